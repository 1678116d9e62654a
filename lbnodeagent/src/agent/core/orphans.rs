//! The orphans' ledger: VIPs whose winner is a live peer with an older view
//! of the cluster that does not show them held, since when, and how long
//! each must wait before the nodes that know better take it.
//!
//! Which VIPs are orphans is a question of the election and the view, and
//! the core asks it ([`Core::orphans`](super::Core::orphans)); this part
//! keeps the answer between steps and the rules of the wait: a hand-over's
//! time ([`HANDOVER_MAX`]) while somebody answers, the view's spread
//! ([`VIEW_SPREAD`]) while nobody does, and the whole hand-over again once
//! a hostlb node is heard answering after all.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use super::{HANDOVER_MAX, VIEW_SPREAD};
use crate::election::NodeName;

#[derive(Default)]
pub(super) struct Orphans {
    /// Each orphan, and since when its winner has been behind as far as
    /// this node can tell.
    since: BTreeMap<IpAddr, Instant>,
    /// Who came first for each orphan when its duty was last read: the
    /// first live candidate not behind. It moves when a node behind
    /// catches up, and as well when one that is not comes or goes.
    fallback: BTreeMap<IpAddr, Option<NodeName>>,
    /// Orphans due before [`HANDOVER_MAX`] because nobody answered for
    /// them once the view had [`VIEW_SPREAD`] to spread.
    spread: BTreeSet<IpAddr>,
    /// Orphans a hostlb node answered for on the wire when asked: they
    /// wait [`HANDOVER_MAX`] as any somebody answers for.
    heard: BTreeSet<IpAddr>,
    /// The set must be found again at the next step (the view, the
    /// election or the peers' revisions moved).
    scan: bool,
    /// The winners of those orphans that have been behind for a
    /// hand-over's time, as this node publishes them.
    behind: Arc<BTreeSet<NodeName>>,
}

/// What a new scan changed.
pub(super) struct Rescanned {
    /// The set of orphans or the time of one changed (for the log).
    pub changed: bool,
    /// The VIPs whose duty must be read again: new, gone, waited from
    /// another time, or with another first node to fall back to.
    pub moved: Vec<IpAddr>,
}

impl Orphans {
    /// The set is found again at the next step.
    pub fn rescan(&mut self) {
        self.scan = true;
    }

    /// Whether a scan is due; it is done now.
    pub fn take_scan(&mut self) -> bool {
        std::mem::take(&mut self.scan)
    }

    pub fn since(&self, ip: IpAddr) -> Option<Instant> {
        self.since.get(&ip).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (IpAddr, Instant)> + '_ {
        self.since.iter().map(|(ip, t)| (*ip, *t))
    }

    pub fn ips(&self) -> Vec<IpAddr> {
        self.since.keys().copied().collect()
    }

    /// Replaces the orphans with those a scan `found`, each with the first
    /// node to fall back to.
    pub fn replace(
        &mut self,
        found: BTreeMap<IpAddr, Instant>,
        fallback: BTreeMap<IpAddr, Option<NodeName>>,
    ) -> Rescanned {
        let changed = found != self.since;
        let moved: Vec<IpAddr> = found
            .iter()
            .filter(|(ip, since)| {
                self.since.get(ip) != Some(since) || self.fallback.get(ip) != fallback.get(ip)
            })
            .map(|(ip, _)| ip)
            .chain(self.since.keys().filter(|ip| !found.contains_key(ip)))
            .copied()
            .collect();
        self.fallback = fallback;
        self.spread.retain(|ip| found.contains_key(ip));
        self.heard.retain(|ip| found.contains_key(ip));
        self.since = found;
        Rescanned { changed, moved }
    }

    /// Whether the orphan `ip`, an orphan `since`, is due by its own
    /// clock: its winner had a hand-over's time, or nobody answered for
    /// it once the view had spread. (The core adds a third way: its holder
    /// is a silent owner whose addresses will lapse.)
    pub fn waited(&self, ip: IpAddr, since: Instant, now: Instant) -> bool {
        now.saturating_duration_since(since) >= HANDOVER_MAX || self.spread.contains(&ip)
    }

    /// Orphans the view has had [`VIEW_SPREAD`] to reach the winner of,
    /// not yet due early: those of them nobody answers for are made so by
    /// [`Orphans::spread`].
    pub fn spread_candidates(&self, now: Instant) -> Vec<IpAddr> {
        self.since
            .iter()
            .filter(|(ip, since)| {
                !self.spread.contains(*ip) && now.saturating_duration_since(**since) >= VIEW_SPREAD
            })
            .map(|(ip, _)| *ip)
            .collect()
    }

    /// Makes `ips` due early: nobody answers for them.
    pub fn spread(&mut self, ips: impl IntoIterator<Item = IpAddr>) {
        self.spread.extend(ips);
    }

    /// An orphan due early is answered on the wire by another hostlb node:
    /// it waits the whole hand-over's time after all. `true` when it was
    /// due early.
    pub fn answered(&mut self, ip: IpAddr) -> bool {
        let early = self.spread.remove(&ip);
        if early {
            self.heard.insert(ip);
        }
        early
    }

    /// A hostlb node answered for `ip` when asked.
    pub fn heard(&self, ip: IpAddr) -> bool {
        self.heard.contains(&ip)
    }

