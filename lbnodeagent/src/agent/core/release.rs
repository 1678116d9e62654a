//! Letting a VIP go: make before break to a live winner, a contest of two
//! holders, a leave on SIGTERM, and addresses no node should hold any more
//! (orphans). Every rule here answers one question: may this node stop
//! answering now without leaving the VIP unanswered?

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::election::{Reason, order_key};
use crate::model::Status;

use super::links::{Mode, Want};
use super::reason::{LetGo, NotWon};
use super::slot::{Handover, Held, Slot};
use super::{Actions, Core, GOSSIP_ROUNDS_TO_SETTLE, HANDOVER_MAX, LEAVE_GRACE_ROUNDS, Phase};
use crate::election::NodeName;

/// What a leaving node with no winner to hand a VIP to may still hope for
/// (see [`Core::leaving_without_successor`]).
pub(super) enum Successor {
    /// A live peer holds it now: it goes.
    Holds(NodeName),
    /// A peer may come to win it (its view is newer, or the leave's grace
    /// is not over): kept meanwhile.
    MayCome,
    /// Nobody: it goes for the election's reason.
    None,
}

impl Core {
    /// Why a held VIP this node no longer wins may go now, or `None` while
    /// it must stay. A live winner that has not yet shown the VIP in its
    /// gossip state gets up to [`HANDOVER_MAX`]; meanwhile this node stops
    /// announcing but keeps answering, so no request goes unanswered.
    pub(super) fn may_release(&mut self, ip: IpAddr, held: &Want, now: Instant) -> Option<LetGo> {
        let adopted = self.vips.get(&ip).is_some_and(Slot::adopted);
        let link_up = self
            .links
            .by_index(held.vip.ifindex)
            .is_some_and(|l| l.carrier);
        if adopted && !link_up {
            return Some(LetGo::AdoptedNoCarrier);
        }
        if adopted && self.phase == Phase::Starting {
            // Not decided before the first reconcile, unless another node
            // has taken it over meanwhile.
            if self.a_member_holds(ip) {
                return Some(LetGo::AdoptedTakenOver);
            }
            let other = self.starting_holder_first(ip)?;
            self.settling.yielded(ip, held.clone());
            return Some(LetGo::StartingHolderFirst(other));
        }
        if held.mode == Mode::Virtual || self.phase == Phase::Finishing {
            return Some(LetGo::NotWon(self.release_reason(ip)));
        }
        if !link_up {
            return Some(LetGo::NoCarrier(held.vip.interface.clone()));
        }
        let Some(mut winner) = self
            .election
            .winner(ip)
            .filter(|w| *w != self.settings.node)
            .map(NodeName::from)
        else {
            if let Phase::Leaving { since } = self.phase {
                match self.leaving_without_successor(ip, since, now) {
                    Successor::Holds(peer) => return Some(LetGo::HeldBy(peer)),
                    Successor::MayCome => return None,
                    Successor::None => {}
                }
            }
            return Some(LetGo::NotWon(self.release_reason(ip)));
        };
        // A winner with an older view of the cluster may not know the VIP;
        // the nodes that do take it then (see `orphans`): the first of them
        // is who to hand it to. This node may be the first of those: the
        // winner then keeps answering only until a node with the newer view
        // holds it (see `acquire`), so letting go on its word or its answer
        // would have each let go to the other, and nobody would answer
        // (seed 10081302340 of the burst model). It is kept for the views
        // instead (below) until they agree.
        let mut first_that_knows = false;
        if self
            .membership
            .view()
            .node(&winner)
            .is_some_and(|n| self.revision_of(n) < self.dating.revision())
        {
            let older = self.older_peers();
            match self.election.winner_without(ip, |n| older.contains(n)) {
                Some(w) if w == self.settings.node => first_that_knows = true,
                Some(w) => winner = w.into(),
                None => {}
            }
        }
        if !first_that_knows {
            if self.may_leave_it_to(&winner, ip) {
                return Some(LetGo::HeldBy(winner));
            }
            if self.vips.get(&ip).is_some_and(|s| {
                s.handover()
                    .is_some_and(|h| h.answered_by.as_deref() == Some(winner.as_str()))
            }) && self.answer_counts(&winner, ip)
            {
                return Some(LetGo::AnsweredBy(winner));
            }
        }
        // A live peer whose view of the cluster is newer than ours holds it:
        // by the newer view, that is where it belongs. (Not any peer: one
        // with the same view that shows it may be letting it go right now.)
        if let Some(p) = self
            .alive_peers()
            .filter(|n| self.revision_of(n) > self.dating.revision())
            .map(|n| n.node.clone())
            .find(|n| self.holds(n, ip))
        {
            return Some(LetGo::NewerHolder(p));
        }
        let winner_revision = self
            .membership
            .view()
            .node(&winner)
            .map_or(0, |n| self.revision_of(n));
        // Kept for differing views (below), or about to be for a winner
        // whose view is older, and a peer with the same view shows it held:
        // the one the election ranks first keeps it. Both wait on a winner
        // that cannot know the VIP until it catches up, so neither waits
        // for its own hand-over time first: the pair settles as soon as
        // either one shows it kept. (A winner with a newer view may take
        // it any moment: that hand-over has its time.)
        let views_differ = winner_revision != self.dating.revision();
        let winner_behind = winner_revision < self.dating.revision();
        let kept = self
            .vips
            .get(&ip)
            .is_some_and(|s| s.handover().is_some_and(|h| h.kept_for_views));
        let mut same_view_holder_below = false;
        if kept || winner_behind {
            let me = self.settings.node.as_str();
            for p in self.alive_peers().filter(|n| {
                self.revision_of(n) == self.dating.revision() && self.holds(&n.node, ip)
            }) {
                match self.election.outranks(ip, &p.node, me, true) {
                    Some(true) => return Some(LetGo::KeptByFirst(p.node.clone())),
                    Some(false) => same_view_holder_below = true,
                    None => {}
                }
            }
        }
        // The first node that knows a change, handing over to a winner
        // whose view is older, while a peer of an older view holds the VIP
        // too: that peer lets go only of a VIP a newer view shows held (see
        // `contest`), and this node does not let go to it, so until this
        // node shows the VIP kept, both answer for a whole hand-over's time.
        let older_holder = first_that_knows
            && self
                .alive_peers()
                .any(|n| self.revision_of(n) < self.dating.revision() && self.holds(&n.node, ip));
        let settle = self.settle_time();
        // Only a VIP held here is released or contested.
        let held = self.vips.get_mut(&ip).and_then(Slot::held_mut)?;
        held.garp = None;
        held.contested = None;
        let handover = held.handover.get_or_insert_with(|| {
            debug!(%ip, %winner, "handing over: waiting for the winner to hold it");
            self.sent.touch_publish();
            // Taken back as a new view reached this node first, and given
            // again to the same winner as it reached the others: one hand-
            // over, not two. Restarting it would let two holders answer
            // for up to twice a hand-over's time. Only its start carries
            // over: what the winner showed before may be stale now.
            let since = match held.taken_back.take().map(|b| *b) {
                Some((given, at))
                    if given.to == winner && now.saturating_duration_since(at) < settle =>
                {
                    given.since
                }
                _ => now,
            };
            Box::new(Handover::new(since, winner.clone()))
        });
        let since = handover.since;
        // A peer this node outranks keeps it for the same reason, or one
        // with an older view holds it: show it kept now, so that one lets
        // go rather than both answering on.
        let keep_now =
            winner_behind && (same_view_holder_below || older_holder) && !handover.kept_for_views;
        if keep_now || now.saturating_duration_since(since) >= HANDOVER_MAX {
            if views_differ {
                // The two views of the cluster differ (watches lag, or the
                // API server went away before both heard of a change). An
                // older winner may not know this address yet; a newer one
                // evidently does not think it wins. Either way, letting go
                // would leave nobody answering: keep answering until the
                // views agree or someone with the newer view holds it.
                debug!(%ip, %winner, winner_revision, revision = self.dating.revision(),
                    "the winner's view of the cluster differs; still answering");
                handover.since = now;
                // Shown as held again: this node answers for it until the
                // views agree, and another that keeps it too must see so.
                if !std::mem::replace(&mut handover.kept_for_views, true) {
                    self.sent.touch_publish();
                }
                return None;
            }
            warn!(%ip, %winner, "the winner did not show the address in time; releasing anyway");
            return Some(LetGo::HandoverTimedOut(winner));
        }
        None
    }

