//! Membership at scale: 100 to 1,000 agents (issue figures in
//! `docs/agent-network.md`).
//!
//! `cargo bench -p lbnodeagent --bench membership` runs, for each size,
//! every agent's real `Membership` (chitchat, the published state, the view
//! builder) in one process on chitchat's in-memory transport with a paused
//! clock: time only moves when every agent is idle, so the figures are the
//! protocol's, not the two cores'. 1,000 agents on loopback UDP would need
//! about 30 000 datagrams a second of hashing and copying, which two cores
//! cannot serve without every agent falling behind its own rounds.
//!
//! What the in-memory transport leaves out is added by a cost model:
//! - on the wire, every message carries the 81-byte signed frame, 8 bytes
//!   of UDP header and 20 bytes of IPv4 header per 1,500-byte IP fragment;
//! - CPU: messages sampled during the run are replayed through the real
//!   authenticated transport over loopback, and its measured cost per
//!   message (sign, send, relay, verify, reassemble, decode) is charged per
//!   message an agent sends.
//!
//! Per agent, state is what the agent publishes: two prefixes, one MAC and
//! ten held VIPs.
//!
//! Owner sessions run beside: who watches whom comes from one real
//! election of ten VIPs per node (no preferences, so owners and the nodes
//! next in line are spread by hash), each agent keeps the core's
//! `Sessions` and sends with the agent's own beat sender over the
//! detector's link. A crash is known to the nodes next in line for the
//! victim's VIPs when each holds it suspect (its watcher's own silence, or
//! a relay); each then takes its VIPs after the pre-check on the wire
//! (30 ms), which is not run here. Memory per agent is the heap growth of the whole process
//! divided by the number of agents (each holds the whole cluster's state),
//! to which the agent's own footprint without gossip is added in the docs.
//!
//! Environment: `MEMBERSHIP_BENCH_SIZES` (default `100,250,500,1000`),
//! `MEMBERSHIP_BENCH_SECS` (measured virtual seconds, default 60),
//! `MEMBERSHIP_BENCH_CRASHES` (default 5), `MEMBERSHIP_BENCH_WARMUP`
//! (seconds between forming and measuring, default 10), `MEMBERSHIP_BENCH_LOSS` (fraction
//! of messages dropped, default 0), `MEMBERSHIP_BENCH_INTERVAL_MS` (force a
//! gossip interval), `MEMBERSHIP_BENCH_BUDGET` (bytes per second or
//! `unlimited`, instead of the shipped `gossip.max_bandwidth`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use chitchat::transport::{
    ChannelTransport, RecvOutcome, SendOutcome, Socket, Transport, TransportExt,
};
use chitchat::{
    ChitchatEnvelope, ChitchatId, ChitchatMessage, Deserializable, ProtocolVersion, Serializable,
};
use hostlb_api::{AddressRange, Prefix};
use lbnodeagent::agent::beats::{BeatCheck, Beats, Prover, drain};
use lbnodeagent::agent::core::sessions::{self, BEAT_INTERVAL, Sessions};
use lbnodeagent::agent::core::{BeatPlan, Relay};
use lbnodeagent::election::{
    Advertisement, Cluster, Election, Endpoints, Labels, Member, NodeInfo, NodeName, OnLink, Pool,
    ServiceInfo,
};
use lbnodeagent::gossip::BeatLink;
use lbnodeagent::gossip::ProbeSend;
use lbnodeagent::gossip::counting::CountingTransport;
use lbnodeagent::gossip::frame::{MAX_DATAGRAM, MAX_MESSAGE, OVERHEAD};
use lbnodeagent::gossip::{
    AuthTransport, DEFAULT_INTERVAL, DEFAULT_REPLAY_WINDOW, GossipConfig, GossipKeys, LocalState,
    MemProbes, Membership, Status,
};
use lbnodeagent::gossip::{MemberInfo, MembershipView};
use lbnodeagent::identity::{Identities, Known, NodeKey};
use tokio::time::Instant;

struct Counting;

static HEAP: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator and only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HEAP.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HEAP.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HEAP.fetch_add(new_size, Ordering::Relaxed);
        HEAP.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const KEY: [u8; 32] = [0x42; 32];
const UDP_HEADER: u64 = 8;
const IP_HEADER: u64 = 20;
const ETHERNET_MTU: u64 = 1500;

