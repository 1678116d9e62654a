//! `lbnodeagent run`: the shell around the agent's [`core`].
//!
//! The core decides; this module does what it says and tells it what
//! happened. One task, one `select!` ([`Agent::run`]) over the Kubernetes
//! watches ([`watches`]), gossip views ([`crate::gossip::Membership`]),
//! kernel address and link events ([`crate::addrs::Events`]), claims heard
//! on the wire, the results of kernel operations, reads of the links and
//! routes (asked for by a one-second tick, since routes raise no event, and
//! by link events), the core's own deadline, signals and `/status`
//! requests. Each wake-up becomes one [`Input`]; the [`Actions`] of
//! [`Core::step`] are carried out without waiting on any of them: kernel
//! operations go as one batch to a worker task that feeds the results back,
//! links are read by a task of their own ([`kernel::LinkReads`]),
//! announcements and probes are sent by tasks of their own, file writes run
//! on blocking threads. So the loop serves its inputs while a thousand
//! addresses are being added, or while the kernel's RTNL lock is busy.
//!
//! The path of one VIP, from a Service to the kernel, is in `docs/agent.md`.

pub mod admission;
pub mod arp;
pub mod beats;
mod checks;
pub mod cleanup;
pub mod config;
pub mod core;
pub mod drain;
mod firewall;
mod kernel;
pub mod record;
mod reload;
pub mod report;
mod start;
pub mod status;
pub mod telemetry;
mod watches;
mod wire;

pub use watches::ServiceRecords;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hostlb_api::runtime::notify::{NotifyState, notify, watchdog_enabled};
use hostlb_api::runtime::signals::{Signal, Signals};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, error, info, warn};

use self::core::sessions::Beat;
pub use self::core::{
    Actions, ConflictKind, Core, HANDOVER_MAX, Input, LEAVE_MAX, Metric, OpKind, OpResult,
    STARTUP_GRACE, Settings, UNCONFIRMED_GRACE, conflict, links,
};
use crate::addrs::AddressBackend;
use crate::gossip::{AuthTransport, Membership, MembershipView};
pub use checks::START_OVER;
pub use config::AgentConfig;
use kernel::{Kernel, KernelJob};
use report::ReportHandle;
pub use start::{
    check_offline, credential_files_are_private, default_advertise, keygen, keygen_to, run,
};
use status::StatusDoc;
use telemetry::Telemetry;
use watches::KubeInputs;
use wire::{Wire, send_each};

/// The loop's housekeeping (seeds, health, the ARP check) runs this often.
const TICK: Duration = Duration::from_secs(1);
/// Links and routes are read when the kernel says they changed
/// ([`KernelEvent::LinksChanged`](crate::addrs::KernelEvent), carrier
/// changes, a resync), and at least this often besides: a read that no
/// notification asks for, for what the kernel tells no subscriber of (a
/// host address added with no main-table route of its own; see the route
/// socket's filter) and for anything a notification missed.
const SAFETY_READ: Duration = Duration::from_secs(10);
/// systemd's watchdog is told the loop is turning at most this often.
/// A loop turn at least this long is logged (at debug) with where its time
/// went.
const SLOW_TURN: Duration = Duration::from_millis(30);
const WATCHDOG_EVERY: Duration = Duration::from_millis(500);
/// The file `cleanup` reads peers from, in the run directory.
pub const PEERS_FILE: &str = "peers";
/// The file holding the running agent's gossip generation, in the run
/// directory: `cleanup`'s leaving beats name that run, so peers never take
/// them for a newer run of the node.
pub const GENERATION_FILE: &str = "generation";

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("kernel addresses: {0}")]
    Addresses(#[from] crate::addrs::Error),
    #[error("gossip: {0}")]
    Gossip(#[from] crate::gossip::GossipError),
    #[error("ARP/NDP: {0}")]
    Announce(#[from] crate::announce::Error),
    #[error("kubeconfig {}: {message}", path.display())]
    Kubeconfig { path: PathBuf, message: String },
    #[error(
        "{} holds this node's credential and others may read or write it (mode {mode:04o}); \
         make it the agent's alone: chown lbnodeagent {0} && chmod 600 {0}",
        path.display()
    )]
    SecretMode { path: PathBuf, mode: u32 },
    #[error("cannot serve HTTP on {addr}: {source}")]
    Http {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("cannot start the kernel thread: {0}")]
    KernelThread(std::io::Error),
    #[error("no free port to gossip from: {0}")]
    NoPort(std::io::Error),
    #[error(
        "gossip.advertise is not set and no address could be found on the announce interface; set it in the config"
    )]
    NoAdvertise,
    #[error(
        "firewall.enabled is on but no nft is on the PATH: the agent adds no VIP before its firewall is in force (install the nftables package, or set firewall.enabled = false)"
    )]
    NoNft,
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
}

