//! The allocator controller: one loop that owns the [`Ledger`] and is the
//! only writer.
//!
//! Data flow: four watches (Services, IPAddressPools, Namespaces,
//! L2Advertisements) feed reflector stores and one event stream; a fifth,
//! of the agents' NodeAgent records, only tells the pools which of their
//! addresses another host answers for (see [`hostlb_api::v1::addresses_in_use`]),
//! and nothing waits for it. Nothing is
//! decided until every watch has completed its first list; then, while this
//! replica holds the Lease, the ledger is rebuilt from every Service's status
//! (keep first, allocate after) and kept up to date event by event. Each
//! change the ledger reports becomes a status/annotation patch and an Event.
//! Losing the Lease stops all writes at once; winning it rebuilds from the
//! caches, so a hand-over never hands out an address twice.

mod events;
mod lease;
mod status;
pub mod telemetry;
mod watches;
mod writes;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hostlb_api::runtime::events::Recorder;
use hostlb_api::{IPAddressPool, L2Advertisement, NodeAgent};
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::inputs::{self, Scope};
use crate::ledger::Ledger;
use lease::{LeaseGuard, MAX_SKEW, watch_lease};
use telemetry::Telemetry;
use watches::{KINDS, is_answer, is_init_done, kind_index, watch_into};
use writes::{MAX_WRITE, Written};

/// How soon a failed write is tried again.
const RETRY_WRITES: Duration = Duration::from_secs(2);

/// The field manager of every write, so `managedFields` show who owns what.
pub const FIELD_MANAGER: &str = "hostlb-allocator";

/// How long writes may take and how much Lease they need.
///
/// A write started while the Lease is ours must be over, on the client and
/// on the server, before another replica can take the Lease and rebuild;
/// otherwise it could land after that replica handed the same address to
/// someone else. So a write starts only when the Lease has more than
/// `write + skew` left, the client gives up after `write`, and the server is
/// told (`timeout`) to apply it within what is left of `write`, or not at
/// all. The holder renews the Lease when half of it is left (see `run`),
/// which is more than `write + skew`, so writes never wait on a healthy
/// Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub write: Duration,
    pub skew: Duration,
}

impl Timing {
    /// A third of the Lease for a write, a tenth for clock skew, within
    /// [`MAX_WRITE`] and [`MAX_SKEW`]; without leader election, no skew.
    pub fn new(lease_duration: u64, leader_election: bool) -> Timing {
        if !leader_election {
            return Timing {
                write: MAX_WRITE,
                skew: Duration::ZERO,
            };
        }
        let d = Duration::from_secs(lease_duration);
        Timing {
            write: (d / 3).min(MAX_WRITE),
            skew: (d / 10).min(MAX_SKEW),
        }
    }

    /// How much Lease a write needs left when it starts.
    fn needed(&self) -> Duration {
        self.write + self.skew
    }
}

/// Prepares the client configuration for the controller.
///
/// Names this replica in every request (`User-Agent`), so audit logs and
/// tests can tell replicas apart. Turns off the client's own retries of
/// 429/503/504: they back off for up to minutes per request, during which
/// the Lease can pass to another replica and the write still land. The
/// controller retries failed writes itself, every few seconds, each time
/// after confirming the Lease again.
pub fn prepare_client(config: &mut kube::Config, identity: &str) {
    hostlb_api::runtime::client::prepare(config, "allocator", identity);
}

#[derive(Clone, Debug)]
pub struct Config {
    pub scope: Scope,
    /// This replica's name in the Lease and in Events.
    pub identity: String,
    pub lease_name: String,
    /// Seconds; a dead leader is replaced after about this long.
    pub lease_duration: u64,
    /// Off for a single replica that should never wait for a Lease.
    pub leader_election: bool,
    /// Full re-check of every Service against the caches, to heal anything a
    /// lost event left behind.
    pub resync: Duration,
}

