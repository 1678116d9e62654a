//! IPAddressPools as the allocator uses them: parsed, checked, and ordered.
//!
//! A pool with an entry or selector that does not parse is `Invalid`; one
//! that overlaps an older pool is `Overlaps`. Neither hands out new
//! addresses, but the addresses Services already hold from them are kept:
//! a typo in a pool must not move traffic. Other pools are not affected.

use std::collections::BTreeMap;
use std::net::IpAddr;

use hostlb_api::rules::age_key;
use hostlb_api::selector::parse_list;
use hostlb_api::{AddressRange, Family, Selector};

use super::ipset::buggy_in;

pub type Labels = BTreeMap<String, String>;

/// A pool as read from the cluster, before checking.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolSpec {
    pub name: String,
    /// Creation time in seconds; the older of two overlapping pools wins.
    pub created: Option<i64>,
    pub addresses: Vec<String>,
    pub auto_assign: bool,
    pub avoid_buggy_ips: bool,
    pub service_allocation: Option<AllocationSpec>,
    pub share_across_namespaces: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllocationSpec {
    pub priority: Option<i32>,
    pub namespaces: Vec<String>,
    pub namespace_selectors: Vec<hostlb_api::LabelSelector>,
    pub service_selectors: Vec<hostlb_api::LabelSelector>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolState {
    Ready,
    Invalid(String),
    Overlaps(String),
}

#[derive(Clone, Debug)]
pub struct Allocation {
    pub priority: Option<i32>,
    pub namespaces: Vec<String>,
    pub namespace_selectors: Vec<Selector>,
    pub service_selectors: Vec<Selector>,
}

#[derive(Clone, Debug)]
pub struct Pool {
    pub name: String,
    pub created: Option<i64>,
    /// Valid entries, in the order written.
    pub ranges: Vec<AddressRange>,
    pub auto_assign: bool,
    pub avoid_buggy_ips: bool,
    pub allocation: Option<Allocation>,
    pub share_across_namespaces: bool,
    pub state: PoolState,
    /// Addresses the pool can hand out per family (union of its ranges,
    /// less `.0`/`.255` with `avoidBuggyIPs`).
    pub capacity: [u128; 2],
    /// The union of the ranges per family, as disjoint sorted spans.
    pub spans: [Vec<(u128, u128)>; 2],
}

pub fn family_index(f: Family) -> usize {
    match f {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

impl Pool {
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip))
    }

    pub fn has_family(&self, f: Family) -> bool {
        self.ranges.iter().any(|r| r.family() == f)
    }

    pub fn usable(&self) -> bool {
        self.state == PoolState::Ready
    }

    /// Whether `serviceAllocation` lets the Service use this pool. Without
    /// it, every Service may.
    pub fn admits(&self, namespace: &str, ns_labels: Option<&Labels>, svc_labels: &Labels) -> bool {
        let Some(a) = &self.allocation else {
            return true;
        };
        let by_namespace = if a.namespaces.is_empty() && a.namespace_selectors.is_empty() {
            true
        } else {
            a.namespaces.iter().any(|n| n == namespace)
                || ns_labels.is_some_and(|l| a.namespace_selectors.iter().any(|s| s.matches(l)))
        };
        let by_service = a.service_selectors.is_empty()
            || a.service_selectors.iter().any(|s| s.matches(svc_labels));
        by_namespace && by_service
    }

    /// Pools with `serviceAllocation` come first, by priority (lower first,
    /// unset last), then the others; ties by age, then name.
    pub fn order_key(&self) -> (bool, bool, i32, i64, &str) {
        let prio = self.allocation.as_ref().and_then(|a| a.priority);
        (
            self.allocation.is_none(),
            prio.is_none(),
            prio.unwrap_or(0),
            self.created.unwrap_or(i64::MAX),
            &self.name,
        )
    }
}

