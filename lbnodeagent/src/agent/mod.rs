//! `lbnodeagent run`: the shell around the agent's [`core`].
//!
//! The core decides; this module does what it says and tells it what
//! happened. One task, one `select!` ([`Agent::run`]) over the Kubernetes
//! watches ([`watches`]), gossip views ([`crate::gossip::Membership`]),
//! kernel address and link events ([`crate::addrs::Events`]), claims heard
//! on the wire, the results of kernel operations, a one-second tick (links
//! and routes, which raise no event), the core's own deadline, signals and
//! `/status` requests. Each wake-up becomes one [`Input`]; the [`Actions`]
//! of [`Core::step`] are carried out without waiting on any of them: kernel
//! operations go as one batch to a worker task that feeds the results back,
//! announcements and probes are sent by tasks of their own, file writes run
//! on blocking threads. So the loop serves its inputs while a thousand
//! addresses are being added.
//!
//! The path of one VIP, from a Service to the kernel, is in `docs/agent.md`.

pub mod arp;
pub mod beats;
pub mod cleanup;
pub mod config;
pub mod core;
pub mod record;
pub mod report;
pub mod status;
pub mod telemetry;
mod watches;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use hostlb_api::Family;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, error, info, warn};

pub use self::core::{
    Actions, Core, HANDOVER_MAX, Input, LEAVE_MAX, Metric, OpKind, OpResult, STARTUP_GRACE,
    Settings, UNCONFIRMED_GRACE, conflict, links,
};
use crate::addrs::{AddressBackend, Events, Interface, KernelEvent, NetlinkBackend, NetlinkConfig};
use crate::announce::packet::Claim;
use crate::announce::{Announcer, Target};
use crate::gossip::{AuthTransport, GossipKeys, Membership, MembershipView};
use crate::inputs::Scope;
pub use config::AgentConfig;
use links::Links;
use report::ReportHandle;
use status::StatusDoc;
use telemetry::Telemetry;
use watches::KubeInputs;

/// Links and routes are re-read this often: route changes raise no event.
const TICK: Duration = Duration::from_secs(1);
/// systemd's watchdog is told the loop is turning at most this often.
const WATCHDOG_EVERY: Duration = Duration::from_millis(500);
/// The file `cleanup` reads peers from, in the run directory.
pub const PEERS_FILE: &str = "peers";

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
    #[error("cannot serve HTTP on {addr}: {source}")]
    Http {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("no free port to gossip from: {0}")]
    NoPort(std::io::Error),
    #[error(
        "gossip.advertise is not set and no address could be found on the announce interface; set it in the config"
    )]
    NoAdvertise,
}

/// The wire beside the kernel: announcements and probes go out through
/// the announcer; claims on the addresses the core watches come in.
struct Wire {
    announcer: Option<Arc<Announcer>>,
    claims: Option<mpsc::Receiver<Claim>>,
    /// The addresses whose claims reach the loop (a busy LAN carries ARP
    /// for every host on it), shared with the task that reads the wire.
    watched: Arc<RwLock<BTreeSet<IpAddr>>>,
}

/// Gossip, and what the shell remembers of it.
struct Gossip {
    membership: Membership,
    /// The owner sessions: beats sent, and beats received.
    beats: Option<beats::Beats>,
    beats_in: Option<mpsc::Receiver<(SocketAddr, Vec<u8>)>>,
    /// Kept to apply a reloaded key file to the open sockets.
    transport: AuthTransport,
    views: watch::Receiver<MembershipView>,
    seeds_given: Vec<SocketAddr>,
    peers_written: Vec<SocketAddr>,
}

/// Kernel address operations, carried out one batch after another by a
/// task of their own (see [`kernel_worker`]).
struct Kernel {
    batches: mpsc::UnboundedSender<KernelJob>,
    results: mpsc::UnboundedReceiver<Input>,
}

/// One batch for the kernel worker: addresses to add, then to remove,
/// then (`read`) our addresses read back for the core.
#[derive(Default)]
struct KernelJob {
    add: Vec<crate::addrs::VipAddress>,
    remove: Vec<crate::addrs::VipAddress>,
    read: bool,
}

impl Kernel {
    /// Asks for our addresses as the kernel has them once the operations
    /// asked for so far are done, as [`Input::KernelOwned`].
    fn read(&self) {
        // The worker lives as long as the agent.
        let _ = self.batches.send(KernelJob {
            read: true,
            ..KernelJob::default()
        });
    }
}