/// On-the-wire bytes of one message of `len` chitchat bytes: frame, UDP
/// header, one IPv4 header per fragment.
fn wire_bytes(len: u64) -> u64 {
    let udp = len + OVERHEAD as u64 + UDP_HEADER;
    let fragments = udp.div_ceil(ETHERNET_MTU - IP_HEADER);
    udp + fragments * IP_HEADER
}

fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Kubernetes-style node names: what digests carry for every member.
fn node_name(i: usize) -> String {
    format!("worker-{i:04}.rack{:02}.dc1", i / 40)
}

fn node_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 20, (i / 250) as u8, (i % 250) as u8 + 1], 7934))
}

/// The agent's generation is its start time in ms shifted left by 20 bits
/// (see `generation_now` in `gossip/membership.rs`); agents of a real
/// cluster started over days (restarts, upgrades), here over a week.
fn started_at(i: usize, n: usize) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let week = 604_800_000u64;
    let ms = now - week + (i as u64 * week / n.max(1) as u64) + (i as u64 * 7_919) % 1_000;
    ms << 20
}

fn node_state(i: usize) -> LocalState {
    let i = i as u32;
    LocalState {
        status: Status::Alive,
        virtual_mode: true,
        on_link: vec![
            OnLink {
                prefix: "10.20.0.0/16".parse().unwrap(),
                interface: "bond0".into(),
                announce: true,
                upstream_lost: false,
            },
            OnLink {
                prefix: "fd00:20::/64".parse().unwrap(),
                interface: "bond0".into(),
                announce: true,
                upstream_lost: false,
            },
        ]
        .into(),
        vips: (0..10u32)
            .map(|v| {
                let n = i * 10 + v;
                IpAddr::from([10, 96, (n >> 8) as u8, n as u8])
            })
            .collect::<BTreeSet<_>>()
            .into(),
        macs: [lbnodeagent::addrs::MacAddr([
            2,
            0,
            (i >> 16) as u8,
            (i >> 8) as u8,
            i as u8,
            1,
        ])]
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into(),
        revision: 0,
        digest: None,
        drained: false,
        behind: Default::default(),
    }
}

/// Counts the messages that carry a digest (SYN, SYN-ACK): each costs its
/// receiver a digest decode on top of the transport. Reports sizes as the
/// authenticated transport does, frame included, so the pacer spends what it
/// would on the wire.
#[derive(Clone)]
struct Kinds<T> {
    inner: T,
    digests: Arc<AtomicUsize>,
}

#[async_trait]
impl<T: Transport> Transport for Kinds<T> {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        Ok(Box::new(KindsSocket {
            inner: self.inner.open(listen_addr).await?,
            digests: self.digests.clone(),
        }))
    }
}

struct KindsSocket {
    inner: Box<dyn Socket>,
    digests: Arc<AtomicUsize>,
}

#[async_trait]
impl Socket for KindsSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.inner.local_addr()
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        if matches!(
            envelope.message,
            ChitchatMessage::Syn { .. } | ChitchatMessage::SynAck { .. }
        ) {
            self.digests.fetch_add(1, Ordering::Relaxed);
        }
        let mut outcome = self.inner.send(to, envelope).await?;
        outcome.num_bytes_sent += OVERHEAD;
        Ok(outcome)
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        self.inner.recv().await
    }
}

/// CPU per message of `size` encoded bytes through the real authenticated
/// transport on loopback, both ends: encode, sign, send, relay, verify,
/// decode. The message is a SYN whose cluster id pads it to the size (its
/// digest decode is charged separately, by [`digest_decode_cost`]).
fn auth_cost_per_message(size: usize) -> Duration {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let keys = || GossipKeys::from_keys(&[KEY]).unwrap();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let transport_a = AuthTransport::new(keys(), DEFAULT_REPLAY_WINDOW);
        let transport_b = AuthTransport::new(keys(), DEFAULT_REPLAY_WINDOW);
        let mut a = transport_a.open(any).await.unwrap();
        let mut b = transport_b.open(any).await.unwrap();
        let b_addr = b.local_addr().unwrap();
        let message = || ChitchatEnvelope {
            version: ProtocolVersion::V1,
            message: ChitchatMessage::Syn {
                cluster_id: "x".repeat(size.saturating_sub(16).max(1)),
                digest: Default::default(),
            },
        };
        for _ in 0..50 {
            a.send(b_addr, message()).await.unwrap();
            b.recv().await.unwrap();
        }
        let count = 2000;
        let started = cpu_time();
        for _ in 0..count {
            a.send(b_addr, message()).await.unwrap();
            b.recv().await.unwrap();
        }
        (cpu_time() - started) / count
    })
}