impl Config {
    pub fn for_test(identity: &str) -> Self {
        Config {
            scope: Scope {
                namespace: "hostlb-system".into(),
                load_balancer_class: hostlb_api::annotations::DEFAULT_LOAD_BALANCER_CLASS.into(),
            },
            identity: identity.into(),
            lease_name: "hostlb-allocator".into(),
            lease_duration: 3,
            leader_election: true,
            resync: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    #[error("every watch stream ended")]
    WatchesEnded,
    #[error("leader election stopped: {0}")]
    LeaseEnded(String),
}

/// Events are boxed where they are large: one enum travels through the merged
/// stream for all four kinds.
enum Input {
    Service(Box<watcher::Event<Service>>),
    Pool(watcher::Event<IPAddressPool>),
    Namespace(watcher::Event<Namespace>),
    Advertisement(watcher::Event<L2Advertisement>),
    Agent(Box<watcher::Event<NodeAgent>>),
    /// A watch (by [`kind_index`]) failed; it retries by itself.
    WatchFailed(usize, String),
}

struct Stores {
    services: Store<Service>,
    pools: Store<IPAddressPool>,
    namespaces: Store<Namespace>,
    advertisements: Store<L2Advertisement>,
    agents: Store<NodeAgent>,
}

/// The loop's state.
struct Loop {
    cfg: Config,
    client: Client,
    stores: Stores,
    telemetry: Arc<Telemetry>,
    events: hostlb_api::runtime::events::Events,
    /// Kinds whose first list completed: services, pools, namespaces, ads.
    synced: [bool; 4],
    leader: bool,
    /// Present while active (leader and synced).
    ledger: Option<Ledger>,
    /// Status we wrote and the cache has not shown yet: a stale event must
    /// neither make the ledger act on the old status nor skip a write.
    written: HashMap<String, Written>,
    /// Last failure reported per Service, so a repeated failure is one Event.
    reported: HashMap<String, String>,
    /// Services whose write failed (API away, conflict): retried soon.
    dirty: BTreeSet<String>,
    /// Services to write in the next round, and whether the pools' and
    /// advertisements' statuses go with it.
    pending: BTreeSet<String>,
    pools_due: bool,
    ads_due: bool,
    /// A round is in flight.
    round: bool,
    /// Bumped when the Lease is lost: a round made before decides nothing.
    epoch: u64,
    /// What the round in flight writes to each of its Services.
    in_flight: HashMap<String, status::Shown>,
    rounds: tokio::sync::mpsc::UnboundedSender<writes::Done>,
    /// Set at shutdown: the round in flight starts no further batch.
    stopping: Arc<std::sync::atomic::AtomicBool>,
    /// A pool or advertisement status write failed: retried soon.
    statuses_dirty: bool,
    /// The pools the ledger was last given: our own pool status writes come
    /// back as pool events and must not re-check every Service.
    pools_seen: Vec<crate::engine::PoolSpec>,
    /// Addresses the agents found another host answering for, as the pools
    /// were last written with: records change often, this seldom.
    in_use: std::collections::BTreeMap<String, (String, String)>,
    /// The NodeAgent watch is failing (logged once; it decides nothing).
    agents_failing: bool,
    guard: Option<LeaseGuard>,
    timing: Timing,
    /// Watches (by [`kind_index`]) whose last attempt failed, and when.
    failing: [bool; 4],
    failed_at: [std::time::Instant; 4],
    /// The server took the last write.
    writes_ok: bool,
    /// When the server last took a write or answered a probe.
    last_write: std::time::Instant,
}

/// With no write this long, the loop asks the server whether it still takes
/// requests (for `/readyz`).
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// Run until `shutdown` turns true.
pub async fn run(
    client: Client,
    cfg: Config,
    telemetry: Arc<Telemetry>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), Error> {
    let ns = cfg.scope.namespace.clone();
    let (services, sw) = reflector::store();
    let (pools, pw) = reflector::store();
    let (namespaces, nw) = reflector::store();
    let (advertisements, aw) = reflector::store();
    let (agents, gw) = reflector::store();
    let mut inputs = futures::stream::select_all(vec![
        watch_into(
            Api::<Service>::all(client.clone()),
            sw,
            |e| Input::Service(Box::new(e)),
            0,
        ),
        watch_into(
            Api::<IPAddressPool>::namespaced(client.clone(), &ns),
            pw,
            Input::Pool,
            1,
        ),
        watch_into(
            Api::<Namespace>::all(client.clone()),
            nw,
            Input::Namespace,
            2,
        ),
        watch_into(
            Api::<L2Advertisement>::namespaced(client.clone(), &ns),
            aw,
            Input::Advertisement,
            3,
        ),
        watch_into(
            Api::<NodeAgent>::all(client.clone()),
            gw,
            |e| Input::Agent(Box::new(e)),
            watches::AGENTS,
        ),
    ]);

    // Without leader election this replica always leads; the sender is kept
    // so the receiver never reports it gone.
    let (_always, always_rx) = watch::channel(true);
    let (leadership, lease_task) = if cfg.leader_election {
        let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &cfg.lease_name)
            .with_namespace(&ns)
            .with_identity(&cfg.identity)
            .with_duration(cfg.lease_duration)
            // Renewed with half of it left: more than a write needs (Timing).
            .with_grace(cfg.lease_duration.div_ceil(2).max(1))
            .build()
            .await?;
        let (rx, task) = watch_lease(manager);
        (rx, Some(task))
    } else {
        (always_rx, None)
    };

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(cfg.identity.clone()),
        },
    );
    // Events are written off the loop; each outcome comes back as an input.
    let (outcomes, mut event_outcomes) = tokio::sync::mpsc::unbounded_channel();
    let events = hostlb_api::runtime::events::Events::start(
        recorder,
        Box::new(|_: &str| None),
        Arc::new(events::Outcomes {
            telemetry: telemetry.clone(),
            tx: outcomes,
        }),
        hostlb_api::runtime::events::Settings {
            in_flight: writes::WRITES_IN_FLIGHT,
            ..Default::default()
        },
    );
    let timing = Timing::new(cfg.lease_duration, cfg.leader_election);
    let guard = cfg.leader_election.then(|| LeaseGuard {
        api: Api::namespaced(client.clone(), &ns),
        name: cfg.lease_name.clone(),
        identity: cfg.identity.clone(),
        timing,
        confirmed: None,
    });
    let mut leadership = leadership;
    // Writes go in rounds off the loop; each comes back as an input.
    let (rounds_tx, mut rounds) = tokio::sync::mpsc::unbounded_channel();
    let mut l = Loop {
        cfg: cfg.clone(),
        client,
        stores: Stores {
            services,
            pools,
            namespaces,
            advertisements,
            agents,
        },
        telemetry: telemetry.clone(),
        events,
        synced: [false; 4],
        leader: *leadership.borrow_and_update(),
        ledger: None,
        written: HashMap::new(),
        reported: HashMap::new(),
        dirty: BTreeSet::new(),
        pending: BTreeSet::new(),
        pools_due: false,
        ads_due: false,
        round: false,
        epoch: 0,
        in_flight: HashMap::new(),
        rounds: rounds_tx,
        stopping: Default::default(),
        statuses_dirty: false,
        pools_seen: Vec::new(),
        in_use: Default::default(),
        agents_failing: false,
        guard,
        timing,
        failing: [false; 4],
        failed_at: [std::time::Instant::now(); 4],
        writes_ok: true,
        last_write: std::time::Instant::now(),
    };
    telemetry.set_leader(l.leader);
    let mut resync = tokio::time::interval(cfg.resync);
    resync.tick().await;
    let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
    let mut retry = tokio::time::interval(RETRY_WRITES);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Open watches do not show that the server takes requests (a stopping
    // server keeps them for a minute and refuses the rest): with no write
    // for PROBE_EVERY, one GET of its version says so, off the loop.
    let mut probe = tokio::time::interval(Duration::from_secs(1));
    probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (probed_tx, mut probed) = tokio::sync::mpsc::channel::<bool>(1);
    loop {
        tokio::select! {
            input = inputs.next() => match input {
                Some(i) => l.handle(i),
                None => return Err(Error::WatchesEnded),
            },
            changed = leadership.changed() => {
                if changed.is_err() {
                    // The lease task ended and this replica can never lead
                    // again: stop writing and exit, so it is restarted.
                    l.set_leader(false);
                    let why = match lease_task {
                        Some(task) => match task.await {
                            Ok(Ok(_)) => "released".to_string(),
                            Ok(Err(e)) => e.to_string(),
                            Err(e) => e.to_string(),
                        },
                        None => "no lease task".to_string(),
                    };
                    return Err(Error::LeaseEnded(why));
                }
                let now = *leadership.borrow_and_update();
                l.set_leader(now);
            }
            _ = resync.tick() => {
                if l.ledger.is_some() {
                    info!("periodic resync");
                    l.activate();
                }
            }
            _ = heartbeat.tick() => {
                telemetry.beat();
                l.quiet_watches();
            }
            _ = probe.tick() => {
                // Due after PROBE_EVERY without a write, or each second
                // while the server refuses (to see it back soon).
                if !l.writes_ok || l.last_write.elapsed() >= PROBE_EVERY {
                    let client = l.client.clone();
                    let tx = probed_tx.clone();
                    tokio::spawn(async move {
                        let ok = matches!(
                            tokio::time::timeout(Duration::from_secs(3), client.apiserver_version()).await,
                            Ok(Ok(_))
                        );
                        let _ = tx.try_send(ok);
                    });
                }
            }
            Some(ok) = probed.recv() => l.wrote(ok),
            Some(ok) = event_outcomes.recv() => l.wrote(ok),
            Some(done) = rounds.recv() => l.round_done(done),
            _ = retry.tick(), if !l.dirty.is_empty() || l.statuses_dirty => {
                let keys = std::mem::take(&mut l.dirty);
                l.statuses_dirty = false;
                l.ads_due = true;
                l.write(keys);
            }
            _ = shutdown.changed() => {
                info!("shutting down");
                // Writes in flight land before the Lease is released, or
                // not at all (their deadline): never under the next leader.
                l.stopping.store(true, std::sync::atomic::Ordering::Relaxed);
                if l.round {
                    let _ = tokio::time::timeout(MAX_WRITE * 2, rounds.recv()).await;
                }
                drop(leadership);
                if let Some(task) = lease_task {
                    // Dropping the receiver releases the Lease for the next replica.
                    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
                }
                return Ok(());
            }
        }
    }
}

