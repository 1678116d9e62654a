//! The allocator controller against the test API server: real HTTP, the
//! unchanged kube client, watches, Leases and faults.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use hostlb_allocator::controller;
use hostlb_api::annotations::IP_ALLOCATED_FROM_POOL;
use hostlb_api::{IPAddressPool, L2Advertisement};
use hostlb_tests::apiserver::TestServer;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const NS: &str = "hostlb-system";

async fn setup() -> TestServer {
    let server = TestServer::start().await;
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in hostlb_api::crds::all() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let nss: Api<Namespace> = Api::all(client);
    for ns in [NS, "shop"] {
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    }
    server
}

async fn pool(server: &TestServer, name: &str, spec: serde_json::Value) {
    let api: Api<IPAddressPool> = Api::namespaced(server.client(), NS);
    let p: IPAddressPool = serde_json::from_value(
        json!({"apiVersion": "hostlb.io/v1", "kind": "IPAddressPool",
        "metadata": {"name": name}, "spec": spec}),
    )
    .unwrap();
    api.create(&PostParams::default(), &p).await.unwrap();
}

async fn service(server: &TestServer, name: &str, extra: serde_json::Value) {
    let api: Api<Service> = Api::namespaced(server.client(), "shop");
    let mut v = json!({"metadata": {"name": name}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
    json_patch::merge(&mut v, &extra);
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
}

fn client_for(server: &TestServer, identity: &str) -> Client {
    let mut config = server.config();
    controller::prepare_client(&mut config, identity);
    Client::try_from(config).unwrap()
}

mod support;
use support::replica::{Replica, start as start_replica};

fn start(server: &TestServer, identity: &str, leader_election: bool) -> Replica {
    start_replica(
        &server.config(),
        identity,
        leader_election,
        Duration::from_secs(10),
    )
}

async fn eventually<F, Fut, T>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn ips(server: &TestServer, name: &str) -> Vec<String> {
    let api: Api<Service> = Api::namespaced(server.client(), "shop");
    let s = api.get(name).await.unwrap();
    s.status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| i.ip)
        .collect()
}

async fn wait_ips(server: &TestServer, name: &str, want: &[&str]) {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    eventually(&format!("{name} to hold {want:?}"), || {
        let want = want.clone();
        async move {
            let got = ips(server, name).await;
            (got == want).then_some(())
        }
    })
    .await
}

async fn events(server: &TestServer, reason: &str) -> Vec<String> {
    let api: Api<Event> = Api::namespaced(server.client(), "shop");
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| {
            format!(
                "{}: {}",
                e.regarding.and_then(|r| r.name).unwrap_or_default(),
                e.note.unwrap_or_default()
            )
        })
        .collect()
}

/// Writes to Services (not Leases or Events), for checking who wrote.
fn service_writes(server: &TestServer) -> Vec<hostlb_tests::apiserver::WriteRecord> {
    server
        .writes()
        .into_iter()
        .filter(|w| w.path.contains("/services/") && w.status < 300)
        .collect()
}