/// One digest of `n` members as chitchat 0.13 encodes it (protocol V1:
/// entries of id, heartbeat, GC version and max version, cut in 16 KiB
/// blocks, each compressed by zstd at its default level), with ids as the
/// agent makes them. Returns its size
/// and the CPU to decode it once.
fn digest_decode_cost(n: usize) -> (usize, Duration) {
    const BLOCK: usize = 16_384;
    let mut ids: Vec<ChitchatId> = (0..n)
        .map(|i| ChitchatId::new(node_name(i), started_at(i, n), node_addr(i)))
        .collect();
    ids.sort();
    let mut plain = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        id.serialize(&mut plain);
        // Up a day at 100 ms rounds; no GC yet; a few dozen versions.
        (864_000 + i as u64 * 37).serialize(&mut plain);
        0u64.serialize(&mut plain);
        (40 + (i as u64 % 7)).serialize(&mut plain);
    }
    let blocks: Vec<Vec<u8>> = plain
        .chunks(BLOCK)
        .map(|block| zstd::bulk::compress(block, 0).unwrap())
        .collect();
    // One tag and a u16 length per block, one end tag.
    let size = blocks.iter().map(|b| b.len() + 3).sum::<usize>() + 1;
    let runs = 200;
    let started = cpu_time();
    for _ in 0..runs {
        let mut decoded = Vec::new();
        for block in &blocks {
            decoded.extend(zstd::bulk::decompress(block, BLOCK).unwrap());
        }
        let mut cursor = &decoded[..];
        let mut entries = Vec::with_capacity(n);
        while !cursor.is_empty() {
            entries.push((
                ChitchatId::deserialize(&mut cursor).unwrap(),
                u64::deserialize(&mut cursor).unwrap(),
                u64::deserialize(&mut cursor).unwrap(),
                u64::deserialize(&mut cursor).unwrap(),
            ));
        }
        std::hint::black_box(entries);
    }
    (size, (cpu_time() - started) / runs)
}

/// The owners each node watches (index by node), each with the others
/// next in line for its VIPs, and every owner's nodes next in line: from
/// one election of ten VIPs per node among the nodes still up, as every
/// agent works it out (again once a crash has left every view).
struct Watches {
    watch: Vec<BTreeMap<NodeName, BTreeSet<NodeName>>>,
    next: BTreeMap<NodeName, BTreeSet<NodeName>>,
}

fn watches(n: usize, down: &BTreeSet<usize>) -> Watches {
    let names: Vec<String> = (0..n).map(node_name).collect();
    let services = (0..n * 10)
        .map(|k| {
            let v = k as u32 + 1;
            ServiceInfo {
                key: format!("ns/svc-{k}"),
                labels: Labels::new(),
                created: Some(k as i64),
                addresses: vec![IpAddr::from([10, 96, (v >> 8) as u8, v as u8])],
                allocated_pool: Some("default".into()),
                local_traffic: false,
                rebalance: false,
                endpoints: Endpoints {
                    any_usable: true,
                    nodes: BTreeSet::new(),
                },
                ports: Vec::new(),
            }
        })
        .collect();
    let cluster = Cluster {
        nodes: names
            .iter()
            .map(|name| NodeInfo {
                name: name.clone(),
                labels: Labels::new(),
                network_unavailable: false,
                addresses: Vec::new(),
                cordoned: false,
            })
            .collect(),
        pools: vec![Pool {
            name: "default".into(),
            labels: Labels::new(),
            created: Some(0),
            ranges: vec![AddressRange::parse("10.96.0.0/16").unwrap()],
        }],
        advertisements: vec![Advertisement {
            name: "main".into(),
            ..Default::default()
        }],
        services,
    };
    let members = names
        .iter()
        .enumerate()
        .filter(|(i, _)| !down.contains(i))
        .map(|(_, name)| Member::alive(name, ["10.96.0.0/16".parse::<Prefix>().unwrap()]));
    let runners_up = Election::new(&cluster, members).runners_up();
    Watches {
        watch: names
            .iter()
            .map(|me| sessions::watched_by(me, &runners_up))
            .collect(),
        next: runners_up
            .into_iter()
            .map(|(owner, runs)| (owner, runs.into_iter().map(|(_, r)| r).collect()))
            .collect(),
    }
}