/// Gossip, and what the shell remembers of it.
struct Gossip {
    membership: Membership,
    /// The owner sessions: beats sent, and beats received.
    beats: Option<beats::Beats>,
    beats_in: Option<mpsc::Receiver<crate::gossip::Arrived>>,
    /// Beats that change nothing but when their senders were last heard
    /// ([`Core::beat_is_routine`]), with their arrival times: handed to the
    /// core before the next input, or at the wake-up it asked for (a
    /// watched owner's silence deadline), not each at its own step. A
    /// watcher hears its owner 40 times a second and so steps about 7.
    waiting: Vec<Beat>,
    /// Kept to apply a reloaded key file to the open sockets.
    transport: AuthTransport,
    views: watch::Receiver<MembershipView>,
    seeds_given: Vec<SocketAddr>,
    peers_file: checks::PeersFile,
}

/// The shell's state. See the module docs.
pub struct Agent<B: AddressBackend + 'static> {
    core: Core,
    cfg: AgentConfig,
    /// This node's own key (see `identity`): its record publishes the
    /// public part, its beats and gossip state are made under it.
    identity: Arc<crate::identity::NodeKey>,
    /// Every node's identity as the records say, for what verifies.
    identities: Arc<crate::identity::Identities>,
    /// Believes a beat only of its node's proof (see `beats`).
    beat_check: beats::BeatCheck,
    /// Beats refused in a node's name, logged at most once a minute.
    beats_warned: Option<std::time::Instant>,
    /// Whether the API server took the writer's last request, as the loop
    /// last saw it: its return restarts the watches (`checks::api_health`).
    api_answered: bool,
    config_path: PathBuf,
    backend: Arc<B>,
    wire: Wire,
    gossip: Gossip,
    kube: KubeInputs,
    report: ReportHandle,
    /// Every agent's record in the API, and this one's writer.
    records: record::Records,
    publisher: record::Publisher,
    /// Checks that the Service policy is in force (see `admission`).
    _admission: crate::addrs::AbortOnDrop,
    /// A hash of the configuration in force, for the record.
    config_hash: String,
    /// The core's last conflict, and when it was seen.
    conflict_seen: Option<(core::ConflictSeen, jiff::Timestamp)>,
    /// The last moves of VIPs to this node, oldest first, for the record.
    moves: std::collections::VecDeque<(core::Move, jiff::Timestamp)>,
    telemetry: Arc<Telemetry>,
    kernel: Kernel,
    link_reads: kernel::LinkReads,
    /// Checks that this node reaches its default gateways (`[upstream]`);
    /// `None` when turned off.
    upstream: Option<crate::announce::gateway::GatewayProbe>,
    /// Create the virtual interface at the next links refresh (at start,
    /// and after a reload changed its name); otherwise it is only looked up.
    ensure_virtual: bool,
    /// The core has had a whole cluster view (later, changes of
    /// EndpointSlices alone go as endpoints).
    cluster_sent: bool,
    /// This node's drain as the core has it (a core starts undrained).
    drain_sent: bool,
    /// The firewall task's latest plan.
    firewall: firewall::Firewall,
    /// When start-up's code pages are unmapped (see `checks`).
    start_code: checks::StartCode,
}

