//! What the agent asks of the election: winners, duties, runners-up, and
//! who outranks whom.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::net::IpAddr;

use foldhash::HashMap;

use super::super::hash::rank_key;
use super::super::report::Reason;
use super::super::view::Member;
use super::elect::elect;
use super::{Class, Duty, Election, NodeId};
use crate::election::NodeName;

impl Election {
    /// Whether `node` outranks `other` for `ip` by the election's order with
    /// liveness ignored (eligibility, then score, then hash). Two nodes that
    /// both hold a VIP because each thinks the other dead (a partition that
    /// drops gossip but not ARP) ask this and agree, without talking, on
    /// which keeps it: from what both sides know alike, the cluster
    /// objects, and not drains, which one side may have heard of and the
    /// other not. Between nodes that hear each other's gossip (two live
    /// holders, or an owner gossip still shows but whose beats stopped),
    /// `drains` counts each one's drain as last seen, and a gateway its
    /// gossip says it lost, as the election does, so an owner that won
    /// only because this node is drained outranks it.
    /// `None` when the address is unknown.
    pub fn outranks(&self, ip: IpAddr, node: &str, other: &str, drains: bool) -> Option<bool> {
        self.outranks_with(ip, node, other, drains, None)
    }

    /// [`Election::outranks`] where `holder` answers for `ip` and `other`
    /// only asks the LAN before taking it: a sticky VIP's holder comes
    /// first (after nodes of last resort), as in the election. Without
    /// that, a node that ranks first by hash, asking about a sticky VIP
    /// whose holder's agent stalled for a moment (out of its view, its
    /// kernel answering), would take it from the holder.
    pub fn outranks_holding(
        &self,
        ip: IpAddr,
        holder: &str,
        other: &str,
        drains: bool,
    ) -> Option<bool> {
        self.outranks_with(ip, holder, other, drains, Some(holder))
    }