/// When each node first held an owner suspect: (node, owner, when).
type Suspicions = Arc<Mutex<Vec<(usize, NodeName, Instant)>>>;

/// Beats sent by one node: datagrams and payload bytes.
#[derive(Default)]
struct Sent(AtomicU64, AtomicU64);

struct CountingSend {
    inner: Arc<dyn ProbeSend>,
    sent: Arc<Sent>,
}

impl ProbeSend for CountingSend {
    fn send(&self, to: SocketAddr, payload: &[u8]) {
        self.sent.0.fetch_add(1, Ordering::Relaxed);
        self.sent
            .1
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
        self.inner.send(to, payload);
    }
}

/// One agent's owner sessions: the core's `Sessions` turned every beat
/// interval (as the agent's loop at least is), the agent's beat sender.
/// Every agent's identity, as the agents read them from the records: each
/// node's key (seeded by its index), the identities all of them know, and
/// a view that says which node gossips from which address (what the beat
/// sender looks its pair keys up by).
struct Proofs {
    keys: Vec<Arc<NodeKey>>,
    identities: Arc<Identities>,
    view: tokio::sync::watch::Receiver<MembershipView>,
}

impl Proofs {
    fn new(n: usize) -> Proofs {
        let keys: Vec<Arc<NodeKey>> = (0..n)
            .map(|i| {
                let mut seed = [0u8; 32];
                seed[..8].copy_from_slice(&(i as u64 + 1).to_be_bytes());
                Arc::new(NodeKey::from_seed(seed))
            })
            .collect();
        let identities = Identities::new();
        let mut view = MembershipView::empty();
        for (i, k) in keys.iter().enumerate() {
            identities.set(&node_name(i), Known::Key(k.public()));
            view.nodes.push(Arc::new(MemberInfo {
                node: node_name(i).into(),
                gossip_addr: node_addr(i),
                ..view.local.clone()
            }));
        }
        Proofs {
            keys,
            identities,
            view: tokio::sync::watch::channel(view).1,
        }
    }
}

async fn run_sessions(
    me: usize,
    n: usize,
    link: BeatLink,
    mut watch: tokio::sync::watch::Receiver<BTreeMap<NodeName, BTreeSet<NodeName>>>,
    sent: Arc<Sent>,
    suspicions: Suspicions,
    proofs: Arc<Proofs>,
) {
    let name = node_name(me);
    let send = Arc::new(CountingSend {
        inner: link.send,
        sent,
    });
    let key = proofs.keys[me].clone();
    let beats = Beats::start(
        name.clone(),
        link.generation,
        send,
        Prover {
            key: key.clone(),
            identities: proofs.identities.clone(),
            views: proofs.view.clone(),
            counter: Arc::default(),
        },
    );
    let mut check = BeatCheck::new(key, proofs.identities.clone(), Duration::from_secs(30));
    let mut sessions = Sessions::default();
    sessions.watch(watch.borrow_and_update().clone(), |_| true);
    let mut recv = link.recv;
    let mut every = tokio::time::interval(BEAT_INTERVAL);
    let index: HashMap<NodeName, usize> = (0..n).map(|i| (node_name(i).into(), i)).collect();
    let addrs = |names: &BTreeSet<NodeName>| -> Vec<SocketAddr> {
        names.iter().map(|n| node_addr(index[n])).collect()
    };
    loop {
        let received = tokio::select! {
            _ = every.tick() => Vec::new(),
            Ok(()) = watch.changed() => {
                sessions.watch(watch.borrow_and_update().clone(), |_| true);
                Vec::new()
            }
            got = recv.recv() => match got {
                Some(first) => drain(first, &mut recv, &mut check, |_, _| true).0,
                None => return,
            },
        };
        let now = Instant::now();
        let mut suspect = Vec::new();
        for b in received {
            let subject = b.silent.as_ref().map(|s| s.node.clone());
            if b.leaving || subject.as_deref() == Some(name.as_str()) {
                continue;
            }
            if sessions.heard(b, now.into_std())
                && let Some(s) = subject
            {
                suspect.push(s);
            }
        }
        suspect.extend(sessions.expire(now.into_std()).0);
        if !suspect.is_empty() {
            let mut log = suspicions.lock().unwrap();
            log.extend(suspect.into_iter().map(|s| (me, s, now)));
        }
        beats.turned();
        if sessions.take_changed() {
            let plan = sessions.plan();
            beats.set_plan(BeatPlan {
                dense: addrs(&plan.dense),
                sparse: addrs(&plan.sparse),
                lapse: None,
                relays: plan
                    .relays
                    .iter()
                    .map(|(owner, to)| Relay {
                        node: owner.clone(),
                        generation: started_at(index[owner], n),
                        lapse: None,
                        to: addrs(to),
                    })
                    .collect(),
            });
        }
    }
}

