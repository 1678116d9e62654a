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
//! Every rule lives in `rules.rs` (`Compiled::exclusion`): the fast path and the full
//! explanation ([`Election::explain`]) both ask it, so they cannot disagree.

mod compile;
mod elect;
mod explain;
mod queries;
mod rules;

use std::cmp::Ordering;
use std::net::IpAddr;

use foldhash::{HashMap, HashMapExt};
use hostlb_api::Selector;
use hostlb_api::annotations::EXCLUDE_FROM_EXTERNAL_LB;

use super::hash::rank_key;
use super::node::NodeName;
use super::report::{Note, Reason};
use super::view::{Cluster, Endpoints, Labels, Member, OnLink};
use compile::endpoint_filter;
pub use elect::elect_all;
use elect::{ORDER_DEPTH, Order, changed, elect};

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
    name: NodeName,
    /// Facts from the Node object; `None` when there is no Node of that name.
    node: Option<NodeFacts>,
    member: Option<Member>,
    /// The node was drained when last a member: kept after it leaves the
    /// membership, for [`Election::outranks`] of an owner that gossip still
    /// shows but whose beats stopped.
    drained_seen: bool,
}

struct NodeFacts {
    labels: Labels,
    /// Rules that exclude the node whatever the advertisement.
    veto: Option<Reason>,
    /// `spec.unschedulable`: drained where the class says so.
    cordoned: bool,
}

