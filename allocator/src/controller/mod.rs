//! The allocator controller: one loop that owns the [`Ledger`] and is the
//! only writer.
//!
//! Data flow: four watches (Services, IPAddressPools, Namespaces,
//! L2Advertisements) feed reflector stores and one event stream. Nothing is
//! decided until every watch has completed its first list; then, while this
//! replica holds the Lease, the ledger is rebuilt from every Service's status
//! (keep first, allocate after) and kept up to date event by event. Each
//! change the ledger reports becomes a status/annotation patch and an Event.
//! Losing the Lease stops all writes at once; winning it rebuilds from the
//! caches, so a hand-over never hands out an address twice.

mod status;
pub mod telemetry;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream::BoxStream};
use hostlb_api::{IPAddressPool, L2Advertisement};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::inputs::{self, Scope};
use crate::ledger::Ledger;
use telemetry::Telemetry;

/// How soon a failed write is tried again.
const RETRY_WRITES: Duration = Duration::from_secs(2);

/// How long a confirmation that this replica holds the Lease is trusted
/// before the Lease is read again (someone may have changed its holder).
const LEASE_CHECK: Duration = Duration::from_millis(500);

/// The field manager of every write, so `managedFields` show who owns what.
pub const FIELD_MANAGER: &str = "hostlb-allocator";

/// The longest a write may take, whatever the Lease duration.
const MAX_WRITE: Duration = Duration::from_secs(5);

/// The largest clock difference between replicas allowed for: another
/// replica judges our Lease expired on its own clock.
const MAX_SKEW: Duration = Duration::from_secs(1);

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

/// When a write started now must be done, on both sides.
fn write_deadline(timing: Timing) -> tokio::time::Instant {
    tokio::time::Instant::now() + timing.write
}

/// `write`, failed if it is not done by `deadline` (the server was told the
/// same, so it does not apply it later either).
async fn bounded<T>(
    deadline: tokio::time::Instant,
    write: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    tokio::time::timeout_at(deadline, write)
        .await
        .unwrap_or_else(|_| Err(kube::Error::Service("no answer in time".into())))
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
    if let Ok(v) = http::HeaderValue::from_str(&format!(
        "hostlb-allocator/{} ({identity})",
        env!("CARGO_PKG_VERSION")
    )) {
        config.headers.push((http::header::USER_AGENT, v));
    }
    config.default_retry = false;
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
}

/// A watch feeding a store, as one stream of inputs; errors are logged and
/// retried with backoff by the watcher.
fn watch_into<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    wrap: fn(watcher::Event<K>) -> Input,
) -> BoxStream<'static, Input>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let kind = K::kind(&()).to_string();
    watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .filter_map(move |ev| {
            let kind = kind.clone();
            async move {
                match ev {
                    Ok(e) => Some(wrap(e)),
                    Err(e) => {
                        warn!(%kind, error = %e, "watch failed; retrying");
                        None
                    }
                }
            }
        })
        .boxed()
}

/// What we wrote to a Service before the cache showed it.
struct Written {
    shown: status::Shown,
    /// resourceVersion our last write returned.
    rv: Option<String>,
    /// resourceVersion of the cached object when we wrote.
    before_rv: Option<String>,
}

impl Written {
    /// The cached object is at least as new as our write, so it is the
    /// truth again (someone may have changed it after us). resourceVersions
    /// are compared as numbers when both are (etcd revisions); otherwise any
    /// version other than the one we wrote over counts as newer.
    fn superseded_by(&self, svc: &Service) -> bool {
        let cached = svc.metadata.resource_version.as_deref();
        let as_num = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok());
        match (as_num(cached), as_num(self.rv.as_deref())) {
            (Some(c), Some(w)) => c >= w,
            _ => cached != self.before_rv.as_deref(),
        }
    }
}