    /// A VIP this node holds and wins, which a live peer shows held too
    /// for [`HANDOVER_MAX`]: no planned move takes that long (the old
    /// owner stops showing a VIP it hands over), so the two nodes'
    /// views of the cluster differ: one's watches lag, or the API server
    /// went away while a change was on its way. The node with the older
    /// view lets go; with equal views (the memberships differ), the one the
    /// election ranks lower, liveness aside. Both sides compute the same.
    pub(super) fn contest(&mut self, ip: IpAddr, now: Instant) -> Option<(NodeName, LetGo)> {
        let me = self.settings.node.as_str();
        let peers: Vec<(NodeName, u64)> = self
            .alive_peers()
            .filter(|n| n.vips.contains(&ip))
            .map(|n| (n.node.clone(), self.revision_of(n)))
            .collect();
        // Only a VIP held here is released or contested.
        let held = self.vips.get_mut(&ip).and_then(Slot::held_mut)?;
        if peers.is_empty() {
            held.contested = None;
            return None;
        }
        let since = *held.contested.get_or_insert(now);
        // A newer view settles it at once (once its word is fresh enough
        // to trust); equal views only after a planned move had its time.
        if let Some(peer) = peers
            .iter()
            .find(|(peer, revision)| *revision > self.dating.revision() && self.holds(peer, ip))
        {
            return Some((peer.0.clone(), LetGo::ContestNewer(peer.0.clone())));
        }
        if now.saturating_duration_since(since) < HANDOVER_MAX {
            return None;
        }
        peers.into_iter().find_map(|(peer, revision)| {
            if revision > self.dating.revision() {
                let why = LetGo::ContestNewer(peer.clone());
                Some((peer, why))
            } else if revision == self.dating.revision()
                && self.election.outranks(ip, &peer, me, true) == Some(true)
            {
                let why = LetGo::ContestOutranked(peer.clone());
                Some((peer, why))
            } else {
                None
            }
        })
    }

