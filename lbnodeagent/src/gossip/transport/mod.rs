//! The authenticated UDP transport: chitchat's `Transport` whose every
//! datagram on the wire is a signed [`frame`](super::frame).
//!
//! chitchat keeps its envelope codec crate-private, so the only public way to
//! turn a `ChitchatEnvelope` into bytes and back is chitchat's own
//! `UdpSocket`. Each opened socket therefore runs a small loopback relay:
//!
//! ```text
//!            send(to, env)                           recv()
//! chitchat ─────────────▶ codec (chitchat UdpSocket, 127.0.0.1:c) ◀──────── decoded envelope
//!                           │  encodes env, sends to port[to]         ▲  from_addr = port[peer]
//!                           ▼                                         │  (rewritten to peer)
//!                     port[to] (127.0.0.1:p, connected to codec) ─────┘
//!                           │  we read, sign, send      ▲  we verify, then inject
//!                           ▼                           │
//!                        wire (listen address) ◀────── network
//! ```
//!
//! One loopback "port" socket per peer carries both directions: bytes the
//! codec sends to `port[P]` are for peer P, and what we inject through
//! `port[P]` reaches the codec with `port[P]` as source, which maps back to
//! P. No FIFO pairing is assumed anywhere, so a late or lost loopback
//! datagram can never shift one peer's message onto another. A port is only
//! opened for a peer chitchat sends to, or once a whole message from it has
//! verified, so forged or misdirected datagrams open none. Ports idle for a
//! while are closed once there are more than [`MAX_PORTS`]; a closed port
//! stays bound (and mapped to its peer) for [`PORT_GRACE`] first, so that a
//! message injected through it and still queued at the codec is delivered as
//! its peer's, and its port number cannot be reused for another peer while
//! such a message may be pending.
//!
//! A frame names its receiver (see `frame`), and one addressed elsewhere is
//! dropped. It is for this socket when its destination is the socket's own
//! address, or one of the addresses given to
//! [`AuthTransport::with_destinations`] (the advertise address, which a NAT
//! may make different from any local one). With a wildcard listen address
//! (`0.0.0.0`, `::`), any local address of the host on our port counts:
//! peers address this node by its advertise address, but replies go to the
//! source address of what we sent, which the kernel picks and which on a
//! multi-homed host may be another of ours. Whether an address is local is
//! asked of the kernel (binding a socket to it succeeds only if it is) and
//! cached for a few seconds. Where binding to foreign addresses is allowed
//! (`net.ipv4.ip_nonlocal_bind`, `net.ipv6.ip_nonlocal_bind`), that answer
//! means nothing, and only the configured destinations are accepted.
//!
//! Datagrams at the codec that are not from one of our ports are dropped
//! and counted; chitchat's own warning for each one it cannot decode is
//! replaced by one line a minute with their number (see `codec_junk`).
//!
//! The wire socket is read by a task of its own ([`read_wire`]): the
//! failure detector's frames (their payload starts with its mark) are
//! verified there, under a replay state of their own, and handed to the
//! detector, so its probes are answered however long chitchat's loop is
//! busy; every other datagram is queued for chitchat's socket. The detector
//! sends through a duplicate of the wire socket, signing under a sender id
//! of its own ([`ProbeNet`] for [`AuthTransport`]).
//!
//! `recv` is cancel-safe (chitchat polls it inside `select!`): its only await
//! points are `recv` on the codec socket and on the reader's queue, both
//! cancel-safe, and everything between taking a wire datagram and handing
//! its payload to the codec (verification, replay state, reassembly,
//! injection) is synchronous, with injection a non-blocking `send` on a std
//! socket.

mod ports;
mod verify;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use async_trait::async_trait;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport, UdpSocket as CodecSocket};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tracing::instrument::WithSubscriber;
use tracing::{debug, warn};

use super::codec_junk::CodecJunk;
use super::counters::AuthCounters;
use super::frame::{Inbound, MAX_DATAGRAM, Outbound, Reject, Verified, canonical};
use super::keys::GossipKeys;
use super::link::{ProbeLink, ProbeNet, ProbeSend};
pub use ports::bind_udp;
use ports::{Destinations, PORT_IDLE, Port, on_wire};
use verify::{Backlog, Verifier, Warnings, read_keys, read_wire};

/// Loopback port sockets kept open before idle ones are closed. A node
/// exchanges with about six random peers per gossip round, so even in a
/// 1 000-node cluster far fewer than this are busy at any moment; the cap
/// keeps file descriptors bounded however large the cluster grows.
pub const MAX_PORTS: usize = 512;
/// How long a closed port stays bound: far longer than chitchat takes to read
/// what the codec has queued (ten gossip rounds), short enough that closed
/// ports do not pile up.
pub const PORT_GRACE: Duration = Duration::from_secs(1);
/// How long the kernel's answer to "is this address one of ours" is reused.
const LOCAL_PROBE_TTL: Duration = Duration::from_secs(10);
/// Addresses whose answer is cached at once; only authenticated frames add
/// to it.
const MAX_LOCAL_PROBES: usize = 256;
/// How long `send` waits for the codec's bytes on loopback. Loopback
/// delivery is immediate; this only bounds the stall of chitchat's loop if
/// the kernel dropped the datagram.
const LOOPBACK_TIMEOUT: Duration = Duration::from_millis(250);
/// Receive buffer: larger than any valid datagram, so an oversized one is
/// seen whole and counted instead of silently truncated.
const RECV_BUF: usize = 65_536;
/// Datagrams queued for chitchat, and messages for the failure detector,
/// before new ones are dropped.
const INBOX: usize = 4_096;

