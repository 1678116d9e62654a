//! The cluster as gossip shows it: membership views, owners lost and
//! watched, the start's settling, the election's members, and isolation.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, info, warn};

use crate::election::Member;
use crate::model::{MemberInfo, MembershipView, PROTOCOL_DRAIN, Status};

use super::sessions::{self};
use super::{
    Actions, ConflictSeen, Core, HANDOVER_MAX, Metric, Phase, STARTUP_GRACE, TAKEOVER_WINDOW,
    UNCONFIRMED_GRACE,
};

/// `node`'s leaving beat came after gossip had lost it, within a
/// hand-over's time (see `Core::left_gone`).
pub(super) fn left_lately(left_gone: &BTreeMap<String, Instant>, node: &str, now: Instant) -> bool {
    left_gone
        .get(node)
        .is_some_and(|t| now.saturating_duration_since(*t) < HANDOVER_MAX)
}

impl Core {
    /// Whether a beat's `generation` of `node` is another run than the
    /// one gossip shows.
    pub(super) fn of_another_run(&self, node: &str, generation: Option<u64>) -> bool {
        generation.is_some_and(|g| {
            self.gossip_view
                .node(node)
                .is_some_and(|n| n.generation != g)
        })
    }

    /// `node` left gracefully and gossip no longer shows it: its host's
    /// answers for a hand-over's time are the last of its hand-over.
    fn note_left_gone(&mut self, node: String, now: Instant) {
        self.left_gone
            .retain(|_, t| now.saturating_duration_since(*t) < HANDOVER_MAX);
        self.left_gone.insert(node, now);
    }

    /// `node`'s leaving beat says it goes: its addresses answer until
    /// others do. True when that is news.
    pub(super) fn left_by_beat(&mut self, node: String) -> bool {
        if node == self.settings.node {
            return false;
        }
        let Some(generation) = self.gossip_view.node(&node).map(|n| n.generation) else {
            if self.lost_at.contains_key(&node) {
                // Lost a moment ago: its `cleanup` removes each address
                // once another node answers for it, so an answer from its
                // host is no owner to stay off for.
                info!(%node, "its leaving beat came after gossip lost it; taking its addresses as from a leaving node");
                // A VIP yielded to it and wanted here is unsettled, so
                // decided again at this very step: the yield ends there.
                self.note_left_gone(node.clone(), self.now);
            } else {
                debug!(%node, "leaving beat from a node gossip does not show live");
            }
            return false;
        };
        if self.left.get(&node) == Some(&generation) {
            return false;
        }
        info!(%node, "its leaving beat says it goes; taking its addresses as from a leaving node");
        self.left.insert(node, generation);
        true
    }

