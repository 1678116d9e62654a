//! Reading cluster objects from YAML as `kubectl get -o yaml` prints them:
//! several documents, `kind: List` (or `NodeList`, ...) wrappers, or both.
//!
//! Used by the offline tools (`lbnodeagent simulate`, `allocator plan`) so
//! an operator can ask "what would happen" from a dump of a real cluster. An
//! object that does not deserialize is reported and skipped; the rest of the
//! file still counts. Kinds hostlb does not read are ignored.

use std::path::Path;

use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde_json::Value;

use crate::v1::{IPAddressPool, L2Advertisement};

/// An object that cannot be used, named `Kind/namespace/name` (or
/// `Kind/name` when cluster-scoped), with what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ObjectError {
    pub object: String,
    pub message: String,
}

impl ObjectError {
    pub fn new(kind: &str, meta: &ObjectMeta, message: impl Into<String>) -> Self {
        ObjectError {
            object: object_ref(kind, meta.namespace.as_deref(), meta.name.as_deref()),
            message: message.into(),
        }
    }
}

/// `Kind/namespace/name`, or `Kind/name` for cluster-scoped objects.
pub fn object_ref(kind: &str, namespace: Option<&str>, name: Option<&str>) -> String {
    let name = name.unwrap_or("<unnamed>");
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{kind}/{ns}/{name}"),
        _ => format!("{kind}/{name}"),
    }
}

/// A file that cannot be read at all.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not valid YAML: {message}")]
    Yaml { path: String, message: String },
}

/// The objects of one or more files, in the order they were read.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub nodes: Vec<Node>,
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
    pub namespaces: Vec<Namespace>,
    pub pools: Vec<IPAddressPool>,
    pub advertisements: Vec<L2Advertisement>,
    pub errors: Vec<ObjectError>,
}

impl Snapshot {
    pub fn load(path: &Path) -> Result<Snapshot, SnapshotError> {
        let mut s = Snapshot::default();
        s.add_file(path)?;
        Ok(s)
    }

    pub fn add_file(&mut self, path: &Path) -> Result<(), SnapshotError> {
        let text = std::fs::read_to_string(path).map_err(|source| SnapshotError::Read {
            path: path.display().to_string(),
            source,
        })?;
        self.add_str(&text, &path.display().to_string())
    }

    /// Add the objects of YAML `text`; `source` names it in errors.
    pub fn add_str(&mut self, text: &str, source: &str) -> Result<(), SnapshotError> {
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(text).map_err(|e| SnapshotError::Yaml {
                path: source.to_string(),
                message: e.to_string(),
            })?;
        for doc in docs {
            self.add_value(doc);
        }
        Ok(())
    }

    fn add_value(&mut self, doc: Value) {
        let kind = doc
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if kind.ends_with("List") {
            if let Some(Value::Array(items)) = doc.get("items") {
                for item in items.clone() {
                    self.add_value(item);
                }
            }
            return;
        }
        let api_version = doc
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match (api_version, kind.as_str()) {
            ("v1", "Node") => push(&mut self.nodes, &mut self.errors, &kind, doc),
            ("v1", "Service") => push(&mut self.services, &mut self.errors, &kind, doc),
            ("v1", "Namespace") => push(&mut self.namespaces, &mut self.errors, &kind, doc),
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                push(&mut self.endpoint_slices, &mut self.errors, &kind, doc)
            }
            ("hostlb.io/v1", "IPAddressPool") => {
                push(&mut self.pools, &mut self.errors, &kind, doc)
            }
            ("hostlb.io/v1", "L2Advertisement") => {
                push(&mut self.advertisements, &mut self.errors, &kind, doc)
            }
            _ => {}
        }
    }
}

fn push<T: serde::de::DeserializeOwned>(
    into: &mut Vec<T>,
    errors: &mut Vec<ObjectError>,
    kind: &str,
    doc: Value,
) {
    let meta = doc.get("metadata");
    let field = |k: &str| {
        meta.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let (namespace, name) = (field("namespace"), field("name"));
    match serde_json::from_value(doc) {
        Ok(obj) => into.push(obj),
        Err(e) => errors.push(ObjectError {
            object: object_ref(kind, namespace.as_deref(), name.as_deref()),
            message: format!("cannot be read: {e}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_lists_and_unknown_kinds() {
        let yaml = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: a, labels: {zone: x}}
- apiVersion: v1
  kind: Pod
  metadata: {name: ignored}
---
apiVersion: hostlb.io/v1
kind: IPAddressPool
metadata: {name: p1, namespace: hostlb-system}
spec:
  addresses: [10.0.0.0/24]
---
apiVersion: hostlb.io/v1
kind: L2Advertisement
metadata: {name: broken, namespace: hostlb-system}
spec:
  preferredNodeSelectors:
  - weight: "heavy"
    preference: {}
---
"#;
        let mut s = Snapshot::default();
        s.add_str(yaml, "test.yaml").unwrap();
        assert_eq!(s.nodes.len(), 1);
        assert_eq!(s.pools.len(), 1);
        assert!(s.pools[0].spec.auto_assign, "autoAssign defaults to true");
        assert!(s.advertisements.is_empty());
        assert_eq!(s.errors.len(), 1);
        assert_eq!(s.errors[0].object, "L2Advertisement/hostlb-system/broken");
        assert!(
            s.errors[0].message.starts_with("cannot be read: "),
            "{}",
            s.errors[0].message
        );
    }

    #[test]
    fn bad_yaml_names_the_file() {
        let err = Snapshot::default()
            .add_str("a: [unclosed", "bad.yaml")
            .unwrap_err();
        assert!(
            err.to_string().starts_with("bad.yaml: not valid YAML"),
            "{err}"
        );
    }
}
