//! What the core last gave out, and what must be worked out again: the
//! beat plan, this node's gossip state, the addresses the wire is watched
//! for, the annotations, readiness and the status line. Each output goes
//! out only when it differs from the last; each is worked out again only
//! when something it follows moved (`touch_*`), since steps come many
//! times a second and most change none of them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::model::LocalState;

use super::api::{Announcing, BeatPlan};

pub(super) struct Sent {
    beats: Option<BeatPlan>,
    /// The beat plan may have moved beyond what the gossip state and the
    /// sessions say: peers' addresses, or a renewal.
    beats_moved: bool,
    published: Option<LocalState>,
    publish_moved: bool,
    watched: BTreeMap<IpAddr, u32>,
    announced: Option<Announcing>,
    report_moved: bool,
    ready: bool,
    status: Option<(usize, usize)>,
}

impl Default for Sent {
    /// Everything to work out at the first step.
    fn default() -> Sent {
        Sent {
            beats: None,
            beats_moved: true,
            published: None,
            publish_moved: true,
            watched: BTreeMap::new(),
            announced: None,
            report_moved: true,
            ready: false,
            status: None,
        }
    }
}

/// `new` if it differs from what `last` holds, which it replaces.
fn news<T: PartialEq + Clone>(last: &mut Option<T>, new: T) -> Option<T> {
    if last.as_ref() == Some(&new) {
        return None;
    }
    *last = Some(new.clone());
    Some(new)
}

impl Sent {
    /// This node's gossip state may have changed.
    pub fn touch_publish(&mut self) {
        self.publish_moved = true;
    }

    /// The annotations this node is responsible for may have changed.
    pub fn touch_report(&mut self) {
        self.report_moved = true;
    }

    /// The beat plan may have changed.
    pub fn touch_beats(&mut self) {
        self.beats_moved = true;
    }

    /// Whether the beat plan is worked out again now: it follows the gossip
    /// state as well as its own inputs.
    pub fn take_beats(&mut self, peers_changed: bool) -> bool {
        std::mem::take(&mut self.beats_moved) || self.publish_moved || peers_changed
    }

    pub fn offer_beats(&mut self, plan: BeatPlan) -> Option<BeatPlan> {
        news(&mut self.beats, plan)
    }

    pub fn beats(&self) -> Option<&BeatPlan> {
        self.beats.as_ref()
    }

    /// Whether the gossip state is worked out again now.
    pub fn take_publish(&mut self) -> bool {
        std::mem::take(&mut self.publish_moved)
    }

    pub fn offer_publish(&mut self, local: LocalState) -> Option<LocalState> {
        news(&mut self.published, local)
    }

    /// The addresses to watch the wire for, when they differ from the
    /// last given out (compared in place: built only when they changed).
    pub fn offer_watch<I: Iterator<Item = (IpAddr, u32)>>(
        &mut self,
        watched: impl Fn() -> I,
    ) -> Option<BTreeMap<IpAddr, u32>> {
        if watched().eq(self.watched.iter().map(|(ip, i)| (*ip, *i))) {
            return None;
        }
        self.watched = watched().collect();
        Some(self.watched.clone())
    }

    /// The interface `ip` is watched on.
    pub fn watched(&self, ip: IpAddr) -> Option<u32> {
        self.watched.get(&ip).copied()
    }

    /// Whether the annotations are worked out again now: never before the
    /// cluster is known, when they would clear what is only not read yet.
    pub fn take_report(&mut self, cluster_known: bool) -> bool {
        if !(self.report_moved && cluster_known) {
            return false;
        }
        self.report_moved = false;
        true
    }

    pub fn offer_announcing(&mut self, announcing: Announcing) -> Option<Announcing> {
        news(&mut self.announced, announcing)
    }

    pub fn ready(&self) -> bool {
        self.ready
    }

    pub fn become_ready(&mut self) {
        self.ready = true;
    }

    /// The status line's figures (held, live members), once ready and
    /// when they changed.
    pub fn offer_status(&mut self, status: (usize, usize)) -> Option<(usize, usize)> {
        if !self.ready {
            return None;
        }
        news(&mut self.status, status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_output_goes_out_once_per_change() {
        let mut s = Sent::default();
        assert!(s.take_publish(), "worked out at the first step");
        assert!(!s.take_publish());
        // The beat plan follows the gossip state.
        assert!(s.take_beats(false));
        assert!(!s.take_beats(false));
        s.touch_publish();
        assert!(s.take_beats(false));
        assert!(s.take_beats(true));
        // Annotations wait for the cluster.
        assert!(!s.take_report(false));
        assert!(s.take_report(true));
        assert!(!s.take_report(true));
        // Watched addresses: the same set is no news.
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let one = || [(ip, 2)].into_iter();
        assert_eq!(s.offer_watch(one), Some([(ip, 2)].into()));
        assert_eq!(s.offer_watch(one), None);
        assert_eq!(s.watched(ip), Some(2));
        // No status line before ready; then once per change.
        assert_eq!(s.offer_status((1, 3)), None);
        s.become_ready();
        assert_eq!(s.offer_status((1, 3)), Some((1, 3)));
        assert_eq!(s.offer_status((1, 3)), None);
        assert_eq!(s.offer_status((2, 3)), Some((2, 3)));
    }
}
