//! The LAN: claims heard on the wire and what they mean, the probes that
//! ask who answers for a held VIP, and renewal of held addresses before
//! they lapse.

use std::net::IpAddr;
use std::time::Instant;

use tracing::{debug, info, warn};

use crate::election::NodeName;
use crate::model::Claim;
use crate::model::{Lifetime, Status};

use super::cadence::YieldProbe;
use super::conflict::{OWNER_PROBE, OWNER_PROBE_AT_REST, Verdict, lapsing};
use super::links::{Mode, Want};
use super::reason::LetGo;
use super::slot::{Garp, HeldOp, Slot};
use super::{
    Actions, ConflictKind, ConflictOutcome, ConflictSeen, Core, HANDOVER_MAX, Metric, Move,
    MoveCause, Phase, TAKEOVER_WINDOW,
};

impl Core {
    /// The lifetime of an address taken now: so that it lapses with the
    /// ones renewed at the last renewal (to the second, the kernel's unit),
    /// and a follower learns one moment when all of them lapse.
    pub(super) fn aligned_lifetime(&self, now: Instant) -> Lifetime {
        // A renewal due now renews the others in this very step, to the
        // whole lifetime; it skips this address (its add is in flight), so
        // the address must outlast the renewal after that one too.
        match (
            self.settings.lifetime.renew_every(),
            self.cadence.renew_at(),
        ) {
            (Some(every), Some(next)) if next > now => Lifetime::new(next + every * 2 - now),
            _ => self.settings.lifetime,
        }
    }

