//! The allocator controller against the real kube-apiserver (v1.28.0 with
//! etcd and RBAC), each replica running as the `hostlb-allocator`
//! ServiceAccount of `deploy/allocator/rbac.yaml`, never as admin: a 403
//! anywhere in the controller's log fails the test.
//!
//! Each test starts its own server on loopback with ports of its own. On a
//! machine without the server (`../shared/kube-apiserver`, etcd-server) the
//! tests say they did not run; under `CI=true` that is a failure.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use hostlb_api::{IPAddressPool, L2Advertisement};
use hostlb_tests::realserver::{RealServer, kube_config};

mod support;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const NS: &str = "hostlb-system";

/// Every log line of the controllers in this process.
fn log() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .with_ansi(false)
            .with_writer(move || Capture(writer.clone()))
            .try_init();
        buf
    })
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        std::io::stderr().write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The log is the process's, shared by the tests that run side by side,
/// so a neighbour's server restarting (RBAC caches empty a moment) is
/// left out along with this one's.
fn assert_nothing_refused() {
    let text = String::from_utf8_lossy(&log().lock().unwrap()).into_owned();
    let refused: Vec<&str> = text
        .lines()
        .filter(|l| {
            (l.contains("forbidden") || l.contains(" 403")) && !RealServer::while_any_starting(l)
        })
        .collect();
    assert!(
        refused.is_empty(),
        "the API refused the allocator:\n{}",
        refused.join("\n")
    );
}

/// A server with the CRDs, the namespaces and the allocator's RBAC; the
/// admin's client and the ServiceAccount's config. `None` (after saying
/// why) without the real server.
struct Bed {
    server: RealServer,
    _dir: tempfile::TempDir,
    admin: Client,
    allocator: kube::Config,
}

/// `port` for the API server; etcd takes `port + 10_000` and the next one.
async fn bed(port: u16) -> Option<Bed> {
    if let Err(why) = RealServer::available() {
        eprintln!("NOT RUN: {why}");
        return None;
    }
    log();
    let dir = tempfile::tempdir().unwrap();
    let server = tokio::task::block_in_place(|| {
        RealServer::start_local(port, port + 10_000, &dir.path().join("k8s"))
    });
    tokio::task::block_in_place(|| {
        server.install_hostlb("allocator/rbac.yaml");
        server.kubectl(&["create", "namespace", "shop"]);
        server.service_account_kubeconfig(
            NS,
            "hostlb-allocator",
            &dir.path().join("sa.kubeconfig"),
        );
    });
    let admin = kube_config(&server.admin_kubeconfig()).await;
    let allocator = kube_config(&dir.path().join("sa.kubeconfig")).await;
    Some(Bed {
        server,
        _dir: dir,
        admin: Client::try_from(admin).unwrap(),
        allocator,
    })
}

use support::replica::{Replica, start as start_replica};

fn start(bed: &Bed, identity: &str, leader_election: bool) -> Replica {
    start_replica(
        &bed.allocator,
        identity,
        leader_election,
        Duration::from_secs(20),
    )
}

async fn eventually<F, Fut, T>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn pool(bed: &Bed, name: &str, spec: serde_json::Value) {
    let api: Api<IPAddressPool> = Api::namespaced(bed.admin.clone(), NS);
    let p: IPAddressPool = serde_json::from_value(json!({"apiVersion": "hostlb.io/v1",
        "kind": "IPAddressPool", "metadata": {"name": name}, "spec": spec}))
    .unwrap();
    api.create(&PostParams::default(), &p).await.unwrap();
}

