//! How new this node's view of the cluster is, and how a peer's compares.
//!
//! Peers compare views by the newest resourceVersion each was built from,
//! and by a digest of what the election reads: agents write annotations
//! on the Services they announce, and each write moves every watch's
//! resourceVersion without changing what anybody elects from. Two views
//! with the same digest are the same view, whatever their revisions.

use std::time::Instant;

pub(super) struct Dating {
    /// The election has had a cluster view.
    known: bool,
    /// The newest resourceVersion that view was built from.
    revision: u64,
    /// What that view holds.
    digest: Option<u64>,
    /// Since when this node has had that view: a peer still behind it a
    /// hand-over's time later is stuck, not late.
    since: Instant,
    /// Whether the fallbacks were looked at again since the view had
    /// [`VIEW_SPREAD`](super::VIEW_SPREAD) (see [`Dating::take_spread`]).
    spread_seen: bool,
}

impl Dating {
    pub fn new(now: Instant) -> Dating {
        Dating {
            known: false,
            revision: 0,
            digest: None,
            since: now,
            spread_seen: true,
        }
    }

    pub fn known(&self) -> bool {
        self.known
    }

    /// A first view came; `true` the first time.
    pub fn know(&mut self) -> bool {
        !std::mem::replace(&mut self.known, true)
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn digest(&self) -> Option<u64> {
        self.digest
    }

    pub fn since(&self) -> Instant {
        self.since
    }

    /// When the view will have spread, while [`Dating::take_spread`] has
    /// yet to see it. A node wakes then for an orphan whose own wait is
    /// over by that time: one found in an earlier view keeps its wait,
    /// and its first node is read again only once the peers still older
    /// are passed over. Without the wake a node with nothing else to do
    /// (it held nothing, and the API server was away) slept past it, and
    /// the VIP stayed dark (seed 12300252185 of the simulation: 5.2 s).
    pub fn spread_at(&self) -> Option<Instant> {
        (!self.spread_seen).then_some(self.since + super::VIEW_SPREAD)
    }

    /// This view has had [`VIEW_SPREAD`](super::VIEW_SPREAD) to reach
    /// every peer: one still older now is behind, not catching up.
    pub fn spread(&self, now: Instant) -> bool {
        now >= self.since + super::VIEW_SPREAD
    }

    /// `true` once, at the first step after the view has spread: the
    /// peers still older then are passed over (see `Core::passed_over`).
    pub fn take_spread(&mut self, now: Instant) -> bool {
        if self.spread_seen || !self.spread(now) {
            return false;
        }
        self.spread_seen = true;
        true
    }

    /// The view's date now; `true` when it moved. A write that changed
    /// nothing the election reads moves the revision, not the view: a peer
    /// behind it was behind before, so `since` stays.
    pub fn set(&mut self, revision: u64, digest: Option<u64>, now: Instant) -> bool {
        if revision == self.revision && digest == self.digest {
            return false;
        }
        let same_view = digest.is_some() && digest == self.digest;
        if !same_view {
            self.since = now;
            self.spread_seen = false;
        }
        self.revision = revision;
        self.digest = digest;
        true
    }

    /// How new a peer's view is (its `revision` and `digest`), to compare with this node's revision:
    /// this node's own when the two views hold the same. A peer that has
    /// not seen the latest annotation writes yet has no older view for
    /// it, and taking it for one would keep a VIP on two nodes until the
    /// writes reach it (a drain under load: 150 ms).
    pub fn of(&self, revision: u64, digest: Option<u64>) -> u64 {
        if digest.is_some() && digest == self.digest {
            self.revision
        } else {
            revision
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::VIEW_SPREAD;
    use super::*;

    #[test]
    fn a_write_that_changes_nothing_elected_moves_the_revision_not_the_view() {
        let t = Instant::now();
        let mut d = Dating::new(t);
        assert!(d.know());
        assert!(!d.know());
        let later = t + Duration::from_secs(1);
        assert!(d.set(10, Some(7), later));
        assert_eq!(d.since(), later);
        // An annotation write: a newer revision, the same digest.
        assert!(d.set(12, Some(7), later + Duration::from_secs(1)));
        assert_eq!((d.revision(), d.since()), (12, later));
        assert!(!d.set(12, Some(7), later + Duration::from_secs(2)));
        // A peer with the same view has this node's revision, whatever
        // its own; one with another view has its own.
        assert_eq!(d.of(11, Some(7)), 12);
        assert_eq!(d.of(11, Some(8)), 11);
        assert_eq!(d.of(11, None), 11);
    }

    /// A new view's spread is a moment to wake for until a step has seen
    /// it; a write that keeps the view asks for none.
    #[test]
    fn a_new_views_spread_is_a_wake_up_until_seen() {
        let t = Instant::now();
        let mut d = Dating::new(t);
        assert_eq!(d.spread_at(), None, "no view yet");
        let later = t + Duration::from_secs(1);
        d.set(10, Some(7), later);
        assert_eq!(d.spread_at(), Some(later + VIEW_SPREAD));
        assert!(!d.take_spread(later + VIEW_SPREAD - Duration::from_millis(1)));
        assert_eq!(d.spread_at(), Some(later + VIEW_SPREAD));
        assert!(d.take_spread(later + VIEW_SPREAD));
        assert_eq!(d.spread_at(), None);
        d.set(12, Some(7), later + Duration::from_secs(1));
        assert_eq!(d.spread_at(), None, "the same view: it spread already");
        let newer = later + Duration::from_secs(2);
        d.set(13, Some(8), newer);
        assert_eq!(d.spread_at(), Some(newer + VIEW_SPREAD));
    }
}
