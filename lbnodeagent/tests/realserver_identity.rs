//! What one host's credential can do, tried on the real kube-apiserver
//! (v1.28.0, RBAC, ValidatingAdmissionPolicy on) as an attacker with root
//! on that host would: its node's token, made by the shipped
//! `deploy/agent/kubeconfig.sh`, under the shipped `deploy/agent/rbac.yaml`
//! and `deploy/agent/policy-v1beta1.yaml`.
//!
//! Needs kubectl, curl, etcd-server and the real server
//! (`../shared/kube-apiserver`). Without it the test says it did not run;
//! under `CI=true` that is a failure.

use hostlb_tests::realserver::{RealServer, kube_config};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// `port` for the API server; etcd takes `port + 10_000` and the next one.
const PORT: u16 = 16493;

async fn client(path: &std::path::Path) -> Client {
    Client::try_from(kube_config(path).await).unwrap()
}

/// The HTTP status of a refusal, or 200.
fn code<T>(r: &Result<T, kube::Error>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("not an answer from the server: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hosts_credential_cannot_rewrite_a_service_or_another_nodes_record() {
    if let Err(why) = RealServer::available() {
        eprintln!("NOT RUN: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, node_a, node_b) = tokio::task::block_in_place(|| {
        let s = RealServer::start_local(PORT, PORT + 10_000, &dir.path().join("k8s"));
        s.install_hostlb("agent/rbac.yaml");
        let policy = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/agent/policy-v1beta1.yaml"
        );
        s.kubectl(&["apply", "-f", policy]);
        s.kubectl(&["create", "namespace", "shop"]);
        s.kubectl(&[
            "-n",
            "shop",
            "create",
            "service",
            "clusterip",
            "web",
            "--tcp=80:80",
        ]);
        s.wait_agent_policy("shop", "web");
        let a = s.node_identity("node-a", &dir.path().join("node-a"));
        let b = s.node_identity("node-b", &dir.path().join("node-b"));
        (s, a, b)
    });
    let a = client(&node_a).await;
    let services: Api<Service> = Api::namespaced(a.clone(), "shop");
    let patch = |v: serde_json::Value| {
        let services = services.clone();
        async move {
            let r = services
                .patch("web", &PatchParams::default(), &Patch::Merge(&v))
                .await;
            code(&r)
        }
    };

    // What the agent does: its annotations, set and cleared.
    assert_eq!(
        patch(json!({"metadata": {"annotations": {"hostlb.io/announcing-IPv4": "node-a,eth0"}}}))
            .await,
        200
    );
    assert_eq!(
        patch(json!({"metadata": {"annotations": {"hostlb.io/announcing-IPv4": null}}})).await,
        200
    );
    // A value as long as the longest node name and interface name make
    // is taken; a longer one, which names no node, is not (every watch of
    // Services carries it, to every agent and client).
    use hostlb_api::annotations::{ANNOUNCING_MAX, ANNOUNCING_VIRTUAL_MAX};
    for (key, max) in [
        ("hostlb.io/announcing-IPv6", ANNOUNCING_MAX),
        ("hostlb.io/announcing-virtual-IPv4", ANNOUNCING_VIRTUAL_MAX),
    ] {
        let value = |n: usize| "n".repeat(n);
        assert_eq!(
            patch(json!({"metadata": {"annotations": {key: value(max)}}})).await,
            200,
            "{key} of {max} characters"
        );
        assert_eq!(
            patch(json!({"metadata": {"annotations": {key: value(max + 1)}}})).await,
            422,
            "{key} of {} characters",
            max + 1
        );
        assert_eq!(
            patch(json!({"metadata": {"annotations": {key: null}}})).await,
            200
        );
    }
    // The CVE-2020-8554 pattern and its neighbours: refused by the policy
    // (422), whatever the patch touches besides.
    for (what, v) in [
        ("selector", json!({"spec": {"selector": {"app": "evil"}}})),
        (
            "externalIPs",
            json!({"spec": {"externalIPs": ["10.0.0.9"]}}),
        ),
        (
            "ports",
            json!({"spec": {"ports": [{"port": 22, "targetPort": 22}]}}),
        ),
        ("labels", json!({"metadata": {"labels": {"app": "evil"}}})),
        (
            "owners (the garbage collector would delete it)",
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                "name": "gone", "uid": "00000000-0000-0000-0000-000000000001"}]}}),
        ),
        (
            "finalizers",
            json!({"metadata": {"finalizers": ["example.com/never"]}}),
        ),
        (
            "another annotation",
            json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        (
            "an annotation riding along",
            json!({"metadata": {"annotations": {"hostlb.io/announcing-IPv4": "node-a,eth0", "x": "y"}}}),
        ),
    ] {
        assert_eq!(patch(v).await, 422, "a change of the Service's {what}");
    }
    let svc = tokio::task::block_in_place(|| {
        server.kubectl(&["-n", "shop", "get", "service", "web", "-o", "json"])
    });
    let svc: serde_json::Value = serde_json::from_str(&svc).unwrap();
    assert_eq!(svc["spec"]["selector"], json!({"app": "web"}), "{svc}");
    assert!(svc["spec"]["externalIPs"].is_null(), "{svc}");
    // Nor can it make or delete Services.
    let new: Service = serde_json::from_value(json!({
        "metadata": {"name": "evil"},
        "spec": {"ports": [{"port": 80}]}
    }))
    .unwrap();
    assert_eq!(
        code(&services.create(&PostParams::default(), &new).await),
        403
    );
    assert_eq!(
        code(&services.delete("web", &Default::default()).await),
        403
    );

    // Its own record, and no other node's, and no new ones.
    let records: Api<hostlb_api::NodeAgent> = Api::all(a.clone());
    let status = |node: &str| {
        json!({
            "apiVersion": "hostlb.io/v1", "kind": "NodeAgent",
            "metadata": {"name": node},
            "status": {"state": "Ready", "macs": ["02:00:00:00:00:0a"]},
        })
    };
    let ssa = PatchParams::apply("hostlb-lbnodeagent").force();
    let own = records
        .patch_status("node-a", &ssa, &Patch::Apply(status("node-a")))
        .await;
    assert_eq!(code(&own), 200);
    let other = records
        .patch_status("node-b", &ssa, &Patch::Apply(status("node-b")))
        .await;
    assert_eq!(code(&other), 403, "node-a wrote node-b's record");
    let other_main = records
        .patch(
            "node-b",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await;
    assert_eq!(code(&other_main), 403);
    let forged = records
        .patch_status("node-z", &ssa, &Patch::Apply(status("node-z")))
        .await;
    assert_eq!(code(&forged), 403, "node-a made a record for node-z");
    // A host may drain itself (`lbnodeagent drain`), and no other host.
    let drain = json!({"spec": {"drain": true}});
    let own_drain = records
        .patch("node-a", &PatchParams::default(), &Patch::Merge(&drain))
        .await;
    assert_eq!(code(&own_drain), 200);
    let other_drain = records
        .patch("node-b", &PatchParams::default(), &Patch::Merge(&drain))
        .await;
    assert_eq!(code(&other_drain), 403, "node-a drained node-b");
    // Every record stays readable: the MACs are what agents read.
    assert_eq!(
        records.list(&Default::default()).await.unwrap().items.len(),
        2
    );

    // A record write that lands late, after a newer one was made (TCP
    // retransmitting what a timed-out write had sent), is refused rather
    // than putting back what was true before; the agent's writer names the
    // version its last write made.
    use lbnodeagent::agent::record::write_status;
    let reading = |reason: &str| hostlb_api::NodeAgentStatus {
        state: "Ready".into(),
        reason: Some(reason.into()),
        ..Default::default()
    };
    let first = write_status(&records, "node-a", reading("before"), None)
        .await
        .unwrap();
    let second = write_status(&records, "node-a", reading("after"), Some(&first))
        .await
        .unwrap();
    assert_ne!(first, second);
    let late = write_status(&records, "node-a", reading("before"), Some(&first)).await;
    assert_eq!(
        code(&late),
        409,
        "a write over a version that is gone landed"
    );
    let now = records.get_status("node-a").await.unwrap();
    assert_eq!(
        now.status.and_then(|s| s.reason).as_deref(),
        Some("after"),
        "the late write put back what was true before"
    );

    // node-b revoked (its ServiceAccount deleted): node-b is refused, and
    // node-a goes on as before.
    tokio::task::block_in_place(|| {
        server.kubectl(&["-n", "hostlb-agents", "delete", "serviceaccount", "node-b"])
    });
    let b: Api<hostlb_api::NodeAgent> = Api::all(client(&node_b).await);
    let mut refused = false;
    for _ in 0..50 {
        if code(&b.list(&Default::default()).await) == 401 {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(refused, "a revoked node's token still works");
    assert_eq!(
        code(
            &records
                .patch_status("node-a", &ssa, &Patch::Apply(status("node-a")))
                .await
        ),
        200
    );
}