    /// When each orphan's wait ends: its hand-over's time, and its view's
    /// spread where that still counts (`unanswered`, as the core knows it).
    /// Also `view_spread` (the view's own spread, while not yet seen; see
    /// `Dating::spread_at`) when an orphan's wait is over by then: one found
    /// in an earlier view has no deadline of its own left, and its first
    /// node is read again only once the peers still older are passed over
    /// at that spread. One still waiting then wakes the node at its own
    /// deadline, after it.
    pub fn deadlines(
        &self,
        unanswered: impl Fn(IpAddr) -> bool,
        view_spread: Option<Instant>,
    ) -> Vec<Instant> {
        let mut out = Vec::new();
        for (ip, since) in &self.since {
            out.push(*since + HANDOVER_MAX);
            if !self.spread.contains(ip) && unanswered(*ip) {
                out.push(*since + VIEW_SPREAD);
            }
        }
        if let Some(t) = view_spread
            && self.iter().any(|(ip, since)| self.waited(ip, since, t))
        {
            out.push(t);
        }
        out
    }

    /// The orphans this node has waited a hand-over's time for.
    pub fn overdue(&self, now: Instant) -> impl Iterator<Item = IpAddr> + '_ {
        self.since
            .iter()
            .filter(move |(_, since)| now.saturating_duration_since(**since) >= HANDOVER_MAX)
            .map(|(ip, _)| *ip)
    }

    /// The winners this node says are behind, as its gossip state carries
    /// them.
    pub fn behind(&self) -> &Arc<BTreeSet<NodeName>> {
        &self.behind
    }

    /// `true` when what this node says is behind changed.
    pub fn set_behind(&mut self, behind: BTreeSet<NodeName>) -> bool {
        if *self.behind == behind {
            return false;
        }
        self.behind = behind.into();
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_scan_says_which_duties_moved() {
        let t = Instant::now();
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        let mut o = Orphans::default();
        let first = o.replace(
            [(a, t), (b, t)].into(),
            [(a, Some("x".into())), (b, None)].into(),
        );
        assert!(first.changed);
        assert_eq!(first.moved, vec![a, b]);
        // The same set: nothing moved.
        let same = o.replace(
            [(a, t), (b, t)].into(),
            [(a, Some("x".into())), (b, None)].into(),
        );
        assert!(!same.changed && same.moved.is_empty());
        // Only the first node to fall back to moved: read again, though
        // the set is the same.
        let fell = o.replace(
            [(a, t), (b, t)].into(),
            [(a, Some("y".into())), (b, None)].into(),
        );
        assert!(!fell.changed);
        assert_eq!(fell.moved, vec![a]);
        // One gone: read again too.
        let gone = o.replace([(a, t)].into(), [(a, Some("y".into()))].into());
        assert!(gone.changed);
        assert_eq!(gone.moved, vec![b]);
    }

    #[test]
    fn an_orphan_nobody_answers_is_due_at_the_spread_and_waits_again_once_heard() {
        let t = Instant::now();
        let a = ip("10.0.0.1");
        let mut o = Orphans::default();
        o.replace([(a, t)].into(), [(a, None)].into());
        assert!(!o.waited(a, t, t + VIEW_SPREAD));
        // Still waiting at a view's spread: its own deadlines wake the node,
        // not the spread.
        assert_eq!(
            o.deadlines(|_| true, Some(t + VIEW_SPREAD / 2)),
            vec![t + HANDOVER_MAX, t + VIEW_SPREAD]
        );
        assert!(o.spread_candidates(t).is_empty());
        assert_eq!(o.spread_candidates(t + VIEW_SPREAD), vec![a]);
        o.spread([a]);
        assert!(o.waited(a, t, t + VIEW_SPREAD));
        assert!(o.spread_candidates(t + VIEW_SPREAD).is_empty());
        // Its deadlines: the hand-over's time only, once spread.
        assert_eq!(o.deadlines(|_| true, None), vec![t + HANDOVER_MAX]);
        // A newer view's spread is a deadline too: the wait is over by then,
        // and the winner still older is passed over only at it.
        let newer = t + Duration::from_millis(40) + VIEW_SPREAD;
        assert_eq!(
            o.deadlines(|_| true, Some(newer)),
            vec![t + HANDOVER_MAX, newer]
        );
        // Heard answering after all: the whole hand-over's time.
        assert!(o.answered(a));
        assert!(o.heard(a));
        assert!(!o.answered(a));
        assert!(!o.waited(a, t, t + VIEW_SPREAD));
        assert!(o.waited(a, t, t + HANDOVER_MAX));
        // Gone from the set: forgotten, heard or not.
        o.replace(BTreeMap::new(), BTreeMap::new());
        assert!(!o.heard(a));
        assert_eq!(o.overdue(t + Duration::from_secs(3600)).count(), 0);
    }

    #[test]
    fn behind_is_news_only_when_it_changes() {
        let mut o = Orphans::default();
        assert!(!o.set_behind(BTreeSet::new()));
        assert!(o.set_behind(["b".into()].into()));
        assert!(!o.set_behind(["b".into()].into()));
        assert_eq!(o.behind().len(), 1);
    }
}
