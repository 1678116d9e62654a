//! What the core tells the world: its beat plan, its gossip state, the
//! annotations and Events, metrics, when to wake it next, and the
//! `/status` document.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use hostlb_api::Family;
use hostlb_api::annotations::{self};
use tracing::info;

use crate::election::NodeName;
use crate::model::{LocalState, Status};

use super::conflict::{self, LAPSE_EARLY, lapsing};
use super::links::Mode;
use super::sessions::Lapse;
use super::slot::{Slot, expiry, merged, same_place};
use super::{
    Actions, Announcing, BeatPlan, Core, EventRequest, HANDOVER_MAX, LEAVE_GRACE_ROUNDS, LEAVE_MAX,
    Phase, Relay,
};

impl Core {
    /// The state to publish in gossip before the first step.
    pub fn local_state(&self) -> LocalState {
        LocalState {
            status: match self.phase {
                Phase::Starting => Status::Starting,
                Phase::Running => Status::Alive,
                _ => Status::Leaving,
            },
            virtual_mode: self.links.virtual_link.is_some(),
            on_link: self.own.on_link(),
            // Not what is being handed over: this node does not mean to
            // keep it, and a peer that holds it too need not contest it.
            // Nor what is being removed: a leaving node that read it here
            // would let go to a node that is letting go too.
            vips: self
                .vips
                .iter()
                .filter(|(_, s)| {
                    s.answering()
                        && !s.releasing()
                        && s.held_at().is_some_and(|h| h.mode == Mode::Local)
                })
                .map(|(ip, _)| *ip)
                .collect::<BTreeSet<_>>()
                .into(),
            macs: self.links.macs().into(),
            revision: self.dating.revision(),
            digest: self.dating.digest(),
            drained: self.own.drain(),
            behind: Arc::clone(self.orphans.behind()),
        }
    }

    /// Whom to beat and what to tell them: the session peers, when the
    /// addresses this node answers for lapse, and the silent owners.
    pub(super) fn next_beat_plan(&self) -> BeatPlan {
        let plan = self.sessions.plan();
        let gossip = self.membership.gossip();
        let known = || gossip.nodes.iter().chain(&gossip.gone);
        // Sorted, each once.
        let addrs = |names: &BTreeSet<NodeName>| -> Vec<SocketAddr> {
            if names.is_empty() {
                return Vec::new();
            }
            let mut addrs: Vec<SocketAddr> = known()
                .filter(|n| names.contains(&n.node) && n.node != self.settings.node)
                .map(|n| n.gossip_addr)
                .collect();
            addrs.sort_unstable();
            addrs.dedup();
            addrs
        };
        let relays = plan
            .relays
            .iter()
            .filter_map(|(node, to)| {
                let generation = known().find(|n| n.node == *node)?.generation;
                Some(Relay {
                    node: node.clone(),
                    generation,
                    lapse: self.sessions.lapse(node),
                    to: addrs(to),
                })
            })
            .collect();
        // An add or renewal in flight may land, even if this agent dies
        // now (the kernel has the request): then its address lapses a
        // lifetime from now, and a follower told only the older lapse
        // would stop asking before the address goes.
        let expiries = self
            .vips
            .values()
            .filter_map(Slot::held)
            .filter(|h| h.at.mode == Mode::Local)
            .filter_map(|h| h.expires)
            .chain(self.vips.values().filter_map(|s| {
                s.adding()
                    .filter(|w| w.mode == Mode::Local)
                    .and_then(|w| expiry(w, self.now))
            }));
        let lapse = expiries.fold(None, |acc: Option<Lapse>, e| {
            Some(match acc {
                None => Lapse { first: e, last: e },
                Some(l) => Lapse {
                    first: l.first.min(e),
                    last: l.last.max(e),
                },
            })
        });
        BeatPlan {
            dense: addrs(&plan.dense),
            sparse: addrs(&plan.sparse),
            lapse,
            relays,
        }
    }

