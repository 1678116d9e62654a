//! What the kernel did with what the core asked: operation results, the
//! kernel's own list of our addresses (which is trusted over events read
//! late), and the addresses a previous run left.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Instant;

use hostlb_api::annotations::reasons;
use tracing::{debug, info, warn};

use crate::model::Target;
use crate::model::{Applied, OwnedAddress};

use super::links::{Mode, Want};
use super::reason::LetGo;
use super::slot::{Garp, Held, Op, expiry, same_place};
use super::{ADD_FAST_FOR, ADD_RETRY_MAX, Actions, Core, Metric, OpName, OpResult, RETRY_MAX};

impl Core {
    /// Our addresses as the kernel has them, read after every operation
    /// asked for before: the truth, for every VIP with no operation in
    /// flight. One held here but gone from the kernel (removed by hand,
    /// lapsed) is put back if still ours; one the kernel holds that the
    /// core does not (a removal it was told of that had not happened) is
    /// held again, and kept or released like any other.
    pub(super) fn kernel_owned(&mut self, owned: Vec<OwnedAddress>) {
        let there: BTreeSet<(u32, IpAddr)> = owned.iter().map(|o| (o.ifindex, o.ip)).collect();
        for ip in self.vips.unhold_missing(&there) {
            warn!(%ip, "address removed outside the agent; putting it back if still ours");
            self.sent.touch_publish();
            self.sent.touch_report();
        }
        for o in owned {
            if self
                .vips
                .get(&o.ip)
                .is_some_and(|s| s.busy() || s.held().is_some())
            {
                continue;
            }
            info!(ip = %o.ip, interface = %o.interface,
                "the kernel holds an address of ours the agent thought gone; deciding it again");
            let want = self.adopted_want(&o);
            // Not a VIP just handed to this node: a peer's word that it
            // holds it stands at once (see `holds`).
            self.vips.found_held(o.ip, Held::new(want, None));
            self.sent.touch_publish();
            self.sent.touch_report();
        }
    }

