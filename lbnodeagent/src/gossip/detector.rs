//! Failure detection by SWIM (foca), beside chitchat.
//!
//! chitchat learns that a peer lives from the heartbeats in every
//! exchange's digest, and a digest lists every member: the bytes a node
//! spends to notice a crash within a given time grow with the cluster (at
//! 1,000 members about 750 kB/s per node for a one-second detection). SWIM
//! probes one member per period, asks three others to probe it when it
//! does not answer, and spreads what it learns on the back of its probes:
//! a node's traffic does not grow with the cluster, and a crash is noticed
//! within about two periods plus the suspicion timeout, then spread in a
//! few more. So chitchat carries what each node publishes (prefixes, MACs,
//! held VIPs), which changes rarely and may be paced, and this detector
//! says who is up; a node is a member when both agree (see `membership`).
//!
//! # Identity
//!
//! A [`Peer`] is the node name, its chitchat generation and its gossip
//! address, plus a rejoin counter: a node that others declared down (a
//! partition, a long stall) cannot refute that and rejoins under the next
//! counter. Two identities at one address are resolved by (generation,
//! rejoin), so a restarted agent replaces its old self at once.
//!
//! # Wire
//!
//! Detector messages travel on the gossip socket, in the same signed frames
//! as chitchat's (keys, replay window, destination binding all apply), and
//! their payload starts with [`PROBE_MARK`], which no chitchat message
//! starts with (chitchat's begin with its own two-byte magic). A message is
//! at most [`MAX_PACKET`] bytes, one unfragmented datagram. How the link is
//! provided is [`ProbeNet`]'s business: the authenticated transport on UDP,
//! [`MemProbes`] in memory for tests and the scale benchmark.
//!
//! # Timing
//!
//! With period P (the gossip interval, 100 ms): a probe waits 0.4 P for a
//! direct answer, then asks four members to probe; at the end of the
//! period the silent member becomes suspect, and down after the suspicion
//! timeout (see [`SUSPECT_PERIODS`]: 4 periods up to 10 members, 8 at
//! 1,000), long enough for a slow but live member to hear of the suspicion
//! and refute it. News spreads on probes and by gossiping it to three
//! members every half period. Received messages are handled before due
//! timers, so a node that was stalled counts the answers that arrived
//! meanwhile before it calls anyone silent.
//!
//! # At rest
//!
//! Probes are most of what an agent sends when nothing happens, and on a
//! quiet cluster they only confirm what is already known. So once the
//! detector has had no news for [`QUIET_PERIODS`] periods (no member up,
//! suspect or down to spread, no probe unanswered) it starts each probe
//! [`REST_PERIODS`] periods after the last rather than one: three times
//! fewer probes and answers. Everything else keeps its pace: a probe still
//! waits 0.4 P for its answer, and the moment one goes unanswered the
//! detector is busy again, so the silent member is suspect at the end of
//! the ordinary period and down after the same suspicion timeout. What
//! rest costs is the wait until some node probes a member that died: at
//! three members, up to three slower cycles' extra (see
//! `bounds::REST_WAIT`). Owners are watched by their sessions' beats, not
//! by this, so a host that held VIPs is taken over as fast at rest.

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use foca::{AccumulatingRuntime, Config, Foca, Identity, OwnedNotification, PostcardCodec, Timer};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::link::{PROBE_MARK, ProbeLink, ProbeNet, ProbeSend};

/// Largest detector message, mark included: one datagram on a 1,500-byte
/// MTU with the frame, UDP and IPv4/IPv6 headers.
pub const MAX_PACKET: usize = 1_300;
/// Suspicion timeout in probe periods: this many, plus as many again per
/// tenfold members beyond ten (4 periods up to 10 members, 6 at 100, 8 at
/// 1,000), so a suspect has a few rounds to hear of it and refute it while
/// news takes longer to cross a larger cluster.
pub const SUSPECT_PERIODS: u32 = 2;
/// Members asked to probe a silent one: with 10% of datagrams lost, a live
/// member is suspected after about one probe in 400 instead of one in 130
/// with three.
const INDIRECT_PROBES: usize = 4;
/// At rest a probe starts this many periods after the last one (see the
/// module doc).
pub const REST_PERIODS: u32 = 3;
/// Periods without news before the detector is at rest: news takes a few
/// periods to reach everyone (foca passes each update on six times or
/// more, three members every half period), and every node that hears it
/// is busy again for as long.
pub const QUIET_PERIODS: u32 = 10;
/// Received messages queued for the detector before new ones are dropped.
const INBOX: usize = 4_096;
/// A node is asked to let us in at most this often.
const ANNOUNCE_EVERY: Duration = Duration::from_secs(1);
/// Nodes asked per request: joining a 1,000-node cluster takes a few
/// seconds of small bursts, not one burst of 1,000 datagrams.
const ANNOUNCE_BATCH: usize = 32;
/// How long a node declared down is remembered, so its stale messages do
/// not make it a member again (as long as chitchat keeps a dead node).
const REMEMBER_DOWN: Duration = Duration::from_secs(15 * 60);

