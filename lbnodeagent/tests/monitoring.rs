//! The shipped alert rules and dashboard (`deploy/monitoring/`) name only
//! metrics the agent exports: a renamed metric would leave an alert that
//! never fires. (The allocator's are checked in its own tests.)

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use lbnodeagent::agent::telemetry::{CauseLabels, Telemetry};
use lbnodeagent::gossip::AuthCounters;

/// Every `PREFIX...` metric name in the monitoring files, without the
/// suffixes Prometheus adds to counters and histograms.
pub fn names_used(prefix: &str) -> BTreeSet<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring");
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let mut rest = text.as_str();
        while let Some(i) = rest.find(prefix) {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[i + name.len()..];
            let base = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name)
                .to_string();
            out.insert(base);
        }
    }
    out
}

#[test]
fn the_rules_and_dashboard_name_only_metrics_the_agent_exports() {
    let t = Telemetry::new();
    // Families appear once a label set has a value.
    t.conflict("hostlb");
    t.beat_refused("unproved");
    t.op("add", true);
    t.takeover_seconds
        .get_or_create(&CauseLabels { cause: "host-gone" })
        .observe(Duration::from_millis(150).as_secs_f64());
    t.moves
        .get_or_create(&CauseLabels { cause: "host-gone" })
        .inc();
    t.set_gossip_counters(Arc::new(AuthCounters::default()));
    let exported = t.render();
    let used = names_used("hostlb_agent_");
    assert!(used.len() >= 8, "{used:?}");
    for name in &used {
        assert!(
            exported.contains(&format!("# TYPE {name} ")),
            "{name} is used in deploy/monitoring but the agent does not export it:\n{exported}"
        );
    }
}

/// `promtool` checks the rules, runs their unit tests, and parses every
/// dashboard query (as recording rules). Needs promtool (Debian's
/// `prometheus` package); fails saying so without it.
#[test]
fn promtool_checks_the_rules_their_tests_and_the_dashboard_queries() {
    let promtool = |args: &[&str], dir: &std::path::Path| {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("this test needs promtool: apt-get install prometheus ({e})")
            });
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring");
    promtool(&["check", "rules", "hostlb-alerts.yaml"], &dir);
    promtool(&["test", "rules", "hostlb-alerts.test.yaml"], &dir);
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("hostlb-dashboard.json")).unwrap())
            .unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().clone())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(exprs.len() >= 10);
    let rules: Vec<serde_json::Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": e}))
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(tmp.path().join("dashboard.yaml"), file.to_string()).unwrap();
    promtool(&["check", "rules", "dashboard.yaml"], tmp.path());
}