struct Figures {
    n: usize,
    interval: Duration,
    budget: Option<u64>,
    held_per_node: f64,
    payload_per_node: f64,
    wire_per_node: f64,
    wire_max_node: f64,
    datagrams_per_node: f64,
    /// Failure detector, on the wire (included in `wire_*`).
    detector_per_node: f64,
    detector_datagrams: f64,
    largest: u64,
    send_failures: u64,
    chitchat_cpu_per_node: f64,
    auth_cpu_per_node: f64,
    digest_size: usize,
    heap_per_node: f64,
    formed_after: Duration,
    join: Duration,
    crash_all: Vec<Duration>,
    crash_each_median: Duration,
    spurious: usize,
    /// Owner sessions' beats on the wire per node: mean, and the busiest.
    beats_per_node: f64,
    beats_max_node: f64,
    /// Signing, sending and checking the beats, per agent (share of a core).
    beats_cpu_per_node: f64,
    /// Per crash: until every node next in line for the victim's VIPs
    /// held it suspect.
    sessions_all: Vec<Duration>,
    /// Nodes next in line that never held a victim suspect by sessions
    /// (they learn it from SWIM).
    sessions_missed: usize,
    /// Suspicions of live owners in the steady window.
    sessions_spurious: usize,
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[v.len() / 2]
}

async fn wait_all(
    nodes: &[(usize, Membership)],
    until: impl Fn(&lbnodeagent::gossip::MembershipView) -> bool + Clone + Send + Sync + 'static,
) -> Vec<Duration> {
    let started = Instant::now();
    let mut waits = Vec::new();
    for (_, node) in nodes {
        let mut views = node.views();
        let until = until.clone();
        waits.push(tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(600), views.wait_for(|v| until(v)))
                .await
                .expect("membership converges within 600 s")
                .unwrap();
            started.elapsed()
        }));
    }
    let mut times = Vec::new();
    for wait in waits {
        times.push(wait.await.unwrap());
    }
    times
}

struct Settings {
    secs: u64,
    crashes: usize,
    loss: f64,
    interval: Option<Duration>,
    /// Settling time after the cluster formed, before measuring.
    warmup: Duration,
    /// `None`: the shipped budget; `Some(None)`: unlimited.
    budget: Option<Option<u64>>,
}