impl Loop {
    fn synced(&self) -> bool {
        self.synced.iter().all(|s| *s)
    }

    fn set_leader(&mut self, leader: bool) {
        if leader == self.leader {
            return;
        }
        self.leader = leader;
        self.telemetry.set_leader(leader);
        if leader {
            info!(identity = %self.cfg.identity, "acquired the lease");
            if self.synced() {
                self.activate();
            }
        } else {
            info!(identity = %self.cfg.identity, "lost the lease; writes stop");
            self.ledger = None;
            self.written.clear();
            self.dirty.clear();
            self.statuses_dirty = false;
            self.epoch += 1;
            self.pending.clear();
            self.in_flight.clear();
            self.pools_due = false;
            self.ads_due = false;
            if let Some(g) = &mut self.guard {
                g.confirmed = None;
            }
        }
    }

    /// `/readyz`: every watch listed once, none failing now, and the
    /// server took the last write.
    fn update_ready(&self) {
        let ready = self.synced() && !self.failing.iter().any(|f| *f) && self.writes_ok;
        if ready != self.telemetry.is_ready() {
            info!(ready, synced = ?self.synced, failing = ?self.failing, writes_ok = self.writes_ok,
                "readiness changed");
        }
        self.telemetry.set_ready(ready);
    }

    /// A watch that reconnects from its last resourceVersion sees nothing
    /// until something changes, so silence is the sign: a failing watch
    /// retries within [`WatchBackoff::MAX`](hostlb_api::watch::WatchBackoff::MAX),
    /// and one with no new error for longer than that is watching again.
    /// (A server that takes the connection and never answers is caught by
    /// the probe of `/version` instead.)
    fn quiet_watches(&mut self) {
        let quiet = hostlb_api::watch::WatchBackoff::MAX + Duration::from_millis(500);
        let mut changed = false;
        for ((failing, at), kind) in self.failing.iter_mut().zip(&self.failed_at).zip(KINDS) {
            if *failing && at.elapsed() > quiet {
                *failing = false;
                changed = true;
                info!(kind, "watch recovered (no error since it reconnected)");
            }
        }
        if changed {
            self.update_ready();
        }
    }

