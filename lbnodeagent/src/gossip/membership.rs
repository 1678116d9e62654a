//! Membership: runs chitchat and the failure detector, publishes this
//! node's state, and turns the cluster state into [`MembershipView`]s for
//! the reconcile loop: a member is a node whose state chitchat carries and
//! whom the detector holds up (see `detector`).
//!
//! A view is rebuilt when the detector's up set changes, when chitchat's
//! live set changes (a node joined, was declared dead, or bumped its state
//! version: chitchat checks this at the end of each of its own rounds)
//! and, sooner, whenever a key is set (a key-change listener wakes the
//! builder the moment a delta is applied), so a `leaving` status takes
//! effect one message after it arrives rather than one round later.
//! chitchat fires no key-change event for a deleted key, so a node that
//! drops `vips.N` chunks also sets `vipchunks` (see `state`). Views are
//! only sent when they differ, so heartbeats never wake the reconcile loop.
//!
//! # Rounds: sparse at rest, at the interval while there is news
//!
//! chitchat's own rounds come [`REST_ROUNDS`] intervals apart (1 s by
//! default). Whenever any node's state changes here (a key set or deleted,
//! ours or a peer's, a node come or gone), this node runs rounds of its own
//! at the gossip interval for `BUSY_ROUNDS`, the first at once: a SYN to
//! three random live peers, as chitchat's round would send. Each node that
//! learns the news does the same, so it spreads as fast as with a round per
//! interval everywhere, while a cluster at rest sends a tenth of it.
//! Liveness does not ride on these rounds (the detector says who is up),
//! and a lost message is repaired by the next round, at rest or not.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chitchat::transport::Transport;
use chitchat::{
    Chitchat, ChitchatConfig, ChitchatHandle, ChitchatId, ListenerHandle, NodeState,
    ProtocolVersion, Version, spawn_chitchat,
};
use tokio::sync::{Mutex, Notify, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info};

use super::GossipError;
use super::config::{GossipConfig, REST_ROUNDS};
use super::detector::{Detector, Peer, Up};
use super::link::ProbeNet;
use super::pace::{Pace, PacedTransport};
use super::state::{self, LocalState, MemberInfo, Status};
pub use crate::model::MembershipView;

/// Peers told directly when this node starts leaving; the rest hear it by
/// ordinary gossip within a round or two. Each push costs a SYN carrying the
/// whole digest, so a 1 000-node cluster is not sent 1 000 of them at once.
const MAX_LEAVE_PUSH: usize = 128;
/// Runtime seeds probed per round while no peer is known.
const SEEDS_PER_ROUND_ALONE: usize = 3;
/// With peers known, one unknown seed every this many rounds: enough to merge
/// two halves that never met, cheap when seeds list nodes without an agent.
const SEED_ROUNDS_CONNECTED: u32 = 10;

/// A running gossip member. Dropping it stops gossip at once, without
/// telling anyone: peers find out through their failure detectors, exactly
/// as after a crash. Use [`Membership::leave`] to go gracefully.
pub struct Membership {
    /// This node's key: when set, every change of its own state is signed
    /// (see `signed`), so peers that check merge it.
    signer: std::sync::OnceLock<Arc<crate::identity::NodeKey>>,
    handle: Arc<ChitchatHandle>,
    chitchat: Arc<Mutex<Chitchat>>,
    id: ChitchatId,
    views: watch::Receiver<MembershipView>,
    refresh: Arc<Notify>,
    seeds: watch::Sender<Vec<SocketAddr>>,
    leaving: AtomicBool,
    interval: Duration,
    leave_rounds: u32,
    pace: Arc<Pace>,
    detector: Arc<Detector>,
    task: JoinHandle<()>,
    _listener: ListenerHandle,
}