async fn service(bed: &Bed, name: &str, extra: serde_json::Value) {
    let api: Api<Service> = Api::namespaced(bed.admin.clone(), "shop");
    let mut v = json!({"metadata": {"name": name},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
    json_patch::merge(&mut v, &extra);
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
}

async fn ips(bed: &Bed, name: &str) -> Vec<String> {
    let api: Api<Service> = Api::namespaced(bed.admin.clone(), "shop");
    api.get(name)
        .await
        .unwrap()
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| i.ip)
        .collect()
}

async fn wait_ips(bed: &Bed, name: &str, want: &[&str]) {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    eventually(&format!("{name} to hold {want:?}"), || {
        let want = want.clone();
        async move { (ips(bed, name).await == want).then_some(()) }
    })
    .await
}

/// Addresses, a shared address, pool status and Events, as the shipped
/// ServiceAccount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocation_sharing_status_and_events_with_the_shipped_rbac() {
    let Some(bed) = bed(16443).await else { return };
    pool(&bed, "p1", json!({"addresses": ["10.0.0.0/30"]})).await;
    let r = start(&bed, "r1", false);
    service(&bed, "a", json!({})).await;
    wait_ips(&bed, "a", &["10.0.0.0"]).await;
    // v1.28 has no ipMode (beta and on by default from 1.30): the server
    // drops the field the allocator writes and takes the address. The
    // allocator compares addresses only, so it does not write again.
    let services: Api<Service> = Api::namespaced(bed.admin.clone(), "shop");
    let a = services.get("a").await.unwrap();
    let ingress = a.status.unwrap().load_balancer.unwrap().ingress.unwrap();
    assert_eq!(ingress[0].ip.as_deref(), Some("10.0.0.0"));
    assert_eq!(ingress[0].ip_mode, None, "v1.28 keeps no ipMode");
    let share = json!({"metadata": {"annotations": {"hostlb.io/allow-shared-ip": "k"}}});
    service(&bed, "web", share.clone()).await;
    let mut other = share.clone();
    json_patch::merge(&mut other, &json!({"spec": {"ports": [{"port": 443}]}}));
    service(&bed, "web-tls", other).await;
    let shared = eventually("a shared address", || async {
        let (x, y) = (ips(&bed, "web").await, ips(&bed, "web-tls").await);
        (!x.is_empty() && x == y).then_some(x)
    })
    .await;
    assert_ne!(shared, vec!["10.0.0.0".to_string()]);
    // The terms the shared address was given under, for a restart to tell
    // an edited sharer from an unchanged one.
    let terms = eventually("the sharing terms recorded", || async {
        let svc = services.get("web-tls").await.unwrap();
        hostlb_allocator::inputs::granted_terms(&svc)
    })
    .await;
    assert_eq!(terms, "key=k ports=TCP/443 traffic=Cluster");
    let pools: Api<IPAddressPool> = Api::namespaced(bed.admin.clone(), NS);
    eventually("pool status", || async {
        pools
            .get("p1")
            .await
            .unwrap()
            .status
            .filter(|s| s.assigned_ipv4 == 2 && s.available_ipv4 == 2)
    })
    .await;
    let events: Api<Event> = Api::namespaced(bed.admin.clone(), "shop");
    eventually("IPAllocated Events", || async {
        let n = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|e| e.reason.as_deref() == Some("IPAllocated"))
            .count();
        (n >= 3).then_some(())
    })
    .await;
    // `a` moves: its second IPAllocated is the next count of the first's
    // series, which the server takes as the binaries' recorder patches it.
    services
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"hostlb.io/loadBalancerIPs": "10.0.0.3"}}}),
            ),
        )
        .await
        .unwrap();
    wait_ips(&bed, "a", &["10.0.0.3"]).await;
    eventually("a series of two IPAllocated about a", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("IPAllocated")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("a")
                    && e.series.as_ref().is_some_and(|s| s.count == 2)
            })
            .then_some(())
    })
    .await;
    r.stop().await;
    assert_nothing_refused();
}

