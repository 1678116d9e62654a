//! A VIP's state in the core, and small helpers over it.

use std::time::{Duration, Instant};

use crate::model::{MacAddr, VipAddress};

use super::links::Want;
use super::reason::LetGo;

/// A kernel operation in flight for a VIP.
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
    pub(super) to: String,
    /// The hostlb node whose MAC claimed it on the wire meanwhile: the
    /// winner answering is as good as its gossip saying so.
    pub(super) answered_by: Option<String>,
    /// Still answering, past the hand-over time, because the winner has a
    /// view of the cluster other than this node's (see
    /// [`Core::may_release`]): published as held again.
    pub(super) kept_for_views: bool,
}

impl Handover {
    pub(super) fn new(since: Instant, to: String) -> Handover {
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
#[derive(Clone, Debug, Default)]
pub(super) struct Slot {
    /// Where the election and the links say this node holds it now.
    pub(super) want: Option<Want>,
    /// What the kernel holds for us.
    pub(super) held: Option<Held>,
    pub(super) op: Option<Op>,
    /// Asking the LAN before taking it.
    pub(super) probing: Option<Probing>,
    pub(super) retry: Option<Retry>,
    /// A host that is no hostlb node answered when this node asked before
    /// its first claim of the VIP: its MAC, until the VIP is taken.
    pub(super) in_use: Option<MacAddr>,
}

impl Slot {
    pub(super) fn idle(&self) -> bool {
        self.want.is_none()
            && self.held.is_none()
            && self.op.is_none()
            && self.retry.is_none()
            && self.probing.is_none()
    }

    /// Nothing to decide until an input changes it.
    pub(super) fn settled(&self) -> bool {
        self.op.is_none()
            && self.probing.is_none()
            && match (&self.want, &self.held) {
                (Some(w), Some(h)) => {
                    same_place(w, &h.at)
                        && h.handover.is_none()
                        && h.garp.is_none()
                        && h.contested.is_none()
                        && !h.adopted
                }
                (None, None) => self.retry.is_none(),
                _ => false,
            }
    }

    /// Where the kernel holds it for us.
    pub(super) fn held_at(&self) -> Option<&Want> {
        self.held.as_ref().map(|h| &h.at)
    }

    /// Held and answering as held (see [`Held::answering`]); not held
    /// answers as nothing is handed over.
    pub(super) fn answering(&self) -> bool {
        self.held.as_ref().is_none_or(Held::answering)
    }

    pub(super) fn handover(&self) -> Option<&Handover> {
        self.held.as_ref().and_then(|h| h.handover.as_deref())
    }

    pub(super) fn adopted(&self) -> bool {
        self.held.as_ref().is_some_and(|h| h.adopted)
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
