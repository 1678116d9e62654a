//! The election engine: SPEC §5 computed for every VIP, kept up to date as the
//! cluster and the gossip membership change.
//!
//! Data flow: [`Election::set_cluster`] compiles the cluster objects into
//! *classes* (one per distinct set of advertisements that apply to a VIP:
//! eligibility, scores and interfaces per node) and *VIPs* (address, class,
//! endpoint filter); then every VIP is elected. Membership changes
//! ([`Election::upsert_member`], [`Election::remove_member`]) re-elect only the
//! VIPs they can affect.
//!
//! Speed comes from never hashing more than needed. Each VIP keeps, once
//! computed, the first nodes of its order by `sha256(node#ip)` (deepened
//! when a walk needs more); it depends on node names and the address only,
//! so it survives every configuration and membership change. A VIP's winner
//! is then the first candidate of its top score tier met while walking that
//! order, usually within a few steps. Tiers of a few nodes (preferred edge
//! nodes, say) are hashed directly.
//!
//! Every rule lives in [`Election::exclusion`]: the fast path and the full
//! explanation ([`Election::explain`]) both ask it, so they cannot disagree.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use hostlb_api::Selector;
use hostlb_api::annotations::EXCLUDE_FROM_EXTERNAL_LB;
use hostlb_api::rules::{age_key, pool_holding};

use super::hash::rank_key;
use super::report::{Candidate, Excluded, Note, Reason, VipReport};
use super::view::{Cluster, Endpoints, Labels, Member, OnLink, Pool, ServiceInfo};

/// Index of a node in the engine; stable for the engine's lifetime.
type NodeId = u32;

/// Tiers (and Local endpoint lists) up to this size are hashed directly
/// rather than found by walking the cached hash order.
const DIRECT_HASH_MAX: usize = 8;

/// What a node must do for one VIP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Duty {
    /// Won the election: hold the address on `on_link.interface` with the
    /// on-link prefix length, and answer ARP/ND for it.
    Announce { ip: IpAddr, on_link: OnLink },
    /// Eligible but off-link: hold `ip/32` (`/128`) on the virtual interface.
    Virtual { ip: IpAddr },
}

struct Slot {
    name: String,
    /// Facts from the Node object; `None` when there is no Node of that name.
    node: Option<NodeFacts>,
    member: Option<Member>,
}

struct NodeFacts {
    labels: Labels,
    /// Rules that exclude the node whatever the advertisement.
    veto: Option<Reason>,
}

struct CompiledAd {
    service_selectors: Vec<Selector>,
    interfaces: Vec<String>,
    /// Per node: `nodeSelectors` match.
    matches: Vec<bool>,
    /// Per node: sum of matching preference weights, zero where `!matches`.
    score: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct IfaceSet {
    /// Listed interfaces, in the order the advertisements list them.
    names: Vec<String>,
    /// Some applicable advertisement lists no interface: the announce one.
    announce: bool,
}

struct Class {
    eligible: Vec<bool>,
    score: Vec<u32>,
    /// Eligible nodes grouped by score, highest first.
    tiers: Vec<Tier>,
    iface_sets: Vec<IfaceSet>,
    iface_of: Vec<u16>,
}

struct Tier {
    score: u32,
    nodes: Vec<NodeId>,
}

enum EndpointFilter {
    Anywhere,
    Nowhere,
    /// Sorted node ids with a usable endpoint (`externalTrafficPolicy: Local`).
    Only(Vec<NodeId>),
}

struct Vip {
    ip: IpAddr,
    text: String,
    /// Indices into `Compiled::services`, oldest first.
    services: Vec<usize>,
    pool: Option<String>,
    class: Option<usize>,
    /// `externalTrafficPolicy: Local` on the oldest Service.
    local_traffic: bool,
    endpoints: EndpointFilter,
    note: Option<Note>,
}

/// Everything compiled from the cluster; read-only while electing.
#[derive(Default)]
struct Compiled {
    slots: Vec<Slot>,
    classes: Vec<Class>,
    vips: Vec<Vip>,
    services: Vec<String>,
    direct_hash_max: usize,
    order_depth: usize,
}

#[derive(Clone, Copy)]
struct Win {
    node: NodeId,
    score: u32,
    hash: [u8; 32],
}

/// The election for every VIP of the cluster. See the module docs.
pub struct Election {
    c: Compiled,
    slot_of: HashMap<String, NodeId>,
    /// Per address: the first node ids by rank key, built on first need.
    orders: HashMap<IpAddr, Order>,
    winners: Vec<Option<Win>>,
    vip_of: HashMap<IpAddr, usize>,
    /// Bumped by every change of the inputs (see [`Election::epoch`]).
    epoch: u64,
}

impl Election {
    /// Changes at every change of what the election is computed from (the
    /// cluster, a member, a Service's endpoints), so that a caller may keep
    /// what it derived from the election (a costly [`Election::runners_up`])
    /// while the epoch stays.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn new(cluster: &Cluster, members: impl IntoIterator<Item = Member>) -> Election {
        Election::tuned(cluster, members, DIRECT_HASH_MAX, ORDER_DEPTH)
    }