    pub(super) fn on_done(&mut self, r: OpResult, now: Instant, out: &mut Actions) {
        let ip = r.ip;
        let Some((op, slot)) = self.vips.take_op(ip) else {
            return;
        };
        match (op, r.result) {
            (Op::Add { want, renew: true }, Ok(Applied::Done)) => {
                out.metrics.push(Metric::Op {
                    op: OpName::Renew,
                    ok: true,
                });
                if let Some(h) = slot.held_mut()
                    && same_place(&h.at, &want)
                {
                    h.expires = expiry(&want, now);
                    h.at = want;
                    self.sent.touch_beats();
                }
            }
            (Op::Add { renew: true, .. }, Ok(Applied::NotOurs)) => {
                warn!(%ip, "address is no longer ours (added by hand?); leaving it alone");
                slot.unhold();
                self.sent.touch_publish();
                self.sent.touch_report();
            }
            (Op::Add { renew: true, .. }, Err(e)) => {
                out.metrics.push(Metric::Op {
                    op: OpName::Renew,
                    ok: false,
                });
                warn!(%ip, error = %e, "renewing failed; retrying at the next renewal");
            }
            (Op::Add { want, .. }, Ok(Applied::Done)) => {
                out.metrics.push(Metric::Op {
                    op: OpName::Add,
                    ok: true,
                });
                slot.retry = None;
                if let Some(mac) = slot.in_use.take() {
                    info!(%ip, %mac, "the host that answered for this address no longer does; taken");
                }
                let (held, previous) = match slot.unhold() {
                    Some(mut h) => {
                        let p = std::mem::replace(&mut h.at, want.clone());
                        (h, Some(p))
                    }
                    None => {
                        let mut h = Held::new(want.clone(), Some(now));
                        h.taken_from = self
                            .conflicts
                            .previous_holder(ip, &self.settings.node)
                            .map(Box::from);
                        (h, None)
                    }
                };
                let held = slot.hold(held);
                held.expires = expiry(&want, now);
                held.handover = None;
                if let Some(target) = want.target {
                    out.garp.push(target);
                    held.garp = Garp::after_round(
                        self.settings.garp.count,
                        self.settings.garp.interval,
                        now,
                    );
                }
                let fresh = previous.is_none();
                let moved = previous.filter(|p| p.vip.ifindex != want.vip.ifindex);
                let fresh = fresh || moved.is_some();
                if let Some(p) = moved
                    && let Some(vip) =
                        slot.remove(LetGo::MovedTo(want.vip.interface.clone()), Some(p.vip))
                {
                    out.remove.push(vip);
                }
                self.vips.held_once(ip);
                self.conflicts.foreign_gone(ip);
                self.sent.touch_publish();
                self.sent.touch_report();
                if fresh {
                    info!(%ip, interface = %want.vip.interface, prefix_len = want.vip.prefix_len,
                        mode = ?want.mode, "acquired");
                    self.observe_move(ip, now, out);
                    let (reason, note) = match want.mode {
                        Mode::Local => (
                            reasons::ANNOUNCING_LOCAL,
                            format!(
                                "{} answers for {ip} on {}",
                                self.settings.node, want.vip.interface
                            ),
                        ),
                        Mode::Virtual => (
                            reasons::ANNOUNCING_VIRTUAL,
                            format!(
                                "{} holds {ip} on {} for routing",
                                self.settings.node, want.vip.interface
                            ),
                        ),
                    };
                    self.event_for(ip, false, reason, note, out);
                }
            }
            (Op::Add { want, .. }, Ok(Applied::NotOurs)) => {
                out.metrics.push(Metric::Op {
                    op: OpName::Add,
                    ok: true,
                });
                // Looked at again later, in case it is taken away.
                self.backoff(ip);
                if self.conflicts.foreign_found(ip) {
                    warn!(%ip, interface = %want.vip.interface,
                        "won, but the host already holds this address and the agent did not add it; leaving it alone");
                    let note = format!(
                        "{} won {ip} but {} already holds it, added outside hostlb; it is left alone",
                        self.settings.node, want.vip.interface
                    );
                    self.event_for(
                        ip,
                        true,
                        hostlb_api::annotations::reasons::ADDRESS_CONFLICT,
                        note,
                        out,
                    );
                }
            }
            (Op::Add { .. }, Err(e)) => {
                out.metrics.push(Metric::Op {
                    op: OpName::Add,
                    ok: false,
                });
                let before = slot.retry;
                let refused_for = before.map(|r| now.saturating_duration_since(r.since));
                let fast = refused_for.is_none_or(|d| d < ADD_FAST_FOR);
                let slowing = !fast && before.is_some_and(|r| r.delay <= ADD_RETRY_MAX);
                let delay = self.backoff_to(ip, if fast { ADD_RETRY_MAX } else { RETRY_MAX });
                // Warned at the first refusal and when the retries slow
                // down; the failures metric counts each.
                match refused_for {
                    None => warn!(%ip, error = %e, retry_in = ?delay,
                        "cannot add the address; trying again until the kernel takes it"),
                    Some(d) if slowing => {
                        warn!(%ip, error = %e, refused_for = ?d, retry_in = ?delay,
                            "the kernel still refuses the address; asking less often")
                    }
                    Some(_) => debug!(%ip, error = %e, retry_in = ?delay,
                        "the kernel still refuses the address"),
                }
            }
            (Op::Remove { vip, why, stale }, Ok(_)) => {
                out.metrics.push(Metric::Op {
                    op: OpName::Remove,
                    ok: true,
                });
                if stale {
                    return;
                }
                let adopted = slot.adopted();
                slot.unhold();
                slot.retry = None;
                self.sent.touch_publish();
                self.sent.touch_report();
                if adopted {
                    info!(%ip, interface = %vip.interface, reason = %why,
                        "removed an address of a previous run");
                } else {
                    info!(%ip, interface = %vip.interface, reason = %why, "released");
                    let note = format!("{} no longer answers for {ip} ({why})", self.settings.node);
                    self.event_for(ip, false, reasons::WITHDRAWN, note, out);
                }
            }
            (Op::Remove { vip, .. }, Err(e)) => {
                out.metrics.push(Metric::Op {
                    op: OpName::Remove,
                    ok: false,
                });
                let delay = self.backoff(ip);
                warn!(%ip, interface = %vip.interface, error = %e, retry_in = ?delay,
                    "cannot remove the address");
            }
        }
    }

    /// An address of a previous run as a held VIP.
    pub(super) fn adopted_want(&self, a: &OwnedAddress) -> Want {
        let virtual_link = self
            .links
            .virtual_link
            .as_ref()
            .is_some_and(|v| v.index == a.ifindex);
        Want {
            vip: a.vip(self.settings.lifetime),
            mode: if virtual_link {
                Mode::Virtual
            } else {
                Mode::Local
            },
            target: if virtual_link {
                None
            } else {
                self.links
                    .by_index(a.ifindex)
                    .and_then(|i| Target::on(i, a.ip))
            },
        }
    }
}