/// The shell's state. See the module docs.
pub struct Agent<B: AddressBackend + 'static> {
    core: Core,
    cfg: AgentConfig,
    config_path: PathBuf,
    backend: Arc<B>,
    wire: Wire,
    gossip: Gossip,
    kube: KubeInputs,
    report: ReportHandle,
    /// Every agent's record in the API, and this one's writer.
    records: record::Records,
    publisher: record::Publisher,
    /// A hash of the configuration in force, for the record.
    config_hash: String,
    /// The core's last conflict, and when it was seen.
    conflict_seen: Option<(core::ConflictSeen, jiff::Timestamp)>,
    telemetry: Arc<Telemetry>,
    kernel: Kernel,
    /// Create the virtual interface at the next links refresh (at start,
    /// and after a reload changed its name); otherwise it is only looked up.
    ensure_virtual: bool,
    /// The core has had a whole cluster view (later, changes of
    /// EndpointSlices alone go as endpoints).
    cluster_sent: bool,
}

/// Starts the agent on a real host and runs it until SIGTERM/SIGINT.
pub async fn run(config_path: &Path) -> Result<(), AgentError> {
    let cfg = AgentConfig::load(config_path)?;
    let backend = NetlinkBackend::new(NetlinkConfig {
        run_dir: cfg.run_dir.clone(),
        ..NetlinkConfig::default()
    })
    .await?;
    let announcer = match Announcer::new() {
        Ok(a) => Some(Arc::new(a)),
        Err(e) => {
            error!(error = %e, "cannot send gratuitous ARP/NA; VIPs will move as client caches expire");
            None
        }
    };
    Agent::start(cfg, config_path.to_path_buf(), Arc::new(backend), announcer)
        .await?
        .run()
        .await
}

/// What `lbnodeagent check` can tell without the network, beyond the file
/// itself: that the kubeconfig reads and resolves to a cluster and
/// credentials (certificates and token files loaded), and that the gossip
/// key file loads with a safe mode. Both would stop `run` at start; the
/// unit's `ExecStartPre=` check then fails with the reason instead.
pub async fn check_offline(cfg: &AgentConfig) -> Result<(), AgentError> {
    kube_client(cfg).await?;
    crate::gossip::GossipKeys::load(&cfg.gossip.key_file)?;
    Ok(())
}

/// The client, and the API server's URL (for log lines).
async fn kube_client(cfg: &AgentConfig) -> Result<(kube::Client, String), AgentError> {
    let bad = |message: String| AgentError::Kubeconfig {
        path: cfg.kubeconfig.clone(),
        message,
    };
    let kubeconfig =
        kube::config::Kubeconfig::read_from(&cfg.kubeconfig).map_err(|e| bad(e.to_string()))?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| bad(e.to_string()))?;
    // The client's own retries of 503s back off for minutes, during which
    // the watches look healthy; the watchers retry themselves, and report.
    config.default_retry = false;
    if let Ok(v) = format!("hostlb-lbnodeagent/{} ({})", crate::VERSION, cfg.node_name).parse() {
        config.headers.push((http::header::USER_AGENT, v));
    }
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(|e| bad(e.to_string()))?;
    Ok((client, server))
}