    /// [`Election::new`] with other thresholds, so tests can force the walk
    /// (`direct_hash_max` 0) or direct hashing (`usize::MAX`) everywhere, and
    /// make cached orders deepen (`order_depth` 1).
    pub(crate) fn tuned(
        cluster: &Cluster,
        members: impl IntoIterator<Item = Member>,
        direct_hash_max: usize,
        order_depth: usize,
    ) -> Election {
        let mut e = Election {
            c: Compiled {
                direct_hash_max,
                order_depth: order_depth.max(1),
                ..Compiled::default()
            },
            slot_of: HashMap::new(),
            orders: HashMap::new(),
            winners: Vec::new(),
            vip_of: HashMap::new(),
            epoch: 0,
        };
        for m in members {
            let id = e.slot(&m.node);
            e.c.slots[id as usize].member = Some(m);
        }
        e.set_cluster(cluster);
        e
    }

    /// Replace the cluster objects and re-elect every VIP. Returns the
    /// addresses whose winner changed (or that appeared or disappeared).
    pub fn set_cluster(&mut self, cluster: &Cluster) -> Vec<IpAddr> {
        self.epoch += 1;
        let before = self.winner_ids();
        for s in &mut self.c.slots {
            s.node = None;
        }
        for n in &cluster.nodes {
            let id = self.slot(&n.name);
            let veto = if n.labels.contains_key(EXCLUDE_FROM_EXTERNAL_LB) {
                Some(Reason::ExcludeLabel)
            } else if n.network_unavailable {
                Some(Reason::NetworkUnavailable)
            } else {
                None
            };
            self.c.slots[id as usize].node = Some(NodeFacts {
                labels: n.labels.clone(),
                veto,
            });
        }
        self.compile(cluster);
        self.orders.retain(|ip, _| self.vip_of.contains_key(ip));
        self.winners = (0..self.c.vips.len())
            .map(|v| elect(&self.c, &mut self.orders, v, None))
            .collect();
        let after = self.winner_ids();
        changed(&before, &after)
    }

    /// A member joined, or its state (leaving, prefixes) changed.
    pub fn upsert_member(&mut self, member: Member) -> Vec<IpAddr> {
        let id = self.slot(&member.node);
        let slot = &mut self.c.slots[id as usize];
        if slot.member.as_ref() == Some(&member) {
            return Vec::new();
        }
        slot.member = Some(member);
        self.epoch += 1;
        self.reconsider(id)
    }

