//! Taking a VIP: the one place a VIP's next move is chosen ([`Core::decide`]),
//! what the election and the links want of it, and the gates before an
//! address goes into the kernel: a retry's backoff, a yield to an
//! outranking owner, and the pre-check that asks the LAN first.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::conflict::{
    Hold, PRECHECK, PRECHECK_ANSWER, PRECHECK_EVERY, PRECHECK_IN_USE, PRECHECK_PROBES,
};
use super::links::{Mode, Want};
use super::slot::{Probing, Retry, Slot, same_place};
use super::{Actions, Core, Phase, RETRY_MAX, RETRY_MIN};

impl Core {
    /// The slot of a VIP being decided. `decide` and what it calls run
    /// only for VIPs with a slot (an unsettled VIP has one until `decide`
    /// finds it idle), and nothing they call removes one.
    pub(super) fn slot(&self, ip: IpAddr) -> &Slot {
        self.vips.get(&ip).expect("a VIP being decided has a slot")
    }

    pub(super) fn slot_mut(&mut self, ip: IpAddr) -> &mut Slot {
        self.vips
            .get_mut(&ip)
            .expect("a VIP being decided has a slot")
    }

    /// Re-reads what this node should hold for the given addresses.
    pub(super) fn mark(&mut self, ips: impl IntoIterator<Item = IpAddr>) {
        for ip in ips {
            let want = self.want_of(ip);
            if self.vips.want(ip, want) == Some(true) {
                // What the annotations say of it may change.
                self.sent.touch_report();
            }
        }
    }

    pub(super) fn want_of(&self, ip: IpAddr) -> Option<Want> {
        if self.phase != Phase::Running {
            return None;
        }
        let duty = self
            .election
            .duty(&self.settings.node, ip)
            .or_else(|| self.orphan_duty(ip))?;
        let (wants, missing) = self
            .links
            .wants(std::slice::from_ref(&duty), self.settings.lifetime);
        for (ip, what) in missing {
            debug!(%ip, missing = %what, "won, but the interface is not there");
        }
        wants.into_values().next()
    }

    /// Every duty again (a cluster view, new links, this node's own state).
    pub(super) fn refresh_wants(&mut self) {
        let wants = if self.phase == Phase::Running {
            let mut duties = self.election.duties(&self.settings.node);
            let orphans = self.orphans.ips();
            duties.extend(orphans.into_iter().filter_map(|ip| self.orphan_duty(ip)));
            let (wants, missing) = self.links.wants(&duties, self.settings.lifetime);
            for (ip, what) in missing {
                debug!(%ip, missing = %what, "won, but the interface is not there");
            }
            wants
        } else {
            BTreeMap::new()
        };
        self.vips.want_all(wants);
        self.sent.touch_report();
    }

    /// The one place a VIP's next move is chosen; see the module docs.
    pub(super) fn decide(&mut self, ip: IpAddr, now: Instant, out: &mut Actions) {
        let Some(slot) = self.vips.get(&ip) else {
            self.vips.decided(ip);
            return;
        };
        if slot.busy() {
            return;
        }
        if let Some(r) = slot.retry
            && r.at > now
        {
            return;
        }
        let (want, held) = (slot.want.clone(), slot.held_at().cloned());
        match (want, held) {
            (Some(want), Some(held)) if same_place(&want, &held) => {
                let slot = self.slot_mut(ip);
                let (handed_back, adopted) = slot
                    .held_mut()
                    .map(|h| {
                        h.at = want.clone();
                        let handed_back = h.handover.take().map(|given| {
                            h.taken_back = Some(Box::new((*given, now)));
                        });
                        (handed_back.is_some(), std::mem::take(&mut h.adopted))
                    })
                    .unwrap_or_default();
                if handed_back {
                    info!(%ip, "kept: this node wins it again");
                }
                if adopted {
                    info!(%ip, interface = %want.vip.interface, "kept an address of a previous run");
                    // Renewed now, and announced: a peer may have answered
                    // for it while this node was away.
                    slot.add(want.clone());
                    out.add.push(want.vip.clone());
                }
                if handed_back {
                    self.sent.touch_publish();
                }
                if !self.slot(ip).busy()
                    && let Some((peer, why)) = self.contest(ip, now)
                {
                    warn!(%ip, reason = %why, "another live node holds it too; letting go");
                    // And stays off while it answers, even if gossip loses it.
                    self.conflicts.yield_to(ip, &peer, want.clone(), now);
                    let slot = self.slot_mut(ip);
                    if let Some(h) = slot.held_mut() {
                        h.contested = None;
                    }
                    if let Some(vip) = slot.remove(why, None) {
                        out.remove.push(vip);
                    }
                }
            }
            (Some(want), held) => self.acquire(ip, want, held.is_some(), now, out),
            (None, Some(held)) => {
                if let Some(why) = self.may_release(ip, &held, now) {
                    // Whatever the hand-over came to, the cause is the stop.
                    let why = if self.is_leaving() {
                        why.while_leaving()
                    } else {
                        why
                    };
                    if let Some(vip) = self.slot_mut(ip).remove(why, None) {
                        out.remove.push(vip);
                    }
                }
            }
            (None, None) => {
                let slot = self.slot_mut(ip);
                slot.stop_probing();
                slot.retry = None;
                slot.in_use = None;
                self.conflicts.forget(ip);
            }
        }
        self.vips.decided(ip);
    }

