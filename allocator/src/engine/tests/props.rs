//! Property tests: over any sequence of Service creates, updates, deletes
//! and pool edits, the invariants of SPEC §4 hold, and rebuilding from the
//! statuses written reproduces the same state.

use std::collections::BTreeMap;

use hostlb_api::address::to_u128;
use proptest::prelude::*;

use super::*;
use crate::engine::ipset::is_buggy;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() as f64 / u64::MAX as f64) < p
    }
}

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
        s.backend_key = "app=x".into();
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

/// What the controller would have written for each Service.
type Statuses = BTreeMap<String, (Vec<IpAddr>, Option<String>)>;

/// Reconcile `s` the way the controller does (with its last status), write
/// the status, and follow evictions until nothing moves.
fn converge(
    a: &mut Allocator,
    services: &BTreeMap<String, ServiceRequest>,
    statuses: &mut Statuses,
    key: &str,
) {
    let mut queue = vec![key.to_string()];
    let mut rounds = 0;
    while let Some(k) = queue.pop() {
        rounds += 1;
        assert!(rounds < 1000, "evictions do not converge");
        let Some(base) = services.get(&k) else {
            continue;
        };
        let mut s = base.clone();
        if let Some((ips, pool)) = statuses.get(&k) {
            s.current = ips.clone();
            s.current_pool = pool.clone();
        }
        let out = a.reconcile(&s, true);
        match out.result {
            Ok(Some(x)) => statuses.insert(k.clone(), (x.ips, Some(x.pool))),
            _ => statuses.insert(k.clone(), (vec![], None)),
        };
        for e in out.evicted {
            statuses.insert(e.clone(), (vec![], None));
            queue.push(e);
        }
    }
}

/// As the controller does: Services still waiting for an address (or for
/// one of their families) are retried, oldest first, until nothing changes.
fn settle(a: &mut Allocator, services: &BTreeMap<String, ServiceRequest>, statuses: &mut Statuses) {
    loop {
        let mut waiting: Vec<&ServiceRequest> = services
            .values()
            .filter(|s| {
                statuses
                    .get(&s.key)
                    .is_none_or(|(ips, _)| ips.len() < s.wanted().len())
            })
            .collect();
        waiting.sort_by(|x, y| x.age().cmp(&y.age()));
        let waiting: Vec<String> = waiting.into_iter().map(|s| s.key.clone()).collect();
        let before = statuses.clone();
        for k in waiting {
            converge(a, services, statuses, &k);
        }
        if *statuses == before {
            break;
        }
    }
}

fn check_invariants(
    a: &Allocator,
    services: &BTreeMap<String, ServiceRequest>,
) -> Result<(), TestCaseError> {
    let mut by_ip: BTreeMap<IpAddr, Vec<&ServiceRequest>> = BTreeMap::new();
    for (k, s) in services {
        if let Some(x) = a.allocation(k) {
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
            prop_assert_eq!(
                &h.backend_key,
                &holders[0].backend_key,
                "{} shared across different backends",
                ip
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
fn naive_lowest(a: &Allocator, s: &ServiceRequest) -> Option<IpAddr> {
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
                if a.holders_of(addr).is_empty() && !(p.avoid_buggy_ips && is_buggy(f, x)) {
                    return Some(addr);
                }
            }
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn invariants_hold_and_rebuild_reproduces_the_state(seed in any::<u64>()) {
        let mut r = Rng(seed);
        let mut pools = random_pools(&mut r);
        let mut a = with_pools(&pools);
        a.set_namespace("a", [("team".to_string(), "x".to_string())].into());
        a.set_namespace("b", Labels::new());
        let mut services: BTreeMap<String, ServiceRequest> = BTreeMap::new();
        let mut statuses = Statuses::new();
        for step in 0..40 {
            match r.below(10) {
                0..=5 => {
                    let i = r.below(12) as usize;
                    let s = random_service(&mut r, i, &pools);
                    let k = s.key.clone();
                    services.insert(k.clone(), s);
                    converge(&mut a, &services, &mut statuses, &k);
                }
                6 | 7 => {
                    let keys: Vec<String> = services.keys().cloned().collect();
                    if !keys.is_empty() {
                        let k = keys[r.below(keys.len() as u64) as usize].clone();
                        services.remove(&k);
                        statuses.remove(&k);
                        a.release(&k);
                    }
                }
                _ => {
                    pools = random_pools(&mut r);
                    a.set_pools(&pools);
                    let mut keys: Vec<&ServiceRequest> = services.values().collect();
                    keys.sort_by(|x, y| x.age().cmp(&y.age()));
                    let keys: Vec<String> = keys.into_iter().map(|s| s.key.clone()).collect();
                    for k in keys {
                        converge(&mut a, &services, &mut statuses, &k);
                    }
                }
            }
            settle(&mut a, &services, &mut statuses);
            check_invariants(&a, &services)?;
            // Status and engine agree.
            for (k, (ips, _)) in &statuses {
                let held = a.allocation(k).map(|x| x.ips).unwrap_or_default();
                prop_assert_eq!(&held, ips, "step {}: status of {} differs from the engine", step, k);
            }
        }

        // Release then re-allocate: the lowest free address.
        let plain: Vec<String> = services.values()
            .filter(|s| s.sharing_key.is_none() && s.requested.is_empty() && s.requested_pool.is_none() && s.policy == FamilyPolicy::SingleStack)
            .map(|s| s.key.clone()).collect();
        if let Some(k) = plain.first() {
            a.release(k);
            statuses.remove(k);
            let s = services[k].clone();
            let want = naive_lowest(&a, &s);
            let got = a.reconcile(&s, true).result.ok().flatten().map(|x| x.ips[0]);
            prop_assert_eq!(got, want, "re-allocation of {}", k);
            statuses.insert(k.clone(), (got.into_iter().collect(), a.allocation(k).map(|x| x.pool)));
            settle(&mut a, &services, &mut statuses);
        }

        // Rebuild from the statuses, oldest first: keep, then allocate.
        let mut b = with_pools(&pools);
        b.set_namespace("a", [("team".to_string(), "x".to_string())].into());
        b.set_namespace("b", Labels::new());
        let mut order: Vec<&ServiceRequest> = services.values().collect();
        order.sort_by(|x, y| x.age().cmp(&y.age()));
        for allow_new in [false, true] {
            for s in &order {
                let mut s = (*s).clone();
                if let Some((ips, pool)) = statuses.get(&s.key) {
                    s.current = ips.clone();
                    s.current_pool = pool.clone();
                }
                b.reconcile(&s, allow_new);
            }
        }
        for k in services.keys() {
            if a.allocation(k) != b.allocation(k) {
                eprintln!("pools: {:#?}", pools);
                for s in &order { eprintln!("{} age={:?} policy={:?} primary={:?} share={:?} backend={:?} ports={:?} req={:?} reqpool={:?} status={:?} a={:?} b={:?}", s.key, s.created, s.policy, s.primary, s.sharing_key, s.backend_key, s.ports, s.requested, s.requested_pool, statuses.get(&s.key), a.allocation(&s.key), b.allocation(&s.key)); }
            }
            prop_assert_eq!(a.allocation(k), b.allocation(k), "rebuilt state differs for {}", k);
        }
        let _ = to_u128;
    }
}
