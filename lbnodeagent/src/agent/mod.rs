//! `lbnodeagent run`: the reconcile loop that owns the agent's state.
//!
//! One task, one `select!` (see [`Agent::run`]): Kubernetes watches
//! ([`watches`]), gossip views ([`crate::gossip::Membership`]), kernel
//! address and link events ([`crate::addrs::Events`]), a one-second tick
//! (links and routes, renewals, retries, the watchdog), signals and
//! `/status` requests. Each wake-up marks what changed; then one
//! [`Agent::reconcile`] pass feeds the election (a new cluster view only
//! when objects changed, a whole-view membership update otherwise, which
//! re-elects only the VIPs a changed member can affect), turns this node's
//! duties into kernel addresses ([`links`]), applies the difference through
//! the address backend, announces what it acquired, publishes what it holds
//! in gossip and hands the annotations to the writer ([`report`]).
//!
//! The path of one VIP, from a Service to the kernel, is in `docs/agent.md`.
//!
//! Moves are make-before-break: a node that loses a VIP to a live winner
//! keeps it until that winner's gossip state shows it holds it (bounded by
//! [`HANDOVER_MAX`]), so a returning preferred node and a SIGTERM lose no
//! ARP reply. Only a node that cannot be heard (carrier lost) or a winner
//! that is not live lets go at once.

pub mod cleanup;
pub mod config;
pub mod conflict;
pub mod links;
mod report;
pub mod status;
pub mod telemetry;
mod watches;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hostlb_api::Family;
use hostlb_api::annotations::reasons;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, error, info, warn};

use crate::addrs::{
    AddressBackend, Applied, Events, Interface, KernelEvent, NetlinkBackend, NetlinkConfig,
};
use crate::announce::Announcer;
use crate::election::{Cluster, Election};
use crate::gossip::{GossipKeys, LocalState, Membership, MembershipView, Status};
use crate::inputs::Scope;
pub use config::AgentConfig;
use links::{Links, Mode, Want};
use report::{Announcing, EventRequest, ReportHandle};
use status::{HeldDoc, MemberDoc, StatusDoc, VipDoc};
use telemetry::Telemetry;
use watches::KubeInputs;

/// Longest wait, when giving a VIP to a live winner, for its gossip state to
/// show it holds the address before this node removes it anyway.
pub const HANDOVER_MAX: Duration = Duration::from_secs(2);
/// Longest a SIGTERM waits for the new winners before removing everything.
pub const LEAVE_MAX: Duration = Duration::from_secs(3);
/// How long a starting agent that hears from no peer waits before it acts
/// alone.
pub const STARTUP_GRACE: Duration = Duration::from_secs(2);
/// Longest wait, after the first peer shows up, for the failure detector to
/// confirm the nodes gossip reports.
pub const UNCONFIRMED_GRACE: Duration = Duration::from_secs(10);
/// Links and routes are re-read this often: route changes raise no event.
const TICK: Duration = Duration::from_secs(1);
/// A failed kernel operation on a VIP is retried after this, doubling.
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(30);
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
    #[error("kubeconfig {}: {message}", path.display())]
    Kubeconfig { path: PathBuf, message: String },
    #[error("cannot serve HTTP on {addr}: {source}")]
    Http {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(
        "gossip.advertise is not set and no address could be found on the announce interface; set it in the config"
    )]
    NoAdvertise,
}

/// A VIP the kernel holds for us.
struct Held {
    want: Want,
    /// Tells the announcer whether to keep sending.
    owned: watch::Sender<bool>,
    /// Set while giving the VIP to a live winner: when that began.
    handing_over: Option<Instant>,
}

impl Held {
    fn stop_announcing(&self) {
        self.owned.send_replace(false);
    }
}

struct Retry {
    at: Instant,
    delay: Duration,
}

/// The reconcile loop's state. See the module docs.
pub struct Agent<B: AddressBackend + 'static> {
    cfg: AgentConfig,
    config_path: PathBuf,
    backend: Arc<B>,
    announcer: Option<Arc<Announcer>>,
    membership: Membership,
    /// Kept to apply a reloaded key file to the open sockets.
    transport: crate::gossip::AuthTransport,
    views: watch::Receiver<MembershipView>,
    view: MembershipView,
    kube: KubeInputs,
    report: ReportHandle,
    telemetry: Arc<Telemetry>,
    election: Election,
    /// Services by address, oldest first, from the last cluster view.
    services_of: BTreeMap<IpAddr, Vec<String>>,
    object_errors: Vec<String>,
    links: Links,
    held: BTreeMap<IpAddr, Held>,
    /// Adopted from a previous run, not yet decided.
    adopted: Vec<crate::addrs::OwnedAddress>,
    retry: BTreeMap<IpAddr, Retry>,
    /// Addresses someone else holds on this host: reported once each.
    foreign: BTreeSet<IpAddr>,
    cluster_dirty: bool,
    members_dirty: bool,
    leaving: Option<Instant>,
    last_renew: Instant,
    /// When each member was last seen live, for the takeover metric.
    lost_at: BTreeMap<String, Instant>,
    peers_written: Vec<SocketAddr>,
    seeds_given: Vec<SocketAddr>,
    notified_ready: bool,
    /// Create the virtual interface at the next links refresh (after a
    /// reload changed its name); otherwise it is only looked up.
    ensure_virtual: bool,
    /// When gossip started, and when it first showed a peer: addresses are
    /// only touched once membership has settled (see `settled`).
    gossip_started: Instant,
    first_peer: Option<Instant>,
    settled: bool,
    /// Held VIPs and live members last told to systemd (`STATUS=`).
    last_status: (usize, usize),
    /// Second owners seen on the wire, and VIPs yielded to them.
    conflicts: conflict::Conflicts,
    claims: Option<mpsc::Receiver<crate::announce::packet::Claim>>,
    /// The addresses whose claims matter (held or yielded), for the task
    /// that reads the wire.
    watched: Arc<std::sync::RwLock<BTreeSet<IpAddr>>>,
    last_owner_probe: Instant,
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

