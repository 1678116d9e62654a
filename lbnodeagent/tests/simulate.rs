//! `lbnodeagent simulate` on the worked examples of the preferred-node design,
//! run as the real binary. Each case checks what the design says the answer
//! is, and compares the whole output with the snapshot under
//! `tests/simulate/expected/` (`UPDATE_SNAPSHOTS=1` rewrites them).

use std::path::{Path, PathBuf};
use std::process::Command;

use lbnodeagent::election::rank_key;
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/simulate")
}

fn simulate(args: &[&str]) -> (String, String, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_lbnodeagent"))
        .arg("simulate")
        .args(args)
        .current_dir(dir())
        .output()
        .expect("run lbnodeagent");
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
        out.status.success(),
    )
}

/// Run one case in both output forms, compare with the snapshots and return
/// the parsed JSON.
fn case(name: &str, file: &str, extra: &[&str]) -> Value {
    let mut args = vec!["-f", file];
    args.extend_from_slice(extra);
    let mut json_args = args.clone();
    json_args.extend(["-o", "json"]);
    let (json, err, ok) = simulate(&json_args);
    assert!(ok, "{name}: {err}");
    let (table, err, ok) = simulate(&args);
    assert!(ok, "{name}: {err}");
    for (ext, text) in [("json", &json), ("txt", &table)] {
        let path = dir().join("expected").join(format!("{name}.{ext}"));
        if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
        } else {
            let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!("{}: {e} (UPDATE_SNAPSHOTS=1 creates it)", path.display())
            });
            pretty_assertions::assert_eq!(&want, text, "{name}.{ext} differs from its snapshot");
        }
    }
    serde_json::from_str(&json).unwrap()
}

fn vip<'a>(v: &'a Value, ip: &str) -> &'a Value {
    v["vips"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["ip"] == ip)
        .unwrap_or_else(|| panic!("no vip {ip}"))
}