/// Two replicas: the Lease names one; it dies without releasing it, and
/// the other takes over, keeps every address and allocates new Services.
/// Then a restart over the same Services writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_takeover_and_a_restart_that_writes_nothing() {
    let Some(bed) = bed(16453).await else { return };
    pool(&bed, "p1", json!({"addresses": ["10.0.0.0/24"]})).await;
    let a = start(&bed, "replica-a", true);
    let b = start(&bed, "replica-b", true);
    for i in 0..5 {
        service(&bed, &format!("s{i}"), json!({})).await;
    }
    for i in 0..5 {
        wait_ips(&bed, &format!("s{i}"), &[&format!("10.0.0.{i}")]).await;
    }
    let leases: Api<Lease> = Api::namespaced(bed.admin.clone(), NS);
    let holder = leases
        .get("hostlb-allocator")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap();
    let (dead, survivor, survivor_name) = match holder.as_str() {
        "replica-a" => (a, b, "replica-b"),
        "replica-b" => (b, a, "replica-a"),
        other => panic!("the Lease names {other}"),
    };
    dead.kill();
    service(&bed, "late", json!({})).await;
    wait_ips(&bed, "late", &["10.0.0.5"]).await;
    let holder = leases
        .get("hostlb-allocator")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some(survivor_name));
    for i in 0..5 {
        assert_eq!(
            ips(&bed, &format!("s{i}")).await,
            vec![format!("10.0.0.{i}")]
        );
    }
    survivor.stop().await;

    let services: Api<Service> = Api::namespaced(bed.admin.clone(), "shop");
    let versions = |list: Vec<Service>| -> BTreeMap<String, String> {
        list.into_iter()
            .map(|s| (s.name_any(), s.resource_version().unwrap_or_default()))
            .collect()
    };
    let before = versions(services.list(&ListParams::default()).await.unwrap().items);
    let r = start(&bed, "replica-c", false);
    eventually("ready", || async { r.telemetry.is_ready().then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = versions(services.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(before, after, "a restart wrote to Services");
    r.stop().await;
    assert_nothing_refused();
}

/// The API server goes away: `/readyz` says not ready within a few
/// seconds, whether it is killed or stops gracefully (keeping open watches
/// while it refuses the rest); once it is back the allocator is ready again
/// within 5 s and allocates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_api_server_and_catches_up_within_5s() {
    let Some(bed) = bed(16463).await else { return };
    pool(&bed, "p1", json!({"addresses": ["10.0.0.0/24"]})).await;
    let r = start(&bed, "r1", false);
    service(&bed, "a", json!({})).await;
    wait_ips(&bed, "a", &["10.0.0.0"]).await;
    eventually("ready", || async { r.telemetry.is_ready().then_some(()) }).await;

    for graceful in [true, false] {
        let down = std::time::Instant::now();
        if graceful {
            bed.server.stop_apiserver();
        } else {
            tokio::task::block_in_place(|| bed.server.kill_apiserver());
        }
        eventually("not ready", || async {
            (!r.telemetry.is_ready()).then_some(())
        })
        .await;
        eprintln!(
            "{}: not ready after {} ms",
            if graceful { "graceful stop" } else { "kill" },
            down.elapsed().as_millis()
        );
        assert!(
            down.elapsed() < Duration::from_secs(12),
            "{:?}",
            down.elapsed()
        );
        tokio::task::block_in_place(|| bed.server.start_apiserver());
        let back = std::time::Instant::now();
        eventually("ready again", || async {
            r.telemetry.is_ready().then_some(())
        })
        .await;
        let caught_up = back.elapsed();
        eprintln!(
            "allocator ready {} ms after the API server",
            caught_up.as_millis()
        );
        assert!(caught_up <= Duration::from_secs(5), "{caught_up:?}");
    }
    service(&bed, "b", json!({})).await;
    wait_ips(&bed, "b", &["10.0.0.1"]).await;
    r.stop().await;
    assert_nothing_refused();
}

/// The CRD schema refuses what it can of a bad selector or weight at
/// `kubectl apply`; what it cannot (a bad `matchLabels` key: a CEL rule over
/// map keys exceeds the server's cost budget) gets the `Invalid` condition
/// and one Warning Event from the allocator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_refuses_bad_selectors_and_the_rest_is_reported() {
    let Some(bed) = bed(16473).await else { return };
    let ads: Api<L2Advertisement> = Api::namespaced(bed.admin.clone(), NS);
    let create = |name: &str, spec: serde_json::Value| {
        let ads = ads.clone();
        let ad: L2Advertisement = serde_json::from_value(json!({"apiVersion": "hostlb.io/v1",
            "kind": "L2Advertisement", "metadata": {"name": name}, "spec": spec}))
        .unwrap();
        async move { ads.create(&PostParams::default(), &ad).await }
    };
    let refused = [
        (
            json!({"nodeSelectors": [{"matchExpressions": [{"key": "zone", "operator": "In"}]}]}),
            "values must be non-empty for In and NotIn",
        ),
        (
            json!({"nodeSelectors": [{"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]}]}),
            "values must be non-empty for In and NotIn, and empty for Exists",
        ),
        (
            json!({"nodeSelectors": [{"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]}]}),
            "Unsupported value: \"Near\"",
        ),
        (
            json!({"nodeSelectors": [{"matchExpressions": [{"key": "bad key", "operator": "Exists"}]}]}),
            "matchExpressions[0].key in body should match",
        ),
        (
            json!({"serviceSelectors": [{"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x y"]}]}]}),
            "values[0] in body should match",
        ),
        (
            json!({"nodeSelectors": [{"matchLabels": {"zone": "x y"}}]}),
            "matchLabels.zone in body should match",
        ),
        (
            json!({"preferredNodeSelectors": [{"weight": 0, "preference": {}}]}),
            "weight in body should be greater than or equal to 1",
        ),
        (
            json!({"preferredNodeSelectors": [{"weight": 101, "preference": {}}]}),
            "weight in body should be less than or equal to 100",
        ),
    ];
    for (i, (spec, why)) in refused.into_iter().enumerate() {
        match create(&format!("bad-{i}"), spec.clone()).await {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 422, "{spec}: {e:?}");
                assert!(e.message.contains(why), "{spec}: {}", e.message);
            }
            other => panic!("{spec} was not refused: {other:?}"),
        }
    }
    create(
        "good",
        json!({"nodeSelectors": [{"matchLabels": {"example.com/zone": "a"},
            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                                 {"key": "gpu", "operator": "DoesNotExist"}]}],
            "preferredNodeSelectors": [{"weight": 100, "preference": {"matchLabels": {"zone": "a"}}}]}),
    )
    .await
    .unwrap();
    create(
        "typo",
        json!({"nodeSelectors": [{"matchLabels": {"bad key": "a"}}]}),
    )
    .await
    .unwrap();

    let r = start(&bed, "r1", false);
    let condition = |name: &'static str| {
        let ads = ads.clone();
        async move {
            ads.get(name)
                .await
                .unwrap()
                .status
                .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Invalid"))
        }
    };
    let invalid = eventually("the typo's Invalid condition", || async {
        condition("typo").await.filter(|c| c.status == "True")
    })
    .await;
    assert!(invalid.message.contains("\"bad key\""), "{invalid:?}");
    eventually("the good one's condition", || async {
        condition("good").await.filter(|c| c.status == "False")
    })
    .await;
    let events: Api<Event> = Api::namespaced(bed.admin.clone(), NS);
    let warning = eventually("an InvalidConfig Warning", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("InvalidConfig"))
    })
    .await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let regarding = warning.regarding.unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("L2Advertisement"), Some("typo"))
    );
    assert!(warning.note.unwrap().contains("\"bad key\""));

    // The last valid forms are recorded, and stay in force through an edit
    // the schema cannot refuse: the advertisement's for the agents, the
    // pool's for the allocator and the agents alike.
    let status_of = |name: &'static str| {
        let ads = ads.clone();
        async move { ads.get(name).await.unwrap().status.unwrap_or_default() }
    };
    let good = eventually("the good spec recorded", || async {
        status_of("good").await.last_valid_spec
    })
    .await;
    assert_eq!(good, ads.get("good").await.unwrap().spec);
    assert!(status_of("typo").await.last_valid_spec.is_none());
    ads.patch(
        "good",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            json!({"spec": {"nodeSelectors": [{"matchLabels": {"bad key": "a"}}]}}),
        ),
    )
    .await
    .unwrap();
    let kept = eventually("the edit reported, the form kept", || async {
        let s = status_of("good").await;
        s.conditions
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == "False")
            .map(|c| (c.message.clone(), s.last_valid_spec.clone()))
    })
    .await;
    assert!(
        kept.0.ends_with("the last valid form stays in force"),
        "{kept:?}"
    );
    assert_eq!(kept.1, Some(good));

    pool(&bed, "p1", json!({"addresses": ["10.0.0.0/30"]})).await;
    service(&bed, "a", json!({})).await;
    wait_ips(&bed, "a", &["10.0.0.0"]).await;
    let pools: Api<IPAddressPool> = Api::namespaced(bed.admin.clone(), NS);
    eventually("the pool's addresses recorded", || async {
        let s = pools.get("p1").await.unwrap().status?;
        (s.last_valid_addresses == Some(vec!["10.0.0.0/30".to_string()])).then_some(())
    })
    .await;
    pools
        .patch(
            "p1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"addresses": ["10.0.0.0/3O"]}})),
        )
        .await
        .unwrap();
    let message = eventually("the pool's typo reported", || async {
        let s = pools.get("p1").await.unwrap().status?;
        s.conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.status == "False")
            .map(|c| c.message)
    })
    .await;
    assert!(
        message.contains("10.0.0.0/3O") && message.ends_with("the last valid form stays in force"),
        "{message}"
    );
    // A Service created after the typo is still served from the kept form,
    // and the first keeps its address.
    service(&bed, "b", json!({})).await;
    wait_ips(&bed, "b", &["10.0.0.1"]).await;
    assert_eq!(ips(&bed, "a").await, vec!["10.0.0.0".to_string()]);
    r.stop().await;
    assert_nothing_refused();
}
