//! Field ownership for server-side apply, enough to give the real server's
//! `409 Conflict` when an apply without `force` would change a field that
//! another manager set. Leader election clients rely on exactly that.
//!
//! Ownership is kept per leaf field (maps are walked, lists are atomic):
//! a write owns the leaves it adds or changes; an apply also owns every leaf
//! it names, sharing it with other managers that set the same value. As on
//! the real server, a leaf an apply stops naming is given up: removed from
//! the object when no other manager owns it. Clients rely on that to clear
//! a field by leaving it out, e.g. a status that omits a `false` flag.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// Who owns what in one object.
#[derive(Clone, Debug, Default)]
pub struct Owners {
    /// Field path → the managers that own it, by write or by apply.
    by_path: BTreeMap<String, BTreeSet<String>>,
    /// (manager, status subresource) → the leaves its last apply there
    /// named: what its next apply gives up if it leaves them out. Kept per
    /// subresource, as the real server's managed fields are: an apply to
    /// the status never gives up the spec's fields, nor the reverse.
    applied: BTreeMap<(String, bool), BTreeSet<String>>,
}

impl Owners {
    /// The managers that own the leaf at `path`.
    pub fn of(&self, path: &str) -> Option<&BTreeSet<String>> {
        self.by_path.get(path)
    }
}

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
    owners.by_path.retain(|path, _| after.contains_key(path));
    for (path, value) in &after {
        if before.get(path) != Some(value) {
            owners
                .by_path
                .insert(path.clone(), BTreeSet::from([manager.to_string()]));
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
        for other in owners.of(&path).into_iter().flatten() {
            if other != manager {
                out.push((path.clone(), other.clone()));
            }
        }
    }
    out
}

/// The leaves an apply by `manager` to the object (`status`: to its status
/// subresource) gives up, named by its last apply there and not by
/// `applied`, with whether it owned each alone (then the apply removes it).
pub fn given_up(
    owners: &Owners,
    applied: &Value,
    manager: &str,
    status: bool,
) -> Vec<(String, bool)> {
    let Some(before) = owners.applied.get(&(manager.to_string(), status)) else {
        return Vec::new();
    };
    let now = leaves(applied);
    before
        .iter()
        .filter(|path| !now.contains_key(*path))
        .map(|path| {
            let alone = owners
                .of(path)
                .is_none_or(|set| set.iter().all(|m| m == manager));
            (path.clone(), alone)
        })
        .collect()
}

/// Remove the leaves at `paths` from `v`, and the maps their removal
/// emptied (a map that was empty before stays: it is a leaf of its own).
pub fn remove_leaves(v: &mut Value, paths: &BTreeSet<String>) {
    fn walk(v: &mut Value, path: &str, paths: &BTreeSet<String>) {
        let Value::Object(m) = v else { return };
        m.retain(|k, x| {
            let child = format!("{path}.{k}");
            match x {
                Value::Object(inner) if !inner.is_empty() => {
                    walk(x, &child, paths);
                    x.as_object().is_some_and(|inner| !inner.is_empty())
                }
                _ => !paths.contains(&child),
            }
        });
    }
    if !paths.is_empty() {
        walk(v, "", paths);
    }
}

/// After an apply: `manager` owns every leaf it named (with `force`, alone)
/// and no longer the leaves it gave up; what it named is remembered for its
/// next apply to the same subresource.
pub fn record_apply(
    owners: &mut Owners,
    applied: &Value,
    manager: &str,
    status: bool,
    force: bool,
) {
    for (path, _) in given_up(owners, applied, manager, status) {
        if let Some(set) = owners.by_path.get_mut(&path) {
            set.remove(manager);
            if set.is_empty() {
                owners.by_path.remove(&path);
            }
        }
    }
    let named: BTreeSet<String> = leaves(applied).into_keys().collect();
    for path in &named {
        let set = owners.by_path.entry(path.clone()).or_default();
        if force {
            set.clear();
        }
        set.insert(manager.to_string());
    }
    owners.applied.insert((manager.to_string(), status), named);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn apply_conflicts_with_another_managers_different_value() {
        let mut owners = Owners::default();
        let live = json!({"spec": {"holderIdentity": "a", "renewTime": "t1"}});
        record_write(&mut owners, None, &live, "unknown");
        record_apply(
            &mut owners,
            &json!({"spec": {"holderIdentity": "a"}}),
            "lease-a",
            false,
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
        record_apply(&mut owners, &mine, "lease-b", false, true);
        assert_eq!(
            owners.of(".spec.holderIdentity").unwrap(),
            &BTreeSet::from(["lease-b".to_string()])
        );
        // A field set to null by a patch is no longer owned.
        let cleared = json!({"spec": {"renewTime": "t1"}});
        record_write(&mut owners, Some(&live), &cleared, "lease-b");
        assert!(owners.of(".spec.holderIdentity").is_none());
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

    #[test]
    fn an_apply_gives_up_what_it_stops_naming_per_subresource() {
        let mut owners = Owners::default();
        let first = json!({"status": {"drained": true, "ready": true}});
        record_apply(&mut owners, &first, "agent", true, false);
        let spec = json!({"metadata": {"labels": {"a.b/c": "x"}}});
        record_apply(&mut owners, &spec, "agent", false, false);
        // Another manager set the same `ready`: it shares it.
        record_apply(
            &mut owners,
            &json!({"status": {"ready": true}}),
            "other",
            true,
            false,
        );
        let next = json!({"status": {"note": "n"}});
        let mut up = given_up(&owners, &next, "agent", true);
        up.sort();
        assert_eq!(
            up,
            vec![
                (".status.drained".to_string(), true),
                (".status.ready".to_string(), false)
            ]
        );
        // The spec's apply is not touched by the status's.
        assert!(
            given_up(&owners, &json!({}), "agent", false)
                .iter()
                .any(|(p, alone)| p == ".metadata.labels.a.b/c" && *alone)
        );
        record_apply(&mut owners, &next, "agent", true, false);
        assert!(owners.of(".status.drained").is_none());
        assert_eq!(
            owners.of(".status.ready").unwrap(),
            &BTreeSet::from(["other".to_string()])
        );

        let mut obj =
            json!({"status": {"drained": true, "ready": true, "deep": {"x": 1}, "empty": {}}});
        remove_leaves(
            &mut obj,
            &BTreeSet::from([".status.drained".to_string(), ".status.deep.x".to_string()]),
        );
        assert_eq!(obj, json!({"status": {"ready": true, "empty": {}}}));
    }
}
