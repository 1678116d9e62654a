//! `allocator plan`, `convert` and `crds` as the real binary.

use std::path::Path;
use std::process::Command;

fn allocator(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_allocator"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data"))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn plan_prints_the_assignment_in_creation_order() {
    let (ok, out, err) = allocator(&["plan", "-f", "plan.yaml", "-o", "json"]);
    assert!(ok, "{err}");
    // shop is labelled team=retail: the retail pool (priority 10) first, .0 avoided.
    // ops/held keeps its status; ops/dual takes the last IPv4 and an IPv6;
    // ops/late finds the general pool empty; the ClusterIP Service is not listed.
    assert_eq!(
        out,
        concat!(
            r#"{"services":[{"service":"shop/web","addresses":["192.168.20.1"],"pool":"retail"},"#,
            r#"{"service":"ops/held","addresses":["192.168.10.201"],"pool":"general"},"#,
            r#"{"service":"ops/dual","addresses":["192.168.10.200","fd00:10::200"],"pool":"general"},"#,
            r#"{"service":"ops/late","error":"no available addresses in pool general"}]}"#,
            "\n"
        )
    );
    let (ok, table, _) = allocator(&["plan", "-f", "plan.yaml"]);
    assert!(ok);
    assert!(
        table.contains("ops/held  192.168.10.201                general  kept"),
        "{table}"
    );
    assert!(table.contains("typo     Invalid"), "{table}");
    assert!(
        table.contains("typo: spec.addresses[1]: invalid address \"192.168.30.300\""),
        "{table}"
    );
}

#[test]
fn convert_rewrites_metallb_objects_and_names_what_it_leaves_out() {
    std::fs::write(
        std::env::temp_dir().join("hostlb-convert-in.yaml"),
        "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {name: p, namespace: metallb-system}\nspec: {addresses: [10.0.0.0/24]}\n---\napiVersion: metallb.io/v1beta2\nkind: BGPPeer\nmetadata: {name: tor, namespace: metallb-system}\nspec: {}\n",
    )
    .unwrap();
    let input = std::env::temp_dir().join("hostlb-convert-in.yaml");
    let (ok, out, err) = allocator(&["convert", "-f", input.to_str().unwrap()]);
    assert!(ok, "{err}");
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&out).unwrap();
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0]["apiVersion"], "hostlb.io/v1");
    assert_eq!(docs[0]["metadata"]["namespace"], "hostlb-system");
    assert!(
        err.contains("not carried over: BGPPeer/metallb-system/tor: hostlb has no BGP mode"),
        "{err}"
    );
}

#[test]
fn crds_command_prints_the_committed_crds() {
    let (ok, out, _) = allocator(&["crds"]);
    assert!(ok);
    for f in [
        "hostlb.io_ipaddresspools.yaml",
        "hostlb.io_l2advertisements.yaml",
        "hostlb.io_nodeagents.yaml",
    ] {
        let committed = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../deploy/crds")
                .join(f),
        )
        .unwrap();
        assert!(
            out.contains(&committed),
            "{f} differs from `allocator crds`"
        );
    }
}

#[test]
fn bad_input_fails_clearly() {
    let (ok, _, err) = allocator(&["plan", "-f", "missing.yaml"]);
    assert!(!ok && err.contains("reading missing.yaml"), "{err}");
    let (ok, _, err) = allocator(&["run", "--lease-duration", "0"]);
    assert!(!ok && err.contains("--lease-duration"), "{err}");
}

/// A Service whose request cannot be met keeps its address, and `plan`
/// says so in both outputs.
#[test]
fn plan_shows_a_request_not_applied_next_to_the_kept_address() {
    let dir = std::env::temp_dir().join(format!("hostlb-plan-pending-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cluster.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n\
         apiVersion: hostlb.io/v1\nkind: IPAddressPool\nmetadata: {name: p, namespace: hostlb-system}\nspec: {addresses: [10.0.0.0/30]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: shop\n  annotations: {hostlb.io/ip-allocated-from-pool: p, hostlb.io/address-pool: gone}\n\
         spec: {type: LoadBalancer, ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{ip: 10.0.0.2}]}}\n",
    )
    .unwrap();
    let (ok, out, err) = allocator(&["plan", "-f", file.to_str().unwrap(), "-o", "json"]);
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "{\"services\":[{\"service\":\"shop/web\",\"addresses\":[\"10.0.0.2\"],\"pool\":\"p\",\"notApplied\":\"pool gone does not exist\"}]}\n"
    );
    let (ok, table, _) = allocator(&["plan", "-f", file.to_str().unwrap()]);
    assert!(ok);
    assert!(
        table.contains("kept; not applied: pool gone does not exist"),
        "{table}"
    );
}