    /// Replace the whole membership with `members` (a gossip view): members
    /// that changed are upserted, missing ones removed, unchanged ones cost
    /// nothing. Returns the addresses whose winner changed, sorted.
    pub fn set_members<'a, I>(&mut self, members: I) -> Vec<IpAddr>
    where
        I: IntoIterator<Item = &'a Member>,
        I::IntoIter: Clone,
    {
        let members = members.into_iter();
        // Most views change nothing here (a peer's held VIPs moved): the
        // same members, each as it was, and nothing to re-elect.
        let mut given = 0;
        let same = members.clone().all(|m| {
            given += 1;
            self.member(&m.node) == Some(m)
        });
        if same && given == self.c.slots.iter().filter(|s| s.member.is_some()).count() {
            return Vec::new();
        }
        let mut moved = Vec::new();
        let keep: std::collections::HashSet<&str> =
            members.clone().map(|m| m.node.as_str()).collect();
        let gone: Vec<String> = self
            .c
            .slots
            .iter()
            .filter(|s| s.member.is_some() && !keep.contains(s.name.as_str()))
            .map(|s| s.name.clone())
            .collect();
        for node in gone {
            moved.extend(self.remove_member(&node));
        }
        for m in members {
            if self.member(&m.node) != Some(m) {
                moved.extend(self.upsert_member(m.clone()));
            }
        }
        moved.sort();
        moved.dedup();
        moved
    }

    /// Whether `node` outranks `other` for `ip` by the election's order with
    /// liveness ignored (eligibility, then score, then hash). Two nodes that
    /// both hold a VIP because each thinks the other dead (a partition that
    /// drops gossip but not ARP) ask this and agree, without talking, on
    /// which keeps it. `None` when the address is unknown.
    pub fn outranks(&self, ip: IpAddr, node: &str, other: &str) -> Option<bool> {
        let v = *self.vip_of.get(&ip)?;
        let vip = &self.c.vips[v];
        let rank = |name: &str| -> Option<(std::cmp::Reverse<u32>, [u8; 32])> {
            let id = *self.slot_of.get(name)?;
            let class = &self.c.classes[vip.class?];
            let facts = self.c.slots[id as usize].node.as_ref()?;
            if !class.eligible.get(id as usize).copied().unwrap_or(false) || facts.veto.is_some() {
                return None;
            }
            Some((
                std::cmp::Reverse(class.score[id as usize]),
                rank_key(name, &vip.text),
            ))
        };
        Some(match (rank(node), rank(other)) {
            (Some(a), Some(b)) => a < b,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => node < other,
        })
    }

    /// Live members as the engine has them, by name.
    pub fn member(&self, node: &str) -> Option<&Member> {
        let id = *self.slot_of.get(node)?;
        self.c.slots[id as usize].member.as_ref()
    }

    /// A member is gone (failed or left).
    pub fn remove_member(&mut self, node: &str) -> Vec<IpAddr> {
        let Some(&id) = self.slot_of.get(node) else {
            return Vec::new();
        };
        if self.c.slots[id as usize].member.take().is_none() {
            return Vec::new();
        }
        self.epoch += 1;
        self.reconsider(id)
    }

    /// Re-elect after node `id` changed: the VIPs it won may move away, and
    /// it may now beat the winner of others. Nothing else can change.
    fn reconsider(&mut self, id: NodeId) -> Vec<IpAddr> {
        let mut moved = Vec::new();
        for v in 0..self.c.vips.len() {
            let old = self.winners[v];
            let new = if old.is_some_and(|w| w.node == id) {
                elect(&self.c, &mut self.orders, v, None)
            } else if self.c.exclusion(v, id).is_none() {
                let vip = &self.c.vips[v];
                let class = &self.c.classes[vip.class.expect("a candidate implies a class")];
                let challenger = Win {
                    node: id,
                    score: class.score[id as usize],
                    hash: rank_key(&self.c.slots[id as usize].name, &vip.text),
                };
                match old {
                    Some(w) if self.c.order(&w, &challenger) != Ordering::Greater => old,
                    _ => Some(challenger),
                }
            } else {
                old
            };
            if new.map(|w| w.node) != old.map(|w| w.node) {
                self.winners[v] = new;
                moved.push(self.c.vips[v].ip);
            }
        }
        moved
    }

    fn slot(&mut self, name: &str) -> NodeId {
        if let Some(&id) = self.slot_of.get(name) {
            return id;
        }
        let id = self.c.slots.len() as NodeId;
        self.c.slots.push(Slot {
            name: name.to_string(),
            node: None,
            member: None,
        });
        self.slot_of.insert(name.to_string(), id);
        let slots = &self.c.slots;
        for (ip, order) in &mut self.orders {
            order.insert(slots, id, &ip.to_string());
        }
        for class in &mut self.c.classes {
            class.eligible.push(false);
            class.score.push(0);
            class.iface_of.push(0);
        }
        id
    }

