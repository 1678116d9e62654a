//! The shipped alert rules and dashboard (`deploy/monitoring/`) name only
//! metrics the allocator exports. (The agent's are checked in its tests.)

use std::collections::BTreeSet;

use hostlb_allocator::controller::telemetry::Telemetry;
use hostlb_allocator::engine::{PoolReport, PoolState};

fn names_used(prefix: &str) -> BTreeSet<String> {
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
fn the_rules_and_dashboard_name_only_metrics_the_allocator_exports() {
    let t = Telemetry::new();
    // Families appear once a label set has a value.
    t.set_pools(&[PoolReport {
        name: "p".into(),
        state: PoolState::Ready,
        assigned: [1, 0],
        available: [9, 0],
    }]);
    let exported = t.render();
    let used = names_used("hostlb_allocator_");
    assert!(used.len() >= 4, "{used:?}");
    for name in &used {
        assert!(
            exported.contains(&format!("# TYPE {name} ")),
            "{name} is used in deploy/monitoring but the allocator does not export it:\n{exported}"
        );
    }
}
