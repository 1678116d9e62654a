//! `kubectl hostlb check` on the real kube-apiserver (v1.28.0, RBAC,
//! ValidatingAdmissionPolicy on): it tells a cluster where the Service
//! policy confines the agents from one where it does not, by trying a
//! dry-run patch as an agent would. Needs kubectl, curl, etcd-server and
//! the real server (`../shared/kube-apiserver`); without it the test says
//! it did not run, and under `CI=true` that is a failure.

use std::process::Command;

use hostlb_tests::realserver::RealServer;

/// `port` for the API server; etcd takes `port + 10_000` and the next one.
const PORT: u16 = 16593;

fn check(server: &RealServer) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-hostlb"))
        .arg("--kubeconfig")
        .arg(server.admin_kubeconfig())
        .arg("check")
        .output()
        .expect("run kubectl-hostlb");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn check_fails_where_the_service_policy_is_not_in_force() {
    if let Err(why) = RealServer::available() {
        eprintln!("NOT RUN: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = RealServer::start_local(PORT, PORT + 10_000, &dir.path().join("k8s"));
    s.install_hostlb("agent/rbac.yaml");
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
    // RBAC's grant to the agents, in force: what the probe relies on.
    s.wait_granted(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/agent/rbac.yaml"
        ))
        .unwrap(),
    );

    let (code, out) = check(&s);
    eprintln!("{out}");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("ValidatingAdmissionPolicy/hostlb-agent-services")
            && out.contains("not in force"),
        "{out}"
    );

    let policy = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/agent/policy-v1beta1.yaml"
    );
    s.kubectl(&["apply", "-f", policy]);
    s.wait_agent_policy("shop", "web");
    let (_, out) = check(&s);
    eprintln!("{out}");
    assert!(!out.contains("hostlb-agent-services"), "{out}");
    let labels = s.kubectl(&[
        "-n",
        "shop",
        "get",
        "service",
        "web",
        "-o",
        "jsonpath={.metadata.labels}",
    ]);
    assert!(
        !labels.contains("policy-probe"),
        "a dry run writes nothing: {labels}"
    );
}
