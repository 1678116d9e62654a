//! Property tests: over any sequence of Service creates, updates, deletes
//! and pool edits, the invariants of SPEC §4 hold, and rebuilding from the
//! statuses written reproduces the same state.

use std::collections::BTreeMap;

use hostlb_tests::rng::Rng;
use proptest::prelude::*;

use super::*;
use crate::engine::ipset::is_buggy;
use crate::ledger::Ledger;

fn random_pools(r: &mut Rng) -> Vec<PoolSpec> {
    let n = 1 + r.below(4);
    (0..n)
        .map(|i| {
            let mut addrs = vec![
                format!("10.{i}.0.{}/29", 248 * r.below(2)),
                format!("fd00:{i}::/125"),
            ];
            if r.chance(0.2) {
                addrs.push("10.0.0.250-10.0.1.2".into()); // may overlap pool 0
            }
            if r.chance(0.1) {
                addrs.push("not-an-address".into());
            }
            let mut p = pool(
                &format!("p{i}"),
                r.below(3) as i64,
                &addrs.iter().map(String::as_str).collect::<Vec<_>>(),
            );
            p.auto_assign = r.chance(0.8);
            p.avoid_buggy_ips = r.chance(0.4);
            if r.chance(0.4) {
                p.service_allocation = Some(AllocationSpec {
                    priority: r.chance(0.7).then(|| r.below(3) as i32),
                    namespaces: if r.chance(0.5) {
                        vec!["a".into()]
                    } else {
                        vec![]
                    },
                    namespace_selectors: if r.chance(0.3) {
                        vec![hostlb_api::LabelSelector::from_labels([("team", "x")])]
                    } else {
                        vec![]
                    },
                    service_selectors: if r.chance(0.3) {
                        vec![hostlb_api::LabelSelector::from_labels([("tier", "web")])]
                    } else {
                        vec![]
                    },
                });
            }
            p
        })
        .collect()
}

fn random_service(r: &mut Rng, i: usize, pools: &[PoolSpec]) -> ServiceRequest {
    let ns = ["a", "b"][r.below(2) as usize];
    let mut s = svc(&format!("s{i}"), r.below(10) as i64).ns(ns);
    if r.chance(0.5) {
        s = s.label("tier", "web");
    }
    s.primary = Some(if r.chance(0.8) {
        Family::V4
    } else {
        Family::V6
    });
    s.policy = [
        FamilyPolicy::SingleStack,
        FamilyPolicy::PreferDualStack,
        FamilyPolicy::RequireDualStack,
    ][r.below(3) as usize];
    if r.chance(0.4) {
        s.sharing_key = Some(["k1", "k2"][r.below(2) as usize].into());
    }
    if r.chance(0.3) {
        s.backend = Backend::Local("app=x".into());
    } else if r.chance(0.1) {
        s.backend = Backend::LocalUnselected;
    }
    s.ports = vec![Port {
        protocol: ["TCP", "UDP"][r.below(2) as usize].into(),
        port: [53, 80][r.below(2) as usize],
    }];
    if r.chance(0.15) {
        let p = r.below(pools.len() as u64 + 1);
        s.requested = vec![ip(&format!("10.{p}.0.{}", r.below(8)))];
    } else if r.chance(0.15) {
        s.requested_pool = Some(format!("p{}", r.below(pools.len() as u64 + 1)));
    }
    s
}

fn check_invariants(
    a: &Ledger,
    services: &BTreeMap<String, ServiceRequest>,
) -> Result<(), TestCaseError> {
    let mut by_ip: BTreeMap<IpAddr, Vec<&ServiceRequest>> = BTreeMap::new();
    for (k, s) in services {
        if let Some(x) = held(a, k) {
            let pool = a.pools().iter().find(|p| p.name == x.pool);
            prop_assert!(
                pool.is_some(),
                "{} holds addresses of a pool that is gone",
                k
            );
            for ip in &x.ips {
                prop_assert!(
                    pool.unwrap().contains(*ip),
                    "{} holds {} outside pool {}",
                    k,
                    ip,
                    x.pool
                );
                by_ip.entry(*ip).or_default().push(s);
            }
        }
    }
    for (ip, holders) in by_ip {
        if holders.len() < 2 {
            continue;
        }
        let key = &holders[0].sharing_key;
        for h in &holders {
            prop_assert!(
                h.sharing_key.is_some() && &h.sharing_key == key,
                "{} shared without a common key",
                ip
            );
            prop_assert!(
                h.backend.shares_with(&holders[0].backend),
                "{} shared across backends {:?} and {:?}",
                ip,
                h.backend,
                holders[0].backend
            );
        }
        let mut ports = std::collections::BTreeSet::new();
        for h in &holders {
            for p in &h.ports {
                prop_assert!(ports.insert(p.clone()), "{} port {} used twice", ip, p);
            }
        }
    }
    Ok(())
}