    /// Whether another live member (an elected candidate, not a starting
    /// node) shows `ip` held.
    fn a_member_holds(&self, ip: IpAddr) -> bool {
        self.membership
            .view()
            .members
            .iter()
            .any(|m| m.node != self.settings.node && self.holds(&m.node, ip))
    }

    /// Another starting node that shows `ip` kept from its previous run and
    /// comes before this one in the election's tie-break order. Two agents
    /// restarted while the API server is away both find the address in
    /// their kernels and neither has a view of the cluster to rank them by
    /// score; the hash order needs none and both read it alike, so of two
    /// that see each other exactly one keeps answering until the view
    /// returns and the election moves the VIP make before break. The one
    /// that let go puts the address back should the other stop showing it
    /// meanwhile ([`Core::starting_comebacks`]).
    fn starting_holder_first(&self, ip: IpAddr) -> Option<NodeName> {
        let me = &self.settings.node;
        let text = ip.to_string();
        let mine = order_key(me, &text);
        self.membership
            .view()
            .nodes
            .iter()
            .filter(|n| n.node != *me && n.status == Status::Starting && n.vips.contains(&ip))
            .map(|n| order_key(&n.node, &text))
            .filter(|key| *key < mine)
            .min()
            .map(|(_, node)| node.into())
    }