fn measure(n: usize, settings: &Settings) -> Figures {
    let Settings {
        secs,
        crashes,
        loss,
        interval,
        warmup,
        budget,
    } = *settings;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let counting = CountingTransport::new(ChannelTransport::with_mtu(MAX_DATAGRAM));
    let digests = Arc::new(AtomicUsize::new(0));
    let kinds = Kinds {
        inner: counting.clone(),
        digests: digests.clone(),
    };
    let probes = MemProbes::with_loss(loss);
    let transport: Box<dyn Transport> = if loss > 0.0 {
        kinds.drop_message(loss)
    } else {
        Box::new(kinds)
    };
    let config = |i: usize| {
        let mut config = GossipConfig::for_test(&node_name(i), node_addr(i));
        config.seeds = (0..3).map(|s| node_addr(s).to_string()).collect();
        config.interval = interval.unwrap_or(DEFAULT_INTERVAL);
        config.generation = Some(started_at(i, n));
        if let Some(budget) = budget {
            config.max_bandwidth = budget;
        }
        config
    };
    let chosen = config(0).interval;
    let budget = config(0).max_bandwidth;
    runtime.block_on(async move {
        let heap_before = HEAP.load(Ordering::Relaxed);
        let started = Instant::now();
        let mut nodes = Vec::new();
        for i in 0..n {
            let node = Membership::start(&config(i), node_state(i), transport.as_ref(), &probes)
                .await
                .unwrap();
            nodes.push((i, node));
        }
        wait_all(&nodes, move |v| v.members.len() == n).await;
        let formed_after = started.elapsed();
        let mut down = BTreeSet::new();
        let Watches { watch, mut next } = watches(n, &down);
        let mut watch_tx = Vec::new();
        let suspicions: Suspicions = Default::default();
        let proofs = Arc::new(Proofs::new(n));
        let sent: Vec<Arc<Sent>> = (0..n).map(|_| Arc::default()).collect();
        let mut session_tasks: HashMap<usize, tokio::task::JoinHandle<()>> = HashMap::new();
        for (i, node) in &nodes {
            let link = node.take_beats().expect("the detector's beat link");
            let (tx, rx) = tokio::sync::watch::channel(watch[*i].clone());
            watch_tx.push(tx);
            let task = run_sessions(
                *i,
                n,
                link,
                rx,
                sent[*i].clone(),
                suspicions.clone(),
                proofs.clone(),
            );
            session_tasks.insert(*i, tokio::spawn(task));
        }
        tokio::time::sleep(warmup).await;

        // Steady state: traffic, CPU, spurious removals.
        let removals = Arc::new(AtomicUsize::new(0));
        let mut watchers = Vec::new();
        for (_, node) in &nodes {
            let mut views = node.views();
            let removals = removals.clone();
            watchers.push(tokio::spawn(async move {
                let mut last = views.borrow().members.len();
                while views.changed().await.is_ok() {
                    let now = views.borrow().members.len();
                    removals.fetch_add(last.saturating_sub(now), Ordering::Relaxed);
                    last = now;
                }
            }));
        }
        counting.reset();
        probes.reset();
        for s in &sent {
            s.0.store(0, Ordering::Relaxed);
            s.1.store(0, Ordering::Relaxed);
        }
        let steady_from = Instant::now();
        digests.store(0, Ordering::Relaxed);
        let held_before: u64 = nodes.iter().map(|(_, node)| node.gossip_held()).sum();
        let cpu_before = cpu_time();
        tokio::time::sleep(Duration::from_secs(secs)).await;
        let cpu = cpu_time() - cpu_before;
        let held = nodes
            .iter()
            .map(|(_, node)| node.gossip_held())
            .sum::<u64>()
            - held_before;
        let digests_per_node = digests.load(Ordering::Relaxed) as f64 / n as f64 / secs as f64;
        let heap_per_node = (HEAP.load(Ordering::Relaxed) - heap_before) as f64 / n as f64;
        let traffic = counting.traffic();
        // The failure detector's messages: one datagram each.
        let (probe_datagrams, probe_bytes) = (0..n)
            .map(|i| probes.sent(node_addr(i)))
            .fold((0, 0), |(d, b), (dd, bb)| (d + dd, b + bb));
        // Beats ride the detector's link: told apart by what the sessions
        // sent.
        let beat_wire: Vec<f64> = sent
            .iter()
            .map(|s| {
                let (d, b) = (s.0.load(Ordering::Relaxed), s.1.load(Ordering::Relaxed));
                let mean = b.checked_div(d).unwrap_or(0);
                d as f64 * wire_bytes(mean) as f64 / secs as f64
            })
            .collect();
        let beats_per_node = beat_wire.iter().sum::<f64>() / n as f64;
        let beats_max_node = beat_wire.iter().cloned().fold(0.0, f64::max);
        let (beat_datagrams, beat_bytes) = sent.iter().fold((0, 0), |(d, b), s| {
            (
                d + s.0.load(Ordering::Relaxed),
                b + s.1.load(Ordering::Relaxed),
            )
        });
        let (probe_datagrams, probe_bytes) =
            (probe_datagrams - beat_datagrams, probe_bytes - beat_bytes);
        let beat_mean = beat_bytes.checked_div(beat_datagrams).unwrap_or(0);
        let beat_datagrams_per_node = beat_datagrams as f64 / n as f64 / secs as f64;
        let probe_mean = probe_bytes.checked_div(probe_datagrams).unwrap_or(0);
        let detector_per_node =
            probe_datagrams as f64 * wire_bytes(probe_mean) as f64 / n as f64 / secs as f64;
        let detector_datagrams = probe_datagrams as f64 / n as f64 / secs as f64;
        let wire: Vec<f64> = traffic
            .values()
            .map(|t| {
                // Mean message size per socket; fragments are charged on it.
                let mean = t.bytes_sent.checked_div(t.messages_sent).unwrap_or(0);
                (t.bytes_sent + t.messages_sent * (wire_bytes(mean) - mean)) as f64 / secs as f64
                    + detector_per_node
            })
            .zip(&beat_wire)
            .map(|(w, b)| w + b)
            .collect();
        let payload: f64 =
            traffic.values().map(|t| t.bytes_sent as f64).sum::<f64>() / n as f64 / secs as f64;
        let datagrams: f64 = traffic
            .values()
            .map(|t| t.messages_sent as f64)
            .sum::<f64>()
            / n as f64
            / secs as f64;
        let largest = traffic.values().map(|t| t.largest_sent).max().unwrap_or(0);

        // A newcomer, seen by all.
        let newcomer = Membership::start(&config(n), node_state(n), transport.as_ref(), &probes)
            .await
            .unwrap();
        let name = node_name(n);
        let join = wait_all(&nodes, move |v| v.member(&name).is_some())
            .await
            .into_iter()
            .max()
            .unwrap();
        nodes.push((n, newcomer));
        tokio::time::sleep(Duration::from_secs(5)).await;
        // Stop counting before the crashes below.
        let spurious = removals.load(Ordering::Relaxed);
        let sessions_spurious = suspicions
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, _, t)| *t >= steady_from)
            .count();
        for watcher in watchers {
            watcher.abort();
        }

        // Crashes: victims spread over the cluster, never a seed.
        let mut crash_all = Vec::new();
        let mut crash_each = Vec::new();
        let mut sessions_all = Vec::new();
        let mut sessions_missed = 0;
        for k in 0..crashes {
            let victim = 3 + (k * 7919) % (nodes.len() - 3);
            let (index, node) = nodes.remove(victim);
            tokio::time::sleep(Duration::from_millis(37 * k as u64)).await;
            drop(node);
            if let Some(task) = session_tasks.remove(&index) {
                task.abort();
            }
            let crashed = Instant::now();
            let name = node_name(index);
            let times = wait_all(&nodes, {
                let name = name.clone();
                move |v| v.member(&name).is_none()
            })
            .await;
            let log = suspicions.lock().unwrap().clone();
            let mut known = Duration::ZERO;
            for follower in next.get(name.as_str()).into_iter().flatten() {
                let first = log
                    .iter()
                    .filter(|(i, s, t)| node_name(*i) == *follower && *s == name && *t >= crashed)
                    .map(|(_, _, t)| *t - crashed)
                    .min();
                match first {
                    Some(d) => known = known.max(d),
                    None => sessions_missed += 1,
                }
            }
            sessions_all.push(known);
            crash_all.push(*times.iter().max().unwrap());
            // Every view has lost the victim: the elections move on.
            down.insert(index);
            let now = watches(n, &down);
            for (i, tx) in watch_tx.iter().enumerate() {
                let _ = tx.send(now.watch[i].clone());
            }
            next = now.next;
            let mut times = times;
            crash_each.push(median(&mut times));
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let crash_each_median = median(&mut crash_each);
        for task in session_tasks.into_values() {
            task.abort();
        }
        drop(nodes);
        drop(transport);
        let mean_size = (payload / datagrams) as usize;
        // On a thread of their own: they run their own runtime.
        let (auth, probe_auth, beat_auth, (digest_size, digest_decode)) =
            std::thread::spawn(move || {
                (
                    auth_cost_per_message(mean_size),
                    auth_cost_per_message(probe_mean as usize),
                    auth_cost_per_message(beat_mean as usize),
                    digest_decode_cost(n),
                )
            })
            .join()
            .unwrap();
        Figures {
            n,
            interval: chosen,
            budget,
            held_per_node: held as f64 / n as f64 / secs as f64,
            payload_per_node: payload,
            wire_per_node: wire.iter().sum::<f64>() / n as f64,
            wire_max_node: wire.iter().cloned().fold(0.0, f64::max),
            datagrams_per_node: datagrams,
            largest,
            send_failures: counting.traffic().values().map(|t| t.send_failures).sum(),
            chitchat_cpu_per_node: cpu.as_secs_f64() / secs as f64 / n as f64,
            auth_cpu_per_node: auth.as_secs_f64() * datagrams
                + probe_auth.as_secs_f64() * detector_datagrams
                + digest_decode.as_secs_f64() * digests_per_node,
            detector_per_node,
            detector_datagrams,
            digest_size,
            heap_per_node,
            formed_after,
            join,
            crash_all,
            crash_each_median,
            spurious,
            beats_per_node,
            beats_cpu_per_node: beat_auth.as_secs_f64() * beat_datagrams_per_node,
            beats_max_node,
            sessions_all,
            sessions_missed,
            sessions_spurious,
        }
    })
}