#[tokio::test]
async fn pools_and_services_in_statuses_and_events_out() {
    let server = setup().await;
    pool(&server, "p1", json!({"addresses": ["10.0.0.0/30"]})).await;
    service(&server, "a", json!({})).await;
    let r = start(&server, "r1", false);
    wait_ips(&server, "a", &["10.0.0.0"]).await;
    let svcs: Api<Service> = Api::namespaced(server.client(), "shop");
    let a = svcs.get("a").await.unwrap();
    assert_eq!(a.annotations()[IP_ALLOCATED_FROM_POOL], "p1");
    // The address reaches the node unchanged: ipMode VIP.
    let ingress = a.status.unwrap().load_balancer.unwrap().ingress.unwrap();
    assert_eq!(ingress[0].ip_mode.as_deref(), Some("VIP"));

    service(
        &server,
        "b",
        json!({"metadata": {"annotations": {"hostlb.io/loadBalancerIPs": "10.0.0.3"}}}),
    )
    .await;
    wait_ips(&server, "b", &["10.0.0.3"]).await;
    // Not ours: another type, another class.
    service(&server, "plain", json!({"spec": {"type": "ClusterIP"}})).await;
    service(
        &server,
        "other-class",
        json!({"spec": {"loadBalancerClass": "example.com/lb"}}),
    )
    .await;
    service(&server, "c", json!({})).await;
    wait_ips(&server, "c", &["10.0.0.1"]).await;
    assert!(ips(&server, "plain").await.is_empty() && ips(&server, "other-class").await.is_empty());

    let got = eventually("IPAllocated events", || async {
        let e = events(&server, "IPAllocated").await;
        (e.len() >= 3).then_some(e)
    })
    .await;
    assert!(
        got.contains(&"a: Assigned 10.0.0.0 from pool p1".to_string()),
        "{got:?}"
    );

    // Pool status: counts and conditions.
    let pools: Api<IPAddressPool> = Api::namespaced(server.client(), NS);
    let st = eventually("pool status", || async {
        let p = pools.get("p1").await.unwrap();
        p.status.filter(|s| s.assigned_ipv4 == 3)
    })
    .await;
    assert_eq!(st.available_ipv4, 1);
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "True");

    // Exhaustion is reported; a deletion frees the address for the waiting Service.
    service(&server, "d", json!({})).await;
    service(&server, "e", json!({})).await;
    wait_ips(&server, "d", &["10.0.0.2"]).await;
    let failed = eventually("AllocationFailed", || async {
        let e = events(&server, "AllocationFailed").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(
        failed,
        vec!["e: no available addresses in pool p1".to_string()]
    );
    svcs.delete("a", &DeleteParams::default()).await.unwrap();
    wait_ips(&server, "e", &["10.0.0.0"]).await;

    // A type change releases the address and clears what we wrote.
    svcs.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
    )
    .await
    .unwrap();
    wait_ips(&server, "c", &[]).await;
    eventually("annotation removed", || async {
        (!svcs
            .get("c")
            .await
            .unwrap()
            .annotations()
            .contains_key(IP_ALLOCATED_FROM_POOL))
        .then_some(())
    })
    .await;
    r.stop().await;
}

#[tokio::test]
async fn malformed_pool_is_reported_while_a_good_pool_serves() {
    let server = setup().await;
    pool(
        &server,
        "bad",
        json!({"addresses": ["10.1.1.300", "10.1.2.0/24"]}),
    )
    .await;
    pool(&server, "good", json!({"addresses": ["10.2.0.0/24"]})).await;
    // An invalid advertisement is reported too.
    let ads: Api<L2Advertisement> = Api::namespaced(server.client(), NS);
    let ad: L2Advertisement = serde_json::from_value(json!({"apiVersion": "hostlb.io/v1", "kind": "L2Advertisement",
        "metadata": {"name": "ad"}, "spec": {"nodeSelectors": [{"matchLabels": {"bad key": "x"}}]}}))
    .unwrap();
    ads.create(&PostParams::default(), &ad).await.unwrap();
    service(&server, "a", json!({})).await;
    let r = start(&server, "r1", false);
    wait_ips(&server, "a", &["10.2.0.0"]).await;
    let pools: Api<IPAddressPool> = Api::namespaced(server.client(), NS);
    let st = eventually("invalid pool status", || async {
        pools
            .get("bad")
            .await
            .unwrap()
            .status
            .filter(|s| !s.conditions.is_empty())
    })
    .await;
    let invalid = st.conditions.iter().find(|c| c.type_ == "Invalid").unwrap();
    assert_eq!(invalid.status, "True");
    assert!(
        invalid
            .message
            .starts_with("spec.addresses[0]: invalid address \"10.1.1.300\""),
        "{}",
        invalid.message
    );
    assert_eq!(
        st.conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap()
            .status,
        "False"
    );
    let st = eventually("ad status", || async {
        ads.get("ad")
            .await
            .unwrap()
            .status
            .filter(|s| !s.conditions.is_empty())
    })
    .await;
    let invalid = st.conditions.iter().find(|c| c.type_ == "Invalid").unwrap();
    assert!(
        invalid
            .message
            .starts_with("spec.nodeSelectors[0]: key: Invalid value: \"bad key\""),
        "{}",
        invalid.message
    );
    r.stop().await;
}