    fn winner_ids(&self) -> HashMap<IpAddr, Option<NodeId>> {
        self.c
            .vips
            .iter()
            .zip(&self.winners)
            .map(|(v, w)| (v.ip, w.map(|w| w.node)))
            .collect()
    }

    /// The winner for `ip`, `None` when no node announces it or it is unknown.
    pub fn winner(&self, ip: IpAddr) -> Option<&str> {
        let v = *self.vip_of.get(&ip)?;
        self.winners[v].map(|w| self.c.slots[w.node as usize].name.as_str())
    }

    /// Every VIP with its winner, in address order of compilation.
    pub fn winners(&self) -> impl Iterator<Item = (IpAddr, Option<&str>)> {
        self.c
            .vips
            .iter()
            .zip(&self.winners)
            .map(|(v, w)| (v.ip, w.map(|w| self.c.slots[w.node as usize].name.as_str())))
    }

    /// What `node` must hold: the VIPs it won and the off-link VIPs it is
    /// eligible for (when its agent runs virtual mode).
    pub fn duties(&self, node: &str) -> Vec<Duty> {
        let Some(&id) = self.slot_of.get(node) else {
            return Vec::new();
        };
        (0..self.c.vips.len())
            .filter_map(|v| self.duty_of(v, id))
            .collect()
    }

    /// [`Election::duties`] for one address: what `node` must hold for `ip`,
    /// `None` when nothing (or the address is unknown).
    pub fn duty(&self, node: &str, ip: IpAddr) -> Option<Duty> {
        let id = *self.slot_of.get(node)?;
        let v = *self.vip_of.get(&ip)?;
        self.duty_of(v, id)
    }

    fn duty_of(&self, v: usize, id: NodeId) -> Option<Duty> {
        let vip = &self.c.vips[v];
        if self.winners[v].is_some_and(|w| w.node == id) {
            let on_link = self
                .c
                .announce_target(v, id)
                .expect("a winner is on-link")
                .clone();
            return Some(Duty::Announce {
                ip: vip.ip,
                on_link,
            });
        }
        self.goes_virtual(id, self.c.exclusion(v, id))
            .then_some(Duty::Virtual { ip: vip.ip })
    }

    /// Whether node `n`, kept out of a VIP's election for `exclusion`,
    /// holds it on its virtual interface instead: the address is on none
    /// of its links and its agent runs virtual mode.
    fn goes_virtual(&self, n: NodeId, exclusion: Option<Reason>) -> bool {
        exclusion == Some(Reason::NotOnLink)
            && self.c.slots[n as usize]
                .member
                .as_ref()
                .is_some_and(|m| m.virtual_mode)
    }

    /// The nodes holding `ip` on their virtual interfaces, by name: the
    /// report's `virtual_nodes`, without ranking the candidates (a sha256
    /// per node), for callers that ask about every VIP.
    pub fn virtual_nodes(&self, ip: IpAddr) -> Vec<&str> {
        let Some(&v) = self.vip_of.get(&ip) else {
            return Vec::new();
        };
        let mut names: Vec<&str> = (0..self.c.slots.len() as NodeId)
            .filter(|&n| {
                self.c.slots[n as usize].node.is_some()
                    && self.goes_virtual(n, self.c.exclusion(v, n))
            })
            .map(|n| self.c.slots[n as usize].name.as_str())
            .collect();
        names.sort_unstable();
        names
    }

    /// The winner for `ip` if the nodes for which `passed` says so were no
    /// candidates.
    pub fn winner_without(&self, ip: IpAddr, passed: impl Fn(&str) -> bool) -> Option<&str> {
        let v = *self.vip_of.get(&ip)?;
        let class = &self.c.classes[self.c.vips[v].class?];
        (0..self.c.slots.len() as NodeId)
            .filter(|&n| {
                !passed(&self.c.slots[n as usize].name) && self.c.exclusion(v, n).is_none()
            })
            .map(|n| self.c.win(v, class, n))
            .min_by(|a, b| self.c.order(a, b))
            .map(|w| self.c.slots[w.node as usize].name.as_str())
    }