/// 12 hex digits of SHA-256: enough to tell two values apart at a glance.
fn short_hash(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The configuration in force, hashed without what names the node (its
/// name and its own addresses), so agents configured alike agree.
fn config_hash(cfg: &AgentConfig) -> String {
    let mut c = cfg.clone();
    c.node_name.clear();
    c.gossip.node_name.clear();
    c.gossip.advertise = None;
    short_hash(format!("{c:?}").as_bytes())
}

/// The address peers reach this node on when `gossip.advertise` is not
/// set and `listen` is a wildcard: its own address on the announce
/// interface, IPv4 when the host has one and the socket can take it,
/// otherwise IPv6. Every node picks the same way, so a fleet with IPv4
/// gossips over IPv4 and an IPv6-only fleet over IPv6; only a fleet mixing
/// IPv6-only hosts with others has to set it. A node with no announce
/// interface (no default route, a typo in `announce.interface`) still
/// gossips, and so tells its peers why it is no candidate: from its first
/// other link with carrier and an on-link prefix.
pub(crate) fn default_advertise(
    listen: SocketAddr,
    links: &Links,
) -> Result<SocketAddr, AgentError> {
    let families: &[Family] = if listen.is_ipv4() {
        &[Family::V4]
    } else {
        &[Family::V4, Family::V6]
    };
    let virtual_index = links.virtual_link.as_ref().map(|v| v.index);
    let own = |family: Family| {
        let announce = match family {
            Family::V4 => links.announce_v4,
            Family::V6 => links.announce_v6,
        };
        let first = |i: &Interface| i.prefixes_of(family).next().and_then(source_address);
        announce
            .and_then(|i| links.by_index(i))
            .and_then(first)
            .or_else(|| {
                links
                    .all
                    .iter()
                    .filter(|i| i.carrier && i.mac.is_some() && Some(i.index) != virtual_index)
                    .find_map(first)
            })
    };
    families
        .iter()
        .find_map(|f| own(*f))
        .map(|ip| SocketAddr::new(ip, listen.port()))
        .ok_or(AgentError::NoAdvertise)
}

/// The address the kernel would use to reach `prefix`: the interface's own
/// address there. A UDP connect sends nothing.
fn source_address(prefix: &hostlb_api::Prefix) -> Option<IpAddr> {
    let (first, last) = prefix.range().bounds();
    let target = hostlb_api::address::from_u128(prefix.family(), first.saturating_add(1).min(last));
    let bind: SocketAddr = match target {
        IpAddr::V4(_) => "0.0.0.0:0".parse().ok()?,
        IpAddr::V6(_) => "[::]:0".parse().ok()?,
    };
    let s = std::net::UdpSocket::bind(bind).ok()?;
    s.connect(SocketAddr::new(target, 9)).ok()?;
    Some(s.local_addr().ok()?.ip())
}

/// The core's settings from the configuration.
fn settings(cfg: &AgentConfig, wire: bool) -> Settings {
    Settings {
        node: cfg.node_name.clone(),
        lifetime: cfg.announce.lifetime,
        garp: cfg.announce.garp,
        gossip_interval: cfg.gossip.interval,
        wire,
        unable: unable(),
    }
}

/// Why this process cannot add addresses, if it cannot: CAP_NET_ADMIN
/// (bit 12) missing from its effective capabilities. Such an agent still
/// gossips and reports, but stands in no election.
fn unable() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())?;
    (caps & (1 << 12) == 0).then(|| {
        "no CAP_NET_ADMIN: this agent cannot add addresses, so it is no candidate (run it as the packaged unit does, with AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW)".to_string()
    })
}