struct CompiledAd {
    service_selectors: Vec<Selector>,
    interfaces: Vec<String>,
    /// Per node: `nodeSelectors` match.
    matches: Vec<bool>,
    /// Per node: sum of matching preference weights, zero where `!matches`.
    score: Vec<u32>,
    drain_cordoned: bool,
    sticky: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct IfaceSet {
    /// Listed interfaces, in the order the advertisements list them.
    names: Vec<String>,
    /// Some applicable advertisement lists no interface: the announce one.
    announce: bool,
}

struct Class {
    /// An advertisement of the class counts cordoned nodes as drained.
    drains_cordoned: bool,
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
    /// Placed sticky (see [`Election::set_holders`]).
    sticky: bool,
    text: String,
    /// Indices into `Compiled::services`, oldest first.
    services: Vec<usize>,
    pool: Option<String>,
    class: Option<usize>,
    /// `externalTrafficPolicy: Local` on the oldest Service.
    local_traffic: bool,
    endpoints: EndpointFilter,
    note: Option<Note>,
    /// The rank keys worked out so far, by node: one VIP is elected many
    /// times per cluster view (every membership change, every runner-up
    /// and orphan asked), each time hashing the same few nodes. Only the
    /// key's first 8 bytes, and only the first [`RANKS_KEPT`] nodes: a
    /// few bytes per VIP, whatever the cluster's size.
    ranks: RankCache,
}

/// A VIP's rank keys worked out so far (see `Vip::ranks`).
type RankCache = std::cell::RefCell<Vec<(NodeId, u64)>>;

/// Rank keys kept per VIP (see `Vip::ranks`): the nodes a small tier or
/// an endpoint list hashes directly.
const RANKS_KEPT: usize = 16;

impl Vip {
    /// The first 8 bytes of `sha256(node#ip)`, in order: what decides
    /// nearly every tie (see [`Compiled::order`] for the rest).
    fn rank(&self, n: NodeId, name: &str) -> u64 {
        let mut ranks = self.ranks.borrow_mut();
        if let Some(&(_, r)) = ranks.iter().find(|(m, _)| *m == n) {
            return r;
        }
        let key = rank_key(name, &self.text);
        let r = u64::from_be_bytes(key[..8].try_into().expect("8 bytes"));
        if ranks.len() < RANKS_KEPT {
            ranks.push((n, r));
        }
        r
    }
}

/// Everything compiled from the cluster; read-only while electing, but
/// for each VIP's rank keys, kept as they are first worked out.
#[derive(Default)]
struct Compiled {
    slots: Vec<Slot>,
    classes: Vec<Class>,
    vips: Vec<Vip>,
    services: Vec<String>,
    /// Per sticky VIP, the members whose gossip shows it held, by id (see
    /// [`Election::set_holders`]); kept across cluster views.
    holders: HashMap<IpAddr, Vec<NodeId>>,
    /// Some VIP is sticky.
    any_sticky: bool,
    direct_hash_max: usize,
    order_depth: usize,
}

#[derive(Clone, Copy)]
struct Win {
    node: NodeId,
    /// The VIP's index in `Compiled::vips`.
    vip: u32,
    /// The node is drained: it ranks after every node that is not,
    /// whatever its score.
    last_resort: bool,
    /// A sticky VIP's holder: it ranks before every node that does not
    /// hold it (but after none of last resort).
    held: bool,
    score: u32,
    /// The first 8 bytes of the rank key (see [`Vip::rank`]).
    hash: u64,
}

/// The election for every VIP of the cluster. See the module docs.
pub struct Election {
    c: Compiled,
    slot_of: HashMap<NodeName, NodeId>,
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
            e.c.slots[id as usize].drained_seen = m.drained;
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
                cordoned: n.cordoned,
            });
        }
        self.compile(cluster);
        self.orders.retain(|ip, _| self.vip_of.contains_key(ip));
        let (vip_of, vips) = (&self.vip_of, &self.c.vips);
        self.c
            .holders
            .retain(|ip, _| vip_of.get(ip).is_some_and(|&v| vips[v].sticky));
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
        slot.drained_seen = member.drained;
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
        let keep: foldhash::HashSet<&str> = members.clone().map(|m| m.node.as_str()).collect();
        let gone: Vec<NodeName> = self
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
                let challenger = self.c.win(v, class, id);
                match old {
                    Some(w) if self.c.order(&w, &challenger) != Ordering::Greater => old,
                    _ => Some(challenger),
                }
            } else {
                old
            };
            // Kept even when the node is the same: a winner that was
            // drained and no longer is ranks differently from now on.
            self.winners[v] = new;
            if new.map(|w| w.node) != old.map(|w| w.node) {
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
        let name = NodeName::from(name);
        self.c.slots.push(Slot {
            name: name.clone(),
            node: None,
            member: None,
            drained_seen: false,
        });
        self.slot_of.insert(name, id);
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

    /// Whether any VIP is placed sticky: only then do holders count.
    pub fn any_sticky(&self) -> bool {
        self.c.any_sticky
    }

    /// Which members hold which addresses, as their gossip says (each
    /// `(address, node)` once). Only sticky VIPs read it: one stays with
    /// the best of its holders that is a candidate, and is elected as
    /// usual when none is (its holder gone, drained, cut off from its
    /// gateway, or no longer eligible). Every agent reads the same gossip,
    /// so all come to the same holder once it has spread; until then a
    /// node that has not heard of the holder asks the LAN before taking the
    /// VIP and finds it answered. Returns the addresses whose winner moved.
    pub fn set_holders<'a>(
        &mut self,
        holders: impl IntoIterator<Item = (IpAddr, &'a str)>,
    ) -> Vec<IpAddr> {
        let mut next: HashMap<IpAddr, Vec<NodeId>> = HashMap::new();
        for (ip, node) in holders {
            let (Some(&v), Some(&id)) = (self.vip_of.get(&ip), self.slot_of.get(node)) else {
                continue;
            };
            if self.c.vips[v].sticky {
                let ids = next.entry(ip).or_default();
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        for ids in next.values_mut() {
            ids.sort_unstable();
        }
        if next == self.c.holders {
            return Vec::new();
        }
        let mut touched: Vec<IpAddr> = next
            .iter()
            .filter(|(ip, ids)| self.c.holders.get(*ip) != Some(*ids))
            .map(|(ip, _)| *ip)
            .chain(
                self.c
                    .holders
                    .keys()
                    .filter(|ip| !next.contains_key(*ip))
                    .copied(),
            )
            .collect();
        touched.sort();
        self.c.holders = next;
        self.epoch += 1;
        let mut moved = Vec::new();
        for ip in touched {
            let v = self.vip_of[&ip];
            let old = self.winners[v];
            self.winners[v] = elect(&self.c, &mut self.orders, v, None);
            if self.winners[v].map(|w| w.node) != old.map(|w| w.node) {
                moved.push(ip);
            }
        }
        moved
    }
}