    /// For every owner, its VIPs (in address order) with the node next in
    /// line for each: the one that would win were the owner gone. These
    /// pairs are whose failure must be noticed first (see the agent core's
    /// owner sessions). One election per VIP, each walking the cached
    /// order.
    pub fn runners_up(&mut self) -> BTreeMap<String, Vec<(IpAddr, String)>> {
        let mut out: BTreeMap<String, Vec<(IpAddr, String)>> = BTreeMap::new();
        for v in 0..self.c.vips.len() {
            let Some(w) = self.winners[v] else { continue };
            if let Some(r) = elect(&self.c, &mut self.orders, v, Some(w.node)) {
                out.entry(self.c.slots[w.node as usize].name.clone())
                    .or_default()
                    .push((
                        self.c.vips[v].ip,
                        self.c.slots[r.node as usize].name.clone(),
                    ));
            }
        }
        for runs in out.values_mut() {
            runs.sort();
        }
        out
    }

    /// What `node` would hold for `ip` if the nodes for which `passed`
    /// says so were no candidates: the announce duty when it comes first
    /// among the others, `None` otherwise. For a VIP whose winner cannot
    /// know of it (its view of the cluster is older), so that the nodes
    /// that do know agree on one of them.
    pub fn duty_without(
        &self,
        node: &str,
        ip: IpAddr,
        passed: impl Fn(&str) -> bool,
    ) -> Option<Duty> {
        let id = *self.slot_of.get(node)?;
        let v = *self.vip_of.get(&ip)?;
        if self.c.exclusion(v, id).is_some() {
            return None;
        }
        let class = &self.c.classes[self.c.vips[v].class?];
        let me = self.c.win(v, class, id);
        let beaten = (0..self.c.slots.len() as NodeId).any(|n| {
            n != id
                && !passed(&self.c.slots[n as usize].name)
                && self.c.exclusion(v, n).is_none()
                && self.c.order(&self.c.win(v, class, n), &me) == Ordering::Less
        });
        if beaten {
            return None;
        }
        let on_link = self.c.announce_target(v, id)?.clone();
        Some(Duty::Announce { ip, on_link })
    }

    /// Only the endpoints of Service `key` (`namespace/name`) changed: the
    /// VIPs it gives the Service-side inputs of (those where it is the
    /// oldest Service) are re-elected, nothing is recompiled. Returns those
    /// addresses, whether their winner moved or not: off-link VIPs follow
    /// endpoints without any winner.
    pub fn set_endpoints(&mut self, key: &str, endpoints: &Endpoints) -> Vec<IpAddr> {
        let Some(s) = self.c.services.iter().position(|k| k == key) else {
            return Vec::new();
        };
        self.epoch += 1;
        let mut touched = Vec::new();
        for v in 0..self.c.vips.len() {
            if self.c.vips[v].services.first() != Some(&s) {
                continue;
            }
            let vip = &mut self.c.vips[v];
            vip.endpoints = endpoint_filter(&self.slot_of, endpoints, vip.local_traffic);
            match (&vip.note, &vip.endpoints) {
                (None, EndpointFilter::Nowhere) => vip.note = Some(Note::NoEndpoints),
                (Some(Note::NoEndpoints), EndpointFilter::Anywhere | EndpointFilter::Only(_)) => {
                    vip.note = None
                }
                _ => {}
            }
            self.winners[v] = elect(&self.c, &mut self.orders, v, None);
            touched.push(self.c.vips[v].ip);
        }
        touched.sort();
        touched
    }

    /// The full answer for one VIP: every node and why it won or lost.
    pub fn explain(&self, ip: IpAddr) -> Option<VipReport> {
        let v = *self.vip_of.get(&ip)?;
        Some(self.report(v))
    }

    /// [`Election::explain`] for every VIP, by address.
    pub fn report_all(&self) -> Vec<VipReport> {
        let mut out: Vec<VipReport> = (0..self.c.vips.len()).map(|v| self.report(v)).collect();
        out.sort_by_key(|r| r.ip);
        out
    }