    /// The outputs that follow the state: gossip, the watched addresses,
    /// annotations, readiness and status.
    pub(super) fn report(&mut self, now: Instant, out: &mut Actions) {
        // Held addresses change with what is published; worked out only
        // then, not at every step (beats arrive many times a second).
        let peers_changed = self.sessions.take_changed();
        if self.sent.take_beats(peers_changed) {
            let plan = self.next_beat_plan();
            if let Some(plan) = self.sent.offer_beats(plan) {
                out.beat = Some(plan);
            }
        }
        if self.sent.take_publish() {
            let local = self.local_state();
            if let Some(local) = self.sent.offer_publish(local) {
                out.publish = Some(local);
            }
        }
        // Compared in place (every step comes here), built only when it
        // changed.
        // Each with the interface it is (or would be) announced on: a
        // claim heard on any other (a pod's veth, a second network) is no
        // claim on this VIP, as the kernel itself would not take it as one.
        let watched = || {
            merged(
                self.vips.iter().filter_map(|(ip, s)| {
                    let at = s.held_at().or(s.probing().and(s.want.as_ref()))?;
                    Some((*ip, at.vip.ifindex))
                }),
                self.conflicts
                    .yielded()
                    .map(|(ip, y)| (*ip, y.want.vip.ifindex)),
                |(ip, _)| *ip,
            )
        };
        if let Some(watched) = self.sent.offer_watch(watched) {
            out.watch = Some(watched);
        }
        if self.sent.take_report(self.dating.known()) {
            let announcing = self.announcing();
            if let Some(announcing) = self.sent.offer_announcing(announcing) {
                out.announcing = Some(announcing);
            }
        }
        if self.phase == Phase::Running
            && !self.sent.ready()
            && self.settling.may_take(now)
            && self
                .vips
                .values()
                .all(|s| !s.busy() && s.probing().is_none())
        {
            self.sent.become_ready();
            info!(
                held = self.held_count(),
                members = self.membership.view().members.len(),
                "first reconcile applied; ready"
            );
            out.ready = true;
        }
        let status = (self.held_count(), self.membership.view().members.len());
        if let Some(status) = self.sent.offer_status(status) {
            out.status = Some(format!(
                "holding {} VIPs; {} live members",
                status.0, status.1
            ));
        }
    }

    /// The annotations this node is responsible for: the VIPs it holds and
    /// wins; and, on the first live member by name, clearing those nobody
    /// announces and naming the nodes that hold each VIP on their virtual
    /// interfaces (several hold it at once, so no one of them can say).
    pub(super) fn announcing(&self) -> Announcing {
        let mut out = Announcing::new();
        let janitor = self
            .membership
            .view()
            .members
            .first()
            .is_some_and(|m| m.node == self.settings.node);
        for (ip, svcs) in self.services.iter() {
            let family = Family::of(*ip);
            let slot = self.vips.get(ip);
            let local = match slot.and_then(|s| s.want.as_ref().zip(s.held_at())) {
                Some((w, h)) if w.mode == Mode::Local && same_place(w, h) => {
                    Some(Some(format!("{},{}", self.settings.node, w.vip.interface)))
                }
                _ if janitor && self.election.winner(*ip).is_none() => Some(None),
                _ => None,
            };
            let routed = janitor.then(|| {
                let nodes = self.election.virtual_nodes(*ip);
                (!nodes.is_empty()).then(|| annotations::virtual_value(&nodes))
            });
            for s in svcs {
                if let Some(v) = &local {
                    out.insert(
                        (s.clone(), annotations::announcing(family, false)),
                        v.clone(),
                    );
                }
                if let Some(v) = &routed {
                    out.insert(
                        (s.clone(), annotations::announcing(family, true)),
                        v.clone(),
                    );
                }
            }
        }
        out
    }