impl Membership {
    /// Starts gossiping on `transport`, with the failure detector on
    /// `probes` (normally both the config's
    /// [`auth_transport`](GossipConfig::auth_transport); tests pass
    /// chitchat's `ChannelTransport` and [`MemProbes`](super::MemProbes)).
    pub async fn start(
        config: &GossipConfig,
        local: LocalState,
        transport: &dyn Transport,
        probes: &dyn ProbeNet,
    ) -> Result<Membership, GossipError> {
        config.validate()?;
        let advertise = config.advertise_addr()?;
        let generation = config.generation.unwrap_or_else(generation_now);
        let id = ChitchatId::new(config.node_name.as_str(), generation, advertise);
        let leaving = local.status == Status::Leaving;
        let chitchat_config = ChitchatConfig {
            chitchat_id: id.clone(),
            cluster_id: config.cluster_id.clone(),
            gossip_interval: config.interval * REST_ROUNDS,
            listen_addr: config.listen,
            seed_nodes: config.seeds.clone(),
            failure_detector_config: config.failure_detector(),
            marked_for_deletion_grace_period: config.marked_for_deletion_grace_period,
            catchup_callback: None,
            extra_liveness_predicate: Some(Box::new(state::is_live)),
            // Every node runs chitchat 0.13, which reads V1; its compressed
            // digest keeps SYNs of large clusters well inside one datagram.
            protocol_version: ProtocolVersion::V1,
        };
        let kvs = state::initial_key_values(&config.agent_version, &local);
        let start_error = |error: anyhow::Error| GossipError::Start {
            listen: config.listen,
            message: format!("{error:#}"),
        };
        let pace = Pace::new(config.max_bandwidth, config.interval);
        let paced = PacedTransport::open(transport, config.listen, pace.clone())
            .await
            .map_err(start_error)?;
        let link = probes
            .attach(config.listen)
            .map_err(|error| start_error(anyhow::anyhow!(error)))?;
        let detector = Arc::new(Detector::start(
            Peer::new(config.node_name.as_str(), generation, advertise),
            config.interval,
            link,
        ));
        let handle = spawn_chitchat(chitchat_config, kvs, &paced)
            .await
            .map_err(start_error)?;
        let chitchat = handle.chitchat();
        let refresh = Arc::new(Notify::new());
        let (listener, watcher, first) = {
            let c = chitchat.lock().await;
            let notify = refresh.clone();
            let listener = c.subscribe_event("", move |_| notify.notify_one());
            (
                listener,
                c.live_nodes_watcher(),
                ViewBuilder::default().build(&c, &detector.up().borrow()),
            )
        };
        let (views_tx, views) = watch::channel(first);
        let (seeds, seeds_rx) = watch::channel(Vec::new());
        let handle = Arc::new(handle);
        let task = tokio::spawn(
            ViewTask {
                handle: handle.clone(),
                chitchat: chitchat.clone(),
                own: [config.listen, advertise].into_iter().collect(),
                watcher,
                refresh: refresh.clone(),
                seeds: seeds_rx,
                views: views_tx,
                interval: config.interval,
                pace: pace.clone(),
                detector: detector.clone(),
                up: detector.up(),
            }
            .run(),
        );
        info!(node = %config.node_name, generation, %advertise, listen = %config.listen, "gossip started");
        Ok(Membership {
            signer: std::sync::OnceLock::new(),
            handle,
            chitchat,
            id,
            views,
            refresh,
            seeds,
            leaving: AtomicBool::new(leaving),
            interval: config.interval,
            leave_rounds: config.leave_rounds,
            pace,
            detector,
            task,
            _listener: listener,
        })
    }

    /// Signs this node's state with `key` from now on (see `signed`), the
    /// state already published first. Peers that check identities merge
    /// none of it until then.
    pub async fn sign_with(&self, key: Arc<crate::identity::NodeKey>) {
        let mut c = self.chitchat.lock().await;
        super::signed::sign_state(c.self_node_state(), &key);
        let _ = self.signer.set(key);
        drop(c);
        self.refresh.notify_one();
    }

    /// The owner sessions' link on the gossip socket, once.
    pub fn take_beats(&self) -> Option<super::link::BeatLink> {
        self.detector.take_beats()
    }

    /// Views as they change; the current one is there at once.
    pub fn views(&self) -> watch::Receiver<MembershipView> {
        self.views.clone()
    }

    pub fn view(&self) -> MembershipView {
        self.views.borrow().clone()
    }

    pub fn chitchat_id(&self) -> &ChitchatId {
        &self.id
    }

    /// The failure detector's counters, for the metrics endpoint.
    pub fn detector_counters(&self) -> Arc<super::DetectorCounters> {
        self.detector.counters()
    }

    /// SYNs the byte budget held back so far (see `pace`).
    pub fn gossip_held(&self) -> u64 {
        self.pace.held()
    }

    /// [`gossip_held`](Self::gossip_held), shared, for the metrics endpoint.
    pub fn gossip_held_counter(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.pace.held_counter()
    }

    /// The chitchat instance, for diagnostics (failure-detection timeouts,
    /// dead nodes). Hold its lock briefly: gossip waits on it.
    pub fn chitchat(&self) -> Arc<Mutex<Chitchat>> {
        self.chitchat.clone()
    }

    /// Publishes this node's state; only changed keys are gossiped. Once
    /// [`set_leaving`](Self::set_leaving) was called the status stays
    /// `leaving`, whatever `local` says, so a reconcile pass during shutdown
    /// cannot make the node a candidate again.
    pub async fn publish(&self, mut local: LocalState) {
        let mut chitchat = self.chitchat.lock().await;
        // Read under the lock that `set_leaving` sets it under: read before
        // waiting for the lock, it could be stale by the time this writes,
        // and `alive` would overwrite `leaving`.
        if self.leaving.load(Ordering::SeqCst) {
            local.status = Status::Leaving;
        }
        state::publish(chitchat.self_node_state(), &local);
        if let Some(key) = self.signer.get() {
            super::signed::sign_state(chitchat.self_node_state(), key);
        }
        drop(chitchat);
        self.refresh.notify_one();
    }

