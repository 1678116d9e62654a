//! Every VIP this node deals with: its [`Slot`], whether it must be
//! decided again, and every address this run held.
//!
//! A slot is made when the VIP is first wanted here or found held, and
//! goes once it is idle (neither wanted, held, in the kernel's hands nor
//! waiting on a retry). Only unsettled slots are decided at a step: an
//! input that can change a VIP's next move marks it, and
//! [`Core::decide`](super::Core::decide) drops the mark once the slot is
//! settled (see [`Slot::settled`]).

use std::collections::{BTreeMap, BTreeSet, btree_map};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::links::Want;
use super::slot::{Held, Op, Slot};

pub(super) struct Vips {
    slots: BTreeMap<IpAddr, Slot>,
    /// Slots that are not [`Slot::settled`], decided at every step.
    unsettled: BTreeSet<IpAddr>,
    /// Every VIP's want read again, and each decided, at the next step.
    all_dirty: bool,
    /// Every address of the cluster's this run held: never taken for the
    /// host's own by the firewall (see
    /// [`Core::plan_firewall`](super::Core::plan_firewall)), also for the
    /// moment after its removal when the links read still shows it.
    /// Pruned to the cluster's addresses.
    ever_held: BTreeSet<IpAddr>,
}

impl Default for Vips {
    fn default() -> Vips {
        Vips {
            slots: BTreeMap::new(),
            unsettled: BTreeSet::new(),
            all_dirty: true,
            ever_held: BTreeSet::new(),
        }
    }
}

impl Vips {
    pub(super) fn get(&self, ip: &IpAddr) -> Option<&Slot> {
        self.slots.get(ip)
    }

    pub(super) fn get_mut(&mut self, ip: &IpAddr) -> Option<&mut Slot> {
        self.slots.get_mut(ip)
    }

