//! The agent's writer against the real kube-apiserver (v1.28.0 with etcd),
//! as the shipped `hostlb-agent` ServiceAccount: how long until 1,000
//! Services this node just took show its `announcing-IPv4` annotation, and
//! until their 1,000 `AnnouncingLocal` Events exist, as a client sees them.
//!
//! `cargo bench -p lbnodeagent --bench writer`
//!
//! `WRITER_SERVICES` (default 1,000) and `WRITER_RUNS` (default 3); the
//! medians are printed. Needs `../shared/kube-apiserver` and etcd-server;
//! without them it says so and prints no figure.

use std::time::{Duration, Instant};

use futures::StreamExt;
use hostlb_api::annotations::{ANNOUNCING_IPV4, reasons};
use hostlb_tests::median;
use hostlb_tests::realserver::{RealServer, create_load_balancers, kube_config};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use lbnodeagent::agent::core::{Announcing, EventRequest};
use lbnodeagent::agent::telemetry::Telemetry;
use lbnodeagent::agent::{ServiceRecords, report};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn client(path: &std::path::Path) -> Client {
    Client::try_from(kube_config(path).await).unwrap()
}

async fn run(n: usize, port: u16) -> (Duration, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let policy = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/agent/policy-v1beta1.yaml"
    );
    let server = tokio::task::block_in_place(|| {
        let s = RealServer::start_local(port, port + 10_000, &dir.path().join("k8s"));
        s.install_hostlb("agent/rbac.yaml");
        s.kubectl(&["create", "namespace", "shop"]);
        s.kubectl(&["apply", "-f", policy]);
        let kubeconfig = s.node_identity("node-a", &dir.path().join("node-a"));
        (s, kubeconfig)
    });
    let (server, kubeconfig) = server;
    let admin = client(&server.admin_kubeconfig()).await;
    let agent = client(&kubeconfig).await;
    let services: Api<Service> = Api::namespaced(admin.clone(), "shop");
    create_load_balancers(&admin, "shop", n).await;

    // The agent's records of Services, as its watches keep them.
    let store = ServiceRecords::default();
    let records = store.clone();
    let mut stream = watcher(
        Api::<Service>::all(agent.clone()),
        watcher::Config::default(),
    )
    .boxed();
    let cache = tokio::spawn(async move {
        while let Some(e) = stream.next().await {
            if let Ok(e) = e {
                records.apply(&e);
            }
        }
    });
    while store.len() < n {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let telemetry = Telemetry::new();
    let handle = report::start(agent, "node-a", store, telemetry.clone());
    let started = Instant::now();
    let want: Announcing = (0..n)
        .map(|i| {
            (
                (format!("shop/s{i}"), ANNOUNCING_IPV4),
                Some("node-a,eth0".to_string()),
            )
        })
        .collect();
    handle.announcing.send(want).unwrap();
    for i in 0..n {
        handle.event(EventRequest {
            service: format!("shop/s{i}"),
            warning: false,
            reason: reasons::ANNOUNCING_LOCAL,
            note: "announcing from node-a on eth0".into(),
        });
    }
    let mut annotated = None;
    let mut events = None;
    let event_api: Api<Event> = Api::namespaced(admin.clone(), "shop");
    while annotated.is_none() || events.is_none() {
        assert!(started.elapsed() < Duration::from_secs(600), "not written");
        tokio::time::sleep(Duration::from_millis(100)).await;
        if annotated.is_none() {
            let list = services.list(&ListParams::default()).await.unwrap();
            let done = list
                .items
                .iter()
                .filter(|s| s.annotations().get(ANNOUNCING_IPV4).is_some())
                .count();
            if done == n {
                annotated = Some(started.elapsed());
            }
        }
        if events.is_none() {
            let list = event_api.list(&ListParams::default()).await.unwrap();
            if list.items.len() >= n {
                events = Some(started.elapsed());
            }
        }
    }
    assert_eq!(telemetry.events_dropped.get(), 0, "Events were dropped");
    drop(handle);
    cache.abort();
    (annotated.unwrap(), events.unwrap())
}

use kube::ResourceExt;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Err(why) = RealServer::available() {
        println!("writer bench NOT RUN: {why}");
        return;
    }
    let n = env("WRITER_SERVICES", 1000);
    let runs = env("WRITER_RUNS", 3);
    let (mut a, mut e) = (Vec::new(), Vec::new());
    for r in 0..runs {
        let (annotated, events) = run(n, 19443 + r as u16 * 2).await;
        println!(
            "run {r}: {n} annotations in {:.2} s, {n} Events in {:.2} s",
            annotated.as_secs_f64(),
            events.as_secs_f64()
        );
        a.push(annotated);
        e.push(events);
    }
    println!(
        "agent writer, {n} Services taken at once: annotations median {:.2} s, Events median {:.2} s over {runs} runs (listed every 100 ms)",
        median(a).as_secs_f64(),
        median(e).as_secs_f64()
    );
}