    /// Seeds handed over at run time (the InternalIPs of the cluster's
    /// Nodes), replacing the previous run-time list. chitchat's own seed list
    /// is fixed at start, so these are probed by this layer: a few per round
    /// while no peer is known, then one every few rounds if some still are
    /// not members.
    pub fn set_seeds(&self, seeds: impl IntoIterator<Item = SocketAddr>) {
        let mut seeds: Vec<SocketAddr> = seeds.into_iter().collect();
        seeds.sort();
        seeds.dedup();
        self.seeds.send_replace(seeds);
    }

    /// Publishes `leaving` and pushes it to live peers at once (a SYN makes
    /// each answer, and our reply carries the new status), so they drop this
    /// node from their live views within a round trip. Gossip keeps running:
    /// the node still sees who takes over its VIPs.
    pub async fn set_leaving(&self) {
        let peers: Vec<SocketAddr> = {
            let mut c = self.chitchat.lock().await;
            // Flag and status change together under the lock, so a `publish`
            // either wrote before (and is overwritten here) or sees the flag.
            self.leaving.store(true, Ordering::SeqCst);
            self.pace.unpace();
            c.self_node_state()
                .set(state::KEY_STATUS, Status::Leaving.as_str());
            if let Some(key) = self.signer.get() {
                super::signed::sign_state(c.self_node_state(), key);
            }
            let own = c.self_chitchat_id().clone();
            c.live_nodes()
                .filter(|id| **id != own)
                .map(|id| id.gossip_advertise_addr)
                .collect::<HashSet<_>>()
                .into_iter()
                .take(MAX_LEAVE_PUSH)
                .collect()
        };
        for peer in &peers {
            // Fails only if the server already stopped.
            let _ = self.handle.gossip(*peer);
        }
        self.refresh.notify_one();
        info!(pushed = peers.len(), "gossip: leaving");
    }

    /// Graceful leave: publish `leaving`, keep gossiping for the configured
    /// rounds so every peer hears it, then stop.
    pub async fn leave(self) -> Result<(), GossipError> {
        self.set_leaving().await;
        tokio::time::sleep(self.interval * self.leave_rounds).await;
        self.shutdown().await
    }

    /// Stops gossip now (after [`set_leaving`](Self::set_leaving), for a
    /// caller that waited for its own handover). Peers' detectors hear that
    /// this node left, rather than finding out by timeout.
    pub async fn shutdown(self) -> Result<(), GossipError> {
        self.detector.leave().await;
        let _ = self.handle.initiate_shutdown();
        self.handle
            .termination_watcher()
            .await
            .map_err(|error| GossipError::Stopped(format!("{error:#}")))
    }

    /// Resolves when the gossip server stops on its own (a broken socket)
    /// or the failure detector does (it never does unless it panicked, and
    /// views would then keep every member forever). The agent should treat
    /// either as fatal (not ready, restart).
    pub fn stopped(&self) -> impl Future<Output = Result<(), GossipError>> + use<> {
        let watcher = self.handle.termination_watcher();
        let mut up = self.detector.up();
        async move {
            tokio::select! {
                stopped = watcher => {
                    stopped.map_err(|error| GossipError::Stopped(format!("{error:#}")))
                }
                () = async { while up.changed().await.is_ok() {} } => {
                    Err(GossipError::Stopped("the failure detector stopped".into()))
                }
            }
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.task.abort();
        self.handle.abort();
    }
}

/// Start time in ns since the Unix epoch: a restart gets a larger generation
/// as long as the clock does not step back across it (the stale generation
/// then only lingers until peers declare it dead, about a second).
/// The start time in milliseconds, shifted left by 20 bits: every member's
/// generation is in every digest, and zero low bytes compress away (a
/// 1,000-member digest is 11 kB instead of 14 kB with nanoseconds), while
/// the value stays above the nanosecond generations of earlier releases, so
/// an upgraded agent still replaces its previous self at once. Two starts
/// in one process within a millisecond still get increasing generations.
fn generation_now() -> u64 {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| (d.as_millis() as u64) << 20)
        .unwrap_or(0);
    let previous = LAST
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
            Some(now.max(last + 1))
        })
        .expect("the update always succeeds");
    now.max(previous + 1)
}

struct ViewTask {
    handle: Arc<ChitchatHandle>,
    chitchat: Arc<Mutex<Chitchat>>,
    own: HashSet<SocketAddr>,
    watcher: watch::Receiver<BTreeMap<ChitchatId, NodeState>>,
    refresh: Arc<Notify>,
    seeds: watch::Receiver<Vec<SocketAddr>>,
    views: watch::Sender<MembershipView>,
    interval: Duration,
    pace: Arc<Pace>,
    detector: Arc<Detector>,
    up: watch::Receiver<Arc<Up>>,
}

