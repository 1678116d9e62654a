//! Owner sessions: one node watches each owner directly, so a host that
//! goes away is noticed in about a tenth of a second at any cluster size,
//! where SWIM's suspicion grows with the cluster (0.5 s at 3 members, 1.3
//! s at 1,000).
//!
//! Every node learns from the election, for every owner, which node comes
//! next for each of its VIPs ([`Election::runners_up`]). Of those, one
//! watches the owner: the node next in line for the owner's lowest VIP.
//! Each node can tell it is the watcher from its own election; two views
//! that differ may name two watchers (harmless) or none for a while (the
//! others then learn of the failure from SWIM, as before).
//!
//! The watcher beats the owner every [`SPARSE_EVERY`] beat, saying it
//! watches; the owner answers every node that said so in the last
//! [`WATCHER_TTL`] with a beat every [`BEAT_INTERVAL`] (beats that do not
//! say so, the owner's, are not answered: that would make every session
//! dense both ways). So each node sends dense beats to about one
//! watcher and sparse ones to the owners it watches, whatever the size of
//! the cluster. An owner heard at least once and then silent for
//! [`BEAT_MISS`] is a *suspect*: the watcher treats it as gone from the
//! view, and tells the others next in line for its VIPs so every
//! [`RELAY_EVERY`] (a *relay*, with when the owner's addresses lapse); they
//! hold it suspect until [`RELAY_TTL`] after the last relay. Each then takes
//! its VIPs after the usual pre-check on the wire. The pre-check is what
//! keeps this safe: a live host (its agent starved, stopped, or only its
//! beats lost) still answers ARP/ND, and the node stays off. A suspect
//! heard again is back at once (the relays stop, and the others' hold
//! runs out); one SWIM declares down leaves the session. A node never
//! heard (an agent of an older release, one that just started) is never
//! suspected: SWIM judges it as before.
//!
//! Each beat also says when the sender's addresses lapse (they have a
//! finite lifetime, renewed in one batch): once its agent is dead or frozen
//! and its host still answers, the nodes next in line know when the
//! answers will stop, and ask densely then instead of waiting out a
//! silence (see `conflict`).
//!
//! Pure: the core feeds beats and the clock in; the shell sends the beats.
//!
//! [`Election::runners_up`]: crate::election::Election::runners_up

use crate::election::NodeName;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How often a beat goes to each watcher.
pub const BEAT_INTERVAL: Duration = Duration::from_millis(25);
/// A watcher beats the owner it watches every this many beat intervals:
/// only to be answered (an owner answers whoever beat it within
/// [`WATCHER_TTL`]), not to be watched.
pub const SPARSE_EVERY: u32 = 10;
/// Silence after which a watched owner is suspect: six intervals, five
/// beats lost in a row, so at 5% datagram loss a live owner is suspected
/// about once in 3 million beats (once a day per session; at 1,000 owners
/// about once a minute in the cluster), and even then the pre-check on the
/// wire hears it answer.
pub const BEAT_MISS: Duration = Duration::from_millis(150);
/// A node that beat this one within this long is answered: four sparse
/// beats.
pub const WATCHER_TTL: Duration = Duration::from_secs(1);
/// How often a watcher tells the others next in line that their owner is
/// silent, while it is.
pub const RELAY_EVERY: Duration = Duration::from_millis(50);
/// A relayed suspect stays one this long after the last relay: two relays
/// lost in a row do not lift it.
pub const RELAY_TTL: Duration = Duration::from_millis(160);

/// How long a silent peer's lapse is remembered after its last address's:
/// the kernel drops a lapsed address up to about a second late.
pub const LAPSE_KEPT: Duration = Duration::from_secs(3);