    pub(super) fn on_claim(&mut self, claim: Claim, now: Instant, out: &mut Actions) {
        let Some(slot) = self.vips.get(&claim.ip) else {
            // Only yielded VIPs, which may have no slot, refresh their yield.
            self.judge(claim, None, now);
            return;
        };
        // The winner answering is as good as its word that it holds the
        // VIP, but not right after this node took it: the node it was
        // taken from answers until it lets go, and it lets go on this
        // node's word that it holds the VIP, which may reach it after this
        // node let go in turn (taken on an undrain, handed back on a drain
        // 100 ms later: each let go to the other, seed 10090236915). Once
        // a few gossip rounds passed, the winner's word and its answers
        // count (see `may_leave_it_to`). A leaving node's winner takes the
        // VIP from a leaving node rather than letting go to it once it has
        // heard the leave: its answer is taken at once, and counts as
        // `Core::answer_counts` says.
        if slot.handover().is_some()
            && (self.phase != Phase::Running || self.fresh_take(claim.ip).is_none())
            && let Some(node) = self.conflicts.owner_of(claim.mac)
            && node != self.settings.node
        {
            let node = NodeName::from(node);
            if let Some(handover) = self
                .vips
                .get_mut(&claim.ip)
                .and_then(|s| s.held_mut()?.handover.as_deref_mut())
                && handover.answered_by.as_ref() != Some(&node)
            {
                debug!(ip = %claim.ip, %node, "answered for on the wire while handing over");
                handover.answered_by = Some(node);
                self.vips.unsettle(claim.ip);
            }
        }
        let Some(slot) = self.vips.get(&claim.ip) else {
            return;
        };
        // While asking the LAN, the VIP is judged as if held here: an owner
        // that outranks this node makes it stay off. A VIP kept past its
        // hand-over because the winner's view differs is held as much as
        // any: a second owner gossip cannot reach is settled by rank. So
        // is one being handed over, but only to yield: the winner waited
        // for may never take it (it stays off for that same owner), and an
        // owner that outranks this node answers for it meanwhile; this
        // node lets go to it, and takes it back should it fall silent.
        let handing_over = slot.handover().is_some()
            && !slot.answering()
            && self.conflicts.owner_of(claim.mac).is_some();
        let held = if slot.probing().is_some() {
            slot.want.clone()
        } else {
            slot.held_at()
                .filter(|h| {
                    h.mode == Mode::Local && (slot.answering() || handing_over) && !slot.busy()
                })
                .cloned()
        };
        let probing = slot.probing().is_some();
        // A silent owner whose addresses this node knows will lapse is not
        // a late word in gossip: the yield to it below keeps this node off
        // until they do (see `orphan_due`), and waiting a hand-over's time
        // more would leave the VIP unanswered past its lapse.
        if probing
            && self
                .conflicts
                .owner_of(claim.mac)
                .is_some_and(|n| n != self.settings.node && !self.lapsing_silent_owner(n))
            && self.orphan_answered(claim.ip)
        {
            // Due early only because nobody seemed to answer for it: a
            // hostlb node does, and its word in gossip is late (its agent
            // stalled after it took the VIP). Waited for as any orphan
            // somebody answers for. Not a warning: nothing is wrong, and
            // while Services stream in, each new revision can make it an
            // orphan again (35,000 lines a minute from 20 starved agents).
            debug!(ip = %claim.ip, mac = %claim.mac,
                "an orphan nobody seemed to answer for is answered on the wire; waiting for its winner after all");
            self.slot_mut(claim.ip).stop_probing();
            self.mark([claim.ip]);
            self.vips.unsettle(claim.ip);
            return;
        }
        let mut verdict = self.judge(claim, held.as_ref(), now);
        if handing_over && !matches!(verdict, Verdict::Yield { .. }) {
            verdict = Verdict::Ignore;
        }
        if let Verdict::Keep { other, .. } = &verdict
            && self.phase != Phase::Running
        {
            // Not a candidate (still starting, without a view of the
            // cluster to rank by, or leaving): the other hostlb node that
            // answers keeps it.
            let to = other.clone();
            if let Some(want) = held.clone() {
                self.conflicts.yield_to(claim.ip, &to, want, now);
            }
            verdict = Verdict::Yield { to };
        }
        match verdict {
            Verdict::Ignore => {}
            Verdict::Keep { other, gone } => {
                if probing {
                    return;
                }
                // Kept is only ever judged of a VIP held here.
                let Some(mine) = self.vips.get_mut(&claim.ip).and_then(Slot::held_mut) else {
                    return;
                };
                if mine.garp.is_some()
                    || mine
                        .kept_at
                        .is_some_and(|t| now.saturating_duration_since(t) < OWNER_PROBE)
                {
                    return;
                }
                mine.kept_at = Some(now);
                match self.conflicts.say(claim.ip, now) {
                    Some(left_out) if gone => {
                        warn!(ip = %claim.ip, node = %other, mac = %claim.mac, left_out,
                        "an answer in the name of a node whose agent is gone (out of gossip, its record stale); not its own, so this node keeps the address (one line a minute per address; left_out counts the answers since the last)")
                    }
                    Some(left_out) => warn!(ip = %claim.ip, %other, mac = %claim.mac, left_out,
                        "second owner on the wire; this node outranks it and keeps the address (one line a minute per address; left_out counts the answers since the last)"),
                    None => {}
                }
                out.metrics.push(Metric::Conflict(ConflictKind::Hostlb));
                self.conflicts.seen(ConflictSeen {
                    ip: claim.ip,
                    mac: claim.mac,
                    node: Some(other.to_string()),
                    outcome: ConflictOutcome::Kept,
                });
                if let Some(t) = held.and_then(|h| h.target) {
                    out.garp.push(t);
                    mine.garp = Garp::after_round(
                        self.settings.garp.count,
                        self.settings.garp.interval,
                        now,
                    );
                    self.vips.unsettle(claim.ip);
                }
            }
            Verdict::Yield { to } => {
                out.metrics.push(Metric::Conflict(ConflictKind::Hostlb));
                self.conflicts.seen(ConflictSeen {
                    ip: claim.ip,
                    mac: claim.mac,
                    node: Some(to.to_string()),
                    outcome: ConflictOutcome::Yielded,
                });
                self.vips.unsettle(claim.ip);
                let slot = self.slot_mut(claim.ip);
                if probing {
                    warn!(ip = %claim.ip, winner = %to, mac = %claim.mac,
                        "won, but a node that outranks this one still answers for it; staying off while it does");
                    slot.stop_probing();
                    return;
                }
                warn!(ip = %claim.ip, winner = %to, mac = %claim.mac,
                    "second owner on the wire; it outranks this node, which lets go while it answers");
                if let Some(vip) = slot.remove(LetGo::OutrankedOnWire, None) {
                    out.remove.push(vip);
                }
            }
            Verdict::Foreign { first } => {
                if probing && self.conflicts.last_holder(claim.ip).is_none() {
                    // Asked before the first claim of a VIP no hostlb node
                    // held, and a host that is no hostlb node answers (an
                    // address configured by hand, a DHCP lease): not taken,
                    // asked again with backoff until nobody else answers.
                    self.in_use(claim, out);
                    return;
                }
                if probing {
                    if first {
                        // Reported once the address is held here and it
                        // still answers.
                        self.conflicts.forget_report(claim.ip, claim.mac);
                    }
                    return;
                }
                out.metrics.push(Metric::Conflict(ConflictKind::Foreign));
                self.conflicts.seen(ConflictSeen {
                    ip: claim.ip,
                    mac: claim.mac,
                    node: None,
                    outcome: ConflictOutcome::Reported,
                });
                if first && let Some(left_out) = self.conflicts.say(claim.ip, now) {
                    warn!(ip = %claim.ip, mac = %claim.mac, left_out,
                        "another host answers for this address and it is no hostlb node; not fighting over it (one line a minute per address; left_out counts the answers from other MACs since the last)");
                    let also = if left_out > 0 {
                        format!(" ({left_out} answers from other MACs since the last such Event)")
                    } else {
                        String::new()
                    };
                    let note = format!(
                        "{} holds {} but the host with MAC {} answers for it too, and it is no hostlb node{also}",
                        self.settings.node, claim.ip, claim.mac
                    );
                    self.event_for(
                        claim.ip,
                        true,
                        hostlb_api::annotations::reasons::ADDRESS_CONFLICT,
                        note,
                        out,
                    );
                }
            }
        }
    }