    /// Acts on membership: gossip's view without the owners whose
    /// sessions went silent (see [`sessions`]), and with the nodes whose
    /// leaving beat came as leaving.
    pub(super) fn apply_view(&mut self, now: Instant, out: &mut Actions) {
        let gossip = &self.gossip_view;
        // A node whose leaving beat came and that gossip has since lost
        // left gracefully: its host's answers heard a moment later are
        // the last of its hand-over (it let go once this node answered),
        // not a second owner to let go to (seed 10090839114: the VIP
        // went unanswered).
        let gone_after_leaving: Vec<String> = self
            .left
            .keys()
            .filter(|n| gossip.node(n).is_none())
            .cloned()
            .collect();
        for n in gone_after_leaving {
            self.note_left_gone(n, now);
        }
        let gossip = &self.gossip_view;
        self.left
            .retain(|n, g| gossip.node(n).is_some_and(|i| i.generation == *g));
        let view = if self.left.is_empty() && !self.sessions.any_suspect() {
            Arc::clone(&self.gossip_view)
        } else {
            let mut view = (*self.gossip_view).clone();
            if !self.left.is_empty() {
                view.members.retain(|m| !self.left.contains_key(&m.node));
                for n in &mut view.nodes {
                    if n.status == Status::Alive && self.left.contains_key(&n.node) {
                        n.status = Status::Leaving;
                    }
                }
            }
            if self.sessions.any_suspect() {
                // A node whose leaving beat came is leaving, not silent:
                // its host answers until others do, and it is handed over
                // as such.
                let suspect = |n: &str| {
                    n != self.settings.node
                        && self.sessions.is_suspect(n)
                        && !self.left.contains_key(n)
                };
                view.members.retain(|m| !suspect(&m.node));
                let (silent, nodes): (Vec<_>, Vec<_>) =
                    view.nodes.into_iter().partition(|n| suspect(&n.node));
                view.nodes = nodes;
                view.gone.extend(silent);
            }
            Arc::new(view)
        };
        // Most views are of a peer's state (its held VIPs), with the same
        // members: the election has them already, and nobody was lost.
        let members_changed = self.view.members != view.members;
        if members_changed {
            let members: BTreeSet<&str> = view.members.iter().map(|m| m.node.as_str()).collect();
            for m in &self.view.members {
                if !members.contains(m.node.as_str()) {
                    self.lost_at.insert(m.node.clone(), now);
                }
            }
        }
        self.lost_at
            .retain(|_, t| now.saturating_duration_since(*t) < TAKEOVER_WINDOW * 3);
        let before = ByName::of(&self.view);
        // Whose published state changed, of the live nodes: what it holds
        // is learnt again below.
        let mut news = Vec::with_capacity(view.nodes.len());
        for (i, n) in view.nodes.iter().enumerate() {
            let b = before.get(&n.node, i);
            news.push(b.is_none_or(|(b, _)| b.macs != n.macs || b.vips != n.vips));
            let live_before = b.filter(|(b, live)| *live && b.generation == n.generation);
            match live_before {
                Some((b, _)) if b.vips == n.vips => {}
                Some((b, _)) => {
                    let gained = match self.vips_gained.get_mut(&n.node) {
                        Some(gained) => gained,
                        None => self.vips_gained.entry(n.node.clone()).or_default(),
                    };
                    gained.retain(|ip, _| n.vips.contains(ip));
                    for ip in n.vips.difference(&b.vips) {
                        gained.insert(*ip, now);
                    }
                }
                None => {
                    let all = n.vips.iter().map(|ip| (*ip, now)).collect();
                    self.vips_gained.insert(n.node.clone(), all);
                }
            }
        }
        if self.vips_gained.len() > view.nodes.len() {
            let live: BTreeSet<&str> = view.nodes.iter().map(|n| n.node.as_str()).collect();
            self.vips_gained
                .retain(|node, _| live.contains(node.as_str()));
        }
        // The live last, so that who holds a VIP now wins over a
        // gone node's last word. Only what changed: a view comes with
        // every gossip update, and most of its nodes are as they were.
        let gone_news = view.gone.iter().filter(|n| {
            before
                .get(&n.node, usize::MAX)
                .is_none_or(|(b, _)| b.macs != n.macs || b.vips != n.vips)
        });
        let live_news = view.nodes.iter().zip(&news).filter(|(_, new)| **new);
        self.conflicts.learn(
            gone_news.chain(live_news.map(|(n, _)| n)),
            &self.settings.node,
        );
        let drain_was_in_force = self.drain_in_force();
        self.view = view;
        self.orphans.rescan();
        // A view that only brings a peer's new state changes nothing the
        // annotations show (see `elect_members`), and views come many
        // times a second.
        if members_changed || drain_was_in_force != self.drain_in_force() {
            self.elect_members();
        }
        out.metrics.push(Metric::Elected);
        // Adopted addresses another node now holds, VIPs handed
        // over, and VIPs a peer holds too may be decided now.
        let mut waiting: BTreeSet<IpAddr> = self
            .slots
            .iter()
            .filter(|(_, s)| {
                s.held
                    .as_ref()
                    .is_some_and(|h| h.handover.is_some() || h.adopted || h.contested.is_some())
            })
            .map(|(ip, _)| *ip)
            .collect();
        for n in self.alive_peers() {
            waiting.extend(
                n.vips
                    .iter()
                    .filter(|ip| self.slots.get(ip).is_some_and(|s| s.held.is_some())),
            );
        }
        self.mark(waiting);
        self.watching.moved(now);
        self.sent.touch_beats();
    }

