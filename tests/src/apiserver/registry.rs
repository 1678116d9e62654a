//! The resources the test server serves: a fixed table of built-in kinds,
//! plus one entry per served version of every CustomResourceDefinition
//! created through the API.

use serde_json::Value;

use super::error::ApiError;

/// Identifies stored objects: versions of one resource share storage.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupResource {
    pub group: String,
    pub plural: String,
}

impl std::fmt::Display for GroupResource {
    /// `services` or `leases.coordination.k8s.io`, as Kubernetes names them
    /// in messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.plural)
        } else {
            write!(f, "{}.{}", self.plural, self.group)
        }
    }
}

#[derive(Clone, Debug)]
pub struct ResourceDef {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    /// Has a `/status` subresource.
    pub status: bool,
    /// Objects keep the status they are created with (Nodes do; most kinds
    /// start with an empty status).
    pub keep_status_on_create: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// `openAPIV3Schema` for custom resources.
    pub schema: Option<Value>,
    /// `additionalPrinterColumns` for custom resources.
    pub printer_columns: Vec<Value>,
    /// The CRD that defines it, for custom resources.
    pub crd: Option<String>,
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn gr(&self) -> GroupResource {
        GroupResource {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }

    /// `IPAddressPool.hostlb.io` as used in 422 messages.
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    fn builtin(
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        namespaced: bool,
        status: bool,
        short: &[&str],
    ) -> ResourceDef {
        ResourceDef {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            status,
            keep_status_on_create: kind == "Node",
            short_names: short.iter().map(|s| s.to_string()).collect(),
            categories: Vec::new(),
            schema: None,
            printer_columns: Vec::new(),
            crd: None,
        }
    }
}

/// The built-in resources served from the start.
pub fn builtins() -> Vec<ResourceDef> {
    let b = ResourceDef::builtin;
    vec![
        b("", "v1", "namespaces", "Namespace", false, true, &["ns"]),
        b("", "v1", "nodes", "Node", false, true, &["no"]),
        b("", "v1", "services", "Service", true, true, &["svc"]),
        b("", "v1", "endpoints", "Endpoints", true, false, &["ep"]),
        b("", "v1", "events", "Event", true, false, &["ev"]),
        b("", "v1", "configmaps", "ConfigMap", true, false, &["cm"]),
        b("", "v1", "secrets", "Secret", true, false, &[]),
        b("", "v1", "pods", "Pod", true, true, &["po"]),
        b(
            "",
            "v1",
            "serviceaccounts",
            "ServiceAccount",
            true,
            false,
            &["sa"],
        ),
        // Stored only, nothing runs them: enough for `kubectl apply -k
        // deploy/` to land every object the project ships.
        b(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            true,
            true,
            &["deploy"],
        ),
        b(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
            true,
            &["pdb"],
        ),
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "ClusterRole",
            false,
            false,
            &[],
        ),
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            false,
            &[],
        ),
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "roles",
            "Role",
            true,
            false,
            &[],
        ),
        b(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
            false,
            &[],
        ),
        b(
            "events.k8s.io",
            "v1",
            "events",
            "Event",
            true,
            false,
            &["ev"],
        ),
        b(
            "discovery.k8s.io",
            "v1",
            "endpointslices",
            "EndpointSlice",
            true,
            false,
            &[],
        ),
        b(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
            false,
            &[],
        ),
        b(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            true,
            &["crd", "crds"],
        ),
    ]
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

/// The resources a CRD object defines (one per served version), checked the
/// way the real server checks the parts the client depends on.
pub fn from_crd(crd: &Value) -> Result<Vec<ResourceDef>, ApiError> {
    let name = str_at(crd, &["metadata", "name"]).unwrap_or_default();
    let spec = crd
        .get("spec")
        .ok_or_else(|| ApiError::invalid_crd(name, "spec: Required value"))?;
    let group = str_at(spec, &["group"]).unwrap_or_default().to_string();
    let plural = str_at(spec, &["names", "plural"])
        .unwrap_or_default()
        .to_string();
    let kind = str_at(spec, &["names", "kind"])
        .unwrap_or_default()
        .to_string();
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return Err(ApiError::invalid_crd(
            name,
            "spec.group, spec.names.plural and spec.names.kind are required",
        ));
    }
    if name != format!("{plural}.{group}") {
        return Err(ApiError::invalid_crd(
            name,
            &format!(
                "metadata.name: Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"
            ),
        ));
    }
    let scope = str_at(spec, &["scope"]).unwrap_or("Namespaced");
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let names = spec.get("names");
    let singular = str_at(spec, &["names", "singular"])
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let mut out = Vec::new();
    for v in spec
        .get("versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let version = str_at(v, &["name"]).unwrap_or_default().to_string();
        out.push(ResourceDef {
            group: group.clone(),
            version,
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            namespaced: scope == "Namespaced",
            status: v.pointer("/subresources/status").is_some(),
            keep_status_on_create: false,
            short_names: strings(names.and_then(|n| n.get("shortNames"))),
            categories: strings(names.and_then(|n| n.get("categories"))),
            schema: v.pointer("/schema/openAPIV3Schema").cloned(),
            printer_columns: v
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            crd: Some(name.to_string()),
        });
    }
    if out.is_empty() {
        return Err(ApiError::invalid_crd(
            name,
            "spec.versions: Required value: must have at least one served version",
        ));
    }
    Ok(out)
}