    /// Puts back an address let go to a starting node first in the hash
    /// order (see [`Core::starting_holder_first`]) once no node shows it
    /// any more while this one is still starting: the word that node held
    /// it may have been stale (it had just let go itself), or its host
    /// failed since. Without this, the VIP would be dark until this node
    /// knows the cluster again, which during an API outage is its whole
    /// length. Once running, the election decides and these are dropped.
    pub(super) fn starting_comebacks(&mut self, now: Instant, out: &mut Actions) {
        if self.phase != Phase::Starting {
            self.settling.forget_yields();
            return;
        }
        let ips = self.settling.yields();
        for ip in ips {
            if self
                .vips
                .get(&ip)
                .is_some_and(|s| s.held().is_some() || s.busy())
            {
                continue;
            }
            if self.a_member_holds(ip) {
                self.settling.drop_yield(ip);
                continue;
            }
            if self.starting_holder_first(ip).is_some() {
                continue;
            }
            let want = self.settling.drop_yield(ip).expect("listed");
            if !self
                .links
                .by_index(want.vip.ifindex)
                .is_some_and(|l| l.carrier)
            {
                continue;
            }
            info!(%ip, interface = %want.vip.interface,
                "the starting node this one let the address go to no longer shows it; putting it back");
            self.vips
                .found_held(ip, Held::adopted(want.clone(), now))
                .add(want.clone());
            out.add.push(want.vip);
            self.sent.touch_publish();
        }
    }

    /// Whether `node`'s gossip shows it holding `ip`. Right after this node
    /// came to hold `ip`, only if `node`'s state came to show `ip` since: an
    /// older word may be that of the node that just handed the VIP to this
    /// one, whose word that it let go has not arrived yet, and a state of
    /// that node about another VIP, published before and arriving late,
    /// still carries it. After a few gossip rounds that word would have
    /// come, and the state stands.
    pub(super) fn holds(&self, node: &str, ip: IpAddr) -> bool {
        self.membership
            .view()
            .node(node)
            .is_some_and(|n| n.vips.contains(&ip))
            && self
                .fresh_take(ip)
                .is_none_or(|since| self.shown_after(node, ip, since))
    }

    /// Whether `node`'s state, by our views, came to show `ip` after `t`.
    fn shown_after(&self, node: &str, ip: IpAddr, t: Instant) -> bool {
        self.membership.shown_after(node, ip, t)
    }