    fn report(&self, v: usize) -> VipReport {
        let vip = &self.c.vips[v];
        let mut nodes: Vec<NodeId> = (0..self.c.slots.len() as NodeId)
            .filter(|&n| self.c.slots[n as usize].node.is_some())
            .collect();
        nodes.sort_by(|a, b| {
            self.c.slots[*a as usize]
                .name
                .cmp(&self.c.slots[*b as usize].name)
        });
        let mut wins = Vec::new();
        let mut virtual_nodes = Vec::new();
        let mut excluded = Vec::new();
        for n in nodes {
            let slot = &self.c.slots[n as usize];
            match self.c.exclusion(v, n) {
                None => wins.push(Win {
                    node: n,
                    score: self.c.classes[vip.class.expect("candidate has a class")].score
                        [n as usize],
                    hash: rank_key(&slot.name, &vip.text),
                }),
                Some(reason) if self.goes_virtual(n, Some(reason)) => {
                    virtual_nodes.push(slot.name.clone())
                }
                Some(reason) => excluded.push(Excluded {
                    node: slot.name.clone(),
                    reason,
                }),
            }
        }
        let mut by_hash: Vec<([u8; 32], NodeId)> = wins.iter().map(|w| (w.hash, w.node)).collect();
        by_hash.sort();
        wins.sort_by(|a, b| self.c.order(a, b));
        let candidates: Vec<Candidate> = wins
            .iter()
            .map(|w| Candidate {
                node: self.c.slots[w.node as usize].name.clone(),
                score: w.score,
                hash_rank: 1 + by_hash
                    .iter()
                    .position(|(_, n)| *n == w.node)
                    .expect("present"),
                hash: w.hash,
            })
            .collect();
        let winner = candidates.first().map(|c| c.node.clone());
        let winner_on = wins
            .first()
            .and_then(|w| self.c.announce_target(v, w.node))
            .cloned();
        debug_assert_eq!(
            winner.as_deref(),
            self.winners[v].map(|w| self.c.slots[w.node as usize].name.as_str()),
            "incremental winner must equal the full computation for {}",
            vip.ip
        );
        VipReport {
            ip: vip.ip,
            services: vip
                .services
                .iter()
                .map(|&s| self.c.services[s].clone())
                .collect(),
            pool: vip.pool.clone(),
            winner,
            winner_on,
            candidates,
            virtual_nodes,
            excluded,
            note: vip.note.clone(),
        }
    }

    /// Compile pools, advertisements and Services into classes and VIPs.
    fn compile(&mut self, cluster: &Cluster) {
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
            vips.push(Vip {
                ip,
                text: ip.to_string(),
                services: svcs,
                pool: pool.map(|p| pools[p].name.clone()),
                class,
                local_traffic: oldest.local_traffic,
                endpoints,
                note,
            });
        }

        let classes = class_ads
            .iter()
            .map(|ads| build_class(ads, &compiled_ads, n_slots))
            .collect();

        self.vip_of = vips.iter().enumerate().map(|(i, v)| (v.ip, i)).collect();
        self.c.classes = classes;
        self.c.vips = vips;
        self.c.services = services.iter().map(|s| s.key.clone()).collect();
    }
}

/// Which nodes a VIP's endpoints allow (SPEC §5.5).
fn endpoint_filter(
    slot_of: &HashMap<String, NodeId>,
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
        .filter_map(|n| slot_of.get(n).copied())
        .collect();
    ids.sort_unstable();
    if ids.is_empty() {
        EndpointFilter::Nowhere
    } else {
        EndpointFilter::Only(ids)
    }
}

fn build_class(ads: &[usize], compiled: &[CompiledAd], n_slots: usize) -> Class {
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
        eligible,
        score,
        tiers,
        iface_sets,
        iface_of,
    }
}