    fn handle(&mut self, input: Input) {
        match &input {
            Input::Agent(e) => return self.agents_changed(e.as_ref()),
            Input::WatchFailed(watches::AGENTS, error) => {
                if !std::mem::replace(&mut self.agents_failing, true) {
                    warn!(error = %error, "cannot watch the NodeAgent records (is deploy/crds/hostlb.io_nodeagents.yaml applied?); pools will not say which addresses another host answers for");
                }
                return;
            }
            _ => {}
        }
        let k = kind_index(&input);
        let (done, answer) = match &input {
            Input::Service(e) => (is_init_done(e.as_ref()), is_answer(e.as_ref())),
            Input::Pool(e) => (is_init_done(e), is_answer(e)),
            Input::Namespace(e) => (is_init_done(e), is_answer(e)),
            Input::Advertisement(e) => (is_init_done(e), is_answer(e)),
            Input::Agent(_) => unreachable!("handled above"),
            Input::WatchFailed(_, error) => {
                // Logged once per outage, not on every retry.
                self.failed_at[k] = std::time::Instant::now();
                if !self.failing[k] {
                    self.failing[k] = true;
                    warn!(kind = KINDS[k], error = %error,
                        "watch failed; keeping the last known objects and retrying");
                    self.update_ready();
                }
                return;
            }
        };
        if answer && self.failing[k] {
            self.failing[k] = false;
            info!(kind = KINDS[k], "watch recovered");
            self.update_ready();
        }
        if done {
            let first = !self.synced[k];
            self.synced[k] = true;
            self.update_ready();
            // A first list completing everything, or a re-list (after a 410
            // or a restart of the watch): decide everything from the caches.
            if self.synced() && self.leader && (first || self.ledger.is_some()) {
                self.activate();
            }
            return;
        }
        if self.ledger.is_none() {
            return;
        }
        match input {
            Input::Service(e) => match *e {
                watcher::Event::Apply(svc) => self.service_changed(&svc),
                watcher::Event::Delete(svc) => self.service_deleted(&svc),
                _ => {}
            },
            Input::Pool(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                let specs = self.pool_specs();
                if specs == self.pools_seen {
                    // Only a status changed (often our own write, which
                    // writes nothing again), or an edit that leaves the
                    // addresses in force as they were (an invalid one, whose
                    // conditions must say so).
                    self.write_pools();
                    return;
                }
                self.pools_seen = specs.clone();
                let changed = self.ledger.as_mut().expect("active").set_pools(&specs);
                self.write(changed);
            }
            Input::Namespace(watcher::Event::Apply(ns)) => {
                let (name, labels) = inputs::namespace_labels(&ns);
                let changed = self
                    .ledger
                    .as_mut()
                    .expect("active")
                    .set_namespace(&name, labels);
                self.write(changed);
            }
            Input::Namespace(watcher::Event::Delete(ns)) => {
                let changed = self
                    .ledger
                    .as_mut()
                    .expect("active")
                    .remove_namespace(&ns.name_any());
                self.write(changed);
            }
            Input::Advertisement(watcher::Event::Apply(_)) => self.write_advertisements(),
            _ => {}
        }
    }