/// What one beat said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Beat {
    /// When it arrived. The loop may hand a beat that changes nothing but
    /// when its sender was last heard to the core at its next step rather
    /// than at once ([`Sessions::routine`]); the core counts it from here.
    pub at: Instant,
    pub node: NodeName,
    /// The sender's gossip generation, when the beat says it.
    pub generation: Option<u64>,
    /// When the sender's addresses lapse if it renews nothing more, counted
    /// from the moment the beat arrived: the earliest and the latest.
    pub lapse: Option<(Duration, Duration)>,
    /// The node goes (its agent on SIGTERM, or `cleanup` for a dead
    /// one): the core takes it as leaving; sessions never see such a beat.
    pub leaving: bool,
    /// The sender watches this node, which is to beat it densely.
    pub watching: bool,
    /// A relay: the sender watches this owner and finds it silent. Such a
    /// beat says nothing else of the sender.
    pub silent: Option<Silent>,
}

/// A relay's subject: the silent owner, and what its last beat told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Silent {
    pub node: NodeName,
    pub generation: Option<u64>,
    /// As in [`Beat::lapse`], counted from the moment the relay arrived.
    pub lapse: Option<(Duration, Duration)>,
}

/// When a node's addresses lapse, as its last beat said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lapse {
    pub first: Instant,
    pub last: Instant,
}

