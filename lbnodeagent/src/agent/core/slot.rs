//! A VIP's state in the core, and small helpers over it.

use std::time::{Duration, Instant};

use crate::election::NodeName;
use crate::model::{MacAddr, VipAddress};

use super::links::Want;
use super::reason::LetGo;

/// A kernel operation that came back, as [`Slot::take_op`] hands it to
/// the result's handling.
#[derive(Clone, Debug)]
pub(super) enum Op {
    Add {
        want: Want,
        renew: bool,
    },
    Remove {
        vip: VipAddress,
        why: LetGo,
        /// The old place of a VIP that moved to another interface: the VIP
        /// stays held at its new place.
        stale: bool,
    },
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Retry {
    pub(super) at: Instant,
    pub(super) delay: Duration,
    /// The first failure of this run of failures.
    pub(super) since: Instant,
}

/// A pre-check under way: [`PRECHECK_PROBES`] questions on the wire,
/// [`PRECHECK_EVERY`] apart, and the window ends at `until`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Probing {
    pub(super) until: Instant,
    /// When the next question goes out, while some are left.
    pub(super) next: Instant,
    pub(super) left: u32,
}

/// A hand-over under way: what the winner has shown of it, and whether
/// this node answers on past its time.
#[derive(Clone, Debug)]
pub(super) struct Handover {
    /// Since when (restarted while the views differ).
    pub(super) since: Instant,
    /// To whom.
    pub(super) to: NodeName,
    /// The hostlb node whose MAC claimed it on the wire meanwhile: the
    /// winner answering is as good as its gossip saying so.
    pub(super) answered_by: Option<NodeName>,
    /// Still answering, past the hand-over time, because the winner has a
    /// view of the cluster other than this node's (see
    /// [`Core::may_release`]): published as held again.
    pub(super) kept_for_views: bool,
}

