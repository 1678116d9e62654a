//! Field ownership for server-side apply, enough to give the real server's
//! `409 Conflict` when an apply without `force` would change a field that
//! another manager set. Leader election clients rely on exactly that.
//!
//! Ownership is kept per leaf field (maps are walked, lists are atomic):
//! a write owns the leaves it adds or changes; an apply also owns every leaf
//! it names, sharing it with other managers that set the same value. Fields
//! an apply stops naming are not removed (a difference from the real
//! server, which drops fields no manager owns any more).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// Field path → the managers that own it.
pub type Owners = BTreeMap<String, BTreeSet<String>>;

const SYSTEM: &[&str] = &[
    ".apiVersion",
    ".kind",
    ".metadata.name",
    ".metadata.namespace",
    ".metadata.uid",
    ".metadata.resourceVersion",
    ".metadata.generation",
    ".metadata.creationTimestamp",
    ".metadata.deletionTimestamp",
    ".metadata.managedFields",
];

/// Every leaf of `v` with its path, system fields left out.
pub fn leaves(v: &Value) -> BTreeMap<String, Value> {
    fn walk(v: &Value, path: String, out: &mut BTreeMap<String, Value>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, x) in m {
                    walk(x, format!("{path}.{k}"), out);
                }
            }
            _ => {
                if !SYSTEM.contains(&path.as_str()) && !path.is_empty() {
                    out.insert(path, v.clone());
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(v, String::new(), &mut out);
    out
}

/// Record a non-apply write by `manager` from `old` to `new`.
pub fn record_write(owners: &mut Owners, old: Option<&Value>, new: &Value, manager: &str) {
    let before = old.map(leaves).unwrap_or_default();
    let after = leaves(new);
    owners.retain(|path, _| after.contains_key(path));
    for (path, value) in &after {
        if before.get(path) != Some(value) {
            owners.insert(path.clone(), BTreeSet::from([manager.to_string()]));
        }
    }
}

/// The fields an apply by `manager` would take from other managers:
/// `(path, other manager)` for each field another manager owns whose live
/// value differs from the applied one.
pub fn conflicts(
    owners: &Owners,
    live: &Value,
    applied: &Value,
    manager: &str,
) -> Vec<(String, String)> {
    let live = leaves(live);
    let mut out = Vec::new();
    for (path, value) in leaves(applied) {
        if live.get(&path) == Some(&value) {
            continue;
        }
        for other in owners.get(&path).into_iter().flatten() {
            if other != manager {
                out.push((path.clone(), other.clone()));
            }
        }
    }
    out
}

/// After an apply: `manager` owns every leaf it named; with `force` it
/// owns them alone.
pub fn record_apply(owners: &mut Owners, applied: &Value, manager: &str, force: bool) {
    for path in leaves(applied).into_keys() {
        let set = owners.entry(path).or_default();
        if force {
            set.clear();
        }
        set.insert(manager.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn apply_conflicts_with_another_managers_different_value() {
        let mut owners = Owners::new();
        let live = json!({"spec": {"holderIdentity": "a", "renewTime": "t1"}});
        record_write(&mut owners, None, &live, "unknown");
        record_apply(
            &mut owners,
            &json!({"spec": {"holderIdentity": "a"}}),
            "lease-a",
            false,
        );
        let mine = json!({"spec": {"holderIdentity": "b"}});
        // Both the creator and the first applier set that value.
        assert_eq!(
            conflicts(&owners, &live, &mine, "lease-b"),
            vec![
                (".spec.holderIdentity".to_string(), "lease-a".to_string()),
                (".spec.holderIdentity".to_string(), "unknown".to_string())
            ]
        );
        // The same value is shared, not a conflict.
        assert!(
            conflicts(
                &owners,
                &live,
                &json!({"spec": {"holderIdentity": "a"}}),
                "lease-b"
            )
            .is_empty()
        );
        // Force takes the field.
        record_apply(&mut owners, &mine, "lease-b", true);
        assert_eq!(
            owners[".spec.holderIdentity"],
            BTreeSet::from(["lease-b".to_string()])
        );
        // A field set to null by a patch is no longer owned.
        let cleared = json!({"spec": {"renewTime": "t1"}});
        record_write(&mut owners, Some(&live), &cleared, "lease-b");
        assert!(!owners.contains_key(".spec.holderIdentity"));
        assert!(
            conflicts(
                &owners,
                &cleared,
                &json!({"spec": {"holderIdentity": "c"}}),
                "lease-c"
            )
            .is_empty()
        );
    }
}
