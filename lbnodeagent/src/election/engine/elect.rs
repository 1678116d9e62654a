//! Electing: the winner of each VIP by walking its cached order by
//! `sha256(node#ip)` through its top score tier.

use std::net::IpAddr;

use foldhash::HashMap;

use super::super::hash::{order_key, rank_key};
use super::super::report::VipReport;
use super::super::view::{Cluster, Member};
use super::{Compiled, Election, EndpointFilter, NodeId, Slot, Win};

/// Elect VIP `v` from scratch (using the cached hash order when it helps),
/// with node `skip`, if any, no candidate (the runner-up, when it is the
/// winner). Nodes of last resort (drained, or their gateway lost) are
/// passed over first, and asked only when no other node is a candidate.
pub(super) fn elect(
    c: &Compiled,
    orders: &mut HashMap<IpAddr, Order>,
    v: usize,
    skip: Option<NodeId>,
) -> Option<Win> {
    elect_among(c, orders, v, skip, false).or_else(|| {
        let class = &c.classes[c.vips[v].class?];
        let any_last_resort = (0..c.slots.len() as NodeId).any(|n| c.last_resort_at(v, class, n));
        if any_last_resort {
            elect_among(c, orders, v, skip, true)
        } else {
            None
        }
    })
}

/// [`elect`] over the nodes that are not of last resort, or over every node.
fn elect_among(
    c: &Compiled,
    orders: &mut HashMap<IpAddr, Order>,
    v: usize,
    skip: Option<NodeId>,
    with_last_resort: bool,
) -> Option<Win> {
    let vip = &c.vips[v];
    let class = &c.classes[vip.class?];
    let usable = |n: NodeId| {
        Some(n) != skip
            && (with_last_resort || !c.last_resort_at(v, class, n))
            && c.exclusion(v, n).is_none()
    };
    // A sticky VIP's holders come first (see `Compiled::order`).
    if let Some(w) = c.best_of(v, class, c.holders_of(v), &usable) {
        return Some(w);
    }
    match &vip.endpoints {
        EndpointFilter::Nowhere => return None,
        EndpointFilter::Only(ids) if ids.len() <= c.direct_hash_max => {
            return c.best_of(v, class, ids, &usable);
        }
        _ => {}
    }
    for tier in &class.tiers {
        if tier.nodes.len() <= c.direct_hash_max {
            if let Some(w) = c.best_of(v, class, &tier.nodes, &usable) {
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
                if usable(n) {
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
pub(super) const ORDER_DEPTH: usize = 32;

/// The first `ids.len()` nodes in `sha256(node#ip)` order; `complete` when
/// that is every node. The order depends only on node names and the address,
/// so it survives every configuration and membership change.
pub(super) struct Order {
    ids: Vec<NodeId>,
    complete: bool,
}

impl Order {
    pub(super) fn build(slots: &[Slot], ip_text: &str, depth: usize) -> Order {
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
    pub(super) fn insert(&mut self, slots: &[Slot], id: NodeId, ip_text: &str) {
        let name = &slots[id as usize].name;
        let key = order_key(name, ip_text);
        let pos = self.ids.partition_point(|&n| {
            let s = &slots[n as usize].name;
            order_key(s, ip_text) < key
        });
        if pos < self.ids.len() || self.complete {
            self.ids.insert(pos, id);
            if !self.complete {
                self.ids.pop();
            }
        }
    }
}

pub(super) fn changed(
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
