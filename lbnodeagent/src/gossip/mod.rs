//! Gossip membership (SPEC §7): who is alive, what each node can announce,
//! and the authenticated datagrams that carry it.
//!
//! # Data flow
//!
//! [`Membership`] runs chitchat 0.13 and publishes this node's
//! [`LocalState`] as key-values (`version`, `status`, `onlink.v4`,
//! `onlink.v6`, `virtual`, `vips.N`, `detector`; see `state`), and runs a
//! SWIM failure detector ([`Detector`], foca) beside it on the same socket.
//! It turns chitchat's cluster state and the detector's up set into
//! [`MembershipView`]s on a `watch` channel: the election's `Vec<Member>`
//! (up, `alive`, newest generation per node name) plus every node's
//! published state and this node's own. chitchat carries what nodes
//! publish; the detector says who is up (see `detector` for why two
//! protocols). The
//! reconcile loop selects on that channel and calls
//! [`Membership::publish`] with what it holds; on SIGTERM it calls
//! [`Membership::set_leaving`], waits until the view shows others holding
//! its VIPs, then [`Membership::shutdown`] (or [`Membership::leave`] does
//! both with a fixed wait). Dropping a `Membership` is a crash as far as
//! peers can tell. Seeds come from the config (chitchat's own list, DNS
//! names re-resolved every minute) and at run time from
//! [`Membership::set_seeds`], probed by this layer because chitchat's list
//! is fixed at start.
//!
//! # Transport: a loopback codec relay
//!
//! chitchat's envelope codec is crate-private and nothing may be patched,
//! so [`AuthTransport`] implements chitchat's public `Transport`/`Socket`
//! traits around chitchat's public `UdpSocket`, bound to 127.0.0.1, as the
//! codec. For each peer P one loopback "port" socket, connected to the
//! codec, carries both directions: the codec encodes messages for P into
//! `port[P]`, we sign them and send them on the wire socket; verified
//! payloads from P are injected through `port[P]`, so the codec's
//! `from_addr` names the port and maps back to P. Pairing is by port, never
//! by arrival order, so a late or lost loopback datagram cannot hand one
//! peer's message to another. `recv` is cancel-safe: its only awaits are
//! the cancel-safe `recv_from` of the codec and of the wire socket, and
//! everything from receiving a wire datagram to injecting it is
//! synchronous. Cost: two loopback copies per message, one socket per
//! recent peer (at most [`MAX_PORTS`], idle ones closed first, each kept
//! bound [`PORT_GRACE`] longer so its number is not reused while the codec
//! may still hold a message injected through it). A port is opened only for
//! a peer chitchat sends to or whose message verified: forged, replayed and
//! misdirected datagrams open none.
//!
//! # Frames (`frame`)
//!
//! `magic "HLG\x02" | fragment | fragments | tags | sender u64 | seq u64 |
//! timestamp-ms u64 | destination ip (16) + port (2) | payload |
//! HMAC-SHA256 × tags`: 49 header bytes, 32 per tag, 81 bytes with one key.
//! Drops are counted by reason in [`AuthCounters`] (for metrics) and never
//! stop gossip; a wrong key, a wrong clock, a frame addressed to another
//! node and a frame of another format version are also logged, at most once
//! a minute. Version 1 frames are refused, not misread: agents on either
//! side of that change do not gossip with each other, so upgrade all agents
//! of a cluster together.
//!
//! - **Keys** ([`GossipKeys`]): a file of one or two hex lines, each at
//!   least 32 bytes. Frames carry a tag under every configured key and are
//!   accepted when any tag verifies under any accepted key, so rotation is
//!   `[A]` → `[B, A]` → `[B]` with no split at any step (`[A]` and `[B]`
//!   alone do not talk). [`AuthTransport::set_keys`] applies a reloaded
//!   file to open sockets (SIGHUP).
//! - **Replay**: a frame whose timestamp is more than the replay window
//!   (30 s) from our clock is dropped; within it, each sender's sequence
//!   numbers are tracked with a 128-entry sliding bitmap (IPsec style), so
//!   a duplicate is dropped and reordering is not. Every frame names the
//!   address its sender sent it to, under the MAC, and a node drops frames
//!   addressed to anyone else: a SYN captured on its way to one node cannot
//!   be replayed to the others with a spoofed source to make each send a
//!   large reply to a victim. A node accepts its own address (with a
//!   wildcard listen address, any local address on the gossip port) and the
//!   addresses given to [`AuthTransport::with_destinations`] (the advertise
//!   address, by [`GossipConfig::auth_transport`]). What remains: a frame
//!   captured in flight and delivered to its own receiver before the
//!   original, from a spoofed source, draws one reply to that source, once.
//! - **Size**: chitchat fills its messages up to the IPv4 UDP maximum,
//!   65 507 bytes, which the frame overhead would exceed. A message that no
//!   longer fits one datagram is split in two signed fragments and
//!   reassembled (five-second timeout, 64 pending at most); anything
//!   chitchat emits fits in two. Separately, chitchat never splits a value,
//!   so held VIPs are published in `vips.N` keys of at most 4 000 bytes.
//!   Still a limit: chitchat sends the SYN digest whole, and the codec
//!   relay carries a message in one loopback datagram (65,507 bytes); with
//!   protocol V1 (zstd, which we use) a digest is about 11 bytes per member,
//!   so about 5,900 members.
//!
//! # Defaults and the measurements behind them
//!
//! Run `cargo bench -p lbnodeagent --bench gossip`: three agents on
//! loopback UDP with this transport, a fresh cluster per run warmed up for
//! 3 s, time until *both* survivors' views drop the node; "spurious" counts
//! member removals in a 10-agent cluster over 30 s idle, with four spinning
//! threads on the two cores, then with 10% of messages dropped. With the
//! SWIM detector at the 100 ms interval (2-core machine, 6 runs): crash
//! seen by both survivors in 467 ms median, 547 ms max; leave in 1 ms;
//! spurious removals 0 idle, 0 busy, 1 with 10% loss at three indirect
//! probes and a three-period suspicion, which is why the shipped detector
//! asks four members and waits at least four periods (figures for that in
//! docs/agent-network.md).
//!
//! Crash detection was chitchat's before that detector, and its failure
//! detector still judges peers that do not run one (an agent of an earlier
//! release, during an upgrade); this is how its settings were chosen, with
//! `GOSSIP_BENCH_SWEEP=1` (10–12 runs):
//!
//! | interval | phi | detector timeout | crash: median / max | spurious busy / lossy |
//! |---|---|---|---|---|
//! | 100 ms | 6 | 279 ms | 399 / 402 ms | 0 / 0 |
//! | **100 ms** | **8** | **376 ms** | **499 / 598 ms** | **0 / 0** |
//! | 100 ms | 10 | 464 ms | 599 / 601 ms | 0 / 0 |
//! | 100 ms | 12 | 555 ms | 699 / 800 ms | 0 / 0 |
//! | 150 ms | 6 | 427 ms | 599 / 749 ms | 0 / 0 |
//! | 200 ms | 3 | 290 ms | 598 / 600 ms | 177 / 193 |
//! | 200 ms | 4 | 386 ms | 699 / 800 ms | 6 / 4 |
//! | 200 ms | 6 | 579 ms | 899 / 999 ms | 0 / 0 |
//! | 200 ms | 8 | 772 ms | 1098 / 1199 ms | 0 / 0 |
//!
//! chitchat's "phi" is silence divided by the mean observed heartbeat
//! interval, and a peer's heartbeat is seen about twice per round, so the
//! timeout is about phi × interval / 2; liveness is only re-checked at the
//! end of a round, which adds up to one interval. What causes flapping is
//! the timeout measured in rounds, not in milliseconds: 200 ms / phi 3 and
//! 100 ms / phi 6 have the same ~285 ms timeout, but the first is 1.5
//! rounds and flaps hundreds of times, the second 2.8 rounds and never
//! does. Hence **interval 100 ms, phi 8** (timeout ≈ 3.7 rounds): crash
//! detected in 0.5 s median, 0.6 s max, leaving half of SPEC's one-second
//! VIP-outage budget for election, address and ARP, and a margin of one
//! round over the tightest setting that showed no flap. In larger clusters
//! each node hears of a given peer less often (fan-out is three), so the
//! timeout grows rather than shrinks: 358 / 419 / 539 ms at 3 / 10 / 100
//! members (in-memory, paused clock).
//!
//! **Leave** is detected in 1–2 ms median and max, at every setting:
//! [`Membership::set_leaving`] sends a SYN to up to 128 live peers, each
//! answers, and our reply carries `status = leaving`; a key-change listener
//! rebuilds the view the moment it lands. `extra_liveness_predicate` drops
//! leaving nodes from chitchat's live-node watcher too, but that watcher is
//! only recomputed at the end of a round and `live_nodes()` ignores the
//! predicate, so views filter `status` themselves. After leaving, a node
//! keeps gossiping for [`DEFAULT_LEAVE_ROUNDS`] rounds (covering peers
//! beyond the push and lost pushes) before it stops.
//!
//! **Bandwidth** grows with the cluster: every SYN and SYN-ACK carries a
//! digest of every member (about 11 bytes each, compressed), and a round
//! sends three SYNs, so at 100 ms a node sends about 1 kB/s per member. The
//! [`pace`] layer caps it at `gossip.max_bandwidth` (128 kB/s by default,
//! reached from about 150 members): past the budget a node starts fewer
//! exchanges and published changes spread more slowly. Crash detection is
//! not slowed: the SWIM detector beside it sends about 3.5 kB/s per node
//! whatever the cluster size. `cargo bench -p lbnodeagent --bench
//! membership` measures 100 to 1,000 members; the table is in
//! `docs/agent-network.md`.
//!
//! Other settings: `initial_interval` = the gossip interval (chitchat's 5 s
//! prior would make detection take ~40 s right after a peer joins);
//! `max_interval` = 10 rounds, so one long pause does not skew the mean;
//! `dead_node_grace_period` = 10 min (a dead generation leaves digests after
//! 5 min and state after 10; chitchat's memory of deleted nodes keeps it
//! from coming back; 24 h would keep every restart's stale generation in
//! every digest for half a day); `marked_for_deletion_grace_period` = 10 min
//! (only `vips.N` chunks are ever deleted; a peer that missed the deletion
//! for longer is reset and resent the node's state, which is small);
//! protocol V1 (compressed digests; every node runs chitchat 0.13).
//! Generations are the start time in ms shifted left by 20 bits (zero low
//! bytes compress away in every digest; the values stay above the
//! nanosecond generations of earlier releases), and views keep the newest
//! generation of each node name, so a restarted agent replaces its old
//! self at once instead of appearing twice until the old one times out.