#[tokio::test]
async fn restart_changes_nothing() {
    let server = setup().await;
    pool(
        &server,
        "p1",
        json!({"addresses": ["10.0.0.0/24", "fd00::/120"]}),
    )
    .await;
    for i in 0..20 {
        let extra = if i % 3 == 0 {
            json!({"spec": {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"]}})
        } else {
            json!({})
        };
        service(&server, &format!("s{i}"), extra).await;
    }
    let r = start(&server, "r1", false);
    for i in 0..20 {
        let name = format!("s{i}");
        let want = if i % 3 == 0 { 2 } else { 1 };
        eventually(&format!("{name} allocated"), || async {
            (ips(&server, &name).await.len() == want).then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    r.stop().await;
    let mut before = Vec::new();
    for i in 0..20 {
        before.push(ips(&server, &format!("s{i}")).await);
    }
    server.clear_writes();
    // Statuses edited by hand meanwhile on a Service is restored, the rest untouched.
    let r = start(&server, "r2", false);
    eventually("ready", || async { r.telemetry.is_ready().then_some(()) }).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        service_writes(&server),
        vec![],
        "a restart writes nothing to Services"
    );
    let mut after = Vec::new();
    for i in 0..20 {
        after.push(ips(&server, &format!("s{i}")).await);
    }
    assert_eq!(before, after);
    r.stop().await;
}

#[tokio::test]
async fn only_the_leader_writes_and_the_other_takes_over() {
    let server = setup().await;
    pool(&server, "p1", json!({"addresses": ["10.0.0.0/24"]})).await;
    let a = start(&server, "replica-a", true);
    let b = start(&server, "replica-b", true);
    let leader = eventually("a leader", || async {
        let (x, y) = (a.telemetry.render(), b.telemetry.render());
        let lead = |m: &str| m.lines().any(|l| l == "hostlb_allocator_leader 1");
        match (lead(&x), lead(&y)) {
            (true, false) => Some("replica-a"),
            (false, true) => Some("replica-b"),
            _ => None,
        }
    })
    .await;
    for i in 0..5 {
        service(&server, &format!("s{i}"), json!({})).await;
    }
    for i in 0..5 {
        wait_ips(&server, &format!("s{i}"), &[&format!("10.0.0.{i}")]).await;
    }
    let writers: BTreeSet<String> = service_writes(&server)
        .into_iter()
        .map(|w| w.user_agent)
        .collect();
    assert_eq!(writers.len(), 1, "{writers:?}");
    assert!(writers.iter().next().unwrap().contains(leader));

    // The leader dies without releasing the Lease: the other takes over once
    // it expires, rebuilds from the statuses and allocates new Services.
    let (dead, survivor, survivor_name) = if leader == "replica-a" {
        (a, b, "replica-b")
    } else {
        (b, a, "replica-a")
    };
    dead.kill();
    server.clear_writes();
    service(&server, "late", json!({})).await;
    wait_ips(&server, "late", &["10.0.0.5"]).await;
    let writers: BTreeSet<String> = service_writes(&server)
        .into_iter()
        .map(|w| w.user_agent)
        .collect();
    assert_eq!(writers.len(), 1);
    assert!(
        writers.iter().next().unwrap().contains(survivor_name),
        "{writers:?}"
    );
    for i in 0..5 {
        assert_eq!(
            ips(&server, &format!("s{i}")).await,
            vec![format!("10.0.0.{i}")],
            "nothing moved on take-over"
        );
    }
    survivor.stop().await;
}

#[tokio::test]
async fn api_outage_then_recovery_without_double_allocation() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let server = setup().await;
    pool(&server, "p1", json!({"addresses": ["10.0.0.0/28"]})).await;
    for i in 0..4 {
        service(&server, &format!("s{i}"), json!({})).await;
    }
    let r = start(&server, "r1", false);
    wait_ips(&server, "s3", &["10.0.0.3"]).await;
    // Connections refused: the watches fail and retry with backoff.
    server.set_refusing();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // While the API is away, objects change behind the controller's back
    // (as if another client wrote during the outage).
    server.with_store(|s| {
        let svc = s.def("", "v1", "services").unwrap().clone();
        s.delete(&svc, "shop", "s1", &serde_json::Value::Null, &Default::default()).unwrap();
        s.create(&svc, "shop", json!({"metadata": {"name": "new1"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}), &Default::default()).unwrap();
        s.create(&svc, "shop", json!({"metadata": {"name": "new2"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}), &Default::default()).unwrap();
        s.compact();
    });
    server.set_available();
    // After the outage (re-list on 410): the freed address is reused, nothing twice.
    wait_ips(&server, "new1", &["10.0.0.1"]).await;
    wait_ips(&server, "new2", &["10.0.0.4"]).await;
    // A failed write is tried again by the controller.
    server.fail_writes("/services/unlucky", 3);
    server.with_store(|s| {
        let svc = s.def("", "v1", "services").unwrap().clone();
        s.create(&svc, "shop", json!({"metadata": {"name": "unlucky"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}), &Default::default()).unwrap();
    });
    wait_ips(&server, "unlucky", &["10.0.0.5"]).await;
    // Then a 503 window: the next change still lands.
    server.set_unavailable();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.set_available();
    service(&server, "after", json!({})).await;
    wait_ips(&server, "after", &["10.0.0.6"]).await;
    let all: Vec<Vec<String>> = futures::future::join_all(
        ["s0", "s2", "s3", "new1", "new2", "unlucky", "after"].map(|n| ips(&server, n)),
    )
    .await;
    let flat: Vec<String> = all.into_iter().flatten().collect();
    let unique: BTreeSet<&String> = flat.iter().collect();
    assert_eq!(
        unique.len(),
        flat.len(),
        "an address was given twice: {flat:?}"
    );
    r.stop().await;
}

#[tokio::test]
async fn namespace_labels_move_services_between_pools() {
    let server = setup().await;
    pool(&server, "general", json!({"addresses": ["10.0.0.0/24"]})).await;
    pool(&server, "team-a", json!({"addresses": ["10.9.0.0/24"],
        "serviceAllocation": {"priority": 1, "namespaceSelectors": [{"matchLabels": {"team": "a"}}]}})).await;
    service(&server, "web", json!({})).await;
    let r = start(&server, "r1", false);
    wait_ips(&server, "web", &["10.0.0.0"]).await;
    let nss: Api<Namespace> = Api::all(server.client());
    nss.patch(
        "shop",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
    )
    .await
    .unwrap();
    // The held address stays valid in the general pool: kept.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ips(&server, "web").await, vec!["10.0.0.0"]);
    // A new Service goes to the team's pool.
    service(&server, "api", json!({})).await;
    wait_ips(&server, "api", &["10.9.0.0"]).await;
    // Removing the label takes the team pool away from it.
    nss.patch(
        "shop",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": null}}})),
    )
    .await
    .unwrap();
    wait_ips(&server, "api", &["10.0.0.1"]).await;
    r.stop().await;
}

#[tokio::test]
async fn a_service_seen_before_its_namespace_waits_for_it() {
    let server = setup().await;
    pool(&server, "general", json!({"addresses": ["10.0.0.0/24"]})).await;
    pool(&server, "team-a", json!({"addresses": ["10.9.0.0/24"],
        "serviceAllocation": {"priority": 1, "namespaceSelectors": [{"matchLabels": {"team": "a"}}]}})).await;
    let r = start(&server, "r1", false);
    eventually("ready", || async { r.telemetry.is_ready().then_some(()) }).await;
    // The namespace's watch is slow, so the Service's event arrives first:
    // judged on no labels it would take a general address for good.
    server.set_watch_lag("namespaces", Duration::from_millis(1500));
    let nss: Api<Namespace> = Api::all(server.client());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "late", "labels": {"team": "a"}}}))
            .unwrap(),
    )
    .await
    .unwrap();
    let svcs: Api<Service> = Api::namespaced(server.client(), "late");
    svcs.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "web"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    let shown = |s: Service| -> Vec<String> {
        s.status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|i| i.ip)
            .collect()
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(shown(svcs.get("web").await.unwrap()).is_empty());
    eventually("web allocated from its team's pool", || async {
        (shown(svcs.get("web").await.unwrap()) == vec!["10.9.0.0".to_string()]).then_some(())
    })
    .await;
    r.stop().await;
}

#[tokio::test]
async fn a_status_changed_by_someone_else_is_restored() {
    let server = setup().await;
    pool(&server, "p1", json!({"addresses": ["10.0.0.0/30"]})).await;
    service(&server, "a", json!({})).await;
    let r = start(&server, "r1", false);
    wait_ips(&server, "a", &["10.0.0.0"]).await;
    let svcs: Api<Service> = Api::namespaced(server.client(), "shop");
    // Emptied, or set to an address in no pool: written back.
    for ingress in [json!(null), json!([{"ip": "10.7.7.7"}])] {
        svcs.patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": ingress}}})),
        )
        .await
        .unwrap();
        wait_ips(&server, "a", &["10.0.0.0"]).await;
    }
    // Set to another free address of the pool: that is its address now, and
    // the one it left is free for the next Service.
    svcs.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.3"}]}}})),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    service(&server, "b", json!({})).await;
    wait_ips(&server, "b", &["10.0.0.0"]).await;
    assert_eq!(ips(&server, "a").await, vec!["10.0.0.3"]);
    r.stop().await;
}

/// The client gives a failed write back at once instead of retrying it for
/// minutes, so the controller's own retry, after a fresh Lease check, is
/// the only one.
#[tokio::test]
async fn a_write_during_an_outage_fails_at_once() {
    let server = setup().await;
    service(&server, "s", json!({})).await;
    let api: Api<Service> = Api::namespaced(client_for(&server, "r1"), "shop");
    server.set_unavailable();
    let patch = json!({"status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}});
    let params = PatchParams::apply(controller::FIELD_MANAGER);
    let patch = Patch::Merge(&patch);
    let write = api.patch_status("s", &params, &patch);
    let got = tokio::time::timeout(Duration::from_secs(10), write)
        .await
        .expect("the client gave the write back");
    match got {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 503, "{s:?}"),
        other => panic!("expected 503, got {other:?}"),
    }
    server.set_available();
    assert!(ips(&server, "s").await.is_empty(), "nothing was written");
}

/// Every state of the Services in `shop` as a watch sees it; a state where
/// two Services without a sharing key hold one address is recorded.
fn watch_for_double_holders(server: &TestServer) -> Arc<std::sync::Mutex<Vec<String>>> {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let found = Arc::new(std::sync::Mutex::new(Vec::new()));
    let api: Api<Service> = Api::namespaced(server.client(), "shop");
    let out = found.clone();
    tokio::spawn(async move {
        let mut held: std::collections::HashMap<String, (Vec<String>, bool)> = Default::default();
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(Ok(ev)) = events.next().await {
            match ev {
                watcher::Event::Apply(s) | watcher::Event::InitApply(s) => {
                    let shares = s.annotations().contains_key("hostlb.io/allow-shared-ip");
                    let ips: Vec<String> = s
                        .status
                        .as_ref()
                        .and_then(|s| s.load_balancer.as_ref())
                        .and_then(|lb| lb.ingress.clone())
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|i| i.ip)
                        .collect();
                    held.insert(s.name_any(), (ips, shares));
                }
                watcher::Event::Delete(s) => {
                    held.remove(&s.name_any());
                }
                _ => continue,
            }
            let mut by_ip: std::collections::BTreeMap<&String, Vec<&String>> = Default::default();
            for (name, (ips, shares)) in &held {
                for ip in ips.iter().filter(|_| !shares) {
                    by_ip.entry(ip).or_default().push(name);
                }
            }
            for (ip, names) in by_ip.into_iter().filter(|(_, n)| n.len() > 1) {
                out.lock().unwrap().push(format!("{ip} held by {names:?}"));
            }
        }
    });
    found
}

async fn leader_is(r: &Replica) -> bool {
    r.telemetry
        .render()
        .lines()
        .any(|l| l == "hostlb_allocator_leader 1")
}

/// The leader's writes become slow (an overloaded API server): it loses the
/// Lease, and no write it started lands after the other replica took over
/// and handed the address out again. Without a server-side bound, its
/// rewrite of `x`'s emptied status would land seconds later, on an address
/// the new leader had meanwhile given to `y`.
#[tokio::test]
async fn a_deposed_leaders_slow_writes_never_land() {
    let server = setup().await;
    pool(&server, "p", json!({"addresses": ["10.0.0.0/31"]})).await;
    pool(
        &server,
        "r",
        json!({"addresses": ["10.1.0.0/32"], "autoAssign": false}),
    )
    .await;
    service(&server, "x", json!({})).await;
    let a = start(&server, "replica-a", true);
    eventually("replica-a to lead", || async {
        leader_is(&a).await.then_some(())
    })
    .await;
    wait_ips(&server, "x", &["10.0.0.0"]).await;
    let b = start(&server, "replica-b", true);
    let doubles = watch_for_double_holders(&server);
    tokio::time::sleep(Duration::from_millis(200)).await;

    server.set_slow_writes("replica-a", Duration::from_secs(8));
    server.clear_writes();
    let started = tokio::time::Instant::now();
    // Someone empties x's status: replica-a writes it back, slowly.
    let api: Api<Service> = Api::namespaced(server.client(), "shop");
    api.patch_status(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": null}}})),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Then x asks for pool r.
    api.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"hostlb.io/address-pool": "r"}}})),
    )
    .await
    .unwrap();
    eventually("replica-b to lead", || async {
        leader_is(&b).await.then_some(())
    })
    .await;
    wait_ips(&server, "x", &["10.1.0.0"]).await;
    service(&server, "y", json!({})).await;
    wait_ips(&server, "y", &["10.0.0.0"]).await;
    // Past the time replica-a's writes take.
    tokio::time::sleep_until(started + Duration::from_secs(10)).await;
    assert_eq!(doubles.lock().unwrap().clone(), Vec::<String>::new());
    assert_eq!(ips(&server, "x").await, vec!["10.1.0.0"]);
    assert_eq!(ips(&server, "y").await, vec!["10.0.0.0"]);
    let landed: Vec<_> = service_writes(&server)
        .into_iter()
        .filter(|w| w.user_agent.contains("replica-a"))
        .collect();
    assert!(landed.is_empty(), "{landed:#?}");
    a.kill();
    b.stop().await;
}