    pub(super) fn next_wake(&self, now: Instant) -> Option<Instant> {
        // Only deadlines still ahead: one that has passed was acted on in
        // this step, or waits on something else that has its own deadline
        // (a VIP whose retry is due while a yield holds it off). Waking
        // for it again now would spin.
        let mut wake: Option<Instant> = None;
        let mut read_wire = false;
        let mut at = |t: Instant| {
            if t > now {
                wake = Some(wake.map_or(t, |w| w.min(t)));
            }
        };
        for ip in self.vips.unsettled() {
            let Some(s) = self.vips.get(ip) else {
                continue;
            };
            if s.busy() {
                continue;
            }
            if let Some(r) = s.retry {
                at(r.at);
            }
            if let Some(p) = s.probing() {
                at(p.until);
                if p.left > 0 {
                    at(p.next);
                }
                // Past its window, but concluded only at a wake (see
                // `wire_read`): one is due at once.
                read_wire |= p.until <= now && self.wire_read < p.until;
            }
            if let Some(h) = s.held() {
                if let Some(o) = &h.handover {
                    at(o.since + HANDOVER_MAX);
                }
                if let Some(c) = h.contested {
                    at(c + HANDOVER_MAX);
                }
                if let Some(g) = h.garp {
                    at(g.next);
                }
            }
            if let Some(y) = self.conflicts.yield_of(*ip) {
                let lapse = self.sessions.lapse(&y.to);
                at(conflict::yield_ends(y.seen, lapse, now));
                if let Some(l) = lapse {
                    at(l.first.checked_sub(LAPSE_EARLY).unwrap_or(l.first));
                }
            }
        }
        if let Some(r) = self.cadence.renew_at()
            && self.vips.any_held()
        {
            at(r);
        }
        if let Some(r) = self.cadence.refresh_at()
            && self.settings.garp.refresh.is_some()
            && self.vips.any_held()
        {
            at(r);
        }
        for t in self
            .orphans
            .deadlines(|ip| self.unanswered(ip), self.dating.spread_at())
        {
            at(t);
        }
        if let Some(d) = self.sessions.deadline() {
            at(d);
        }
        if let Some(t) = self.isolation.deadline(self.gossip_alone()) {
            at(t);
        }
        if let Some(t) = self.watching.deadline() {
            at(t);
        }
        if let Some(t) = self.upstream.deadline(self.upstream_settle()) {
            at(t);
        }
        if self.settings.wire {
            if self.conflicts.yielded().next().is_some() {
                at(self.cadence.yield_probe_at());
            }
            if self
                .conflicts
                .yielded()
                .any(|(_, y)| lapsing(self.sessions.lapse(&y.to), now))
            {
                at(self.cadence.lapse_probe_at());
            }
            if self.vips.any_held() {
                at(self.cadence.owner_probe_at());
            }
        }
        match self.phase {
            Phase::Starting => {
                for t in self.settling.starting_wakes(self.settings.gossip_interval) {
                    at(t);
                }
            }
            Phase::Leaving { since } => {
                at(since + self.settings.gossip_interval * LEAVE_GRACE_ROUNDS);
                at(since + LEAVE_MAX);
            }
            Phase::Running if !self.settling.may_take(now) => at(self.settling.acquire_from()),
            _ => {}
        }
        if read_wire { Some(now) } else { wake }
    }

    pub(super) fn event_for(
        &self,
        ip: IpAddr,
        warning: bool,
        reason: &'static str,
        note: String,
        out: &mut Actions,
    ) {
        for svc in self.services.of(&ip) {
            out.events.push(EventRequest {
                service: svc.clone(),
                warning,
                reason,
                note: note.clone(),
            });
        }
    }

    pub(super) fn set_revision(&mut self, revision: u64, digest: Option<u64>) {
        if self.dating.set(revision, digest, self.now) {
            self.sent.touch_publish();
            self.orphans.rescan();
        }
    }

    /// The peers' gossip addresses, for `cleanup`.
    pub fn peers(&self) -> Vec<SocketAddr> {
        let mut peers: Vec<SocketAddr> = self
            .membership
            .view()
            .nodes
            .iter()
            .filter(|n| n.node != self.settings.node)
            .map(|n| n.gossip_addr)
            .collect();
        peers.sort();
        peers
    }
}
