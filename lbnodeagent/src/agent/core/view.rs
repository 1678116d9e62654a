//! The cluster as gossip shows it, as the core acts on it: owners
//! watched, the start's settling, the election's members, and isolation.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Instant;

use tracing::{info, warn};

use crate::election::Member;
use crate::model::{PROTOCOL_DRAIN, Status};

use super::sessions::{self};
use super::upstream;
use super::{Actions, ConflictSeen, Core, Metric, Phase};
use crate::election::NodeName;

impl Core {
    /// Acts on membership: the view [`super::membership::Membership`] makes from gossip's and
    /// the sessions' word, learnt by the conflict rule and the election.
    pub(super) fn apply_view(&mut self, now: Instant, out: &mut Actions) {
        let drain_was_in_force = self.drain_in_force();
        let change = self
            .membership
            .apply(&self.sessions, &self.settings.node, now);
        let view = self.membership.view();
        // The live last, so that who holds a VIP now wins over a gone
        // node's last word.
        self.conflicts.learn(
            change
                .gone_news
                .iter()
                .map(|&i| &*view.gone[i])
                .chain(change.live_news.iter().map(|&i| &*view.nodes[i])),
            &self.settings.node,
        );
        let members_changed = change.members_changed;
        self.orphans.rescan();
        // A view that only brings a peer's new state changes nothing the
        // annotations show (see `elect_members`), and views come many
        // times a second.
        if members_changed || drain_was_in_force != self.drain_in_force() {
            self.elect_members();
        } else {
            // A peer's held VIPs moved: sticky ones stay with their
            // holders.
            let moved = self.set_holders();
            self.mark(moved);
        }
        out.metrics.push(Metric::Elected);
        // Adopted addresses another node now holds, VIPs handed
        // over, and VIPs a peer holds too may be decided now.
        let mut waiting: BTreeSet<IpAddr> = self
            .vips
            .iter()
            .filter(|(_, s)| {
                s.held()
                    .is_some_and(|h| h.handover.is_some() || h.adopted || h.contested.is_some())
            })
            .map(|(ip, _)| *ip)
            .collect();
        for n in self.alive_peers() {
            waiting.extend(
                n.vips
                    .iter()
                    .filter(|ip| self.vips.get(ip).is_some_and(|s| s.held().is_some())),
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
        let gossip = self.membership.gossip();
        self.sessions.watch(owners, |n| gossip.node(n).is_some());
    }

    /// Whether a starting agent may elect: the cluster is known, and gossip
    /// has had time to show the other members. A node that elected before
    /// hearing from its peers would win every VIP alone and put them on the
    /// wire beside their real owners. Settled once a peer was seen, a few
    /// rounds passed (so its state, held VIPs included, arrived) and the
    /// failure detector has confirmed every node gossip reports (in a large
    /// cluster that takes a few seconds), or after [`STARTUP_GRACE`](super::STARTUP_GRACE) with
    /// nobody to hear from (the first node of a cluster). Nodes the
    /// detector cannot reach hold it back for at most [`UNCONFIRMED_GRACE`](super::UNCONFIRMED_GRACE),
    /// counted from the first peer or the first view of the cluster,
    /// whichever came later (see [`settling::Settling::membership_settled`](super::settling::Settling::membership_settled)).
    ///
    /// Peers that are still starting are no candidates, so two nodes that
    /// settle at the same moment would each elect as if the other were
    /// absent, and both add the VIPs the other wins. So a node that
    /// settles publishes `alive` at once but takes nothing for three more
    /// gossip rounds ([`settling::Settling::running`](super::settling::Settling::running)), by when it sees every peer that
    /// settled with it; one that settles later takes over from it make
    /// before break, as any returning node does.
    pub(super) fn settle(&mut self, now: Instant) -> bool {
        let view = self.membership.view();
        let unconfirmed = view.unconfirmed;
        let peers = unconfirmed > 0 || view.nodes.iter().any(|n| n.node != self.settings.node);
        let settled = self.settling.membership_settled(
            peers,
            unconfirmed,
            self.dating.known(),
            self.settings.gossip_interval,
            now,
        );
        // Said once, as it elects: until the cluster is known this runs
        // at every step.
        if peers && settled && self.dating.known() && unconfirmed > 0 {
            warn!(
                unconfirmed,
                "electing although the failure detector has not reached every node gossip reports alive"
            );
        }
        settled && self.dating.known()
    }

    /// This node as the election should see it: from its own links and
    /// phase, not from the echo of its gossip state, which lags.
    pub(super) fn own_member(&self) -> Option<Member> {
        self.own.member(
            &self.settings.node,
            self.phase == Phase::Running,
            self.drain_in_force(),
            self.links.virtual_link.is_some(),
        )
    }

    /// How long a change of anyone's lost gateways waits to count (see
    /// `upstream`).
    pub(super) fn upstream_settle(&self) -> std::time::Duration {
        self.settings.gossip_interval * upstream::SETTLE_ROUNDS
    }

    /// Hands the membership (with this node as it is now) to the election
    /// and marks what it says moved.
    pub(super) fn elect_members(&mut self) {
        // The annotations follow the election, the first member (who
        // clears what nobody announces) and this node's own VIPs.
        self.sent.touch_report();
        let own = self.own_member();
        let me = self.settings.node.as_str();
        let members: Vec<&Member> = self
            .membership
            .view()
            .members
            .iter()
            .filter(|m| m.node != me)
            .chain(own.as_ref())
            .collect();
        // Lost gateways count once every agent can have heard of them.
        let held = self
            .upstream
            .count(self.now, self.upstream_settle(), &members);
        let members = match &held {
            Some(held) => held.iter().collect(),
            None => members,
        };
        let moved =
            if self.drain_in_force() || !self.membership.view().members.iter().any(|m| m.drained) {
                self.election.set_members(members)
            } else {
                // An agent of an older protocol elects drained nodes like any
                // other: so does this one until every member knows drains.
                let undrained: Vec<Member> = members
                    .into_iter()
                    .map(|m| Member {
                        drained: false,
                        ..m.clone()
                    })
                    .collect();
                self.election.set_members(undrained.iter())
            };
        let own = match held {
            Some(held) => held.into_iter().find(|m| m.node == me),
            None => own,
        };
        let mut moved = moved;
        moved.extend(self.set_holders());
        if self.own.elected(own) {
            // Its interfaces or its candidacy changed: any duty may have.
            self.vips.refresh_all();
        } else {
            self.mark(moved);
        }
    }

    /// Hands the election who holds which address, as gossip shows it
    /// (this node too, as its peers see it), for the VIPs placed sticky.
    /// The addresses whose winner moved.
    pub(super) fn set_holders(&mut self) -> Vec<IpAddr> {
        if !self.election.any_sticky() {
            return Vec::new();
        }
        // An address of this agent's previous run is no claim until this
        // run decides to keep it: as a second holder it could outrank the
        // node that took the VIP over meanwhile, and take it back. (Peers
        // never count it: it is published only while this node starts,
        // and no starting node is a candidate.)
        let me = self.settings.node.as_str();
        let vips = &self.vips;
        let nodes = &self.membership.view().nodes;
        self.election.set_holders(nodes.iter().flat_map(|n| {
            n.vips
                .iter()
                .filter(move |ip| n.node != me || !vips.get(ip).is_some_and(|s| s.adopted()))
                .map(move |ip| (*ip, n.node.as_str()))
        }))
    }

    /// A drain counts in the election only once every node gossip shows
    /// speaks [`PROTOCOL_DRAIN`]: until then all elect as the oldest does.
    pub fn drain_in_force(&self) -> bool {
        self.membership
            .view()
            .nodes
            .iter()
            .all(|n| n.protocol >= PROTOCOL_DRAIN)
    }

    /// Its operator drained this node, in force or not.
    pub fn drain_requested(&self) -> bool {
        self.own.drain()
    }

    /// This node is drained and the drain is in force.
    pub fn drained(&self) -> bool {
        self.own.drain() && self.drain_in_force()
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
        self.services
            .iter()
            .map(|(ip, _)| ip)
            .filter(|ip| {
                self.election.winner(**ip).is_none() && self.election.virtual_nodes(**ip).is_empty()
            })
            .count()
    }

    pub fn last_conflict(&self) -> Option<&ConflictSeen> {
        self.conflicts.last_seen()
    }

    /// Gossip shows no live peer.
    pub fn gossip_alone(&self) -> bool {
        let me = &self.settings.node;
        !self
            .membership
            .gossip()
            .members
            .iter()
            .any(|m| m.node != *me)
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
        self.membership
            .view()
            .nodes
            .iter()
            .map(|n| &**n)
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

    /// The live peers whose view is older than this node's
    /// ([`Core::view_behind`]).
    fn older(&self) -> impl Iterator<Item = &crate::model::MemberInfo> {
        self.membership
            .view()
            .nodes
            .iter()
            .map(|n| &**n)
            .filter(|n| self.view_behind(n))
    }

    /// Whether some live peer's view is older than this node's, without
    /// listing them.
    pub(super) fn any_older_peer(&self) -> bool {
        self.older().next().is_some()
    }

    /// The names of the live peers whose view is older than this node's.
    pub(super) fn older_peers(&self) -> BTreeSet<NodeName> {
        self.older().map(|n| n.node.clone()).collect()
    }

    /// The older peers an orphan falls back past when this node asks
    /// whether to take it (its winner's view is older than this node's):
    /// every one of them once this node has had its view for
    /// [`VIEW_SPREAD`](super::VIEW_SPREAD), and before that only those a
    /// peer has found stuck behind (`behind` in gossip). A peer older for
    /// a moment is catching up with the same change: passed over at once,
    /// it would have the first node to hear a change take the VIP from the
    /// fallback that holds it, and give it back as the others caught up,
    /// at every change (seed 3000070901 of the simulation: three holders
    /// on and off for 5 s while labels moved). A holder deciding whether
    /// to keep a VIP passes over every older peer at once (`may_release`):
    /// keeping is never the move that leaves a VIP unanswered.
    pub(super) fn passed_over(&self) -> BTreeSet<NodeName> {
        self.passed_over_among(self.older_peers())
    }

    /// [`Core::passed_over`], given the older peers.
    pub(super) fn passed_over_among(&self, older: BTreeSet<NodeName>) -> BTreeSet<NodeName> {
        if self.dating.spread(self.now) {
            older
        } else {
            self.said_behind(&older)
        }
    }
}
