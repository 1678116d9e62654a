//! Cold allocation against the real kube-apiserver (v1.28.0 with etcd),
//! the allocator running as its shipped ServiceAccount with leader
//! election on, as in production.
//!
//! `cargo bench -p hostlb-allocator --bench realserver`
//!
//! Each run starts a fresh server, creates `COLD_SERVICES` (default 2,000)
//! LoadBalancer Services before the allocator starts, then starts it and
//! times, from the start, until a client watching the Services sees an
//! address on every one. It checks that no address was
//! handed out twice. Then a second replica is started over the same
//! Services with the first one stopped, and the time until it is ready and
//! the Services it wrote are printed (a restart must write nothing).
//! `COLD_RUNS` (default 3) runs; the median is printed. Target: 2,000 in
//! at most 5 s.
//!
//! Then, for each outage in `CATCHUP_OUTAGES` (seconds, comma-separated,
//! default `15`; `15,120` for the documented figures), the API server is
//! killed for that long and started again, and the time from its return
//! (ready, RBAC loaded) until the replica is ready and a Service created
//! then has its address is printed. Target: 5 s.
//!
//! `RUST_LOG=hostlb_allocator=debug` shows the controller's log.
//!
//! Needs `../shared/kube-apiserver` and etcd-server; without them it says so
//! and prints no figure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hostlb_api::IPAddressPool;
use hostlb_tests::median;
use hostlb_tests::realserver::{RealServer, create_load_balancers, kube_config};
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::WatchStreamExt;
use serde_json::json;

const NS: &str = "hostlb-system";

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[path = "../tests/support/replica.rs"]
#[allow(dead_code)]
mod replica;
use replica::{Replica, start as start_replica};

fn start(sa: &kube::Config, identity: &str) -> Replica {
    start_replica(sa, identity, true, Duration::from_secs(30))
}

/// Each Service's addresses as a watching client sees them (a watch
/// costs the server far less than listing 2,000 Services again and again,
/// which would slow down what is measured).
fn watch_addresses(
    api: Api<Service>,
) -> tokio::sync::watch::Receiver<BTreeMap<String, Vec<String>>> {
    let (tx, rx) = tokio::sync::watch::channel(BTreeMap::new());
    tokio::spawn(async move {
        let stream = kube::runtime::watcher(api, kube::runtime::watcher::Config::default())
            .applied_objects();
        futures::pin_mut!(stream);
        while let Some(Ok(s)) = stream.next().await {
            let ips: Vec<String> = s
                .status
                .and_then(|s| s.load_balancer)
                .and_then(|lb| lb.ingress)
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip)
                .collect();
            let name = s.metadata.name.unwrap_or_default();
            tx.send_modify(|m| {
                m.insert(name, ips);
            });
        }
    });
    rx
}

/// Per outage: how long after the API server is back (ready, RBAC
/// loaded) the allocator is ready again and a Service created then has its
/// address.
async fn catch_up(
    server: &RealServer,
    replica: &Replica,
    services: &Api<Service>,
    outage: Duration,
) -> Duration {
    tokio::task::block_in_place(|| server.kill_apiserver());
    tokio::time::sleep(outage).await;
    tokio::task::block_in_place(|| server.start_apiserver());
    let back = Instant::now();
    let name = format!("late-{}", outage.as_secs());
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    loop {
        let allocated = services
            .get(&name)
            .await
            .ok()
            .and_then(|s| s.status?.load_balancer?.ingress)
            .is_some_and(|i| !i.is_empty());
        if allocated && replica.telemetry.is_ready() {
            return back.elapsed();
        }
        assert!(back.elapsed() < Duration::from_secs(120), "no catch-up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run(
    n: usize,
    port: u16,
    outages: &[Duration],
) -> (Duration, Duration, u64, Vec<Duration>) {
    let dir = tempfile::tempdir().unwrap();
    let server = tokio::task::block_in_place(|| {
        let s = RealServer::start_local(port, port + 10_000, &dir.path().join("k8s"));
        s.install_hostlb("allocator/rbac.yaml");
        s.kubectl(&["create", "namespace", "shop"]);
        s.service_account_kubeconfig(NS, "hostlb-allocator", &dir.path().join("sa.kubeconfig"));
        s
    });
    let admin = Client::try_from(kube_config(&server.admin_kubeconfig()).await).unwrap();
    let sa = kube_config(&dir.path().join("sa.kubeconfig")).await;
    let pools: Api<IPAddressPool> = Api::namespaced(admin.clone(), NS);
    let pool: IPAddressPool = serde_json::from_value(json!({"apiVersion": "hostlb.io/v1",
        "kind": "IPAddressPool", "metadata": {"name": "p"},
        "spec": {"addresses": ["10.0.0.0/16"]}}))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    let services: Api<Service> = Api::namespaced(admin.clone(), "shop");
    create_load_balancers(&admin, "shop", n).await;

    let mut seen = watch_addresses(services.clone());
    seen.wait_for(|m| m.len() == n).await.unwrap();
    let started = Instant::now();
    let first = start(&sa, "replica-a");
    let all = tokio::time::timeout(
        Duration::from_secs(300),
        seen.wait_for(|m| m.values().all(|ips| !ips.is_empty())),
    )
    .await
    .expect("every Service allocated")
    .unwrap()
    .clone();
    let cold = started.elapsed();
    let ips: Vec<&String> = all.values().flatten().collect();
    let distinct: BTreeSet<&String> = ips.iter().copied().collect();
    assert_eq!(distinct.len(), n, "an address was handed out twice");
    first.stop().await;

    let versions = |api: Api<Service>| async move {
        let list = api.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .map(|s| s.metadata.resource_version.unwrap_or_default())
            .collect::<BTreeSet<String>>()
    };
    let before = versions(services.clone()).await;
    let started = Instant::now();
    let second = start(&sa, "replica-b");
    while !second.telemetry.is_ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let restart = started.elapsed();
    // Give it time to write anything it believed it had to.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = versions(services.clone()).await;
    let mut caught_up = Vec::new();
    for outage in outages {
        caught_up.push(catch_up(&server, &second, &services, *outage).await);
    }
    second.stop().await;
    (
        cold,
        restart,
        after.difference(&before).count() as u64,
        caught_up,
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Err(why) = RealServer::available() {
        println!("realserver bench NOT RUN: {why}");
        return;
    }
    if let Ok(filter) = std::env::var("RUST_LOG") {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let n = env("COLD_SERVICES", 2000);
    let runs = env("COLD_RUNS", 3);
    let outages: Vec<Duration> = std::env::var("CATCHUP_OUTAGES")
        .unwrap_or_else(|_| "15".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .map(Duration::from_secs)
        .collect();
    let mut colds = Vec::new();
    for r in 0..runs {
        let (cold, restart, writes, caught_up) = run(n, 18443 + r as u16 * 2, &outages).await;
        println!(
            "run {r}: {n} Services allocated in {:.2} s ({:.0}/s); restart ready in {} ms, {writes} Services written",
            cold.as_secs_f64(),
            n as f64 / cold.as_secs_f64(),
            restart.as_millis()
        );
        for (outage, t) in outages.iter().zip(caught_up) {
            println!(
                "run {r}: after a {} s outage, ready with a new Service allocated {} ms after the API server was back",
                outage.as_secs(),
                t.as_millis()
            );
        }
        colds.push(cold);
    }
    let m = median(colds);
    println!(
        "cold allocation of {n} Services: median {:.2} s over {runs} runs (target <= 5 s)",
        m.as_secs_f64()
    );
}
