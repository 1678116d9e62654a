//! The agent's view of the cluster: five watches (Services, EndpointSlices,
//! Nodes, IPAddressPools, L2Advertisements) into reflector stores (the
//! EndpointSlices as compact [`SliceEndpoints`] records), a sixth
//! of this node's own NodeAgent record for its `spec.drain`, and a
//! [`Notify`] the reconcile loop waits on. The watches also note what
//! changed ([`Changes`]): when only EndpointSlices did, the loop hands the
//! core just those Services' endpoints instead of a whole new cluster view.
//!
//! The stores outlive an API outage: when the API server is unreachable the
//! watches retry with backoff and the stores keep the last known objects, so
//! the loop goes on electing (and failing over on membership changes) from
//! them. [`KubeInputs::api_healthy`] says whether the watches are currently
//! failing, for `/readyz`.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use futures::StreamExt;
use hostlb_api::annotations::OUT_OF_SERVICE_TAINT;
use hostlb_api::snapshot::ObjectError;
use hostlb_api::{IPAddressPool, L2Advertisement, NodeAgent};
use k8s_openapi::api::core::v1::{
    Node, NodeCondition, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec, Taint,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::election::{Cluster, Endpoints};
use crate::inputs::{self, EndpointIndex, Scope, ServiceRecord, SliceEndpoints};

const WATCHES: usize = 6;

/// Stores of the objects the election reads, kept current by watches.
pub struct KubeInputs {
    /// Shared with the writers of annotations and Events, which read the
    /// same records.
    pub services: ServiceRecords,
    /// What the election reads of each EndpointSlice: at 1,000 Services
    /// the trimmed objects took 0.8 MiB more of the heap (docs/agent.md).
    slices: Records<SliceEndpoints>,
    pub nodes: Store<Node>,
    pub pools: Store<IPAddressPool>,
    pub advertisements: Store<L2Advertisement>,
    /// This node's own record, for its drain (the agent writes its status
    /// elsewhere, and reads no other record's spec).
    own_record: Store<NodeAgent>,
    /// This node's name, for its Node's taint.
    node: String,
    scope: Scope,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

struct Shared {
    changed: Notify,
    /// Watches that have completed their first list.
    synced: AtomicUsize,
    /// Watches whose last attempt failed.
    failing: AtomicUsize,
    failed: [AtomicBool; WATCHES],
    changes: Mutex<Changes>,
    /// The newest resourceVersion seen in any watch event.
    revision: AtomicU64,
    /// What the stores hold that dates the view, as the XOR of each
    /// object's [`fingerprint`] (see [`KubeInputs::digest`]).
    digest: AtomicU64,
    /// The API server's URL, for the log lines of failing watches.
    server: String,
    /// Bumped to make every watch start again (see
    /// [`KubeInputs::restart`]).
    restarts: tokio::sync::watch::Sender<u64>,
    /// Watches restarted that have not completed their list yet: until
    /// they all have, the loop builds no view (one kind listed anew beside
    /// another still old is no view the cluster ever had).
    relisting: AtomicUsize,
}

/// What changed since the loop last looked.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Something other than an EndpointSlice changed (or a watch listed
    /// again): the whole cluster view is needed.
    pub full: bool,
    /// `(namespace, service)` of the EndpointSlices that changed.
    pub services: BTreeSet<(String, String)>,
}

/// What a changed object asks of the loop.
enum Touch {
    /// A new view of the whole cluster.
    Whole,
    /// Only this Service's endpoints (`namespace`, `name`).
    Endpoints((String, String)),
    /// No new view: the loop reads what it needs from the store. Its
    /// versions do not date the view either (see `spawn_watch`).
    Store,
}

/// The Service an EndpointSlice belongs to.
fn slice_service(slice: &EndpointSlice) -> Option<(String, String)> {
    let name = slice
        .metadata
        .labels
        .as_ref()?
        .get("kubernetes.io/service-name")?;
    Some((slice.metadata.namespace.clone()?, name.clone()))
}

fn slice_touch(slice: &EndpointSlice) -> Touch {
    slice_service(slice).map_or(Touch::Whole, Touch::Endpoints)
}

/// Most kinds: every change needs the whole view.
fn whole<K>(_: &K) -> Touch {
    Touch::Whole
}

/// The own record changes with every status the agent writes; only its
/// spec is read, through [`KubeInputs::drain`].
fn store_only<K>(_: &K) -> Touch {
    Touch::Store
}

impl KubeInputs {
    /// `server` is the API server's URL, named when a watch fails; `node`
    /// names this node's record.
    pub fn start(client: &Client, scope: &Scope, server: &str, node: &str) -> KubeInputs {
        let shared = Arc::new(Shared {
            changed: Notify::new(),
            synced: AtomicUsize::new(0),
            failing: AtomicUsize::new(0),
            failed: Default::default(),
            changes: Mutex::new(Changes::default()),
            revision: AtomicU64::new(0),
            digest: AtomicU64::new(0),
            server: server.to_string(),
            restarts: tokio::sync::watch::Sender::new(0),
            relisting: AtomicUsize::new(0),
        });
        let services = Records::default();
        let slices = Records::default();
        let (nodes, nw) = reflector::store();
        let (pools, pw) = reflector::store();
        let (advertisements, aw) = reflector::store();
        let (own_record, rw) = reflector::store();
        let ns = &scope.namespace;
        let all = watcher::Config::default;
        let tasks = vec![
            spawn_watch(
                Api::<Service>::all(client.clone()),
                all(),
                services.sink(|s| Some(ServiceRecord::of(s))),
                shared.clone(),
                0,
                whole,
                trim_service,
            ),
            spawn_watch(
                Api::<EndpointSlice>::all(client.clone()),
                all(),
                slices.sink(SliceEndpoints::of),
                shared.clone(),
                1,
                slice_touch,
                trim_slice,
            ),
            spawn_watch(
                Api::<Node>::all(client.clone()),
                all(),
                store(nw),
                shared.clone(),
                2,
                whole,
                trim_node,
            ),
            spawn_watch(
                Api::<IPAddressPool>::namespaced(client.clone(), ns),
                all(),
                store(pw),
                shared.clone(),
                3,
                whole,
                slim,
            ),
            spawn_watch(
                Api::<L2Advertisement>::namespaced(client.clone(), ns),
                all(),
                store(aw),
                shared.clone(),
                4,
                whole,
                slim,
            ),
            spawn_watch(
                Api::<NodeAgent>::all(client.clone()),
                all().fields(&format!("metadata.name={node}")),
                store(rw),
                shared.clone(),
                5,
                store_only,
                slim,
            ),
        ];
        KubeInputs {
            services,
            slices,
            nodes,
            pools,
            advertisements,
            own_record,
            node: node.to_string(),
            scope: scope.clone(),
            shared,
            tasks,
        }
    }

    /// Wakes when any watched object changed (or a watch first synced).
    pub async fn changed(&self) {
        self.shared.changed.notified().await
    }

    /// Every watch has listed once, and every restarted one again: the
    /// stores are a complete picture.
    pub fn synced(&self) -> bool {
        self.shared.synced.load(Ordering::Relaxed) >= WATCHES
            && self.shared.relisting.load(Ordering::Relaxed) == 0
    }

    /// Starts every watch again, from a new list. For the API server's
    /// return after it was unreachable: a watch whose connection the
    /// network cut (packets dropped, not refused) sees no error, and hears
    /// what changed meanwhile only when TCP retransmits, which after a cut
    /// of a minute is most of a minute later. The stores keep their objects
    /// until each list completes, and the view waits for all of them.
    pub fn restart(&self) {
        self.shared.relisting.store(WATCHES, Ordering::Relaxed);
        self.shared.restarts.send_modify(|n| *n += 1);
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.shared.server
    }

    /// No watch is failing now.
    pub fn api_healthy(&self) -> bool {
        self.shared.failing.load(Ordering::Relaxed) == 0
    }

    /// How new this view of the cluster is: the newest resourceVersion any
    /// watch has seen (the API server's etcd revision, so comparable across
    /// kinds and agents; 0 if it is not a number).
    pub fn revision(&self) -> u64 {
        self.shared.revision.load(Ordering::Relaxed)
    }

    /// What this view of the cluster holds, as a digest: equal on two
    /// agents whose stores hold the same, whatever their revisions (see
    /// `MemberInfo::digest`). Agents write annotations on the Services they
    /// announce, so the revision moves on writes the election never reads.
    pub fn digest(&self) -> u64 {
        self.shared.digest.load(Ordering::Relaxed)
    }

    /// This node's record says `spec.drain` (no record: not drained).
    pub fn drain(&self) -> bool {
        self.own_record.state().iter().any(|r| r.spec.drain)
    }

    /// This node's Node carries the out-of-service taint: drained while
    /// it does, as `spec.drain` would (see `hostlb_api::annotations`).
    pub fn out_of_service(&self) -> bool {
        self.nodes
            .get(&kube::runtime::reflector::ObjectRef::new(&self.node))
            .is_some_and(|n| hostlb_api::annotations::out_of_service(&n))
    }

    /// Wakes [`KubeInputs::changed`] again, for what the loop left to its
    /// next turn.
    pub fn poke(&self) {
        self.shared.changed.notify_one();
    }

    /// What changed since the last call.
    pub fn take_changes(&self) -> Changes {
        std::mem::take(
            &mut *self
                .shared
                .changes
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// The usable endpoints of these Services, from the EndpointSlice store.
    pub fn endpoints(&self, services: &BTreeSet<(String, String)>) -> Vec<(String, Endpoints)> {
        let slices = self.slices.read();
        let index = EndpointIndex::build(
            slices
                .values()
                .filter(|s| services.contains(&(s.namespace.clone(), s.service.clone()))),
        );
        services
            .iter()
            .map(|(ns, name)| (format!("{ns}/{name}"), index.get(ns, name)))
            .collect()
    }

    /// The election's input from the stores, and the objects left out.
    pub fn cluster(&self) -> (Cluster, Vec<ObjectError>) {
        let nodes = self.nodes.state();
        let pools = self.pools.state();
        let ads = self.advertisements.state();
        let services = self.services.read();
        let slices = self.slices.read();
        inputs::cluster(
            &self.scope,
            nodes.iter().map(|n| n.as_ref()),
            pools.iter().map(|p| p.as_ref()),
            ads.iter().map(|a| a.as_ref()),
            services.values(),
            slices.values(),
        )
    }

    /// `node`'s addresses in its Node object (InternalIP, ExternalIP).
    pub fn node_addresses(&self, node: &str) -> Vec<IpAddr> {
        self.nodes
            .get(&kube::runtime::reflector::ObjectRef::new(node))
            .map(|n| inputs::node_addresses(&n))
            .unwrap_or_default()
    }

    /// Gossip seeds from the Nodes' InternalIPs (SPEC §7), on `port`.
    pub fn seeds(&self, port: u16) -> Vec<SocketAddr> {
        let mut out: Vec<SocketAddr> = self
            .nodes
            .state()
            .iter()
            .flat_map(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.addresses.as_ref())
                    .into_iter()
                    .flatten()
                    .filter(|a| a.type_ == "InternalIP")
                    .filter_map(|a| a.address.parse::<IpAddr>().ok())
                    .collect::<Vec<_>>()
            })
            .map(|ip| SocketAddr::new(ip, port))
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

impl Drop for KubeInputs {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Drops what the agent never reads before an object enters a store:
/// `managedFields` and kubectl's last-applied copy are often larger than the
/// rest of a Service, and there are thousands of them.
fn slim<K: kube::Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// What the agent reads of a Service (`inputs::service_info`, `Scope`, the
/// writer of annotations and Events): its type, class and traffic policy,
/// status, labels and annotations. Most of a cluster's Services are of
/// another type, and of those it keeps only the type. The view's digest
/// hashes the trimmed object, and the store keeps its record
/// ([`ServiceRecord`]).
fn trim_service(s: &mut Service) {
    slim(s);
    let Some(spec) = s.spec.take() else { return };
    let balanced = spec.type_.as_deref() == Some("LoadBalancer");
    s.spec = Some(ServiceSpec {
        type_: spec.type_,
        load_balancer_class: spec.load_balancer_class.filter(|_| balanced),
        external_traffic_policy: spec.external_traffic_policy.filter(|_| balanced),
        // Port and protocol, for the firewall.
        ports: spec.ports.filter(|_| balanced).map(|ports| {
            ports
                .into_iter()
                .map(|p| ServicePort {
                    port: p.port,
                    protocol: p.protocol,
                    ..ServicePort::default()
                })
                .collect()
        }),
        ..ServiceSpec::default()
    });
    if !balanced {
        s.status = None;
        s.metadata.labels = None;
        s.metadata.annotations = None;
    }
}

/// Of an EndpointSlice the agent reads which node each endpoint is on and
/// whether it is usable (`inputs::SliceEndpoints`), nothing else. The
/// trimmed object is what the view's digest holds, and what the record is
/// made from.
fn trim_slice(e: &mut EndpointSlice) {
    slim(e);
    e.ports = None;
    for ep in &mut e.endpoints {
        ep.addresses = Vec::new();
        ep.target_ref = None;
        ep.hints = None;
        ep.hostname = None;
        ep.zone = None;
        ep.deprecated_topology = None;
    }
}

/// Of a Node the agent reads labels, the `NetworkUnavailable` condition and
/// the addresses (gossip seeds); not the images, capacity or node info,
/// which make most of a real Node object.
fn trim_node(n: &mut Node) {
    slim(n);
    // Of the spec, the out-of-service taint (the node's drain) and the
    // cordon (a drain where an advertisement says so) alone; a Node with
    // neither keeps no spec, so its digest is as before.
    n.spec = n.spec.take().and_then(|spec| {
        let taints: Vec<Taint> = spec
            .taints
            .into_iter()
            .flatten()
            .filter(|t| t.key == OUT_OF_SERVICE_TAINT)
            .collect();
        let cordoned = spec.unschedulable == Some(true);
        (!taints.is_empty() || cordoned).then(|| NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            unschedulable: cordoned.then_some(true),
            ..NodeSpec::default()
        })
    });
    if let Some(status) = n.status.take() {
        n.status = Some(NodeStatus {
            addresses: status.addresses,
            // Without its heartbeat, which moves on every report and
            // would make each one a new view.
            conditions: status.conditions.map(|c| {
                c.into_iter()
                    .filter(|c| c.type_ == "NetworkUnavailable")
                    .map(|c| NodeCondition {
                        last_heartbeat_time: None,
                        ..c
                    })
                    .collect()
            }),
            ..NodeStatus::default()
        });
    }
}

/// A reflector store's side of [`spawn_watch`].
fn store<K>(mut writer: reflector::store::Writer<K>) -> impl FnMut(&watcher::Event<K>) + Send
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    move |e| writer.apply_watcher_event(e)
}

/// Records of one kind of object by namespace and name, which a watch keeps
/// as a reflector store keeps the objects: a relist replaces them once it
/// is complete, and an API outage leaves the last known ones.
pub struct Records<T>(Arc<RwLock<Listed<T>>>);

impl<T> Clone for Records<T> {
    fn clone(&self) -> Self {
        Records(self.0.clone())
    }
}

/// The Services as the agent keeps them.
pub type ServiceRecords = Records<ServiceRecord>;

impl ServiceRecords {
    /// The record of Service `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<ServiceRecord> {
        self.read()
            .now
            .get(&(Some(namespace.to_string()), name.to_string()))
            .cloned()
    }

    /// Some Service's namespace and name (`None`: none is known yet).
    pub fn any(&self) -> Option<(String, String)> {
        self.read()
            .values()
            .next()
            .map(|r| (r.namespace.clone(), r.name.clone()))
    }

    /// How many Services are known.
    pub fn len(&self) -> usize {
        self.read().now.len()
    }

    /// Takes in one event of a watch of Services, as the agent's own watch
    /// does (for a watch of one's own: a bench, a test).
    pub fn apply(&self, e: &watcher::Event<Service>) {
        self.take(e, |s| Some(ServiceRecord::of(s)));
    }
}

impl<T> Default for Records<T> {
    fn default() -> Self {
        Records(Arc::new(RwLock::new(Listed::default())))
    }
}

impl<T: Send + Sync + 'static> Records<T> {
    /// The watch's side: each object as `record` makes it (`None`: none
    /// kept).
    fn sink<K: kube::Resource>(
        &self,
        record: fn(&K) -> Option<T>,
    ) -> impl FnMut(&watcher::Event<K>) + Send + use<T, K> {
        let records = self.clone();
        move |e| records.take(e, record)
    }

    /// Takes in one watch event, each object as `record` makes it.
    fn take<K: kube::Resource>(&self, e: &watcher::Event<K>, record: fn(&K) -> Option<T>) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .apply(e, record);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Listed<T>> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// An object's namespace and name.
type ObjectKey = (Option<String>, String);

/// One watch's objects by key, each as a value of its own (a record, a
/// fingerprint).
struct Listed<T> {
    now: HashMap<ObjectKey, T>,
    /// A list under way: what it has brought so far.
    listing: Option<HashMap<ObjectKey, T>>,
}

impl<T> Default for Listed<T> {
    fn default() -> Self {
        Listed {
            now: HashMap::new(),
            listing: None,
        }
    }
}

/// What one event changed among the objects in force, for a caller that
/// keeps a sum of them.
enum Change<'a, T> {
    /// Nothing in force (a list under way).
    None,
    /// One object's value, before and after.
    One(Option<T>, Option<&'a T>),
    /// A completed list replaced them all: the ones before.
    All(HashMap<ObjectKey, T>),
}

impl<T> Listed<T> {
    /// Takes in one watch event, each object as `value` makes it.
    fn apply<K: kube::Resource>(
        &mut self,
        e: &watcher::Event<K>,
        value: impl Fn(&K) -> Option<T>,
    ) -> Change<'_, T> {
        let key = |o: &K| {
            (
                o.meta().namespace.clone(),
                o.meta().name.clone().unwrap_or_default(),
            )
        };
        let put = |map: &mut HashMap<ObjectKey, T>, o: &K| match value(o) {
            Some(v) => map.insert(key(o), v),
            None => map.remove(&key(o)),
        };
        match e {
            watcher::Event::Init => {
                self.listing = Some(HashMap::new());
                Change::None
            }
            watcher::Event::InitApply(o) => {
                put(self.listing.get_or_insert_with(HashMap::new), o);
                Change::None
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                Change::All(std::mem::replace(&mut self.now, listed))
            }
            watcher::Event::Apply(o) => {
                let old = put(&mut self.now, o);
                Change::One(old, self.now.get(&key(o)))
            }
            watcher::Event::Delete(o) => Change::One(self.now.remove(&key(o)), None),
        }
    }

    fn values(&self) -> impl Iterator<Item = &T> {
        self.now.values()
    }
}

fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    mut sink: impl FnMut(&watcher::Event<K>) + Send + 'static,
    shared: Arc<Shared>,
    slot: usize,
    touch: fn(&K) -> Touch,
    trim: fn(&mut K),
) -> JoinHandle<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize
        + Send
        + Sync
        + 'static,
{
    let kind = K::kind(&()).to_string();
    let mut restarts = shared.restarts.subscribe();
    tokio::spawn(async move {
        let mut synced = false;
        // Restarted, and not yet listed again.
        let mut relisting = false;
        let mut prints = Fingerprints::default();
        let start = move || {
            watcher(api.clone(), config.clone())
                .backoff(hostlb_api::watch::WatchBackoff::spread())
                .modify(trim)
                .boxed()
        };
        let mut stream = start();
        // A watch that reconnects from its last resourceVersion sees
        // nothing until something changes, so silence is the sign it
        // recovered: a failing watch retries within `WatchBackoff::MAX`,
        // and one with no new error for longer than that is watching
        // again. (A server that takes connections and never answers is
        // caught by the writer's probe instead.)
        let quiet = hostlb_api::watch::WatchBackoff::MAX + std::time::Duration::from_millis(250);
        loop {
            let next = async {
                if shared.failed[slot].load(Ordering::Relaxed) {
                    tokio::time::timeout(quiet, stream.next()).await
                } else {
                    Ok(stream.next().await)
                }
            };
            let ev = tokio::select! {
                ev = next => ev,
                changed = restarts.changed() => {
                    if changed.is_ok() {
                        stream = start();
                        relisting = true;
                    }
                    continue;
                }
            };
            let ev = match ev {
                Ok(ev) => ev,
                Err(_) => {
                    if shared.failed[slot].swap(false, Ordering::Relaxed) {
                        shared.failing.fetch_sub(1, Ordering::Relaxed);
                        tracing::info!(%kind, server = %shared.server,
                            "watch recovered (no error since it reconnected)");
                        shared.changed.notify_one();
                    }
                    continue;
                }
            };
            let Some(ev) = ev else { break };
            match ev {
                Ok(e) => {
                    sink(&e);
                    let touched = match &e {
                        watcher::Event::Apply(o)
                        | watcher::Event::Delete(o)
                        | watcher::Event::InitApply(o) => Some((o, touch(o))),
                        _ => None,
                    };
                    // Only what every agent watches dates the view: peers
                    // compare revisions to tell who is behind, and this
                    // node's own record (its status writes) would make it
                    // look ahead of them all, and them behind, for good.
                    if !matches!(touched, Some((_, Touch::Store))) {
                        prints.apply(&e, &kind, &shared.digest);
                    }
                    if let Some((o, t)) = &touched
                        && !matches!(t, Touch::Store)
                        && let Some(rv) = o
                            .meta()
                            .resource_version
                            .as_deref()
                            .and_then(|v| v.parse::<u64>().ok())
                    {
                        shared.revision.fetch_max(rv, Ordering::Relaxed);
                    }
                    // `Init` comes before the list request is even sent: only
                    // objects or the end of a list show the server answered.
                    if !matches!(e, watcher::Event::Init)
                        && shared.failed[slot].swap(false, Ordering::Relaxed)
                    {
                        shared.failing.fetch_sub(1, Ordering::Relaxed);
                        tracing::info!(%kind, server = %shared.server, "watch recovered");
                    }
                    if matches!(e, watcher::Event::InitDone) && !synced {
                        synced = true;
                        shared.synced.fetch_add(1, Ordering::Relaxed);
                    }
                    if matches!(e, watcher::Event::InitDone) && std::mem::take(&mut relisting) {
                        let _ = shared.relisting.fetch_update(
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                            |n| n.checked_sub(1),
                        );
                    }
                    if !matches!(e, watcher::Event::Init | watcher::Event::InitApply(_)) {
                        {
                            let mut changes =
                                shared.changes.lock().unwrap_or_else(|e| e.into_inner());
                            match touched {
                                Some((_, Touch::Endpoints(key))) => {
                                    changes.services.insert(key);
                                }
                                Some((_, Touch::Store)) => {}
                                Some((_, Touch::Whole)) | None => changes.full = true,
                            }
                        }
                        shared.changed.notify_one();
                    }
                }
                Err(e) => {
                    if !shared.failed[slot].swap(true, Ordering::Relaxed) {
                        shared.failing.fetch_add(1, Ordering::Relaxed);
                        warn!(%kind, server = %shared.server, error = %e, "watch failed; keeping the last known objects and retrying");
                        shared.changed.notify_one();
                    }
                }
            }
        }
    })
}