/// Rounds between two looks for nodes gossip knows and the detector not.
const ANNOUNCE_ROUNDS: u32 = 2;
/// Rounds of our own at the gossip interval after anything in the cluster
/// state changed (a key set or deleted, here or by a peer, a node come or
/// gone): a node that learns news passes it on at full pace, so it spreads
/// as fast as if every round were at the interval.
const BUSY_ROUNDS: u32 = 10;
/// Peers per round of our own, as chitchat's own rounds pick.
const ROUND_PEERS: usize = 3;

/// Changes whenever any node's state does (every set or deleted key moves
/// its node's max version), never for a heartbeat.
fn news_mark(c: &Chitchat) -> (usize, u64) {
    let states = c.node_states();
    (
        states.len(),
        states
            .values()
            .fold(0u64, |sum, node| sum.wrapping_add(node.max_version())),
    )
}

impl ViewTask {
    async fn run(mut self) {
        let rest = self.interval * REST_ROUNDS;
        let mut probe = SeedProbe::default();
        let mut builder = ViewBuilder::default();
        let mut rounds = 0u32;
        // Busy from the start: joining is news.
        let mut busy = BUSY_ROUNDS;
        let mut seen = None;
        let next = tokio::time::sleep(self.interval);
        tokio::pin!(next);
        loop {
            tokio::select! {
                changed = self.watcher.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    self.pace.set_live(
                        self.watcher.borrow().keys().map(|id| id.gossip_advertise_addr),
                    );
                }
                () = self.refresh.notified() => {}
                changed = self.up.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = &mut next => {
                    if busy > 0 {
                        busy -= 1;
                        self.round().await;
                    }
                    let alone = self.probe_seeds(&mut probe).await;
                    rounds += 1;
                    let mut waiting = false;
                    if rounds >= ANNOUNCE_ROUNDS {
                        rounds = 0;
                        waiting = self.announce_unknown().await;
                    }
                    // Alone with seeds to try, or peers the detector has
                    // not let in yet: keep the pace until they are found.
                    if alone || waiting {
                        busy = busy.max(1);
                    }
                    let wait = if busy > 0 { self.interval } else { rest };
                    next.as_mut().reset(tokio::time::Instant::now() + wait);
                    continue;
                }
            }
            let up = self.up.borrow_and_update().clone();
            let (view, news) = {
                let c = self.chitchat.lock().await;
                let now = news_mark(&c);
                let news = seen.replace(now) != Some(now);
                (builder.build(&c, &up), news)
            };
            if news {
                busy = BUSY_ROUNDS;
                if next.deadline() > tokio::time::Instant::now() + self.interval {
                    next.as_mut().reset(tokio::time::Instant::now());
                }
            }
            self.views.send_if_modified(|current| {
                if *current == view {
                    return false;
                }
                debug!(
                    members = view.members.len(),
                    nodes = view.nodes.len(),
                    "membership changed"
                );
                *current = view;
                true
            });
        }
    }

    /// One round of our own between chitchat's rounds at rest: a SYN to up
    /// to [`ROUND_PEERS`] random live peers, as chitchat's own round would
    /// pick them. Each answers with what we lack and our reply carries what
    /// it lacks, so news spreads at the configured interval while it is
    /// news.
    async fn round(&mut self) {
        let peers: Vec<SocketAddr> = {
            let c = self.chitchat.lock().await;
            let own = c.self_chitchat_id();
            let up = self.up.borrow();
            let live: HashSet<&ChitchatId> = c.live_nodes().collect();
            let candidates: Vec<SocketAddr> = c
                .node_states()
                .keys()
                .filter(|id| *id != own && (live.contains(id) || is_up(&up, id)))
                .map(|id| id.gossip_advertise_addr)
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            let mut rng = rand::rng();
            rand::seq::IndexedRandom::sample(candidates.as_slice(), &mut rng, ROUND_PEERS)
                .copied()
                .collect()
        };
        for peer in peers {
            // Fails only if the server already stopped.
            let _ = self.handle.gossip(peer);
        }
    }

    /// Nodes gossip knows and reports alive whose detector has not been
    /// heard yet are asked to let this node in: that is how the detector
    /// joins, and how it finds a node that restarted.
    async fn announce_unknown(&mut self) -> bool {
        let up = self.up.borrow().clone();
        let unknown: Vec<Peer> = {
            let c = self.chitchat.lock().await;
            let own = c.self_chitchat_id();
            c.node_states()
                .iter()
                .filter(|(id, node)| {
                    *id != own
                        && state::runs_detector(node)
                        && state::is_live(node)
                        && !is_up(&up, id)
                })
                .map(|(id, _)| Peer::new(&*id.node_id, id.generation_id, id.gossip_advertise_addr))
                .collect()
        };
        let any = !unknown.is_empty();
        self.detector.announce(unknown);
        any
    }

    /// Whether this node is alone (no live peer) with seeds to try.
    async fn probe_seeds(&mut self, probe: &mut SeedProbe) -> bool {
        let seeds = self.seeds.borrow().clone();
        if seeds.is_empty() {
            return false;
        }
        let (known, alone) = {
            let c = self.chitchat.lock().await;
            let known: HashSet<SocketAddr> =
                c.live_nodes().map(|id| id.gossip_advertise_addr).collect();
            let alone = known.len() <= 1;
            (known, alone)
        };
        let unknown: Vec<SocketAddr> = seeds
            .into_iter()
            .filter(|seed| !known.contains(seed) && !self.own.contains(seed))
            .collect();
        for seed in probe.pick(&unknown, alone) {
            let _ = self.handle.gossip(seed);
        }
        alone
    }
}