/// Who a detector member is (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Peer {
    pub node: String,
    pub generation: u64,
    pub rejoin: u16,
    pub addr: SocketAddr,
}

impl Peer {
    /// A peer known only by address (a seed), or by chitchat's identity:
    /// foca accepts an announce addressed to any identity at its address.
    pub fn new(node: impl Into<String>, generation: u64, addr: SocketAddr) -> Peer {
        Peer {
            node: node.into(),
            generation,
            rejoin: 0,
            addr,
        }
    }
}

impl Identity for Peer {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Peer {
            rejoin: self.rejoin.wrapping_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        (self.generation, self.rejoin) > (adversary.generation, adversary.rejoin)
    }
}

/// The members the detector holds up, this node excluded: each node name
/// with its generations up (one, unless a restarted node's old self is
/// still there). Views look every node up by name on every rebuild, so a
/// lookup allocates nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Up(HashMap<String, Vec<u64>>);

impl Up {
    pub fn contains(&self, node: &str, generation: u64) -> bool {
        self.0
            .get(node)
            .is_some_and(|generations| generations.contains(&generation))
    }

    /// Nodes up.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromIterator<(String, u64)> for Up {
    fn from_iter<I: IntoIterator<Item = (String, u64)>>(members: I) -> Up {
        let mut up = Up::default();
        for (node, generation) in members {
            up.0.entry(node).or_default().push(generation);
        }
        up
    }
}

/// In-memory [`ProbeNet`] for tests and benchmarks, with optional loss and
/// per-sender counts of datagrams and bytes.
#[derive(Clone, Default)]
pub struct MemProbes(Arc<Mutex<MemState>>);

#[derive(Default)]
struct MemState {
    links: HashMap<SocketAddr, mpsc::Sender<(SocketAddr, Vec<u8>)>>,
    /// Fraction of datagrams dropped, and the generator that picks them.
    loss: Option<(f64, SmallRng)>,
    sent: HashMap<SocketAddr, (u64, u64)>,
    /// Pairs that cannot reach each other, either way.
    cut: HashSet<(SocketAddr, SocketAddr)>,
}

impl MemProbes {
    /// Drops each datagram with probability `loss`.
    pub fn with_loss(loss: f64) -> MemProbes {
        let net = MemProbes::default();
        if loss > 0.0 {
            net.lock().loss = Some((loss, SmallRng::seed_from_u64(0x9E37_79B9_7F4A_7C15)));
        }
        net
    }