async fn request_condition(server: &TestServer, name: &str) -> Option<(String, String)> {
    let api: Api<Service> = Api::namespaced(server.client(), "shop");
    let s = api.get(name).await.unwrap();
    s.status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "hostlb.io/AddressRequest")
        .map(|c| (c.status, c.message))
}

async fn wait_condition(server: &TestServer, name: &str, status: &str, message: &str) {
    let want = Some((status.to_string(), message.to_string()));
    eventually(&format!("{name}'s condition {want:?}"), || {
        let want = want.clone();
        async move { (request_condition(server, name).await == want).then_some(()) }
    })
    .await
}

/// An edit the allocator cannot act on leaves the address where it is, with
/// a Warning Event and a condition saying why; fixing the edit applies it.
#[tokio::test]
async fn an_invalid_edit_keeps_the_address_and_says_why() {
    let server = setup().await;
    pool(&server, "p1", json!({"addresses": ["10.0.0.0/29"]})).await;
    service(&server, "web", json!({})).await;
    let r = start(&server, "r1", false);
    wait_ips(&server, "web", &["10.0.0.0"]).await;
    assert_eq!(request_condition(&server, "web").await, None);
    let api: Api<Service> = Api::namespaced(server.client(), "shop");
    let annotate = |v: serde_json::Value| {
        let api = api.clone();
        async move {
            api.patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": v}})),
            )
            .await
            .unwrap();
        }
    };
    annotate(json!({"hostlb.io/loadBalancerIPs": "10.0.0.x"})).await;
    let why = "hostlb.io/loadBalancerIPs: \"10.0.0.x\" is not an IP address";
    wait_condition(&server, "web", "False", why).await;
    assert_eq!(ips(&server, "web").await, vec!["10.0.0.0"]);
    eventually("the Event", || async {
        events(&server, "AllocationFailed")
            .await
            .contains(&format!("web: keeping 10.0.0.0: {why}"))
            .then_some(())
    })
    .await;
    // A pool that is gone: the same.
    annotate(json!({"hostlb.io/loadBalancerIPs": null, "hostlb.io/address-pool": "gone"})).await;
    wait_condition(&server, "web", "False", "pool gone does not exist").await;
    assert_eq!(ips(&server, "web").await, vec!["10.0.0.0"]);
    // Both ways of asking, disagreeing: named both, address kept.
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": {"annotations": {"hostlb.io/address-pool": null, "hostlb.io/loadBalancerIPs": "10.0.0.3"}},
            "spec": {"loadBalancerIP": "10.0.0.4"}})),
    )
    .await
    .unwrap();
    // (A repeated Event of one reason is a series on the first, keeping its
    // note: the condition carries the current reason.)
    wait_condition(
        &server,
        "web",
        "False",
        "hostlb.io/loadBalancerIPs (10.0.0.3) and spec.loadBalancerIP (10.0.0.4) differ; set one of them",
    )
    .await;
    assert_eq!(ips(&server, "web").await, vec!["10.0.0.0"]);
    // Fixed: acted on.
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"loadBalancerIP": null}})),
    )
    .await
    .unwrap();
    wait_ips(&server, "web", &["10.0.0.3"]).await;
    wait_condition(&server, "web", "True", "").await;
    r.stop().await;
}