    /// The first claim of `claim.ip` is given up for now: a stranger
    /// answers for it. Said once per stranger, counted every time.
    fn in_use(&mut self, claim: Claim, out: &mut Actions) {
        let now = self.now;
        let slot = self.slot_mut(claim.ip);
        slot.stop_probing();
        let news = slot.in_use != Some(claim.mac);
        slot.in_use = Some(claim.mac);
        // News is said at most once a minute per address.
        let news = news && self.conflicts.say(claim.ip, now).is_some();
        let delay = self.backoff(claim.ip);
        self.conflicts.forget_report(claim.ip, claim.mac);
        out.metrics.push(Metric::Conflict(ConflictKind::InUse));
        self.conflicts.seen(ConflictSeen {
            ip: claim.ip,
            mac: claim.mac,
            node: None,
            outcome: ConflictOutcome::NotTaken,
        });
        if news {
            warn!(ip = %claim.ip, mac = %claim.mac, retry_in = ?delay,
                "not taking the address: a host that is no hostlb node answers for it; asking again with backoff");
            let note = format!(
                "{} did not take {}: the host with MAC {} answers for it and is no hostlb node (an address configured by hand, or a DHCP lease?); asked again with backoff, taken once nobody else answers",
                self.settings.node, claim.ip, claim.mac
            );
            self.event_for(
                claim.ip,
                true,
                hostlb_api::annotations::reasons::ADDRESS_IN_USE,
                note,
                out,
            );
        }
    }