impl Lapse {
    fn after(now: Instant, (first, last): (Duration, Duration)) -> Lapse {
        Lapse {
            first: now + first,
            last: now + last,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Watched {
    heard: Option<Instant>,
    suspect: bool,
    /// The others next in line for the owner's VIPs: told when it is
    /// silent.
    relay_to: BTreeSet<NodeName>,
}

/// Owners to watch, each with the others next in line for its VIPs.
pub type Owners = BTreeMap<NodeName, BTreeSet<NodeName>>;

/// The owners `me` watches, given every owner's VIPs with the node next
/// in line for each ([`Election::runners_up`]): those for whose lowest VIP
/// `me` comes next, each with the others next in line for its VIPs.
///
/// [`Election::runners_up`]: crate::election::Election::runners_up
pub fn watched_by<'a>(
    me: &str,
    runners_up: impl IntoIterator<Item = (&'a NodeName, &'a Vec<(IpAddr, NodeName)>)>,
) -> Owners {
    runners_up
        .into_iter()
        .filter(|(owner, runs)| *owner != me && runs.first().is_some_and(|(_, r)| r == me))
        .map(|(owner, runs)| {
            let others = runs.iter().map(|(_, r)| r).filter(|r| *r != me).cloned();
            (owner.clone(), others.collect())
        })
        .collect()
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Sessions {
    watched: BTreeMap<NodeName, Watched>,
    /// Nodes that beat this one, when last heard.
    watchers: BTreeMap<NodeName, Instant>,
    /// Owners a watcher says are silent, until when.
    relayed: BTreeMap<NodeName, Instant>,
    /// The last lapse each peer told (or a relay told of it), kept after
    /// it goes silent (that is when it is needed) until [`LAPSE_KEPT`]
    /// after its last address.
    lapses: BTreeMap<NodeName, Lapse>,
    /// When each peer's last beat came, watched or not, for a move's
    /// record: how long its VIPs may have been dark when one is taken.
    /// Forgotten [`HEARD_KEPT`] after.
    last_beat: BTreeMap<NodeName, Instant>,
    /// [`Sessions::plan`] changed since [`Sessions::take_changed`].
    changed: bool,
}

/// How long a peer's last beat is remembered.
const HEARD_KEPT: Duration = Duration::from_secs(60);

/// Whom to beat, as [`Sessions::plan`] says: node names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionPlan {
    /// Every [`BEAT_INTERVAL`]: the watchers.
    pub dense: BTreeSet<NodeName>,
    /// The owners watched, beaten saying so: every [`SPARSE_EVERY`]
    /// beats, or with the dense ones if they watch this node too.
    pub sparse: BTreeSet<NodeName>,
    /// Every [`RELAY_EVERY`]: each silent owner, and whom to tell.
    pub relays: BTreeMap<NodeName, BTreeSet<NodeName>>,
}

impl Sessions {
    /// The owners this node watches now, each with the others next in
    /// line for its VIPs. A suspect stays watched (it may answer again)
    /// until `live` says gossip itself lost it.
    pub fn watch(&mut self, owners: Owners, live: impl Fn(&str) -> bool) {
        let before = self.watched.len();
        // An owner no longer watched while it is heard (the election moved
        // and another node is next in line for it) stops beating this
        // node: the lapse it told goes stale as it renews its addresses,
        // and is forgotten with it. Kept for a silent owner, or one a
        // relay told of: that is when it is needed. (Simulation seed
        // 3000701863: a node took a live owner's VIPs without asking, at a
        // lapse told seconds before it stopped watching that owner.)
        let (relayed, lapses) = (&self.relayed, &mut self.lapses);
        self.watched.retain(|n, w| {
            if owners.contains_key(n) {
                return true;
            }
            if !w.suspect && !relayed.contains_key(n) {
                lapses.remove(n);
            }
            w.suspect && live(n)
        });
        let kept = self.watched.len();
        for (o, relay_to) in owners {
            let w = self.watched.entry(o).or_default();
            if w.relay_to != relay_to {
                self.changed |= w.suspect;
                w.relay_to = relay_to;
            }
        }
        self.changed |= kept != before || self.watched.len() != kept;
    }

    /// Whether `beat` would change nothing here but when its sender was
    /// last heard and when its addresses lapse: no relay, its sender not
    /// suspect by this node's watch, and not a watcher this node does not
    /// know yet. Such a beat decides nothing until a step judges silence,
    /// so it may wait for that step if it is handed over with its arrival
    /// time.
    pub fn routine(&self, beat: &Beat) -> bool {
        beat.silent.is_none()
            && !self.watched.get(&beat.node).is_some_and(|w| w.suspect)
            && (!beat.watching || self.watchers.contains_key(&beat.node))
    }

    /// A beat arrived at `now`. True when it changes who is suspect.
    pub fn heard(&mut self, beat: Beat, now: Instant) -> bool {
        if let Some(silent) = beat.silent {
            return self.relayed(silent, now);
        }
        match self.last_beat.get_mut(&beat.node) {
            Some(t) => *t = now,
            None => {
                self.last_beat.insert(beat.node.clone(), now);
            }
        }
        match beat.lapse {
            Some(l) => {
                self.lapses.insert(beat.node.clone(), Lapse::after(now, l));
            }
            None => {
                self.lapses.remove(&beat.node);
            }
        }
        let back = match self.watched.get_mut(&beat.node) {
            Some(w) => {
                w.heard = Some(now);
                let back = std::mem::take(&mut w.suspect);
                self.changed |= back;
                back
            }
            None => false,
        };
        if beat.watching {
            self.changed |= self.watchers.insert(beat.node, now).is_none();
        }
        back
    }

    fn relayed(&mut self, silent: Silent, now: Instant) -> bool {
        if let Some(l) = silent.lapse {
            self.lapses
                .insert(silent.node.clone(), Lapse::after(now, l));
        }
        let before = self.is_suspect(&silent.node);
        self.relayed.insert(silent.node.clone(), now + RELAY_TTL);
        !before
    }

    /// Marks the owners silent for [`BEAT_MISS`] and lifts relayed
    /// suspects past their hold. The owners newly suspect, and whether
    /// who is suspect changed at all.
    pub fn expire(&mut self, now: Instant) -> (Vec<NodeName>, bool) {
        let mut new = Vec::new();
        for (n, w) in &mut self.watched {
            if !w.suspect
                && w.heard
                    .is_some_and(|h| now.saturating_duration_since(h) >= BEAT_MISS)
            {
                w.suspect = true;
                new.push(n.clone());
            }
        }
        self.changed |= !new.is_empty();
        let before = self.relayed.len();
        self.relayed.retain(|_, until| now < *until);
        let lifted = self.relayed.len() != before;
        let before = self.watchers.len();
        self.watchers
            .retain(|_, t| now.saturating_duration_since(*t) < WATCHER_TTL);
        self.changed |= self.watchers.len() != before;
        self.lapses.retain(|_, l| now < l.last + LAPSE_KEPT);
        self.last_beat
            .retain(|_, t| now.saturating_duration_since(*t) < HEARD_KEPT);
        let changed = !new.is_empty() || lifted;
        (new, changed)
    }

    pub fn is_suspect(&self, node: &str) -> bool {
        self.watched.get(node).is_some_and(|w| w.suspect) || self.relayed.contains_key(node)
    }

    /// Whether any node is suspect, by this node's watch or a relay.
    pub fn any_suspect(&self) -> bool {
        !self.relayed.is_empty() || self.watched.values().any(|w| w.suspect)
    }

    /// Whether [`Sessions::plan`] changed since the last call.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// Whom to beat and whom to tell of a silent owner.
    pub fn plan(&self) -> SessionPlan {
        let dense: BTreeSet<NodeName> = self.watchers.keys().cloned().collect();
        let sparse = self.watched.keys().cloned().collect();
        let relays = self
            .watched
            .iter()
            .filter(|(_, w)| w.suspect && !w.relay_to.is_empty())
            .map(|(n, w)| (n.clone(), w.relay_to.clone()))
            .collect();
        SessionPlan {
            dense,
            sparse,
            relays,
        }
    }

    /// When the next owner turns suspect if it stays silent, or a relayed
    /// one stops being one.
    pub fn deadline(&self) -> Option<Instant> {
        self.watched
            .values()
            .filter(|w| !w.suspect)
            .filter_map(|w| w.heard)
            .map(|h| h + BEAT_MISS)
            .chain(self.relayed.values().copied())
            .min()
    }

    /// When `node`'s last beat came, within the last minute.
    pub fn last_beat(&self, node: &str) -> Option<Instant> {
        self.last_beat.get(node).copied()
    }

    /// When `node`'s addresses lapse, as it (or a relay) last said.
    pub fn lapse(&self, node: &str) -> Option<Lapse> {
        self.lapses.get(node).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(node: &str) -> Beat {
        Beat {
            at: Instant::now(),
            node: node.into(),
            generation: None,
            lapse: None,
            leaving: false,
            watching: true,
            silent: None,
        }
    }

    fn set(nodes: &[&str]) -> BTreeSet<NodeName> {
        nodes.iter().map(|n| NodeName::from(*n)).collect()
    }

    /// Owners watched, none with others next in line.
    fn owners(nodes: &[&str]) -> BTreeMap<NodeName, BTreeSet<NodeName>> {
        nodes
            .iter()
            .map(|n| (NodeName::from(*n), set(&[])))
            .collect()
    }

    fn relay(owner: &str, lapse: Option<Duration>) -> Beat {
        Beat {
            silent: Some(Silent {
                node: owner.into(),
                generation: None,
                lapse: lapse.map(|d| (d, d)),
            }),
            ..beat("w")
        }
    }

    fn suspects(s: &Sessions) -> Vec<&str> {
        ["a", "b", "c"]
            .into_iter()
            .filter(|n| s.is_suspect(n))
            .collect()
    }

    #[test]
    fn an_owner_heard_then_silent_is_suspect_until_heard_again() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        s.watch(owners(&["a"]), |_| true);
        assert_eq!(
            s.expire(t0 + Duration::from_secs(5)),
            (vec![], false),
            "never heard: never suspect"
        );
        assert_eq!(s.deadline(), None);
        s.heard(beat("a"), t0);
        assert_eq!(s.deadline(), Some(t0 + BEAT_MISS));
        assert!(!s.expire(t0 + BEAT_MISS - Duration::from_millis(1)).1);
        assert_eq!(s.expire(t0 + BEAT_MISS), (vec![NodeName::from("a")], true));
        assert!(s.is_suspect("a"));
        assert!(!s.expire(t0 + BEAT_MISS * 2).1, "suspect once");
        assert!(s.heard(beat("a"), t0 + BEAT_MISS * 3));
        assert!(!s.is_suspect("a"));
    }

    #[test]
    fn beats_within_the_miss_keep_an_owner_up() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        s.watch(owners(&["a"]), |_| true);
        let mut t = t0;
        for i in 0..400 {
            // Three beats in four lost: still within the miss.
            if i % 4 == 0 {
                s.heard(beat("a"), t);
            }
            t += BEAT_INTERVAL;
            assert!(!s.expire(t).1, "suspected at beat {i}");
        }
    }

    /// Only a beat that changes nothing here but when its sender was last
    /// heard is routine: not a relay, not from a suspect, not from a
    /// watcher this node does not know yet.
    #[test]
    fn only_a_beat_that_changes_no_one_is_routine() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        s.watch(owners(&["a"]), |_| true);
        let plain = Beat {
            watching: false,
            ..beat("a")
        };
        assert!(s.routine(&plain), "a watched owner, never suspect");
        assert!(!s.routine(&beat("w")), "a watcher not known yet");
        s.heard(beat("w"), t0);
        assert!(s.routine(&beat("w")), "a watcher known");
        assert!(!s.routine(&relay("a", None)), "a relay");
        s.heard(plain.clone(), t0);
        s.expire(t0 + BEAT_MISS);
        assert!(!s.routine(&plain), "a suspect heard again");
        assert!(s.heard(plain.clone(), t0 + BEAT_MISS * 2), "back");
        assert!(s.routine(&plain), "heard again, routine again");
    }