    /// Whether this node may let `ip` go on `node`'s gossip that it holds
    /// it. While leaving, only a word from after the leave began counts:
    /// its successor takes it on hearing of the leave, and any earlier word
    /// may be stale however long ago this node took the VIP (the peer let
    /// it go a moment before, or came back into the view with its old
    /// state), so letting go on it could leave the VIP unanswered. A peer
    /// that really held it all along keeps answering beside this node until
    /// the leave's wait ends.
    ///
    /// Nor, right after this node took `ip`, is any peer's word. A peer
    /// with an older view of the cluster lets go of a VIP a node with a
    /// newer view shows held (see [`Core::contest`]); one with the same view
    /// lets go of a VIP this node won; either way, the word it published
    /// before the take may reach this node after it, and if this node let
    /// go on it (its view changed meanwhile: a drain), each would have let
    /// go to the other and nobody would answer. Nor does the winner's
    /// answer on the wire (see [`Core::on_claim`]). Once a few gossip
    /// rounds passed, its word stands.
    ///
    /// Nor, while leaving, is the word of the node this one took the VIP
    /// from less than a hand-over's time ago: that node answered until it
    /// heard this one hold it, or again while their views differed, and a
    /// state of it from then, still showing the VIP, may arrive after the
    /// leave began, when it has let go already (seed 5000867531: a VIP
    /// taken back as a gateway answered again, a SIGTERM 150 ms later; the
    /// leaving node let go on such a state 8 ms into its leave, and nobody
    /// answered). Its answer on the wire counts once its state shows the
    /// VIP again since the leave began (see `answer_counts`); failing
    /// that, this node answers beside it until the leave's wait ends.
    ///
    /// Nor, while this node is drained and took the VIP less than a
    /// hand-over's time ago, is a word from before its hand-over began: the
    /// peer may be handing the VIP to this node right then (it took it a
    /// moment before this node, and gives it on as its view catches up),
    /// and ends that on hearing this node answer. Given back on that word,
    /// each would let go to the other and nobody would answer (seed 11956:
    /// a router back, a VIP on two nodes a moment, then a drain). The
    /// peer's answer on the wire still counts, and so does its word once it
    /// takes the VIP again, as a leaving node's does. A VIP held longer
    /// than that has no such hand-over behind it.
    fn may_leave_it_to(&self, node: &str, ip: IpAddr) -> bool {
        let slot = self.vips.get(&ip);
        let lately_taken = self.lately_taken(ip);
        let stale_for_drain = self.own.drain() && lately_taken && {
            let since = slot
                .and_then(|s| s.handover())
                .map_or(self.now, |h| h.since);
            !self.shown_after(node, ip, since)
        };
        let from_its_giver = self.lately_given_by(ip) == Some(node);
        self.holds(node, ip)
            && !stale_for_drain
            && match self.phase {
                Phase::Leaving { since } => !from_its_giver && self.shown_after(node, ip, since),
                _ => self.fresh_take(ip).is_none(),
            }
    }

    /// Whether `node`'s answer on the wire for `ip`, heard while handing it
    /// over, says it holds the VIP. A leaving node's winner takes the VIP
    /// from a leaving node rather than letting go to it once it has heard
    /// the leave, so its answer counts, unless it is the node this one
    /// lately took the VIP from: that node may not have heard the leave yet
    /// and answers as the tail of its own hand-over, which it completes on
    /// this node's word from before the leave, and each would let go to the
    /// other (seed 8400596645: taken by preference, SIGTERM 26 ms later,
    /// both let go within 3 ms). Its answer counts once its state shows the
    /// VIP again since the leave began, as it does when, having heard the
    /// leave, it keeps the VIP or takes it back.
    fn answer_counts(&self, node: &str, ip: IpAddr) -> bool {
        match self.phase {
            Phase::Leaving { since } => {
                self.lately_given_by(ip) != Some(node) || self.shown_after(node, ip, since)
            }
            _ => true,
        }
    }

    /// Whether this node took `ip` less than a hand-over's time ago.
    fn lately_taken(&self, ip: IpAddr) -> bool {
        self.vips
            .get(&ip)
            .and_then(|s| s.held()?.since)
            .is_some_and(|since| self.now.saturating_duration_since(since) < HANDOVER_MAX)
    }

    /// The node this one took `ip` from, if less than a hand-over's time
    /// ago: that node answers for it until it hears this one hold it, so
    /// its answers and its word then are the tail of its own hand-over.
    fn lately_given_by(&self, ip: IpAddr) -> Option<&str> {
        if !self.lately_taken(ip) {
            return None;
        }
        self.vips.get(&ip)?.held()?.taken_from.as_deref()
    }

    /// When this node took `ip`, if less than a few gossip rounds ago: its
    /// peers may not have heard of it yet.
    pub(super) fn fresh_take(&self, ip: IpAddr) -> Option<Instant> {
        let settle = self.settle_time();
        self.vips
            .get(&ip)
            .and_then(|s| s.held()?.since)
            .filter(|since| self.now.saturating_duration_since(*since) < settle)
    }

