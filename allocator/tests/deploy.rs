//! The manifests in `deploy/`: they parse as the Kubernetes types they
//! claim to be (no misspelled field is silently dropped), the Deployment
//! matches the binary, and the RBAC grants every request a real allocator
//! session makes, and nothing is granted that no request needs.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use hostlb_allocator::controller::{self, Config, telemetry::Telemetry};
use hostlb_api::IPAddressPool;
use hostlb_tests::apiserver::TestServer;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn docs(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(deploy().join(file)).unwrap();
    serde_saphyr::from_multiple(&text).unwrap()
}

/// Every path of `a` exists in `b` with the same scalar: what a typed
/// round trip keeps.
fn missing_paths(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    Some(w) => missing_paths(v, w, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, v) in x.iter().enumerate() {
                match y.get(i) {
                    Some(w) => missing_paths(v, w, &format!("{path}[{i}]"), out),
                    None => out.push(format!("{path}[{i}]")),
                }
            }
        }
        (x, y) if x != y && !(x.is_number() && y.is_string()) => {
            out.push(format!("{path} ({x} != {y})"))
        }
        _ => {}
    }
}

fn roundtrip<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value) -> Vec<String> {
    let typed: T = serde_json::from_value(doc.clone()).unwrap();
    let back = serde_json::to_value(&typed).unwrap();
    let mut out = Vec::new();
    missing_paths(doc, &back, "", &mut out);
    out
}

#[test]
fn manifests_are_what_they_claim() {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
    for file in [
        "namespace.yaml",
        "allocator/rbac.yaml",
        "allocator/deployment.yaml",
        "agent/rbac.yaml",
    ] {
        for d in docs(file) {
            let kind = d["kind"].as_str().unwrap().to_string();
            let lost = match kind.as_str() {
                "Namespace" => roundtrip::<Namespace>(&d),
                "ServiceAccount" => roundtrip::<ServiceAccount>(&d),
                "ClusterRole" => roundtrip::<ClusterRole>(&d),
                "ClusterRoleBinding" => roundtrip::<ClusterRoleBinding>(&d),
                "Role" => roundtrip::<Role>(&d),
                "RoleBinding" => roundtrip::<RoleBinding>(&d),
                "Deployment" => roundtrip::<Deployment>(&d),
                "PodDisruptionBudget" => roundtrip::<PodDisruptionBudget>(&d),
                other => panic!("{file}: unexpected kind {other}"),
            };
            assert!(
                lost.is_empty(),
                "{file} {kind}: fields the type does not have: {lost:?}"
            );
        }
    }
    // The agents' Service policy: v1 for 1.30 and later, the same policy
    // in v1beta1 for 1.28 and 1.29, and nothing else apart.
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let v1 = docs("agent/policy.yaml");
    for d in &v1 {
        let lost = match d["kind"].as_str().unwrap() {
            "ValidatingAdmissionPolicy" => roundtrip::<ValidatingAdmissionPolicy>(d),
            "ValidatingAdmissionPolicyBinding" => roundtrip::<ValidatingAdmissionPolicyBinding>(d),
            other => panic!("agent/policy.yaml: unexpected kind {other}"),
        };
        assert!(lost.is_empty(), "agent/policy.yaml: {lost:?}");
    }
    let mut beta = docs("agent/policy-v1beta1.yaml");
    assert_eq!(beta.len(), v1.len());
    for (b, v) in beta.iter_mut().zip(&v1) {
        assert_eq!(b["apiVersion"], "admissionregistration.k8s.io/v1beta1");
        b["apiVersion"] = v["apiVersion"].clone();
        assert_eq!(b, v, "policy-v1beta1.yaml differs from policy.yaml");
    }
    // The kustomization lists every manifest that exists.
    let k = std::fs::read_to_string(deploy().join("kustomization.yaml")).unwrap();
    for f in [
        "namespace.yaml",
        "crds/hostlb.io_ipaddresspools.yaml",
        "crds/hostlb.io_l2advertisements.yaml",
        "crds/hostlb.io_nodeagents.yaml",
        "allocator/rbac.yaml",
        "allocator/deployment.yaml",
        "agent/rbac.yaml",
    ] {
        assert!(k.contains(f) && deploy().join(f).exists(), "{f}");
    }
}

#[test]
fn deployment_matches_the_binary() {
    let d: Deployment =
        serde_json::from_value(docs("allocator/deployment.yaml").remove(0)).unwrap();
    let spec = d.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("hostlb-allocator")
    );
    let c = &pod.containers[0];
    assert_eq!(c.args.as_deref(), Some(&["run".to_string()][..]));
    assert_eq!(
        c.ports.as_ref().unwrap()[0].container_port,
        7472,
        "the default --listen port"
    );
    let probe = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .clone()
            .unwrap()
    };
    assert_eq!(probe(&c.liveness_probe), "/healthz");
    assert_eq!(probe(&c.readiness_probe), "/readyz");
    let env: BTreeSet<String> = c.env.iter().flatten().map(|e| e.name.clone()).collect();
    for needed in ["POD_NAME", "POD_NAMESPACE"] {
        assert!(env.contains(needed), "{needed}");
    }
    assert!(c.resources.as_ref().unwrap().requests.is_some());
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
}