/// The older of two Services sharing an address changes its key: it is the
/// one refused (an Event, and another address); the younger keeps it.
#[tokio::test]
async fn a_sharing_edit_refuses_the_edited_service() {
    let server = setup().await;
    pool(&server, "p1", json!({"addresses": ["10.0.0.0/29"]})).await;
    let shared = |port: i32| {
        json!({"metadata": {"annotations": {"hostlb.io/allow-shared-ip": "k"}},
               "spec": {"ports": [{"port": port}]}})
    };
    service(&server, "old", shared(1)).await;
    let r = start(&server, "r1", false);
    wait_ips(&server, "old", &["10.0.0.0"]).await;
    service(&server, "young", shared(2)).await;
    wait_ips(&server, "young", &["10.0.0.0"]).await;
    let api: Api<Service> = Api::namespaced(server.client(), "shop");
    api.patch(
        "old",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"hostlb.io/allow-shared-ip": "other"}}})),
    )
    .await
    .unwrap();
    wait_ips(&server, "old", &["10.0.0.1"]).await;
    assert_eq!(ips(&server, "young").await, vec!["10.0.0.0"]);
    eventually("the Event", || async {
        events(&server, "AllocationFailed")
            .await
            .contains(&"old: 10.0.0.0 stays with shop/young, which shares it: sharing key \"other\" differs from \"k\"".to_string())
            .then_some(())
    })
    .await;
    r.stop().await;
}