/// Wall-clock milliseconds since the Unix epoch. Frames carry this time, so
/// it must be real time (nodes compare it); tests pass in their own.
#[derive(Clone)]
pub struct WallClock(Arc<dyn Fn() -> u64 + Send + Sync>);

impl WallClock {
    pub fn system() -> WallClock {
        WallClock(Arc::new(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0)
        }))
    }

    pub fn from_fn(f: impl Fn() -> u64 + Send + Sync + 'static) -> WallClock {
        WallClock(Arc::new(f))
    }

    pub fn now_ms(&self) -> u64 {
        (self.0)()
    }
}

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WallClock")
    }
}

/// chitchat `Transport` that signs and verifies every datagram.
#[derive(Clone, Debug)]
pub struct AuthTransport {
    /// Shared with every opened socket, so a key reload (SIGHUP during a
    /// rotation) takes effect without restarting gossip.
    keys: Arc<RwLock<GossipKeys>>,
    replay_window: Duration,
    max_datagram: usize,
    /// Accepted as a frame's destination besides the socket's own address.
    destinations: Vec<SocketAddr>,
    clock: WallClock,
    counters: Arc<AuthCounters>,
    /// The failure detector's links on opened sockets, by listen address,
    /// until [`ProbeNet::attach`] takes them.
    probes: PendingProbes,
    /// Every node's identity: when set, gossip state in a node's name is
    /// handed to chitchat only where that node signed it (see `signed`).
    identities: Option<Arc<crate::identity::Identities>>,
}

#[derive(Clone, Default)]
struct PendingProbes(Arc<std::sync::Mutex<HashMap<SocketAddr, ProbeLink>>>);

impl std::fmt::Debug for PendingProbes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingProbes")
    }
}

impl AuthTransport {
    pub fn new(keys: GossipKeys, replay_window: Duration) -> AuthTransport {
        Self::with_clock(keys, replay_window, WallClock::system())
    }

    pub fn with_clock(
        keys: GossipKeys,
        replay_window: Duration,
        clock: WallClock,
    ) -> AuthTransport {
        AuthTransport {
            keys: Arc::new(RwLock::new(keys)),
            replay_window,
            max_datagram: MAX_DATAGRAM,
            destinations: Vec::new(),
            clock,
            counters: Arc::default(),
            probes: PendingProbes::default(),
            identities: None,
        }
    }

    /// Checks each node's part of every delta received against that
    /// node's identity before chitchat merges it (see `signed`): what a
    /// key holder forges in another node's name is dropped.
    pub fn with_identities(
        mut self,
        identities: Arc<crate::identity::Identities>,
    ) -> AuthTransport {
        self.identities = Some(identities);
        self
    }

    /// Splits messages above `bytes` (at least about 32 kB) in two. For
    /// tests: chitchat's own messages rarely exceed what one datagram holds
    /// with our overhead, and this makes them take the fragment path.
    pub fn with_max_datagram(mut self, bytes: usize) -> AuthTransport {
        self.max_datagram = bytes;
        self
    }

    /// Addresses peers may send to that reach this node, besides the
    /// socket's own: the advertise address (needed when it is not a local
    /// address, behind a NAT, or when the host allows binding to foreign
    /// addresses), and any other address seeds name this node by. Frames
    /// addressed anywhere else are dropped as replays (see `frame`).
    pub fn with_destinations(
        mut self,
        destinations: impl IntoIterator<Item = SocketAddr>,
    ) -> AuthTransport {
        self.destinations
            .extend(destinations.into_iter().map(canonical));
        self
    }

    /// Replaces the keys for every socket already opened and to come: the
    /// next datagram is signed and verified with the new set.
    pub fn set_keys(&self, keys: GossipKeys) {
        *self
            .keys
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = keys;
    }

    pub fn counters(&self) -> Arc<AuthCounters> {
        self.counters.clone()
    }

    /// Opens the concrete socket (the trait object hides its type; tests want
    /// it to inspect port counts).
    pub async fn open_socket(&self, listen_addr: SocketAddr) -> anyhow::Result<AuthSocket> {
        let bound = bind_udp(listen_addr)
            .with_context(|| format!("failed to bind gossip socket {listen_addr}/udp"))?;
        bound.set_nonblocking(true)?;
        // The detector sends through a plain duplicate: a `send_to` that
        // never waits and, unlike tokio's `try_send_to`, does not depend on
        // readiness the reactor may not have seen yet on a fresh socket.
        let probe_wire = bound.try_clone()?;
        let wire = Arc::new(tokio::net::UdpSocket::from_std(bound)?);
        let local = wire.local_addr()?;
        let (probe_inbox, recv) = mpsc::channel(INBOX);
        let (to_chitchat, from_wire) = mpsc::channel(INBOX);
        let backlog = Arc::new(Backlog::default());
        let reader = tokio::spawn(read_wire(
            wire.clone(),
            to_chitchat,
            backlog.clone(),
            self.verifier(local),
            probe_inbox,
        ));
        let probe_send = Arc::new(ProbeSender {
            v6: local.is_ipv6(),
            wire: probe_wire,
            outbound: std::sync::Mutex::new(Outbound::new(sender_id(local))),
            keys: self.keys.clone(),
            clock: self.clock.clone(),
            counters: self.counters.clone(),
        });
        self.probes
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(
                listen_addr,
                ProbeLink {
                    send: probe_send,
                    recv,
                },
            );
        let codec = CodecSocket::open((Ipv4Addr::LOCALHOST, 0).into()).await?;
        let codec_addr = codec.local_addr()?;
        let (codec_log, codec_junk) = CodecJunk::dispatch(self.counters.clone());
        Ok(AuthSocket {
            send_warned: None,
            send_unreported: 0,
            wire,
            local,
            from_wire,
            backlog,
            reader,
            codec,
            codec_addr,
            codec_log,
            codec_junk,
            ports: HashMap::new(),
            by_port: HashMap::new(),
            closing: VecDeque::new(),
            max_ports: MAX_PORTS,
            verifier: self.verifier(local),
            identities: self.identities.clone(),
            state_warned: None,
            keys: self.keys.clone(),
            outbound: Outbound::new(sender_id(local)).with_max_datagram(self.max_datagram),
            clock: self.clock.clone(),
            counters: self.counters.clone(),
            send_buf: vec![0u8; RECV_BUF].into_boxed_slice(),
        })
    }
}