pub mod beats;
mod codec_junk;
mod config;
mod counters;
pub mod counting;
mod detector;
pub mod frame;
mod keys;
mod link;
mod membership;
mod pace;
pub mod signed;
mod state;
mod transport;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use config::{
    DEFAULT_CLUSTER_ID, DEFAULT_DEAD_NODE_GRACE, DEFAULT_INTERVAL, DEFAULT_LEAVE_ROUNDS,
    DEFAULT_MAX_BANDWIDTH, DEFAULT_PHI_THRESHOLD, DEFAULT_PORT, DEFAULT_REPLAY_WINDOW,
    DEFAULT_TOMBSTONE_GRACE, GossipConfig, MIN_MAX_BANDWIDTH,
};
pub use counters::{AuthCounters, AuthStats};
pub use detector::{Detector, DetectorCounters, MAX_PACKET, MemProbes, Peer, REST_PERIODS, Up};
pub(crate) use keys::SHARED_MODE_BITS;
pub use keys::{GossipKeys, MAX_KEYS, MIN_KEY_LEN};
pub use link::{
    Arrived, BEAT_INBOX, BEAT_MARK, BeatLink, PROBE_MARK, ProbeLink, ProbeNet, ProbeSend,
};
pub use membership::{Membership, MembershipView, ViewBuilder, build_view};
pub use state::{
    KEY_STATUS, LocalState, MemberInfo, PROTOCOL, PROTOCOL_UNSAID, Status, initial_key_values,
};
pub use transport::{AuthSocket, AuthTransport, MAX_PORTS, PORT_GRACE, WallClock, bind_udp};

