//! A second, deliberately naive reading of SPEC §5, written straight from
//! the text with no caching or indexing. Property tests hold the engine to it.

use std::collections::BTreeMap;

use hostlb_api::annotations::EXCLUDE_FROM_EXTERNAL_LB;

use super::*;
use crate::election::rank_key;

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Answer {
    pub winner: Option<String>,
    /// `(node, score)` in election order.
    pub order: Vec<(String, u32)>,
}

pub(super) fn elect(c: &Cluster, members: &[Member]) -> BTreeMap<IpAddr, Answer> {
    let mut out = BTreeMap::new();
    let mut ips: Vec<IpAddr> = c
        .services
        .iter()
        .flat_map(|s| s.addresses.clone())
        .collect();
    ips.sort();
    ips.dedup();
    for ip in ips {
        // Services sharing the address: the oldest gives the inputs.
        let oldest = c
            .services
            .iter()
            .filter(|s| s.addresses.contains(&ip))
            .min_by_key(|s| (s.created.unwrap_or(i64::MAX), s.key.clone()))
            .unwrap();
        // 1. The pool.
        let named = oldest
            .allocated_pool
            .as_ref()
            .and_then(|n| c.pools.iter().find(|p| &p.name == n))
            .filter(|p| p.ranges.iter().any(|r| r.contains(ip)));
        let pool = named.or_else(|| {
            c.pools
                .iter()
                .filter(|p| p.ranges.iter().any(|r| r.contains(ip)))
                .min_by_key(|p| (p.created.unwrap_or(i64::MAX), p.name.clone()))
        });
        let Some(pool) = pool else {
            out.insert(
                ip,
                Answer {
                    winner: None,
                    order: vec![],
                },
            );
            continue;
        };
        // 2. The advertisements.
        let ads: Vec<&Advertisement> = c
            .advertisements
            .iter()
            .filter(|a| {
                (a.pools.is_empty() && a.pool_selectors.is_empty())
                    || a.pools.contains(&pool.name)
                    || a.pool_selectors.iter().any(|s| s.matches(&pool.labels))
            })
            .filter(|a| {
                a.service_selectors.is_empty()
                    || a.service_selectors
                        .iter()
                        .any(|s| s.matches(&oldest.labels))
            })
            .collect();
        let selects = |a: &Advertisement, n: &NodeInfo| {
            a.node_selectors.is_empty() || a.node_selectors.iter().any(|s| s.matches(&n.labels))
        };
        let text = ip.to_string();
        // A cordoned node is drained for this address if an advertisement
        // of it says so.
        let cordon_drains = ads.iter().any(|a| a.drain_cordoned);
        let mut cands: Vec<(bool, u32, [u8; 32], String)> = Vec::new();
        for n in &c.nodes {
            // 3. Eligible.
            let node_ads: Vec<&&Advertisement> = ads.iter().filter(|a| selects(a, n)).collect();
            if node_ads.is_empty()
                || n.labels.contains_key(EXCLUDE_FROM_EXTERNAL_LB)
                || n.network_unavailable
            {
                continue;
            }
            // 4. Live, not leaving, on-link.
            let Some(m) = members.iter().find(|m| m.node == n.name) else {
                continue;
            };
            if m.leaving {
                continue;
            }
            let on_link = m.on_link.iter().any(|o| {
                o.prefix.contains(ip)
                    && node_ads.iter().any(|a| {
                        if a.interfaces.is_empty() {
                            o.announce
                        } else {
                            a.interfaces.contains(&o.interface)
                        }
                    })
            });
            if !on_link {
                continue;
            }
            // 5. Endpoints.
            if !oldest.endpoints.any_usable
                || (oldest.local_traffic && !oldest.endpoints.nodes.contains(&n.name))
            {
                continue;
            }
            // 6. Score.
            let score: u32 = node_ads
                .iter()
                .flat_map(|a| a.preferences.iter())
                .filter(|p| p.selector.matches(&n.labels))
                .map(|p| p.weight)
                .sum();
            // Its gateway lost where it would hold the address: last too.
            let upstream_lost = m
                .on_link
                .iter()
                .any(|o| o.prefix.contains(ip) && o.upstream_lost);
            let drained = m.drained || (cordon_drains && n.cordoned) || upstream_lost;
            cands.push((drained, score, rank_key(&n.name, &text), n.name.clone()));
        }
        // 7. Order: drained nodes (and those whose gateway is lost) last,
        // whatever their score.
        cands.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        out.insert(
            ip,
            Answer {
                winner: cands.first().map(|c| c.3.clone()),
                order: cands.into_iter().map(|(_, s, _, n)| (n, s)).collect(),
            },
        );
    }
    out
}