    /// Starts the counts of [`sent`](Self::sent) over, as a measurement
    /// begins.
    pub fn reset(&self) {
        self.lock().sent.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemState> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Partitions `a` from `b`, both ways.
    pub fn cut(&self, a: SocketAddr, b: SocketAddr) {
        let mut state = self.lock();
        state.cut.insert((a, b));
        state.cut.insert((b, a));
    }

    /// Undoes [`cut`](Self::cut).
    pub fn heal(&self, a: SocketAddr, b: SocketAddr) {
        let mut state = self.lock();
        state.cut.remove(&(a, b));
        state.cut.remove(&(b, a));
    }

    /// Datagrams and payload bytes `from` has sent since the start or the
    /// last [`reset`](Self::reset).
    pub fn sent(&self, from: SocketAddr) -> (u64, u64) {
        self.lock().sent.get(&from).copied().unwrap_or_default()
    }
}

struct MemSend {
    net: MemProbes,
    from: SocketAddr,
}

impl ProbeSend for MemSend {
    fn send(&self, to: SocketAddr, payload: &[u8]) {
        let mut state = self.net.lock();
        let counts = state.sent.entry(self.from).or_default();
        counts.0 += 1;
        counts.1 += payload.len() as u64;
        if let Some((loss, rng)) = &mut state.loss
            && rng.random_bool(*loss)
        {
            return;
        }
        if state.cut.contains(&(self.from, to)) {
            return;
        }
        if let Some(link) = state.links.get(&to) {
            let _ = link.try_send((self.from, payload.to_vec()));
        }
    }
}

impl ProbeNet for MemProbes {
    fn attach(&self, listen: SocketAddr) -> Result<ProbeLink, String> {
        let (tx, recv) = mpsc::channel(INBOX);
        self.lock().links.insert(listen, tx);
        Ok(ProbeLink {
            send: Arc::new(MemSend {
                net: self.clone(),
                from: listen,
            }),
            recv,
        })
    }
}

/// foca's settings for `members` other members at probe period `period`.
pub fn foca_config(period: Duration, members: usize) -> Config {
    let periods = SUSPECT_PERIODS as f64 * (1.0 + (members.max(10) as f64).log10());
    // Every node passes an update on this many times; a node that none of
    // those copies reaches learns of a crash only by probing the dead node
    // itself, which can take as many periods as there are members. With
    // 4 × log10 members, one crash in five at 500 members reached a last
    // node after 11 s; 6 × makes each node's expected copies e^2 more
    // (P(missed) e^-16 instead of e^-10 at 500 members).
    let max_transmissions = (((members + 1) as f64).log10() * 6.0).clamp(6.0, 255.0) as u8;
    Config {
        probe_period: period,
        probe_rtt: period * 2 / 5,
        num_indirect_probes: NonZeroUsize::new(INDIRECT_PROBES).expect("non-zero"),
        max_transmissions: NonZeroU8::new(max_transmissions).expect("at least 6"),
        suspect_to_down_after: period.mul_f64(periods),
        remove_down_after: Some(REMEMBER_DOWN),
        max_packet_size: NonZeroUsize::new(MAX_PACKET - PROBE_MARK.len()).expect("non-zero"),
        // Tells a member others declared down, so it rejoins at once.
        notify_down_members: true,
        // Fills gaps in the member list (a Feed answers each announce).
        periodic_announce: Some(foca::PeriodicParams {
            frequency: Duration::from_secs(10),
            num_members: NonZeroUsize::new(1).expect("non-zero"),
        }),
        // Heals a split: members of the other side were declared down.
        periodic_announce_to_down_members: Some(foca::PeriodicParams {
            frequency: Duration::from_secs(15),
            num_members: NonZeroUsize::new(2).expect("non-zero"),
        }),
        periodic_gossip: Some(foca::PeriodicParams {
            frequency: period / 2,
            num_members: NonZeroUsize::new(3).expect("non-zero"),
        }),
    }
}

/// Counters for the agent's metrics.
#[derive(Debug, Default)]
pub struct DetectorCounters {
    /// Messages foca refused (undecodable or malformed: another release).
    pub rejected: AtomicU64,
    /// Members declared down.
    pub downs: AtomicU64,
}

enum Command {
    Announce(Vec<Peer>),
    Leave(oneshot::Sender<()>),
}

/// A running detector task.
pub struct Detector {
    commands: mpsc::UnboundedSender<Command>,
    /// The owner sessions' side of the link, until the agent takes it.
    beats: std::sync::Mutex<Option<super::link::BeatLink>>,
    up: watch::Receiver<Arc<Up>>,
    counters: Arc<DetectorCounters>,
    task: JoinHandle<()>,
}

impl Detector {
    pub fn start(me: Peer, period: Duration, link: ProbeLink) -> Detector {
        let generation = me.generation;
        let seed = {
            let digest = Sha256::digest(format!("{}#{}#{:?}", me.node, me.generation, me.addr));
            u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
        };
        let foca = Foca::new(
            me,
            foca_config(period, 0),
            SmallRng::seed_from_u64(seed),
            PostcardCodec,
        );
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (up_tx, up) = watch::channel(Arc::new(Up::default()));
        let counters = Arc::new(DetectorCounters::default());
        let (beat_tx, beat_rx) = mpsc::channel(super::link::BEAT_INBOX);
        let beats = super::link::BeatLink {
            generation,
            send: link.send.clone(),
            recv: beat_rx,
        };
        let task = tokio::spawn(
            Task {
                foca,
                runtime: AccumulatingRuntime::new(),
                timers: Timers::default(),
                send: link.send,
                recv: link.recv,
                beats: beat_tx,
                commands: commands_rx,
                up: up_tx,
                period,
                members: 0,
                announced: HashMap::new(),
                counters: counters.clone(),
                out: Vec::with_capacity(MAX_PACKET),
                leaving: false,
                pace: Pace::new(period, Instant::now()),
            }
            .run(),
        );
        Detector {
            commands,
            beats: std::sync::Mutex::new(Some(beats)),
            up,
            counters,
            task,
        }
    }

    pub fn up(&self) -> watch::Receiver<Arc<Up>> {
        self.up.clone()
    }

    /// The beats' link (see `beats`), once.
    pub fn take_beats(&self) -> Option<super::link::BeatLink> {
        self.beats
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }

    pub fn counters(&self) -> Arc<DetectorCounters> {
        self.counters.clone()
    }

    /// Asks these nodes to let us in (each at most once a second): the
    /// nodes gossip knows that the detector does not hold up yet.
    pub fn announce(&self, peers: Vec<Peer>) {
        if !peers.is_empty() {
            let _ = self.commands.send(Command::Announce(peers));
        }
    }

    /// Declares this node down to a few members, who spread it, and stops.
    pub async fn leave(&self) {
        let (done, wait) = oneshot::channel();
        if self.commands.send(Command::Leave(done)).is_ok() {
            let _ = wait.await;
        }
    }
}

impl Drop for Detector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// foca's timers, due first on top.
#[derive(Default)]
struct Timers {
    heap: BinaryHeap<std::cmp::Reverse<(Instant, u64)>>,
    timers: HashMap<u64, Timer<Peer>>,
    next: u64,
    /// foca's periodic gossip, every half period: it sends only while
    /// there is news to spread, so with none it waits for the next wake-up
    /// something else makes (at most a period away: the next probe) rather
    /// than waking the host 20 times a second for nothing.
    gossip: Option<(Instant, Timer<Peer>)>,
    /// The next probe, at foca's time: at rest it starts later by the
    /// stretch handed to [`Timers::next_due`] and [`Timers::pop_due`], and
    /// the moment the detector is busy again it is due at foca's own time
    /// (never earlier, so each probe cycle is one foca could have run).
    probe: Option<(Instant, Timer<Peer>)>,
}

impl Timers {
    fn push(&mut self, at: Instant, timer: Timer<Peer>) {
        match timer {
            Timer::PeriodicGossip(_) => self.gossip = Some((at, timer)),
            Timer::ProbeRandomMember(_) => self.probe = Some((at, timer)),
            timer => {
                self.next += 1;
                self.heap.push(std::cmp::Reverse((at, self.next)));
                self.timers.insert(self.next, timer);
            }
        }
    }

    /// When to wake next; `news` when foca has updates to gossip, and the
    /// next probe `stretch` later than foca asked (at rest).
    fn next_due(&self, news: bool, stretch: Duration) -> Option<Instant> {
        let heap = self.heap.peek().map(|std::cmp::Reverse((at, _))| *at);
        let gossip = self.gossip.as_ref().filter(|_| news).map(|(at, _)| *at);
        let probe = self.probe.as_ref().map(|(at, _)| *at + stretch);
        heap.into_iter().chain(gossip).chain(probe).min()
    }

    fn pop_due(&mut self, now: Instant, stretch: Duration) -> Option<Timer<Peer>> {
        if self.gossip.as_ref().is_some_and(|(at, _)| *at <= now) {
            return self.gossip.take().map(|(_, timer)| timer);
        }
        // In time order, the heap's first at a tie: a probe cycle's
        // indirect stage must run before the next cycle checks it.
        let probe = self
            .probe
            .as_ref()
            .map(|(at, _)| *at + stretch)
            .filter(|at| *at <= now);
        let heap = self
            .heap
            .peek()
            .map(|std::cmp::Reverse((at, id))| (*at, *id))
            .filter(|(at, _)| *at <= now);
        match (heap, probe) {
            (Some((at, id)), probe) if probe.is_none_or(|p| at <= p) => {
                self.heap.pop();
                self.timers.remove(&id)
            }
            (_, Some(_)) => self.probe.take().map(|(_, timer)| timer),
            _ => None,
        }
    }
}

/// Whether the detector is at rest (see the module doc): when it last had
/// news, and the probe under way, with whether its member answered.
struct Pace {
    period: Duration,
    news_at: Instant,
    probed: Option<(SocketAddr, bool)>,
}

impl Pace {
    /// Busy at first: a starting node has members to learn.
    fn new(period: Duration, now: Instant) -> Pace {
        Pace {
            period,
            news_at: now,
            probed: None,
        }
    }

    /// Something changed: a member up, suspect or down to spread.
    fn news(&mut self, now: Instant) {
        self.news_at = now;
    }

    /// How much later than foca asked the next probe starts: nothing
    /// while busy, [`REST_PERIODS`] - 1 periods at rest.
    fn stretch(&self, now: Instant) -> Duration {
        if now.saturating_duration_since(self.news_at) >= self.period * QUIET_PERIODS {
            self.period * (REST_PERIODS - 1)
        } else {
            Duration::ZERO
        }
    }

    /// A probe of the member at `addr` began.
    fn probing(&mut self, addr: SocketAddr) {
        self.probed = Some((addr, false));
    }

