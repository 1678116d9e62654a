//! The transport's counters for the agent's metrics: what was signed,
//! verified and refused. The transport and chitchat's log filter
//! (`codec_junk`) both count here.

use std::sync::atomic::{AtomicU64, Ordering};

use super::frame::Reject;

/// Counters for the agent's metrics. Monotonic, shared by every socket the
/// transport opens.
#[derive(Debug, Default)]
pub struct AuthCounters {
    pub frames_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub frames_received: AtomicU64,
    pub bytes_received: AtomicU64,
    /// Messages handed to chitchat after verification.
    pub messages_accepted: AtomicU64,
    /// Messages that needed two datagrams.
    pub messages_fragmented: AtomicU64,
    pub dropped_oversized: AtomicU64,
    pub dropped_malformed: AtomicU64,
    pub dropped_bad_mac: AtomicU64,
    pub dropped_stale: AtomicU64,
    pub dropped_replayed: AtomicU64,
    /// Authentic frames addressed to another node (replays; see `frame`).
    pub dropped_misdirected: AtomicU64,
    /// Frames of another format version (an agent of another release).
    pub dropped_other_version: AtomicU64,
    /// Verified messages lost on loopback (full buffer), and datagrams at
    /// the codec that are not from one of our ports or that it cannot
    /// decode (a local process sending junk to its loopback socket).
    pub dropped_loopback: AtomicU64,
    /// Outgoing messages dropped: too large even in two fragments, or the
    /// codec's bytes never came back over loopback.
    pub send_failed: AtomicU64,
    /// Of `send_failed`: too large even in two fragments.
    pub send_too_large: AtomicU64,
    /// The largest message sent, in chitchat bytes (before framing).
    pub largest_sent: AtomicU64,
    /// Datagrams dropped because their reader (chitchat or the failure
    /// detector) fell behind by thousands.
    pub dropped_backlog: AtomicU64,
    /// Nodes' parts of received deltas not merged, by why (see `signed`):
    /// their node's identity not known yet, cut at their last manifest,
    /// or refused (not signed by their node).
    pub state_unknown: AtomicU64,
    pub state_cut: AtomicU64,
    pub state_refused: AtomicU64,
}

impl AuthCounters {
    /// Counts one node's part of a delta that was not merged whole.
    pub fn state_refused(&self, outcome: &super::signed::Outcome) {
        use super::signed::Outcome;
        let counter = match outcome {
            Outcome::Kept => return,
            Outcome::Cut => &self.state_cut,
            Outcome::Unknown => &self.state_unknown,
            Outcome::Refused(_) => &self.state_refused,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A point-in-time copy of [`AuthCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuthStats {
    pub frames_sent: u64,
    pub bytes_sent: u64,
    pub frames_received: u64,
    pub bytes_received: u64,
    pub messages_accepted: u64,
    pub messages_fragmented: u64,
    pub dropped_oversized: u64,
    pub dropped_malformed: u64,
    pub dropped_bad_mac: u64,
    pub dropped_stale: u64,
    pub dropped_replayed: u64,
    pub dropped_misdirected: u64,
    pub dropped_other_version: u64,
    pub dropped_loopback: u64,
    pub send_failed: u64,
    pub send_too_large: u64,
    pub largest_sent: u64,
    pub dropped_backlog: u64,
}

impl AuthStats {
    /// Every datagram or message dropped for any reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_oversized
            + self.dropped_malformed
            + self.dropped_bad_mac
            + self.dropped_stale
            + self.dropped_replayed
            + self.dropped_misdirected
            + self.dropped_other_version
            + self.dropped_loopback
            + self.dropped_backlog
    }
}

impl AuthCounters {
    pub fn snapshot(&self) -> AuthStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        AuthStats {
            frames_sent: get(&self.frames_sent),
            bytes_sent: get(&self.bytes_sent),
            frames_received: get(&self.frames_received),
            bytes_received: get(&self.bytes_received),
            messages_accepted: get(&self.messages_accepted),
            messages_fragmented: get(&self.messages_fragmented),
            dropped_oversized: get(&self.dropped_oversized),
            dropped_malformed: get(&self.dropped_malformed),
            dropped_bad_mac: get(&self.dropped_bad_mac),
            dropped_stale: get(&self.dropped_stale),
            dropped_replayed: get(&self.dropped_replayed),
            dropped_misdirected: get(&self.dropped_misdirected),
            dropped_other_version: get(&self.dropped_other_version),
            dropped_loopback: get(&self.dropped_loopback),
            send_failed: get(&self.send_failed),
            send_too_large: get(&self.send_too_large),
            largest_sent: get(&self.largest_sent),
            dropped_backlog: get(&self.dropped_backlog),
        }
    }

    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn reject(&self, reason: Reject) {
        let counter = match reason {
            Reject::Oversized => &self.dropped_oversized,
            Reject::Malformed => &self.dropped_malformed,
            Reject::BadMac => &self.dropped_bad_mac,
            Reject::Stale { .. } => &self.dropped_stale,
            Reject::Replayed => &self.dropped_replayed,
            Reject::Misdirected { .. } => &self.dropped_misdirected,
            Reject::OtherVersion { .. } => &self.dropped_other_version,
        };
        Self::add(counter, 1);
    }
}