    /// Works out again which owners this node watches, once the election
    /// moved (at most every [`WATCH_EVERY`]: one election per VIP): those
    /// for whose lowest VIP it comes next, each with the others next in
    /// line for its VIPs.
    pub(super) fn watch_owners(&mut self, now: Instant) {
        if !self.watching.take_due(now) {
            return;
        }
        let running = self.phase == Phase::Running;
        let me = &self.settings.node;
        let election = &mut self.election;
        let epoch = election.epoch();
        // One election per VIP: only when the election changed.
        let owners = self
            .watching
            .owners(epoch, running, || {
                if running {
                    sessions::watched_by(me, &election.runners_up())
                } else {
                    BTreeMap::new()
                }
            })
            .clone();
        let gossip = &self.gossip_view;
        self.sessions.watch(owners, |n| gossip.node(n).is_some());
    }

    /// Whether a starting agent may elect: the cluster is known, and gossip
    /// has had time to show the other members. A node that elected before
    /// hearing from its peers would win every VIP alone and put them on the
    /// wire beside their real owners. Settled once a peer was seen, a few
    /// rounds passed (so its state, held VIPs included, arrived) and the
    /// failure detector has confirmed every node gossip reports (in a large
    /// cluster that takes a few seconds), or after [`STARTUP_GRACE`] with
    /// nobody to hear from (the first node of a cluster). Nodes the
    /// detector cannot reach hold it back for at most [`UNCONFIRMED_GRACE`].
    ///
    /// Peers that are still starting are no candidates, so two nodes that
    /// settle at the same moment would each elect as if the other were
    /// absent, and both add the VIPs the other wins. So a node that
    /// settles publishes `alive` at once but takes nothing for three more
    /// gossip rounds (`acquire_from`), by when it sees every peer that
    /// settled with it; one that settles later takes over from it make
    /// before break, as any returning node does.
    pub(super) fn settle(&mut self, now: Instant) -> bool {
        let peers = self.view.unconfirmed > 0
            || self.view.nodes.iter().any(|n| n.node != self.settings.node);
        let settled = if peers {
            let first = *self.first_peer.get_or_insert(now);
            let waited = now.saturating_duration_since(first);
            let settled = (waited >= self.settings.gossip_interval * 3
                && self.view.unconfirmed == 0)
                || waited >= UNCONFIRMED_GRACE;
            // Said once, as it elects: until the cluster is known this
            // runs at every step.
            if settled && self.dating.known() && self.view.unconfirmed > 0 {
                warn!(
                    unconfirmed = self.view.unconfirmed,
                    "electing although the failure detector has not reached every node gossip reports alive"
                );
            }
            settled
        } else {
            now.saturating_duration_since(self.started) >= STARTUP_GRACE
        };
        settled && self.dating.known()
    }

    /// This node as the election should see it: from its own links and
    /// phase, not from the echo of its gossip state, which lags.
    pub(super) fn own_member(&self) -> Option<Member> {
        (self.phase == Phase::Running).then(|| Member {
            node: self.settings.node.clone(),
            leaving: false,
            drained: self.drain && self.drain_in_force(),
            virtual_mode: self.links.virtual_link.is_some(),
            on_link: Arc::clone(&self.on_link),
        })
    }

    /// Hands the membership (with this node as it is now) to the election
    /// and marks what it says moved.
    pub(super) fn elect_members(&mut self) {
        // The annotations follow the election, the first member (who
        // clears what nobody announces) and this node's own VIPs.
        self.sent.touch_report();
        let own = self.own_member();
        let me = self.settings.node.as_str();
        let peers = self.view.members.iter().filter(|m| m.node != me);
        let moved = if self.drain_in_force() || !self.view.members.iter().any(|m| m.drained) {
            self.election.set_members(peers.chain(own.as_ref()))
        } else {
            // An agent of an older protocol elects drained nodes like any
            // other: so does this one until every member knows drains.
            let undrained: Vec<Member> = peers
                .map(|m| Member {
                    drained: false,
                    ..m.clone()
                })
                .collect();
            self.election
                .set_members(undrained.iter().chain(own.as_ref()))
        };
        if own != self.own_member {
            // Its interfaces or its candidacy changed: any duty may have.
            self.own_member = own;
            self.all_dirty = true;
        } else {
            self.mark(moved);
        }
    }