/// An agent's record says a host that is no hostlb node answered for a
/// new VIP (`not-taken`): the pool holding it says so in an
/// `AddressesInUse` condition, naming the address, the MAC and the node
/// that asked, and another pool's addresses stay out of it; once an agent
/// holds it, the condition turns `False`.
#[tokio::test]
async fn a_pool_says_which_of_its_addresses_another_host_answers_for() {
    let server = setup().await;
    pool(&server, "main", json!({"addresses": ["10.3.0.0/24"]})).await;
    pool(&server, "other", json!({"addresses": ["10.4.0.0/24"]})).await;
    let r = start(&server, "r1", false);
    let agents: Api<hostlb_api::NodeAgent> = Api::all(server.client());
    let record = |name: &str, address: &str, vips: &[&str]| {
        serde_json::from_value::<hostlb_api::NodeAgent>(json!({
            "apiVersion": "hostlb.io/v1", "kind": "NodeAgent", "metadata": {"name": name}, "spec": {},
        }))
        .map(|a| (a, json!({"status": {
            "state": "Ready", "heartbeatTime": jiff::Timestamp::now().to_string(), "vips": vips,
            "lastConflict": {"address": address, "mac": "02:00:00:00:99:99", "outcome": "not-taken"}}})))
        .unwrap()
    };
    for (name, address) in [("node-a", "10.3.0.7"), ("node-b", "10.4.0.9")] {
        let (a, status) = record(name, address, &[]);
        agents.create(&PostParams::default(), &a).await.unwrap();
        agents
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap();
    }
    let pools: Api<IPAddressPool> = Api::namespaced(server.client(), NS);
    let in_use = |pool: &'static str, status: &'static str| {
        let pools = pools.clone();
        async move {
            pools
                .get(pool)
                .await
                .unwrap()
                .status
                .and_then(|s| {
                    s.conditions
                        .into_iter()
                        .find(|c| c.type_ == "AddressesInUse")
                })
                .filter(|c| c.status == status)
        }
    };
    let c = eventually("AddressesInUse on main", || in_use("main", "True")).await;
    assert_eq!(c.reason, "AnotherHostAnswers");
    assert!(
        c.message
            .starts_with("hosts that are no hostlb nodes answer for 10.3.0.7 (MAC 02:00:00:00:99:99, asked by node-a)"),
        "{}",
        c.message
    );
    let other = eventually("AddressesInUse on other", || in_use("other", "True")).await;
    assert!(other.message.contains("10.4.0.9") && !other.message.contains("10.3.0.7"));

    // The stranger left and node-a holds it now.
    let (_, status) = record("node-a", "10.3.0.7", &["10.3.0.7"]);
    agents
        .patch_status("node-a", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    eventually("AddressesInUse False on main", || in_use("main", "False")).await;
    r.stop().await;
}

/// Writes go in rounds off the loop: a slow server holds up neither the
/// loop (its heartbeat, `/healthz`) nor what changes meanwhile, which goes
/// in the next round.
#[tokio::test]
async fn slow_writes_do_not_stall_the_loop() {
    let server = setup().await;
    pool(&server, "p1", json!({"addresses": ["10.0.0.0/23"]})).await;
    // Three batches of writes, each slowed to 2 s.
    for i in 0..150 {
        service(&server, &format!("s{i:03}"), json!({})).await;
    }
    server.set_slow_writes("r1", Duration::from_secs(2));
    let r = start(&server, "r1", false);
    let started = tokio::time::Instant::now();
    let mut silent = 0;
    let mut late = false;
    while started.elapsed() < Duration::from_secs(8) {
        silent = silent.max(r.telemetry.silent_secs());
        if !late && started.elapsed() > Duration::from_secs(3) {
            // Mid-round: a Service created now is written in the next one.
            service(&server, "late", json!({})).await;
            late = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The heartbeat turns each second; whole seconds are read.
    assert!(silent <= 2, "the loop was silent for {silent} s");
    server.set_slow_writes("r1", Duration::ZERO);
    eventually("every Service to have an address", || async {
        let api: Api<Service> = Api::namespaced(server.client(), "shop");
        let all = api.list(&ListParams::default()).await.unwrap();
        (all.items.len() == 151
            && all.items.iter().all(|s| {
                s.status
                    .as_ref()
                    .and_then(|s| s.load_balancer.as_ref())
                    .and_then(|l| l.ingress.as_ref())
                    .is_some_and(|i| !i.is_empty())
            }))
        .then_some(())
    })
    .await;
    r.stop().await;
}