    /// The gossip rounds within which a change a peer published has
    /// reached this node, as time.
    fn settle_time(&self) -> Duration {
        self.settings.gossip_interval * GOSSIP_ROUNDS_TO_SETTLE
    }

    /// Leaving, and by this node's view nobody else may hold `ip`. A live
    /// peer may know better: a change that makes it eligible (an
    /// advertisement widened a moment ago) can be on its way here. So the
    /// VIP is kept while a live peer has a newer view, or for
    /// [`LEAVE_GRACE_ROUNDS`] gossip rounds after the leave began, unless a
    /// live peer already holds it.
    pub(super) fn leaving_without_successor(
        &self,
        ip: IpAddr,
        since: Instant,
        now: Instant,
    ) -> Successor {
        let peers: Vec<&crate::model::MemberInfo> = self.alive_peers().collect();
        if peers.is_empty() {
            return Successor::None;
        }
        if let Some(p) = peers.iter().find(|n| self.may_leave_it_to(&n.node, ip)) {
            return Successor::Holds(p.node.clone());
        }
        let newer = peers
            .iter()
            .any(|n| self.revision_of(n) > self.dating.revision());
        let grace = self.settings.gossip_interval * LEAVE_GRACE_ROUNDS;
        if newer || now.saturating_duration_since(since) < grace {
            Successor::MayCome
        } else {
            Successor::None
        }
    }

    /// Why this node no longer holds `ip`: the first rule it fails, or who
    /// wins.
    pub(super) fn release_reason(&self, ip: IpAddr) -> NotWon {
        if self.is_leaving() {
            return NotWon::ShuttingDown;
        }
        let Some(report) = self.election.explain(ip) else {
            return NotWon::Unknown;
        };
        if let Some(x) = report
            .excluded
            .iter()
            .find(|x| x.node == self.settings.node)
        {
            return match x.reason {
                Reason::NoReadyEndpoint => match report.note {
                    Some(n) => NotWon::Noted(n),
                    None => NotWon::Excluded(x.reason),
                },
                r => NotWon::Excluded(r),
            };
        }
        match (report.winner, report.note) {
            (Some(w), _) => NotWon::Winner(w),
            (None, Some(n)) => NotWon::Noted(n),
            (None, None) => NotWon::Nobody,
        }
    }

    pub(super) fn begin_leave(&mut self, now: Instant, out: &mut Actions) {
        if self.is_leaving() {
            return;
        }
        info!(
            held = self.held_count(),
            "leaving: handing VIPs over before exit"
        );
        out.leave = true;
        self.phase = Phase::Leaving { since: now };
        self.sent.touch_publish();
        self.elect_members();
        self.vips.refresh_all();
    }