/// The union of the ranges of one family as disjoint sorted spans.
fn spans(ranges: &[AddressRange], family: Family) -> Vec<(u128, u128)> {
    let mut all: Vec<(u128, u128)> = ranges
        .iter()
        .filter(|r| r.family() == family)
        .map(|r| r.bounds())
        .collect();
    all.sort();
    let mut out: Vec<(u128, u128)> = Vec::new();
    for (a, b) in all {
        match out.last_mut() {
            Some((_, cb)) if a <= cb.saturating_add(1) => *cb = (*cb).max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Addresses in `spans`, less buggy ones when asked.
fn capacity(spans: &[(u128, u128)], family: Family, avoid_buggy: bool) -> u128 {
    spans.iter().fold(0u128, |total, &(a, b)| {
        let n = (b - a).saturating_add(1);
        let bad = if avoid_buggy {
            buggy_in(family, a, b)
        } else {
            0
        };
        total.saturating_add(n - bad)
    })
}

/// Check every pool; older pools win overlaps.
pub fn compile(specs: &[PoolSpec]) -> Vec<Pool> {
    let mut order: Vec<&PoolSpec> = specs.iter().collect();
    order.sort_by(|a, b| age_key(a.created, &a.name).cmp(&age_key(b.created, &b.name)));
    let mut out: Vec<Pool> = Vec::with_capacity(order.len());
    for spec in order {
        let mut problems = Vec::new();
        let mut ranges = Vec::new();
        for (i, entry) in spec.addresses.iter().enumerate() {
            match AddressRange::parse(entry) {
                Ok(r) => ranges.push(r),
                Err(e) => problems.push(format!("spec.addresses[{i}]: {e}")),
            }
        }
        if spec.addresses.is_empty() {
            problems.push("spec.addresses is empty".to_string());
        }
        let allocation = match &spec.service_allocation {
            None => None,
            Some(a) => {
                let ns = parse_list(
                    "spec.serviceAllocation.namespaceSelectors",
                    &a.namespace_selectors,
                );
                let svc = parse_list(
                    "spec.serviceAllocation.serviceSelectors",
                    &a.service_selectors,
                );
                match (ns, svc) {
                    (Ok(namespace_selectors), Ok(service_selectors)) => Some(Allocation {
                        priority: a.priority,
                        namespaces: a.namespaces.clone(),
                        namespace_selectors,
                        service_selectors,
                    }),
                    (Err(e), _) | (_, Err(e)) => {
                        problems.push(e);
                        None
                    }
                }
            }
        };
        let mut state = if problems.is_empty() {
            PoolState::Ready
        } else {
            PoolState::Invalid(problems.join("; "))
        };
        if state == PoolState::Ready {
            // Only pools in use can be overlapped: a broken older pool must
            // not take a good newer one down with it.
            let clash = out.iter().filter(|older| older.usable()).find_map(|older| {
                ranges.iter().find_map(|r| {
                    older
                        .ranges
                        .iter()
                        .find(|o| o.overlaps(r))
                        .map(|o| format!("{r} overlaps {o} of pool {}", older.name))
                })
            });
            if let Some(c) = clash {
                state = PoolState::Overlaps(c);
            }
        }
        let spans = [spans(&ranges, Family::V4), spans(&ranges, Family::V6)];
        let capacity = [
            capacity(&spans[0], Family::V4, spec.avoid_buggy_ips),
            capacity(&spans[1], Family::V6, spec.avoid_buggy_ips),
        ];
        out.push(Pool {
            name: spec.name.clone(),
            created: spec.created,
            ranges,
            auto_assign: spec.auto_assign,
            avoid_buggy_ips: spec.avoid_buggy_ips,
            share_across_namespaces: spec.share_across_namespaces,
            allocation,
            state,
            capacity,
            spans,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests::pool as spec;

    #[test]
    fn invalid_and_overlapping_pools_are_marked_others_stay_ready() {
        let pools = compile(&[
            spec("newer", 2, &["10.0.0.128/25"]),
            spec("older", 1, &["10.0.0.0/24"]),
            spec("typo", 3, &["10.1.0.0/24", "10.1.1.300"]),
            spec("fine", 4, &["10.2.0.0/24", "fd00::/120"]),
            spec("empty", 5, &[]),
        ]);
        let state = |n: &str| pools.iter().find(|p| p.name == n).unwrap().state.clone();
        assert_eq!(state("older"), PoolState::Ready);
        assert_eq!(
            state("newer"),
            PoolState::Overlaps(
                "10.0.0.128-10.0.0.255 overlaps 10.0.0.0-10.0.0.255 of pool older".into()
            )
        );
        assert!(
            matches!(state("typo"), PoolState::Invalid(m) if m.starts_with("spec.addresses[1]: invalid address \"10.1.1.300\""))
        );
        assert_eq!(state("fine"), PoolState::Ready);
        assert_eq!(
            state("empty"),
            PoolState::Invalid("spec.addresses is empty".into())
        );
        let typo = pools.iter().find(|p| p.name == "typo").unwrap();
        assert_eq!(
            typo.ranges.len(),
            1,
            "valid entries of an invalid pool are kept"
        );
    }

    #[test]
    fn capacity_unions_ranges_and_skips_buggy() {
        let mut s = spec("p", 1, &["10.0.0.0/24", "10.0.0.10-10.0.1.9", "fd00::/64"]);
        let p = &compile(std::slice::from_ref(&s))[0];
        assert_eq!(p.capacity, [266, 1 << 64]);
        s.avoid_buggy_ips = true;
        let p = &compile(&[s])[0];
        assert_eq!(p.capacity, [266 - 3, 1 << 64], ".0, .255 and the next .0");
    }

    #[test]
    fn admission_by_namespace_labels_and_service_labels() {
        let mut s = spec("p", 1, &["10.0.0.0/24"]);
        s.service_allocation = Some(AllocationSpec {
            priority: Some(5),
            namespaces: vec!["shop".into()],
            namespace_selectors: vec![hostlb_api::LabelSelector::from_labels([("team", "a")])],
            service_selectors: vec![hostlb_api::LabelSelector::from_labels([("expose", "yes")])],
        });
        let p = &compile(&[s])[0];
        let l = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Labels>()
        };
        let yes = l(&[("expose", "yes")]);
        assert!(p.admits("shop", None, &yes));
        assert!(p.admits("other", Some(&l(&[("team", "a")])), &yes));
        assert!(!p.admits("other", Some(&l(&[("team", "b")])), &yes));
        assert!(!p.admits("shop", None, &l(&[])));
    }

    #[test]
    fn bad_selector_makes_the_pool_invalid() {
        let mut s = spec("p", 1, &["10.0.0.0/24"]);
        s.service_allocation = Some(AllocationSpec {
            service_selectors: vec![hostlb_api::LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![hostlb_api::selector::LabelSelectorRequirement {
                    key: "a".into(),
                    operator: "Near".into(),
                    values: None,
                }]),
            }],
            ..Default::default()
        });
        assert_eq!(
            compile(&[s])[0].state,
            PoolState::Invalid(r#"spec.serviceAllocation.serviceSelectors[0]: "Near" is not a valid label selector operator"#.into())
        );
    }
}