fn main() {
    let sizes: Vec<usize> = std::env::var("MEMBERSHIP_BENCH_SIZES")
        .unwrap_or_else(|_| "100,250,500,1000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("sizes: comma-separated counts"))
        .collect();
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .map(|v| v.parse().expect("a number"))
            .unwrap_or(default)
    };
    let secs = env("MEMBERSHIP_BENCH_SECS", 60);
    let crashes = env("MEMBERSHIP_BENCH_CRASHES", 5) as usize;
    let loss: f64 = std::env::var("MEMBERSHIP_BENCH_LOSS")
        .ok()
        .map(|v| v.parse().expect("loss fraction"))
        .unwrap_or(0.0);
    let interval = std::env::var("MEMBERSHIP_BENCH_INTERVAL_MS")
        .ok()
        .map(|v| Duration::from_millis(v.parse().expect("interval in ms")));
    let budget = std::env::var("MEMBERSHIP_BENCH_BUDGET")
        .ok()
        .map(|v| (v != "unlimited").then(|| v.parse().expect("bytes per second or \"unlimited\"")));
    let settings = Settings {
        secs,
        crashes,
        loss,
        interval,
        warmup: Duration::from_secs(env("MEMBERSHIP_BENCH_WARMUP", 10)),
        budget,
    };
    println!(
        "membership bench: in-memory transport, paused clock, {secs} s measured, {crashes} crashes, loss {loss}; \
         wire = chitchat bytes + {OVERHEAD} B frame + UDP + IPv4 per 1,500-byte fragment; \
         largest message limit {} B in one datagram, {MAX_MESSAGE} B in two fragments",
        MAX_DATAGRAM - OVERHEAD
    );
    println!(
        "| members | interval | budget | SYNs held/s | payload kB/s | wire kB/s (max node) | of which detector | datagrams/s (detector) | digest | largest msg | too large | CPU/agent (chitchat + auth) | heap/agent | formed | join seen by all | crash by all median / max | crash per node median | spurious in {secs} s | of which beats kB/s (max node) | beats CPU/agent | crash known to all next in line by sessions, median / max (missed) | sessions' spurious suspicions |"
    );
    println!(
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for n in sizes {
        let mut f = measure(n, &settings);
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
        let crash_median = median(&mut f.crash_all);
        let crash_max = f.crash_all.iter().max().copied().unwrap_or_default();
        let sessions_median = median(&mut f.sessions_all);
        let sessions_max = f.sessions_all.iter().max().copied().unwrap_or_default();
        println!(
            "| {} | {:?} | {} | {:.1} | {:.1} | {:.1} ({:.1}) | {:.1} | {:.0} ({:.0}) | {} B | {} B | {} | {:.2}% + {:.2}% of a core | {:.1} MB | {:.1} s | {} | {} / {} | {} | {} | {:.1} ({:.1}) | {:.2}% | {} / {} ({}) | {} |",
            f.n,
            f.interval,
            f.budget
                .map_or("unlimited".to_string(), |b| format!("{} kB/s", b / 1000)),
            f.held_per_node,
            f.payload_per_node / 1e3,
            f.wire_per_node / 1e3,
            f.wire_max_node / 1e3,
            f.detector_per_node / 1e3,
            f.datagrams_per_node + f.detector_datagrams,
            f.detector_datagrams,
            f.digest_size,
            f.largest,
            f.send_failures,
            f.chitchat_cpu_per_node * 100.0,
            f.auth_cpu_per_node * 100.0,
            f.heap_per_node / 1e6,
            f.formed_after.as_secs_f64(),
            ms(f.join),
            ms(crash_median),
            ms(crash_max),
            ms(f.crash_each_median),
            f.spurious,
            f.beats_per_node / 1e3,
            f.beats_max_node / 1e3,
            f.beats_cpu_per_node * 100.0,
            ms(sessions_median),
            ms(sessions_max),
            f.sessions_missed,
            f.sessions_spurious,
        );
    }
}