    fn outranks_with(
        &self,
        ip: IpAddr,
        node: &str,
        other: &str,
        drains: bool,
        holder: Option<&str>,
    ) -> Option<bool> {
        let v = *self.vip_of.get(&ip)?;
        let vip = &self.c.vips[v];
        let sticky = vip.sticky;
        let rank = |name: &str| -> Option<(bool, bool, std::cmp::Reverse<u32>, [u8; 32])> {
            let (class, id) = self.class_and_node(v, name)?;
            if !self.c.eligible_in(class, id) {
                return None;
            }
            // A cordon is a cluster object: both sides know it alike.
            Some((
                (drains
                    && (self.c.slots[id as usize].drained_seen || self.c.upstream_lost_at(v, id)))
                    || self.c.cordon_drains(class, id),
                !(sticky && holder == Some(name)),
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

    /// Whether `ip` is placed sticky (see [`Election::set_holders`]).
    pub fn sticky(&self, ip: IpAddr) -> bool {
        self.vip_of.get(&ip).is_some_and(|&v| self.c.vips[v].sticky)
    }

    /// Whether `node` may serve `ip` at all by the cluster objects and its
    /// links (liveness and drains aside); `None` when either is unknown.
    pub fn eligible(&self, ip: IpAddr, node: &str) -> Option<bool> {
        let (class, id) = self.class_and_node(*self.vip_of.get(&ip)?, node)?;
        Some(self.c.eligible_in(class, id))
    }

    /// Whether `node` is cordoned and an advertisement of `ip` counts that
    /// as a drain.
    pub fn cordon_drains(&self, ip: IpAddr, node: &str) -> bool {
        self.vip_of
            .get(&ip)
            .and_then(|&v| self.class_and_node(v, node))
            .is_some_and(|(class, id)| self.c.cordon_drains(class, id))
    }

    /// Whether `node`'s gossip says its gateway toward where it would hold
    /// `ip` is lost (see `OnLink::upstream_lost`).
    pub fn upstream_lost(&self, ip: IpAddr, node: &str) -> bool {
        self.vip_of
            .get(&ip)
            .zip(self.slot_of.get(node))
            .is_some_and(|(&v, &id)| {
                self.c.slots[id as usize].member.is_some() && self.c.upstream_lost_at(v, id)
            })
    }

    /// VIP `v`'s class and `node`'s id, when the VIP has a class and the
    /// node is a Node of the cluster.
    fn class_and_node(&self, v: usize, node: &str) -> Option<(&Class, NodeId)> {
        let id = *self.slot_of.get(node)?;
        self.c.slots[id as usize].node.as_ref()?;
        Some((&self.c.classes[self.c.vips[v].class?], id))
    }

    /// Live members as the engine has them, by name.
    /// Whether `name` is a Node of the cluster (not only a gossip member).
    pub fn is_node(&self, name: &str) -> bool {
        self.slot_of
            .get(name)
            .is_some_and(|id| self.c.slots[*id as usize].node.is_some())
    }

    pub fn member(&self, node: &str) -> Option<&Member> {
        let id = *self.slot_of.get(node)?;
        self.c.slots[id as usize].member.as_ref()
    }

    pub(super) fn winner_ids(&self) -> HashMap<IpAddr, Option<NodeId>> {
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

    pub(super) fn duty_of(&self, v: usize, id: NodeId) -> Option<Duty> {
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
        self.holds_virtual(v, id)
            .then_some(Duty::Virtual { ip: vip.ip })
    }

    /// Whether node `n` holds VIP `v` on its virtual interface: it goes
    /// virtual for it and is not drained, or it is drained and no node
    /// that is not drained goes virtual for it (the last resort, as in
    /// the LAN election).
    pub(super) fn holds_virtual(&self, v: usize, n: NodeId) -> bool {
        if !self.goes_virtual(n, self.c.exclusion(v, n)) {
            return false;
        }
        !self.c.drained_at(v, n)
            || !(0..self.c.slots.len() as NodeId).any(|m| {
                m != n && !self.c.drained_at(v, m) && self.goes_virtual(m, self.c.exclusion(v, m))
            })
    }

    /// Whether node `n`, kept out of a VIP's election for `exclusion`,
    /// holds it on its virtual interface instead: the address is on none
    /// of its links and its agent runs virtual mode.
    pub(super) fn goes_virtual(&self, n: NodeId, exclusion: Option<Reason>) -> bool {
        exclusion == Some(Reason::NotOnLink)
            && self.c.slots[n as usize]
                .member
                .as_ref()
                .is_some_and(|m| m.virtual_mode)
    }

    /// The VIPs `node` would hold on its virtual interface were its virtual
    /// mode on, that nobody serves now: no node is on-link for them (no
    /// winner), and `node` is kept out only for being off-link. A VIP that
    /// another node serves on its LAN is not counted: a node of another
    /// segment with virtual mode off is as configured, not broken.
    pub fn routed_unserved(&self, node: &str) -> Vec<IpAddr> {
        let Some(&id) = self.slot_of.get(node) else {
            return Vec::new();
        };
        let Some(member) = self.c.slots[id as usize].member.as_ref() else {
            return Vec::new();
        };
        if member.virtual_mode {
            return Vec::new();
        }
        (0..self.c.vips.len())
            .filter(|&v| {
                self.winners[v].is_none() && self.c.exclusion(v, id) == Some(Reason::NotOnLink)
            })
            .map(|v| self.c.vips[v].ip)
            .collect()
    }

    /// The nodes holding `ip` on their virtual interfaces, by name: the
    /// report's `virtual_nodes`, without ranking the candidates (a sha256
    /// per node), for callers that ask about every VIP.
    pub fn virtual_nodes(&self, ip: IpAddr) -> Vec<&str> {
        let Some(&v) = self.vip_of.get(&ip) else {
            return Vec::new();
        };
        let mut names: Vec<&str> = (0..self.c.slots.len() as NodeId)
            .filter(|&n| self.c.slots[n as usize].node.is_some() && self.holds_virtual(v, n))
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
    pub fn runners_up(&mut self) -> BTreeMap<NodeName, Vec<(IpAddr, NodeName)>> {
        let mut out: BTreeMap<NodeName, Vec<(IpAddr, NodeName)>> = BTreeMap::new();
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
}