/// Two Services shared 10.0.0.0 under key `k`; then the older changed its
/// key, and the allocator was down, so both statuses still claim it. The
/// terms each was given the address under (the `hostlb.io/SharingGranted`
/// status condition) show which one changed: `plan`, like a restarted allocator, moves the
/// edited one, as the live allocator would have, not the younger.
#[test]
fn plan_moves_the_service_whose_sharing_terms_changed() {
    let dir = std::env::temp_dir().join(format!("hostlb-plan-terms-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cluster.yaml");
    let svc = |name: &str, created: &str, key: &str| {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: shop\n  creationTimestamp: \"{created}\"\n  annotations:\n    hostlb.io/ip-allocated-from-pool: p\n    hostlb.io/allow-shared-ip: {key}\n\
             spec: {{type: LoadBalancer, ports: [{{port: {port}}}]}}\nstatus: {{loadBalancer: {{ingress: [{{ip: 10.0.0.0}}]}}, conditions: [{{type: hostlb.io/SharingGranted, status: \"True\", reason: Granted, message: \"key=k ports=TCP/{port} traffic=Cluster\", lastTransitionTime: \"2026-01-01T00:00:00Z\"}}]}}\n",
            port = if name == "old" { 80 } else { 443 }
        )
    };
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n\
         apiVersion: hostlb.io/v1\nkind: IPAddressPool\nmetadata: {name: p, namespace: hostlb-system}\nspec: {addresses: [10.0.0.0/30]}\n"
            .to_string()
            + &svc("old", "2026-01-01T00:00:00Z", "other")
            + &svc("young", "2026-02-01T00:00:00Z", "k"),
    )
    .unwrap();
    let (ok, out, err) = allocator(&["plan", "-f", file.to_str().unwrap(), "-o", "json"]);
    assert!(ok, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    let addresses = |name: &str| {
        plan["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["service"] == format!("shop/{name}"))
            .unwrap()["addresses"]
            .clone()
    };
    assert_eq!(addresses("young"), serde_json::json!(["10.0.0.0"]), "{out}");
    assert_eq!(addresses("old"), serde_json::json!(["10.0.0.1"]), "{out}");
}

/// A dump, `plan`, the plan applied (the addresses, the pool and the
/// sharing terms it lists, written as the allocator writes them), then an
/// edit and `plan` again: the second plan refuses the edited Service the
/// shared address, as the live allocator does, because the first plan
/// listed the terms to record. Without them, the older (edited) one
/// would keep it.
#[test]
fn plan_apply_plan_follows_the_live_allocator_on_an_edited_sharing_key() {
    let dir = std::env::temp_dir().join(format!("hostlb-plan-apply-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let head = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n\
         apiVersion: hostlb.io/v1\nkind: IPAddressPool\nmetadata: {name: p, namespace: hostlb-system}\nspec: {addresses: [10.0.0.0/30]}\n";
    // `status`: YAML for the Service's status, or empty.
    let svc = |name: &str, created: &str, key: &str, port: u16, extra: &str, status: &str| {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: shop\n  creationTimestamp: \"{created}\"\n  annotations:\n    hostlb.io/allow-shared-ip: {key}\n{extra}\
             spec: {{type: LoadBalancer, ports: [{{port: {port}}}]}}\n{status}"
        )
    };
    let plan = |text: &str, n: u32| -> serde_json::Value {
        let file = dir.join(format!("cluster-{n}.yaml"));
        std::fs::write(&file, text).unwrap();
        let (ok, out, err) = allocator(&["plan", "-f", file.to_str().unwrap(), "-o", "json"]);
        assert!(ok, "{err}");
        serde_json::from_str(&out).unwrap()
    };
    let entry = |plan: &serde_json::Value, name: &str| -> serde_json::Value {
        plan["services"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["service"] == format!("shop/{name}"))
            .unwrap_or_else(|| panic!("{name} in {plan}"))
            .clone()
    };
    let services = [
        ("old", "2026-01-01T00:00:00Z", 80),
        ("young", "2026-02-01T00:00:00Z", 443),
    ];

    // Plan 1: a fresh cluster; both share one address under key k.
    let mut text = head.to_string();
    for (name, created, port) in services {
        text += &svc(name, created, "k", port, "", "");
    }
    let first = plan(&text, 1);
    let (old, young) = (entry(&first, "old"), entry(&first, "young"));
    assert_eq!(old["addresses"], young["addresses"], "{first}");
    assert_eq!(old["sharingGranted"], "key=k ports=TCP/80 traffic=Cluster");

    // Applied as the allocator writes it; then `old` edits its key.
    let mut text = head.to_string();
    for (name, created, port) in services {
        let e = entry(&first, name);
        let ip = e["addresses"][0].as_str().unwrap().to_string();
        let status = format!(
            "status: {{loadBalancer: {{ingress: [{{ip: {ip}}}]}}, conditions: [{{type: hostlb.io/SharingGranted, status: \"True\", reason: Granted, message: \"{}\", lastTransitionTime: \"2026-03-01T00:00:00Z\"}}]}}\n",
            e["sharingGranted"].as_str().unwrap()
        );
        let pool = format!(
            "    hostlb.io/ip-allocated-from-pool: {}\n",
            e["pool"].as_str().unwrap()
        );
        let key = if name == "old" { "other" } else { "k" };
        text += &svc(name, created, key, port, &pool, &status);
    }
    let second = plan(&text, 2);
    let shared = &old["addresses"];
    assert_eq!(
        entry(&second, "young")["addresses"],
        *shared,
        "the unchanged sharer keeps the address: {second}"
    );
    assert_ne!(
        entry(&second, "old")["addresses"],
        *shared,
        "the edited one is refused it, as live: {second}"
    );
}