    pub(super) fn judge(&mut self, claim: Claim, held: Option<&Want>, now: Instant) -> Verdict {
        let membership = &self.membership;
        let (view, gossip) = (membership.view(), membership.gossip());
        // Never yielded to: a node gossip shows live (the election settles
        // it), nor one that left gracefully a moment ago, whose answers are
        // the last of its hand-over, heard after it left the view (or
        // before its `cleanup`'s leaving beat, see `Membership::left_lately`). Yielding
        // to it would leave the VIP unanswered until its answers stop for
        // `YIELD_HOLD`.
        let settled_by_gossip = |n: &str| {
            view.node(n).is_some()
                || (view
                    .gone
                    .iter()
                    .any(|g| g.node == n && g.status == Status::Leaving)
                    && membership
                        .lost_at(n)
                        .is_some_and(|t| now.saturating_duration_since(t) < HANDOVER_MAX))
                || membership.left_lately(n, now)
        };
        // Known gone: out of gossip, its addresses lapsed by its last word
        // (before that, a killed agent's host answers for itself), and the
        // API shows no agent of it running (listed records, none fresh of
        // it). Across a gossip partition its record stays fresh, and its
        // answers are its own; a dead host's MAC in a claim is somebody
        // else's.
        // The API's word counts only if listed since gossip lost the node:
        // a list from while its agent restarted (or before the API went
        // away) says nothing of the agent gossip saw run since (seed
        // 18622: a node cut off from gossip kept a VIP beside its live
        // owner for 5.6 s on a list 7 s old).
        let sessions = &self.sessions;
        let records_at = self.conflicts.records_at();
        let gone = |n: &str| {
            !settled_by_gossip(n)
                && sessions
                    .lapse(n)
                    .is_none_or(|l| now >= l.last + super::conflict::LAPSE_LATE)
                && membership
                    .lost_at(n)
                    .is_none_or(|lost| records_at.is_some_and(|r| r > lost))
        };
        let asking = self
            .vips
            .get(&claim.ip)
            .is_some_and(|s| s.probing().is_some());
        self.conflicts.judge(
            claim,
            &self.settings.node,
            &self.links.macs(),
            held,
            asking,
            &self.election,
            settled_by_gossip,
            |n: &str| gossip.node(n).is_some_and(|i| i.status == Status::Alive),
            gone,
            now,
        )
    }

    /// Renews every held address each third of its lifetime, in one batch.
    pub(super) fn renew(&mut self, now: Instant, out: &mut Actions) {
        if !self
            .cadence
            .renew_due(self.settings.lifetime.renew_every(), now)
        {
            return;
        }
        for s in self.vips.values_mut() {
            if let Some(vip) = s.renew(self.settings.lifetime) {
                out.add.push(vip);
            }
        }
    }

