//! Compiling the cluster objects into classes (one per distinct set of
//! advertisements a VIP falls under) and VIPs (address, class, endpoint
//! filter).

use std::collections::BTreeMap;
use std::net::IpAddr;

use foldhash::{HashMap, HashMapExt};
use hostlb_api::rules::{age_key, pool_holding};

use super::super::node::NodeName;
use super::super::report::Note;
use super::super::view::{Cluster, Endpoints, Pool, ServiceInfo};
use super::{Class, CompiledAd, Election, EndpointFilter, IfaceSet, NodeId, RankCache, Tier, Vip};

impl Election {
    /// Compile pools, advertisements and Services into classes and VIPs.
    pub(super) fn compile(&mut self, cluster: &Cluster) {
        // What the last compile worked out of each address alone (its text
        // and the rank keys hashed so far, by node ids that outlive
        // compiles): most cluster views keep most VIPs.
        let mut known: HashMap<IpAddr, (String, RankCache)> = std::mem::take(&mut self.c.vips)
            .into_iter()
            .map(|v| (v.ip, (v.text, v.ranks)))
            .collect();
        let slots = &self.c.slots;
        let n_slots = slots.len();

        let mut pools: Vec<&Pool> = cluster.pools.iter().collect();
        pools.sort_by(|a, b| age_key(a.created, &a.name).cmp(&age_key(b.created, &b.name)));

        let mut ads: Vec<_> = cluster.advertisements.iter().collect();
        ads.sort_by(|a, b| a.name.cmp(&b.name));
        let compiled_ads: Vec<CompiledAd> = ads
            .iter()
            .map(|ad| {
                let mut matches = vec![false; n_slots];
                let mut score = vec![0u32; n_slots];
                for (i, slot) in slots.iter().enumerate() {
                    let Some(facts) = &slot.node else { continue };
                    if ad.node_selectors.is_empty()
                        || ad.node_selectors.iter().any(|s| s.matches(&facts.labels))
                    {
                        matches[i] = true;
                        score[i] = ad
                            .preferences
                            .iter()
                            .filter(|p| p.selector.matches(&facts.labels))
                            .map(|p| p.weight)
                            .sum();
                    }
                }
                CompiledAd {
                    service_selectors: ad.service_selectors.clone(),
                    interfaces: ad.interfaces.clone(),
                    matches,
                    score,
                    drain_cordoned: ad.drain_cordoned,
                    sticky: ad.sticky,
                }
            })
            .collect();
        // Advertisements selecting each pool (by name or label, once).
        let pool_ads: Vec<Vec<usize>> = pools
            .iter()
            .map(|p| {
                (0..ads.len())
                    .filter(|&a| {
                        let ad = ads[a];
                        (ad.pools.is_empty() && ad.pool_selectors.is_empty())
                            || ad.pools.contains(&p.name)
                            || ad.pool_selectors.iter().any(|s| s.matches(&p.labels))
                    })
                    .collect()
            })
            .collect();

        let mut services: Vec<&ServiceInfo> = cluster.services.iter().collect();
        services.sort_by(|a, b| a.age_key().cmp(&b.age_key()));
        let mut by_ip: BTreeMap<IpAddr, Vec<usize>> = BTreeMap::new();
        for (i, s) in services.iter().enumerate() {
            for ip in &s.addresses {
                let list = by_ip.entry(*ip).or_default();
                if !list.contains(&i) {
                    list.push(i);
                }
            }
        }

        let mut class_of: HashMap<Vec<usize>, usize> = HashMap::new();
        let mut class_ads: Vec<Vec<usize>> = Vec::new();
        let mut vips = Vec::with_capacity(by_ip.len());
        for (ip, svcs) in by_ip {
            let oldest = services[svcs[0]];
            let pool = pool_holding(
                &pools,
                oldest.allocated_pool.as_deref(),
                &[ip],
                |p| &p.name,
                |p, ip| p.ranges.iter().any(|r| r.contains(ip)),
            );
            let (class, mut note) = match pool {
                None => (None, Some(Note::NoPool)),
                Some(p) => {
                    let applicable: Vec<usize> = pool_ads[p]
                        .iter()
                        .copied()
                        .filter(|&a| {
                            let sel = &compiled_ads[a].service_selectors;
                            sel.is_empty() || sel.iter().any(|s| s.matches(&oldest.labels))
                        })
                        .collect();
                    if applicable.is_empty() {
                        (
                            None,
                            Some(Note::NoAdvertisement {
                                pool: pools[p].name.clone(),
                            }),
                        )
                    } else {
                        let next = class_ads.len();
                        let c = *class_of.entry(applicable.clone()).or_insert(next);
                        if c == next {
                            class_ads.push(applicable);
                        }
                        (Some(c), None)
                    }
                }
            };
            let endpoints = endpoint_filter(&self.slot_of, &oldest.endpoints, oldest.local_traffic);
            if note.is_none() && matches!(endpoints, EndpointFilter::Nowhere) {
                note = Some(Note::NoEndpoints);
            }
            // Sticky where an applicable advertisement says so, unless an
            // operator asked its oldest Service to go back to the
            // election's first node (`kubectl hostlb rebalance`).
            let sticky = class
                .is_some_and(|c| class_ads[c].iter().any(|&a| compiled_ads[a].sticky))
                && !oldest.rebalance;
            let (text, ranks) = known
                .remove(&ip)
                .unwrap_or_else(|| (ip.to_string(), RankCache::default()));
            vips.push(Vip {
                ip,
                sticky,
                text,
                services: svcs,
                pool: pool.map(|p| pools[p].name.clone()),
                class,
                local_traffic: oldest.local_traffic,
                endpoints,
                note,
                ranks,
            });
        }

        let classes = class_ads
            .iter()
            .map(|ads| build_class(ads, &compiled_ads, n_slots))
            .collect();

        self.vip_of = vips.iter().enumerate().map(|(i, v)| (v.ip, i)).collect();
        self.c.any_sticky = vips.iter().any(|v| v.sticky);
        self.c.classes = classes;
        self.c.vips = vips;
        self.c.services = services.iter().map(|s| s.key.clone()).collect();
    }
}

