//! The gossip socket's side channels: payloads that are not chitchat's,
//! told apart by their first bytes, and the links through which the
//! failure detector and the owner beats send and receive them. The
//! transport, the detector and the beats all use these; none of them
//! depends on another for them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

/// First bytes of every detector payload.
pub const PROBE_MARK: [u8; 4] = *b"HLS\x01";
/// First bytes of every owner beat (see `beats`).
pub const BEAT_MARK: [u8; 4] = *b"HLB\x01";

/// Beats queued for the agent's loop before more are dropped: the loop
/// drains them at every turn.
pub const BEAT_INBOX: usize = 1_024;

/// Sends one detector payload; never waits (a full socket drops it, as the
/// network may).
pub trait ProbeSend: Send + Sync + 'static {
    fn send(&self, to: SocketAddr, payload: &[u8]);
}

/// The detector's side of the gossip socket.
pub struct ProbeLink {
    pub send: Arc<dyn ProbeSend>,
    /// Verified payloads (mark included) and who sent them.
    pub recv: mpsc::Receiver<(SocketAddr, Vec<u8>)>,
}

/// Provides the detector's link on the socket gossip listens on.
pub trait ProbeNet: Send + Sync {
    /// Called once the gossip socket bound to `listen` is open.
    fn attach(&self, listen: SocketAddr) -> Result<ProbeLink, String>;
}

/// The agent's side of the beats: send to a peer's gossip address, and
/// the verified beats received.
pub struct BeatLink {
    /// This run's gossip generation, which its beats carry.
    pub generation: u64,
    pub send: Arc<dyn ProbeSend>,
    pub recv: mpsc::Receiver<Arrived>,
}

/// A beat off the socket, verified, and when it came: a busy loop may
/// read it later, and an owner is judged silent by when its beats came,
/// not by when the loop got round to them.
#[derive(Clone, Debug)]
pub struct Arrived {
    pub from: SocketAddr,
    pub payload: Vec<u8>,
    pub at: Instant,
}
