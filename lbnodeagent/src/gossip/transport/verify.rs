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
use crate::gossip::frame::{Accepted, Inbound, Reject, canonical, payload_starts_with};
use crate::gossip::keys::GossipKeys;
use crate::gossip::link::PROBE_MARK;

/// Reads the gossip socket on its own task, so the failure detector's
/// probes are answered however busy chitchat's loop is (a large delta, a
/// slow round): its messages are verified and handed to the detector here,
/// everything else is queued for chitchat's socket, which verifies it.
/// Telling the two apart peeks at the unverified payload; a forged answer
/// only sends a datagram to the verifier that rejects it.
pub(super) async fn read_wire(
    wire: Arc<tokio::net::UdpSocket>,
    to_chitchat: mpsc::Sender<io::Result<(Vec<u8>, SocketAddr)>>,
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
                } else if to_chitchat.try_send(Ok((datagram.to_vec(), from))).is_err() {
                    AuthCounters::add(&counters.dropped_backlog, 1);
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
        match accepted {
            Ok(Accepted::Whole(payload)) => Some(payload.to_vec()),
            Ok(Accepted::Reassembled(payload)) => Some(payload),
            Ok(Accepted::Pending) => None,
            Err(reason) => {
                self.counters.reject(reason);
                self.warnings.reject(reason, from);
                debug!(%from, len = datagram.len(), ?reason, "gossip datagram dropped");
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
