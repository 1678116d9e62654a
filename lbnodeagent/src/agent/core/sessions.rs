//! Owner sessions: the node next in line for an owner's VIPs watches that
//! owner directly, so a host that goes away is noticed in about a tenth of
//! a second at any cluster size, where SWIM's suspicion grows with the
//! cluster (0.5 s at 3 members, 1.3 s at 1,000).
//!
//! Every node learns from the election which owners it comes right after
//! ([`Election::next_in_line`](crate::election::Election::next_in_line))
//! and sends each of them a signed beat every [`BEAT_INTERVAL`] over the
//! gossip socket; a node answers every node that beat it in the last
//! [`WATCHER_TTL`] at the same pace. The pair is one session, started by
//! the follower, so the two need not agree on the election for it to work.
//! An owner heard at least once and then silent for [`BEAT_MISS`] is a
//! *suspect*: the core treats it as gone from the view, so this node takes
//! its VIPs, after the usual pre-check on the wire. The pre-check is what
//! keeps this safe: a live host (its agent starved, stopped, or only its
//! beats lost) still answers ARP/ND, and this node then stays off. A
//! suspect heard again is back at once; one SWIM declares down leaves the
//! session. A node never heard (an agent of an older release, one that
//! just started) is never suspected: SWIM judges it as before.
//!
//! Each beat also says when the sender's addresses lapse (they have a
//! finite lifetime, renewed in one batch): once its agent is dead or frozen
//! and its host still answers, the follower knows when the answers will
//! stop, and asks densely then instead of waiting out a silence (see
//! `conflict`).
//!
//! Pure: the core feeds beats and the clock in; the shell sends the beats.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// How often a beat goes to each session peer.
pub const BEAT_INTERVAL: Duration = Duration::from_millis(25);
/// Silence after which a watched owner is suspect: five beats, so at 5%
/// datagram loss a live owner is suspected about once in 3 million beat
/// periods (and even then the pre-check on the wire hears it answer).
pub const BEAT_MISS: Duration = Duration::from_millis(125);
/// A node that beat this one within this long is answered.
pub const WATCHER_TTL: Duration = Duration::from_secs(1);

/// How long a silent peer's lapse is remembered after its last address's:
/// the kernel drops a lapsed address up to about a second late.
pub const LAPSE_KEPT: Duration = Duration::from_secs(3);

/// What one beat said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Beat {
    pub node: String,
    /// The sender's gossip generation, when the beat says it.
    pub generation: Option<u64>,
    /// When the sender's addresses lapse if it renews nothing more, counted
    /// from the moment the beat arrived: the earliest and the latest.
    pub lapse: Option<(Duration, Duration)>,
    /// The node goes (its agent on SIGTERM, or `cleanup` for a dead
    /// one): the core takes it as leaving; sessions never see such a beat.
    pub leaving: bool,
}

/// When a node's addresses lapse, as its last beat said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lapse {
    pub first: Instant,
    pub last: Instant,
}

#[derive(Clone, Debug, Default)]
struct Watched {
    heard: Option<Instant>,
    suspect: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Sessions {
    watched: BTreeMap<String, Watched>,
    /// Nodes that beat this one, when last heard.
    watchers: BTreeMap<String, Instant>,
    /// The last lapse each peer told, kept after it goes silent (that is
    /// when it is needed) until [`LAPSE_KEPT`] after its last address.
    lapses: BTreeMap<String, Lapse>,
    /// [`Sessions::peers`] changed since [`Sessions::take_changed`].
    changed: bool,
}

impl Sessions {
    /// The owners to watch now. A suspect stays watched (it may answer
    /// again) until `live` says gossip itself lost it.
    pub fn watch(&mut self, owners: BTreeSet<String>, live: impl Fn(&str) -> bool) {
        let before = self.watched.len();
        self.watched
            .retain(|n, w| owners.contains(n) || (w.suspect && live(n)));
        let kept = self.watched.len();
        for o in owners {
            self.watched.entry(o).or_default();
        }
        self.changed |= kept != before || self.watched.len() != kept;
    }

    /// A beat arrived. True when it brings a suspect back.
    pub fn heard(&mut self, beat: Beat, now: Instant) -> bool {
        if let Some((first, last)) = beat.lapse {
            self.lapses.insert(
                beat.node.clone(),
                Lapse {
                    first: now + first,
                    last: now + last,
                },
            );
        } else {
            self.lapses.remove(&beat.node);
        }
        let back = match self.watched.get_mut(&beat.node) {
            Some(w) => {
                w.heard = Some(now);
                std::mem::take(&mut w.suspect)
            }
            None => false,
        };
        self.changed |= self.watchers.insert(beat.node, now).is_none();
        back
    }

    /// Marks the owners silent for [`BEAT_MISS`]. True when one is newly
    /// suspect.
    pub fn expire(&mut self, now: Instant) -> bool {
        let mut new = false;
        for w in self.watched.values_mut() {
            if !w.suspect
                && w.heard
                    .is_some_and(|h| now.saturating_duration_since(h) >= BEAT_MISS)
            {
                w.suspect = true;
                new = true;
            }
        }
        let before = self.watchers.len();
        self.watchers
            .retain(|_, t| now.saturating_duration_since(*t) < WATCHER_TTL);
        self.changed |= self.watchers.len() != before;
        self.lapses.retain(|_, l| now < l.last + LAPSE_KEPT);
        new
    }

