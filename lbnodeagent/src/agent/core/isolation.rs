//! Gossip isolation: the API shows agents running on other nodes (their
//! records are fresh) and gossip has reached none of them for
//! [`ISOLATED_AFTER`]. Such an agent would otherwise act alone and take
//! every VIP; the core makes it act as if partitioned instead (it asks
//! the LAN before taking any VIP). This part keeps who runs elsewhere and
//! since when gossip showed one of them; whether gossip shows a live peer
//! is the view's, and given here.

use std::collections::BTreeSet;
use std::time::Instant;

use super::ISOLATED_AFTER;
use crate::election::NodeName;

pub(super) struct Isolation {
    /// Nodes whose NodeAgent record is fresh, this one aside.
    running_elsewhere: BTreeSet<NodeName>,
    /// Gossip last showed a live peer then (or the agent started).
    peer_seen: Instant,
    isolated: bool,
}

impl Isolation {
    pub fn new(now: Instant) -> Isolation {
        Isolation {
            running_elsewhere: BTreeSet::new(),
            peer_seen: now,
            isolated: false,
        }
    }

    /// The agents the records show running elsewhere.
    pub fn set_running_elsewhere(&mut self, nodes: BTreeSet<NodeName>) {
        self.running_elsewhere = nodes;
    }

    /// Gossip shows no live peer (`gossip_alone`) while the API shows
    /// other agents running: a start before gossip connected, or
    /// isolation.
    pub fn lonely(&self, gossip_alone: bool) -> bool {
        !self.running_elsewhere.is_empty() && gossip_alone
    }

    pub fn isolated(&self) -> bool {
        self.isolated
    }

    /// The agents the API shows running elsewhere while gossip reaches
    /// none of them (empty unless isolated).
    pub fn from(&self) -> Vec<String> {
        if self.isolated {
            self.running_elsewhere
                .iter()
                .map(|n| n.to_string())
                .collect()
        } else {
            Vec::new()
        }
    }

    pub fn running_elsewhere(&self) -> &BTreeSet<NodeName> {
        &self.running_elsewhere
    }

    /// Notes what gossip shows now; the new state when it changed.
    pub fn note(&mut self, gossip_alone: bool, now: Instant) -> Option<bool> {
        let lonely = self.lonely(gossip_alone);
        if !lonely {
            self.peer_seen = now;
        }
        let isolated = lonely && now.saturating_duration_since(self.peer_seen) >= ISOLATED_AFTER;
        if isolated == self.isolated {
            return None;
        }
        self.isolated = isolated;
        Some(isolated)
    }

    /// When a lonely node becomes isolated, while it is not yet.
    pub fn deadline(&self, gossip_alone: bool) -> Option<Instant> {
        (!self.isolated && self.lonely(gossip_alone)).then(|| self.peer_seen + ISOLATED_AFTER)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn lonely_for_the_whole_wait_is_isolated_and_a_peer_ends_it() {
        let t = Instant::now();
        let mut i = Isolation::new(t);
        // Alone, but nobody else runs: a lone node, not isolated.
        assert_eq!(i.note(true, t + ISOLATED_AFTER), None);
        assert_eq!(i.deadline(true), None);
        i.set_running_elsewhere(["b".into()].into());
        let seen = t + ISOLATED_AFTER;
        assert_eq!(i.note(false, seen), None);
        assert_eq!(i.deadline(true), Some(seen + ISOLATED_AFTER));
        assert_eq!(
            i.note(true, seen + ISOLATED_AFTER - Duration::from_millis(1)),
            None
        );
        assert_eq!(i.note(true, seen + ISOLATED_AFTER), Some(true));
        assert_eq!(i.from(), vec!["b".to_string()]);
        assert_eq!(i.deadline(true), None, "isolated already");
        // A peer heard again ends it at once.
        let back = seen + ISOLATED_AFTER * 2;
        assert_eq!(i.note(false, back), Some(false));
        assert!(i.from().is_empty());
    }
}