async fn kube_client(cfg: &AgentConfig) -> Result<kube::Client, AgentError> {
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
    if let Ok(v) = format!(
        "hostlb-lbnodeagent/{} ({})",
        env!("CARGO_PKG_VERSION"),
        cfg.node_name
    )
    .parse()
    {
        config.headers.push((http::header::USER_AGENT, v));
    }
    kube::Client::try_from(config).map_err(|e| bad(e.to_string()))
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

impl<B: AddressBackend + 'static> Agent<B> {
    /// Reads the host, joins gossip and starts the watches; nothing is added
    /// or removed before [`run`](Self::run) has a complete cluster view.
    pub async fn start(
        mut cfg: AgentConfig,
        config_path: PathBuf,
        backend: Arc<B>,
        announcer: Option<Arc<Announcer>>,
    ) -> Result<Agent<B>, AgentError> {
        info!(node = %cfg.node_name, version = env!("CARGO_PKG_VERSION"), "starting");
        let telemetry = Telemetry::new();
        let links = read_links(&*backend, &cfg, true).await;
        let adopted = backend.adopt().await?;
        if !adopted.is_empty() {
            info!(count = adopted.len(), "found addresses of a previous run");
        }

        if cfg.gossip.advertise.is_none() && cfg.gossip.listen.ip().is_unspecified() {
            let family = if cfg.gossip.listen.is_ipv4() {
                Family::V4
            } else {
                Family::V6
            };
            let index = match family {
                Family::V4 => links.announce_v4,
                Family::V6 => links.announce_v6,
            };
            let ip = index
                .and_then(|i| links.by_index(i))
                .and_then(|i| i.prefixes_of(family).next().copied())
                .and_then(|p| source_address(&p))
                .ok_or(AgentError::NoAdvertise)?;
            cfg.gossip.advertise = Some(SocketAddr::new(ip, cfg.gossip.listen.port()));
        }
        let transport = cfg.gossip.auth_transport()?;
        telemetry.set_gossip_counters(transport.counters());
        let local = LocalState {
            status: Status::Alive,
            virtual_mode: links.virtual_link.is_some(),
            on_link: links.on_link(),
            vips: BTreeSet::new(),
            macs: links.macs(),
        };
        let membership = Membership::start(&cfg.gossip, local, &transport, &transport).await?;
        telemetry.set_gossip_held(membership.gossip_held_counter());
        telemetry.set_detector_counters(membership.detector_counters());
        let views = membership.views();
        let view = views.borrow().clone();

        let client = kube_client(&cfg).await?;
        let scope = Scope {
            namespace: cfg.namespace.clone(),
            load_balancer_class: cfg.load_balancer_class.clone(),
        };
        let kube = KubeInputs::start(&client, &scope);
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

        // Only claims on addresses held or yielded here reach the loop: a
        // busy LAN carries ARP for every host on it.
        let watched: Arc<std::sync::RwLock<BTreeSet<IpAddr>>> = Arc::default();
        let claims = match crate::announce::Claims::open() {
            Ok(claims) => {
                let (tx, rx) = mpsc::channel(256);
                let filter = watched.clone();
                tokio::spawn(async move {
                    loop {
                        match claims.next().await {
                            Ok(c) => {
                                let wanted = filter
                                    .read()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .contains(&c.ip);
                                // Dropped when the loop is busy: the next
                                // probe asks again.
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
        Ok(Agent {
            election: Election::new(&Cluster::default(), view.members.clone()),
            cfg,
            config_path,
            backend,
            announcer,
            membership,
            transport,
            views,
            view,
            kube,
            report,
            telemetry,
            services_of: BTreeMap::new(),
            object_errors: Vec::new(),
            links,
            held: BTreeMap::new(),
            adopted,
            retry: BTreeMap::new(),
            foreign: BTreeSet::new(),
            cluster_dirty: true,
            members_dirty: true,
            leaving: None,
            last_renew: Instant::now(),
            lost_at: BTreeMap::new(),
            peers_written: Vec::new(),
            seeds_given: Vec::new(),
            notified_ready: false,
            ensure_virtual: false,
            gossip_started: Instant::now(),
            first_peer: None,
            settled: false,
            last_status: (usize::MAX, 0),
            conflicts: conflict::Conflicts::default(),
            claims,
            watched,
            last_owner_probe: Instant::now(),
        })
    }

    /// The loop. Returns after a graceful leave (SIGTERM/SIGINT).
    pub async fn run(mut self) -> Result<(), AgentError> {
        let mut events = self.backend.subscribe().await?;
        self.drop_unheard_adopted().await;
        let mut hup = signal(SignalKind::hangup()).map_err(AgentError::Signals)?;
        let mut term = signal(SignalKind::terminate()).map_err(AgentError::Signals)?;
        let mut int = signal(SignalKind::interrupt()).map_err(AgentError::Signals)?;
        let (status_tx, mut status_rx) = mpsc::channel::<oneshot::Sender<StatusDoc>>(8);
        self.telemetry.set_status_channel(status_tx);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let watchdog = watchdog_interval();
        // Intervals, not sleeps re-created at every turn of the loop, which
        // a busy loop would never let expire.
        let mut probes = tokio::time::interval(conflict::YIELD_PROBE);
        probes.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut fast = tokio::time::interval(Duration::from_millis(50));
        fast.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let handover_pending = self.held.values().any(|h| h.handing_over.is_some())
                || self.leaving.is_some()
                || self.retry.values().any(|r| r.at <= Instant::now() + TICK)
                || !self.settled;
            tokio::select! {
                _ = self.kube.changed() => self.cluster_dirty = true,
                changed = self.views.changed() => {
                    if changed.is_err() {
                        error!("gossip stopped; exiting so the service manager restarts the agent");
                        return Err(AgentError::Gossip(crate::gossip::GossipError::Stopped(
                            "the membership task ended".into(),
                        )));
                    }
                    self.members_dirty = true;
                }
                ev = events.recv() => match ev {
                    Some(ev) => self.on_kernel_event(ev).await,
                    None => {
                        warn!("kernel event stream ended; subscribing again");
                        events = self.resubscribe().await;
                    }
                },
                _ = tick.tick() => self.on_tick().await,
                Some(claim) = recv_claim(&mut self.claims) => {
                    if !self.on_claim(claim).await {
                        continue;
                    }
                }
                _ = probes.tick() => {
                    self.probe_wire().await;
                    // Only an expiring yield needs a reconcile pass.
                    if self.conflicts.yielded().next().is_none() {
                        continue;
                    }
                }
                _ = fast.tick(), if handover_pending => {}
                _ = hup.recv() => self.reload(),
                _ = term.recv() => self.begin_leave("SIGTERM").await,
                _ = int.recv() => self.begin_leave("SIGINT").await,
                Some(reply) = status_rx.recv() => {
                    let _ = reply.send(self.status_doc());
                    continue;
                }
            }
            self.reconcile().await;
            if watchdog {
                notify(&[sd_notify::NotifyState::Watchdog]);
            }
            self.telemetry.beat();
            if let Some(started) = self.leaving {
                let local_left = self.held.values().any(|h| h.want.mode == Mode::Local);
                if !local_left || started.elapsed() >= LEAVE_MAX {
                    return self.finish_leave().await;
                }
            }
        }
    }

    async fn resubscribe(&mut self) -> Events {
        loop {
            match self.backend.subscribe().await {
                Ok(ev) => {
                    self.resync_kernel().await;
                    return ev;
                }
                Err(e) => {
                    warn!(error = %e, "cannot subscribe to kernel events; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// A host on the wire claims an address; `true` when that changed
    /// something the reconcile pass must see.
    async fn on_claim(&mut self, claim: crate::announce::packet::Claim) -> bool {
        let held = self
            .held
            .get(&claim.ip)
            .filter(|h| h.want.mode == Mode::Local && h.handing_over.is_none())
            .map(|h| h.want.clone());
        let verdict = self.conflicts.judge(
            claim,
            &self.cfg.node_name,
            &self.links.macs(),
            held.as_ref(),
            &self.election,
            |n| self.view.node(n).is_some(),
            Instant::now(),
        );
        match verdict {
            conflict::Verdict::Ignore => false,
            conflict::Verdict::Keep { other } => {
                warn!(ip = %claim.ip, %other, mac = %claim.mac,
                    "second owner on the wire; this node outranks it and keeps the address");
                self.telemetry.conflict("hostlb");
                if let (Some(h), Some(announcer)) =
                    (self.held.get(&claim.ip), self.announcer.clone())
                    && let Some(target) = h.want.target
                {
                    let garp = self.cfg.announce.garp;
                    let mut owned = h.owned.subscribe();
                    tokio::spawn(async move {
                        let _ = announcer.announce(&target, &garp, &mut owned).await;
                    });
                }
                false
            }
            conflict::Verdict::Yield { to } => {
                warn!(ip = %claim.ip, winner = %to, mac = %claim.mac,
                    "second owner on the wire; it outranks this node, which lets go while it answers");
                self.telemetry.conflict("hostlb");
                self.release(
                    claim.ip,
                    "another node that outranks this one answers for it",
                )
                .await;
                true
            }
            conflict::Verdict::Foreign { first } => {
                self.telemetry.conflict("foreign");
                if first {
                    warn!(ip = %claim.ip, mac = %claim.mac,
                        "another host answers for this address and it is no hostlb node; not fighting over it");
                    self.event_for(
                        claim.ip,
                        true,
                        "AddressConflict",
                        format!(
                            "{} holds {} but the host with MAC {} answers for it too, and it is no hostlb node",
                            self.cfg.node_name, claim.ip, claim.mac
                        ),
                    );
                }
                false
            }
        }
    }

    /// Before taking a VIP that no live node is handing over (its owner
    /// crashed, froze, or is cut off from gossip only): ask the LAN once and
    /// listen for [`conflict::PRECHECK`]. If a hostlb node that outranks this
    /// one still answers, this node stays off instead of becoming a second
    /// owner; the usual yield rules then apply.
    async fn answered_elsewhere(&mut self, want: &Want) -> bool {
        let (Some(announcer), Some(target)) = (self.announcer.clone(), want.target) else {
            return false;
        };
        let ip = want.vip.ip;
        let handed_over = self
            .view
            .nodes
            .iter()
            .any(|n| n.node != self.cfg.node_name && n.vips.contains(&ip));
        // Nobody else ever held it (a new Service's address): nobody to hear.
        let held_elsewhere = self
            .conflicts
            .last_holder(ip)
            .is_some_and(|n| n != self.cfg.node_name);
        if handed_over || !held_elsewhere || self.claims.is_none() {
            return false;
        }
        self.watched
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ip);
        if announcer.probe(&target).await.is_err() {
            return false;
        }
        let deadline = tokio::time::Instant::now() + conflict::PRECHECK;
        let own = self.links.macs();
        loop {
            let rx = self.claims.as_mut().expect("checked");
            let claim = match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(c)) => c,
                _ => return false,
            };
            // Claims for other addresses are dropped here; the next
            // probes ask again.
            if claim.ip != ip {
                continue;
            }
            let view = &self.view;
            let verdict = self.conflicts.judge(
                claim,
                &self.cfg.node_name,
                &own,
                Some(want),
                &self.election,
                |n| view.node(n).is_some(),
                Instant::now(),
            );
            match verdict {
                conflict::Verdict::Yield { to } => {
                    warn!(%ip, winner = %to, mac = %claim.mac,
                        "won, but a node that outranks this one still answers for it; staying off while it does");
                    self.telemetry.conflict("hostlb");
                    return true;
                }
                conflict::Verdict::Foreign { first: true } => {
                    // Reported once the address is held here and it
                    // still answers.
                    self.conflicts.forget_report(ip, claim.mac);
                }
                _ => {}
            }
        }
    }

    /// Asks the LAN about every VIP held here (each second) and every VIP
    /// yielded to another node (each [`conflict::YIELD_PROBE`]).
    async fn probe_wire(&mut self) {
        let Some(announcer) = self.announcer.clone() else {
            return;
        };
        let mut targets: Vec<crate::announce::Target> = self
            .conflicts
            .yielded()
            .filter_map(|(_, y)| y.want.target)
            .collect();
        if self.last_owner_probe.elapsed() >= conflict::OWNER_PROBE {
            self.last_owner_probe = Instant::now();
            targets.extend(
                self.held
                    .values()
                    .filter(|h| h.want.mode == Mode::Local && h.handing_over.is_none())
                    .filter_map(|h| h.want.target),
            );
        }
        for t in targets {
            if let Err(e) = announcer.probe(&t).await {
                debug!(ip = %t.ip, error = %e, "probe failed");
            }
        }
    }

    async fn on_tick(&mut self) {
        self.refresh_links().await;
        if let Some(every) = self.cfg.announce.lifetime.renew_every()
            && self.last_renew.elapsed() >= every
        {
            self.last_renew = Instant::now();
            self.renew().await;
        }
        let seeds = self.kube.seeds(self.cfg.gossip.listen.port());
        if seeds != self.seeds_given && !seeds.is_empty() {
            self.membership.set_seeds(seeds.clone());
            self.seeds_given = seeds;
        }
        self.telemetry
            .api_healthy
            .store(self.kube.api_healthy(), Ordering::Relaxed);
    }

    async fn on_kernel_event(&mut self, ev: KernelEvent) {
        match ev {
            KernelEvent::AddressRemoved(a) => {
                if let Some(h) = self.held.get(&a.ip)
                    && h.want.vip.ifindex == a.ifindex
                {
                    warn!(ip = %a.ip, interface = %a.interface, "address removed outside the agent; putting it back if still ours");
                    let h = self.held.remove(&a.ip).expect("present");
                    h.stop_announcing();
                }
            }
            KernelEvent::CarrierLost { ifindex, interface } => {
                if self.links.is_announce(ifindex)
                    || self.held.values().any(|h| h.want.vip.ifindex == ifindex)
                {
                    warn!(%interface, "carrier lost; releasing its VIPs");
                }
                self.refresh_links().await;
            }
            KernelEvent::CarrierRegained { interface, .. } => {
                info!(%interface, "carrier back");
                self.refresh_links().await;
            }
            KernelEvent::Resync => {
                self.refresh_links().await;
                self.resync_kernel().await;
            }
        }
    }

    /// Drops from the books what the kernel no longer holds.
    async fn resync_kernel(&mut self) {
        match self.backend.owned().await {
            Ok(owned) => {
                let there: HashSet<(u32, IpAddr)> =
                    owned.iter().map(|o| (o.ifindex, o.ip)).collect();
                let gone: Vec<IpAddr> = self
                    .held
                    .iter()
                    .filter(|(ip, h)| !there.contains(&(h.want.vip.ifindex, **ip)))
                    .map(|(ip, _)| *ip)
                    .collect();
                for ip in gone {
                    if let Some(h) = self.held.remove(&ip) {
                        h.stop_announcing();
                    }
                }
            }
            Err(e) => warn!(error = %e, "cannot read the kernel's addresses"),
        }
    }

    async fn refresh_links(&mut self) {
        let links = read_links(&*self.backend, &self.cfg, self.ensure_virtual).await;
        self.ensure_virtual = false;
        let carrier = [links.announce_v4, links.announce_v6]
            .into_iter()
            .flatten()
            .all(|i| links.by_index(i).is_some_and(|l| l.carrier));
        self.telemetry.carrier.store(carrier, Ordering::Relaxed);
        if links != self.links {
            debug!("links or routes changed");
            self.links = links;
            self.members_dirty = true;
            self.publish().await;
        }
        self.drop_unheard_adopted().await;
    }

    /// Removes an address a previous run of the agent left, saying why.
    async fn remove_previous(&self, a: &crate::addrs::OwnedAddress, why: &str) {
        match self
            .backend
            .remove(&a.vip(self.cfg.announce.lifetime))
            .await
        {
            Ok(_) => info!(ip = %a.ip, interface = %a.interface, reason = why,
                "removed an address of a previous run"),
            Err(e) => warn!(ip = %a.ip, error = %e, "cannot remove an address of a previous run"),
        }
    }

    /// Addresses of a previous run wait for the first reconcile to be kept
    /// or removed, except on a link without carrier: this node cannot be
    /// their owner there, and when the cable returns before the agent has
    /// a cluster view (the API server is behind that cable too) the kernel
    /// would answer for them beside their real owner.
    async fn drop_unheard_adopted(&mut self) {
        let (dead, live): (Vec<_>, Vec<_>) = std::mem::take(&mut self.adopted)
            .into_iter()
            .partition(|a| !self.links.by_index(a.ifindex).is_some_and(|l| l.carrier));
        self.adopted = live;
        for a in dead {
            self.remove_previous(&a, "its link has no carrier").await;
        }
    }

    async fn renew(&mut self) {
        let vips: Vec<(IpAddr, Want)> = self
            .held
            .iter()
            .map(|(ip, h)| (*ip, h.want.clone()))
            .collect();
        for (ip, want) in vips {
            match self.backend.add(&want.vip).await {
                Ok(Applied::Done) => self.telemetry.op("renew", true),
                Ok(Applied::NotOurs) => {
                    warn!(%ip, "address is no longer ours (added by hand?); leaving it alone");
                    if let Some(h) = self.held.remove(&ip) {
                        h.stop_announcing();
                    }
                }
                Err(e) => {
                    self.telemetry.op("renew", false);
                    warn!(%ip, error = %e, "renewing failed; retrying at the next renewal");
                }
            }
        }
    }

    fn reload(&mut self) {
        match AgentConfig::load(&self.config_path) {
            Ok(new) => {
                let restart = self.cfg.restart_only_changes(&new);
                if !restart.is_empty() {
                    warn!(keys = ?restart, "reloaded; these settings take effect only after a restart");
                }
                match GossipKeys::load(&new.gossip.key_file) {
                    Ok(keys) => self.transport.set_keys(keys),
                    Err(e) => {
                        error!(error = %e, "reload refused: the gossip key file is unusable; keeping the running config");
                        return;
                    }
                }
                self.ensure_virtual =
                    new.announce.virtual_interface != self.cfg.announce.virtual_interface;
                self.cfg.announce = new.announce;
                self.cfg.gossip.seeds = new.gossip.seeds;
                self.cfg.gossip.key_file = new.gossip.key_file;
                self.members_dirty = true;
                info!(config = %self.config_path.display(), "config reloaded");
            }
            Err(e) => {
                error!(error = %e, "reload refused; keeping the running config");
            }
        }
    }

    async fn begin_leave(&mut self, signal: &str) {
        if self.leaving.is_some() {
            return;
        }
        info!(
            signal,
            held = self.held.len(),
            "leaving: handing VIPs over before exit"
        );
        notify(&[sd_notify::NotifyState::Stopping]);
        self.telemetry.leaving.store(true, Ordering::Relaxed);
        self.leaving = Some(Instant::now());
        self.membership.set_leaving().await;
        self.members_dirty = true;
    }

    async fn finish_leave(mut self) -> Result<(), AgentError> {
        let ips: Vec<IpAddr> = self.held.keys().copied().collect();
        for ip in ips {
            self.release(ip, "shutting down").await;
        }
        self.publish().await;
        info!("left");
        let _ = self.membership.shutdown().await;
        Ok(())
    }

    /// One pass: election inputs, then kernel, gossip and API outputs.
    async fn reconcile(&mut self) {
        if !self.kube.synced() {
            return;
        }
        let started = Instant::now();
        let mut elected = false;
        if self.cluster_dirty {
            self.cluster_dirty = false;
            let (cluster, errors) = self.kube.cluster();
            self.note_object_errors(
                errors
                    .iter()
                    .map(|e| format!("{}: {}", e.object, e.message)),
            );
            self.services_of.clear();
            let mut services = cluster.services.clone();
            services.sort_by(|a, b| {
                hostlb_api::rules::age_key(a.created, &a.key)
                    .cmp(&hostlb_api::rules::age_key(b.created, &b.key))
            });
            for s in &services {
                for ip in &s.addresses {
                    self.services_of.entry(*ip).or_default().push(s.key.clone());
                }
            }
            self.election.set_cluster(&cluster);
            elected = true;
        }
        if self.members_dirty {
            self.members_dirty = false;
            let view = self.views.borrow_and_update().clone();
            let now = Instant::now();
            for m in &self.view.members {
                if view.member(&m.node).is_none() {
                    self.lost_at.insert(m.node.clone(), now);
                }
            }
            self.lost_at
                .retain(|_, t| now - *t < Duration::from_secs(30));
            self.election.set_members(&view.members);
            self.conflicts.learn(&view.nodes);
            self.telemetry.live_members.set(view.members.len() as i64);
            self.view = view;
            self.write_peers();
            elected = true;
        }
        if !self.membership_settled() {
            return;
        }
        let duties = self.election.duties(&self.cfg.node_name);
        if elected {
            self.telemetry.elections.inc();
            self.telemetry
                .election_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        let (wants, missing) = self.links.wants(&duties, self.cfg.announce.lifetime);
        for (ip, what) in missing {
            debug!(%ip, missing = %what, "won, but the interface is not there");
        }

        // Adopted addresses of a previous run: kept when still wanted here
        // (the add below renews them), removed otherwise.
        for a in std::mem::take(&mut self.adopted) {
            if wants.get(&a.ip).is_none_or(|w| w.vip.ifindex != a.ifindex) {
                self.remove_previous(&a, "this node no longer holds it")
                    .await;
            }
        }

        // Acquire first (make before break), then release.
        for (ip, want) in &wants {
            let current = self.held.get(ip);
            let held_here = current.is_some();
            if current.is_some_and(|h| same_place(&h.want, want)) {
                if let Some(h) = self.held.get_mut(ip)
                    && h.handing_over.take().is_some()
                {
                    info!(%ip, "kept: this node wins it again");
                    h.owned.send_replace(true);
                }
                continue;
            }
            if let Some(r) = self.retry.get(ip)
                && r.at > Instant::now()
            {
                continue;
            }
            let view = &self.view;
            if self
                .conflicts
                .holding_off(*ip, Instant::now(), |n| view.node(n).is_some())
            {
                continue;
            }
            if want.mode == Mode::Local && !held_here && self.answered_elsewhere(want).await {
                continue;
            }
            self.acquire(*ip, want.clone()).await;
        }
        let unwanted: Vec<IpAddr> = self
            .held
            .keys()
            .filter(|ip| !wants.contains_key(ip))
            .copied()
            .collect();
        for ip in unwanted {
            if self.may_release(ip) {
                self.release(ip, "lost the election").await;
            }
        }
        self.retry.retain(|ip, _| wants.contains_key(ip));
        self.conflicts.retain(|ip| wants.contains_key(ip));
        let watched: BTreeSet<IpAddr> = self
            .held
            .keys()
            .chain(self.conflicts.yielded().map(|(ip, _)| ip))
            .copied()
            .collect();
        *self.watched.write().unwrap_or_else(|e| e.into_inner()) = watched;

        self.publish().await;
        self.report_announcing(&wants);
        self.telemetry.owned_vips.set(self.held.len() as i64);
        let status = (self.held.len(), self.view.members.len());
        if status != self.last_status {
            self.last_status = status;
            notify(&[sd_notify::NotifyState::Status(&format!(
                "holding {} VIPs; {} live members",
                status.0, status.1
            ))]);
        }
        if !self.notified_ready {
            self.notified_ready = true;
            self.telemetry.applied.store(true, Ordering::Relaxed);
            info!(
                held = self.held.len(),
                members = self.view.members.len(),
                "first reconcile applied; ready"
            );
            notify(&[sd_notify::NotifyState::Ready]);
        }
    }

    /// Whether gossip has had time to show the other members. A node that
    /// elected before hearing from its peers would win every VIP alone and
    /// put them on the wire beside their real owners. Settled once a peer
    /// was seen, a few rounds passed (so its state, held VIPs included,
    /// arrived) and the failure detector has confirmed every node gossip
    /// reports (in a large cluster that takes a few seconds), or after
    /// [`STARTUP_GRACE`] with nobody to hear from (the first node of a
    /// cluster). Nodes the detector cannot reach hold it back for at most
    /// [`UNCONFIRMED_GRACE`].
    fn membership_settled(&mut self) -> bool {
        if self.settled {
            return true;
        }
        let now = Instant::now();
        // A node gossip reports but the detector has not confirmed yet is a
        // peer too: this node is not alone, so it must not settle as if it were.
        if self.view.unconfirmed > 0 || self.view.nodes.iter().any(|n| n.node != self.cfg.node_name)
        {
            let first = *self.first_peer.get_or_insert(now);
            let waited = now - first;
            self.settled = (waited >= self.cfg.gossip.interval * 3 && self.view.unconfirmed == 0)
                || waited >= UNCONFIRMED_GRACE;
            if self.settled && self.view.unconfirmed > 0 {
                warn!(
                    unconfirmed = self.view.unconfirmed,
                    "electing although the failure detector has not reached every node gossip reports alive"
                );
            }
        } else {
            self.settled = now - self.gossip_started >= STARTUP_GRACE;
        }
        if self.settled {
            debug!(
                peers = self.view.nodes.len().saturating_sub(1),
                "membership settled"
            );
        }
        self.settled
    }

    /// Whether a held VIP this node no longer wins may go now. A live winner
    /// that has not yet shown the VIP in its gossip state gets up to
    /// [`HANDOVER_MAX`]; meanwhile this node stops announcing but keeps
    /// answering, so no request goes unanswered.
    fn may_release(&mut self, ip: IpAddr) -> bool {
        let Some(h) = self.held.get_mut(&ip) else {
            return false;
        };
        if h.want.mode == Mode::Virtual {
            return true;
        }
        let link_up = self
            .links
            .by_index(h.want.vip.ifindex)
            .is_some_and(|l| l.carrier);
        let winner = self.election.winner(ip).map(str::to_string);
        let Some(winner) = winner.filter(|w| *w != self.cfg.node_name) else {
            return true;
        };
        if !link_up {
            return true;
        }
        let taken = self
            .view
            .node(&winner)
            .is_some_and(|n| n.vips.contains(&ip));
        if taken {
            return true;
        }
        let since = *h.handing_over.get_or_insert_with(|| {
            debug!(%ip, %winner, "handing over: waiting for the winner to hold it");
            Instant::now()
        });
        h.stop_announcing();
        if since.elapsed() >= HANDOVER_MAX {
            warn!(%ip, %winner, "the winner did not show the address in time; releasing anyway");
            return true;
        }
        false
    }

    async fn acquire(&mut self, ip: IpAddr, want: Want) {
        let previous = self.held.remove(&ip);
        let result = self.backend.add(&want.vip).await;
        self.telemetry.op("add", result.is_ok());
        match result {
            Ok(Applied::Done) => {
                self.retry.remove(&ip);
                self.foreign.remove(&ip);
                if let Some(p) = previous.filter(|p| p.want.vip.ifindex != want.vip.ifindex) {
                    p.stop_announcing();
                    let _ = self.backend.remove(&p.want.vip).await;
                }
                let (owned, rx) = watch::channel(true);
                if let (Some(target), Some(announcer)) = (want.target, self.announcer.clone()) {
                    let garp = self.cfg.announce.garp;
                    tokio::spawn(async move {
                        let mut rx = rx;
                        if let Err(e) = announcer.announce(&target, &garp, &mut rx).await {
                            warn!(ip = %target.ip, error = %e, "gratuitous ARP/NA failed");
                        }
                    });
                }
                info!(%ip, interface = %want.vip.interface, prefix_len = want.vip.prefix_len,
                    mode = ?want.mode, "acquired");
                self.observe_takeover(ip);
                let (reason, note) = match want.mode {
                    Mode::Local => (
                        reasons::ANNOUNCING_LOCAL,
                        format!(
                            "{} answers for {ip} on {}",
                            self.cfg.node_name, want.vip.interface
                        ),
                    ),
                    Mode::Virtual => (
                        reasons::ANNOUNCING_VIRTUAL,
                        format!(
                            "{} holds {ip} on {} for routing",
                            self.cfg.node_name, want.vip.interface
                        ),
                    ),
                };
                self.event_for(ip, false, reason, note);
                self.held.insert(
                    ip,
                    Held {
                        want,
                        owned,
                        handing_over: None,
                    },
                );
            }
            Ok(Applied::NotOurs) => {
                if let Some(p) = previous {
                    self.held.insert(ip, p);
                }
                if self.foreign.insert(ip) {
                    warn!(%ip, interface = %want.vip.interface,
                        "won, but the host already holds this address and the agent did not add it; leaving it alone");
                    self.event_for(
                        ip,
                        true,
                        "AddressConflict",
                        format!(
                            "{} won {ip} but {} already holds it, added outside hostlb; it is left alone",
                            self.cfg.node_name, want.vip.interface
                        ),
                    );
                }
            }
            Err(e) => {
                if let Some(p) = previous {
                    self.held.insert(ip, p);
                }
                let delay = self
                    .retry
                    .get(&ip)
                    .map(|r| (r.delay * 2).min(RETRY_MAX))
                    .unwrap_or(RETRY_MIN);
                warn!(%ip, error = %e, retry_in = ?delay, "cannot add the address");
                self.retry.insert(
                    ip,
                    Retry {
                        at: Instant::now() + delay,
                        delay,
                    },
                );
            }
        }
    }

    async fn release(&mut self, ip: IpAddr, why: &str) {
        let Some(h) = self.held.get(&ip) else { return };
        h.stop_announcing();
        let result = self.backend.remove(&h.want.vip).await;
        self.telemetry.op("remove", result.is_ok());
        match result {
            Ok(_) => {
                let h = self.held.remove(&ip).expect("present");
                info!(%ip, interface = %h.want.vip.interface, reason = why, "released");
                self.event_for(
                    ip,
                    false,
                    reasons::WITHDRAWN,
                    format!("{} no longer answers for {ip} ({why})", self.cfg.node_name),
                );
            }
            Err(e) => warn!(%ip, error = %e, "cannot remove the address; retrying"),
        }
    }

    fn observe_takeover(&mut self, ip: IpAddr) {
        // The previous holder per gossip, if it is one we saw go.
        let from = self
            .lost_at
            .iter()
            .filter(|(node, _)| {
                self.view
                    .nodes
                    .iter()
                    .all(|n| &n.node != *node || n.vips.contains(&ip))
            })
            .map(|(_, t)| *t)
            .max();
        if let Some(t) = from
            && t.elapsed() < Duration::from_secs(10)
        {
            self.telemetry
                .takeover_seconds
                .observe(t.elapsed().as_secs_f64());
        }
    }

    fn event_for(&self, ip: IpAddr, warning: bool, reason: &'static str, note: String) {
        for svc in self.services_of.get(&ip).into_iter().flatten() {
            self.report.event(
                &self.telemetry,
                EventRequest {
                    service: svc.clone(),
                    warning,
                    reason,
                    note: note.clone(),
                },
            );
        }
    }

    async fn publish(&mut self) {
        let local = LocalState {
            status: if self.leaving.is_some() {
                Status::Leaving
            } else {
                Status::Alive
            },
            virtual_mode: self.links.virtual_link.is_some(),
            on_link: self.links.on_link(),
            vips: self
                .held
                .iter()
                .filter(|(_, h)| h.want.mode == Mode::Local)
                .map(|(ip, _)| *ip)
                .collect(),
            macs: self.links.macs(),
        };
        self.membership.publish(local).await;
    }

    /// The annotations this node is responsible for: the VIPs it holds and
    /// wins, and, on the first live member by name, clearing those nobody
    /// announces.
    fn report_announcing(&self, wants: &BTreeMap<IpAddr, Want>) {
        let mut out = Announcing::new();
        let janitor = self
            .view
            .members
            .first()
            .is_some_and(|m| m.node == self.cfg.node_name);
        for (ip, svcs) in &self.services_of {
            let family = Family::of(*ip);
            let value = match wants.get(ip) {
                Some(w) if w.mode == Mode::Local && self.held.contains_key(ip) => {
                    Some(format!("{},{}", self.cfg.node_name, w.vip.interface))
                }
                _ if janitor && self.election.winner(*ip).is_none() => None,
                _ => continue,
            };
            for s in svcs {
                out.insert((s.clone(), family), value.clone());
            }
        }
        self.report.announcing.send_if_modified(|cur| {
            if *cur == out {
                false
            } else {
                *cur = out;
                true
            }
        });
    }

    fn note_object_errors(&mut self, errors: impl Iterator<Item = String>) {
        let errors: Vec<String> = errors.collect();
        for e in errors.iter().filter(|e| !self.object_errors.contains(e)) {
            warn!(error = %e, "object left out");
        }
        self.telemetry.object_errors.set(errors.len() as i64);
        self.object_errors = errors;
    }

    /// Peers for `cleanup`, which runs after this process is gone.
    fn write_peers(&mut self) {
        let mut peers: Vec<SocketAddr> = self
            .view
            .nodes
            .iter()
            .filter(|n| n.node != self.cfg.node_name)
            .map(|n| n.gossip_addr)
            .collect();
        peers.sort();
        if peers == self.peers_written {
            return;
        }
        let text: String = peers.iter().map(|p| format!("{p}\n")).collect();
        let path = self.cfg.run_dir.join(PEERS_FILE);
        let tmp = self.cfg.run_dir.join(format!("{PEERS_FILE}.tmp"));
        let written = std::fs::create_dir_all(&self.cfg.run_dir)
            .and_then(|()| std::fs::write(&tmp, text))
            .and_then(|()| std::fs::rename(&tmp, &path));
        match written {
            Ok(()) => self.peers_written = peers,
            Err(e) => debug!(error = %e, path = %path.display(), "cannot write the peer list"),
        }
    }

    fn status_doc(&self) -> StatusDoc {
        let not_ready = self.telemetry.not_ready();
        StatusDoc {
            node: self.cfg.node_name.clone(),
            ready: not_ready.is_none(),
            not_ready: not_ready.map(str::to_string),
            api_healthy: self.kube.api_healthy(),
            members: self
                .view
                .nodes
                .iter()
                .map(|n| MemberDoc {
                    node: n.node.clone(),
                    status: n.status.as_str().to_string(),
                    gossip: n.gossip_addr.to_string(),
                    version: n.agent_version.clone(),
                    prefixes: n
                        .on_link
                        .iter()
                        .map(|o| {
                            format!(
                                "{}@{}{}",
                                o.prefix,
                                o.interface,
                                if o.announce { "*" } else { "" }
                            )
                        })
                        .collect(),
                    vips: n.vips.len(),
                })
                .collect(),
            held: self
                .held
                .iter()
                .map(|(ip, h)| HeldDoc {
                    ip: *ip,
                    interface: h.want.vip.interface.clone(),
                    prefix_len: h.want.vip.prefix_len,
                    mode: format!("{:?}", h.want.mode).to_lowercase(),
                    handing_over: h.handing_over.is_some(),
                })
                .collect(),
            vips: self
                .election
                .report_all()
                .iter()
                .map(VipDoc::from_report)
                .collect(),
            object_errors: self.object_errors.clone(),
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

async fn recv_claim(
    claims: &mut Option<mpsc::Receiver<crate::announce::packet::Claim>>,
) -> Option<crate::announce::packet::Claim> {
    match claims {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn same_place(a: &Want, b: &Want) -> bool {
    a.vip.ifindex == b.vip.ifindex && a.vip.prefix_len == b.vip.prefix_len && a.mode == b.mode
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

fn watchdog_interval() -> bool {
    sd_notify::watchdog_enabled().is_some()
}

fn notify(state: &[sd_notify::NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_some()
        && let Err(e) = sd_notify::notify(state)
    {
        debug!(error = %e, "sd_notify failed");
    }
}