    /// A drain counts in the election only once every node gossip shows
    /// speaks [`PROTOCOL_DRAIN`]: until then all elect as the oldest does.
    pub fn drain_in_force(&self) -> bool {
        self.view.nodes.iter().all(|n| n.protocol >= PROTOCOL_DRAIN)
    }

    /// Its operator drained this node, in force or not.
    pub fn drain_requested(&self) -> bool {
        self.drain
    }

    /// This node is drained and the drain is in force.
    pub fn drained(&self) -> bool {
        self.drain && self.drain_in_force()
    }

    /// Gossip is isolated: the API shows agents running on other nodes (their
    /// records are fresh) and gossip has reached none of them for
    /// [`ISOLATED_AFTER`](super::ISOLATED_AFTER) (a firewall on UDP 7934, another key or cluster
    /// id, an advertise address nobody can reach). Such an agent would
    /// otherwise act alone and take every VIP. It acts as if partitioned
    /// instead: it asks the LAN before taking any VIP, and the conflict
    /// rule, which knows the other agents' MACs from their records, settles
    /// any second owner by the election's order.
    pub fn isolated(&self) -> bool {
        self.isolation.isolated()
    }

    /// Gossip shows no live peer while the API shows other agents running:
    /// a start before gossip connected, or isolation. Nothing is taken
    /// without asking the LAN first meanwhile.
    pub fn lonely(&self) -> bool {
        self.isolation.lonely(self.gossip_alone())
    }

    /// Addresses of the cluster's Services that the election gives to no
    /// node (no live, eligible, on-link candidate, and no node to hold it
    /// on its virtual interface). Before a first cluster view, none.
    pub fn vips_without_candidate(&self) -> usize {
        self.services_of
            .keys()
            .filter(|ip| {
                self.election.winner(**ip).is_none() && self.election.virtual_nodes(**ip).is_empty()
            })
            .count()
    }

    pub fn last_conflict(&self) -> Option<&ConflictSeen> {
        self.last_conflict.as_ref()
    }

    /// Gossip shows no live peer.
    pub fn gossip_alone(&self) -> bool {
        let me = &self.settings.node;
        !self.gossip_view.members.iter().any(|m| m.node != *me)
    }

    pub(super) fn note_isolation(&mut self, now: Instant, out: &mut Actions) {
        if let Some(isolated) = self.isolation.note(self.gossip_alone(), now) {
            out.isolated = Some(isolated);
            if isolated {
                warn!(
                    running = ?self.isolation.running_elsewhere(),
                    "gossip reaches no other agent while the API shows agents running on other nodes; acting as if partitioned (check UDP {} between the hosts, gossip.key_file and gossip.cluster_id)",
                    crate::model::DEFAULT_PORT
                );
            } else {
                info!("gossip reaches other agents again");
            }
        }
    }

    /// Live peers whose view of the cluster is older than this node's.
    /// The other nodes gossip shows live and `alive` (candidates, not
    /// starting or leaving), with what they publish.
    pub(super) fn alive_peers(&self) -> impl Iterator<Item = &crate::model::MemberInfo> {
        self.view
            .nodes
            .iter()
            .filter(|n| n.node != self.settings.node && n.status == Status::Alive)
    }

    /// How new `peer`'s view of the cluster is, to compare with this
    /// node's revision: this node's own when the two views hold the same.
    /// Agents write annotations on the Services they announce, and each
    /// write moves every watch's resourceVersion; a peer that has not seen
    /// the latest of those yet has no older view for it, and taking it for
    /// one would keep a VIP on two nodes until the writes reach it (a
    /// drain under load: 150 ms).
    pub(super) fn revision_of(&self, peer: &crate::model::MemberInfo) -> u64 {
        self.dating.of(peer.revision, peer.digest)
    }

