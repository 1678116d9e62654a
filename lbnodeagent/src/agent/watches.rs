//! The agent's view of the cluster: five watches (Services, EndpointSlices,
//! Nodes, IPAddressPools, L2Advertisements) into reflector stores, and a
//! [`Notify`] the reconcile loop waits on. The watches also note what
//! changed ([`Changes`]): when only EndpointSlices did, the loop hands the
//! core just those Services' endpoints instead of a whole new cluster view.
//!
//! The stores outlive an API outage: when the API server is unreachable the
//! watches retry with backoff and the stores keep the last known objects, so
//! the loop goes on electing (and failing over on membership changes) from
//! them. [`KubeInputs::api_healthy`] says whether the watches are currently
//! failing, for `/readyz`.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use hostlb_api::snapshot::ObjectError;
use hostlb_api::{IPAddressPool, L2Advertisement};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::election::{Cluster, Endpoints};
use crate::inputs::{self, EndpointIndex, Scope};

const WATCHES: usize = 5;

/// Stores of the objects the election reads, kept current by watches.
pub struct KubeInputs {
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
    pub nodes: Store<Node>,
    pub pools: Store<IPAddressPool>,
    pub advertisements: Store<L2Advertisement>,
    scope: Scope,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

#[derive(Default)]
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

/// The Service an EndpointSlice belongs to.
fn slice_service(slice: &EndpointSlice) -> Option<(String, String)> {
    let name = slice
        .metadata
        .labels
        .as_ref()?
        .get("kubernetes.io/service-name")?;
    Some((slice.metadata.namespace.clone()?, name.clone()))
}

/// Any other kind: every change needs the whole view.
fn whole<K>(_: &K) -> Option<(String, String)> {
    None
}

impl KubeInputs {
    pub fn start(client: &Client, scope: &Scope) -> KubeInputs {
        let shared = Arc::new(Shared::default());
        let (services, sw) = reflector::store();
        let (slices, ew) = reflector::store();
        let (nodes, nw) = reflector::store();
        let (pools, pw) = reflector::store();
        let (advertisements, aw) = reflector::store();
        let ns = &scope.namespace;
        let tasks = vec![
            spawn_watch(
                Api::<Service>::all(client.clone()),
                sw,
                shared.clone(),
                0,
                whole,
            ),
            spawn_watch(
                Api::<EndpointSlice>::all(client.clone()),
                ew,
                shared.clone(),
                1,
                slice_service,
            ),
            spawn_watch(
                Api::<Node>::all(client.clone()),
                nw,
                shared.clone(),
                2,
                whole,
            ),
            spawn_watch(
                Api::<IPAddressPool>::namespaced(client.clone(), ns),
                pw,
                shared.clone(),
                3,
                whole,
            ),
            spawn_watch(
                Api::<L2Advertisement>::namespaced(client.clone(), ns),
                aw,
                shared.clone(),
                4,
                whole,
            ),
        ];
        KubeInputs {
            services,
            slices,
            nodes,
            pools,
            advertisements,
            scope: scope.clone(),
            shared,
            tasks,
        }
    }

    /// Wakes when any watched object changed (or a watch first synced).
    pub async fn changed(&self) {
        self.shared.changed.notified().await
    }

    /// Every watch has listed once: the stores are a complete picture.
    pub fn synced(&self) -> bool {
        self.shared.synced.load(Ordering::Relaxed) >= WATCHES
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
        let slices = self.slices.state();
        let index = EndpointIndex::build(
            slices
                .iter()
                .map(|s| s.as_ref())
                .filter(|s| slice_service(s).is_some_and(|k| services.contains(&k))),
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
        let services = self.services.state();
        let slices = self.slices.state();
        inputs::cluster(
            &self.scope,
            nodes.iter().map(|n| n.as_ref()),
            pools.iter().map(|p| p.as_ref()),
            ads.iter().map(|a| a.as_ref()),
            services.iter().map(|s| s.as_ref()),
            slices.iter().map(|s| s.as_ref()),
        )
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

fn spawn_watch<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    shared: Arc<Shared>,
    slot: usize,
    partial: fn(&K) -> Option<(String, String)>,
) -> JoinHandle<()>
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
    tokio::spawn(async move {
        let mut synced = false;
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(slim)
            .reflect(writer)
            .boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(e) => {
                    if let watcher::Event::Apply(o)
                    | watcher::Event::Delete(o)
                    | watcher::Event::InitApply(o) = &e
                        && let Some(rv) = o
                            .meta()
                            .resource_version
                            .as_deref()
                            .and_then(|v| v.parse::<u64>().ok())
                    {
                        shared.revision.fetch_max(rv, Ordering::Relaxed);
                    }
                    if shared.failed[slot].swap(false, Ordering::Relaxed) {
                        shared.failing.fetch_sub(1, Ordering::Relaxed);
                        tracing::info!(%kind, "watch recovered");
                    }
                    if matches!(e, watcher::Event::InitDone) && !synced {
                        synced = true;
                        shared.synced.fetch_add(1, Ordering::Relaxed);
                    }
                    if !matches!(e, watcher::Event::Init | watcher::Event::InitApply(_)) {
                        {
                            let mut changes =
                                shared.changes.lock().unwrap_or_else(|e| e.into_inner());
                            match &e {
                                watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                                    match partial(o) {
                                        Some(key) => {
                                            changes.services.insert(key);
                                        }
                                        None => changes.full = true,
                                    }
                                }
                                _ => changes.full = true,
                            }
                        }
                        shared.changed.notify_one();
                    }
                }
                Err(e) => {
                    if !shared.failed[slot].swap(true, Ordering::Relaxed) {
                        shared.failing.fetch_add(1, Ordering::Relaxed);
                        warn!(%kind, error = %e, "watch failed; keeping the last known objects and retrying");
                        shared.changed.notify_one();
                    }
                }
            }
        }
    })
}