    /// VIPs nobody may serve because their winner does not know them: its
    /// view of the cluster is older than this node's (its watches lag, or
    /// the API server went away before it heard of the Service), and it
    /// does not show them held. After [`HANDOVER_MAX`] the nodes that do
    /// know take them: the first of them in the election's order (each
    /// computes the same), until the views agree again and the winner
    /// takes over, make before break.
    ///
    /// While nobody answers for the VIP (its owner died, or let it go to
    /// the winner that then fell behind), the wait is [`VIEW_SPREAD`](super::VIEW_SPREAD): a
    /// winner that is behind longer than a change takes to spread is stuck
    /// (the API server went away before it heard the change), and every
    /// moment more is a client's outage. Should it catch up, it takes the
    /// VIP back, make before break.
    ///
    /// The wait is for the winner to catch up, so it counts from when this
    /// node came to have its view, not from when it found the orphan: one
    /// found late (gossip just came back, or the winner only now became the
    /// winner) whose winner has been behind for a hand-over's time already
    /// is stuck, for as long as the API server is away from it, and
    /// waiting again would leave the VIP unanswered for nothing. A node
    /// that came to its view late (it restarted, and may be the first of
    /// the fallbacks once ready) cannot tell from its own clock how long
    /// the winner has been behind; the peers that waited say so in gossip
    /// (`behind`), and their word counts when their view is no newer than
    /// this node's and still newer than the winner's.
    pub(super) fn orphans(&mut self, now: Instant) {
        // Orphans are looked for only while running.
        let older = if self.phase == Phase::Running {
            self.older_peers()
        } else {
            BTreeSet::new()
        };
        let mut found = BTreeMap::new();
        if !older.is_empty() {
            let said_behind = self.said_behind(&older);
            let waited = now.checked_sub(HANDOVER_MAX);
            for (ip, winner) in self.election.winners() {
                let Some(w) = winner.filter(|w| older.contains(*w)) else {
                    continue;
                };
                // Whoever else holds it meanwhile (an earlier fallback) does
                // not make it the winner's: the fallback's order decides.
                // Nor does the winner showing it held, once this node has
                // taken it as the fallback: an older winner answers for it
                // only until a node with the newer view holds it (see
                // `may_release`), so if this node let go to it in turn,
                // each would let go to the other and nobody would answer.
                let taken_here = self
                    .orphans
                    .since(ip)
                    .is_some_and(|since| self.orphan_due(ip, since, now))
                    && self
                        .vips
                        .get(&ip)
                        .is_some_and(|s| s.held().is_some_and(|h| h.handover.is_none()));
                if taken_here
                    || !self
                        .membership
                        .view()
                        .node(w)
                        .is_some_and(|n| n.vips.contains(&ip))
                {
                    let mut since = self.orphans.since(ip).unwrap_or(self.dating.since());
                    if said_behind.contains(w)
                        && let Some(waited) = waited
                    {
                        since = since.min(waited);
                    }
                    found.insert(ip, since);
                }
            }
        }
        // Who comes first moves without the winner moving: a peer catching
        // up, or one not behind coming back or going. Each orphan whose
        // first node moved has its duty read again, or a node that took one
        // while the others were behind or away would keep it as theirs
        // came back (seed 2603 of the simulation: the contest then made it
        // let go, and the stale duty take it again, every hand-over's
        // time).
        // Views come many times a second and mostly find no orphan.
        let passed_over = if found.is_empty() {
            BTreeSet::new()
        } else {
            self.passed_over_among(older)
        };
        let fallback: BTreeMap<IpAddr, Option<NodeName>> = found
            .keys()
            .map(|ip| {
                let first = self
                    .election
                    .winner_without(*ip, |n| passed_over.contains(n));
                (*ip, first.map(NodeName::from))
            })
            .collect();
        let count = found.len();
        let rescanned = self.orphans.replace(found, fallback);
        if rescanned.changed {
            debug!(
                orphans = count,
                "VIPs whose winner has an older view of the cluster"
            );
        }
        self.mark(rescanned.moved);
    }

    /// Older peers that a peer whose view is newer than theirs, and no
    /// newer than this node's, has found behind for a hand-over's time.
    pub(super) fn said_behind(&self, older: &BTreeSet<NodeName>) -> BTreeSet<NodeName> {
        let node_revision = |node: &str| {
            self.membership
                .view()
                .node(node)
                .map(|n| self.revision_of(n))
        };
        self.alive_peers()
            .filter(|p| self.revision_of(p) <= self.dating.revision() && !p.behind.is_empty())
            .flat_map(|p| {
                let said = self.revision_of(p);
                p.behind.iter().filter(move |w| {
                    older.contains(*w) && node_revision(w).is_some_and(|r| r < said)
                })
            })
            .cloned()
            .collect()
    }

    /// Publishes the winners of the orphans this node has waited a
    /// hand-over's time for (see [`Core::orphans`]).
    pub(super) fn publish_behind(&mut self, now: Instant) {
        let behind: BTreeSet<NodeName> = self
            .orphans
            .overdue(now)
            .filter_map(|ip| self.election.winner(ip))
            .map(NodeName::from)
            .collect();
        if self.orphans.set_behind(behind) {
            self.sent.touch_publish();
        }
    }

