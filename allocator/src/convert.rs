//! `allocator convert`: MetalLB objects rewritten as hostlb objects.
//!
//! `IPAddressPool` and `L2Advertisement` keep their fields (the hostlb API
//! mirrors MetalLB's), move to `hostlb.io/v1` and to the hostlb namespace;
//! the old `AddressPool` becomes a pool plus an advertisement; Services get
//! their `metallb.universe.tf/` and `metallb.io/` annotations renamed. What
//! has no hostlb equivalent (BGP, legacy ConfigMaps) is left out and named in
//! the notes, so nothing is dropped silently.

use std::path::Path;

use serde_json::{Map, Value, json};

/// The converted objects as YAML and what could not be carried over.
pub struct Converted {
    pub yaml: String,
    pub notes: Vec<String>,
}

/// A file that cannot be read: the same failures as any snapshot.
pub use hostlb_api::snapshot::SnapshotError as ConvertError;

const POOL_FIELDS: &[&str] = &[
    "addresses",
    "autoAssign",
    "avoidBuggyIPs",
    "serviceAllocation",
];
const AD_FIELDS: &[&str] = &[
    "ipAddressPools",
    "ipAddressPoolSelectors",
    "nodeSelectors",
    "serviceSelectors",
    "interfaces",
    "preferredNodeSelectors",
];
const RENAMED: &[&str] = &[
    "address-pool",
    "loadBalancerIPs",
    "allow-shared-ip",
    "ip-allocated-from-pool",
];

fn name_of(o: &Value) -> String {
    let m = &o["metadata"];
    match m["namespace"].as_str() {
        Some(ns) => format!(
            "{}/{ns}/{}",
            o["kind"].as_str().unwrap_or("?"),
            m["name"].as_str().unwrap_or("?")
        ),
        None => format!(
            "{}/{}",
            o["kind"].as_str().unwrap_or("?"),
            m["name"].as_str().unwrap_or("?")
        ),
    }
}

/// Metadata worth keeping: name, the target namespace, labels, annotations
/// other than client bookkeeping.
fn metadata(o: &Value, namespace: Option<&str>) -> Value {
    let m = &o["metadata"];
    let mut out = Map::new();
    out.insert("name".into(), m["name"].clone());
    if let Some(ns) = namespace {
        out.insert("namespace".into(), Value::String(ns.into()));
    }
    if let Some(l) = m
        .get("labels")
        .filter(|l| l.as_object().is_some_and(|x| !x.is_empty()))
    {
        out.insert("labels".into(), l.clone());
    }
    if let Some(a) = m.get("annotations").and_then(Value::as_object) {
        let kept: Map<String, Value> = a
            .iter()
            .filter(|(k, _)| *k != "kubectl.kubernetes.io/last-applied-configuration")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !kept.is_empty() {
            out.insert("annotations".into(), Value::Object(kept));
        }
    }
    Value::Object(out)
}

/// The spec fields hostlb has, noting the others.
fn carry(o: &Value, fields: &[&str], notes: &mut Vec<String>) -> Map<String, Value> {
    let mut spec = Map::new();
    for (k, v) in o["spec"].as_object().into_iter().flatten() {
        if fields.contains(&k.as_str()) {
            spec.insert(k.clone(), v.clone());
        } else {
            notes.push(format!(
                "{}: spec.{k} has no hostlb equivalent; left out",
                name_of(o)
            ));
        }
    }
    spec
}

fn pool(o: &Value, namespace: &str, notes: &mut Vec<String>) -> Value {
    let mut spec = carry(o, POOL_FIELDS, notes);
    if let Some(sa) = spec
        .get_mut("serviceAllocation")
        .and_then(Value::as_object_mut)
        && sa.get("priority").and_then(Value::as_i64) == Some(0)
    {
        // MetalLB reads priority 0 as "not set"; hostlb reads it as a priority.
        sa.remove("priority");
        notes.push(format!(
            "{}: serviceAllocation.priority 0 means unset in MetalLB; written without priority",
            name_of(o)
        ));
    }
    // MetalLB shares an address between Services of any namespaces whose
    // keys agree; hostlb keeps a key to its namespace unless told.
    spec.insert("shareAcrossNamespaces".into(), Value::Bool(true));
    json!({"apiVersion": "hostlb.io/v1", "kind": "IPAddressPool", "metadata": metadata(o, Some(namespace)), "spec": spec})
}