    pub(super) fn acquire(
        &mut self,
        ip: IpAddr,
        want: Want,
        held_here: bool,
        now: Instant,
        out: &mut Actions,
    ) {
        if self.phase != Phase::Running || !self.settling.may_take(now) {
            return;
        }
        // A live peer with a newer view of the cluster holds it: by that
        // view it is where it belongs (this node's view lags, or lost a
        // contest over it; see `contest`).
        let newer_holder = (!held_here)
            .then(|| {
                self.alive_peers()
                    .find(|n| self.revision_of(n) > self.dating.revision() && n.vips.contains(&ip))
                    .map(|n| n.node.clone())
            })
            .flatten();
        if let Some(peer) = newer_holder {
            self.conflicts.yield_to(ip, &peer, want, now);
            self.slot_mut(ip).stop_probing();
            return;
        }
        let membership = &self.membership;
        let sessions = &self.sessions;
        // A node whose `cleanup` said it goes is held off for no longer
        // either: its host answers until another does.
        let checked = match self.conflicts.holding_off(
            ip,
            now,
            |n| membership.view().node(n).is_some() || membership.left_lately(n, now),
            |n| sessions.lapse(n),
        ) {
            Hold::Off => {
                self.slot_mut(ip).stop_probing();
                return;
            }
            Hold::Released { checked } => checked,
            Hold::Free => false,
        };
        if checked {
            info!(%ip, "the gone owner's address lapsed and nobody answers; taking it");
        }
        if want.mode == Mode::Local && !held_here && !checked && self.needs_precheck(ip) {
            let wire_read = self.wire_read;
            let slot = self.slot_mut(ip);
            match slot.probing_mut() {
                None => {
                    debug!(%ip, "asking the LAN before taking it");
                    let window = if slot.in_use.is_some() {
                        PRECHECK_IN_USE
                    } else {
                        PRECHECK
                    };
                    slot.probe(Probing {
                        until: now + window,
                        next: now + PRECHECK_EVERY,
                        left: PRECHECK_PROBES - 1,
                    });
                    out.probe.extend(want.target);
                    return;
                }
                // A host late on its timers asks every question still,
                // the last with its time for an answer, and concludes only
                // once the wire was read after that: a late wake must not
                // turn one question, or an unread answer, into "nobody
                // answers".
                Some(p) if now < p.until || p.left > 0 || wire_read < p.until => {
                    if p.left > 0 && now >= p.next {
                        p.left -= 1;
                        p.next = now + PRECHECK_EVERY;
                        p.until = p.until.max(now + PRECHECK_ANSWER);
                        out.probe.extend(want.target);
                    }
                    return;
                }
                Some(_) => {}
            }
        }
        let mut want = want;
        if !held_here {
            want.vip.lifetime = self.aligned_lifetime(now);
        }
        out.add.push(want.vip.clone());
        self.slot_mut(ip).add(want);
    }

    /// Whether to ask the LAN before taking `ip`: unless a live node shows
    /// it held, and so hands it over make before break (both answer until
    /// it sees this node hold it), every takeover asks first. Its holder
    /// may have crashed, frozen, stalled, or be out of gossip's reach; and
    /// what this node has heard of who held it proves nothing: an owner
    /// that took it a moment ago may not have told yet (its state lost or
    /// late, or this agent just started). While an owner is out of the
    /// view for silence, every takeover asks, whoever shows the VIP: the
    /// owner may only have stalled, its kernel answering, and the node it
    /// took a VIP from a moment ago may still show it here (its newer
    /// state not heard yet), as if handing it over to this node.
    pub(super) fn needs_precheck(&self, ip: IpAddr) -> bool {
        // Out for silence, not leaving: a leaving owner hands over.
        let silenced = self
            .membership
            .view()
            .gone
            .iter()
            .any(|n| self.sessions.is_suspect(&n.node) && !self.membership.left(&n.node));
        self.settings.wire
            && (silenced
                || !self
                    .membership
                    .view()
                    .nodes
                    .iter()
                    .any(|n| n.node != self.settings.node && n.vips.contains(&ip)))
    }

    /// Schedules the next try at `ip`, doubling the delay each time.
    pub(super) fn backoff(&mut self, ip: IpAddr) -> Duration {
        self.backoff_to(ip, RETRY_MAX)
    }

    /// As [`Core::backoff`], doubling no further than `max`.
    pub(super) fn backoff_to(&mut self, ip: IpAddr, max: Duration) -> Duration {
        let now_retry = self.vips.get(&ip).and_then(|s| s.retry);
        let delay = now_retry
            .map(|r| (r.delay * 2).min(max))
            .unwrap_or(RETRY_MIN);
        let at = self.now + delay;
        let since = now_retry.map_or(self.now, |r| r.since);
        if let Some(s) = self.vips.get_mut(&ip) {
            s.retry = Some(Retry { at, delay, since });
        }
        delay
    }
}