impl AuthTransport {
    /// Signed one-off messages (what the failure detector and the beats
    /// send) from a socket of their own bound to `bind`, beside no
    /// gossip: `cleanup` speaks for a dead agent whose port may still be
    /// held. Answers to it are not read.
    pub fn sender(&self, bind: SocketAddr) -> io::Result<Arc<dyn ProbeSend>> {
        let wire = bind_udp(bind)?;
        let local = wire.local_addr()?;
        Ok(Arc::new(ProbeSender {
            v6: local.is_ipv6(),
            wire,
            outbound: std::sync::Mutex::new(Outbound::new(sender_id(local))),
            keys: self.keys.clone(),
            clock: self.clock.clone(),
            counters: self.counters.clone(),
        }))
    }

    fn verifier(&self, local: SocketAddr) -> Verifier {
        Verifier {
            inbound: Inbound::new(self.replay_window.as_millis() as u64),
            destinations: Destinations::new(local, self.destinations.clone()),
            keys: self.keys.clone(),
            clock: self.clock.clone(),
            counters: self.counters.clone(),
            warnings: Warnings::default(),
        }
    }
}

impl ProbeNet for AuthTransport {
    fn attach(&self, listen: SocketAddr) -> Result<ProbeLink, String> {
        self.probes
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&listen)
            .ok_or_else(|| format!("no gossip socket is open on {listen}"))
    }
}

/// Signs the failure detector's messages and sends them on the gossip
/// socket, beside chitchat's (under a sender id of its own, so the two
/// streams of sequence numbers do not collide in peers' replay windows).
struct ProbeSender {
    /// The socket is IPv6 (dual-stack when a wildcard): IPv4 peers are
    /// reached at their mapped addresses.
    v6: bool,
    wire: std::net::UdpSocket,
    outbound: std::sync::Mutex<Outbound>,
    keys: Arc<RwLock<GossipKeys>>,
    clock: WallClock,
    counters: Arc<AuthCounters>,
}

impl ProbeSend for ProbeSender {
    fn send(&self, to: SocketAddr, payload: &[u8]) {
        let now = self.clock.now_ms();
        let sealed = self
            .outbound
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .seal(&read_keys(&self.keys), payload, to, now);
        let Ok(frames) = sealed else {
            AuthCounters::add(&self.counters.send_failed, 1);
            return;
        };
        let on_wire = on_wire(self.v6, to);
        for frame in &frames {
            match self.wire.send_to(frame, on_wire) {
                Ok(sent) => {
                    AuthCounters::add(&self.counters.frames_sent, 1);
                    AuthCounters::add(&self.counters.bytes_sent, sent as u64);
                }
                Err(error) => {
                    AuthCounters::add(&self.counters.send_failed, 1);
                    debug!(%to, %error, "failure-detector message not sent");
                }
            }
        }
    }
}

#[async_trait]
impl Transport for AuthTransport {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        Ok(Box::new(self.open_socket(listen_addr).await?))
    }
}