    /// Asks the LAN about every VIP held here (each [`OWNER_PROBE`]) and
    /// every VIP yielded to another node (each [`YIELD_PROBE`]); sends the
    /// announcement rounds that are due.
    pub(super) fn probe_wire(&mut self, now: Instant, out: &mut Actions) {
        for s in self.vips.values_mut() {
            let Some(h) = s.held_mut() else {
                continue;
            };
            let Some(g) = h.garp else {
                continue;
            };
            if g.next > now {
                continue;
            }
            if let Some(t) = h.at.target {
                out.garp.push(t);
            }
            h.garp = Garp::after_round(g.left, self.settings.garp.interval, now);
        }
        if let Some(every) = self.settings.garp.refresh
            && self.cadence.refresh_due(every, now)
        {
            // One batch for every VIP: a round is two frames, so even
            // a thousand VIPs are a moment's burst. Those still in
            // their first rounds, in dispute, or on their way out are
            // left alone.
            out.garp.extend(
                self.vips
                    .values()
                    // A renewal in flight leaves it held; the two
                    // timers may well keep step.
                    .filter(|s| matches!(s.held_op(), None | Some(HeldOp::Renew(_))))
                    .filter_map(Slot::held)
                    .filter(|h| h.garp.is_none() && h.handover.is_none() && h.contested.is_none())
                    .map(|h| &h.at)
                    .filter(|h| h.mode == Mode::Local)
                    .filter_map(|h| h.target),
            );
        }
        if !self.settings.wire {
            return;
        }
        match self.cadence.yield_probe_due(now) {
            Some(YieldProbe::All) => out
                .probe
                .extend(self.conflicts.yielded().filter_map(|(_, y)| y.want.target)),
            Some(YieldProbe::Lapsing) => {
                let sessions = &self.sessions;
                out.probe.extend(
                    self.conflicts
                        .yielded()
                        .filter(|(_, y)| lapsing(sessions.lapse(&y.to), now))
                        .filter_map(|(_, y)| y.want.target),
                );
            }
            None => {}
        }
        if self.cadence.owner_probe_due(now) {
            let asked = |(ip, s): (&IpAddr, &Slot)| {
                let h = s.held()?;
                if s.busy() || h.handover.is_some() || h.at.mode != Mode::Local {
                    return None;
                }
                Some((*ip, h.at.target?))
            };
            let lost = self
                .membership
                .view()
                .gone
                .iter()
                .any(|n| n.status != Status::Leaving);
            let held = self.vips.iter().filter_map(asked);
            if lost || held.clone().count() <= OWNER_PROBE_AT_REST {
                out.probe.extend(held.map(|(_, t)| t));
            } else {
                // In turn, from after the last one asked, around.
                let after = self.cadence.owner_probe_after();
                let next = held
                    .clone()
                    .filter(|(ip, _)| after.is_none_or(|a| *ip > a))
                    .chain(held)
                    .take(OWNER_PROBE_AT_REST);
                for (ip, target) in next {
                    self.cadence.owner_probed(ip);
                    out.probe.push(target);
                }
            }
        }
    }

    /// A VIP just held here that another node published held before: why
    /// it moved and how long it may have been dark, for the move's record
    /// (`Actions::moves`), its Event and the takeover metric. Judged from
    /// what this node knows of the previous holder now.
    pub(super) fn observe_move(&mut self, ip: IpAddr, now: Instant, out: &mut Actions) {
        let Some(from) = self
            .conflicts
            .previous_holder(ip, &self.settings.node)
            .map(str::to_string)
        else {
            return;
        };
        let shown = self.membership.gossip().node(&from);
        let leaving = self.membership.left(&from)
            || self.membership.left_lately(&from, now)
            || shown.is_some_and(|m| m.status == crate::model::Status::Leaving);
        let cause = if leaving {
            MoveCause::Leaving
        } else if shown.is_none() {
            MoveCause::Gone
        } else if self.sessions.is_suspect(&from) {
            MoveCause::Silent
        } else if shown.is_some_and(|m| m.drained) {
            MoveCause::Drained
        } else if self.election.cordon_drains(ip, &from) {
            MoveCause::Cordoned
        } else if self.election.upstream_lost(ip, &from) {
            MoveCause::Upstream
        } else if self.election.eligible(ip, &from) == Some(false) {
            MoveCause::Ineligible
        } else {
            MoveCause::Preference
        };
        let dark = cause
            .is_fault()
            .then(|| {
                self.sessions
                    .last_beat(&from)
                    .or_else(|| self.membership.lost_at(&from))
            })
            .flatten()
            .map(|t| now.saturating_duration_since(t))
            .filter(|d| *d < TAKEOVER_WINDOW);
        if let Some(d) = dark {
            out.metrics.push(Metric::Takeover(cause, d));
        }
        info!(%ip, %from, cause = cause.as_str(), dark_ms = dark.map(|d| d.as_millis() as u64),
            "moved here");
        if let Some(note) = self
            .move_notes
            .note(ip, &self.settings.node, &from, cause, dark, now)
        {
            self.event_for(
                ip,
                cause.is_warning(),
                hostlb_api::annotations::reasons::MOVED,
                note,
                out,
            );
        }
        out.moves.push(Move {
            ip,
            from,
            cause,
            dark,
        });
    }
}