    /// A live peer whose view of the cluster this node finds older than
    /// its own: the VIPs it wins by this node's view stay where they are
    /// until it catches up (shown by `lbnodeagent status`).
    pub fn view_behind(&self, peer: &crate::model::MemberInfo) -> bool {
        peer.node != self.settings.node
            && peer.status == Status::Alive
            && self.revision_of(peer) < self.dating.revision()
    }

    pub(super) fn older_peers(&self) -> BTreeSet<String> {
        self.alive_peers()
            .filter(|n| self.revision_of(n) < self.dating.revision())
            .map(|n| n.node.clone())
            .collect()
    }
}

/// The previous view's node of a name, live over gone (and, of a name
/// listed twice, the later), as a map built from the gone and then the
/// live nodes would give it. Looked up for every node of every view, many
/// views a second: gossip lists each kind sorted by name, once each, so a
/// lookup is a binary search, most often a single comparison at the
/// node's place in the new view. Only a view listed otherwise (the silent
/// owners moved among the gone) has the map built.
enum ByName<'a> {
    Sorted {
        live: &'a [MemberInfo],
        gone: &'a [MemberInfo],
    },
    Map(BTreeMap<&'a str, (&'a MemberInfo, bool)>),
}

impl<'a> ByName<'a> {
    fn of(view: &'a MembershipView) -> ByName<'a> {
        let sorted = |nodes: &[MemberInfo]| nodes.windows(2).all(|w| w[0].node < w[1].node);
        if sorted(&view.nodes) && sorted(&view.gone) {
            return ByName::Sorted {
                live: &view.nodes,
                gone: &view.gone,
            };
        }
        ByName::Map(
            view.gone
                .iter()
                .map(|n| (n.node.as_str(), (n, false)))
                .chain(view.nodes.iter().map(|n| (n.node.as_str(), (n, true))))
                .collect(),
        )
    }

    /// `at`: where the node is likely listed among the live ones.
    fn get(&self, node: &str, at: usize) -> Option<(&'a MemberInfo, bool)> {
        let (live, gone) = match self {
            ByName::Map(map) => return map.get(node).copied(),
            ByName::Sorted { live, gone } => (*live, *gone),
        };
        if let Some(n) = live.get(at).filter(|n| n.node == node) {
            return Some((n, true));
        }
        let find = |nodes: &'a [MemberInfo]| {
            let i = nodes.binary_search_by(|n| n.node.as_str().cmp(node)).ok()?;
            Some(&nodes[i])
        };
        find(live)
            .map(|n| (n, true))
            .or_else(|| find(gone).map(|n| (n, false)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(node: &str, generation: u64) -> MemberInfo {
        let mut n = MembershipView::empty().local;
        n.node = node.into();
        n.generation = generation;
        n
    }

    /// What a map built from the gone and then the live nodes gives: the
    /// rule `ByName` keeps, sorted or not, at any hint.
    #[test]
    fn by_name_finds_what_a_map_of_the_view_would() {
        let views = [
            // As gossip lists them: each kind sorted, once each.
            (
                vec![info("a", 1), info("c", 1), info("d", 1)],
                vec![info("b", 1), info("e", 1)],
            ),
            // A name both live and gone, and names listed twice.
            (
                vec![info("c", 2), info("a", 1), info("c", 3)],
                vec![info("c", 1), info("b", 1), info("b", 2)],
            ),
            (Vec::new(), vec![info("b", 1)]),
        ];
        for (nodes, gone) in views {
            let view = MembershipView {
                nodes,
                gone,
                ..MembershipView::empty()
            };
            let map: BTreeMap<&str, (&MemberInfo, bool)> = view
                .gone
                .iter()
                .map(|n| (n.node.as_str(), (n, false)))
                .chain(view.nodes.iter().map(|n| (n.node.as_str(), (n, true))))
                .collect();
            let by_name = ByName::of(&view);
            for name in ["a", "b", "c", "d", "e", "f"] {
                let want = map.get(name).map(|(n, live)| (n.generation, *live));
                for at in [0, 1, 2, usize::MAX] {
                    let got = by_name.get(name, at).map(|(n, live)| (n.generation, live));
                    assert_eq!(got, want, "{name} at {at}");
                }
            }
        }
    }
}