fn advertisement(o: &Value, namespace: &str, notes: &mut Vec<String>) -> Value {
    let spec = carry(o, AD_FIELDS, notes);
    json!({"apiVersion": "hostlb.io/v1", "kind": "L2Advertisement", "metadata": metadata(o, Some(namespace)), "spec": spec})
}

fn service(o: &Value) -> Option<Value> {
    let annotations = o["metadata"]["annotations"].as_object()?;
    let mut changed = false;
    let mut out = Map::new();
    for (k, v) in annotations {
        let renamed = ["metallb.universe.tf/", "metallb.io/"]
            .iter()
            .find_map(|p| {
                let suffix = k.strip_prefix(p)?;
                RENAMED
                    .contains(&suffix)
                    .then(|| format!("hostlb.io/{suffix}"))
            });
        match renamed {
            Some(new) => {
                changed = true;
                // The hostlb form wins when both are present.
                if !annotations.contains_key(&new) {
                    out.insert(new, v.clone());
                }
            }
            None => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if !changed {
        return None;
    }
    let mut svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": metadata(o, o["metadata"]["namespace"].as_str()), "spec": o["spec"].clone()});
    svc["metadata"]["annotations"] = Value::Object(out);
    if let Some(spec) = svc["spec"].as_object_mut() {
        // Set by Kubernetes, not by the user.
        for k in ["clusterIP", "clusterIPs"] {
            spec.remove(k);
        }
    }
    Some(svc)
}

/// Convert every MetalLB object of `text` (YAML, several documents or
/// `kind: List`).
pub fn convert_str(text: &str, source: &str, namespace: &str) -> Result<Converted, ConvertError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| ConvertError::Yaml {
        path: source.into(),
        message: e.to_string(),
    })?;
    let mut flat = Vec::new();
    for d in docs {
        if d["kind"].as_str().is_some_and(|k| k.ends_with("List")) {
            flat.extend(d["items"].as_array().cloned().unwrap_or_default());
        } else {
            flat.push(d);
        }
    }
    let mut out: Vec<Value> = Vec::new();
    let mut notes = Vec::new();
    for o in &flat {
        let api = o["apiVersion"].as_str().unwrap_or_default();
        let kind = o["kind"].as_str().unwrap_or_default();
        let metallb = api.starts_with("metallb.io/");
        match (metallb, kind) {
            (true, "IPAddressPool") => out.push(pool(o, namespace, &mut notes)),
            (true, "L2Advertisement") => out.push(advertisement(o, namespace, &mut notes)),
            (true, "AddressPool") => match o["spec"]["protocol"].as_str() {
                Some("layer2") | None => {
                    let mut p = o.clone();
                    if let Some(s) = p["spec"].as_object_mut() {
                        s.remove("protocol");
                    }
                    out.push(pool(&p, namespace, &mut notes));
                    out.push(
                        json!({"apiVersion": "hostlb.io/v1", "kind": "L2Advertisement",
                        "metadata": {"name": o["metadata"]["name"], "namespace": namespace},
                        "spec": {"ipAddressPools": [o["metadata"]["name"]]}}),
                    );
                }
                Some(p) => notes.push(format!(
                    "{}: protocol {p} is not supported (hostlb announces on L2 only); left out",
                    name_of(o)
                )),
            },
            (true, "BGPPeer" | "BGPAdvertisement" | "BFDProfile" | "Community") => {
                notes.push(format!("{}: hostlb has no BGP mode; left out (export the virtual interface's routes with your routing daemon instead)", name_of(o)));
            }
            (true, _) => notes.push(format!("{}: no hostlb equivalent; left out", name_of(o))),
            (false, "Service") => {
                if let Some(s) = service(o) {
                    out.push(s);
                }
            }
            (false, "ConfigMap")
                if o["metadata"]["name"] == "config" && o["data"].get("config").is_some() =>
            {
                notes.push(format!("{}: MetalLB's legacy ConfigMap configuration; convert it to MetalLB CRDs first (MetalLB's configmaptocrs), then here", name_of(o)));
            }
            _ => {}
        }
    }
    let pools: Vec<String> = out
        .iter()
        .filter(|o| o["kind"] == "IPAddressPool")
        .map(|o| {
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    if !pools.is_empty() {
        notes.push(format!(
            "IPAddressPool {}: written with shareAcrossNamespaces: true, as MetalLB shares an address between namespaces whose sharing keys agree; set it false on pools whose namespaces belong to tenants that must not share",
            pools.join(", ")
        ));
    }
    let mut yaml = String::new();
    for o in &out {
        yaml.push_str("---\n");
        yaml.push_str(&serde_saphyr::to_string(o).expect("plain values serialize"));
    }
    Ok(Converted { yaml, notes })
}

pub fn convert_file(path: &Path, namespace: &str) -> Result<Converted, ConvertError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConvertError::Read {
        path: path.display().to_string(),
        source,
    })?;
    convert_str(&text, &path.display().to_string(), namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    const METALLB: &str = r#"
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata:
  name: production
  namespace: metallb-system
  uid: 1234
  annotations: {kubectl.kubernetes.io/last-applied-configuration: "{}", team: net}
spec:
  addresses: [192.168.10.0/24]
  autoAssign: false
  avoidBuggyIPs: true
  serviceAllocation: {priority: 0, namespaces: [shop]}
status: {assignedIPv4: 3}
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: l2, namespace: metallb-system}
spec:
  ipAddressPools: [production]
  nodeSelectors: [{matchLabels: {role: lb}}]
  interfaces: [eth1]
  someFutureField: 1
---
apiVersion: metallb.io/v1beta1
kind: BGPPeer
metadata: {name: tor, namespace: metallb-system}
spec: {peerAddress: 10.0.0.1, peerASN: 64500, myASN: 64501}
---
apiVersion: metallb.io/v1beta1
kind: AddressPool
metadata: {name: legacy, namespace: metallb-system}
spec: {protocol: layer2, addresses: [10.9.0.0/24]}
---
apiVersion: v1
kind: Service
metadata:
  name: dns
  namespace: kube-system
  annotations: {metallb.universe.tf/allow-shared-ip: dns, metallb.io/loadBalancerIPs: 192.168.10.53, other: x}
spec: {type: LoadBalancer, clusterIP: 10.96.0.10, ports: [{port: 53, protocol: UDP}]}
---
apiVersion: v1
kind: Service
metadata: {name: plain, namespace: default}
spec: {type: LoadBalancer}
"#;

    #[test]
    fn converts_pools_advertisements_services_and_names_the_rest() {
        let c = convert_str(METALLB, "in.yaml", "hostlb-system").unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&c.yaml).unwrap();
        let kinds: Vec<(&str, &str)> = docs
            .iter()
            .map(|d| {
                (
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["name"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("IPAddressPool", "production"),
                ("L2Advertisement", "l2"),
                ("IPAddressPool", "legacy"),
                ("L2Advertisement", "legacy"),
                ("Service", "dns")
            ]
        );
        let pool = &docs[0];
        assert_eq!(pool["apiVersion"], "hostlb.io/v1");
        assert_eq!(pool["metadata"]["namespace"], "hostlb-system");
        assert_eq!(pool["metadata"]["annotations"], json!({"team": "net"}));
        assert!(pool.get("status").is_none() && pool["metadata"].get("uid").is_none());
        assert_eq!(pool["spec"]["autoAssign"], false);
        assert_eq!(
            pool["spec"]["serviceAllocation"],
            json!({"namespaces": ["shop"]})
        );
        assert_eq!(docs[1]["spec"]["interfaces"], json!(["eth1"]));
        assert_eq!(docs[3]["spec"]["ipAddressPools"], json!(["legacy"]));
        let svc = &docs[4];
        assert_eq!(
            svc["metadata"]["annotations"],
            json!({"hostlb.io/allow-shared-ip": "dns", "hostlb.io/loadBalancerIPs": "192.168.10.53", "other": "x"})
        );
        assert!(svc["spec"].get("clusterIP").is_none());
        assert_eq!(c.notes.len(), 4, "{:?}", c.notes);
        assert!(
            c.notes[3].starts_with(
                "IPAddressPool production, legacy: written with shareAcrossNamespaces: true"
            ),
            "{:?}",
            c.notes
        );
        assert_eq!(pool["spec"]["shareAcrossNamespaces"], true);
        assert!(c.notes[0].contains("priority 0"));
        assert_eq!(
            c.notes[1],
            "L2Advertisement/metallb-system/l2: spec.someFutureField has no hostlb equivalent; left out"
        );
        assert!(c.notes[2].starts_with("BGPPeer/metallb-system/tor: hostlb has no BGP mode"));
        // The output is valid input for the typed hostlb objects.
        let typed: hostlb_api::IPAddressPool = serde_json::from_value(pool.clone()).unwrap();
        assert!(typed.spec.avoid_buggy_ips);
    }
}