/// Confirms, before writes, that the Lease is still ours for longer than a
/// write can take: the lease manager's view can lag when renewals fail.
struct LeaseGuard {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    /// When the Lease was last read and found ours, and when it ends, both
    /// on this replica's monotonic clock.
    confirmed: Option<(tokio::time::Instant, tokio::time::Instant)>,
}

impl LeaseGuard {
    async fn holds(&mut self) -> bool {
        let needed = self.timing.needed();
        if let Some((read, until)) = self.confirmed
            && read.elapsed() < LEASE_CHECK
            && until > tokio::time::Instant::now() + needed
        {
            return true;
        }
        self.confirmed = None;
        // The Lease's end is a wall-clock time: it is mapped onto the
        // monotonic clock as of before the read, so the read's own latency
        // only makes the answer more careful.
        let asked = tokio::time::Instant::now();
        let wall = jiff::Timestamp::now();
        // Bounded: the loop waits on this, and an API that does not answer
        // in time cannot confirm anything anyway.
        let lease = match tokio::time::timeout(LEASE_CHECK * 4, self.api.get_opt(&self.name)).await
        {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                warn!(error = %e, "cannot confirm the lease; writes wait");
                return false;
            }
            Err(_) => {
                warn!("cannot confirm the lease in time; writes wait");
                return false;
            }
        };
        let spec = lease.and_then(|l| l.spec).unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let left = spec
            .renew_time
            .zip(spec.lease_duration_seconds)
            .and_then(|(t, d)| {
                t.0.checked_add(jiff::SignedDuration::from_secs(d.into()))
                    .ok()
            })
            .and_then(|end| Duration::try_from(end.duration_since(wall)).ok());
        let until = left.map(|l| asked + l);
        if ours && let Some(until) = until {
            self.confirmed = Some((asked, until));
            if until > tokio::time::Instant::now() + needed {
                return true;
            }
        }
        warn!(holder = ?spec.holder_identity, left = ?left, needed = ?needed,
            "the lease is not (or not surely long enough) ours; writes wait");
        false
    }
}

struct Stores {
    services: Store<Service>,
    pools: Store<IPAddressPool>,
    namespaces: Store<Namespace>,
    advertisements: Store<L2Advertisement>,
}

