//! `kubectl hostlb` run as a binary against the test API server holding a
//! small cluster's objects: three Nodes with agent records, pools (one
//! overlapping another), advertisements (one selecting no node),
//! Services with and without addresses and annotations. Asserts on what
//! the commands print and their exit status.

use std::path::PathBuf;
use std::process::Command;

use hostlb_api::crds;
use hostlb_tests::apiserver::TestServer;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

struct Bed {
    server: TestServer,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

impl Bed {
    /// Runs `f` with a client of the test server, on the bed's runtime:
    /// the test's own writes between two runs of the plugin.
    fn api<Fut: std::future::Future<Output = ()>>(&self, f: impl FnOnce(Client) -> Fut) {
        self.rt.block_on(async { f(self.server.client()).await })
    }

    /// A merge patch of the Node `name`.
    fn patch_node(&self, name: &str, patch: Value) {
        self.api(|client| async move {
            let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
            api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap();
        });
    }

    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_kubectl-hostlb"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("run kubectl-hostlb");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

fn record(mac: &str, state: &str, heartbeat: &str, extra: Value) -> Value {
    let mut status = json!({
        "heartbeatTime": heartbeat,
        "lastChangeTime": heartbeat,
        "version": "0.1.0",
        "protocol": 2,
        "configHash": "0123456789ab",
        "state": state,
        "gossipAddress": "10.77.0.12:7934",
        "macs": [mac],
        "members": 3,
        "memberNames": NODES,
        "membersHash": "aaaaaaaaaaaa",
        "interfaces": [{"name": "eth0", "mac": mac, "prefixes": ["10.77.0.0/24", "fd00:77::/64"], "announce": true}],
        "heldVIPs": 0,
    });
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            status[k] = v;
        }
    }
    status
}