fn order(v: &Value) -> Vec<(String, u64)> {
    v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["node"].as_str().unwrap().to_string(),
                c["score"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn owned(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    pairs.iter().map(|(n, s)| (n.to_string(), *s)).collect()
}

fn by_hash(nodes: &[&str], ip: &str, score: u64) -> Vec<(String, u64)> {
    let mut v: Vec<&str> = nodes.to_vec();
    v.sort_by_key(|n| rank_key(n, ip));
    v.into_iter().map(|n| (n.to_string(), score)).collect()
}

#[test]
fn ad_scoped_three_ads() {
    let v = case("ad-scoped", "ad-scoped.yaml", &[]);
    let x = vip(&v, "192.168.10.1");
    let mut want = owned(&[("e", 100)]);
    want.extend(by_hash(&["a", "b", "c", "d"], "192.168.10.1", 0));
    assert_eq!(order(x), want, "c matches zone=primary but scores 0");
    assert_eq!(x["winner"], "e");
    assert_eq!(
        x["excluded"],
        serde_json::json!([{"node": "f", "reason": "not-eligible"}])
    );
}

#[test]
fn seventy_plus_thirty() {
    let v = case("seventy-plus-thirty", "seventy-plus-thirty.yaml", &[]);
    assert_eq!(
        order(vip(&v, "192.168.10.1")),
        owned(&[("node-x", 100), ("node-y", 70), ("node-z", 0)])
    );
}

#[test]
fn cumulative_110_beats_100() {
    let v = case("cumulative", "cumulative.yaml", &[]);
    assert_eq!(
        order(vip(&v, "192.168.10.1")),
        owned(&[
            ("both", 110),
            ("gold", 100),
            ("primary", 60),
            ("gpu", 50),
            ("plain", 0)
        ])
    );
}

#[test]
fn tiered_zones_and_failover() {
    for (name, down, tiers) in [
        (
            "tiered-zones",
            vec![],
            vec![
                (vec!["p1", "p2"], 100),
                (vec!["s1", "s2"], 50),
                (vec!["o1", "o2"], 0),
            ],
        ),
        (
            "tiered-zones-primary-down",
            vec!["--down", "p1", "--down", "p2"],
            vec![(vec!["s1", "s2"], 50), (vec!["o1", "o2"], 0)],
        ),
        (
            "tiered-zones-one-left",
            vec![
                "--down", "p1", "--down", "p2", "--down", "s1", "--down", "s2", "--down", "o1",
            ],
            vec![(vec!["o2"], 0)],
        ),
    ] {
        let v = case(name, "tiered-zones.yaml", &down);
        for ip in ["192.168.10.1", "192.168.10.2"] {
            let want: Vec<(String, u64)> =
                tiers.iter().flat_map(|(n, s)| by_hash(n, ip, *s)).collect();
            assert_eq!(order(vip(&v, ip)), want, "{name} {ip}");
        }
    }
}

#[test]
fn edge_nodes_with_failover() {
    let v = case("edge-failover", "edge-failover.yaml", &[]);
    for ip in ["192.168.10.1", "192.168.10.2", "192.168.10.3"] {
        let w = vip(&v, ip)["winner"].as_str().unwrap().to_string();
        assert!(w.starts_with("edge-"), "{ip} won by {w}");
    }
    // Both edge nodes down: the hash picks the best worker.
    let v = case(
        "edge-failover-edge-down",
        "edge-failover.yaml",
        &["--down", "edge-a", "--down", "edge-b"],
    );
    for ip in ["192.168.10.1", "192.168.10.2", "192.168.10.3"] {
        assert_eq!(
            order(vip(&v, ip)),
            by_hash(&["worker-1", "worker-2", "worker-3"], ip, 0)
        );
        let excluded: Vec<&str> = vip(&v, ip)["excluded"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["reason"].as_str().unwrap())
            .collect();
        assert_eq!(excluded, vec!["not-live", "not-live"]);
    }
}

#[test]
fn empty_preference_selectors() {
    let v = case("empty-preference", "empty-preference.yaml", &[]);
    assert_eq!(
        order(vip(&v, "192.168.10.1")),
        by_hash(&["n1", "n2", "n3", "n4"], "192.168.10.1", 40)
    );
    let v = case(
        "empty-preference-node-selectors",
        "empty-preference-node-selectors.yaml",
        &[],
    );
    let mut want = by_hash(&["lb1", "lb2"], "192.168.10.1", 10);
    want.extend(by_hash(&["w1", "w2", "w3"], "192.168.10.1", 0));
    assert_eq!(order(vip(&v, "192.168.10.1")), want);
}

#[test]
fn service_selectors_scope_preferences() {
    let v = case("service-selectors", "service-selectors.yaml", &[]);
    let all = ["primary", "n2", "n3", "n4"];
    assert_eq!(vip(&v, "10.0.0.1")["winner"], "primary");
    // The backend address is one whose hash order does not start with `primary`.
    assert_ne!(by_hash(&all, "10.0.0.3", 0)[0].0, "primary");
    assert_eq!(order(vip(&v, "10.0.0.3")), by_hash(&all, "10.0.0.3", 0));
}

#[test]
fn invalid_selector_is_listed_and_left_out() {
    let v = case("invalid-selector", "invalid-selector.yaml", &[]);
    assert_eq!(
        v["errors"],
        serde_json::json!([{
            "object": "L2Advertisement/hostlb-system/ad1",
            "message": "spec.nodeSelectors[0]: \"Near\" is not a valid label selector operator"
        }])
    );
    assert_eq!(
        order(vip(&v, "10.0.0.1")),
        by_hash(&["a", "b"], "10.0.0.1", 0)
    );
    assert_eq!(
        vip(&v, "10.0.0.1")["excluded"],
        serde_json::json!([{"node": "c", "reason": "not-eligible"}])
    );
}

#[test]
fn on_link_and_virtual_mode() {
    let v = case(
        "edge-failover-on-link",
        "edge-failover.yaml",
        &[
            "--on-link",
            "edge-a=192.168.10.0/24",
            "--on-link",
            "edge-b=192.168.20.0/24",
            "--on-link",
            "worker-1=192.168.10.0/24",
            "--on-link",
            "worker-2=none",
        ],
    );
    let x = vip(&v, "192.168.10.1");
    assert_eq!(x["winner"], "edge-a");
    assert_eq!(x["virtual"], serde_json::json!(["edge-b", "worker-2"]));
    // worker-3 was given no --on-link: on-link for everything.
    assert!(order(x).iter().any(|(n, _)| n == "worker-3"));
}

/// Without `--on-link` all nodes share one segment, also through the
/// interfaces advertisements name: both nodes are candidates, and exactly
/// one announces, on its own advertisement's interface.
#[test]
fn one_segment_includes_the_interfaces_advertisements_name() {
    let v = case("per-node-interfaces", "per-node-interfaces.yaml", &[]);
    let x = vip(&v, "192.168.10.1");
    assert_eq!(
        order(x),
        by_hash(&["node-a", "node-b"], "192.168.10.1", 0),
        "{x}"
    );
    assert_eq!(x["virtual"], serde_json::json!([]));
    let (table, _, ok) = simulate(&["-f", "per-node-interfaces.yaml"]);
    assert!(ok);
    let winner = x["winner"].as_str().unwrap();
    let iface = if winner == "node-a" { "eth0" } else { "eth1" };
    assert!(
        table.contains(&format!("winner: {winner} on {iface}\n")),
        "{table}"
    );
}

#[test]
fn the_json_has_exactly_the_documented_shape() {
    let v = case("seventy-plus-thirty", "seventy-plus-thirty.yaml", &[]);
    let keys = |o: &Value| -> Vec<String> { o.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&v), vec!["errors", "vips"]);
    let x = &v["vips"][0];
    let mut want = vec![
        "candidates",
        "excluded",
        "ip",
        "services",
        "virtual",
        "winner",
    ];
    want.sort();
    assert_eq!(keys(x), want);
    assert_eq!(keys(&x["candidates"][0]), vec!["node", "score"]);
    // Field order as documented.
    let (json, _, _) = simulate(&["-f", "seventy-plus-thirty.yaml", "-o", "json"]);
    assert!(json.starts_with(r#"{"vips":[{"ip":"192.168.10.1","services":["default/web"],"winner":"node-x","candidates":[{"node":"node-x","score":100}"#), "{json}");
}

#[test]
fn bad_arguments_fail_with_a_clear_message() {
    for (args, msg) in [
        (
            vec!["-f", "cumulative.yaml", "--down", "nobody"],
            "--down nobody: no Node of that name in the input",
        ),
        (
            vec!["-f", "cumulative.yaml", "--on-link", "gold"],
            "--on-link gold: expected NODE=CIDR",
        ),
        (
            vec!["-f", "cumulative.yaml", "--on-link", "gold=10.0.0.0/33"],
            "prefix length 33 is out of range",
        ),
        (vec!["-f", "missing.yaml"], "reading missing.yaml"),
    ] {
        let (_, err, ok) = simulate(&args);
        assert!(!ok, "{args:?} should fail");
        assert!(err.contains(msg), "{args:?}: {err}");
    }
}

/// A host's default-route interface named with `@eth0` is what an
/// advertisement without `interfaces` means, as when it is left out:
/// both nodes stand for the base pool on eth0 and for the VLAN pool on
/// eth0.100. With the VLAN's prefix given first, `--default-interface`
/// says which is the default one.
#[test]
fn a_named_default_route_interface_serves_advertisements_without_interfaces() {
    let on_link = |first: &str, second: &str| -> Vec<String> {
        ["h1", "h2"]
            .iter()
            .flat_map(|n| {
                [
                    "--on-link".to_string(),
                    format!("{n}={first}"),
                    "--on-link".to_string(),
                    format!("{n}={second}"),
                ]
            })
            .collect()
    };
    let check = |v: &Value| {
        for ip in ["10.81.10.1", "10.82.10.1"] {
            let x = vip(v, ip);
            assert_eq!(
                order(x),
                by_hash(&["h1", "h2"], ip, 0),
                "{ip}: both nodes stand: {x}"
            );
            assert_eq!(x["excluded"], serde_json::json!([]), "{x}");
        }
    };
    let args = on_link("10.81.0.0/16@eth0", "10.82.0.0/16@eth0.100");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = case("two-networks", "two-networks.yaml", &args);
    check(&v);
    let (table, err, ok) = simulate(&[&["-f", "two-networks.yaml"], &args[..]].concat());
    assert!(ok, "{err}");
    assert!(
        table.contains(" on eth0\n") && table.contains(" on eth0.100\n"),
        "{table}"
    );

    let args = on_link("10.82.0.0/16@eth0.100", "10.81.0.0/16@eth0");
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.extend(["--default-interface", "eth0"]);
    let (json, err, ok) =
        simulate(&[&["-f", "two-networks.yaml", "-o", "json"], &args[..]].concat());
    assert!(ok, "{err}");
    check(&serde_json::from_str(&json).unwrap());
    let (_, err, ok) = simulate(&["-f", "two-networks.yaml", "--default-interface", "h9=eth0"]);
    assert!(!ok && err.contains("no Node named \"h9\""), "{err}");
}