impl Compiled {
    /// The one place the rules of SPEC §5.3–5.5 live: why node `n` is not a
    /// candidate for VIP `v`, or `None` when it is one.
    fn exclusion(&self, v: usize, n: NodeId) -> Option<Reason> {
        let vip = &self.vips[v];
        let slot = &self.slots[n as usize];
        let Some(facts) = &slot.node else {
            return Some(Reason::NotEligible);
        };
        let Some(class) = vip.class.map(|c| &self.classes[c]) else {
            return Some(Reason::NotEligible);
        };
        if !class.eligible.get(n as usize).copied().unwrap_or(false) {
            return Some(Reason::NotEligible);
        }
        if let Some(veto) = facts.veto {
            return Some(veto);
        }
        let Some(member) = &slot.member else {
            return Some(Reason::NotLive);
        };
        if member.leaving {
            return Some(Reason::Leaving);
        }
        match &vip.endpoints {
            EndpointFilter::Anywhere => {}
            EndpointFilter::Nowhere => return Some(Reason::NoReadyEndpoint),
            EndpointFilter::Only(ids) => {
                if ids.binary_search(&n).is_err() {
                    return Some(Reason::NoReadyEndpoint);
                }
            }
        }
        if self.announce_target(v, n).is_none() {
            // Off-link only if no interface at all has the prefix: a node
            // that has it on an interface the advertisements do not allow
            // must not go virtual, since with Linux's default `arp_ignore=0`
            // its kernel would answer ARP for the virtual address on that
            // interface, beside the winner.
            return Some(
                if member.on_link.iter().any(|o| o.prefix.contains(vip.ip)) {
                    Reason::InterfaceNotAllowed
                } else {
                    Reason::NotOnLink
                },
            );
        }
        None
    }

    /// Where node `n` would hold VIP `v` (SPEC §6): the first listed
    /// interface with an on-link prefix containing the address, else the
    /// announce interface; the most specific prefix on that interface.
    fn announce_target(&self, v: usize, n: NodeId) -> Option<&OnLink> {
        let vip = &self.vips[v];
        let class = &self.classes[vip.class?];
        let member = self.slots[n as usize].member.as_ref()?;
        let set = &class.iface_sets[class.iface_of[n as usize] as usize];
        let best = |pred: &dyn Fn(&OnLink) -> bool| {
            member
                .on_link
                .iter()
                .filter(|o| pred(o) && o.prefix.contains(vip.ip))
                .max_by_key(|o| o.prefix.prefix_len())
        };
        set.names
            .iter()
            .find_map(|name| best(&|o: &OnLink| o.interface == *name))
            .or_else(|| {
                if set.announce {
                    best(&|o: &OnLink| o.announce)
                } else {
                    None
                }
            })
    }

    /// Election order: score descending, then rank key ascending (then name,
    /// which only matters if sha256 ever collides).
    fn order(&self, a: &Win, b: &Win) -> Ordering {
        b.score
            .cmp(&a.score)
            .then_with(|| a.hash.cmp(&b.hash))
            .then_with(|| {
                self.slots[a.node as usize]
                    .name
                    .cmp(&self.slots[b.node as usize].name)
            })
    }

    fn win(&self, v: usize, class: &Class, n: NodeId) -> Win {
        Win {
            node: n,
            score: class.score[n as usize],
            hash: rank_key(&self.slots[n as usize].name, &self.vips[v].text),
        }
    }

    /// The best candidate among `nodes`, hashing each candidate.
    fn best_of(
        &self,
        v: usize,
        class: &Class,
        nodes: &[NodeId],
        skip: Option<NodeId>,
    ) -> Option<Win> {
        nodes
            .iter()
            .filter(|&&n| Some(n) != skip && self.exclusion(v, n).is_none())
            .map(|&n| self.win(v, class, n))
            .min_by(|a, b| self.order(a, b))
    }
}

