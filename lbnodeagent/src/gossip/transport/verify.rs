//! Reading the wire: each datagram verified (signature, key, replay window) before its payload reaches the codec, and warnings about refused ones kept to a few a minute.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::ports::Destinations;
use super::{RECV_BUF, WallClock, is_transient};
use crate::gossip::counters::AuthCounters;
use crate::gossip::frame::{Accepted, Inbound, Reject, Verified, canonical, payload_starts_with};
use crate::gossip::keys::GossipKeys;
use crate::gossip::link::PROBE_MARK;

/// Reads the gossip socket on its own task, so the failure detector's
/// probes are answered however busy chitchat's loop is (a large delta, a
/// slow round): its messages are verified and handed to the detector here,
/// everything else is queued for chitchat's socket once its tag verifies
/// (replay, destination and reassembly are checked there, in order).
/// Telling the two apart peeks at the unverified payload; a forged answer
/// only sends a datagram to the verifier that rejects it.
///
/// Nothing unauthenticated is queued, and what is queued is bounded in
/// bytes as well as in datagrams ([`Backlog`]): anyone who reaches the
/// port could otherwise fill the queue with 64 KB of junk per entry.
pub(super) async fn read_wire(
    wire: Arc<tokio::net::UdpSocket>,
    to_chitchat: mpsc::Sender<io::Result<(Verified, SocketAddr)>>,
    backlog: Arc<Backlog>,
    mut probes: Verifier,
    probe_inbox: mpsc::Sender<(SocketAddr, Vec<u8>)>,
) {
    let mut buf = vec![0u8; RECV_BUF];
    loop {
        match wire.recv_from(&mut buf).await {
            Ok((len, from)) => {
                // An IPv4 peer on a dual-stack socket shows as its mapped
                // IPv6 address; it is known by its own.
                let from = canonical(from);
                let counters = &probes.counters;
                AuthCounters::add(&counters.frames_received, 1);
                AuthCounters::add(&counters.bytes_received, len as u64);
                let datagram = &buf[..len];
                if payload_starts_with(datagram, &PROBE_MARK)
                    || payload_starts_with(datagram, &crate::gossip::link::BEAT_MARK)
                {
                    if let Some(message) = probes.open(datagram, from) {
                        match probe_inbox.try_send((from, message)) {
                            Ok(()) => AuthCounters::add(&probes.counters.messages_accepted, 1),
                            Err(_) => AuthCounters::add(&probes.counters.dropped_backlog, 1),
                        }
                    }
                } else {
                    let verified = Verified::open(&read_keys(&probes.keys), datagram);
                    match verified {
                        Err(reason) => {
                            probes.counters.reject(reason);
                            probes.warnings.reject(reason, from);
                            debug!(%from, len, ?reason, "gossip datagram dropped");
                        }
                        Ok(v) => {
                            let bytes = v.len();
                            if !backlog.take(bytes) {
                                AuthCounters::add(&counters.dropped_backlog, 1);
                            } else if to_chitchat.try_send(Ok((v, from))).is_err() {
                                backlog.give_back(bytes);
                                AuthCounters::add(&counters.dropped_backlog, 1);
                            }
                        }
                    }
                }
            }
            Err(error) if is_transient(&error) => {
                debug!(%error, "transient gossip receive error");
            }
            Err(error) => {
                let _ = to_chitchat.send(Err(error)).await;
                return;
            }
        }
    }
}

/// Bytes of verified datagrams queued for chitchat's socket, bounded by
/// [`Backlog::MAX_BYTES`]. The reader takes, the socket gives back when it
/// has read one.
#[derive(Debug, Default)]
pub(super) struct Backlog(AtomicU64);

impl Backlog {
    /// 8 MiB: 128 datagrams of the largest size chitchat sends, far more
    /// than its loop leaves waiting (it reads one between any two of its
    /// own steps), while a flood of signed datagrams from a key holder
    /// costs at most that.
    pub(super) const MAX_BYTES: u64 = 8 << 20;