    /// The duty for an orphaned VIP whose grace has passed.
    /// An orphan is this node's once its winner had a hand-over's time to
    /// catch up with the cluster (or the view's spread, while nobody
    /// answers for it: [`Core::orphans_unanswered`]), or at once while its
    /// holder is a silent owner whose addresses this node knows will lapse:
    /// the yield to it keeps this node off until they do, and waiting
    /// longer would only leave the VIP unanswered after the lapse.
    pub(super) fn orphan_due(&self, ip: IpAddr, since: Instant, now: Instant) -> bool {
        self.orphans.waited(ip, since, now) || self.awaits_lapse(ip)
    }

    /// This node holds off `ip` for a silent owner whose addresses it knows
    /// will lapse: it was the VIP's successor when the owner went silent.
    pub(super) fn awaits_lapse(&self, ip: IpAddr) -> bool {
        self.conflicts
            .yielded_to(ip)
            .is_some_and(|owner| self.lapsing_silent_owner(owner))
    }

    /// `node` is out of the view this node acts on (its beats stopped) and
    /// its addresses will lapse when this node knows: a yield to it ends
    /// then, and its answers meanwhile are its kernel's, not news.
    pub(super) fn lapsing_silent_owner(&self, node: &str) -> bool {
        self.membership.view().node(node).is_none() && self.sessions.lapse(node).is_some()
    }

    /// Makes due the orphans nobody has answered for since the view had
    /// [`VIEW_SPREAD`](super::VIEW_SPREAD) to reach their winners. They stay due once this node
    /// takes one (it answers for it then), until the orphan is gone, or
    /// until the pre-check hears a hostlb node answer after all: its word
    /// in gossip had not come yet (a stalled agent's kernel still
    /// answers), and the orphan waits the hand-over's time after all
    /// ([`Core::orphan_answered`]).
    pub(super) fn orphans_unanswered(&mut self, now: Instant) {
        let stuck: Vec<IpAddr> = self
            .orphans
            .spread_candidates(now)
            .into_iter()
            .filter(|ip| self.unanswered(*ip))
            .collect();
        self.orphans.spread(stuck);
    }

    /// An orphan due early because nobody seemed to answer for it is
    /// answered on the wire by another hostlb node: it waits the whole
    /// hand-over's time, as one somebody answers for.
    pub(super) fn orphan_answered(&mut self, ip: IpAddr) -> bool {
        self.orphans.answered(ip)
    }

    /// Whether nobody answers for `ip` that this node knows of: it does
    /// not hold it, has not yielded it to an owner, no live peer shows it
    /// held, and no hostlb node answered this node's questions about it.
    /// (A dead owner's kernel that still answers is found by the pre-check
    /// before the address is taken.)
    pub(super) fn unanswered(&self, ip: IpAddr) -> bool {
        !self.orphans.heard(ip)
            && self.vips.get(&ip).is_none_or(|s| s.held().is_none())
            && self.conflicts.yielded_to(ip).is_none()
            && !self.alive_peers().any(|p| self.holds(&p.node, ip))
    }

    pub(super) fn orphan_duty(&self, ip: IpAddr) -> Option<crate::election::Duty> {
        let since = self.orphans.since(ip)?;
        if !self.orphan_due(ip, since, self.now) {
            return None;
        }
        // A successor waiting out a dead owner's lapse passes over every
        // older peer at once, as a holder does in keeping it: a view that
        // comes during the wait and names a peer still behind must not
        // turn the wait into the view's spread, with nobody answering once
        // the address lapsed (simulation seed 3000618605).
        let passed_over = if self.awaits_lapse(ip) {
            self.older_peers()
        } else {
            self.passed_over()
        };
        self.election
            .duty_without(&self.settings.node, ip, |n| passed_over.contains(n))
    }
}