    /// A message came from `addr`.
    fn heard(&mut self, addr: SocketAddr) {
        if let Some((probed, heard)) = &mut self.probed
            && *probed == addr
        {
            *heard = true;
        }
    }

    /// The probe of `addr` had its time for a direct answer: if none came,
    /// the detector is busy again, so that the member is suspect at the end
    /// of the ordinary period, not of a slow one.
    fn answer_due(&mut self, addr: SocketAddr, now: Instant) {
        if let Some((probed, heard)) = self.probed.take()
            && probed == addr
            && !heard
        {
            self.news(now);
        }
    }
}

struct Task {
    foca: Foca<Peer, PostcardCodec, SmallRng, foca::NoCustomBroadcast>,
    runtime: AccumulatingRuntime<Peer>,
    timers: Timers,
    send: Arc<dyn ProbeSend>,
    recv: mpsc::Receiver<(SocketAddr, Vec<u8>)>,
    /// Beats go on to the agent (dropped while nobody reads them).
    beats: mpsc::Sender<super::link::Arrived>,
    commands: mpsc::UnboundedReceiver<Command>,
    up: watch::Sender<Arc<Up>>,
    period: Duration,
    /// Member count the current config was made for.
    members: usize,
    announced: HashMap<SocketAddr, Instant>,
    counters: Arc<DetectorCounters>,
    out: Vec<u8>,
    /// This node asked to leave: foca then reports itself defunct, which
    /// is what was asked for, not trouble.
    leaving: bool,
    pace: Pace,
}

impl Task {
    async fn run(mut self) {
        loop {
            let news = self.foca.updates_backlog() > 0;
            let stretch = self.pace.stretch(Instant::now());
            let due = self
                .timers
                .next_due(news, stretch)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                // Messages first: after a stall (a busy host), the answers
                // already queued must count before the timers that would
                // call their senders silent.
                biased;
                received = self.recv.recv() => match received {
                    Some((from, payload)) => self.receive(from, &payload),
                    None => return,
                },
                command = self.commands.recv() => match command {
                    Some(Command::Announce(peers)) => self.announce(peers),
                    Some(Command::Leave(done)) => {
                        self.leaving = true;
                        if let Err(error) = self.foca.leave_cluster(&mut self.runtime) {
                            debug!(%error, "detector: leave");
                        }
                        self.flush();
                        let _ = done.send(());
                        return;
                    }
                    None => return,
                },
                () = tokio::time::sleep_until(due) => {
                    while let Ok((from, payload)) = self.recv.try_recv() {
                        self.receive(from, &payload);
                    }
                    let now = Instant::now();
                    let stretch = self.pace.stretch(now);
                    while let Some(timer) = self.timers.pop_due(now, stretch) {
                        if let Timer::SendIndirectProbe { probed_id, .. } = &timer {
                            self.pace.answer_due(probed_id.addr, now);
                        }
                        if let Err(error) = self.foca.handle_timer(timer, &mut self.runtime) {
                            debug!(%error, "detector: timer");
                        }
                    }
                }
            }
            self.flush();
        }
    }