/// `(group, resource, verb, namespace)` of one request.
fn needs(path: &str, verb: &str) -> (String, String, String, Option<String>) {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = if segs[0] == "api" {
        ("", &segs[2..])
    } else {
        (segs[1], &segs[3..])
    };
    let (ns, rest) = if rest.len() >= 3 && rest[0] == "namespaces" {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let resource = match rest {
        [r, _name, sub] => format!("{r}/{sub}"),
        [r, ..] => r.to_string(),
        [] => unreachable!(),
    };
    (group.to_string(), resource, verb.to_string(), ns)
}

fn grants(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|r| {
        r.api_groups.iter().flatten().any(|g| g == group)
            && r.resources.iter().flatten().any(|x| x == resource)
            && r.verbs.iter().any(|v| v == verb)
    })
}

#[tokio::test]
async fn rbac_grants_exactly_what_a_session_uses() {
    let rbac = docs("allocator/rbac.yaml");
    let cluster: ClusterRole = serde_json::from_value(
        rbac.iter()
            .find(|d| d["kind"] == "ClusterRole")
            .unwrap()
            .clone(),
    )
    .unwrap();
    let role: Role =
        serde_json::from_value(rbac.iter().find(|d| d["kind"] == "Role").unwrap().clone()).unwrap();
    let cluster_rules = cluster.rules.unwrap_or_default();
    let role_rules = role.rules.unwrap_or_default();
    let role_ns = role.metadata.namespace.clone().unwrap();

    // A session: CRDs and namespaces set up by an admin, then the allocator
    // allocates, fails, reports pool and advertisement status and leads.
    let server = TestServer::start().await;
    let admin = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for (_, crd) in hostlb_api::crds::all() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    for n in ["hostlb-system", "shop"] {
        ns.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": n}})).unwrap(),
        )
        .await
        .unwrap();
    }
    let pools: Api<IPAddressPool> = Api::namespaced(admin.clone(), "hostlb-system");
    pools.create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "hostlb.io/v1", "kind": "IPAddressPool", "metadata": {"name": "p"}, "spec": {"addresses": ["10.0.0.1-10.0.0.3"]}})).unwrap()).await.unwrap();
    let ads: Api<hostlb_api::L2Advertisement> = Api::namespaced(admin.clone(), "hostlb-system");
    ads.create(&PostParams::default(), &serde_json::from_value(json!({"apiVersion": "hostlb.io/v1", "kind": "L2Advertisement", "metadata": {"name": "ad"}, "spec": {}})).unwrap()).await.unwrap();
    let svcs: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(admin.clone(), "shop");
    for (n, ann) in [
        ("a", json!({})),
        ("b", json!({})),
        ("bad", json!({"hostlb.io/loadBalancerIPs": "192.0.2.1"})),
    ] {
        svcs.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": n, "annotations": ann}, "spec": {"type": "LoadBalancer"}})).unwrap()).await.unwrap();
    }
    server.clear_writes();
    let mut config = server.config();
    controller::prepare_client(&mut config, "rbac-check");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut cfg = Config::for_test("rbac-check");
    cfg.lease_duration = 2;
    let task = tokio::spawn(controller::run(
        Client::try_from(config).unwrap(),
        cfg,
        Telemetry::new(),
        stopped,
    ));
    // Until two Services are assigned, one failed, and the pool status is
    // written; then `a` moves, so its second IPAllocated is a series patch.
    let settled = |want: i64| {
        let pools = pools.clone();
        let server = &server;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
            loop {
                let p = pools.get("p").await.unwrap();
                let events = server
                    .requests()
                    .iter()
                    .filter(|r| r.path.contains("/events"))
                    .count();
                if p.status.is_some_and(|s| s.assigned_ipv4 == want) && events >= 3 {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the session did not settle"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    settled(2).await;
    svcs.patch(
        "a",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            json!({"metadata": {"annotations": {"hostlb.io/loadBalancerIPs": "10.0.0.3"}}}),
        ),
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !server
        .requests()
        .iter()
        .any(|r| r.path.contains("/events/") && r.method == "PATCH")
    {
        assert!(tokio::time::Instant::now() < deadline, "no repeated Event");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.send(true).unwrap();
    task.await.unwrap().unwrap();

    let mut used: BTreeSet<(String, String, String)> = BTreeSet::new();
    for r in server
        .requests()
        .iter()
        .filter(|r| r.user_agent.contains("rbac-check"))
    {
        let (group, resource, verb, namespace) = needs(&r.path, r.verb());
        let ok = grants(&cluster_rules, &group, &resource, &verb)
            || (namespace.as_deref() == Some(role_ns.as_str())
                && grants(&role_rules, &group, &resource, &verb));
        assert!(
            ok,
            "{} {} needs {verb} on {group}/{resource} in {namespace:?}, which the RBAC does not grant",
            r.method, r.path
        );
        used.insert((group, resource, verb));
    }
    // Least privilege: every granted verb was used in the session.
    for rule in cluster_rules.iter().chain(&role_rules) {
        for g in rule.api_groups.iter().flatten() {
            for res in rule.resources.iter().flatten() {
                for v in &rule.verbs {
                    assert!(
                        used.contains(&(g.clone(), res.clone(), v.clone())),
                        "granted but never used: {v} on {g}/{res}"
                    );
                }
            }
        }
    }
}