async fn objects(client: Client) {
    let crd_api = Api::<CustomResourceDefinition>::all(client.clone());
    for (_, crd) in crds::all() {
        crd_api.create(&PostParams::default(), &crd).await.unwrap();
    }
    let apply = |v: Value| {
        let client = client.clone();
        async move {
            let kind = v["kind"].as_str().unwrap().to_string();
            let name = v["metadata"]["name"].as_str().unwrap().to_string();
            let ns = v["metadata"]["namespace"].as_str().map(str::to_string);
            let api_version = v["apiVersion"].as_str().unwrap().to_string();
            let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
            let gvk = kube::api::GroupVersionKind::gvk(group, version, &kind);
            let (ar, _) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
            let api: Api<kube::api::DynamicObject> = match ns {
                Some(ns) => Api::namespaced_with(client.clone(), &ns, &ar),
                None => Api::all_with(client.clone(), &ar),
            };
            let status = v.get("status").cloned();
            api.patch(&name, &PatchParams::apply("test"), &Patch::Apply(&v))
                .await
                .unwrap();
            if let Some(status) = status {
                let mut body = v.clone();
                body["status"] = status;
                api.patch_status(
                    &name,
                    &PatchParams::apply("test").force(),
                    &Patch::Apply(&body),
                )
                .await
                .unwrap();
            }
        }
    };
    apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hostlb-system"}}))
        .await;
    for (i, n) in NODES.iter().enumerate() {
        apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n, "zone": if i == 0 { "a" } else { "b" }}}})).await;
    }
    apply(json!({"apiVersion": "hostlb.io/v1", "kind": "IPAddressPool", "metadata": {"name": "default", "namespace": "hostlb-system", "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"addresses": ["10.77.0.100-10.77.0.120"]}})).await;
    apply(json!({"apiVersion": "hostlb.io/v1", "kind": "IPAddressPool", "metadata": {"name": "late", "namespace": "hostlb-system"}, "spec": {"addresses": ["10.77.0.120-10.77.0.130"]}})).await;
    apply(json!({"apiVersion": "hostlb.io/v1", "kind": "L2Advertisement", "metadata": {"name": "main", "namespace": "hostlb-system"}, "spec": {"ipAddressPools": ["default", "late"]}})).await;
    apply(json!({"apiVersion": "hostlb.io/v1", "kind": "L2Advertisement", "metadata": {"name": "nowhere", "namespace": "hostlb-system"}, "spec": {"ipAddressPools": ["default"], "nodeSelectors": [{"matchLabels": {"zone": "mars"}}]}})).await;
    let svc = |name: &str, ip: Option<&str>, annotations: Value| {
        let mut v = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default", "annotations": annotations}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}});
        if let Some(ip) = ip {
            v["status"] = json!({"loadBalancer": {"ingress": [{"ip": ip}]}});
        }
        v
    };
    apply(svc(
        "web",
        Some("10.77.0.100"),
        json!({"hostlb.io/ip-allocated-from-pool": "default"}),
    ))
    .await;
    apply(svc("db", None, json!({}))).await;
    // Given an address that a host that is no hostlb node answers for:
    // nobody announces it (node-a's record says why).
    apply(svc(
        "zoo",
        Some("10.77.0.101"),
        json!({"hostlb.io/ip-allocated-from-pool": "default"}),
    ))
    .await;
    for name in ["web", "db"] {
        apply(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": format!("{name}-1"), "namespace": "default", "labels": {"kubernetes.io/service-name": name}}, "addressType": "IPv4", "endpoints": NODES.iter().enumerate().map(|(i, n)| json!({"addresses": [format!("10.244.0.{}", i + 10)], "nodeName": n, "conditions": {"ready": true}})).collect::<Vec<_>>()})).await;
    }
    let now = jiff::Timestamp::now().to_string();
    let old = (jiff::Timestamp::now() - jiff::SignedDuration::from_secs(600)).to_string();
    let records = [
        // node-a did not take a new VIP a stranger answers for, which
        // nobody holds.
        (
            "node-a",
            record(
                "02:00:00:00:00:0a",
                "Ready",
                &now,
                json!({
                    "lastConflict": {"address": "10.77.0.101", "mac": "02:00:00:00:99:99", "outcome": "not-taken"},
                    // web's address came back to node-a, its preferred
                    // node, after node-b had it.
                    "recentMoves": [{"address": "10.77.0.100", "from": "node-b", "cause": "preference", "time": now}],
                }),
            ),
        ),
        (
            "node-b",
            record(
                "02:00:00:00:00:0b",
                "Ready",
                &now,
                json!({
                    "members": 2, "memberNames": ["node-a", "node-b"], "membersHash": "bbbbbbbbbbbb",
                    "recentMoves": [
                        {"address": "10.77.0.100", "from": "node-a", "cause": "host-gone", "darkMs": 190, "time": old},
                        {"address": "10.77.0.101", "from": "node-c", "cause": "stalled", "darkMs": 240, "time": old},
                    ],
                }),
            ),
        ),
        (
            "node-c",
            record("02:00:00:00:00:0c", "Ready", &old, json!({})),
        ),
    ];
    for (n, status) in records {
        apply(json!({"apiVersion": "hostlb.io/v1", "kind": "NodeAgent", "metadata": {"name": n}, "spec": {}, "status": status})).await;
    }
}

fn bed() -> Bed {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(TestServer::start());
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    rt.block_on(async { objects(server.client()).await });
    Bed {
        server,
        kubeconfig,
        _dir: dir,
        rt,
    }
}

/// One Service with its address, pool and announcer; the one without an
/// address; the pools; the agent whose record went stale.
#[test]
fn status_shows_services_pools_and_the_agents_that_are_not_ready() {
    let b = bed();
    // The winner of 10.77.0.100 among the fresh, ready agents (a and b) is
    // what the annotation should say; status prints the annotation as is.
    let (code, out, err) = b.run(&["status"]);
    eprintln!("{out}");
    assert_eq!(code, 0, "{err}");
    let web = out
        .lines()
        .find(|l| l.starts_with("default") && l.contains(" web "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        web.contains("10.77.0.100") && web.contains(" default "),
        "{out}"
    );
    let db = out.lines().find(|l| l.contains(" db ")).unwrap();
    assert!(db.contains("<pending>"), "{out}");
    let zoo = out.lines().find(|l| l.contains(" zoo ")).unwrap();
    assert!(
        zoo.contains("not taken: 02:00:00:00:99:99 (no hostlb node) answers"),
        "{out}"
    );
    assert!(out.contains("POOLS") && out.contains("late"), "{out}");
    assert!(out.contains("AGENTS: 2 of 3 ready; not ready:"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("node-c") && l.contains("Stale")),
        "{out}"
    );
    assert!(!out.contains("LAST MOVE"), "{out}");
    // -o wide lists every agent, with version and config hash, and each
    // address's last move as the node it moved to recorded it.
    let (_, wide, _) = b.run(&["status", "-o", "wide"]);
    eprintln!("{wide}");
    assert!(
        wide.lines()
            .any(|l| l.starts_with("node-a") && l.contains("0123456789ab")),
        "{wide}"
    );
    assert!(wide.contains("LAST MOVE"), "{wide}");
    let web = wide.lines().find(|l| l.contains(" web ")).unwrap();
    assert!(
        web.contains("10.77.0.100: node-b -> node-a preference") && !web.contains("host-gone"),
        "the newer move is shown: {wide}"
    );
    let zoo = wide.lines().find(|l| l.contains(" zoo ")).unwrap();
    assert!(
        zoo.contains("10.77.0.101: node-c -> node-b stalled (dark 240ms) 10m"),
        "{wide}"
    );
    // -o json is the same content, structured.
    let (_, json, _) = b.run(&["status", "-o", "json"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["services"][1]["name"], "web", "{json}");
    assert_eq!(v["services"][1]["pool"], "default");
    assert_eq!(v["services"][1]["last_moves"][0]["to"], "node-a", "{json}");
    assert_eq!(v["services"][2]["last_moves"][0]["dark_ms"], 240, "{json}");
    assert_eq!(v["agents"][2]["state"], "Stale");
    // -n narrows the Services.
    let (_, none, _) = b.run(&["status", "-n", "kube-system"]);
    assert!(none.starts_with("SERVICES\nnone\n"), "{none}");
}

/// The election for web's address, computed with the agents the records
/// show running (node-c's is stale, so it is out), and the annotation
/// judged against it.
#[test]
fn explain_computes_the_election_and_judges_the_annotation() {
    let b = bed();
    let (code, out, err) = b.run(&["explain", "svc/web", "-n", "default"]);
    eprintln!("{out}");
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("members (agents running, by their records): node-a, node-b"),
        "{out}"
    );
    assert!(
        out.contains("ORDER") && out.contains("SHA256(NODE#IP)"),
        "{out}"
    );
    assert!(out.contains("node-c") && out.contains("not-live"), "{out}");
    // Nobody announces it yet: a disagreement, explained.
    assert!(out.contains("announced by: nobody (DISAGREES"), "{out}");
    assert!(out.contains("no node says it announces"), "{out}");
    assert!(
        out.contains("firewall: only 80/tcp and ICMP reach it on its hosts"),
        "{out}"
    );
    assert!(out.contains("see different gossip members"), "{out}");
    let (_, json, _) = b.run(&["explain", "svc/web", "-o", "json"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    let winner = v["addresses"][0]["election"]["winner"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(winner == "node-a" || winner == "node-b", "{json}");
    assert_eq!(v["addresses"][0]["agrees"], false);

    // The winner announces it: they agree.
    let announced = format!("{winner},eth0");
    b.api(|client| async move {
        let api: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client, "default");
        api.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"hostlb.io/announcing-IPv4": announced}}}),
            ),
        )
        .await
        .unwrap();
    });
    let (_, out, _) = b.run(&["explain", "svc/web"]);
    assert!(
        out.contains(&format!("announced by: {winner},eth0 (agrees)")),
        "{out}"
    );
    assert!(!out.contains("maintenance:"), "{out}");

    // A node out of service: named with the taint as its reason.
    b.patch_node(
        "node-b",
        json!({"spec": {"taints": [
            {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}
        ]}}),
    );
    let (_, out, _) = b.run(&["explain", "svc/web"]);
    assert!(
        out.contains(
            "maintenance:\n  - node-b: out of service (taint node.kubernetes.io/out-of-service)"
        ),
        "{out}"
    );

    // A cordon counts only where an advertisement says so, and explain
    // says which.
    b.patch_node("node-a", json!({"spec": {"unschedulable": true}}));
    let (_, out, _) = b.run(&["explain", "svc/web"]);
    assert!(
        out.contains(
            "  - node-a: cordoned; no advertisement counts a cordon, so it serves as before"
        ),
        "{out}"
    );
    b.api(|client| async move {
        let api: Api<hostlb_api::L2Advertisement> = Api::namespaced(client, "hostlb-system");
        api.patch(
            "main",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"drainCordonedNodes": true}})),
        )
        .await
        .unwrap();
    });
    let (_, out, _) = b.run(&["explain", "svc/web"]);
    assert!(
        out.contains("  - node-a: cordoned: drained for the addresses of main (drainCordonedNodes), elected after every node that is not"),
        "{out}"
    );

    let (code, _, err) = b.run(&["explain", "web"]);
    assert_eq!(code, 2);
    assert!(err.contains("expected svc/NAME"), "{err}");
    let (code, _, err) = b.run(&["explain", "svc/nope"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no Service nope in namespace default"),
        "{err}"
    );
}

