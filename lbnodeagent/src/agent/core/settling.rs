//! A starting node's settling: when gossip first showed it a peer, when
//! its membership counts as settled, how long after it became a
//! candidate it takes nothing (see `Core::settle`), and the addresses of
//! a previous run it let go meanwhile.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::links::Want;
use super::{STARTUP_GRACE, UNCONFIRMED_GRACE};

/// Gossip rounds a node that settled waits before it takes anything: by
/// then it sees every peer that settled at the same moment.
const QUIET_ROUNDS: u32 = 3;

pub(super) struct Settling {
    started: Instant,
    /// When gossip first showed a peer, while starting.
    first_peer: Option<Instant>,
    /// When this node first had a view of the cluster, while starting.
    known_at: Option<Instant>,
    /// Nothing is taken before this: a few gossip rounds after this node
    /// became a candidate.
    acquire_from: Instant,
    /// Addresses of a previous run this node let go while starting, to a
    /// starting node first in the hash order that showed them too, and
    /// where they were: put back if that node stops showing them before
    /// this one is running (see `Core::starting_comebacks`).
    yields: BTreeMap<IpAddr, Want>,
}

impl Settling {
    pub(super) fn new(now: Instant) -> Settling {
        Settling {
            started: now,
            first_peer: None,
            known_at: None,
            acquire_from: now,
            yields: BTreeMap::new(),
        }
    }

    /// An address of a previous run let go while starting, from `at`.
    pub(super) fn yielded(&mut self, ip: IpAddr, at: Want) {
        self.yields.insert(ip, at);
    }

    /// The addresses let go while starting; none once running.
    pub(super) fn yields(&self) -> Vec<IpAddr> {
        self.yields.keys().copied().collect()
    }

    /// No longer to be put back: where it was, if it was listed.
    pub(super) fn drop_yield(&mut self, ip: IpAddr) -> Option<Want> {
        self.yields.remove(&ip)
    }

    /// Running: what was let go while starting is the election's now.
    pub(super) fn forget_yields(&mut self) {
        self.yields.clear();
    }

    /// Whether a starting node's membership has settled: with `peers`
    /// shown, once `QUIET_ROUNDS` gossip rounds (`interval` each) passed
    /// since the first and the failure detector confirmed every node
    /// (`unconfirmed` is none), or after [`UNCONFIRMED_GRACE`] whatever it
    /// says; with none, after [`STARTUP_GRACE`] (the first node of a
    /// cluster).
    ///
    /// The unconfirmed grace runs from the first peer or from the first
    /// view of the cluster (`known`), whichever is later. A node started
    /// while the API server is unreachable meets its peers in gossip but
    /// cannot read their identities (their records come from the same
    /// server), so nothing it hears of them counts; a grace run out
    /// meanwhile would have it elect alone the moment the server returns,
    /// win every VIP and find each answered by a host it cannot tell from
    /// a stranger.
    pub(super) fn membership_settled(
        &mut self,
        peers: bool,
        unconfirmed: usize,
        known: bool,
        interval: Duration,
        now: Instant,
    ) -> bool {
        if known {
            self.known_at.get_or_insert(now);
        }
        if !peers {
            return now.saturating_duration_since(self.started) >= STARTUP_GRACE;
        }
        let first = *self.first_peer.get_or_insert(now);
        let waited = now.saturating_duration_since(first);
        (waited >= interval * QUIET_ROUNDS && unconfirmed == 0)
            || self.grace_ends().is_some_and(|end| now >= end)
    }

    /// When the unconfirmed grace ends: `None` before a peer and a view.
    fn grace_ends(&self) -> Option<Instant> {
        Some(self.first_peer?.max(self.known_at?) + UNCONFIRMED_GRACE)
    }

    /// The node became a candidate `now`: it takes nothing for
    /// `QUIET_ROUNDS` more rounds.
    pub(super) fn running(&mut self, interval: Duration, now: Instant) {
        self.acquire_from = now + interval * QUIET_ROUNDS;
    }

    /// Whether a running node may take a VIP now.
    pub(super) fn may_take(&self, now: Instant) -> bool {
        now >= self.acquire_from
    }

