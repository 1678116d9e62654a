//! The rules of SPEC §5, in one place: who is excluded from a VIP and
//! why, where it would be announced, and the order of two candidates.

use std::cmp::Ordering;

use super::super::hash::rank_key;
use super::super::report::Reason;
use super::super::view::OnLink;
use super::{Class, Compiled, EndpointFilter, NodeId, Win};

impl Compiled {
    /// The one place the rules of SPEC §5.3–5.5 live: why node `n` is not a
    /// candidate for VIP `v`, or `None` when it is one.
    pub(super) fn exclusion(&self, v: usize, n: NodeId) -> Option<Reason> {
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
    pub(super) fn announce_target(&self, v: usize, n: NodeId) -> Option<&OnLink> {
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

    /// Election order: a node of last resort (drained, or its gateway
    /// lost) after every other, then a sticky VIP's holders before the
    /// rest, then score descending, then rank key ascending (then name,
    /// which only matters if sha256 ever collides).
    pub(super) fn order(&self, a: &Win, b: &Win) -> Ordering {
        a.last_resort
            .cmp(&b.last_resort)
            .then_with(|| b.held.cmp(&a.held))
            .then_with(|| b.score.cmp(&a.score))
            .then_with(|| a.hash.cmp(&b.hash))
            .then_with(|| {
                let a_vip = a.vip as usize;
                // The same first 8 bytes (a chance of 2^-64): the whole
                // keys, then the names.
                let (a, b) = (&self.slots[a.node as usize], &self.slots[b.node as usize]);
                let text = &self.vips[a_vip].text;
                rank_key(&a.name, text)
                    .cmp(&rank_key(&b.name, text))
                    .then_with(|| a.name.cmp(&b.name))
            })
    }

    pub(super) fn win(&self, v: usize, class: &Class, n: NodeId) -> Win {
        Win {
            node: n,
            vip: v as u32,
            last_resort: self.last_resort_at(v, class, n),
            held: self.holds(v, n),
            score: class.score[n as usize],
            hash: self.vips[v].rank(n, &self.slots[n as usize].name),
        }
    }

    /// Node `n` holds sticky VIP `v`, as its gossip says.
    pub(super) fn holds(&self, v: usize, n: NodeId) -> bool {
        let vip = &self.vips[v];
        vip.sticky
            && self
                .holders
                .get(&vip.ip)
                .is_some_and(|ids| ids.binary_search(&n).is_ok())
    }

    /// The holders of sticky VIP `v`, if any.
    pub(super) fn holders_of(&self, v: usize) -> &[NodeId] {
        let vip = &self.vips[v];
        match self.holders.get(&vip.ip) {
            Some(ids) if vip.sticky => ids,
            _ => &[],
        }
    }

    /// Node `n` ranks after every other node for VIP `v` of `class`:
    /// drained, or its gateway toward the VIP's network is lost (wherever
    /// it would hold `v`, no client beyond the router reaches it).
    pub(super) fn last_resort_at(&self, v: usize, class: &Class, n: NodeId) -> bool {
        self.drained_for(class, n) || self.upstream_lost_at(v, n)
    }

    /// Node `n` would hold VIP `v` on an interface whose default gateway
    /// stopped answering (see `OnLink::upstream_lost`).
    pub(super) fn upstream_lost_at(&self, v: usize, n: NodeId) -> bool {
        // Asked of every candidate of every election: most nodes have lost
        // no gateway, and need no announce target worked out for it.
        self.slots[n as usize]
            .member
            .as_ref()
            .is_some_and(|m| m.on_link.iter().any(|o| o.upstream_lost))
            && self.announce_target(v, n).is_some_and(|o| o.upstream_lost)
    }

    /// Node `n` is drained for the VIPs of `class`: by its operator, or
    /// cordoned where an advertisement of the class counts a cordon.
    pub(super) fn drained_for(&self, class: &Class, n: NodeId) -> bool {
        self.drained(n) || self.cordon_drains(class, n)
    }

    /// Node `n` is cordoned (`spec.unschedulable`) and an advertisement of
    /// `class` counts that as a drain.
    pub(super) fn cordon_drains(&self, class: &Class, n: NodeId) -> bool {
        class.drains_cordoned
            && self.slots[n as usize]
                .node
                .as_ref()
                .is_some_and(|f| f.cordoned)
    }

    /// Node `n` is a Node of the cluster that `class`'s advertisements
    /// select and that no rule excludes whatever the advertisement.
    pub(super) fn eligible_in(&self, class: &Class, n: NodeId) -> bool {
        class.eligible.get(n as usize).copied().unwrap_or(false)
            && self.slots[n as usize]
                .node
                .as_ref()
                .is_some_and(|f| f.veto.is_none())
    }

    /// [`Compiled::drained_for`] the class of VIP `v`.
    pub(super) fn drained_at(&self, v: usize, n: NodeId) -> bool {
        match self.vips[v].class {
            Some(class) => self.drained_for(&self.classes[class], n),
            None => self.drained(n),
        }
    }

    /// Node `n` is a live member drained by its operator.
    pub(super) fn drained(&self, n: NodeId) -> bool {
        self.slots[n as usize]
            .member
            .as_ref()
            .is_some_and(|m| m.drained)
    }

    /// The best candidate among `nodes` for which `usable` says so,
    /// hashing each.
    pub(super) fn best_of(
        &self,
        v: usize,
        class: &Class,
        nodes: &[NodeId],
        usable: &dyn Fn(NodeId) -> bool,
    ) -> Option<Win> {
        nodes
            .iter()
            .filter(|&&n| usable(n))
            .map(|&n| self.win(v, class, n))
            .min_by(|a, b| self.order(a, b))
    }
}