/// The lint finds what is wrong and exits 1.
#[test]
fn check_finds_what_is_wrong_and_exits_non_zero() {
    let b = bed();
    let (code, out, err) = b.run(&["check"]);
    eprintln!("{out}");
    assert_eq!(code, 1, "{out}{err}");
    for want in [
        "IPAddressPool/late",
        "overlaps the older pool default",
        "L2Advertisement/nowhere",
        "spec.nodeSelectors match no Node",
        "Service/default/db",
        "has no address",
        "NodeAgent/node-c",
        "not written for three minutes",
        "NodeAgent/node-a",
        "did not take 10.77.0.101: the host with MAC 02:00:00:00:99:99 answers for it",
        "the agents disagree on gossip membership",
    ] {
        assert!(out.contains(want), "no {want:?} in:\n{out}");
    }
    let (code, json, _) = b.run(&["check", "-o", "json"]);
    assert_eq!(code, 1);
    let v: Value = serde_json::from_str(&json).unwrap();
    assert!(
        v.as_array()
            .unwrap()
            .iter()
            .any(|f| f["severity"] == "error")
    );
    let (_, yaml, _) = b.run(&["check", "-o", "yaml"]);
    assert!(yaml.contains("severity: error"), "{yaml}");
}

/// An address in no node's prefixes, on agents that run virtual mode:
/// every live agent holds it on its virtual interface. `status` prints the
/// virtual annotation; `explain` computes the node set and judges the
/// annotation against it.
#[test]
fn a_routed_address_shows_the_nodes_that_hold_it() {
    let b = bed();
    b.api(|client| async move {
        let agents: Api<hostlb_api::v1::NodeAgent> = Api::all(client.clone());
        for n in NODES {
            agents
                .patch_status(
                    n,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"virtualMode": true}})),
                )
                .await
                .unwrap();
        }
        let pools: Api<hostlb_api::IPAddressPool> = Api::namespaced(client.clone(), "hostlb-system");
        let pool: hostlb_api::IPAddressPool = serde_json::from_value(json!({"apiVersion": "hostlb.io/v1", "kind": "IPAddressPool", "metadata": {"name": "routed", "namespace": "hostlb-system"}, "spec": {"addresses": ["10.99.0.0/24"]}})).unwrap();
        pools.create(&PostParams::default(), &pool).await.unwrap();
        let ads: Api<hostlb_api::L2Advertisement> = Api::namespaced(client.clone(), "hostlb-system");
        let ad: hostlb_api::L2Advertisement = serde_json::from_value(json!({"apiVersion": "hostlb.io/v1", "kind": "L2Advertisement", "metadata": {"name": "routed", "namespace": "hostlb-system"}, "spec": {"ipAddressPools": ["routed"]}})).unwrap();
        ads.create(&PostParams::default(), &ad).await.unwrap();
        let services: Api<k8s_openapi::api::core::v1::Service> =
            Api::namespaced(client, "default");
        services
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    "hostlb.io/ip-allocated-from-pool": "routed",
                    "hostlb.io/announcing-virtual-IPv4": "node-a,node-b"}}})),
            )
            .await
            .unwrap();
        services
            .patch_status(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "10.99.0.5"}]}}})),
            )
            .await
            .unwrap();
    });
    let (code, out, err) = b.run(&["status"]);
    assert_eq!(code, 0, "{err}");
    let web = out
        .lines()
        .find(|l| l.starts_with("default") && l.contains(" web "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(web.contains("routed via node-a,node-b"), "{out}");
    // node-c's record is stale: the agents running are a and b, and both
    // hold it. The annotation agrees.
    let (code, out, err) = b.run(&["explain", "svc/web"]);
    eprintln!("{out}");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("routed by: node-a,node-b (agrees)"), "{out}");
    let (_, json, _) = b.run(&["explain", "svc/web", "-o", "json"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["addresses"][0]["routed_agrees"], true, "{json}");
    assert_eq!(
        v["addresses"][0]["election"]["virtual"],
        json!(["node-a", "node-b"]),
        "{json}"
    );
}

/// `drain node-a` sets the record's `spec.drain` and follows the VIPs by
/// their announcing annotations: each move told, a VIP whose only
/// endpoint is on node-a kept with the reason, the end once node-a's agent
/// says the drain is in force; a VIP that could move but does not fails it
/// at the timeout; `undrain` clears the field. The agents' part is played
/// here by writing what they would write.
#[test]
fn drain_follows_the_vips_off_the_node_and_undrain_lets_it_win_again() {
    use std::process::Stdio;
    let b = bed();
    let services =
        |client: Client| Api::<k8s_openapi::api::core::v1::Service>::namespaced(client, "default");
    let announce = |svc: &'static str, node: &'static str| {
        move |client: Client| async move {
            services(client)
                .patch(
                    svc,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {"hostlb.io/announcing-IPv4": format!("{node},eth0")}}})),
                )
                .await
                .unwrap();
        }
    };
    b.api(|client| async move {
        // "pin": its only endpoint is on node-a.
        let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "pin", "namespace": "default", "annotations": {"hostlb.io/announcing-IPv4": "node-a,eth0"}}, "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80, "protocol": "TCP"}]}})).unwrap();
        services(client.clone()).create(&PostParams::default(), &svc).await.unwrap();
        services(client.clone())
            .patch_status("pin", &PatchParams::default(), &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "10.77.0.102"}]}}})))
            .await
            .unwrap();
        let slice: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "pin-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "pin"}}, "addressType": "IPv4", "endpoints": [{"addresses": ["10.244.0.50"], "nodeName": "node-a", "conditions": {"ready": true}}]})).unwrap();
        Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(client, "default")
            .create(&PostParams::default(), &slice)
            .await
            .unwrap();
    });
    b.api(announce("web", "node-a"));

    let drain = Command::new(env!("CARGO_BIN_EXE_kubectl-hostlb"))
        .arg("--kubeconfig")
        .arg(&b.kubeconfig)
        .args(["drain", "node-a", "--timeout", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // node-a's agent hears of it (the record's spec), hands web to node-b
    // and says the drain is in force; pin stays.
    let agents = |client: Client| Api::<hostlb_api::v1::NodeAgent>::all(client);
    let heard = std::time::Instant::now();
    loop {
        let spec =
            b.rt.block_on(async { agents(b.server.client()).get("node-a").await.unwrap().spec });
        if spec.drain {
            break;
        }
        assert!(
            heard.elapsed() < std::time::Duration::from_secs(10),
            "spec.drain never set"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(600));
    b.api(announce("web", "node-b"));
    b.api(|client| async move {
        agents(client)
            .patch_status(
                "node-a",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"drained": true}})),
            )
            .await
            .unwrap();
    });
    let out = drain.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("moved 10.77.0.100 to node-b"), "{stdout}");
    assert!(
        stdout.contains("node-a drained: 1 of 2 VIPs moved in"),
        "{stdout}"
    );
    assert!(
        stdout.contains("stays: 10.77.0.102 (default/pin): no other node can serve it (")
            && stdout.contains("node-b: no usable endpoint of the Service on the node"),
        "{stdout}"
    );

    // Status shows the drained agent.
    let (_, status, _) = b.run(&["status"]);
    assert!(status.contains("1 drained"), "{status}");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("node-a") && l.contains("Ready (drained)")),
        "{status}"
    );

    // zoo's address is on node-b and could move (to node-a it cannot: drained;
    // nobody serves it, it has no endpoints, so it is no stay either): the
    // drain of node-b times out naming it.
    b.api(announce("zoo", "node-b"));
    b.api(announce("web", "node-a"));
    let (code, out, _) = b.run(&["drain", "node-b", "--timeout", "1"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("node-b not drained after"), "{out}");
    assert!(
        out.contains("the drain is not in force: node-b's agent has not said it heard of it yet"),
        "{out}"
    );

    let (code, out, err) = b.run(&["undrain", "node-a"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("node-a undrained"), "{out}");
    let spec =
        b.rt.block_on(async { agents(b.server.client()).get("node-a").await.unwrap().spec });
    assert!(!spec.drain);
    let (code, _, err) = b.run(&["drain", "node-z", "--no-wait"]);
    assert_eq!(code, 2);
    assert!(err.contains("no NodeAgent record node-z"), "{err}");
}

/// `rebalance svc/web`: with the advertisement sticky, web's address
/// stays on node-b, which announces it, though node-a is preferred
/// (explain agrees with node-b); the command annotates the Service, names
/// the move, sees it arrive once node-a announces it (the agents' part,
/// played here), and takes the annotation away. With no sticky address,
/// `--all` has nothing to do.
#[test]
fn rebalance_moves_a_sticky_address_to_the_preferred_node() {
    use std::process::Stdio;
    let b = bed();
    let services =
        |client: Client| Api::<k8s_openapi::api::core::v1::Service>::namespaced(client, "default");
    let announce = |node: &'static str| {
        move |client: Client| async move {
            services(client)
                .patch(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {"hostlb.io/announcing-IPv4": format!("{node},eth0")}}})),
                )
                .await
                .unwrap();
        }
    };
    let (code, out, _) = b.run(&["rebalance", "--all"]);
    assert_eq!(code, 0);
    assert!(out.contains("nothing to rebalance"), "{out}");
    b.api(|client| async move {
        Api::<hostlb_api::v1::L2Advertisement>::namespaced(client, "hostlb-system")
            .patch(
                "main",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"placement": "Sticky", "preferredNodeSelectors": [{"weight": 50, "preference": {"matchLabels": {"zone": "a"}}}]}})),
            )
            .await
            .unwrap();
    });
    b.api(announce("node-b"));
    let (code, out, _) = b.run(&["explain", "svc/web", "-n", "default"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("node-b (holds it: sticky)"), "{out}");

    let rebalance = Command::new(env!("CARGO_BIN_EXE_kubectl-hostlb"))
        .arg("--kubeconfig")
        .arg(&b.kubeconfig)
        .args(["rebalance", "svc/web", "-n", "default", "--timeout", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let annotation = || {
        b.rt.block_on(async {
            services(b.server.client())
                .get("web")
                .await
                .unwrap()
                .metadata
                .annotations
                .unwrap_or_default()
                .get("hostlb.io/rebalance")
                .cloned()
        })
    };
    let asked = std::time::Instant::now();
    while annotation().is_none() {
        assert!(
            asked.elapsed() < std::time::Duration::from_secs(10),
            "the rebalance annotation never set"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(600));
    b.api(announce("node-a"));
    let out = rebalance.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("{stdout}{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stdout.contains("10.77.0.100 (default/web): node-b -> node-a"),
        "{stdout}"
    );
    assert!(
        stdout.contains("10.77.0.100 (default/web): now on node-a ("),
        "{stdout}"
    );
    assert!(stdout.contains("rebalanced: 1 moved"), "{stdout}");
    assert_eq!(annotation(), None, "the annotation is taken away");
}