impl<B: AddressBackend + 'static> Agent<B> {
    /// The loop. Returns after a graceful leave (SIGTERM/SIGINT).
    /// `signals` were installed before the start, so a SIGHUP or SIGTERM
    /// that came while the agent started waits here instead of ending
    /// the process by its default action.
    pub async fn run(mut self, mut signals: Signals) -> Result<(), AgentError> {
        // Subscribed before the kernel is read, so nothing falls between.
        let mut events = self.backend.subscribe().await?;
        let adopted = self.backend.adopt().await?;
        if self.step(Input::Adopted(adopted)).await {
            return self.finish().await;
        }
        let (status_tx, mut status_rx) = mpsc::channel::<oneshot::Sender<StatusDoc>>(8);
        self.telemetry.set_status_channel(status_tx);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut safety_read = tokio::time::interval(SAFETY_READ);
        safety_read.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The service is up (gossip joined, /readyz answering) even while
        // the API is away: a running, degraded service that is no
        // candidate until its first reconcile, not a start that times out
        // and loops. `/readyz` stays 503 until then.
        notify(&[
            NotifyState::Ready,
            NotifyState::Status(if self.core.settings().unable.is_some() {
                "degraded: no CAP_NET_ADMIN, so not a candidate; peers serve"
            } else {
                "starting: waiting for the first reconcile; not a candidate yet"
            }),
        ]);
        let wake = tokio::time::sleep(Duration::from_secs(3600));
        tokio::pin!(wake);
        let watchdog = watchdog_enabled();
        let mut last_watchdog = Instant::now();
        loop {
            let input = tokio::select! {
                _ = self.kube.changed() => {
                    self.api_health();
                    match self.cluster_input() {
                        Some(input) => input,
                        None => continue,
                    }
                }
                changed = self.gossip.views.changed() => {
                    if changed.is_err() {
                        error!("gossip stopped; exiting so the service manager restarts the agent");
                        return Err(AgentError::Gossip(crate::gossip::GossipError::Stopped(
                            "the membership task ended".into(),
                        )));
                    }
                    let mut view = self.gossip.views.borrow_and_update().clone();
                    // Peers met whose identity is not read yet: their state
                    // waits (see `gossip::signed`); they count as members
                    // not yet confirmed, so this node does not settle alone.
                    view.unconfirmed += self.identities.pending();
                    Input::Members(view)
                }
                () = self.identities.wanted() => {
                    if self.identities.take_wanted() && !self.records.ask_keys() {
                        // Again at a tick, once the gap has passed.
                        self.identities.want_later();
                    }
                    // A peer met whose state waits for its key counts as a
                    // member not yet confirmed from now, not from the next
                    // view (there is none while its state waits).
                    let mut view = self.gossip.views.borrow().clone();
                    view.unconfirmed += self.identities.pending();
                    Input::Members(view)
                }
                ev = events.recv() => match ev {
                    Some(ev) => match self.kernel_event(ev) {
                        Some(input) => input,
                        None => continue,
                    },
                    None => {
                        warn!("kernel event stream ended; subscribing again");
                        events = self.resubscribe().await;
                        self.link_reads.ask();
                        continue;
                    }
                },
                _ = tick.tick() => {
                    self.on_tick();
                    // The loop turns at least once a second, so the
                    // watchdog, `/healthz` and the beats' stall guard hear
                    // from it at rest as well.
                    self.turned(watchdog, &mut last_watchdog);
                    continue;
                }
                _ = safety_read.tick() => {
                    self.link_reads.ask_soon();
                    continue;
                }
                links = self.link_reads.next() => Input::Links(self.links_read(links)),
                Some(lost) = recv_lost(&mut self.upstream) => {
                    self.telemetry.gateways_lost.set(lost.len() as i64);
                    Input::Upstream(lost)
                }
                // Beats and claims that arrived before the deadline first
                // (an owner's beat still queued must count before the
                // deadline that would call it silent); the wake, still
                // due, fires again after them.
                () = &mut wake => match self.gossip.beats_in.as_mut().and_then(|r| r.try_recv().ok()) {
                    Some(first) => match self.beats_arrived(first) {
                        Some(input) => input,
                        None => continue,
                    },
                    None => match self.wire.received() {
                        Some(claims) => Input::Claims(claims),
                        None => Input::Tick,
                    },
                },
                listed = self.records.listed() => match listed {
                    Some(records) => Input::Records(records),
                    None => continue,
                },
                Some(first) = recv_if(&mut self.wire.claims) => {
                    let rest = self.wire.claims.as_mut().expect("a claim came from it");
                    let mut claims = vec![first];
                    while let Ok(c) = rest.try_recv() {
                        claims.push(c);
                    }
                    Input::Claims(claims)
                }
                Some(first) = recv_if(&mut self.gossip.beats_in) => match self.beats_arrived(first) {
                    Some(input) => input,
                    None => continue,
                },
                Some(done) = self.kernel.results.recv() => done,
                Some(signal) = signals.next() => match signal {
                    Signal::Reload => match self.reload().await {
                        Some(input) => input,
                        None => continue,
                    },
                    Signal::Stop => Input::Leave,
                },
                Some(reply) = status_rx.recv() => {
                    let _ = reply.send(self.status_doc());
                    continue;
                }
            };
            let exit = self.step(input).await;
            let next = self
                .core
                .wake_hint()
                .unwrap_or_else(|| Instant::now() + TICK * 60);
            wake.as_mut().reset(next.into());
            self.turned(watchdog, &mut last_watchdog);
            if exit {
                return self.finish().await;
            }
        }
    }

    /// The loop is turning: systemd's watchdog (at most every
    /// [`WATCHDOG_EVERY`]), `/healthz` and the beats' stall guard
    /// ([`beats::LOOP_STALL`]) are told.
    fn turned(&self, watchdog: bool, last_watchdog: &mut Instant) {
        if watchdog && last_watchdog.elapsed() >= WATCHDOG_EVERY {
            *last_watchdog = Instant::now();
            notify(&[NotifyState::Watchdog]);
        }
        self.telemetry.beat();
        if let Some(b) = &self.gossip.beats {
            b.turned();
        }
    }

    /// The beats queued, `first` first, checked: the input they make, or
    /// `None` when each is routine ([`Core::beat_is_routine`]) and waits
    /// for the next step in [`Gossip::waiting`].
    fn beats_arrived(&mut self, first: crate::gossip::Arrived) -> Option<Input> {
        let rest = self.gossip.beats_in.as_mut()?;
        let view = self.gossip.views.borrow();
        let kube = &self.kube;
        let (beats, refused) = beats::drain(first, rest, &mut self.beat_check, |node, source| {
            beats::from_its_node(node, source, &view, |n| kube.node_addresses(n))
        });
        drop(view);
        self.beats_refused(&refused);
        if beats.iter().all(|b| self.core.beat_is_routine(b)) {
            self.gossip.waiting.extend(beats);
            return None;
        }
        Some(Input::Beats(beats))
    }

    /// One step of the core, carried out, after the beats held back (see
    /// [`Gossip::waiting`]). `true` when the core is done.
    async fn step(&mut self, input: Input) -> bool {
        // Beats held back go first, as they came: the core counts each
        // from its arrival, so nothing judged at this step misses one.
        if !self.gossip.waiting.is_empty() {
            let mut beats = std::mem::take(&mut self.gossip.waiting);
            let input = match input {
                Input::Beats(more) => {
                    beats.extend(more);
                    Input::Beats(beats)
                }
                other => {
                    if self.step_one(Input::Beats(beats)).await {
                        return true;
                    }
                    other
                }
            };
            return self.step_one(input).await;
        }
        self.step_one(input).await
    }

    /// One input's step of the core, carried out.
    async fn step_one(&mut self, input: Input) -> bool {
        let timed = matches!(
            input,
            Input::Cluster { .. } | Input::Members(_) | Input::Endpoints { .. } | Input::Links(_)
        );
        // Beats and claims heard on the wire are most of what wakes an
        // agent at rest, and change nothing the record shows but isolation
        // and the last conflict, which `carry_out` checks itself.
        let shows = !matches!(input, Input::Beats(_) | Input::Claims(_));
        let kind = input.kind();
        let started = Instant::now();
        let actions = self.core.step(started, input);
        let stepped = started.elapsed();
        if timed {
            self.telemetry
                .election_seconds
                .observe(stepped.as_secs_f64());
        }
        let exit = actions.exit;
        self.carry_out(actions, shows).await;
        // A new owner's announcement, and so an old owner's release, waits
        // for whatever turn the loop is in: a slow one is worth a line.
        let turn = started.elapsed();
        if turn >= SLOW_TURN {
            debug!(
                input = kind,
                step_ms = stepped.as_millis() as u64,
                carried_out_ms = (turn - stepped).as_millis() as u64,
                "slow loop turn"
            );
        }
        exit
    }

    /// Does what the core said, without waiting for any of it to finish.
    /// The record is built again only when `shows` (the input could change
    /// what it says) or isolation or the last conflict changed.
    async fn carry_out(&mut self, a: Actions, shows: bool) {
        if !a.add.is_empty() || !a.remove.is_empty() || a.read_kernel {
            debug!(
                add = a.add.len(),
                remove = a.remove.len(),
                read = a.read_kernel,
                "kernel batch"
            );
            // The worker lives as long as the agent.
            let _ = self.kernel.batches.send(KernelJob {
                add: a.add,
                remove: a.remove,
                read: a.read_kernel,
            });
        }
        // Listened for before anything is sent: an answer can be back
        // before the send returns, and a send may yield to the task that
        // reads the wire (tokio's budget), which drops what is not watched.
        if let Some(watched) = a.watch {
            self.wire.watch(watched);
        }
        // Sent before the loop goes on (a raw socket's send does not wait):
        // a pre-check's deadline is counted from the step that asked, and
        // a new owner's announcement is what lets the old one go.
        if let Some(announcer) = &self.wire.announcer {
            send_each(a.garp, |t| async move { announcer.round(&t).await }).await;
            send_each(a.probe, |t| async move { announcer.probe(&t).await }).await;
        }
        if let Some(plan) = a.firewall {
            self.firewall.send_replace(Some(plan));
        }
        if let (Some(plan), Some(b)) = (a.beat, &self.gossip.beats) {
            b.set_plan(plan);
        }
        if a.leave {
            if let Some(b) = &self.gossip.beats {
                let view = self.gossip.views.borrow();
                b.leave(
                    view.nodes
                        .iter()
                        .filter(|n| n.node != view.local.node)
                        .map(|n| n.gossip_addr)
                        .collect(),
                );
            }
            notify(&[NotifyState::Stopping]);
            self.telemetry.leaving.store(true, Ordering::Relaxed);
            self.gossip.membership.set_leaving().await;
        }
        if let Some(local) = a.publish {
            self.gossip.membership.publish(local).await;
        }
        if let Some(announcing) = a.announcing {
            self.report.announcing.send_replace(announcing);
        }
        for event in a.events {
            self.report.event(event);
        }
        for m in a.metrics {
            match m {
                Metric::Op { op, ok } => self.telemetry.op(op.as_str(), ok),
                Metric::Conflict(kind) => {
                    self.telemetry.conflict(kind.as_str());
                    if matches!(kind, ConflictKind::Foreign | ConflictKind::InUse) {
                        // Perhaps a hostlb node gossip never showed.
                        self.records.ask();
                    }
                }
                Metric::Takeover(cause, d) => {
                    self.telemetry
                        .takeover_seconds
                        .get_or_create(&telemetry::CauseLabels {
                            cause: cause.as_str(),
                        })
                        .observe(d.as_secs_f64());
                }
                Metric::Elected => {
                    self.telemetry.elections.inc();
                }
            }
        }
        if a.ready {
            self.telemetry.applied.store(true, Ordering::Relaxed);
            notify(&[NotifyState::Ready]);
        }
        if let Some(status) = a.status {
            notify(&[NotifyState::Status(&status)]);
        }
        self.telemetry.owned_vips.set(self.core.held_count() as i64);
        self.telemetry
            .virtual_vips
            .set(self.core.held_virtual_count() as i64);
        self.telemetry
            .live_members
            .set(self.core.view().members.len() as i64);
        self.telemetry
            .object_errors
            .set(self.core.object_errors().len() as i64);
        let mut shows = shows;
        if let Some(isolated) = a.isolated {
            self.telemetry.gossip_isolated.set(i64::from(isolated));
            shows = true;
        }
        self.write_peers();
        if !a.moves.is_empty() {
            let now = jiff::Timestamp::now();
            for m in a.moves {
                self.telemetry
                    .moves
                    .get_or_create(&telemetry::CauseLabels {
                        cause: m.cause.as_str(),
                    })
                    .inc();
                if self.moves.len() == record::MAX_MOVES {
                    self.moves.pop_front();
                }
                self.moves.push_back((m, now));
            }
            shows = true;
        }
        if let Some(c) = self.core.last_conflict()
            && self.conflict_seen.as_ref().map(|(s, _)| s) != Some(c)
        {
            self.conflict_seen = Some((c.clone(), jiff::Timestamp::now()));
            shows = true;
        }
        if shows {
            let unserved = self.core.routed_unserved();
            if unserved.len() as i64 != self.telemetry.routed_unserved.get() {
                if unserved.is_empty() {
                    info!("no routed VIP waits for this node's virtual mode any more");
                } else {
                    warn!(count = unserved.len(), first = %unserved[0],
                        "routed VIPs that no node serves would be held here, but virtual mode is off; not ready");
                }
            }
            self.telemetry.routed_unserved.set(unserved.len() as i64);
            self.publisher.set(self.record());
        }
    }

    /// What the watches say changed, as the core's input: this node's
    /// drain, the whole view, or only some Services' endpoints. `None`
    /// before every watch listed.
    fn cluster_input(&mut self) -> Option<Input> {
        if !self.kube.synced() {
            return None;
        }
        // The drain first, and before the first view: a drained node that
        // restarts never wins back what it gave up. The out-of-service
        // taint on this node's Node drains it as `spec.drain` does.
        let record = self.kube.drain();
        let taint = self.kube.out_of_service();
        let drain = record || taint;
        if self.drain_sent != drain {
            self.drain_sent = drain;
            if taint && !record {
                info!(
                    taint = hostlb_api::annotations::OUT_OF_SERVICE_TAINT,
                    "this node's Node is out of service: drained while the taint is there"
                );
            }
            self.kube.poke();
            return Some(Input::Drain(drain));
        }
        let changes = self.kube.take_changes();
        if changes.full || !self.cluster_sent {
            self.cluster_sent = true;
            let (cluster, errors) = self.kube.cluster();
            let errors = errors
                .iter()
                .map(|e| format!("{}: {}", e.object, e.message))
                .collect();
            Some(Input::Cluster {
                cluster,
                errors,
                revision: self.kube.revision(),
                digest: Some(self.kube.digest()),
            })
        } else if changes.services.is_empty() {
            None
        } else {
            Some(Input::Endpoints {
                changes: self.kube.endpoints(&changes.services),
                revision: self.kube.revision(),
                digest: Some(self.kube.digest()),
            })
        }
    }

    /// Counts the beats refused, and says so at most once a minute: one
    /// line per batch, with the first node and why. Beats of a node whose
    /// identity is not known yet are only counted: that is every peer's
    /// first beat after a restart, until the records are read.
    fn beats_refused(&mut self, refused: &[(beats::Refused, String)]) {
        if refused.is_empty() {
            return;
        }
        for (why, _) in refused {
            self.telemetry.beat_refused(why.as_str());
        }
        let forged = refused
            .iter()
            .find(|(why, _)| *why != beats::Refused::Unknown);
        if let Some((why, node)) = forged
            && self
                .beats_warned
                .is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60))
        {
            self.beats_warned = Some(std::time::Instant::now());
            warn!(%node, reason = why.as_str(), count = refused.len(),
                "beats in a node's name that it did not prove; dropped (logged once a minute, counted in hostlb_agent_beats_refused_total)");
        }
    }

    fn on_tick(&mut self) {
        // Nodes' InternalIPs of either family, as far as the socket reaches.
        let mut seeds = self.kube.seeds(self.cfg.gossip.listen.port());
        seeds.retain(|s| self.cfg.gossip.reaches(s.ip()));
        if seeds != self.gossip.seeds_given && !seeds.is_empty() {
            self.gossip.membership.set_seeds(seeds.clone());
            self.gossip.seeds_given = seeds;
        }
        self.api_health();
        self.check_arp();
        self.drop_start_code();
        self.telemetry
            .ready
            .set(i64::from(self.telemetry.not_ready().is_none()));
        self.telemetry
            .vips_without_candidate
            .set(self.core.vips_without_candidate() as i64);
        // A node whose identity is not known yet spoke (its state or a
        // beat arrived): its record is listed soon.
        if self.identities.take_wanted() && !self.records.ask_keys() {
            self.identities.want_later();
        }
        // While gossip shows no peer, who runs elsewhere and their MACs
        // come from the records alone.
        if self.core.gossip_alone() {
            self.records.ask();
        } else {
            self.records.calm();
        }
    }

    /// After the core's last step: its final state is published; gossip
    /// tells the peers this node left.
    async fn finish(self) -> Result<(), AgentError> {
        let _ = self.gossip.membership.shutdown().await;
        self.publisher.stopped().await;
        Ok(())
    }

    fn status_doc(&self) -> StatusDoc {
        let mut doc = status::doc(
            &self.core,
            self.telemetry.not_ready(),
            self.kube.api_healthy(),
        );
        doc.warnings = self.telemetry.warnings();
        doc
    }
}

/// `recv` on a channel the agent may not have (no raw socket, no
/// detector link): pending forever then, so its `select!` arm never fires.
/// The gateway checks' next word, if they run.
async fn recv_lost(
    probe: &mut Option<crate::announce::gateway::GatewayProbe>,
) -> Option<crate::model::UpstreamLost> {
    match probe {
        Some(p) => p.lost.recv().await,
        None => std::future::pending().await,
    }
}

async fn recv_if<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `due`; without one, never (a `select!` arm for a timer
/// that is not set).
async fn sleep_until(due: Option<tokio::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