/// Round-robin over run-time seeds that are not (yet) members.
#[derive(Debug, Default)]
struct SeedProbe {
    next: usize,
    rounds: u32,
}

impl SeedProbe {
    fn pick(&mut self, unknown: &[SocketAddr], alone: bool) -> Vec<SocketAddr> {
        if unknown.is_empty() {
            return Vec::new();
        }
        let count = if alone {
            SEEDS_PER_ROUND_ALONE
        } else {
            self.rounds += 1;
            if self.rounds < SEED_ROUNDS_CONNECTED {
                return Vec::new();
            }
            self.rounds = 0;
            1
        };
        let picked = (0..count.min(unknown.len()))
            .map(|i| unknown[(self.next + i) % unknown.len()])
            .collect();
        self.next = self.next.wrapping_add(count);
        picked
    }
}

fn is_up(up: &Up, id: &ChitchatId) -> bool {
    up.contains(&id.node_id, id.generation_id)
}

/// The view from chitchat's state and the detector's up set (see
/// [`ViewBuilder::build`]).
pub fn build_view(c: &Chitchat, up: &Up) -> MembershipView {
    ViewBuilder::default().build(c, up)
}

/// Builds views, decoding each node's state only when its version moved:
/// the builder runs with chitchat's lock held, which gossip waits on.
#[derive(Default)]
pub struct ViewBuilder {
    decoded: HashMap<ChitchatId, (Version, Option<Arc<MemberInfo>>)>,
}

impl ViewBuilder {
    /// The node's record, decoded once per version it publishes and shared
    /// by every view that lists it.
    fn decode(&mut self, id: &ChitchatId, node: &NodeState) -> Option<Arc<MemberInfo>> {
        let version = node.max_version();
        match self.decoded.get(id) {
            Some((seen, info)) if *seen == version => info.clone(),
            _ => {
                let info = state::decode(node).map(Arc::new);
                self.decoded.insert(id.clone(), (version, info.clone()));
                info
            }
        }
    }

    /// A node is in the view when chitchat has its state and it is up: by
    /// the detector's word (`up`) if it runs one, by chitchat's failure
    /// detector if not (an agent of an earlier release, mid-upgrade).
    /// Leaving nodes are filtered by their `status`, after keeping the
    /// newest generation of each node name: a node that restarted and then
    /// started leaving must not be represented by its stale older
    /// generation. Nor once that leaving generation is gone: `cleanup`
    /// speaks for a killed agent under a new generation, perhaps from
    /// another port, and when it exits the killed agent's generation (still
    /// up in the detector until its probes time out) must not come back.
    pub fn build(&mut self, c: &Chitchat, up: &Up) -> MembershipView {
        let chitchat_live: HashSet<&ChitchatId> = c.live_nodes().collect();
        let view = self.build_inner(c, up, &chitchat_live);
        let known: HashSet<&ChitchatId> = c.node_states().keys().collect();
        self.decoded.retain(|id, _| known.contains(id));
        view
    }