    /// The records changed: the pools are written again when what they
    /// should say of addresses in use changed.
    fn agents_changed(&mut self, e: &watcher::Event<NodeAgent>) {
        if is_answer(e) && std::mem::take(&mut self.agents_failing) {
            info!("NodeAgent watch recovered");
        }
        if matches!(e, watcher::Event::Init | watcher::Event::InitApply(_)) {
            return;
        }
        let records: Vec<NodeAgent> = self
            .stores
            .agents
            .state()
            .iter()
            .map(|a| (**a).clone())
            .collect();
        let in_use = hostlb_api::v1::addresses_in_use(&records, jiff::Timestamp::now());
        if in_use != self.in_use {
            self.in_use = in_use;
            self.write_pools();
        }
    }

    /// Pools sorted by name, so the same pools compare equal whatever
    /// order the cache lists them in.
    fn pool_specs(&self) -> Vec<crate::engine::PoolSpec> {
        let mut specs: Vec<_> = self
            .stores
            .pools
            .state()
            .iter()
            .map(|p| inputs::pool_spec(p))
            .collect();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        specs
    }

    /// What we wrote to the Service, while the cache has not caught up.
    fn overlay(&mut self, svc: &Service) -> Option<status::Shown> {
        let key = inputs::service_key(svc);
        if let Some(shown) = self.in_flight.get(&key) {
            return Some(shown.clone());
        }
        let w = self.written.get(&key)?;
        if w.shown == status::Shown::of(svc) || w.superseded_by(svc) {
            self.written.remove(&key);
            return None;
        }
        Some(w.shown.clone())
    }

    /// The Service as the ledger should see it: with the status we wrote
    /// when the cache has not caught up yet.
    fn request_for(&mut self, svc: &Service) -> crate::engine::ServiceRequest {
        let mut r = inputs::service_request(svc);
        if let Some(shown) = self.overlay(svc) {
            r.current = shown.ips;
            r.current_pool = shown.pool;
        }
        r
    }

