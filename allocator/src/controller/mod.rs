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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream::BoxStream};
use hostlb_api::{IPAddressPool, L2Advertisement};
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

/// The field manager of every write, so `managedFields` show who owns what.
pub const FIELD_MANAGER: &str = "hostlb-allocator";

/// Name this replica in every request (`User-Agent`), so audit logs and
/// tests can tell replicas apart.
pub fn identify(config: &mut kube::Config, identity: &str) {
    if let Ok(v) = http::HeaderValue::from_str(&format!(
        "hostlb-allocator/{} ({identity})",
        env!("CARGO_PKG_VERSION")
    )) {
        config.headers.push((http::header::USER_AGENT, v));
    }
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
    /// not make the ledger act on the old status.
    written: HashMap<String, Vec<IpAddr>>,
    /// Last failure reported per Service, so a repeated failure is one Event.
    reported: HashMap<String, String>,
    /// Services whose write failed (API away, conflict): retried soon.
    dirty: BTreeSet<String>,
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
    let (mut leadership, lease_task) = if cfg.leader_election {
        let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &cfg.lease_name)
            .with_namespace(&ns)
            .with_identity(&cfg.identity)
            .with_duration(cfg.lease_duration)
            .with_grace(cfg.lease_duration.div_ceil(3).max(1))
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
                    // The lease task ended: treat as not leading.
                    l.set_leader(false).await;
                    leadership = watch::channel(false).1;
                    continue;
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
            _ = retry.tick(), if !l.dirty.is_empty() => {
                let keys = std::mem::take(&mut l.dirty);
                l.write(keys).await;
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
                status::write_advertisement(&self.client, &ad).await;
            }
            _ => {}
        }
    }

    fn pool_specs(&self) -> Vec<crate::engine::PoolSpec> {
        self.stores
            .pools
            .state()
            .iter()
            .map(|p| inputs::pool_spec(p))
            .collect()
    }

    /// The Service as the ledger should see it: with the status we wrote
    /// when the cache has not caught up yet.
    fn request_for(&mut self, svc: &Service) -> crate::engine::ServiceRequest {
        let mut r = inputs::service_request(svc);
        if let Some(w) = self.written.get(&r.key) {
            if *w == r.current {
                self.written.remove(&r.key);
            } else {
                r.current = w.clone();
            }
        }
        r
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
        let mut ledger = Ledger::new();
        let pools = self.pool_specs();
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
        for ad in self.stores.advertisements.state() {
            status::write_advertisement(&self.client, &ad).await;
        }
    }

    /// Make the cluster match the ledger for `keys`, then the pool statuses.
    async fn write(&mut self, keys: BTreeSet<String>) {
        let Some(ledger) = &self.ledger else { return };
        if !self.leader {
            return;
        }
        let mut answers: BTreeMap<String, Option<crate::ledger::Answer>> = BTreeMap::new();
        for k in &keys {
            answers.insert(k.clone(), ledger.answer(k).cloned());
        }
        for (key, answer) in answers {
            let Some((ns, name)) = key.split_once('/') else {
                continue;
            };
            let Some(svc) = self.stores.services.get(&ObjectRef::new(name).within(ns)) else {
                continue;
            };
            match status::write_service(&self.client, &svc, answer.as_ref()).await {
                Ok(Some(written)) => {
                    self.written.insert(key.clone(), written);
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(service = %key, error = %e, "writing status failed; retrying");
                    self.dirty.insert(key.clone());
                }
            }
            self.report(&svc, &key, answer.as_ref()).await;
        }
        let ledger = self.ledger.as_ref().expect("checked");
        let reports = ledger.report();
        self.telemetry.set_pools(&reports);
        self.telemetry.set_services(ledger.len());
        for p in self.stores.pools.state() {
            if let Some(r) = reports.iter().find(|r| r.name == p.name_any()) {
                status::write_pool(&self.client, &p, r).await;
            }
        }
    }

    /// Events for what changed: an address given, or a failure (once per
    /// distinct reason).
    async fn report(&mut self, svc: &Service, key: &str, answer: Option<&crate::ledger::Answer>) {
        let current = inputs::service_request(svc).current;
        let (type_, reason, note) = match answer {
            Some(Ok(a)) if a.ips != current => {
                self.reported.remove(key);
                self.telemetry.allocated();
                let ips: Vec<String> = a.ips.iter().map(|i| i.to_string()).collect();
                info!(service = %key, addresses = %ips.join(","), pool = %a.pool, "assigned");
                (
                    kube::runtime::events::EventType::Normal,
                    hostlb_api::annotations::reasons::IP_ALLOCATED,
                    format!("Assigned {} from pool {}", ips.join(", "), a.pool),
                )
            }
            Some(Err(e)) => {
                let msg = e.to_string();
                if self.reported.get(key) == Some(&msg) {
                    return;
                }
                self.reported.insert(key.to_string(), msg.clone());
                self.telemetry.failed();
                warn!(service = %key, reason = %msg, "allocation failed");
                (
                    kube::runtime::events::EventType::Warning,
                    hostlb_api::annotations::reasons::ALLOCATION_FAILED,
                    msg,
                )
            }
            _ => return,
        };
        let ev = kube::runtime::events::Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Allocate".into(),
            secondary: None,
        };
        use kube::Resource;
        if let Err(e) = self.recorder.publish(&ev, &svc.object_ref(&())).await {
            debug!(service = %key, error = %e, "publishing an Event failed");
        }
    }
}