/// The loop's state.
struct Loop {
    cfg: Config,
    client: Client,
    stores: Stores,
    telemetry: Arc<Telemetry>,
    recorder: Recorder,
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
    /// A pool or advertisement status write failed: retried soon.
    statuses_dirty: bool,
    /// The pools the ledger was last given: our own pool status writes come
    /// back as pool events and must not re-check every Service.
    pools_seen: Vec<crate::engine::PoolSpec>,
    guard: Option<LeaseGuard>,
    timing: Timing,
}

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
    let mut inputs = futures::stream::select_all(vec![
        watch_into(Api::<Service>::all(client.clone()), sw, |e| {
            Input::Service(Box::new(e))
        }),
        watch_into(
            Api::<IPAddressPool>::namespaced(client.clone(), &ns),
            pw,
            Input::Pool,
        ),
        watch_into(Api::<Namespace>::all(client.clone()), nw, Input::Namespace),
        watch_into(
            Api::<L2Advertisement>::namespaced(client.clone(), &ns),
            aw,
            Input::Advertisement,
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
        let (rx, task) = manager.watch().await;
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
    let timing = Timing::new(cfg.lease_duration, cfg.leader_election);
    let guard = cfg.leader_election.then(|| LeaseGuard {
        api: Api::namespaced(client.clone(), &ns),
        name: cfg.lease_name.clone(),
        identity: cfg.identity.clone(),
        timing,
        confirmed: None,
    });
    let mut leadership = leadership;
    let mut l = Loop {
        cfg: cfg.clone(),
        client,
        stores: Stores {
            services,
            pools,
            namespaces,
            advertisements,
        },
        telemetry: telemetry.clone(),
        recorder,
        synced: [false; 4],
        leader: *leadership.borrow_and_update(),
        ledger: None,
        written: HashMap::new(),
        reported: HashMap::new(),
        dirty: BTreeSet::new(),
        statuses_dirty: false,
        pools_seen: Vec::new(),
        guard,
        timing,
    };
    telemetry.set_leader(l.leader);
    let mut resync = tokio::time::interval(cfg.resync);
    resync.tick().await;
    let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
    let mut retry = tokio::time::interval(RETRY_WRITES);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            input = inputs.next() => match input {
                Some(i) => l.handle(i).await,
                None => return Err(Error::WatchesEnded),
            },
            changed = leadership.changed() => {
                if changed.is_err() {
                    // The lease task ended and this replica can never lead
                    // again: stop writing and exit, so it is restarted.
                    l.set_leader(false).await;
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
                l.set_leader(now).await;
            }
            _ = resync.tick() => {
                if l.ledger.is_some() {
                    info!("periodic resync");
                    l.activate().await;
                }
            }
            _ = heartbeat.tick() => telemetry.beat(),
            _ = retry.tick(), if !l.dirty.is_empty() || l.statuses_dirty => {
                let keys = std::mem::take(&mut l.dirty);
                l.statuses_dirty = false;
                l.write(keys).await;
                l.write_advertisements().await;
            }
            _ = shutdown.changed() => {
                info!("shutting down");
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

fn kind_index(i: &Input) -> usize {
    match i {
        Input::Service(_) => 0,
        Input::Pool(_) => 1,
        Input::Namespace(_) => 2,
        Input::Advertisement(_) => 3,
    }
}

fn is_init_done<K>(e: &watcher::Event<K>) -> bool {
    matches!(e, watcher::Event::InitDone)
}

impl Loop {
    fn synced(&self) -> bool {
        self.synced.iter().all(|s| *s)
    }

    async fn set_leader(&mut self, leader: bool) {
        if leader == self.leader {
            return;
        }
        self.leader = leader;
        self.telemetry.set_leader(leader);
        if leader {
            info!(identity = %self.cfg.identity, "acquired the lease");
            if self.synced() {
                self.activate().await;
            }
        } else {
            info!(identity = %self.cfg.identity, "lost the lease; writes stop");
            self.ledger = None;
            self.written.clear();
            self.dirty.clear();
            self.statuses_dirty = false;
            if let Some(g) = &mut self.guard {
                g.confirmed = None;
            }
        }
    }

    async fn handle(&mut self, input: Input) {
        let k = kind_index(&input);
        let done = match &input {
            Input::Service(e) => is_init_done(e.as_ref()),
            Input::Pool(e) => is_init_done(e),
            Input::Namespace(e) => is_init_done(e),
            Input::Advertisement(e) => is_init_done(e),
        };
        if done {
            let first = !self.synced[k];
            self.synced[k] = true;
            if self.synced() {
                self.telemetry.set_ready(true);
            }
            // A first list completing everything, or a re-list (after a 410
            // or a restart of the watch): decide everything from the caches.
            if self.synced() && self.leader && (first || self.ledger.is_some()) {
                self.activate().await;
            }
            return;
        }
        if self.ledger.is_none() {
            return;
        }
        match input {
            Input::Service(e) => match *e {
                watcher::Event::Apply(svc) => self.service_changed(&svc).await,
                watcher::Event::Delete(svc) => self.service_deleted(&svc).await,
                _ => {}
            },
            Input::Pool(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                let specs = self.pool_specs();
                if specs == self.pools_seen {
                    // Only a status changed (often our own write).
                    return;
                }
                self.pools_seen = specs.clone();
                let changed = self.ledger.as_mut().expect("active").set_pools(&specs);
                self.write(changed).await;
            }
            Input::Namespace(watcher::Event::Apply(ns)) => {
                let (name, labels) = inputs::namespace_labels(&ns);
                let changed = self
                    .ledger
                    .as_mut()
                    .expect("active")
                    .set_namespace(&name, labels);
                self.write(changed).await;
            }
            Input::Namespace(watcher::Event::Delete(ns)) => {
                let changed = self
                    .ledger
                    .as_mut()
                    .expect("active")
                    .remove_namespace(&ns.name_any());
                self.write(changed).await;
            }
            Input::Advertisement(watcher::Event::Apply(ad)) => {
                if self.lease_holds().await {
                    self.write_advertisement(&ad).await;
                } else {
                    self.statuses_dirty = true;
                }
            }
            _ => {}
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

    /// Writes go out only while the Lease is surely ours.
    async fn lease_holds(&mut self) -> bool {
        match &mut self.guard {
            Some(g) => g.holds().await,
            None => true,
        }
    }

    async fn service_deleted(&mut self, svc: &Service) {
        let key = inputs::service_key(svc);
        self.written.remove(&key);
        self.reported.remove(&key);
        let changed = self.ledger.as_mut().expect("active").remove(&key);
        self.write(changed).await;
    }

    async fn service_changed(&mut self, svc: &Service) {
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
        self.write(changed).await;
    }

    /// Rebuild the ledger from the caches and write every difference.
    async fn activate(&mut self) {
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
        self.write(all).await;
        self.write_advertisements().await;
    }

    async fn write_advertisement(&mut self, ad: &L2Advertisement) {
        let deadline = write_deadline(self.timing);
        if let Err(e) = bounded(
            deadline,
            status::write_advertisement(&self.client, ad, deadline),
        )
        .await
        {
            warn!(advertisement = %ad.name_any(), error = %e, "writing advertisement status failed; retrying");
            self.statuses_dirty = true;
        }
    }

    async fn write_advertisements(&mut self) {
        if self.ledger.is_none() || !self.leader || !self.lease_holds().await {
            return;
        }
        for ad in self.stores.advertisements.state() {
            self.write_advertisement(&ad).await;
        }
    }

    /// Make the cluster match the ledger for `keys`, then the pool statuses.
    async fn write(&mut self, keys: BTreeSet<String>) {
        if self.ledger.is_none() || !self.leader {
            return;
        }
        let mut refusals = self.ledger.as_mut().expect("checked").take_refusals();
        let mut keys = keys.into_iter();
        loop {
            // A long batch can outlast the Lease: confirm it again (read at
            // most every LEASE_CHECK) before each write.
            if !self.lease_holds().await {
                self.dirty.extend(keys);
                self.statuses_dirty = true;
                return;
            }
            let Some(key) = keys.next() else { break };
            let Some((ns, name)) = key.split_once('/') else {
                continue;
            };
            let Some(svc) = self.stores.services.get(&ObjectRef::new(name).within(ns)) else {
                continue;
            };
            let ledger = self.ledger.as_ref().expect("checked");
            if ledger.undecided(&key) {
                // Its namespace is not known yet; its status stays as it is.
                continue;
            }
            let answer = ledger.answer(&key).cloned();
            if let Some(r) = refusals.remove(&key) {
                self.report_refusal(&svc, &key, &r).await;
            }
            let before = self
                .overlay(&svc)
                .unwrap_or_else(|| status::Shown::of(&svc));
            let deadline = write_deadline(self.timing);
            match bounded(
                deadline,
                status::write_service(&self.client, &svc, &before, answer.as_ref(), deadline),
            )
            .await
            {
                Ok((after, rv)) => {
                    let assigned = after.ips != before.ips && !after.ips.is_empty();
                    if after != status::Shown::of(&svc) {
                        self.written.insert(
                            key.clone(),
                            Written {
                                shown: after,
                                rv,
                                before_rv: svc.metadata.resource_version.clone(),
                            },
                        );
                    }
                    self.report(&svc, &key, answer.as_ref(), assigned).await;
                }
                Err(e) => {
                    warn!(service = %key, error = %e, "writing status failed; retrying");
                    self.dirty.insert(key.clone());
                    self.report(&svc, &key, answer.as_ref(), false).await;
                }
            }
        }
        self.write_pools().await;
    }

    async fn write_pools(&mut self) {
        let Some(ledger) = &self.ledger else { return };
        let reports = ledger.report();
        self.telemetry.set_pools(&reports);
        self.telemetry.set_services(ledger.len());
        for p in self.stores.pools.state() {
            if !self.lease_holds().await {
                self.statuses_dirty = true;
                return;
            }
            if let Some(r) = reports.iter().find(|r| r.name == p.name_any())
                && let Err(e) = {
                    let deadline = write_deadline(self.timing);
                    bounded(deadline, status::write_pool(&self.client, &p, r, deadline)).await
                }
            {
                warn!(pool = %r.name, error = %e, "writing pool status failed; retrying");
                self.statuses_dirty = true;
            }
        }
    }

    /// A Warning that the Service's edit no longer fit the address it
    /// shared, which stays with the others.
    async fn report_refusal(&mut self, svc: &Service, key: &str, why: &crate::engine::AllocError) {
        warn!(service = %key, reason = %why, "edit refused");
        let ev = kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Warning,
            reason: hostlb_api::annotations::reasons::ALLOCATION_FAILED.into(),
            note: Some(why.to_string()),
            action: "Allocate".into(),
            secondary: None,
        };
        use kube::Resource;
        if let Err(e) = self.recorder.publish(&ev, &svc.object_ref(&())).await {
            debug!(service = %key, error = %e, "publishing an Event failed");
        }
    }

    /// Events for what changed: an address given, or a failure (once per
    /// distinct reason; again if publishing it failed).
    async fn report(
        &mut self,
        svc: &Service,
        key: &str,
        answer: Option<&crate::ledger::Answer>,
        assigned: bool,
    ) {
        use hostlb_api::annotations::reasons;
        // A failure, or a request not applied while the addresses are kept:
        // a Warning once per distinct reason.
        let failure = match answer {
            Some(Ok(a)) => a.pending.as_ref().map(|why| {
                let ips: Vec<String> = a.ips.iter().map(|i| i.to_string()).collect();
                format!("keeping {}: {why}", ips.join(", "))
            }),
            Some(Err(e)) => Some(e.to_string()),
            None => return,
        };
        let (type_, reason, note, failure) = match (failure, answer) {
            (Some(msg), _) => {
                if self.reported.get(key) == Some(&msg) {
                    return;
                }
                warn!(service = %key, reason = %msg, "allocation failed or not applied");
                (
                    kube::runtime::events::EventType::Warning,
                    reasons::ALLOCATION_FAILED,
                    msg.clone(),
                    Some(msg),
                )
            }
            (None, Some(Ok(a))) if assigned => {
                self.reported.remove(key);
                self.telemetry.allocated();
                let ips: Vec<String> = a.ips.iter().map(|i| i.to_string()).collect();
                info!(service = %key, addresses = %ips.join(","), pool = %a.pool, "assigned");
                (
                    kube::runtime::events::EventType::Normal,
                    reasons::IP_ALLOCATED,
                    format!("Assigned {} from pool {}", ips.join(", "), a.pool),
                    None,
                )
            }
            _ => {
                // Applied: the next failure is news again.
                self.reported.remove(key);
                return;
            }
        };
        let ev = kube::runtime::events::Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Allocate".into(),
            secondary: None,
        };
        use kube::Resource;
        match self.recorder.publish(&ev, &svc.object_ref(&())).await {
            Ok(()) => {
                if let Some(msg) = failure {
                    self.telemetry.failed();
                    self.reported.insert(key.to_string(), msg);
                }
            }
            Err(e) => debug!(service = %key, error = %e, "publishing an Event failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostlb_tests::apiserver::TestServer;
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