    fn service_deleted(&mut self, svc: &Service) {
        let key = inputs::service_key(svc);
        self.written.remove(&key);
        self.reported.remove(&key);
        let changed = self.ledger.as_mut().expect("active").remove(&key);
        self.write(changed);
    }

    fn service_changed(&mut self, svc: &Service) {
        let key = inputs::service_key(svc);
        let changed = if self.cfg.scope.handles(svc) {
            let r = self.request_for(svc);
            self.ledger.as_mut().expect("active").upsert(r)
        } else {
            let mut c = self.ledger.as_mut().expect("active").remove(&key);
            // No longer a handled LoadBalancer: take back what we wrote.
            if status::ours(svc) {
                c.insert(key);
            }
            c
        };
        self.write(changed);
    }

    /// Rebuild the ledger from the caches and write every difference.
    fn activate(&mut self) {
        let mut ledger = Ledger::requiring_namespaces();
        let pools = self.pool_specs();
        self.pools_seen = pools.clone();
        let namespaces: Vec<_> = self
            .stores
            .namespaces
            .state()
            .iter()
            .map(|n| inputs::namespace_labels(n))
            .collect();
        ledger.load(&pools, namespaces);
        let mut all = BTreeSet::new();
        let services = self.stores.services.state();
        let present: std::collections::HashSet<String> =
            services.iter().map(|s| inputs::service_key(s)).collect();
        self.written.retain(|k, _| present.contains(k));
        self.reported.retain(|k, _| present.contains(k));
        for svc in &services {
            let key = inputs::service_key(svc);
            if self.cfg.scope.handles(svc) {
                let r = self.request_for(svc);
                ledger.insert(r);
                all.insert(key);
            } else if status::ours(svc) {
                all.insert(key);
            }
        }
        let started = std::time::Instant::now();
        ledger.rebuild();
        debug!(services = ledger.len(), took = ?started.elapsed(), "rebuilt allocations");
        self.ledger = Some(ledger);
        self.write(all);
        self.write_advertisements();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostlb_tests::apiserver::TestServer;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Patch, PatchParams};
    use serde_json::json;

    async fn guard_against(server: &TestServer, lease: serde_json::Value) -> bool {
        let api: Api<Lease> = Api::namespaced(server.client(), "hostlb-system");
        api.patch(
            "hostlb-allocator",
            &PatchParams::apply("test").force(),
            &Patch::Apply(
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "hostlb-allocator"}, "spec": lease}),
            ),
        )
        .await
        .unwrap();
        let mut g = LeaseGuard {
            api,
            name: "hostlb-allocator".into(),
            identity: "me".into(),
            timing: Timing::new(15, true),
            confirmed: None,
        };
        g.holds().await
    }

    fn ago(secs: i64) -> String {
        (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(secs)).to_string()
    }

    #[tokio::test]
    async fn writes_wait_unless_the_lease_is_surely_ours() {
        let server = TestServer::start().await;
        let nss: Api<Namespace> = Api::all(server.client());
        nss.create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "hostlb-system"}})).unwrap(),
        )
        .await
        .unwrap();
        let lease = |holder: &str, renewed: i64, duration: i32| json!({"holderIdentity": holder, "renewTime": ago(renewed), "leaseDurationSeconds": duration});
        assert!(guard_against(&server, lease("me", 1, 15)).await);
        assert!(!guard_against(&server, lease("other", 1, 15)).await);
        // Ours, but with less left than a write (5 s) and the clock margin
        // (1 s) need: a write started now could land after it expires.
        assert_eq!(Timing::new(15, true).needed(), Duration::from_secs(6));
        assert!(!guard_against(&server, lease("me", 10, 15)).await);
        assert!(guard_against(&server, lease("me", 8, 15)).await);
        // Ours, but expired or about to: the manager may not know yet.
        assert!(!guard_against(&server, lease("me", 20, 15)).await);
        assert!(!guard_against(&server, lease("me", 15, 15)).await);
        assert!(!guard_against(&server, json!({"holderIdentity": "me"})).await);
        // The API away: no confirmation, no writes.
        server.set_unavailable();
        let mut g = LeaseGuard {
            api: Api::namespaced(server.client(), "hostlb-system"),
            name: "hostlb-allocator".into(),
            identity: "me".into(),
            timing: Timing::new(15, true),
            confirmed: None,
        };
        assert!(!g.holds().await);
    }
}