/// Distinct per opened socket so sequence numbers never collide across
/// restarts; it is under the MAC, so it needs to be unique, not secret.
fn sender_id(local: SocketAddr) -> u64 {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let mut hash = Sha256::new();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    hash.update(now.to_be_bytes());
    hash.update(std::process::id().to_be_bytes());
    hash.update(local.to_string().as_bytes());
    hash.update(OPENED.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    let digest = hash.finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(id)
}

/// A port closed to make room, kept bound for [`PORT_GRACE`].
struct Closing {
    port: Port,
    since: tokio::time::Instant,
}

pub struct AuthSocket {
    wire: Arc<tokio::net::UdpSocket>,
    local: SocketAddr,
    /// Datagrams for chitchat from the wire reader, their tags checked
    /// (see [`read_wire`]), and the bytes they hold.
    from_wire: mpsc::Receiver<io::Result<(Verified, SocketAddr)>>,
    backlog: Arc<Backlog>,
    reader: tokio::task::JoinHandle<()>,
    codec: CodecSocket,
    codec_addr: SocketAddr,
    /// The subscriber the codec is polled under, and the tally it keeps of
    /// undecodable datagrams not yet logged (see `codec_junk`).
    codec_log: tracing::Dispatch,
    codec_junk: Arc<AtomicU64>,
    ports: HashMap<SocketAddr, Port>,
    /// Port socket address → peer, for open and closing ports.
    by_port: HashMap<SocketAddr, SocketAddr>,
    /// Closed ports in their grace period, oldest first.
    closing: VecDeque<Closing>,
    max_ports: usize,
    /// Verifies chitchat's datagrams.
    verifier: Verifier,
    identities: Option<Arc<crate::identity::Identities>>,
    /// State refused in a node's name, logged at most once a minute.
    state_warned: Option<tokio::time::Instant>,
    keys: Arc<RwLock<GossipKeys>>,
    outbound: Outbound,
    clock: WallClock,
    counters: Arc<AuthCounters>,
    send_buf: Box<[u8]>,
    /// Sends the kernel refused (a partition by a firewall, no route),
    /// logged at most once a minute with their count: chitchat would log
    /// each one, with a backtrace, several times a second.
    send_warned: Option<tokio::time::Instant>,
    send_unreported: u64,
}

impl Drop for AuthSocket {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl AuthSocket {
    /// Open loopback port sockets (one per recent peer).
    pub fn ports(&self) -> usize {
        self.ports.len()
    }

    /// Ports closed to make room and still in their grace period.
    pub fn closing_ports(&self) -> usize {
        self.closing.len()
    }

    fn port_for(&mut self, peer: SocketAddr) -> io::Result<&mut Port> {
        self.release_closed_ports();
        if !self.ports.contains_key(&peer) {
            if self.ports.len() >= self.max_ports {
                self.close_idle_ports();
            }
            let port = Port::open(self.codec_addr)?;
            self.by_port.insert(port.local, peer);
            self.ports.insert(peer, port);
        }
        let port = self.ports.get_mut(&peer).expect("inserted above");
        port.last_used = tokio::time::Instant::now();
        Ok(port)
    }

    /// Closes ports idle for [`PORT_IDLE`]; if none is, the least recently
    /// used one, so the count stays bounded.
    fn close_idle_ports(&mut self) {
        let now = tokio::time::Instant::now();
        let mut idle: Vec<SocketAddr> = self
            .ports
            .iter()
            .filter(|(_, p)| now.duration_since(p.last_used) >= PORT_IDLE)
            .map(|(peer, _)| *peer)
            .collect();
        if idle.is_empty()
            && let Some((peer, _)) = self.ports.iter().min_by_key(|(_, p)| p.last_used)
        {
            idle.push(*peer);
        }
        for peer in idle {
            if let Some(port) = self.ports.remove(&peer) {
                // Still bound and mapped: see the module doc.
                self.closing.push_back(Closing { port, since: now });
            }
        }
        // Bounded like the open ones: past that, the oldest go at once.
        while self.closing.len() > self.max_ports {
            if let Some(gone) = self.closing.pop_front() {
                self.by_port.remove(&gone.port.local);
            }
        }
    }

    /// Unbinds closed ports whose grace period is over.
    fn release_closed_ports(&mut self) {
        let now = tokio::time::Instant::now();
        while self
            .closing
            .front()
            .is_some_and(|c| now.duration_since(c.since) >= PORT_GRACE)
        {
            if let Some(gone) = self.closing.pop_front() {
                self.by_port.remove(&gone.port.local);
            }
        }
    }

    /// Signs `payload` and sends it to `to`; returns wire bytes sent.
    async fn send_sealed(&mut self, to: SocketAddr, len: usize) -> anyhow::Result<usize> {
        let now = self.clock.now_ms();
        let sealed = self
            .outbound
            .seal(&read_keys(&self.keys), &self.send_buf[..len], to, now);
        let frames = match sealed {
            Ok(frames) => frames,
            Err(_) => {
                AuthCounters::add(&self.counters.send_failed, 1);
                AuthCounters::add(&self.counters.send_too_large, 1);
                warn!(%to, len, "gossip message too large even in two datagrams; dropped");
                return Ok(0);
            }
        };
        if frames.len() > 1 {
            AuthCounters::add(&self.counters.messages_fragmented, 1);
        }
        self.counters
            .largest_sent
            .fetch_max(len as u64, Ordering::Relaxed);
        let mut sent = 0;
        let on_wire = on_wire(self.local.is_ipv6(), to);
        for frame in &frames {
            match self.wire.send_to(frame, on_wire).await {
                Ok(n) => {
                    sent += n;
                    AuthCounters::add(&self.counters.frames_sent, 1);
                }
                Err(error) => {
                    // Lost as a datagram on the wire would be: chitchat
                    // gossips again next round.
                    AuthCounters::add(&self.counters.send_failed, 1);
                    self.send_unreported += 1;
                    if Warnings::due(&mut self.send_warned) {
                        warn!(%to, %error, failures = self.send_unreported,
                            "cannot send gossip; counted in hostlb_agent_gossip_send_failed_total and logged at most once a minute");
                        self.send_unreported = 0;
                    }
                    break;
                }
            }
        }
        AuthCounters::add(&self.counters.bytes_sent, sent as u64);
        Ok(sent)
    }

    /// Drops from a message each node's part that its node did not sign
    /// (see `signed`), before chitchat sees it; `None` when nothing of it
    /// is left to read.
    fn check_state(&mut self, message: Vec<u8>, from: SocketAddr) -> Option<Vec<u8>> {
        let Some(identities) = &self.identities else {
            return Some(message);
        };
        let counters = &self.counters;
        let warned = &mut self.state_warned;
        let filtered = super::signed::filter_message(&message, identities, |id, o| {
            counters.state_refused(&o);
            let bad = matches!(o, super::signed::Outcome::Refused(_));
            if bad && Warnings::due(warned) {
                warn!(node = %id.node_id, generation = id.generation_id, %from, outcome = ?o,
                    "gossip state in a node's name that the node did not sign; dropped (a key holder forging it, or a key the records have not told yet); logged once a minute, counted in hostlb_agent_gossip_state_refused_total");
            } else {
                debug!(node = %id.node_id, %from, outcome = ?o, "gossip state held back");
            }
        });
        match filtered {
            super::signed::Filtered::Unchanged => Some(message),
            super::signed::Filtered::Replaced(m) => Some(m),
            super::signed::Filtered::Unreadable => {
                self.counters.reject(Reject::Malformed);
                None
            }
        }
    }

    /// Verifies one wire datagram and, once a whole message is there, hands
    /// it to the codec through the sender's port. Synchronous on purpose:
    /// see the module doc on cancel-safety.
    fn accept_wire(&mut self, datagram: &Verified, from: SocketAddr) {
        self.backlog.give_back(datagram.len());
        let Some(message) = self.verifier.open_verified(datagram, from) else {
            return;
        };
        let message = match self.check_state(message, from) {
            Some(m) => m,
            None => return,
        };
        if message.len() > MAX_DATAGRAM {
            // Cannot travel over loopback either; chitchat never emits one.
            self.counters.reject(Reject::Oversized);
            return;
        }
        let injected = self
            .port_for(from)
            .and_then(|port| port.socket.send(&message));
        match injected {
            Ok(_) => AuthCounters::add(&self.counters.messages_accepted, 1),
            Err(error) => {
                AuthCounters::add(&self.counters.dropped_loopback, 1);
                debug!(%from, %error, "verified gossip message lost on loopback");
            }
        }
    }
}

fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::OutOfMemory
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

#[async_trait]
impl Socket for AuthSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.local)
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        let port_addr = self.port_for(to)?.local;
        // Anything already queued on this port is for `to` as well (a reply
        // whose bytes came late): forward it before the new one.
        let mut sent = 0;
        while let Some(len) = self.ports[&to].try_recv(&mut self.send_buf) {
            sent += self.send_sealed(to, len).await?;
        }
        self.codec
            .send(port_addr, envelope)
            .await
            .context("failed to encode gossip message")?;
        let port = &self.ports[&to];
        let len = match port
            .recv(&mut self.send_buf, LOOPBACK_TIMEOUT)
            .await
            .context("loopback relay failed")?
        {
            Some(len) => len,
            None => {
                // Still on its way: the next send to `to` forwards it.
                AuthCounters::add(&self.counters.send_failed, 1);
                return Ok(SendOutcome {
                    num_bytes_sent: sent,
                });
            }
        };
        sent += self.send_sealed(to, len).await?;
        Ok(SendOutcome {
            num_bytes_sent: sent,
        })
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            self.verifier.warnings.codec_junk(&self.codec_junk);
            tokio::select! {
                biased;
                decoded = self.codec.recv().with_subscriber(self.codec_log.clone()) => {
                    let mut outcome = decoded?;
                    match self.by_port.get(&outcome.from_addr) {
                        Some(peer) => {
                            outcome.from_addr = *peer;
                            self.verifier.warnings.codec_junk(&self.codec_junk);
                            return Ok(outcome);
                        }
                        None => {
                            // Not one of our ports (a local process, or a port
                            // closed while its message was queued).
                            AuthCounters::add(&self.counters.dropped_loopback, 1);
                        }
                    }
                }
                received = self.from_wire.recv() => match received {
                    Some(Ok((datagram, from))) => self.accept_wire(&datagram, from),
                    Some(Err(error)) => return Err(error).context("gossip socket failed"),
                    None => anyhow::bail!("gossip socket reader stopped"),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chitchat::{ChitchatMessage, ProtocolVersion};

    use super::*;
    use crate::gossip::PROBE_MARK;
    use crate::gossip::frame::{Header, seal_one};

    fn envelope() -> ChitchatEnvelope {
        // The only message whose contents the public API can build.
        ChitchatEnvelope {
            version: ProtocolVersion::V0,
            message: ChitchatMessage::BadCluster,
        }
    }

    fn transport(key: u8) -> AuthTransport {
        AuthTransport::new(
            GossipKeys::from_keys(&[[key; 32]]).unwrap(),
            Duration::from_secs(30),
        )
    }

    async fn open(t: &AuthTransport) -> AuthSocket {
        t.open_socket((Ipv4Addr::LOCALHOST, 0).into())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn messages_and_replies_reach_the_real_peer() {
        let (ta, tb) = (transport(1), transport(1));
        let (mut a, mut b) = (open(&ta).await, open(&tb).await);
        let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        a.send(b_addr, envelope()).await.unwrap();
        let got = b.recv().await.unwrap();
        assert_eq!(got.from_addr, a_addr, "from_addr rewritten to the peer");
        assert_eq!(got.envelope, envelope());
        b.send(got.from_addr, envelope()).await.unwrap();
        let reply = a.recv().await.unwrap();
        assert_eq!(reply.from_addr, b_addr);
        assert_eq!(b.ports(), 1, "one loopback port per peer, both ways");
        let sent = ta.counters().snapshot();
        assert_eq!(sent.frames_sent, 1);
        assert_eq!(sent.messages_accepted, 1);
        // A BadCluster envelope is its 4-byte header.
        assert_eq!(sent.bytes_sent, (4 + crate::gossip::frame::OVERHEAD) as u64);
    }

    #[tokio::test]
    async fn recv_is_cancel_safe_under_select() {
        let (ta, tb) = (transport(2), transport(2));
        let (mut a, mut b) = (open(&ta).await, open(&tb).await);
        let b_addr = b.local_addr().unwrap();
        let junk = tokio::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        const N: usize = 200;
        let sender = tokio::spawn(async move {
            for i in 0..N {
                a.send(b_addr, envelope()).await.unwrap();
                if i % 3 == 0 {
                    junk.send_to(b"not a frame", b_addr).await.unwrap();
                }
                if i % 20 == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            a
        });
        let mut received = 0;
        let mut cancelled = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while received < N && tokio::time::Instant::now() < deadline {
            tokio::select! {
                got = b.recv() => {
                    got.unwrap();
                    received += 1;
                }
                // Cancels `recv` at arbitrary points, as chitchat's gossip
                // tick does.
                () = tokio::task::yield_now() => cancelled += 1,
            }
        }
        let _a = sender.await.unwrap();
        assert_eq!(received, N, "every message survives cancellation");
        assert!(cancelled > 0, "the test did cancel recv");
        let stats = tb.counters().snapshot();
        assert_eq!(stats.dropped_malformed, N.div_ceil(3) as u64);
        assert_eq!(stats.messages_accepted, N as u64);
    }

    #[tokio::test]
    async fn detector_messages_share_the_socket_without_chitchat_reading_it() {
        let (ta, tb, tx) = (transport(7), transport(7), transport(8));
        let any: SocketAddr = (Ipv4Addr::LOCALHOST, 0).into();
        let (mut a, mut b, _x) = (open(&ta).await, open(&tb).await, open(&tx).await);
        let (a_link, mut b_link, x_link) = (
            ta.attach(any).unwrap(),
            tb.attach(any).unwrap(),
            tx.attach(any).unwrap(),
        );
        assert!(ta.attach(any).is_err(), "a link is handed out once");
        let b_addr = b.local_addr().unwrap();
        let probe = [&PROBE_MARK[..], b"ping"].concat();
        // Wrong key first, then the real one; chitchat's side of b is not
        // polled at all.
        x_link.send.send(b_addr, &probe);
        a_link.send.send(b_addr, &probe);
        let (from, got) = tokio::time::timeout(Duration::from_secs(5), b_link.recv.recv())
            .await
            .expect("the detector hears a without chitchat reading")
            .unwrap();
        assert_eq!((from, got), (a.local_addr().unwrap(), probe.clone()));
        assert_eq!(tb.counters().snapshot().dropped_bad_mac, 1);
        // A replayed detector frame is dropped like a chitchat one.
        let spy = tokio::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        a_link.send.send(spy.local_addr().unwrap(), &probe);
        let mut frame = vec![0u8; RECV_BUF];
        let (len, _) = spy.recv_from(&mut frame).await.unwrap();
        spy.send_to(&frame[..len], b_addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(b_link.recv.try_recv().is_err());
        assert_eq!(tb.counters().snapshot().dropped_misdirected, 1);
        // chitchat's messages still reach chitchat, not the detector.
        a.send(b_addr, envelope()).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), b.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.envelope, envelope());
        assert!(b_link.recv.try_recv().is_err());
    }

    #[tokio::test]
    async fn reloaded_keys_apply_to_open_sockets() {
        let (ta, tb) = (transport(5), transport(6));
        let (mut a, mut b) = (open(&ta).await, open(&tb).await);
        let b_addr = b.local_addr().unwrap();
        a.send(b_addr, envelope()).await.unwrap();
        let quiet = tokio::time::timeout(Duration::from_millis(100), b.recv()).await;
        assert!(quiet.is_err(), "key 5 is not accepted by [6]");
        // Rotation step on b: [6, 5].
        tb.set_keys(GossipKeys::from_keys(&[[6u8; 32], [5u8; 32]]).unwrap());
        a.send(b_addr, envelope()).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), b.recv())
            .await
            .expect("accepted after reload")
            .unwrap();
        assert_eq!(got.from_addr, a.local_addr().unwrap());
        assert_eq!(tb.counters().snapshot().dropped_bad_mac, 1);
    }

    #[tokio::test]
    async fn foreign_and_forged_datagrams_are_counted_not_fatal() {
        let (ta, tb, tx) = (transport(3), transport(3), transport(4));
        let (mut a, mut b, mut x) = (open(&ta).await, open(&tb).await, open(&tx).await);
        let b_addr = b.local_addr().unwrap();
        // Wrong key.
        x.send(b_addr, envelope()).await.unwrap();
        // Right key, stale timestamp.
        let raw = tokio::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let keys = GossipKeys::from_keys(&[[3u8; 32]]).unwrap();
        let mut stale = Vec::new();
        let header = Header {
            fragment: 0,
            fragments: 1,
            tags: 1,
            sender: 42,
            seq: 1,
            timestamp_ms: WallClock::system().now_ms() - 60_000,
            destination: b_addr,
        };
        seal_one(&keys, &header, b"anything", &mut stale);
        raw.send_to(&stale, b_addr).await.unwrap();
        // A valid frame whose payload chitchat cannot decode is dropped by
        // chitchat's codec; a valid one after it still arrives.
        let mut undecodable = Vec::new();
        seal_one(
            &keys,
            &Header {
                timestamp_ms: WallClock::system().now_ms(),
                ..header
            },
            b"garbage",
            &mut undecodable,
        );
        raw.send_to(&undecodable, b_addr).await.unwrap();
        a.send(b_addr, envelope()).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), b.recv())
            .await
            .expect("valid message after garbage")
            .unwrap();
        assert_eq!(got.from_addr, a.local_addr().unwrap());
        let stats = tb.counters().snapshot();
        assert_eq!(stats.dropped_bad_mac, 1);
        assert_eq!(stats.dropped_stale, 1);
        // Nothing from x ever reached chitchat.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), b.recv())
                .await
                .is_err()
        );
    }

    /// The log lines emitted while it is the default subscriber, each as
    /// its fields (`message` first).
    #[derive(Clone, Default)]
    struct Lines(Arc<std::sync::Mutex<Vec<String>>>);

    impl Lines {
        fn all(&self) -> Vec<String> {
            self.0.lock().unwrap().clone()
        }
    }

    struct Fields(String);

    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{}={value:?} ", field.name()));
        }
    }

    impl tracing::Subscriber for Lines {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0.lock().unwrap().push(fields.0);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[tokio::test(flavor = "current_thread")]
    async fn junk_at_the_codec_is_counted_exactly_and_logged_once_a_minute() {
        let lines = Lines::default();
        let _default = tracing::subscriber::set_default(lines.clone());
        let (ta, tb) = (transport(5), transport(5));
        let (mut a, mut b) = (open(&ta).await, open(&tb).await);
        let b_addr = b.local_addr().unwrap();
        let junk = tokio::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        // Two bursts, each followed by a real message that the codec reads
        // after them.
        for burst in 1..=2u64 {
            for _ in 0..100 {
                junk.send_to(b"not gossip", b.codec_addr).await.unwrap();
            }
            a.send(b_addr, envelope()).await.unwrap();
            let got = tokio::time::timeout(Duration::from_secs(5), b.recv())
                .await
                .expect("the message after the junk")
                .unwrap();
            assert_eq!(got.from_addr, a.local_addr().unwrap());
            assert_eq!(tb.counters().snapshot().dropped_loopback, 100 * burst);
        }
        let logged = lines.all();
        assert!(
            !logged
                .iter()
                .any(|l| l.contains("invalid-chitchat-payload")),
            "{logged:#?}"
        );
        let ours: Vec<&String> = logged
            .iter()
            .filter(|l| l.contains("gossip codec"))
            .collect();
        assert_eq!(ours.len(), 1, "{logged:#?}");
        assert!(ours[0].contains("datagrams=100"), "{}", ours[0]);
        // Other events while the codec is polled still reach the subscriber.
        let other = tokio::time::timeout(
            Duration::from_millis(50),
            async {
                warn!("polled");
            }
            .with_subscriber(b.codec_log.clone()),
        );
        other.await.unwrap();
        assert!(lines.all().iter().any(|l| l.contains("polled")));
    }

    #[tokio::test(start_paused = true)]
    async fn the_junk_line_carries_the_count_of_what_it_held_back() {
        let lines = Lines::default();
        let _default = tracing::subscriber::set_default(lines.clone());
        let mut warnings = Warnings::default();
        let unreported = AtomicU64::new(0);
        warnings.codec_junk(&unreported);
        assert!(lines.all().is_empty(), "nothing to report");
        unreported.store(5, Ordering::Relaxed);
        warnings.codec_junk(&unreported);
        unreported.fetch_add(7, Ordering::Relaxed);
        tokio::time::advance(Duration::from_secs(30)).await;
        warnings.codec_junk(&unreported);
        assert_eq!(lines.all().len(), 1);
        tokio::time::advance(Duration::from_secs(31)).await;
        warnings.codec_junk(&unreported);
        let all = lines.all();
        assert_eq!(all.len(), 2, "{all:#?}");
        assert!(all[0].contains("datagrams=5"), "{}", all[0]);
        assert!(all[1].contains("datagrams=7"), "{}", all[1]);
    }

    /// A frame as `a` sent it to `spy`: what an eavesdropper captures.
    async fn capture(a: &mut AuthSocket) -> Vec<u8> {
        let spy = tokio::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        a.send(spy.local_addr().unwrap(), envelope()).await.unwrap();
        let mut buf = vec![0u8; RECV_BUF];
        let (len, _) = spy.recv_from(&mut buf).await.unwrap();
        buf.truncate(len);
        buf
    }

    #[tokio::test]
    async fn a_frame_replayed_to_another_node_is_dropped_and_opens_no_port() {
        let (ta, tc) = (transport(8), transport(8));
        let (mut a, mut c) = (open(&ta).await, open(&tc).await);
        let captured = capture(&mut a).await;
        // Replayed to c from a spoofed source, within the replay window.
        let attacker = tokio::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        attacker
            .send_to(&captured, c.local_addr().unwrap())
            .await
            .unwrap();
        let delivered = tokio::time::timeout(Duration::from_millis(200), c.recv()).await;
        assert!(
            delivered.is_err(),
            "nothing reaches chitchat, so nothing is answered"
        );
        assert_eq!(c.ports(), 0, "no loopback port for the spoofed source");
        let stats = tc.counters().snapshot();
        assert_eq!(stats.dropped_misdirected, 1, "{stats:?}");
        assert_eq!(stats.messages_accepted, 0);
        // Addressed to c, the same key and clock get through.
        a.send(c.local_addr().unwrap(), envelope()).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), c.recv())
            .await
            .expect("a frame for c")
            .unwrap();
        assert_eq!(got.from_addr, a.local_addr().unwrap());
    }

    #[tokio::test]
    async fn destinations_are_the_own_address_local_ones_on_a_wildcard_and_configured_ones() {
        let nat: SocketAddr = "203.0.113.7:9999".parse().unwrap();
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        let mut specific = Destinations::new(addr("127.0.0.1:7000"), vec![nat]);
        assert!(specific.accepts(addr("127.0.0.1:7000")));
        assert!(specific.accepts(addr("[::ffff:127.0.0.1]:7000")));
        assert!(specific.accepts(nat));
        assert!(!specific.accepts(addr("127.0.0.1:7001")));
        assert!(
            !specific.accepts(addr("127.0.0.2:7000")),
            "local, but not ours"
        );

        let mut wildcard = Destinations::new(addr("0.0.0.0:7000"), vec![nat]);
        assert!(wildcard.accepts(nat));
        assert!(!wildcard.accepts(addr("127.0.0.1:7001")));
        assert!(
            !wildcard.accepts(addr("192.0.2.55:7000")),
            "not an address of this host"
        );
        assert!(!wildcard.accepts(addr("[::1]:7000")), "an IPv4 socket");
        assert!(!wildcard.accepts(addr("0.0.0.0:7000")));
        if wildcard.nonlocal_bind {
            // This host binds anything: only what was configured counts.
            assert!(!wildcard.accepts(addr("127.0.0.1:7000")));
        } else {
            assert!(wildcard.accepts(addr("127.0.0.1:7000")));
            assert!(
                wildcard.accepts(addr("127.0.0.2:7000")),
                "all of 127/8 is local"
            );
        }
    }

    #[tokio::test]
    async fn a_closed_port_stays_bound_and_delivers_what_it_had_queued() {
        // chitchat's encoding of an envelope, as the codec would send it.
        let encoder = CodecSocket::open((Ipv4Addr::LOCALHOST, 0).into())
            .await
            .unwrap();
        let sink = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let mut encoder = encoder;
        encoder
            .send(sink.local_addr().unwrap(), envelope())
            .await
            .unwrap();
        let mut encoded = vec![0u8; RECV_BUF];
        let len = sink.recv(&mut encoded).unwrap();
        encoded.truncate(len);

        let tb = transport(9);
        let mut b = open(&tb).await;
        b.max_ports = 1;
        let p1: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let p2: SocketAddr = "127.0.0.1:2".parse().unwrap();
        // A verified message from p1 is injected, and before chitchat reads
        // it, a message from p2 needs the only port.
        let port1 = b.port_for(p1).unwrap().local;
        b.ports[&p1].socket.send(&encoded).unwrap();
        b.port_for(p2).unwrap();
        assert_eq!((b.ports(), b.closing_ports()), (1, 1));
        assert!(
            std::net::UdpSocket::bind(port1).is_err(),
            "p1's port number cannot go to anyone else yet"
        );
        let got = tokio::time::timeout(Duration::from_secs(5), b.recv())
            .await
            .expect("the queued message is delivered")
            .unwrap();
        assert_eq!(got.from_addr, p1, "as p1's");
        // After the grace period it is let go.
        tokio::time::sleep(PORT_GRACE + Duration::from_millis(50)).await;
        b.release_closed_ports();
        assert_eq!(b.closing_ports(), 0);
        assert!(std::net::UdpSocket::bind(port1).is_ok());
    }

    /// Sends `n` datagrams of `len` bytes from a plain socket and waits
    /// until `t`'s reader has seen them all (or the kernel dropped the
    /// rest: the count stops moving).
    async fn flood(
        t: &AuthTransport,
        to: SocketAddr,
        datagram: impl Fn(usize) -> Vec<u8>,
        n: usize,
    ) {
        let sender = tokio::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        for i in 0..n {
            sender.send_to(&datagram(i), to).await.unwrap();
            if i % 8 == 0 {
                // Lets the reader keep up, so most reach it.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let mut seen = u64::MAX;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = t.counters().snapshot().frames_received;
            if now == seen {
                return;
            }
            seen = now;
        }
    }

    /// Junk the size of the largest datagram, flooded at a socket whose
    /// chitchat side reads nothing: not one byte of it is queued, and each
    /// is counted as what it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unauthenticated_datagrams_are_never_queued() {
        let t = transport(5);
        let b = open(&t).await;
        let to = b.local_addr().unwrap();
        let forged = |i: usize| {
            // Our magic and a plausible header, a wrong tag.
            let mut d = vec![i as u8; 60_000];
            d[..4].copy_from_slice(&crate::gossip::frame::MAGIC);
            d[4] = 0;
            d[5] = 1;
            d[6] = 1;
            d
        };
        flood(&t, to, forged, 300).await;
        let stats = t.counters().snapshot();
        assert!(stats.frames_received >= 100, "{stats:?}");
        assert_eq!(stats.dropped_bad_mac, stats.frames_received, "{stats:?}");
        assert_eq!(b.backlog.held(), 0, "nothing unauthenticated is kept");
        assert_eq!(stats.dropped_backlog, 0);
    }

    /// A key holder's flood of valid datagrams is queued only up to the
    /// byte bound; the rest is dropped and counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn what_is_queued_is_bounded_in_bytes() {
        let t = transport(6);
        let b = open(&t).await;
        let to = b.local_addr().unwrap();
        let keys = GossipKeys::from_keys(&[[6; 32]]).unwrap();
        let signed = |i: usize| {
            let header = Header {
                fragment: 0,
                fragments: 1,
                tags: 1,
                sender: 7,
                seq: i as u64 + 1,
                timestamp_ms: t.clock.now_ms(),
                destination: to,
            };
            let mut out = Vec::new();
            seal_one(&keys, &header, &vec![0u8; 60_000], &mut out);
            out
        };
        flood(&t, to, signed, 400).await;
        let stats = t.counters().snapshot();
        let held = b.backlog.held();
        assert!(held <= Backlog::MAX_BYTES, "{held}");
        assert!(
            held > Backlog::MAX_BYTES - 70_000,
            "filled to the bound: {held} ({stats:?})"
        );
        assert!(stats.dropped_backlog > 0, "{stats:?}");
        assert_eq!(
            b.from_wire.len() as u64 * 60_081,
            held,
            "the bound counts what the queue holds"
        );
    }
}