/// Elect VIP `v` from scratch (using the cached hash order when it helps),
/// with node `skip`, if any, no candidate (the runner-up, when it is the
/// winner).
fn elect(
    c: &Compiled,
    orders: &mut HashMap<IpAddr, Order>,
    v: usize,
    skip: Option<NodeId>,
) -> Option<Win> {
    let vip = &c.vips[v];
    let class = &c.classes[vip.class?];
    match &vip.endpoints {
        EndpointFilter::Nowhere => return None,
        EndpointFilter::Only(ids) if ids.len() <= c.direct_hash_max => {
            return c.best_of(v, class, ids, skip);
        }
        _ => {}
    }
    for tier in &class.tiers {
        if tier.nodes.len() <= c.direct_hash_max {
            if let Some(w) = c.best_of(v, class, &tier.nodes, skip) {
                return Some(w);
            }
            continue;
        }
        // Walk the nodes in hash order: the first candidate met with a given
        // score is the lowest hash of that score; stop at the best possible.
        // A cached prefix that ends before that is deepened and walked again.
        let order = orders
            .entry(vip.ip)
            .or_insert_with(|| Order::build(&c.slots, &vip.text, c.order_depth));
        loop {
            let mut best: Option<NodeId> = None;
            let mut best_score = 0;
            let mut settled = false;
            for &n in &order.ids {
                let s = class.score[n as usize];
                if best.is_some() && s <= best_score {
                    continue;
                }
                if Some(n) != skip && c.exclusion(v, n).is_none() {
                    best = Some(n);
                    best_score = s;
                    if s >= tier.score {
                        settled = true;
                        break;
                    }
                }
            }
            if settled || order.complete {
                return best.map(|n| c.win(v, class, n));
            }
            *order = Order::build(&c.slots, &vip.text, order.ids.len() * 4);
        }
    }
    None
}

/// How many nodes of each VIP's hash order are kept at first: enough to end
/// nearly every walk, while memory stays small next to the full order.
const ORDER_DEPTH: usize = 32;

/// The first `ids.len()` nodes in `sha256(node#ip)` order; `complete` when
/// that is every node. The order depends only on node names and the address,
/// so it survives every configuration and membership change.
struct Order {
    ids: Vec<NodeId>,
    complete: bool,
}

impl Order {
    fn build(slots: &[Slot], ip_text: &str, depth: usize) -> Order {
        let mut keyed: Vec<([u8; 32], NodeId)> = slots
            .iter()
            .enumerate()
            .map(|(i, s)| (rank_key(&s.name, ip_text), i as NodeId))
            .collect();
        let by_key = |a: &([u8; 32], NodeId), b: &([u8; 32], NodeId)| {
            a.0.cmp(&b.0)
                .then_with(|| slots[a.1 as usize].name.cmp(&slots[b.1 as usize].name))
        };
        let complete = depth >= keyed.len();
        if !complete {
            keyed.select_nth_unstable_by(depth, by_key);
            keyed.truncate(depth);
        }
        keyed.sort_unstable_by(by_key);
        // A fresh vector: collecting from `keyed` in place would keep its
        // much larger buffer alive for every VIP.
        let mut ids = Vec::with_capacity(keyed.len());
        ids.extend(keyed.iter().map(|&(_, n)| n));
        Order { ids, complete }
    }

    /// Place a new node: inside the kept prefix, or nowhere when it sorts
    /// after a prefix that is already not the whole order.
    fn insert(&mut self, slots: &[Slot], id: NodeId, ip_text: &str) {
        let name = &slots[id as usize].name;
        let key = (rank_key(name, ip_text), name.as_str());
        let pos = self.ids.partition_point(|&n| {
            let s = &slots[n as usize].name;
            (rank_key(s, ip_text), s.as_str()) < key
        });
        if pos < self.ids.len() || self.complete {
            self.ids.insert(pos, id);
            if !self.complete {
                self.ids.pop();
            }
        }
    }
}

fn changed(
    before: &HashMap<IpAddr, Option<NodeId>>,
    after: &HashMap<IpAddr, Option<NodeId>>,
) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = after
        .iter()
        .filter(|(ip, w)| before.get(ip) != Some(w))
        .map(|(ip, _)| *ip)
        .collect();
    out.extend(before.keys().filter(|ip| !after.contains_key(ip)));
    out.sort();
    out
}

/// The whole election for a cluster and its live members, explained.
pub fn elect_all(cluster: &Cluster, members: impl IntoIterator<Item = Member>) -> Vec<VipReport> {
    Election::new(cluster, members).report_all()
}