    /// When a running node may take VIPs.
    pub(super) fn acquire_from(&self) -> Instant {
        self.acquire_from
    }

    /// When a starting node's settling may move without another input.
    pub(super) fn starting_wakes(&self, interval: Duration) -> impl Iterator<Item = Instant> {
        let (a, b) = match self.first_peer {
            // Before a view, at the end of the grace as it would run from
            // the first peer: a view comes as an input, which wakes anyway.
            Some(first) => (
                first + interval * QUIET_ROUNDS,
                Some(self.grace_ends().unwrap_or(first + UNCONFIRMED_GRACE)),
            ),
            None => (self.started + STARTUP_GRACE, None),
        };
        std::iter::once(a).chain(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUND: Duration = Duration::from_millis(100);

    #[test]
    fn alone_a_node_settles_after_the_start_grace() {
        let t0 = Instant::now();
        let mut s = Settling::new(t0);
        assert_eq!(
            s.starting_wakes(ROUND).collect::<Vec<_>>(),
            [t0 + STARTUP_GRACE]
        );
        assert!(!s.membership_settled(false, 0, true, ROUND, t0 + STARTUP_GRACE / 2));
        assert!(s.membership_settled(false, 0, true, ROUND, t0 + STARTUP_GRACE));
    }

    /// With peers: three rounds after the first was seen, once the
    /// detector confirmed every node; unconfirmed ones hold it back for
    /// the unconfirmed grace at most.
    #[test]
    fn with_peers_a_node_settles_after_three_rounds_or_the_unconfirmed_grace() {
        let t0 = Instant::now();
        let mut s = Settling::new(t0);
        let seen = t0 + Duration::from_millis(50);
        assert!(!s.membership_settled(true, 0, true, ROUND, seen));
        assert_eq!(
            s.starting_wakes(ROUND).collect::<Vec<_>>(),
            [seen + ROUND * 3, seen + UNCONFIRMED_GRACE]
        );
        assert!(!s.membership_settled(true, 0, true, ROUND, seen + ROUND * 2));
        assert!(
            !s.membership_settled(true, 1, true, ROUND, seen + ROUND * 3),
            "one unconfirmed"
        );
        assert!(s.membership_settled(true, 0, true, ROUND, seen + ROUND * 3));
        assert!(s.membership_settled(true, 1, true, ROUND, seen + UNCONFIRMED_GRACE));
    }

    /// Peers met before the cluster is known (the API server unreachable
    /// at start): their identities cannot be read, so the grace for
    /// them runs from the first view, not from the first peer.
    #[test]
    fn the_unconfirmed_grace_runs_from_the_first_view_of_the_cluster() {
        let t0 = Instant::now();
        let mut s = Settling::new(t0);
        let seen = t0 + Duration::from_millis(50);
        assert!(!s.membership_settled(true, 2, false, ROUND, seen));
        let late = seen + UNCONFIRMED_GRACE + Duration::from_secs(1);
        assert!(
            !s.membership_settled(true, 2, false, ROUND, late),
            "no view yet"
        );
        assert!(
            !s.membership_settled(true, 2, true, ROUND, late),
            "the view has just come"
        );
        assert_eq!(
            s.starting_wakes(ROUND).collect::<Vec<_>>(),
            [seen + ROUND * 3, late + UNCONFIRMED_GRACE]
        );
        assert!(s.membership_settled(true, 0, true, ROUND, late + ROUND));
        assert!(s.membership_settled(true, 2, true, ROUND, late + UNCONFIRMED_GRACE));
    }

    #[test]
    fn a_new_candidate_takes_nothing_for_three_rounds() {
        let t0 = Instant::now();
        let mut s = Settling::new(t0);
        assert!(s.may_take(t0));
        let t1 = t0 + Duration::from_secs(1);
        s.running(ROUND, t1);
        assert_eq!(s.acquire_from(), t1 + ROUND * 3);
        assert!(!s.may_take(t1 + ROUND * 2));
        assert!(s.may_take(t1 + ROUND * 3));
    }
}