    pub fn is_suspect(&self, node: &str) -> bool {
        self.watched.get(node).is_some_and(|w| w.suspect)
    }

    pub fn suspects(&self) -> impl Iterator<Item = &str> {
        self.watched
            .iter()
            .filter(|(_, w)| w.suspect)
            .map(|(n, _)| n.as_str())
    }

    /// Whether [`Sessions::peers`] changed since the last call.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// Whom to beat: the owners watched and the nodes that watch this one.
    pub fn peers(&self) -> BTreeSet<String> {
        self.watched
            .keys()
            .chain(self.watchers.keys())
            .cloned()
            .collect()
    }

    /// When the next owner turns suspect if it stays silent.
    pub fn deadline(&self) -> Option<Instant> {
        self.watched
            .values()
            .filter(|w| !w.suspect)
            .filter_map(|w| w.heard)
            .map(|h| h + BEAT_MISS)
            .min()
    }

    /// When `node`'s addresses lapse, as it last said.
    pub fn lapse(&self, node: &str) -> Option<Lapse> {
        self.lapses.get(node).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(node: &str) -> Beat {
        Beat {
            node: node.into(),
            generation: None,
            lapse: None,
            leaving: false,
        }
    }

    fn set(nodes: &[&str]) -> BTreeSet<String> {
        nodes.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn an_owner_heard_then_silent_is_suspect_until_heard_again() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        s.watch(set(&["a"]), |_| true);
        assert!(
            !s.expire(t0 + Duration::from_secs(5)),
            "never heard: never suspect"
        );
        assert_eq!(s.deadline(), None);
        s.heard(beat("a"), t0);
        assert_eq!(s.deadline(), Some(t0 + BEAT_MISS));
        assert!(!s.expire(t0 + BEAT_MISS - Duration::from_millis(1)));
        assert!(s.expire(t0 + BEAT_MISS));
        assert!(s.is_suspect("a"));
        assert!(!s.expire(t0 + BEAT_MISS * 2), "suspect once");
        assert!(s.heard(beat("a"), t0 + BEAT_MISS * 3));
        assert!(!s.is_suspect("a"));
    }

    #[test]
    fn beats_within_the_miss_keep_an_owner_up() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        s.watch(set(&["a"]), |_| true);
        let mut t = t0;
        for i in 0..400 {
            // Three beats in four lost: still within the miss.
            if i % 4 == 0 {
                s.heard(beat("a"), t);
            }
            t += BEAT_INTERVAL;
            assert!(!s.expire(t), "suspected at beat {i}");
        }
    }

    #[test]
    fn a_suspect_stays_watched_while_gossip_holds_it_live() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        s.watch(set(&["a", "b"]), |_| true);
        s.heard(beat("a"), t0);
        s.heard(beat("b"), t0);
        s.expire(t0 + BEAT_MISS);
        // Suspects drop out of this node's election, so it no longer comes
        // after them: they must stay watched to come back.
        s.watch(set(&[]), |_| true);
        assert_eq!(s.suspects().collect::<Vec<_>>(), ["a", "b"]);
        s.watch(set(&[]), |n| n == "b");
        assert_eq!(s.suspects().collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn watchers_are_answered_for_a_while() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        s.watch(set(&["a"]), |_| true);
        assert!(s.take_changed(), "a watched");
        assert!(!s.heard(beat("w"), t0));
        assert_eq!(s.peers(), set(&["a", "w"]));
        assert!(s.take_changed(), "w heard");
        s.heard(beat("w"), t0 + WATCHER_TTL / 2);
        s.watch(set(&["a"]), |_| true);
        assert!(!s.take_changed(), "the same peers");
        s.expire(t0 + WATCHER_TTL + WATCHER_TTL / 2);
        assert_eq!(s.peers(), set(&["a"]));
        assert!(s.take_changed(), "w gone");
    }

    #[test]
    fn the_last_lapse_told_is_kept_after_the_owner_goes_silent() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        s.watch(set(&["a"]), |_| true);
        s.heard(
            Beat {
                node: "a".into(),
                generation: None,
                lapse: Some((Duration::from_secs(4), Duration::from_secs(5))),
                leaving: false,
            },
            t0,
        );
        s.expire(t0 + Duration::from_secs(1));
        assert_eq!(
            s.lapse("a"),
            Some(Lapse {
                first: t0 + Duration::from_secs(4),
                last: t0 + Duration::from_secs(5)
            })
        );
        s.watch(set(&[]), |_| false);
        s.expire(t0 + Duration::from_secs(5) + LAPSE_KEPT - Duration::from_millis(1));
        assert!(s.lapse("a").is_some(), "kept after gossip lost the node");
        s.expire(t0 + Duration::from_secs(5) + LAPSE_KEPT);
        assert_eq!(s.lapse("a"), None, "forgotten once past");
    }
}