impl Handover {
    pub(super) fn new(since: Instant, to: NodeName) -> Handover {
        Handover {
            since,
            to,
            answered_by: None,
            kept_for_views: false,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Garp {
    pub(super) left: u32,
    pub(super) next: Instant,
}

impl Garp {
    /// The rounds still due after one sent `now`, of `left` due with it.
    pub(super) fn after_round(left: u32, interval: Duration, now: Instant) -> Option<Garp> {
        (left > 1).then(|| Garp {
            left: left - 1,
            next: now + interval,
        })
    }
}

/// An address the kernel holds for this node, and what goes with holding
/// it: all of it goes when the address does, so no hand-over, contest or
/// announcement outlives what it was about.
#[derive(Clone, Debug)]
pub(super) struct Held {
    /// Where, as last confirmed.
    pub(super) at: Want,
    /// Since when it has been this node's: a peer's gossip saying it holds
    /// the VIP counts only if published after that (see [`Core::holds`]).
    /// `None` for an address found in the kernel, whose peers' word stands
    /// at once.
    pub(super) since: Option<Instant>,
    /// When the kernel drops it unless it is renewed; `None` for one found
    /// in the kernel and not yet renewed.
    pub(super) expires: Option<Instant>,
    /// Left by a previous run and not yet decided by a reconcile.
    pub(super) adopted: bool,
    /// Giving it to a live winner. Boxed, as is `taken_back`: most held
    /// VIPs are in no hand-over, and a holder of 1,000 keeps 1,000 `Held`.
    pub(super) handover: Option<Box<Handover>>,
    /// The last hand-over this node took back because it won the VIP
    /// again, and when: given again to the same winner while the view
    /// that did it spreads, it goes on from its start (see
    /// [`Core::may_release`](super::Core::may_release)).
    pub(super) taken_back: Option<Box<(Handover, Instant)>>,
    /// Won here, and a live peer shows it held too, since then: the two
    /// views of the cluster differ (see [`Core::contest`]).
    pub(super) contested: Option<Instant>,
    /// Announcement rounds still to send.
    pub(super) garp: Option<Garp>,
    /// When a second owner that this node outranks was last answered with
    /// an announcement: one a second at most, so two nodes that each think
    /// they outrank the other do not trade announcements at wire speed.
    pub(super) kept_at: Option<Instant>,
    /// The node that published it held before this node took it: its word
    /// may still be in flight (see `Core::may_leave_it_to`).
    pub(super) taken_from: Option<Box<str>>,
}

impl Held {
    pub(super) fn new(at: Want, since: Option<Instant>) -> Held {
        Held {
            at,
            since,
            expires: None,
            adopted: false,
            handover: None,
            taken_back: None,
            contested: None,
            garp: None,
            kept_at: None,
            taken_from: None,
        }
    }

    /// An address a previous run left, found in the kernel: held, but not
    /// decided before the first reconcile.
    pub(super) fn adopted(at: Want, now: Instant) -> Held {
        Held {
            adopted: true,
            ..Held::new(at, Some(now))
        }
    }

    /// Answers as held: not handed over, or kept past its hand-over for
    /// differing views.
    pub(super) fn answering(&self) -> bool {
        self.handover.as_ref().is_none_or(|h| h.kept_for_views)
    }
}

/// One VIP this node deals with. See the module docs.
///
/// What the election wants of it (`want`) and what the kernel does for it
/// (`state`) are apart: they differ while a VIP is taken, moved or let go,
/// and [`Core::decide`](super::Core::decide) brings them together. The
/// retry and the stranger's MAC outlive every state (a failed add goes
/// back to [`State::Free`] with its backoff kept).
#[derive(Clone, Debug, Default)]
pub(super) struct Slot {
    /// Where the election and the links say this node holds it now.
    pub(super) want: Option<Want>,
    state: State,
    pub(super) retry: Option<Retry>,
    /// A host that is no hostlb node answered when this node asked before
    /// its first claim of the VIP: its MAC, until the VIP is taken.
    pub(super) in_use: Option<MacAddr>,
}

/// What the kernel holds for a VIP and what is asked of it. Each variant
/// carries only what is legal in it: nothing is asked of the LAN while an
/// operation is in flight or once the address is held, and an address is
/// removed only from where it is held.
// `Held` is the large variant and the common one (a holder of 1,000 VIPs
// has 1,000): boxing it would add an allocation to every held VIP to save
// room in the few that are not.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Default)]
pub(super) enum State {
    /// Not held, nothing asked.
    #[default]
    Free,
    /// Asking the LAN before taking it.
    Probing(Probing),
    /// An add in flight for an address not held yet.
    Adding(Want),
    /// The kernel holds it for this node, and maybe an operation on it is
    /// in flight: boxed, as an operation is in flight only between a
    /// request and its result, and a holder of 1,000 VIPs keeps 1,000
    /// `Held` (96 bytes each saved).
    Held(Held, Option<Box<HeldOp>>),
}

/// An operation in flight on a held address.
#[derive(Clone, Debug)]
pub(super) enum HeldOp {
    /// Added again: where it is (an address of a previous run, announced
    /// again) or at a new place, to which it moves (see [`HeldOp::DropOld`]).
    Add(Want),
    /// Its lifetime renewed where it is.
    Renew(Want),
    /// Removed: this node lets it go.
    Release { vip: VipAddress, why: LetGo },
    /// The old place of a VIP that moved to another interface removed: the
    /// VIP stays held at its new place.
    DropOld { vip: VipAddress, why: LetGo },
}

impl Slot {
    pub(super) fn wanting(want: Option<Want>) -> Slot {
        Slot {
            want,
            ..Slot::default()
        }
    }

    pub(super) fn state(&self) -> &State {
        &self.state
    }

    pub(super) fn idle(&self) -> bool {
        self.want.is_none() && matches!(self.state, State::Free) && self.retry.is_none()
    }

    /// Nothing to decide until an input changes it.
    pub(super) fn settled(&self) -> bool {
        match (&self.want, &self.state) {
            (Some(w), State::Held(h, None)) => {
                same_place(w, &h.at)
                    && h.handover.is_none()
                    && h.garp.is_none()
                    && h.contested.is_none()
                    && !h.adopted
            }
            (None, State::Free) => self.retry.is_none(),
            _ => false,
        }
    }

    /// A kernel operation is in flight for it.
    pub(super) fn busy(&self) -> bool {
        matches!(self.state, State::Adding(_) | State::Held(_, Some(_)))
    }

    pub(super) fn held(&self) -> Option<&Held> {
        match &self.state {
            State::Held(h, _) => Some(h),
            _ => None,
        }
    }

    pub(super) fn held_mut(&mut self) -> Option<&mut Held> {
        match &mut self.state {
            State::Held(h, _) => Some(h),
            _ => None,
        }
    }

    /// Where the kernel holds it for us.
    pub(super) fn held_at(&self) -> Option<&Want> {
        self.held().map(|h| &h.at)
    }

    pub(super) fn held_op(&self) -> Option<&HeldOp> {
        match &self.state {
            State::Held(_, op) => op.as_deref(),
            _ => None,
        }
    }

    /// Being removed because this node lets it go (not an old place).
    pub(super) fn releasing(&self) -> bool {
        matches!(self.held_op(), Some(HeldOp::Release { .. }))
    }

    /// What an add or renewal in flight puts in the kernel.
    pub(super) fn adding(&self) -> Option<&Want> {
        match &self.state {
            State::Adding(w) => Some(w),
            State::Held(_, Some(op)) => match &**op {
                HeldOp::Add(w) | HeldOp::Renew(w) => Some(w),
                HeldOp::Release { .. } | HeldOp::DropOld { .. } => None,
            },
            _ => None,
        }
    }

    pub(super) fn probing(&self) -> Option<Probing> {
        match self.state {
            State::Probing(p) => Some(p),
            _ => None,
        }
    }

    pub(super) fn probing_mut(&mut self) -> Option<&mut Probing> {
        match &mut self.state {
            State::Probing(p) => Some(p),
            _ => None,
        }
    }

    /// Starts asking the LAN: only a VIP neither held nor in the kernel's
    /// hands is asked about.
    pub(super) fn probe(&mut self, p: Probing) {
        debug_assert!(matches!(self.state, State::Free));
        if matches!(self.state, State::Free) {
            self.state = State::Probing(p);
        }
    }

    /// Stops asking the LAN, if it was.
    pub(super) fn stop_probing(&mut self) {
        if matches!(self.state, State::Probing(_)) {
            self.state = State::Free;
        }
    }

    /// Asks the kernel to add it at `want`: a first add, or, held, an add
    /// again in place or at a new place.
    pub(super) fn add(&mut self, want: Want) {
        self.state = match std::mem::take(&mut self.state) {
            State::Free | State::Probing(_) => State::Adding(want),
            State::Held(h, None) => State::Held(h, Some(Box::new(HeldOp::Add(want)))),
            busy => unreachable!("an add asked while busy: {busy:?}"),
        };
    }

    /// Asks the kernel to renew it where held, for `lifetime`; returns the
    /// address to add again, or `None` when it is not held or an operation
    /// is in flight.
    pub(super) fn renew(&mut self, lifetime: crate::model::Lifetime) -> Option<VipAddress> {
        let State::Held(h, op @ None) = &mut self.state else {
            return None;
        };
        let mut want = h.at.clone();
        want.vip.lifetime = lifetime;
        let vip = want.vip.clone();
        *op = Some(Box::new(HeldOp::Renew(want)));
        Some(vip)
    }

    /// Asks the kernel to remove it where held: this node lets it go, or
    /// (`old`) the place it moved from. Returns what is removed, or `None`
    /// when it is not held or an operation is in flight.
    pub(super) fn remove(&mut self, why: LetGo, old: Option<VipAddress>) -> Option<VipAddress> {
        let State::Held(h, op @ None) = &mut self.state else {
            return None;
        };
        h.garp = None;
        Some(match old {
            Some(vip) => {
                *op = Some(Box::new(HeldOp::DropOld {
                    vip: vip.clone(),
                    why,
                }));
                vip
            }
            None => {
                let vip = h.at.vip.clone();
                *op = Some(Box::new(HeldOp::Release {
                    vip: vip.clone(),
                    why,
                }));
                vip
            }
        })
    }

    /// The operation in flight, as done: the slot is as before it (held or
    /// not), and the result decides what follows.
    pub(super) fn take_op(&mut self) -> Option<Op> {
        match std::mem::take(&mut self.state) {
            State::Adding(want) => Some(Op::Add { want, renew: false }),
            State::Held(h, Some(op)) => {
                self.state = State::Held(h, None);
                Some(match *op {
                    HeldOp::Add(want) => Op::Add { want, renew: false },
                    HeldOp::Renew(want) => Op::Add { want, renew: true },
                    HeldOp::Release { vip, why } => Op::Remove {
                        vip,
                        why,
                        stale: false,
                    },
                    HeldOp::DropOld { vip, why } => Op::Remove {
                        vip,
                        why,
                        stale: true,
                    },
                })
            }
            other => {
                self.state = other;
                None
            }
        }
    }

    /// Holds it: an add done, or an address found in the kernel. What was
    /// asked of the LAN is moot once the kernel holds it.
    pub(super) fn hold(&mut self, held: Held) -> &mut Held {
        debug_assert!(!self.busy(), "held while an operation is in flight");
        self.state = State::Held(held, None);
        match &mut self.state {
            State::Held(h, _) => h,
            _ => unreachable!(),
        }
    }

    /// No longer held: removed, lapsed or taken by hand.
    pub(super) fn unhold(&mut self) -> Option<Held> {
        match std::mem::take(&mut self.state) {
            State::Held(h, _) => Some(h),
            other => {
                self.state = other;
                None
            }
        }
    }

    /// Held and answering as held (see [`Held::answering`]); not held
    /// answers as nothing is handed over.
    pub(super) fn answering(&self) -> bool {
        self.held().is_none_or(Held::answering)
    }

    pub(super) fn handover(&self) -> Option<&Handover> {
        self.held().and_then(|h| h.handover.as_deref())
    }

    pub(super) fn adopted(&self) -> bool {
        self.held().is_some_and(|h| h.adopted)
    }
}

/// When the kernel drops an address added or renewed `now` (the kernel
/// counts whole seconds from when it took the request, a moment earlier).
pub(super) fn expiry(want: &Want, now: Instant) -> Option<Instant> {
    want.vip
        .lifetime
        .kernel_seconds()
        .map(|s| now + Duration::from_secs(s.into()))
}

/// Two ascending iterators as one, each item once.
/// Two sequences sorted by the key of their items, merged in that order;
/// of two items with the same key, `a`'s is kept.
pub(super) fn merged<T: Copy, K: Ord>(
    a: impl Iterator<Item = T>,
    b: impl Iterator<Item = T>,
    key: impl Fn(&T) -> K,
) -> impl Iterator<Item = T> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if key(x) < key(y) => a.next(),
        (Some(x), Some(y)) if key(y) < key(x) => b.next(),
        (Some(_), Some(_)) => {
            b.next();
            a.next()
        }
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}

pub(super) fn same_place(a: &Want, b: &Want) -> bool {
    a.vip.ifindex == b.vip.ifindex && a.vip.prefix_len == b.vip.prefix_len && a.mode == b.mode
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::core::links::Mode;
    use crate::model::Lifetime;

    fn want(ifindex: u32) -> Want {
        Want {
            vip: VipAddress {
                interface: format!("eth{ifindex}"),
                ifindex,
                ip: "10.77.0.100".parse().unwrap(),
                prefix_len: 24,
                lifetime: Lifetime::FOREVER,
            },
            mode: Mode::Local,
            target: None,
        }
    }

    fn probing(now: Instant) -> Probing {
        Probing {
            until: now,
            next: now,
            left: 0,
        }
    }

    /// A first take: asked about, added, held; nothing in flight after.
    #[test]
    fn a_vip_taken_goes_from_asked_to_added_to_held() {
        let now = Instant::now();
        let mut s = Slot::wanting(Some(want(2)));
        assert!(!s.settled() && !s.idle());
        s.probe(probing(now));
        assert!(s.probing().is_some() && !s.busy());
        s.add(want(2));
        assert!(s.probing().is_none(), "an add ends the question");
        assert!(s.busy() && s.held().is_none());
        assert_eq!(s.adding().map(|w| w.vip.ifindex), Some(2));
        // Nothing else may be asked while the add is in flight.
        assert!(s.renew(Lifetime::FOREVER).is_none());
        assert!(s.remove(LetGo::OutrankedOnWire, None).is_none());
        let Some(Op::Add { renew: false, want }) = s.take_op() else {
            panic!("the add comes back as one");
        };
        assert!(
            matches!(s.state(), State::Free),
            "a failed add holds nothing"
        );
        s.hold(Held::new(want, Some(now)));
        assert!(s.settled());
        assert!(s.take_op().is_none());
    }

    /// A held VIP renewed, then let go: each operation one at a time, and
    /// the address held until its removal is done.
    #[test]
    fn a_held_vip_is_renewed_then_released() {
        let now = Instant::now();
        let mut s = Slot::wanting(Some(want(2)));
        s.hold(Held::new(want(2), Some(now)));
        s.held_mut().unwrap().garp = Some(Garp { left: 2, next: now });
        assert!(s.renew(Lifetime::FOREVER).is_some());
        assert!(
            s.renew(Lifetime::FOREVER).is_none(),
            "one renewal at a time"
        );
        assert!(!s.releasing() && s.adding().is_some());
        assert!(matches!(s.take_op(), Some(Op::Add { renew: true, .. })));
        assert!(s.held().is_some(), "a renewal leaves it held, done or not");
        s.want = None;
        let vip = s.remove(LetGo::OutrankedOnWire, None).unwrap();
        assert_eq!(vip.ifindex, 2);
        assert!(s.releasing() && s.held().unwrap().garp.is_none());
        assert!(!s.settled());
        assert!(matches!(s.take_op(), Some(Op::Remove { stale: false, .. })));
        s.unhold();
        assert!(s.idle());
    }

    /// A VIP moved to another interface: added at the new place while
    /// held at the old, then the old place removed while it stays held.
    #[test]
    fn a_moved_vip_stays_held_while_its_old_place_goes() {
        let now = Instant::now();
        let mut s = Slot::wanting(Some(want(3)));
        s.hold(Held::new(want(2), Some(now)));
        assert!(!s.settled(), "held elsewhere than wanted");
        s.add(want(3));
        let Some(Op::Add { want: new, .. }) = s.take_op() else {
            panic!("the add comes back");
        };
        let mut held = s.unhold().unwrap();
        let old = std::mem::replace(&mut held.at, new);
        s.hold(held);
        let gone = s
            .remove(LetGo::MovedTo("eth3".into()), Some(old.vip))
            .unwrap();
        assert_eq!(gone.ifindex, 2);
        assert!(!s.releasing(), "the VIP itself is not let go");
        assert!(matches!(s.take_op(), Some(Op::Remove { stale: true, .. })));
        assert_eq!(s.held_at().map(|w| w.vip.ifindex), Some(3));
        assert!(s.settled());
    }

    /// An address found in the kernel while the LAN was being asked: held,
    /// and the question is moot.
    #[test]
    fn an_address_found_held_ends_the_question() {
        let now = Instant::now();
        let mut s = Slot::wanting(Some(want(2)));
        s.probe(probing(now));
        s.hold(Held::new(want(2), None));
        assert!(s.probing().is_none() && s.held().is_some());
        s.stop_probing();
        assert!(s.held().is_some(), "stopping a question leaves the address");
    }
}