/// Which nodes a VIP's endpoints allow (SPEC §5.5).
pub(super) fn endpoint_filter(
    slot_of: &HashMap<NodeName, NodeId>,
    endpoints: &Endpoints,
    local_traffic: bool,
) -> EndpointFilter {
    if !endpoints.any_usable {
        return EndpointFilter::Nowhere;
    }
    if !local_traffic {
        return EndpointFilter::Anywhere;
    }
    let mut ids: Vec<NodeId> = endpoints
        .nodes
        .iter()
        .filter_map(|n| slot_of.get(n.as_str()).copied())
        .collect();
    ids.sort_unstable();
    if ids.is_empty() {
        EndpointFilter::Nowhere
    } else {
        EndpointFilter::Only(ids)
    }
}

pub(super) fn build_class(ads: &[usize], compiled: &[CompiledAd], n_slots: usize) -> Class {
    let mut eligible = vec![false; n_slots];
    let mut score = vec![0u32; n_slots];
    let mut iface_sets: Vec<IfaceSet> = Vec::new();
    let mut iface_of = vec![0u16; n_slots];
    for n in 0..n_slots {
        let mut set = IfaceSet {
            names: Vec::new(),
            announce: false,
        };
        for &a in ads {
            let ad = &compiled[a];
            if ad.matches[n] {
                eligible[n] = true;
                score[n] = score[n].saturating_add(ad.score[n]);
                if ad.interfaces.is_empty() {
                    set.announce = true;
                }
                for i in &ad.interfaces {
                    if !set.names.contains(i) {
                        set.names.push(i.clone());
                    }
                }
            }
        }
        if eligible[n] {
            let idx = match iface_sets.iter().position(|s| *s == set) {
                Some(i) => i,
                None => {
                    iface_sets.push(set);
                    iface_sets.len() - 1
                }
            };
            iface_of[n] = idx as u16;
        }
    }
    if iface_sets.is_empty() {
        iface_sets.push(IfaceSet {
            names: Vec::new(),
            announce: true,
        });
    }
    let mut by_score: BTreeMap<u32, Vec<NodeId>> = BTreeMap::new();
    for n in 0..n_slots {
        if eligible[n] {
            by_score.entry(score[n]).or_default().push(n as NodeId);
        }
    }
    let tiers = by_score
        .into_iter()
        .rev()
        .map(|(score, nodes)| Tier { score, nodes })
        .collect();
    Class {
        drains_cordoned: ads.iter().any(|&a| compiled[a].drain_cordoned),
        eligible,
        score,
        tiers,
        iface_sets,
        iface_of,
    }
}