/// The naive lowest free address for a plain single-stack request: pools in
/// the engine's order, ranges in the order written, nothing held, not buggy.
fn naive_lowest(a: &Ledger, s: &ServiceRequest) -> Option<IpAddr> {
    let holders = |ip: IpAddr| a.holders_of(ip);
    let team: Labels = [("team".to_string(), "x".to_string())].into();
    let ns_labels = (s.namespace == "a").then_some(&team);
    let mut pools: Vec<&Pool> = a
        .pools()
        .iter()
        .filter(|p| p.usable() && p.auto_assign && p.admits(&s.namespace, ns_labels, &s.labels))
        .collect();
    pools.sort_by(|x, y| x.order_key().cmp(&y.order_key()));
    let f = s.primary.unwrap_or(Family::V4);
    for p in pools {
        for r in p.ranges.iter().filter(|r| r.family() == f) {
            let (lo, hi) = r.bounds();
            for x in lo..=hi {
                let addr = hostlb_api::address::from_u128(f, x);
                if holders(addr).is_empty() && !(p.avoid_buggy_ips && is_buggy(f, x)) {
                    return Some(addr);
                }
            }
        }
    }
    None
}

/// The Service as the controller hands it to the ledger: with the status
/// it wrote last.
fn with_status(ledger: &Ledger, s: &ServiceRequest) -> ServiceRequest {
    let mut s = s.clone();
    if let Some(Ok(a)) = ledger.answer(&s.key) {
        s.current = a.ips.clone();
        s.current_pool = Some(a.pool.clone());
    }
    s
}

fn held(ledger: &Ledger, key: &str) -> Option<Assigned> {
    ledger.answer(key).and_then(|a| a.as_ref().ok()).cloned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Driven through the ledger exactly as the controller drives it.
    #[test]
    fn invariants_hold_and_rebuild_reproduces_the_state(seed in any::<u64>()) {
        let mut r = Rng(seed);
        let mut pools = random_pools(&mut r);
        let namespaces = || vec![("a".to_string(), Labels::from([("team".to_string(), "x".to_string())])), ("b".to_string(), Labels::new())];
        let mut ledger = Ledger::new();
        ledger.load(&pools, namespaces());
        ledger.rebuild();
        let mut services: BTreeMap<String, ServiceRequest> = BTreeMap::new();
        for _ in 0..40 {
            match r.below(10) {
                0..=5 => {
                    let i = r.below(12) as usize;
                    let s = random_service(&mut r, i, &pools);
                    services.insert(s.key.clone(), s.clone());
                    ledger.upsert(with_status(&ledger, &s));
                }
                6 | 7 => {
                    let keys: Vec<String> = services.keys().cloned().collect();
                    if !keys.is_empty() {
                        let k = keys[r.below(keys.len() as u64) as usize].clone();
                        services.remove(&k);
                        ledger.remove(&k);
                    }
                }
                _ => {
                    pools = random_pools(&mut r);
                    ledger.set_pools(&pools);
                }
            }
            check_invariants(&ledger, &services)?;
        }

        // Release then re-allocate: the lowest free address.
        let plain: Vec<String> = services.values()
            .filter(|s| s.sharing_key.is_none() && s.requested.is_empty() && s.requested_pool.is_none() && s.policy == FamilyPolicy::SingleStack)
            .map(|s| s.key.clone()).collect();
        if let Some(k) = plain.first() {
            ledger.remove(k);
            let s = services[k].clone();
            let want = naive_lowest(&ledger, &s);
            ledger.upsert(s);
            prop_assert_eq!(held(&ledger, k).map(|a| a.ips[0]), want, "re-allocation of {}", k);
        }

        // Rebuild from the statuses, as a restarted controller does.
        let mut rebuilt = Ledger::new();
        rebuilt.load(&pools, namespaces());
        for s in services.values() {
            rebuilt.insert(with_status(&ledger, s));
        }
        rebuilt.rebuild();
        for k in services.keys() {
            prop_assert_eq!(held(&ledger, k), held(&rebuilt, k), "rebuilt state differs for {}", k);
        }
    }
}
