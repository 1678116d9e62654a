//! Lost gateways as this node's election counts them: a change counts
//! once every agent can have heard of it.
//!
//! Every agent asks its gateways at the same whole second of the wall
//! clock (see `announce::gateway`), so when a router dies every node finds
//! it lost in the same round. Each learns its own loss at once but its
//! peers' only through gossip, a round or two later. Counted at once, its
//! own loss ranks each node last while the others still look sound to it:
//! every node then defers to another, and a VIP going dark at that moment
//! (a dead owner's address lapsing) waits for the gossip to cross,
//! although the order among nodes that all lost their gateway is the usual
//! one. So a change of anyone's lost gateways, this node's included, is
//! counted only [`SETTLE_ROUNDS`] gossip rounds after the first change not
//! yet counted, together with every change that came meanwhile: the
//! nodes of one view count the same losses at about the same moment, and
//! a loss for everyone moves nothing. Upstream health is judged over
//! seconds; the wait is a fraction of one.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::election::NodeName;
use crate::election::{Member, OnLink};

/// Gossip rounds between the first change of the lost gateways not yet
/// counted and the moment it counts: a node's state reaches its peers in
/// one or two rounds, one more for a lost datagram.
pub const SETTLE_ROUNDS: u32 = 3;

/// Per node, which of its prefixes count as behind a lost gateway.
#[derive(Default)]
pub(super) struct Upstream {
    /// Per node: its prefixes whose gateway counts as lost, in the order
    /// of its `on_link`, and the call that last saw it a member.
    counted: BTreeMap<NodeName, (u64, Vec<OnLink>)>,
    /// Calls to [`Upstream::count`]: who was not a member at the last one
    /// is forgotten.
    calls: u64,
    /// When what the members say first differed from what is counted.
    pending: Option<Instant>,
}

fn lost(m: &Member) -> impl Iterator<Item = &OnLink> {
    m.on_link.iter().filter(|o| o.upstream_lost)
}

impl Upstream {
    /// The members as the election is to have them: each one's lost
    /// gateways as counted. A member first seen counts as it is (it has no
    /// change to wait for); a change counts once `settle` has passed since
    /// the first one not counted. `None`: every member as it is.
    pub(super) fn count(
        &mut self,
        now: Instant,
        settle: Duration,
        members: &[&Member],
    ) -> Option<Vec<Member>> {
        self.calls += 1;
        let call = self.calls;
        let mut differs = false;
        for m in members {
            match self.counted.get_mut(&m.node) {
                Some((seen, c)) => {
                    *seen = call;
                    differs |= !lost(m).eq(c.iter());
                }
                None => {
                    self.counted
                        .insert(m.node.clone(), (call, lost(m).cloned().collect()));
                }
            }
        }
        self.counted.retain(|_, (seen, _)| *seen == call);
        if !differs {
            self.pending = None;
            return None;
        }
        let since = *self.pending.get_or_insert(now);
        if now.saturating_duration_since(since) >= settle {
            for m in members {
                self.counted
                    .insert(m.node.clone(), (call, lost(m).cloned().collect()));
            }
            self.pending = None;
            return None;
        }
        Some(
            members
                .iter()
                .map(|m| {
                    let (_, counted) = &self.counted[&m.node];
                    let on_link = m
                        .on_link
                        .iter()
                        .map(|o| OnLink {
                            upstream_lost: counted
                                .iter()
                                .any(|c| c.prefix == o.prefix && c.interface == o.interface),
                            ..o.clone()
                        })
                        .collect();
                    Member {
                        on_link,
                        ..(*m).clone()
                    }
                })
                .collect(),
        )
    }

    /// When a change not counted yet is to count.
    pub(super) fn deadline(&self, settle: Duration) -> Option<Instant> {
        self.pending.map(|since| since + settle)
    }

    /// The changes not counted yet are due.
    pub(super) fn due(&self, now: Instant, settle: Duration) -> bool {
        self.deadline(settle).is_some_and(|d| now >= d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostlb_api::Prefix;

    const SETTLE: Duration = Duration::from_millis(300);

    fn member(node: &str, lost: bool) -> Member {
        let prefix: Prefix = "10.0.0.0/24".parse().unwrap();
        let mut m = Member::alive(node, [prefix]);
        m.on_link = vec![OnLink {
            upstream_lost: lost,
            ..m.on_link[0].clone()
        }]
        .into();
        m
    }

    fn lost_of(members: &[Member]) -> Vec<(NodeName, bool)> {
        members
            .iter()
            .map(|m| (m.node.clone(), m.on_link[0].upstream_lost))
            .collect()
    }

    #[test]
    fn a_member_first_seen_counts_as_it_is() {
        let mut u = Upstream::default();
        let (a, b) = (member("a", true), member("b", false));
        assert!(u.count(Instant::now(), SETTLE, &[&a, &b]).is_none());
        assert_eq!(u.deadline(SETTLE), None);
    }

    #[test]
    fn losses_that_come_one_by_one_count_together_once_settled() {
        let t0 = Instant::now();
        let mut u = Upstream::default();
        let (a, b, c) = (member("a", false), member("b", false), member("c", false));
        assert!(u.count(t0, SETTLE, &[&a, &b, &c]).is_none());
        // This node finds its own gateway lost; a peer's loss arrives by
        // gossip 130 ms later: neither counts before the settle.
        let a_lost = member("a", true);
        let held = u.count(t0, SETTLE, &[&a_lost, &b, &c]).expect("held");
        assert_eq!(
            lost_of(&held),
            [
                ("a".into(), false),
                ("b".into(), false),
                ("c".into(), false)
            ]
        );
        assert_eq!(u.deadline(SETTLE), Some(t0 + SETTLE));
        let b_lost = member("b", true);
        let t1 = t0 + Duration::from_millis(130);
        let held = u.count(t1, SETTLE, &[&a_lost, &b_lost, &c]).expect("held");
        assert!(lost_of(&held).iter().all(|(_, l)| !l));
        // The wait counts from the first change, not the last.
        assert_eq!(u.deadline(SETTLE), Some(t0 + SETTLE));
        assert!(!u.due(t0 + SETTLE - Duration::from_millis(1), SETTLE));
        assert!(u.due(t0 + SETTLE, SETTLE));
        assert!(
            u.count(t0 + SETTLE, SETTLE, &[&a_lost, &b_lost, &c])
                .is_none()
        );
        assert_eq!(u.deadline(SETTLE), None);
        // Counted now: the members as they are need nothing held.
        assert!(
            u.count(t0 + SETTLE, SETTLE, &[&a_lost, &b_lost, &c])
                .is_none()
        );
    }

    #[test]
    fn a_change_undone_before_it_counts_moves_nothing() {
        let t0 = Instant::now();
        let mut u = Upstream::default();
        let (a, b) = (member("a", false), member("b", false));
        assert!(u.count(t0, SETTLE, &[&a, &b]).is_none());
        assert!(u.count(t0, SETTLE, &[&member("a", true), &b]).is_some());
        assert!(
            u.count(t0 + Duration::from_millis(100), SETTLE, &[&a, &b])
                .is_none()
        );
        assert_eq!(u.deadline(SETTLE), None);
    }

    #[test]
    fn a_node_that_left_and_came_back_counts_as_new() {
        let t0 = Instant::now();
        let mut u = Upstream::default();
        let (a, b) = (member("a", false), member("b", false));
        assert!(u.count(t0, SETTLE, &[&a, &b]).is_none());
        assert!(u.count(t0, SETTLE, &[&a]).is_none());
        assert!(u.count(t0, SETTLE, &[&a, &member("b", true)]).is_none());
    }
}