    pub(super) fn iter(&self) -> btree_map::Iter<'_, IpAddr, Slot> {
        self.slots.iter()
    }

    pub(super) fn values(&self) -> btree_map::Values<'_, IpAddr, Slot> {
        self.slots.values()
    }

    /// Every slot, for what changes none's next move (renewals and
    /// announcement rounds, which a held slot carries on its own).
    pub(super) fn values_mut(&mut self) -> btree_map::ValuesMut<'_, IpAddr, Slot> {
        self.slots.values_mut()
    }

    pub(super) fn ips(&self) -> Vec<IpAddr> {
        self.slots.keys().copied().collect()
    }

    pub(super) fn any_held(&self) -> bool {
        self.slots.values().any(|s| s.held().is_some())
    }

    pub(super) fn held_count(&self) -> usize {
        self.slots.values().filter(|s| s.held().is_some()).count()
    }

    /// An address found held (left by a previous run, or held by the
    /// kernel when the core thought it gone): held, held by this run, and
    /// decided again.
    pub(super) fn found_held(&mut self, ip: IpAddr, held: Held) -> &mut Slot {
        self.ever_held.insert(ip);
        self.unsettled.insert(ip);
        let slot = self.slots.entry(ip).or_default();
        slot.hold(held);
        slot
    }

    /// The operation in flight for `ip` came back: the VIP is decided
    /// again, and its slot handed over with the operation. `None` when it
    /// has no slot or nothing in flight.
    pub(super) fn take_op(&mut self, ip: IpAddr) -> Option<(Op, &mut Slot)> {
        let slot = self.slots.get_mut(&ip)?;
        let op = slot.take_op()?;
        self.unsettled.insert(ip);
        Some((op, slot))
    }

    /// Decided again at the next step.
    pub(super) fn unsettle(&mut self, ip: IpAddr) {
        self.unsettled.insert(ip);
    }

    /// The VIPs to decide now, in address order.
    pub(super) fn unsettled(&self) -> &BTreeSet<IpAddr> {
        &self.unsettled
    }

    /// What the election and the links want of `ip` here now: the VIP is
    /// decided again unless it has no slot and is not wanted. `Some(true)`
    /// when its want changed (or its slot was made).
    pub(super) fn want(&mut self, ip: IpAddr, want: Option<Want>) -> Option<bool> {
        let changed = match self.slots.get_mut(&ip) {
            Some(s) if s.want != want => {
                s.want = want;
                true
            }
            Some(_) => false,
            None if want.is_some() => {
                self.slots.insert(ip, Slot::wanting(want));
                true
            }
            None => return None,
        };
        self.unsettled.insert(ip);
        Some(changed)
    }

    /// What is wanted of every VIP here now (those not listed are not):
    /// each whose want changed, or that is not settled, is decided again.
    pub(super) fn want_all(&mut self, mut wants: BTreeMap<IpAddr, Want>) {
        for (ip, s) in &mut self.slots {
            let want = wants.remove(ip);
            if s.want != want {
                s.want = want;
                self.unsettled.insert(*ip);
            } else if !s.settled() {
                self.unsettled.insert(*ip);
            }
        }
        for (ip, want) in wants {
            self.slots.insert(ip, Slot::wanting(Some(want)));
            self.unsettled.insert(ip);
        }
    }

    /// Every VIP is read again and decided at the next step (a cluster
    /// view, new links, this node's own state changed).
    pub(super) fn refresh_all(&mut self) {
        self.all_dirty = true;
    }

    /// Whether every VIP is to be read again now; once.
    pub(super) fn take_refresh_all(&mut self) -> bool {
        std::mem::take(&mut self.all_dirty)
    }

    /// `ip` was decided: its slot goes if idle, and its mark if settled.
    /// One with no slot has nothing to decide.
    pub(super) fn decided(&mut self, ip: IpAddr) {
        match self.slots.get(&ip) {
            Some(s) if s.idle() => {
                self.slots.remove(&ip);
                self.unsettled.remove(&ip);
            }
            Some(s) if !s.settled() => {}
            _ => {
                self.unsettled.remove(&ip);
            }
        }
    }

    /// The kernel takes operations again: retries due later than `soon`
    /// from `now` are due then, and their VIPs decided again.
    pub(super) fn hasten_retries(&mut self, now: Instant, soon: Duration) {
        for (ip, s) in &mut self.slots {
            if let Some(r) = &mut s.retry
                && r.at > now + soon
            {
                r.at = now + soon;
                self.unsettled.insert(*ip);
            }
        }
    }

    /// Held addresses the kernel no longer has (`there`: ifindex and
    /// address of each it has), with no operation in flight: no longer
    /// held, and decided again. Returns them.
    pub(super) fn unhold_missing(&mut self, there: &BTreeSet<(u32, IpAddr)>) -> Vec<IpAddr> {
        let mut gone = Vec::new();
        for (ip, s) in &mut self.slots {
            if !s.busy()
                && s.held_at()
                    .is_some_and(|h| !there.contains(&(h.vip.ifindex, *ip)))
            {
                s.unhold();
                self.unsettled.insert(*ip);
                gone.push(*ip);
            }
        }
        gone
    }

    /// This run held `ip`.
    pub(super) fn held_once(&mut self, ip: IpAddr) {
        self.ever_held.insert(ip);
    }

    pub(super) fn ever_held(&self, ip: &IpAddr) -> bool {
        self.ever_held.contains(ip)
    }

    /// Forgets the addresses no longer the cluster's.
    pub(super) fn keep_ever_held(&mut self, keep: impl Fn(&IpAddr) -> bool) {
        self.ever_held.retain(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::core::links::Mode;
    use crate::model::{Lifetime, VipAddress};

    fn want(ip: IpAddr) -> Want {
        Want {
            vip: VipAddress {
                interface: "eth0".into(),
                ifindex: 2,
                ip,
                prefix_len: 24,
                lifetime: Lifetime::FOREVER,
            },
            mode: Mode::Local,
            target: None,
        }
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 77, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 77, 0, 2));

    /// A VIP wanted gets a slot and a mark; one neither wanted nor known
    /// gets neither; a want that does not change still marks it.
    #[test]
    fn a_want_makes_a_slot_and_marks_it() {
        let mut v = Vips::default();
        assert_eq!(v.want(A, None), None);
        assert!(v.get(&A).is_none() && v.unsettled().is_empty());
        assert_eq!(v.want(A, Some(want(A))), Some(true));
        assert!(v.unsettled().contains(&A));
        assert_eq!(v.want(A, Some(want(A))), Some(false));
    }

    /// Decided: a settled slot loses its mark, an idle one goes, one
    /// still moving keeps both.
    #[test]
    fn a_decided_slot_goes_when_idle_and_stays_marked_while_unsettled() {
        let now = Instant::now();
        let mut v = Vips::default();
        v.want(A, Some(want(A)));
        v.decided(A);
        assert!(v.unsettled().contains(&A), "wanted, not held: not settled");
        v.get_mut(&A).unwrap().hold(Held::new(want(A), Some(now)));
        v.decided(A);
        assert!(v.unsettled().is_empty() && v.get(&A).is_some());
        v.want(A, None);
        v.get_mut(&A).unwrap().unhold();
        v.decided(A);
        assert!(v.get(&A).is_none() && v.unsettled().is_empty());
    }

    /// A new set of wants: changed or unsettled VIPs are marked, a
    /// settled one that did not change is not.
    #[test]
    fn wanting_all_marks_only_what_moved() {
        let now = Instant::now();
        let mut v = Vips::default();
        v.want(A, Some(want(A)));
        v.get_mut(&A).unwrap().hold(Held::new(want(A), Some(now)));
        v.decided(A);
        v.want_all([(A, want(A)), (B, want(B))].into());
        assert_eq!(v.unsettled().iter().copied().collect::<Vec<_>>(), [B]);
        v.want_all(BTreeMap::new());
        assert!(v.unsettled().contains(&A), "no longer wanted");
    }

    /// Addresses gone from the kernel are no longer held, unless an
    /// operation on them is in flight.
    #[test]
    fn addresses_the_kernel_lost_are_unheld_unless_in_its_hands() {
        let now = Instant::now();
        let mut v = Vips::default();
        for ip in [A, B] {
            v.found_held(ip, Held::new(want(ip), Some(now)));
        }
        assert!(v.ever_held(&A) && v.unsettled().contains(&B));
        v.get_mut(&B).unwrap().renew(Lifetime::FOREVER);
        assert_eq!(v.unhold_missing(&BTreeSet::new()), [A]);
        assert!(v.get(&A).unwrap().held().is_none());
        assert!(v.get(&B).unwrap().held().is_some());
    }
}