#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    #[error("invalid {key}: {problem}")]
    Config { key: &'static str, problem: String },
    #[error("cannot read gossip key file {}: {source}", path.display())]
    KeyFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "gossip key file {} has mode {mode:04o}: users other than its owner may read or write it, and with the key anyone can join the cluster; run `chmod 0600 {}`",
        path.display(),
        path.display()
    )]
    KeyFileMode { path: PathBuf, mode: u32 },
    #[error(
        "gossip key file {} holds no key; write one hex key per line (e.g. `openssl rand -hex 32`)",
        path.display()
    )]
    NoKey { path: PathBuf },
    #[error(
        "gossip key file {}, line {line}: not a hex key; write each key as hex digits (e.g. `openssl rand -hex 32`)",
        path.display()
    )]
    KeyNotHex { path: PathBuf, line: usize },
    #[error(
        "gossip key file {}, line {line}: key is {len} bytes; it must be at least 32 bytes (64 hex digits)",
        path.display()
    )]
    KeyTooShort {
        path: PathBuf,
        line: usize,
        len: usize,
    },
    #[error(
        "gossip key file {} holds {count} keys; keep at most 2: the signing key, then the previous one while a rotation rolls out",
        path.display()
    )]
    TooManyKeys { path: PathBuf, count: usize },
    #[error("cannot start gossip on {listen}: {message}")]
    Start { listen: SocketAddr, message: String },
    #[error("gossip stopped: {0}")]
    Stopped(String),
}

impl GossipError {
    /// Low-cardinality label for an error metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            GossipError::Config { .. } => "config",
            GossipError::KeyFile { .. }
            | GossipError::KeyFileMode { .. }
            | GossipError::NoKey { .. }
            | GossipError::KeyNotHex { .. }
            | GossipError::KeyTooShort { .. }
            | GossipError::TooManyKeys { .. } => "key_file",
            GossipError::Start { .. } => "start",
            GossipError::Stopped(_) => "stopped",
        }
    }
}