    /// Counts `bytes` in, unless that would pass the bound.
    pub(super) fn take(&self, bytes: usize) -> bool {
        let bytes = bytes as u64;
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + bytes <= Self::MAX_BYTES).then_some(held + bytes)
            })
            .is_ok()
    }

    pub(super) fn give_back(&self, bytes: usize) {
        self.0.fetch_sub(bytes as u64, Ordering::AcqRel);
    }

    #[cfg(test)]
    pub(super) fn held(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// Frame verification with its replay state: one for chitchat's socket,
/// one for the failure detector's frames (which come under sender ids of
/// their own) in the wire reader.
pub(super) struct Verifier {
    pub(super) inbound: Inbound,
    pub(super) destinations: Destinations,
    pub(super) keys: Arc<RwLock<GossipKeys>>,
    pub(super) clock: WallClock,
    pub(super) counters: Arc<AuthCounters>,
    pub(super) warnings: Warnings,
}

impl Verifier {
    /// The whole message once its last fragment verified; drops counted
    /// (and logged, see [`Warnings`]).
    pub(super) fn open(&mut self, datagram: &[u8], from: SocketAddr) -> Option<Vec<u8>> {
        let now = self.clock.now_ms();
        let destinations = &mut self.destinations;
        let accepted = self
            .inbound
            .accept(&read_keys(&self.keys), datagram, now, |to| {
                destinations.accepts(to)
            });
        self.outcome(accepted, datagram.len(), from)
    }

    /// [`Verifier::open`] of a datagram whose tag the wire reader checked.
    pub(super) fn open_verified(
        &mut self,
        datagram: &Verified,
        from: SocketAddr,
    ) -> Option<Vec<u8>> {
        let now = self.clock.now_ms();
        let destinations = &mut self.destinations;
        let accepted = self
            .inbound
            .accept_verified(datagram, now, |to| destinations.accepts(to));
        self.outcome(accepted, datagram.len(), from)
    }

    fn outcome(
        &mut self,
        accepted: Result<Accepted<'_>, Reject>,
        len: usize,
        from: SocketAddr,
    ) -> Option<Vec<u8>> {
        match accepted {
            Ok(Accepted::Whole(payload)) => Some(payload.to_vec()),
            Ok(Accepted::Reassembled(payload)) => Some(payload),
            Ok(Accepted::Pending) => None,
            Err(reason) => {
                self.counters.reject(reason);
                self.warnings.reject(reason, from);
                debug!(%from, len, ?reason, "gossip datagram dropped");
                None
            }
        }
    }
}

/// Drops are counted for metrics; these also mean an operator mistake (a
/// wrong key, a clock without NTP, an address the node does not know as its
/// own, a half-finished upgrade) that would otherwise look like a silent
/// partition, so they are logged too, each at most once a minute.
#[derive(Default)]
pub(super) struct Warnings {
    pub(super) bad_mac: Option<tokio::time::Instant>,
    pub(super) stale: Option<tokio::time::Instant>,
    pub(super) misdirected: Option<tokio::time::Instant>,
    pub(super) other_version: Option<tokio::time::Instant>,
    pub(super) codec_junk: Option<tokio::time::Instant>,
}

impl Warnings {
    const EVERY: Duration = Duration::from_secs(60);

    pub(super) fn due(last: &mut Option<tokio::time::Instant>) -> bool {
        let now = tokio::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < Self::EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }

    pub(super) fn reject(&mut self, reason: Reject, from: SocketAddr) {
        match reason {
            Reject::BadMac if Self::due(&mut self.bad_mac) => {
                warn!(%from, "dropping gossip that fails authentication; does the peer use another gossip key?");
            }
            Reject::Stale { skew_ms } if Self::due(&mut self.stale) => {
                warn!(%from, skew_ms, "dropping gossip stamped outside the replay window; check the clocks (NTP) of both nodes");
            }
            Reject::Misdirected { to } if Self::due(&mut self.misdirected) => {
                warn!(%from, %to, "dropping gossip addressed to another node: a replay, or a peer or seed that names this node by an address it does not know as its own; give that address to gossip as its advertise address");
            }
            Reject::OtherVersion { version } if Self::due(&mut self.other_version) => {
                warn!(%from, version, "dropping gossip in another frame format; agents of this release and that one do not gossip with each other, so upgrade every agent");
            }
            _ => {}
        }
    }

    /// One line for the datagrams at the codec that are not gossip, with
    /// their number since the last line.
    pub(super) fn codec_junk(&mut self, unreported: &AtomicU64) {
        if unreported.load(Ordering::Relaxed) > 0 && Self::due(&mut self.codec_junk) {
            let datagrams = unreported.swap(0, Ordering::Relaxed);
            warn!(
                datagrams,
                "dropping datagrams at the gossip codec's loopback socket that are not gossip; a local process sends them"
            );
        }
    }
}

pub(super) fn read_keys(keys: &RwLock<GossipKeys>) -> std::sync::RwLockReadGuard<'_, GossipKeys> {
    // A panic while holding the lock cannot leave the keys half-written
    // (the write is one assignment), so a poisoned lock is still good.
    keys.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}