    /// `chitchat_live` is chitchat's own liveness, apart so that a test can
    /// set it: chitchat counts a heartbeat from any digest, signed or not.
    fn build_inner(
        &mut self,
        c: &Chitchat,
        up: &Up,
        chitchat_live: &HashSet<&ChitchatId>,
    ) -> MembershipView {
        let own = c.self_chitchat_id();
        let mut newest: BTreeMap<&str, &ChitchatId> = BTreeMap::new();
        let mut newest_gone: BTreeMap<&str, &ChitchatId> = BTreeMap::new();
        let mut unconfirmed: HashSet<&str> = HashSet::new();
        let mut left: BTreeMap<&str, u64> = BTreeMap::new();
        for (id, node) in c.node_states() {
            if state::is_leaving(node) {
                let g = left.entry(&id.node_id).or_insert(0);
                *g = (*g).max(id.generation_id);
            }
        }
        for (id, node) in c.node_states() {
            if left
                .get(&*id.node_id)
                .is_some_and(|g| id.generation_id < *g)
                && id != own
            {
                continue;
            }
            // A state without its status is nobody's word yet (the status
            // is the last key a node writes): chitchat makes an empty one
            // for any generation a digest names, unsigned, and one that
            // stood for a node's newest would hide its real one.
            if id != own && node.get(state::KEY_STATUS).is_none() {
                continue;
            }
            if id.node_id == own.node_id && id != own {
                // Our own name is always us, whatever generation a stale copy of
                // us claims (the clock may have stepped back across a restart).
                continue;
            }
            let live = if id == own {
                true
            } else if state::runs_detector(node) {
                is_up(up, id)
            } else {
                chitchat_live.contains(id)
            };
            if !live {
                if chitchat_live.contains(id) && state::is_live(node) {
                    unconfirmed.insert(&id.node_id);
                }
                newest_gone
                    .entry(&id.node_id)
                    .and_modify(|best| {
                        if id.generation_id > best.generation_id {
                            *best = id;
                        }
                    })
                    .or_insert(id);
                continue;
            }
            newest
                .entry(&id.node_id)
                .and_modify(|best| {
                    if id.generation_id > best.generation_id {
                        *best = id;
                    }
                })
                .or_insert(id);
        }
        unconfirmed.retain(|node| !newest.contains_key(node));
        newest_gone.retain(|node, _| !newest.contains_key(node));
        let nodes: Vec<Arc<MemberInfo>> = newest
            .values()
            .filter_map(|id| c.node_state(id).and_then(|node| self.decode(id, node)))
            .collect();
        let gone: Vec<Arc<MemberInfo>> = newest_gone
            .values()
            .filter_map(|id| c.node_state(id).and_then(|node| self.decode(id, node)))
            .collect();
        let members = nodes
            .iter()
            .filter(|n| n.status == Status::Alive)
            .map(|n| n.to_member())
            .collect();
        let local = c
            .node_state(own)
            .and_then(state::decode)
            .unwrap_or_else(|| MemberInfo {
                // Unreachable in practice: `status` is among the initial keys.
                node: crate::election::NodeName::from(&*own.node_id),
                generation: own.generation_id,
                gossip_addr: own.gossip_advertise_addr,
                agent_version: String::new(),
                protocol: crate::gossip::PROTOCOL,
                status: Status::Leaving,
                virtual_mode: false,
                on_link: Default::default(),
                vips: Default::default(),
                macs: Default::default(),
                revision: 0,
                digest: None,
                drained: false,
                behind: Default::default(),
            });
        MembershipView {
            local,
            members,
            nodes,
            unconfirmed: unconfirmed.len(),
            gone,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::IpAddr;

    use chitchat::FailureDetectorConfig;

    use super::*;
    use crate::election::OnLink;

    #[test]
    fn generations_increase_and_sort_after_nanosecond_ones() {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let first = super::generation_now();
        let second = super::generation_now();
        assert!(first > nanos, "an upgraded agent must replace its old self");
        assert!(second > first);
    }

    fn chitchat_for(node: &str, local: &LocalState) -> Chitchat {
        let id = ChitchatId::new(node, 1, "127.0.0.1:7000".parse().unwrap());
        let config = ChitchatConfig {
            chitchat_id: id,
            cluster_id: "t".into(),
            gossip_interval: Duration::from_millis(100),
            listen_addr: "127.0.0.1:7000".parse().unwrap(),
            seed_nodes: Vec::new(),
            failure_detector_config: FailureDetectorConfig::default(),
            marked_for_deletion_grace_period: Duration::from_secs(60),
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: ProtocolVersion::V1,
        };
        Chitchat::with_chitchat_id_and_seeds(
            config,
            watch::channel(HashSet::new()).1,
            state::initial_key_values("9.9.9", local),
        )
    }

    fn sample() -> LocalState {
        LocalState {
            status: Status::Alive,
            virtual_mode: true,
            on_link: vec![
                OnLink {
                    prefix: "10.0.0.0/24".parse().unwrap(),
                    interface: "eth0".into(),
                    announce: true,
                    upstream_lost: false,
                },
                OnLink {
                    prefix: "2001:db8::/64".parse().unwrap(),
                    interface: "eth0".into(),
                    announce: true,
                    upstream_lost: false,
                },
            ]
            .into(),
            vips: ["10.0.0.10", "2001:db8::10"]
                .iter()
                .map(|s| s.parse::<IpAddr>().unwrap())
                .collect::<BTreeSet<_>>()
                .into(),
            macs: BTreeSet::from(["02:00:00:00:00:01".parse().unwrap()]).into(),
            revision: 0,
            digest: None,
            drained: false,
            behind: BTreeSet::from(["n7".into(), "n8".into()]).into(),
        }
    }

    /// A node's state from key-values as another release wrote them.
    fn chitchat_with(node: &str, kvs: &[(&str, &str)]) -> Chitchat {
        let mut c = chitchat_for(node, &LocalState::default());
        let state = c.self_node_state();
        for key in state
            .key_values()
            .map(|(k, _)| k.to_string())
            .collect::<Vec<_>>()
        {
            state.delete(&key);
        }
        for (k, v) in kvs {
            state.set(*k, *v);
        }
        c
    }

    /// The previous release's keys, verbatim (no `protocol` key yet): read
    /// as protocol 1, every field as the current release reads its own.
    const PREVIOUS_RELEASE: &[(&str, &str)] = &[
        ("version", "0.1.0"),
        (
            "onlink.v4",
            r#"[{"if":"eth0","prefix":"10.0.0.0/24","announce":true}]"#,
        ),
        (
            "onlink.v6",
            r#"[{"if":"eth0","prefix":"2001:db8::/64","announce":true}]"#,
        ),
        ("virtual", "true"),
        ("macs", "02:00:00:00:00:01"),
        ("detector", "swim"),
        ("revision", "42"),
        ("vips.0", "10.0.0.10 2001:db8::10"),
        ("status", "alive"),
    ];

    #[test]
    fn state_of_the_previous_release_and_of_a_newer_protocol_reads_alike() {
        let old = build_view(&chitchat_with("n1", PREVIOUS_RELEASE), &Up::default()).local;
        assert_eq!(old.protocol, 1);
        assert_eq!(old.agent_version, "0.1.0");
        assert_eq!(old.status, Status::Alive);
        assert!(old.virtual_mode);
        assert_eq!(old.revision, 42);
        assert_eq!(old.vips, sample().vips);
        assert_eq!(old.macs, sample().macs);
        assert_eq!(old.on_link, sample().on_link);
        // Without a word of who is behind, a node that came to its view
        // late waits for an orphan's winner as it did before the key.
        assert!(old.behind.is_empty());
        // Nor of what its view holds: its revision alone tells.
        assert_eq!(old.digest, None);
        // The current release writes the same, plus its protocol.
        let current = build_view(
            &chitchat_for(
                "n1",
                &LocalState {
                    revision: 42,
                    behind: Default::default(),
                    ..sample()
                },
            ),
            &Up::default(),
        )
        .local;
        assert_eq!(current.protocol, state::PROTOCOL);
        assert_eq!(
            MemberInfo {
                agent_version: current.agent_version.clone(),
                protocol: current.protocol,
                ..old.clone()
            },
            current
        );
        // A newer protocol's keys that this release does not know, and
        // fields it does not know inside values it does, are skipped.
        let mut newer = PREVIOUS_RELEASE.to_vec();
        newer.retain(|(k, _)| *k != "onlink.v4" && *k != "status");
        newer.extend([
            ("protocol", "3"),
            ("election.rule", "v3"),
            (
                "onlink.v4",
                r#"[{"if":"eth0","prefix":"10.0.0.0/24","announce":true,"weight":3}]"#,
            ),
            ("status", "alive"),
        ]);
        let new = build_view(&chitchat_with("n1", &newer), &Up::default()).local;
        assert_eq!(new.protocol, 3);
        assert_eq!(MemberInfo { protocol: 1, ..new }, old);
    }

    #[test]
    fn published_state_reads_back_as_a_member() {
        let local = sample();
        let c = chitchat_for("n1", &local);
        let view = build_view(&c, &Up::default());
        assert_eq!(view.local.node, "n1");
        assert_eq!(view.local.agent_version, "9.9.9");
        assert_eq!(view.local.vips, local.vips);
        assert_eq!(view.local.behind, local.behind);
        assert_eq!(view.members.len(), 1);
        let member = &view.members[0];
        assert!(!member.leaving && member.virtual_mode);
        let mut got = member.on_link.to_vec();
        got.sort();
        let mut want = local.on_link.to_vec();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn republishing_rewrites_only_changes_and_empties_stale_vip_chunks() {
        let mut local = sample();
        local.vips = (0..1_000u32)
            .map(|i| IpAddr::from([10, 1, (i >> 8) as u8, i as u8]))
            .collect::<BTreeSet<_>>()
            .into();
        let mut c = chitchat_for("n1", &local);
        let chunks = c
            .self_node_state()
            .iter_prefix(state::KEY_VIPS_PREFIX)
            .count();
        assert!(chunks > 1, "1000 VIPs need several chunks");

        let before = c.self_node_state().max_version();
        state::publish(c.self_node_state(), &local);
        assert_eq!(
            c.self_node_state().max_version(),
            before,
            "same state, no new versions"
        );

        local.vips = BTreeSet::from(["10.9.9.9".parse().unwrap()]).into();
        local.status = Status::Leaving;
        state::publish(c.self_node_state(), &local);
        assert_eq!(
            c.self_node_state()
                .iter_prefix(state::KEY_VIPS_PREFIX)
                .filter(|(_, v)| !v.value.is_empty())
                .count(),
            1,
            "the chunks no longer needed are emptied (never deleted: see `signed`)"
        );
        assert!(
            c.self_node_state()
                .key_values_including_deleted()
                .all(|(_, v)| matches!(v.status, chitchat::DeletionStatus::Set)),
            "no tombstone"
        );
        let view = build_view(&c, &Up::default());
        assert_eq!(view.local.vips, local.vips);
        assert_eq!(view.local.status, Status::Leaving);
        assert!(view.members.is_empty(), "a leaving node is no member");
        assert_eq!(view.nodes.len(), 1, "but still a node");
    }

    /// A starting node is a node (peers see it, and its MACs and VIPs) but
    /// no member (no candidate); its revision and digest read back.
    #[test]
    fn a_starting_node_is_seen_but_stands_in_no_election() {
        let mut local = sample();
        local.status = Status::Starting;
        local.revision = 4711;
        let mut c = chitchat_for("n1", &local);
        let view = build_view(&c, &Up::default());
        assert!(view.members.is_empty());
        assert_eq!(view.node("n1").map(|n| n.status), Some(Status::Starting));
        assert_eq!(view.local.revision, 4711);
        assert_eq!(view.local.digest, None, "no view yet");
        local.status = Status::Alive;
        local.revision = 4712;
        local.digest = Some(u64::MAX - 1);
        state::publish(c.self_node_state(), &local);
        let view = build_view(&c, &Up::default());
        assert_eq!(view.members.len(), 1);
        assert_eq!(view.local.revision, 4712);
        assert_eq!(view.local.digest, Some(u64::MAX - 1));
    }

    #[test]
    fn cached_decoding_follows_state_changes() {
        let mut c = chitchat_for("n1", &sample());
        let mut builder = ViewBuilder::default();
        assert_eq!(
            builder
                .build(&c, &Up::default())
                .node("n1")
                .unwrap()
                .vips
                .len(),
            2
        );
        let mut changed = sample();
        changed.vips = Default::default();
        state::publish(c.self_node_state(), &changed);
        assert!(
            builder
                .build(&c, &Up::default())
                .node("n1")
                .unwrap()
                .vips
                .is_empty()
        );
    }

    /// A digest that names a newer generation of a node makes chitchat
    /// hold an empty state for it until its keys arrive, and a forger may
    /// name one that never sends any: that empty state is nobody, and the
    /// node's real generation stays its word.
    #[test]
    fn an_empty_newer_generation_hides_no_node() {
        let mut c = chitchat_for("n1", &sample());
        let addr: SocketAddr = "127.0.0.2:7000".parse().unwrap();
        let real = ChitchatId::new("n2", 1, addr);
        let values = |kvs: &[(&str, &str)]| {
            kvs.iter()
                .enumerate()
                .map(|(i, (k, v))| {
                    (
                        k.to_string(),
                        chitchat::VersionedValue {
                            value: v.to_string(),
                            version: i as u64 + 1,
                            status: chitchat::DeletionStatus::Set,
                        },
                    )
                })
                .collect::<Vec<_>>()
        };
        let kvs = values(PREVIOUS_RELEASE);
        c.reset_node_state_if_update(&real, kvs.clone().into_iter(), kvs.len() as u64, 0);
        let up: Up = [
            ("n1".to_string(), 1),
            ("n2".to_string(), 1),
            ("n2".to_string(), 9),
        ]
        .into_iter()
        .collect();
        let before = build_view(&c, &up);
        assert!(before.members.iter().any(|m| m.node == "n2"));

        let empty = ChitchatId::new("n2", 9, addr);
        c.reset_node_state_if_update(&empty, std::iter::empty(), 1, 0);
        assert!(
            c.node_state(&empty).is_some(),
            "chitchat holds the empty state"
        );
        // The digest's heartbeat makes it live to chitchat, and a state
        // without a `detector` key is judged by chitchat's liveness.
        let live: HashSet<&ChitchatId> = [&real, &empty].into_iter().collect();
        let after = ViewBuilder::default().build_inner(&c, &up, &live);
        assert_eq!(
            after.members.iter().find(|m| m.node == "n2"),
            before.members.iter().find(|m| m.node == "n2"),
            "n2 is still its real generation"
        );

        // Once the newer generation's state is whole (its status is the
        // last key a node writes), it is the node.
        let mut leaving = PREVIOUS_RELEASE.to_vec();
        leaving.retain(|(k, _)| *k != "status");
        leaving.push(("status", "leaving"));
        let newer = values(&leaving);
        c.reset_node_state_if_update(&empty, newer.into_iter(), leaving.len() as u64, 0);
        let live: HashSet<&ChitchatId> = [&real, &empty].into_iter().collect();
        let view = ViewBuilder::default().build_inner(&c, &up, &live);
        assert!(view.members.iter().all(|m| m.node != "n2"), "n2 is leaving");
    }

    #[test]
    fn seed_probe_is_fast_alone_and_slow_when_connected() {
        let seeds: Vec<SocketAddr> = (1..=5)
            .map(|i| SocketAddr::from(([10, 0, 0, i], 7934)))
            .collect();
        let mut probe = SeedProbe::default();
        let first = probe.pick(&seeds, true);
        let second = probe.pick(&seeds, true);
        assert_eq!(first.len(), SEEDS_PER_ROUND_ALONE);
        assert_eq!(second[0], seeds[3], "round robin continues");
        let connected: usize = (0..SEED_ROUNDS_CONNECTED * 3)
            .map(|_| probe.pick(&seeds, false).len())
            .sum();
        assert_eq!(connected, 3);
        assert!(probe.pick(&[], true).is_empty());
    }
}