impl<B: AddressBackend + 'static> Agent<B> {
    /// Reads the host, joins gossip (as `starting`) and starts the watches;
    /// nothing is added or removed before [`run`](Self::run) has a complete
    /// cluster view and membership has settled.
    pub async fn start(
        mut cfg: AgentConfig,
        config_path: PathBuf,
        backend: Arc<B>,
        announcer: Option<Arc<Announcer>>,
    ) -> Result<Agent<B>, AgentError> {
        info!(node = %cfg.node_name, version = crate::VERSION, "starting");
        let telemetry = Telemetry::new();
        let links = read_links(&*backend, &cfg, true).await;
        note_announce_interface(&telemetry, &cfg, &links);

        cfg.gossip.listen = cfg.gossip.usable_listen();
        if cfg.gossip.advertise.is_none() && cfg.gossip.listen.ip().is_unspecified() {
            cfg.gossip.advertise = Some(default_advertise(cfg.gossip.listen, &links)?);
        }
        let wire = open_wire(announcer);
        let core_settings = settings(&cfg, wire.announcer.is_some() && wire.claims.is_some());
        if let Some(why) = &core_settings.unable {
            error!("{why}");
            telemetry.cannot_serve.set(1);
        }
        let core = Core::new(core_settings, links, Instant::now());
        let transport = cfg.gossip.auth_transport()?;
        telemetry.set_gossip_counters(transport.counters());
        let membership =
            Membership::start(&cfg.gossip, core.local_state(), &transport, &transport).await?;
        telemetry.set_gossip_held(membership.gossip_held_counter());
        telemetry.set_detector_counters(membership.detector_counters());
        let views = membership.views();
        let (beats, beats_in) = match membership.take_beats() {
            Some(link) => (
                Some(beats::Beats::start(
                    cfg.node_name.clone(),
                    link.generation,
                    link.send,
                )),
                Some(link.recv),
            ),
            None => (None, None),
        };

        let (client, server) = kube_client(&cfg).await?;
        let scope = Scope {
            namespace: cfg.namespace.clone(),
            load_balancer_class: cfg.load_balancer_class.clone(),
        };
        let kube = KubeInputs::start(&client, &scope, &server);
        let mut records = record::Records::new(&client);
        records.ask();
        let publisher = record::Publisher::start(&client, &cfg.node_name);
        let report = report::start(
            client,
            &cfg.node_name,
            kube.services.clone(),
            telemetry.clone(),
        );

        let listener = tokio::net::TcpListener::bind(cfg.http_listen)
            .await
            .map_err(|source| AgentError::Http {
                addr: cfg.http_listen,
                source,
            })?;
        let router = telemetry::router(telemetry.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                error!(error = %e, "HTTP server stopped");
            }
        });
        let kernel = kernel_worker(backend.clone());
        let config_hash = config_hash(&cfg);
        Ok(Agent {
            core,
            cfg,
            config_path,
            backend,
            wire,
            gossip: Gossip {
                membership,
                beats,
                beats_in,
                transport,
                views,
                seeds_given: Vec::new(),
                peers_written: Vec::new(),
            },
            kube,
            report,
            records,
            publisher,
            config_hash,
            conflict_seen: None,
            telemetry,
            kernel,
            ensure_virtual: false,
            cluster_sent: false,
        })
    }

    /// The loop. Returns after a graceful leave (SIGTERM/SIGINT).
    pub async fn run(mut self) -> Result<(), AgentError> {
        // Subscribed before the kernel is read, so nothing falls between.
        let mut events = self.backend.subscribe().await?;
        let adopted = self.backend.adopt().await?;
        if self.step(Input::Adopted(adopted)).await {
            return self.finish().await;
        }
        let mut hup = signal(SignalKind::hangup()).map_err(AgentError::Signals)?;
        let mut term = signal(SignalKind::terminate()).map_err(AgentError::Signals)?;
        let mut int = signal(SignalKind::interrupt()).map_err(AgentError::Signals)?;
        let (status_tx, mut status_rx) = mpsc::channel::<oneshot::Sender<StatusDoc>>(8);
        self.telemetry.set_status_channel(status_tx);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The service is up (gossip joined, /readyz answering) even while
        // the API is away: a running, degraded service that is no
        // candidate until its first reconcile, not a start that times out
        // and loops. `/readyz` stays 503 until then.
        notify(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(if self.core.settings().unable.is_some() {
                "degraded: no CAP_NET_ADMIN, so not a candidate; peers serve"
            } else {
                "starting: waiting for the first reconcile; not a candidate yet"
            }),
        ]);
        let wake = tokio::time::sleep(Duration::from_secs(3600));
        tokio::pin!(wake);
        let watchdog = sd_notify::watchdog_enabled().is_some();
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
                    let view = self.gossip.views.borrow_and_update().clone();
                    Input::Members(view)
                }
                ev = events.recv() => match ev {
                    Some(ev) => match self.kernel_event(ev).await {
                        Some(input) => input,
                        None => continue,
                    },
                    None => {
                        warn!("kernel event stream ended; subscribing again");
                        events = self.resubscribe().await;
                        Input::Links(self.read_links().await)
                    }
                },
                _ = tick.tick() => {
                    self.on_tick();
                    Input::Links(self.read_links().await)
                }
                () = &mut wake => Input::Tick,
                listed = self.records.listed() => match listed {
                    Some(records) => Input::Records(records),
                    None => continue,
                },
                Some(claim) = recv_if(&mut self.wire.claims) => Input::Claim(claim),
                Some(first) = recv_if(&mut self.gossip.beats_in) => {
                    let rest = self.gossip.beats_in.as_mut().expect("a beat came from it");
                    Input::Beats(beats::drain(first, rest))
                }
                Some(done) = self.kernel.results.recv() => done,
                _ = hup.recv() => match self.reload().await {
                    Some(input) => input,
                    None => continue,
                },
                _ = term.recv() => Input::Leave,
                _ = int.recv() => Input::Leave,
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
            if watchdog && last_watchdog.elapsed() >= WATCHDOG_EVERY {
                last_watchdog = Instant::now();
                notify(&[sd_notify::NotifyState::Watchdog]);
            }
            self.telemetry.beat();
            if let Some(b) = &self.gossip.beats {
                b.turned();
            }
            if exit {
                return self.finish().await;
            }
        }
    }

    /// One step of the core, carried out. `true` when the core is done.
    async fn step(&mut self, input: Input) -> bool {
        let timed = matches!(
            input,
            Input::Cluster { .. } | Input::Members(_) | Input::Endpoints { .. } | Input::Links(_)
        );
        let started = Instant::now();
        let actions = self.core.step(started, input);
        if timed {
            self.telemetry
                .election_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        let exit = actions.exit;
        self.carry_out(actions).await;
        exit
    }

    /// Does what the core said, without waiting for any of it to finish.
    async fn carry_out(&mut self, a: Actions) {
        if !a.add.is_empty() || !a.remove.is_empty() || a.read_kernel {
            // The worker lives as long as the agent.
            let _ = self.kernel.batches.send(KernelJob {
                add: a.add,
                remove: a.remove,
                read: a.read_kernel,
            });
        }
        if let Some(announcer) = &self.wire.announcer {
            if !a.garp.is_empty() {
                let announcer = announcer.clone();
                tokio::spawn(send_each(a.garp, move |t| {
                    let announcer = announcer.clone();
                    async move { announcer.round(&t).await }
                }));
            }
            if !a.probe.is_empty() {
                let announcer = announcer.clone();
                tokio::spawn(send_each(a.probe, move |t| {
                    let announcer = announcer.clone();
                    async move { announcer.probe(&t).await }
                }));
            }
        }
        if let (Some(plan), Some(b)) = (a.beat, &self.gossip.beats) {
            b.set_plan(plan);
        }
        if let Some(watched) = a.watch {
            *self.wire.watched.write().unwrap_or_else(|e| e.into_inner()) = watched;
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
            notify(&[sd_notify::NotifyState::Stopping]);
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
            self.report.event(&self.telemetry, event);
        }
        for m in a.metrics {
            match m {
                Metric::Op { op, ok } => self.telemetry.op(op, ok),
                Metric::Conflict(kind) => {
                    self.telemetry.conflict(kind);
                    if kind == "foreign" {
                        // Perhaps a hostlb node gossip never showed.
                        self.records.ask();
                    }
                }
                Metric::Takeover(d) => {
                    self.telemetry.takeover_seconds.observe(d.as_secs_f64());
                }
                Metric::Elected => {
                    self.telemetry.elections.inc();
                }
            }
        }
        if a.ready {
            self.telemetry.applied.store(true, Ordering::Relaxed);
            notify(&[sd_notify::NotifyState::Ready]);
        }
        if let Some(status) = a.status {
            notify(&[sd_notify::NotifyState::Status(&status)]);
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
        if let Some(isolated) = a.isolated {
            self.telemetry.gossip_isolated.set(i64::from(isolated));
        }
        self.write_peers();
        if let Some(c) = self.core.last_conflict()
            && self.conflict_seen.as_ref().map(|(s, _)| s) != Some(c)
        {
            self.conflict_seen = Some((c.clone(), jiff::Timestamp::now()));
        }
        self.publisher.set(self.record());
    }

    /// This node's record as it should read now.
    fn record(&self) -> hostlb_api::NodeAgentStatus {
        use hostlb_api::{NodeAgentConflict, NodeAgentInterface};
        let not_ready = self.telemetry.not_ready();
        let state = match not_ready {
            None => record::READY,
            Some(_) if !self.telemetry.applied.load(Ordering::Relaxed) => record::STARTING,
            Some(_) => record::DEGRADED,
        };
        let links = self.core.links();
        let on_link = links.on_link();
        let interfaces: Vec<NodeAgentInterface> = links
            .all
            .iter()
            .filter(|i| i.mac.is_some() || on_link.iter().any(|o| o.interface == i.name))
            .map(|i| NodeAgentInterface {
                name: i.name.clone(),
                mac: i.mac.map(|m| m.to_string()).unwrap_or_default(),
                prefixes: on_link
                    .iter()
                    .filter(|o| o.interface == i.name)
                    .map(|o| o.prefix.to_string())
                    .collect(),
                announce: on_link.iter().any(|o| o.interface == i.name && o.announce),
            })
            .collect();
        let mut members: Vec<String> = self
            .core
            .view()
            .members
            .iter()
            .map(|m| m.node.clone())
            .collect();
        members.sort();
        let members_hash = short_hash(members.join("\n").as_bytes());
        let count = members.len() as i64;
        members.truncate(record::MAX_NAMES);
        let mut vips: Vec<IpAddr> = self.core.held().map(|(ip, _)| *ip).collect();
        vips.sort();
        let mut invalid: Vec<String> = self.core.object_errors().to_vec();
        invalid.truncate(record::MAX_INVALID);
        hostlb_api::NodeAgentStatus {
            heartbeat_time: None,
            last_change_time: None,
            version: crate::VERSION.to_string(),
            protocol: Some(crate::gossip::PROTOCOL),
            config_hash: self.config_hash.clone(),
            state: state.to_string(),
            reason: not_ready.map(str::to_string),
            gossip_address: self
                .cfg
                .gossip
                .advertise
                .map(|a| a.to_string())
                .unwrap_or_default(),
            macs: links.macs().iter().map(|m| m.to_string()).collect(),
            gossip_isolated: self.core.isolated(),
            members: count,
            member_names: members,
            members_hash,
            virtual_mode: links.virtual_link.is_some(),
            interfaces,
            held_vips: vips.len() as i64,
            vips: vips
                .iter()
                .take(record::MAX_VIPS)
                .map(|v| v.to_string())
                .collect(),
            invalid_objects: invalid,
            last_conflict: self
                .conflict_seen
                .as_ref()
                .map(|(c, at)| NodeAgentConflict {
                    address: c.ip.to_string(),
                    mac: c.mac.to_string(),
                    node: c.node.clone(),
                    outcome: c.outcome.to_string(),
                    time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(*at)),
                }),
        }
    }

    /// What the watches say changed, as the core's input: the whole view,
    /// or only some Services' endpoints. `None` before every watch listed.
    fn cluster_input(&mut self) -> Option<Input> {
        if !self.kube.synced() {
            return None;
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
            })
        } else if changes.services.is_empty() {
            None
        } else {
            Some(Input::Endpoints {
                changes: self.kube.endpoints(&changes.services),
                revision: self.kube.revision(),
            })
        }
    }

    async fn kernel_event(&mut self, ev: KernelEvent) -> Option<Input> {
        match ev {
            KernelEvent::AddressRemoved(a) => Some(Input::AddressRemoved(a)),
            KernelEvent::CarrierLost { ifindex, interface } => {
                if self.core.links().is_announce(ifindex)
                    || self.core.held().any(|(_, h)| h.vip.ifindex == ifindex)
                {
                    warn!(%interface, "carrier lost; releasing its VIPs");
                }
                Some(Input::Links(self.read_links().await))
            }
            KernelEvent::CarrierRegained { interface, .. } => {
                info!(%interface, "carrier back");
                Some(Input::Links(self.read_links().await))
            }
            KernelEvent::Resync => {
                // Read by the worker, after the operations in flight, so
                // that the read is not older than their results.
                self.kernel.read();
                Some(Input::Links(self.read_links().await))
            }
        }
    }

    async fn resubscribe(&mut self) -> Events {
        loop {
            match self.backend.subscribe().await {
                Ok(ev) => {
                    self.kernel.read();
                    return ev;
                }
                Err(e) => {
                    warn!(error = %e, "cannot subscribe to kernel events; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    async fn read_links(&mut self) -> Links {
        let links = read_links(&*self.backend, &self.cfg, self.ensure_virtual).await;
        self.ensure_virtual = false;
        note_announce_interface(&self.telemetry, &self.cfg, &links);
        let carrier = [links.announce_v4, links.announce_v6]
            .into_iter()
            .flatten()
            .all(|i| links.by_index(i).is_some_and(|l| l.carrier));
        self.telemetry.carrier.store(carrier, Ordering::Relaxed);
        links
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
        self.telemetry
            .ready
            .set(i64::from(self.telemetry.not_ready().is_none()));
        self.telemetry
            .vips_without_candidate
            .set(self.core.vips_without_candidate() as i64);
        // While gossip shows no peer, who runs elsewhere and their MACs
        // come from the records alone.
        if self.core.gossip_alone() {
            self.records.ask();
        } else {
            self.records.calm();
        }
    }

    /// Whether the host answers ARP for its VIPs on networks they do not
    /// belong to (see `arp`): said in the log when it changes, in
    /// `/readyz`, `status` and a metric while it lasts. A warning, not a
    /// failed readiness: the node serves its own VIPs correctly, and only
    /// the host's settings, which the agent may not change, can fix it.
    fn check_arp(&mut self) {
        let links = self.core.links();
        let held_on: BTreeSet<String> = self
            .core
            .held()
            .filter(|(ip, w)| ip.is_ipv4() && w.mode == core::links::Mode::Local)
            .map(|(_, w)| w.vip.interface.clone())
            .collect();
        let announce = links
            .announce_v4
            .and_then(|i| links.by_index(i))
            .map(|i| i.name.as_str());
        let virtual_index = links.virtual_link.as_ref().map(|v| v.index);
        let ethernet: Vec<String> = links
            .all
            .iter()
            .filter(|i| i.mac.is_some() && i.carrier && Some(i.index) != virtual_index)
            .map(|i| i.name.clone())
            .collect();
        let all = arp::read("all").unwrap_or_default();
        let by_interface = ethernet
            .iter()
            .filter_map(|n| arp::read(n).map(|s| (n.clone(), s)))
            .collect();
        let warnings: Vec<String> =
            arp::exposures(&held_on, announce, &ethernet, all, &by_interface)
                .iter()
                .map(|e| format!("VIPs exposed on another network: {e}"))
                .collect();
        self.telemetry.arp_exposed.set(warnings.len() as i64);
        let mut current = self
            .telemetry
            .warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *current != warnings {
            if warnings.is_empty() {
                info!("no interface answers ARP for VIPs of another any more");
            }
            for w in &warnings {
                warn!("{w}; docs/agent.md, \"Several networks per host\"");
            }
            *current = warnings;
        }
    }

    /// `/readyz` follows the watches as soon as one fails or recovers;
    /// systemd's STATUS says what a node without a first view waits for.
    fn api_health(&mut self) {
        let healthy = self.kube.api_healthy();
        let was = self.telemetry.api_healthy.swap(healthy, Ordering::Relaxed);
        if was != healthy && !self.telemetry.applied.load(Ordering::Relaxed) && !healthy {
            let status = format!(
                "degraded: waiting for the API server ({}) for a first view of the cluster; not a candidate",
                self.kube.server()
            );
            notify(&[sd_notify::NotifyState::Status(&status)]);
        }
    }

    /// SIGHUP: the new settings for the core, then the links again (the
    /// virtual interface may have another name).
    async fn reload(&mut self) -> Option<Input> {
        let new = match AgentConfig::load(&self.config_path) {
            Ok(new) => new,
            Err(e) => {
                error!(error = %e, "reload refused; keeping the running config");
                return None;
            }
        };
        // Compared as the running agent resolved them at start: an unset
        // advertise address is the one it worked out, not a change.
        let mut new = new;
        new.gossip.listen = new.gossip.usable_listen();
        if new.gossip.advertise.is_none() && new.gossip.listen == self.cfg.gossip.listen {
            new.gossip.advertise = self.cfg.gossip.advertise;
        }
        let restart = self.cfg.restart_only_changes(&new);
        if !restart.is_empty() {
            warn!(keys = ?restart, "reloaded; these settings take effect only after a restart");
        }
        match GossipKeys::load(&new.gossip.key_file) {
            Ok(keys) => self.gossip.transport.set_keys(keys),
            Err(e) => {
                error!(error = %e, "reload refused: the gossip key file is unusable; keeping the running config");
                return None;
            }
        }
        self.ensure_virtual = new.announce.virtual_interface != self.cfg.announce.virtual_interface;
        self.cfg.announce = new.announce;
        self.cfg.gossip.seeds = new.gossip.seeds;
        self.cfg.gossip.key_file = new.gossip.key_file;
        self.config_hash = config_hash(&self.cfg);
        info!(config = %self.config_path.display(), "config reloaded");
        let wire = self.core.settings().wire;
        self.step(Input::Settings(settings(&self.cfg, wire))).await;
        Some(Input::Links(self.read_links().await))
    }

    /// After the core's last step: its final state is published; gossip
    /// tells the peers this node left.
    async fn finish(self) -> Result<(), AgentError> {
        let _ = self.gossip.membership.shutdown().await;
        self.publisher.stopped().await;
        Ok(())
    }

    /// Peers for `cleanup`, which runs after this process is gone; written
    /// on a blocking thread.
    fn write_peers(&mut self) {
        let peers = self.core.peers();
        if peers == self.gossip.peers_written {
            return;
        }
        self.gossip.peers_written = peers.clone();
        let dir = self.cfg.run_dir.clone();
        tokio::task::spawn_blocking(move || {
            let text: String = peers.iter().map(|p| format!("{p}\n")).collect();
            let path = dir.join(PEERS_FILE);
            let tmp = dir.join(format!("{PEERS_FILE}.tmp"));
            let written = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&tmp, text))
                .and_then(|()| std::fs::rename(&tmp, &path));
            if let Err(e) = written {
                debug!(error = %e, path = %path.display(), "cannot write the peer list");
            }
        });
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

/// Opens the claim reader: only claims on the watched addresses reach the
/// loop, through a bounded channel whose overflow is dropped (the next
/// probe asks again).
fn open_wire(announcer: Option<Arc<Announcer>>) -> Wire {
    let watched: Arc<RwLock<BTreeSet<IpAddr>>> = Arc::default();
    let claims = match crate::announce::Claims::open() {
        Ok(claims) => {
            let (tx, rx) = mpsc::channel(1024);
            let filter = watched.clone();
            tokio::spawn(async move {
                loop {
                    match claims.next().await {
                        Ok(c) => {
                            let wanted = filter
                                .read()
                                .unwrap_or_else(|e| e.into_inner())
                                .contains(&c.ip);
                            if wanted && tx.try_send(c).is_err() && tx.is_closed() {
                                return;
                            }
                        }
                        Err(e) => {
                            warn!(error = %e, "reading ARP/ND failed");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            });
            Some(rx)
        }
        Err(e) => {
            error!(error = %e, "cannot watch the wire for second owners");
            None
        }
    };
    Wire {
        announcer,
        claims,
        watched,
    }
}

/// The kernel worker: batches in the order the core asked for them, each
/// carried out by the backend's batch calls, results back to the loop.
fn kernel_worker<B: AddressBackend + 'static>(backend: Arc<B>) -> Kernel {
    let (batches, mut rx) = mpsc::unbounded_channel::<KernelJob>();
    let (done, results) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(KernelJob {
            mut add,
            mut remove,
            mut read,
        }) = rx.recv().await
        {
            // Whatever queued up meanwhile goes in the same batch (one link
            // read, one record write): the core has at most one operation
            // in flight per VIP, so batches never disagree about one, and
            // a burst (a heal's conflicts settled one claim at a time) costs
            // one batch, not hundreds one after another. A read goes after
            // all of them: what it finds is then no older than any result.
            while let Ok(job) = rx.try_recv() {
                add.extend(job.add);
                remove.extend(job.remove);
                read |= job.read;
            }
            let mut out = Vec::with_capacity(add.len() + remove.len());
            for (kind, vips) in [(OpKind::Add, add), (OpKind::Remove, remove)] {
                if vips.is_empty() {
                    continue;
                }
                let results = match kind {
                    OpKind::Add => backend.add_many(&vips).await,
                    OpKind::Remove => backend.remove_many(&vips).await,
                };
                out.extend(vips.iter().zip(results).map(|(vip, result)| OpResult {
                    ip: vip.ip,
                    kind,
                    result: result.map_err(|e| e.to_string()),
                }));
            }
            if !out.is_empty() && done.send(Input::Done(out)).is_err() {
                return;
            }
            if read {
                match backend.owned().await {
                    Ok(owned) => {
                        if done.send(Input::KernelOwned(owned)).is_err() {
                            return;
                        }
                    }
                    Err(e) => warn!(error = %e, "cannot read the kernel's addresses"),
                }
            }
        }
    });
    Kernel { batches, results }
}

/// Sends one frame (or round) per target, logging failures: the core
/// decides what to send and when, this only sends it.
async fn send_each<F, Fut>(targets: Vec<Target>, send: F)
where
    F: Fn(Target) -> Fut,
    Fut: std::future::Future<Output = crate::announce::Result<()>>,
{
    for t in targets {
        if let Err(e) = send(t).await {
            debug!(ip = %t.ip, error = %e, "sending on the wire failed");
        }
    }
}

/// A new gossip key: 32 random bytes from the kernel, as hex.
pub fn keygen() -> std::io::Result<String> {
    use std::io::Read;
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    Ok(hex::encode(key))
}

/// `recv` on a channel the agent may not have (no raw socket, no
/// detector link): pending forever then, so its `select!` arm never fires.
async fn recv_if<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// The links snapshot; errors leave the affected part empty (logged), so a
/// missing default route means "no announce interface", not a crash.
async fn read_links<B: AddressBackend>(
    backend: &B,
    cfg: &AgentConfig,
    ensure_virtual: bool,
) -> Links {
    let all = match backend.interfaces().await {
        Ok(a) => a,
        Err(e) => {
            warn!(error = %e, "cannot read links");
            Vec::new()
        }
    };
    let configured = cfg.announce.interface.as_deref();
    let mut announce = [None, None];
    for (slot, family) in announce.iter_mut().zip([Family::V4, Family::V6]) {
        *slot = match backend.announce_interface(family, configured).await {
            Ok(i) => Some(i.index),
            Err(e) => {
                debug!(%family, error = %e, "no announce interface");
                None
            }
        };
    }
    let virtual_link = match &cfg.announce.virtual_interface {
        None => None,
        Some(name) if ensure_virtual => match backend.ensure_virtual_interface(name).await {
            Ok(i) => Some(i),
            Err(e) => {
                warn!(error = %e, "virtual mode is off");
                None
            }
        },
        Some(name) => all.iter().find(|i| i.name == *name).cloned(),
    };
    Links {
        all,
        announce_v4: announce[0],
        announce_v6: announce[1],
        virtual_link: virtual_link.map(|v: Interface| Interface {
            prefixes: Vec::new(),
            ..v
        }),
    }
}

/// A node with no announce interface publishes no subnet of its own in
/// gossip, so the election already leaves it out of every on-link VIP; this
/// says why, once per change, in the log, `/readyz` and a metric, so that
/// a typo in `announce.interface` is not a node that silently never serves.
fn note_announce_interface(telemetry: &Telemetry, cfg: &AgentConfig, links: &Links) {
    let missing = links.announce_v4.is_none() && links.announce_v6.is_none();
    let was = telemetry.no_announce_interface.set(i64::from(missing)) > 0;
    if missing && !was {
        match &cfg.announce.interface {
            Some(name) => error!(
                interface = %name,
                "announce.interface not found: no candidate for addresses on the host's subnets until it appears; peers serve them"
            ),
            None => error!(
                "no default route, so no announce interface: no candidate for addresses on the host's subnets until one appears; peers serve them"
            ),
        }
    } else if was && !missing {
        info!("announce interface found; a candidate again");
    }
}

fn notify(state: &[sd_notify::NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_some()
        && let Err(e) = sd_notify::notify(state)
    {
        debug!(error = %e, "sd_notify failed");
    }
}