/// What one watch's objects hold, each as a [`fingerprint`]: its part of
/// the view's digest (the XOR of them all), kept as objects come and go.
#[derive(Default)]
struct Fingerprints {
    listed: Listed<u64>,
}

impl Fingerprints {
    /// Takes in one watch event, and XORs what changed into `digest`.
    fn apply<K>(&mut self, e: &watcher::Event<K>, kind: &str, digest: &AtomicU64)
    where
        K: kube::Resource + Clone + serde::Serialize,
    {
        let xor = |prints: &HashMap<ObjectKey, u64>| prints.values().fold(0, |a, b| a ^ b);
        let change = match self.listed.apply(e, |o| Some(fingerprint(kind, o))) {
            Change::None => 0,
            Change::One(old, new) => old.unwrap_or(0) ^ new.copied().unwrap_or(0),
            Change::All(old) => xor(&old) ^ xor(&self.listed.now),
        };
        digest.fetch_xor(change, Ordering::Relaxed);
    }
}

/// What the agent keeps of an object, as a hash: without its
/// resourceVersion, and without the annotations agents write to say who
/// announces a Service, which the election never reads.
fn fingerprint<K: kube::Resource + Clone + serde::Serialize>(kind: &str, obj: &K) -> u64 {
    use sha2::Digest;
    let mut obj = obj.clone();
    let meta = obj.meta_mut();
    meta.resource_version = None;
    if let Some(a) = meta.annotations.as_mut() {
        for family in [hostlb_api::Family::V4, hostlb_api::Family::V6] {
            for routed in [false, true] {
                a.remove(hostlb_api::annotations::announcing(family, routed));
            }
        }
        if a.is_empty() {
            meta.annotations = None;
        }
    }
    let mut hash = sha2::Sha256::new();
    hash.update(kind.as_bytes());
    hash.update(serde_json::to_vec(&obj).unwrap_or_default());
    let out = hash.finalize();
    u64::from_be_bytes(out[..8].try_into().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(kind: &str) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": "42",
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"app": "web"},
                "annotations": {
                    "hostlb.io/ip-allocated-from-pool": "pool",
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}"
                },
                "managedFields": [{"manager": "kubectl"}]
            },
            "spec": {
                "type": kind, "loadBalancerClass": "hostlb.io/lb",
                "externalTrafficPolicy": "Local", "clusterIP": "10.96.0.10",
                "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080},
                          {"port": 53, "protocol": "UDP"}]
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.100"}]}}
        }))
        .unwrap()
    }

    /// What the election reads of an object is the same before and after
    /// trimming; only the rest goes.
    #[test]
    fn trimming_keeps_all_the_agent_reads() {
        let scope = Scope {
            namespace: "hostlb-system".into(),
            load_balancer_class: "hostlb.io/lb".into(),
        };
        let index = EndpointIndex::default();
        let full = service("LoadBalancer");
        let mut trimmed = full.clone();
        trim_service(&mut trimmed);
        let info = |s: &Service| {
            inputs::service_info(&ServiceRecord::of(s), &scope, &index, &mut Vec::new())
        };
        assert!(info(&full).is_some());
        assert_eq!(info(&trimmed), info(&full));
        assert_eq!(
            ServiceRecord::of(&trimmed),
            ServiceRecord::of(&full),
            "the record is made of what trimming keeps"
        );
        assert_eq!(
            trimmed.metadata.uid.as_deref(),
            Some("u1"),
            "Events name it"
        );
        let ports = trimmed.spec.as_ref().unwrap().ports.as_ref().unwrap();
        assert_eq!(ports.len(), 2);
        assert!(ports[0].name.is_none() && ports[0].node_port.is_none());
        assert_eq!(
            info(&trimmed).unwrap().ports,
            [
                crate::election::ServicePort {
                    protocol: crate::election::Protocol::Tcp,
                    port: 80
                },
                crate::election::ServicePort {
                    protocol: crate::election::Protocol::Udp,
                    port: 53
                }
            ]
        );
        assert_eq!(trimmed.metadata.managed_fields, None);

        let mut other = service("ClusterIP");
        trim_service(&mut other);
        assert!(other.status.is_none() && other.metadata.annotations.is_none());
        assert_eq!(other.spec.unwrap().type_.as_deref(), Some("ClusterIP"));

        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"port": 8080}],
            "endpoints": [
                {"addresses": ["10.244.0.5"], "nodeName": "n1", "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "name": "web-abc"}, "zone": "a"},
                {"addresses": ["10.244.0.6"], "nodeName": "n2", "conditions": {"ready": false}}
            ]
        }))
        .unwrap();
        let mut small = slice.clone();
        trim_slice(&mut small);
        assert_eq!(SliceEndpoints::of(&small), SliceEndpoints::of(&slice));
        assert!(small.endpoints.iter().all(|e| e.addresses.is_empty()));

        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"zone": "a"}},
            "spec": {"podCIDR": "10.244.0.0/24"},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "192.0.2.1"}],
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "NetworkUnavailable", "status": "True"}
                ],
                "images": [{"names": ["registry/image:1"], "sizeBytes": 1}],
                "capacity": {"cpu": "4"}
            }
        }))
        .unwrap();
        let mut lean = node.clone();
        trim_node(&mut lean);
        assert_eq!(inputs::node_info(&lean), inputs::node_info(&node));
        assert!(lean.spec.is_none(), "an untainted Node keeps no spec");
        let status = lean.status.unwrap();
        assert_eq!(status.addresses, node.status.as_ref().unwrap().addresses);
        assert!(status.images.is_none() && status.capacity.is_none());

        // Of the taints, the out-of-service one alone: the node's drain.
        let mut tainted = node.clone();
        tainted.spec = serde_json::from_value(serde_json::json!({"taints": [
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            {"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}
        ]}))
        .unwrap();
        trim_node(&mut tainted);
        assert!(hostlb_api::annotations::out_of_service(&tainted));
        let taints = tainted.spec.unwrap().taints.unwrap();
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0].key, OUT_OF_SERVICE_TAINT);

        // The cordon is kept, alone, for the advertisements that count it.
        let mut cordoned = node.clone();
        cordoned.spec = serde_json::from_value(serde_json::json!({
            "unschedulable": true,
            "podCIDR": "10.244.1.0/24",
            "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]
        }))
        .unwrap();
        trim_node(&mut cordoned);
        assert!(inputs::node_info(&cordoned).cordoned);
        assert!(!hostlb_api::annotations::out_of_service(&cordoned));
        let spec = cordoned.spec.unwrap();
        assert_eq!(
            (spec.unschedulable, spec.taints, spec.pod_cidr),
            (Some(true), None, None)
        );
    }

    fn slice(name: &str, service: Option<&str>, nodes: &[&str]) -> EndpointSlice {
        let labels = service.map(|s| serde_json::json!({"kubernetes.io/service-name": s}));
        let endpoints: Vec<_> = nodes
            .iter()
            .map(|n| serde_json::json!({"addresses": ["10.244.0.5"], "nodeName": n}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop", "labels": labels},
            "addressType": "IPv4",
            "endpoints": endpoints
        }))
        .unwrap()
    }

    /// The records follow the watch as a reflector store does: a relist
    /// replaces them only once complete (until then the last known ones
    /// stand, as through an outage), an object gone from it goes, and a
    /// slice that stops naming a Service leaves no record behind.
    #[test]
    fn records_follow_the_watch_through_relists() {
        let records: Records<SliceEndpoints> = Records::default();
        let mut sink = records.sink(SliceEndpoints::of);
        let nodes = |r: &Records<SliceEndpoints>| -> Vec<String> {
            let index = EndpointIndex::build(r.read().values());
            let services = [index.get("shop", "web"), index.get("shop", "api")];
            services.into_iter().flat_map(|e| e.nodes).collect()
        };
        sink(&watcher::Event::Init);
        sink(&watcher::Event::InitApply(slice(
            "web-1",
            Some("web"),
            &["n1"],
        )));
        sink(&watcher::Event::InitApply(slice(
            "web-2",
            Some("web"),
            &["n2"],
        )));
        assert!(nodes(&records).is_empty(), "a list counts once complete");
        sink(&watcher::Event::InitDone);
        assert_eq!(nodes(&records), ["n1", "n2"]);
        sink(&watcher::Event::Apply(slice("web-2", Some("web"), &["n3"])));
        sink(&watcher::Event::Apply(slice("api-1", Some("api"), &["n4"])));
        assert_eq!(nodes(&records), ["n1", "n3", "n4"]);
        sink(&watcher::Event::Apply(slice("api-1", None, &["n4"])));
        assert_eq!(nodes(&records), ["n1", "n3"]);
        sink(&watcher::Event::Init);
        sink(&watcher::Event::InitApply(slice(
            "web-2",
            Some("web"),
            &["n3"],
        )));
        assert_eq!(nodes(&records), ["n1", "n3"], "the last known stand");
        sink(&watcher::Event::InitDone);
        assert_eq!(nodes(&records), ["n3"]);
        sink(&watcher::Event::Delete(slice(
            "web-2",
            Some("web"),
            &["n3"],
        )));
        assert!(nodes(&records).is_empty());
    }

    async fn until(kube: &KubeInputs, what: &str, done: impl Fn(&KubeInputs) -> bool) {
        let started = std::time::Instant::now();
        while !done(kube) {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "never {what}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// This node's own record changes with every status it writes, and no
    /// peer watches it: were its versions counted, this node would look
    /// ahead of every peer, and they behind, until something all watch
    /// changed. A Service, which all watch, does count. The digest moves
    /// only with what the election reads: not with the record, nor with
    /// the annotations agents write on the Services they announce; and
    /// another agent that lists the same objects later has the same.
    #[tokio::test]
    async fn only_what_every_agent_watches_dates_the_view() {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        use kube::api::{Patch, PatchParams, PostParams};
        let server = hostlb_tests::apiserver::TestServer::start().await;
        let client = server.client();
        let crds = Api::<CustomResourceDefinition>::all(client.clone());
        for (_, crd) in hostlb_api::crds::all() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        let scope = Scope {
            namespace: "hostlb-system".into(),
            load_balancer_class: "hostlb.io/lb".into(),
        };
        let kube = KubeInputs::start(&client, &scope, &server.url(), "n1");
        let services = Api::<Service>::namespaced(client.clone(), "default");
        let svc = |name: &str| -> Service {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}
            }))
            .unwrap()
        };
        services
            .create(&PostParams::default(), &svc("a"))
            .await
            .unwrap();
        until(&kube, "synced", |k| k.synced() && k.revision() > 0).await;
        until(&kube, "saw the Service", |k| k.services.len() == 1).await;
        let before = kube.revision();
        let digest = kube.digest();

        let records = Api::<NodeAgent>::all(client.clone());
        let record = |drain: bool| {
            Patch::Apply(serde_json::json!({
                "apiVersion": "hostlb.io/v1", "kind": "NodeAgent",
                "metadata": {"name": "n1"}, "spec": {"drain": drain}
            }))
        };
        let apply = PatchParams::apply("test").force();
        records.patch("n1", &apply, &record(true)).await.unwrap();
        until(&kube, "saw its drain", |k| k.drain()).await;
        records.patch("n1", &apply, &record(false)).await.unwrap();
        until(&kube, "saw its undrain", |k| !k.drain()).await;
        assert_eq!(kube.revision(), before, "its own record dated the view");
        assert_eq!(kube.digest(), digest, "its own record is in the digest");

        let announced = |node: &str| {
            Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                hostlb_api::annotations::ANNOUNCING_IPV4: node
            }}}))
        };
        let merge = PatchParams::default();
        services.patch("a", &merge, &announced("n1")).await.unwrap();
        until(&kube, "saw the annotation", |k| k.revision() > before).await;
        assert_eq!(kube.digest(), digest, "an announcing annotation moved it");
        let later = KubeInputs::start(&client, &scope, &server.url(), "n2");
        until(&later, "synced", |k| k.synced() && k.revision() > 0).await;
        assert_eq!(later.digest(), digest, "another agent's digest differs");

        services
            .create(&PostParams::default(), &svc("b"))
            .await
            .unwrap();
        until(&kube, "saw the second Service", |k| k.services.len() == 2).await;
        assert!(kube.revision() > before, "a Service did not date the view");
        assert_ne!(kube.digest(), digest, "a Service is not in the digest");
        until(&later, "saw the second Service", |k| k.services.len() == 2).await;
        assert_eq!(later.digest(), kube.digest());
    }
}