    fn receive(&mut self, from: SocketAddr, payload: &[u8]) {
        self.pace.heard(from);
        if payload.starts_with(&super::link::BEAT_MARK) {
            let _ = self.beats.try_send(super::link::Arrived {
                from,
                payload: payload.to_vec(),
                at: std::time::Instant::now(),
            });
            return;
        }
        let Some(data) = payload.strip_prefix(&PROBE_MARK) else {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if let Err(error) = self.foca.handle_data(data, &mut self.runtime) {
            // Our own reflection (DataFromOurselves) is harmless; anything
            // else is an authenticated peer we cannot read.
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            debug!(%from, %error, "detector message refused");
        }
    }

    fn announce(&mut self, peers: Vec<Peer>) {
        let now = Instant::now();
        self.announced
            .retain(|_, at| now.duration_since(*at) < ANNOUNCE_EVERY);
        let mut sent = 0;
        for peer in peers {
            if sent == ANNOUNCE_BATCH {
                break;
            }
            if peer.addr == self.foca.identity().addr || self.announced.contains_key(&peer.addr) {
                continue;
            }
            self.announced.insert(peer.addr, now);
            if let Err(error) = self.foca.announce(peer, &mut self.runtime) {
                debug!(%error, "detector: announce");
            }
            sent += 1;
        }
    }

    /// Sends what foca queued, arms its timers and publishes membership
    /// changes.
    fn flush(&mut self) {
        while let Some((to, data)) = self.runtime.to_send() {
            self.out.clear();
            self.out.extend_from_slice(&PROBE_MARK);
            self.out.extend_from_slice(&data);
            self.send.send(to.addr, &self.out);
        }
        let now = Instant::now();
        while let Some((after, timer)) = self.runtime.to_schedule() {
            if let Timer::SendIndirectProbe { probed_id, .. } = &timer {
                self.pace.probing(probed_id.addr);
            }
            self.timers.push(now + after, timer);
        }
        let mut changed = false;
        // Updates still to spread, or any word about membership: busy.
        let mut news = self.foca.updates_backlog() > 0;
        while let Some(notification) = self.runtime.to_notify() {
            news = true;
            match notification {
                OwnedNotification::MemberUp(peer) => {
                    debug!(node = %peer.node, addr = %peer.addr, "detector: member up");
                    changed = true;
                }
                OwnedNotification::MemberDown(peer) => {
                    self.counters.downs.fetch_add(1, Ordering::Relaxed);
                    info!(node = %peer.node, addr = %peer.addr, "detector: member down");
                    changed = true;
                }
                OwnedNotification::Rename(..) => changed = true,
                OwnedNotification::Rejoin(me) => {
                    warn!(
                        rejoin = me.rejoin,
                        "detector: peers declared this node down; rejoined"
                    );
                }
                OwnedNotification::Defunct if self.leaving => {
                    debug!("detector: left the cluster");
                }
                OwnedNotification::Defunct => {
                    warn!("detector: peers declared this node down and it could not rejoin");
                }
                _ => {}
            }
        }
        if news {
            self.pace.news(now);
        }
        if changed {
            let up: Up = self
                .foca
                .iter_members()
                .map(|m| (m.id().node.clone(), m.id().generation))
                .collect();
            self.retune(up.len());
            self.up.send_replace(Arc::new(up));
        }
    }

    /// Keeps the suspicion timeout and retransmissions matched to the
    /// cluster size (foca takes new values at run time).
    fn retune(&mut self, members: usize) {
        let config = foca_config(self.period, members);
        let current = foca_config(self.period, self.members);
        if config.suspect_to_down_after != current.suspect_to_down_after
            || config.max_transmissions != current.max_transmissions
        {
            match self.foca.set_config(config) {
                Ok(()) => self.members = members,
                Err(error) => debug!(%error, "detector: retune"),
            }
        } else {
            self.members = members;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(node: &str, generation: u64, rejoin: u16) -> Peer {
        Peer {
            rejoin,
            ..Peer::new(node, generation, "10.0.0.1:7934".parse().unwrap())
        }
    }

    #[test]
    fn a_rejoin_or_a_restart_wins_the_address() {
        let first = peer("n1", 5, 0);
        let renewed = first.renew().unwrap();
        assert_eq!(renewed.rejoin, 1);
        assert!(renewed.win_addr_conflict(&first));
        assert!(!first.win_addr_conflict(&renewed));
        let restarted = peer("n1", 6, 0);
        assert!(restarted.win_addr_conflict(&renewed));
    }

    /// foca's periodic gossip sends nothing without news: it wakes the
    /// host only when there is some, and otherwise rides on the next
    /// wake-up for something else.
    #[test]
    fn periodic_gossip_wakes_only_for_news() {
        let t0 = Instant::now();
        let mut timers = Timers::default();
        timers.push(t0 + Duration::from_millis(50), Timer::PeriodicGossip(0));
        timers.push(t0 + Duration::from_millis(100), Timer::ProbeRandomMember(0));
        assert_eq!(
            timers.next_due(false, Duration::ZERO),
            Some(t0 + Duration::from_millis(100))
        );
        assert_eq!(
            timers.next_due(true, Duration::ZERO),
            Some(t0 + Duration::from_millis(50))
        );
        assert!(
            timers
                .pop_due(t0 + Duration::from_millis(49), Duration::ZERO)
                .is_none()
        );
        let due: Vec<_> =
            std::iter::from_fn(|| timers.pop_due(t0 + Duration::from_millis(100), Duration::ZERO))
                .collect();
        assert!(matches!(
            due.as_slice(),
            [Timer::PeriodicGossip(0), Timer::ProbeRandomMember(0)]
        ));
        assert_eq!(timers.next_due(true, Duration::ZERO), None);
    }

    fn indirect(addr: &str) -> Timer<Peer> {
        Timer::SendIndirectProbe {
            probed_id: Peer::new("n1", 1, addr.parse().unwrap()),
            token: 0,
        }
    }

    /// At rest the next probe starts later than foca asked, and the
    /// moment the detector is busy again it is due at foca's own time:
    /// never earlier, and never before the indirect stage of the cycle
    /// before it.
    #[test]
    fn the_next_probe_waits_at_rest_and_never_comes_early() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let rest = ms(200);
        let mut timers = Timers::default();
        timers.push(t0 + ms(40), indirect("10.0.0.1:7934"));
        timers.push(t0 + ms(100), Timer::ProbeRandomMember(0));
        assert_eq!(timers.next_due(false, rest), Some(t0 + ms(40)));
        assert!(matches!(
            timers.pop_due(t0 + ms(40), rest),
            Some(Timer::SendIndirectProbe { .. })
        ));
        assert_eq!(timers.next_due(false, rest), Some(t0 + ms(300)));
        assert!(timers.pop_due(t0 + ms(299), rest).is_none());
        // Busy again at 150 ms: due at once (foca's time has passed).
        assert_eq!(timers.next_due(false, Duration::ZERO), Some(t0 + ms(100)));
        assert!(matches!(
            timers.pop_due(t0 + ms(150), Duration::ZERO),
            Some(Timer::ProbeRandomMember(0))
        ));
        // After a stall, a cycle's indirect stage comes before the next
        // probe that checks it, even when both are overdue.
        timers.push(t0 + ms(190), indirect("10.0.0.1:7934"));
        timers.push(t0 + ms(190), Timer::ProbeRandomMember(1));
        assert!(matches!(
            timers.pop_due(t0 + ms(500), Duration::ZERO),
            Some(Timer::SendIndirectProbe { .. })
        ));
        assert!(matches!(
            timers.pop_due(t0 + ms(500), Duration::ZERO),
            Some(Timer::ProbeRandomMember(1))
        ));
    }

    /// Rest begins after [`QUIET_PERIODS`] without news, ends at the next
    /// news or at a probe whose member did not answer in its time, and a
    /// probe answered keeps it.
    #[test]
    fn rest_ends_at_news_or_an_unanswered_probe() {
        let p = Duration::from_millis(100);
        let t0 = Instant::now();
        let quiet = t0 + p * QUIET_PERIODS;
        let rest = p * (REST_PERIODS - 1);
        let a: SocketAddr = "10.0.0.1:7934".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:7934".parse().unwrap();
        let mut pace = Pace::new(p, t0);
        assert_eq!(
            pace.stretch(quiet - Duration::from_millis(1)),
            Duration::ZERO
        );
        assert_eq!(pace.stretch(quiet), rest);
        // Answered (another member's word does not count).
        pace.probing(a);
        pace.heard(b);
        pace.heard(a);
        pace.answer_due(a, quiet);
        assert_eq!(pace.stretch(quiet), rest, "an answered probe keeps rest");
        // Unanswered: busy for another quiet spell.
        pace.probing(a);
        pace.heard(b);
        pace.answer_due(a, quiet);
        assert_eq!(pace.stretch(quiet), Duration::ZERO);
        assert_eq!(pace.stretch(quiet + p * QUIET_PERIODS), rest);
        pace.news(quiet + p * QUIET_PERIODS);
        assert_eq!(pace.stretch(quiet + p * QUIET_PERIODS), Duration::ZERO);
    }

    #[test]
    fn suspicion_grows_with_log_members() {
        let p = Duration::from_millis(100);
        assert_eq!(foca_config(p, 2).suspect_to_down_after, p * 4);
        assert_eq!(foca_config(p, 100).suspect_to_down_after, p * 6);
        assert_eq!(foca_config(p, 1_000).suspect_to_down_after, p * 8);
        assert!(foca_config(p, 1_000).max_transmissions.get() >= 18);
    }

    async fn cluster(
        net: &MemProbes,
        n: u16,
        period: Duration,
    ) -> Vec<(Detector, watch::Receiver<Arc<Up>>)> {
        cluster_of_run(net, n, period, 1).await
    }

    /// `n` detectors of run `generation` (which seeds their choices).
    async fn cluster_of_run(
        net: &MemProbes,
        n: u16,
        period: Duration,
        generation: u64,
    ) -> Vec<(Detector, watch::Receiver<Arc<Up>>)> {
        let peers: Vec<Peer> = (0..n)
            .map(|i| {
                Peer::new(
                    format!("n{i}"),
                    generation,
                    SocketAddr::from(([10, 0, 0, 1], 7000 + i)),
                )
            })
            .collect();
        let mut out = Vec::new();
        for p in &peers {
            let d = Detector::start(p.clone(), period, net.attach(p.addr).unwrap());
            let up = d.up();
            out.push((d, up));
        }
        // Everyone announces to the first node, as nodes found by gossip.
        for (d, _) in &out[1..] {
            d.announce(vec![peers[0].clone()]);
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn members_join_and_a_crash_is_detected_by_all() {
        let net = MemProbes::default();
        let period = Duration::from_millis(100);
        let mut nodes = cluster(&net, 10, period).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        for (_, up) in &nodes {
            assert_eq!(up.borrow().len(), 9, "everyone sees everyone");
        }
        let (crashed, _) = nodes.pop().unwrap();
        drop(crashed);
        let start = Instant::now();
        let mut detected = Vec::new();
        for (_, up) in &mut nodes {
            up.wait_for(|up| !up.contains("n9", 1)).await.unwrap();
            detected.push(start.elapsed());
        }
        let slowest = detected.iter().max().unwrap();
        assert!(
            *slowest < Duration::from_secs(2),
            "crash seen by all within {slowest:?}"
        );
        // No live member was lost on the way.
        for (_, up) in &nodes {
            assert_eq!(up.borrow().len(), 8);
        }
    }

    /// At rest each node sends a third of the probes and answers it sent
    /// busy, and a crash from rest is still seen by every node of three in
    /// time, over many crashes at moments and with choices of their own:
    /// each node probes each of its two peers at least once in three rest
    /// cycles, then the probe's ordinary period, the suspicion timeout and
    /// half a period for the word to spread (1.45 s; 0.85 s busy). Prints
    /// the figures, ten members' too (the wait for a probe of the dead node
    /// has a longer tail there).
    #[tokio::test(start_paused = true)]
    async fn at_rest_a_third_of_the_probes_and_a_crash_still_seen_in_time() {
        let period = Duration::from_millis(100);
        for n in [3u16, 10] {
            let mut seen = Vec::new();
            let mut rates = Vec::new();
            for run in 0..100u64 {
                let net = MemProbes::default();
                let mut nodes = cluster_of_run(&net, n, period, run + 1).await;
                tokio::time::sleep(Duration::from_secs(5)).await;
                net.reset();
                tokio::time::sleep(Duration::from_secs(10)).await;
                let sent: u64 = (0..n)
                    .map(|i| net.sent(SocketAddr::from(([10, 0, 0, 1], 7000 + i))).0)
                    .sum();
                rates.push(sent as f64 / 10.0 / n as f64);
                // A crash at a moment of its own within a rest cycle.
                tokio::time::sleep(Duration::from_millis(run * 37 % 300)).await;
                let (crashed, _) = nodes.pop().unwrap();
                drop(crashed);
                let start = Instant::now();
                let last = format!("n{}", n - 1);
                for (_, up) in &mut nodes {
                    up.wait_for(|up| !up.contains(&last, run + 1))
                        .await
                        .unwrap();
                }
                seen.push(start.elapsed());
                for (_, up) in &nodes {
                    assert_eq!(up.borrow().len(), n as usize - 2, "no live member lost");
                }
            }
            seen.sort();
            rates.sort_by(f64::total_cmp);
            let (median, max) = (seen[seen.len() / 2], seen[seen.len() - 1]);
            println!(
                "{n} members at rest: {:.1} datagrams sent per node and second (median), \
                 crash seen by all: median {median:?}, max {max:?}",
                rates[rates.len() / 2]
            );
            // Busy, a node sends a probe and an answer each period (and
            // foca's gossip of news, none at rest): 20 a second.
            assert!(
                rates[rates.len() / 2] < 20.0 / REST_PERIODS as f64 + 1.0,
                "a third of the probes at rest"
            );
            if n == 3 {
                let bound = period * (3 * REST_PERIODS) + period + period * 4 + period / 2;
                assert!(max <= bound, "a crash from rest seen by all in {max:?}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_leave_is_seen_before_any_timeout() {
        let net = MemProbes::default();
        let period = Duration::from_millis(100);
        let mut nodes = cluster(&net, 5, period).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (leaving, _) = nodes.pop().unwrap();
        let start = Instant::now();
        leaving.leave().await;
        for (_, up) in &mut nodes {
            up.wait_for(|up| !up.contains("n4", 1)).await.unwrap();
        }
        assert!(
            start.elapsed() < period * 3,
            "leave spread in {:?}, faster than suspicion",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn garbage_is_counted_and_ignored() {
        let net = MemProbes::default();
        let nodes = cluster(&net, 3, Duration::from_millis(100)).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let rogue = net.attach("10.9.9.9:1".parse().unwrap()).unwrap();
        rogue
            .send
            .send("10.0.0.1:7000".parse().unwrap(), b"HLS\x01\xff\xff\xff");
        rogue
            .send
            .send("10.0.0.1:7000".parse().unwrap(), b"no mark");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(nodes[0].0.counters().rejected.load(Ordering::Relaxed), 2);
        assert_eq!(nodes[0].1.borrow().len(), 2, "membership untouched");
    }
}