    #[test]
    fn a_suspect_stays_watched_while_gossip_holds_it_live() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        s.watch(owners(&["a", "b"]), |_| true);
        s.heard(beat("a"), t0);
        s.heard(beat("b"), t0);
        s.expire(t0 + BEAT_MISS);
        // Suspects drop out of this node's election, so it no longer comes
        // after them: they must stay watched to come back.
        s.watch(owners(&[]), |_| true);
        assert_eq!(suspects(&s), ["a", "b"]);
        s.watch(owners(&[]), |n| n == "b");
        assert_eq!(suspects(&s), ["b"]);
    }

    #[test]
    fn watchers_are_beaten_densely_owners_watched_sparsely() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        s.watch(owners(&["a"]), |_| true);
        assert!(s.take_changed(), "a watched");
        let owners_beat = Beat {
            watching: false,
            ..beat("x")
        };
        s.heard(owners_beat, t0);
        assert!(s.plan().dense.is_empty(), "an owner's beat is not answered");
        assert!(!s.heard(beat("w"), t0));
        let plan = s.plan();
        assert_eq!((plan.dense, plan.sparse), (set(&["w"]), set(&["a"])));
        assert!(s.take_changed(), "w heard");
        s.heard(beat("w"), t0 + WATCHER_TTL / 2);
        s.watch(owners(&["a"]), |_| true);
        assert!(!s.take_changed(), "the same peers");
        // An owner that watches this node too is beaten densely, once.
        s.heard(beat("a"), t0 + WATCHER_TTL / 2);
        let plan = s.plan();
        assert_eq!((plan.dense, plan.sparse), (set(&["a", "w"]), set(&["a"])));
        assert!(s.take_changed(), "a heard watching");
        s.expire(t0 + WATCHER_TTL / 2);
        assert!(!s.take_changed(), "no watcher's time is up yet");
        s.expire(t0 + WATCHER_TTL + WATCHER_TTL / 2);
        let plan = s.plan();
        assert_eq!((plan.dense, plan.sparse), (set(&[]), set(&["a"])));
        assert!(s.take_changed(), "w gone");
    }

    /// The watcher tells the others next in line while the owner is
    /// silent, and stops once it is heard again.
    #[test]
    fn a_silent_owner_is_relayed_to_the_others_next_in_line() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        let with_others = [("a".into(), set(&["b", "c"]))].into();
        s.watch(with_others, |_| true);
        s.heard(beat("a"), t0);
        assert!(s.plan().relays.is_empty());
        s.take_changed();
        s.expire(t0 + BEAT_MISS);
        assert!(s.take_changed(), "the relays are news");
        assert_eq!(s.plan().relays, [("a".into(), set(&["b", "c"]))].into());
        s.watch([("a".into(), set(&["c"]))].into(), |_| true);
        assert!(s.take_changed());
        assert_eq!(s.plan().relays, [("a".into(), set(&["c"]))].into());
        s.heard(beat("a"), t0 + BEAT_MISS * 2);
        assert!(s.take_changed());
        assert!(s.plan().relays.is_empty(), "heard again");
    }

    /// A relayed owner is suspect while relays come, and for
    /// [`RELAY_TTL`] after the last; the lapse it carries is kept. A relay
    /// makes no session with its sender.
    #[test]
    fn a_relay_holds_the_owner_suspect_while_relays_come() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        assert!(
            s.heard(relay("a", Some(Duration::from_secs(2))), t0),
            "news"
        );
        assert!(s.is_suspect("a"));
        assert_eq!(
            s.lapse("a").map(|l| l.last),
            Some(t0 + Duration::from_secs(2))
        );
        assert!(
            s.plan().dense.is_empty(),
            "no session with the relay's sender"
        );
        assert_eq!(s.deadline(), Some(t0 + RELAY_TTL));
        let t1 = t0 + RELAY_EVERY;
        assert!(!s.heard(relay("a", None), t1), "not news");
        assert_eq!(s.expire(t0 + RELAY_TTL), (vec![], false), "renewed");
        assert!(s.is_suspect("a"));
        assert_eq!(s.expire(t1 + RELAY_TTL), (vec![], true), "lifted");
        assert!(!s.is_suspect("a") && !s.any_suspect());
    }

    /// An owner this node stops watching while it still hears it no longer
    /// beats this node: the lapse it told is forgotten, not followed later
    /// as if it were still true. A silent owner's, or a relayed one's, is
    /// kept.
    #[test]
    fn an_owner_no_longer_watched_while_heard_takes_its_lapse_along() {
        let t0 = Instant::now();
        let lapse_in = Some((Duration::from_secs(4), Duration::from_secs(5)));
        let mut s = Sessions::default();
        s.watch(owners(&["a", "b"]), |_| true);
        s.heard(
            Beat {
                lapse: lapse_in,
                ..beat("a")
            },
            t0,
        );
        s.heard(relay("b", Some(Duration::from_secs(4))), t0);
        s.watch(owners(&[]), |_| true);
        assert_eq!(s.lapse("a"), None, "a heard, no longer watched");
        assert!(s.lapse("b").is_some(), "b relayed silent");
    }

    #[test]
    fn the_last_lapse_told_is_kept_after_the_owner_goes_silent() {
        let t0 = Instant::now();
        let mut s = Sessions::default();
        s.watch(owners(&["a"]), |_| true);
        s.heard(
            Beat {
                lapse: Some((Duration::from_secs(4), Duration::from_secs(5))),
                ..beat("a")
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
        s.watch(owners(&[]), |_| false);
        s.expire(t0 + Duration::from_secs(5) + LAPSE_KEPT - Duration::from_millis(1));
        assert!(s.lapse("a").is_some(), "kept after gossip lost the node");
        s.expire(t0 + Duration::from_secs(5) + LAPSE_KEPT);
        assert_eq!(s.lapse("a"), None, "forgotten once past");
    }
}
