//! Kubernetes objects to election inputs.
//!
//! The agent's watches and `simulate`'s files both end here, so the rules for
//! which objects count and how they are read are written once. An object that
//! cannot be used is reported as an [`ObjectError`] and left out; it never
//! stops the others from being used.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use hostlb_api::Family;
use hostlb_api::annotations::{IP_ALLOCATED_FROM_POOL, announcing, service_annotation};
use hostlb_api::selector::parse_list;
use hostlb_api::snapshot::{ObjectError, object_ref};
use hostlb_api::v1::LAST_VALID_KEPT;
use hostlb_api::{AddressRange, IPAddressPool, L2Advertisement};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::election::{
    Advertisement, Cluster, Endpoints, Labels, NodeInfo, Pool, Preference, Protocol, ServiceInfo,
    ServicePort,
};

pub use hostlb_api::Scope;

fn labels(meta: &ObjectMeta) -> Labels {
    meta.labels.clone().unwrap_or_default()
}

fn created(meta: &ObjectMeta) -> Option<i64> {
    meta.creation_timestamp.as_ref().map(|t| t.0.as_second())
}

pub fn node_info(node: &Node) -> NodeInfo {
    let network_unavailable = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "NetworkUnavailable" && c.status == "True");
    NodeInfo {
        name: node.metadata.name.clone().unwrap_or_default(),
        labels: labels(&node.metadata),
        network_unavailable,
        addresses: node_addresses(node),
        cordoned: hostlb_api::annotations::cordoned(node),
    }
}

/// The Node's `status.addresses` that are IP addresses (InternalIP,
/// ExternalIP; not hostnames).
pub fn node_addresses(node: &Node) -> Vec<IpAddr> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|a| a.address.parse().ok())
        .collect()
}

/// A pool's addresses in force ([`IPAddressPool::addresses_in_force`]):
/// while an edit leaves an entry that does not parse, the last valid ones the
/// allocator recorded, so a typo takes no address away; without such a
/// record, its valid entries. Each invalid entry is reported.
pub fn pool(p: &IPAddressPool, errors: &mut Vec<ObjectError>) -> Pool {
    let (addresses, kept) = p.addresses_in_force();
    let suffix = if kept { LAST_VALID_KEPT } else { "" };
    for problem in p.address_problems() {
        errors.push(ObjectError::new(
            "IPAddressPool",
            &p.metadata,
            format!("{problem}{suffix}"),
        ));
    }
    Pool {
        name: p.metadata.name.clone().unwrap_or_default(),
        labels: labels(&p.metadata),
        created: created(&p.metadata),
        ranges: addresses
            .iter()
            .filter_map(|a| AddressRange::parse(a).ok())
            .collect(),
    }
}

/// An advertisement with any invalid selector or weight is left out whole
/// (half of it could announce from nodes the operator did not intend),
/// unless the allocator recorded its last valid spec: then that one stays in
/// force on every agent alike, and the edit is reported.
pub fn advertisement(ad: &L2Advertisement, errors: &mut Vec<ObjectError>) -> Option<Advertisement> {
    let spec = match ad.spec_in_force() {
        Ok((spec, None)) => spec,
        Ok((spec, Some(problem))) => {
            errors.push(ObjectError::new(
                "L2Advertisement",
                &ad.metadata,
                format!("{problem}{LAST_VALID_KEPT}"),
            ));
            spec
        }
        Err(problem) => {
            errors.push(ObjectError::new("L2Advertisement", &ad.metadata, problem));
            return None;
        }
    };
    // Validated above: these cannot fail.
    let preferences = spec
        .preferences()
        .ok()?
        .into_iter()
        .map(|(weight, selector)| Preference { weight, selector })
        .collect();
    Some(Advertisement {
        name: ad.metadata.name.clone().unwrap_or_default(),
        pools: spec.ip_address_pools.clone(),
        pool_selectors: parse_list(
            "spec.ipAddressPoolSelectors",
            &spec.ip_address_pool_selectors,
        )
        .ok()?,
        node_selectors: parse_list("spec.nodeSelectors", &spec.node_selectors).ok()?,
        service_selectors: parse_list("spec.serviceSelectors", &spec.service_selectors).ok()?,
        interfaces: spec.interfaces.clone(),
        preferences,
        drain_cordoned: spec.drain_cordoned_nodes,
        sticky: spec.placement == hostlb_api::v1::Placement::Sticky,
    })
}

/// What the agent keeps of an EndpointSlice: the Service it belongs to and
/// where its usable endpoints run. The agent's watch holds these rather
/// than the objects (a slice's object grows with its endpoints, each a
/// struct of a dozen optional fields; its record only with the nodes they
/// run on), so the rule of which endpoints count is written here once, for
/// the watch and for files.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceEndpoints {
    pub namespace: String,
    pub service: String,
    pub endpoints: Endpoints,
}

impl SliceEndpoints {
    /// `None` for a slice that names no Service: nothing reads it.
    pub fn of(slice: &EndpointSlice) -> Option<SliceEndpoints> {
        let service = slice
            .metadata
            .labels
            .as_ref()?
            .get("kubernetes.io/service-name")?
            .clone();
        let mut endpoints = Endpoints::default();
        for ep in &slice.endpoints {
            // Usable: ready unset or true, or serving (terminating pods
            // that still serve keep the address up).
            let c = ep.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(false);
            if !(ready || serving) {
                continue;
            }
            endpoints.any_usable = true;
            if let Some(node) = &ep.node_name {
                endpoints.nodes.insert(node.clone());
            }
        }
        Some(SliceEndpoints {
            namespace: slice.metadata.namespace.clone().unwrap_or_default(),
            service,
            endpoints,
        })
    }

    /// Those of `slices` that name a Service.
    pub fn of_all(slices: &[EndpointSlice]) -> Vec<SliceEndpoints> {
        slices.iter().filter_map(SliceEndpoints::of).collect()
    }
}

/// Where each Service has usable endpoints, from its EndpointSlices.
#[derive(Default)]
pub struct EndpointIndex {
    /// `(namespace, service)` → endpoints.
    by_service: BTreeMap<(String, String), Endpoints>,
}

impl EndpointIndex {
    pub fn build<'a>(slices: impl IntoIterator<Item = &'a SliceEndpoints>) -> Self {
        let mut by_service: BTreeMap<(String, String), Endpoints> = BTreeMap::new();
        for slice in slices {
            let entry = by_service
                .entry((slice.namespace.clone(), slice.service.clone()))
                .or_default();
            entry.any_usable |= slice.endpoints.any_usable;
            entry.nodes.extend(slice.endpoints.nodes.iter().cloned());
        }
        EndpointIndex { by_service }
    }

    pub fn get(&self, namespace: &str, name: &str) -> Endpoints {
        self.by_service
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .unwrap_or_default()
    }
}

/// What the agent keeps of a Service, which is all it reads of one: what
/// the election reads ([`service_info`]), the announcing annotations and
/// the resourceVersion for the annotation writer, the uid for Events. The
/// watch keeps these rather than the objects: a trimmed object in a
/// reflector's store was about 2 KB, most of it empty optional fields and
/// map nodes, and a record of a Service of another type is its name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceRecord {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    /// `None` unless `type: LoadBalancer`: nothing else is read of the
    /// rest. Boxed, as most of a cluster's Services are of other types.
    pub balanced: Option<Box<Balanced>>,
}

/// What is read of a Service of `type: LoadBalancer`, as written: a bad
/// value is reported by [`service_info`] each time it builds a view, as for
/// the other kinds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Balanced {
    pub class: Option<String>,
    pub labels: Vec<(String, String)>,
    /// Seconds since the epoch.
    pub created: Option<i64>,
    /// `status.loadBalancer.ingress[].ip` in order (`None`: an entry with
    /// a hostname only), so that an error names its index.
    pub ingress: Vec<Option<String>>,
    pub allocated_pool: Option<String>,
    pub local_traffic: bool,
    /// [`REBALANCE`](hostlb_api::annotations::REBALANCE) is set.
    pub rebalance: bool,
    /// `spec.ports[]`: port and protocol.
    pub ports: Vec<(i32, Option<String>)>,
    /// The announcing annotations present: name, value.
    pub announcing: Vec<(&'static str, String)>,
}

impl ServiceRecord {
    pub fn of(svc: &Service) -> ServiceRecord {
        let meta = &svc.metadata;
        let spec = svc.spec.as_ref();
        let balanced = (spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")).then(|| {
            let spec = spec.cloned().unwrap_or_default();
            let annotations = meta.annotations.as_ref();
            let announcing = [Family::V4, Family::V6]
                .into_iter()
                .flat_map(|f| [announcing(f, false), announcing(f, true)])
                .filter_map(|name| Some((name, annotations?.get(name)?.clone())))
                .collect();
            Box::new(Balanced {
                class: spec.load_balancer_class,
                labels: meta
                    .labels
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .collect(),
                created: created(meta),
                ingress: svc
                    .status
                    .as_ref()
                    .and_then(|s| s.load_balancer.as_ref())
                    .and_then(|lb| lb.ingress.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|i| i.ip.clone())
                    .collect(),
                allocated_pool: service_annotation(annotations, IP_ALLOCATED_FROM_POOL)
                    .map(str::to_string),
                local_traffic: spec.external_traffic_policy.as_deref() == Some("Local"),
                rebalance: annotations
                    .is_some_and(|a| a.contains_key(hostlb_api::annotations::REBALANCE)),
                ports: spec
                    .ports
                    .into_iter()
                    .flatten()
                    .map(|p| (p.port, p.protocol))
                    .collect(),
                announcing,
            })
        });
        ServiceRecord {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            balanced,
        }
    }

    pub fn of_all(services: &[Service]) -> Vec<ServiceRecord> {
        services.iter().map(ServiceRecord::of).collect()
    }

    /// The value of announcing annotation `name`, if present.
    pub fn announcing(&self, name: &str) -> Option<&str> {
        let b = self.balanced.as_ref()?;
        b.announcing
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The Service, for an Event about it.
    pub fn object_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: self.uid.clone(),
            ..ObjectReference::default()
        }
    }

    fn error(&self, message: String) -> ObjectError {
        ObjectError {
            object: object_ref(
                "Service",
                Some(&self.namespace),
                Some(self.name.as_str()).filter(|n| !n.is_empty()),
            ),
            message,
        }
    }
}

/// The Service as the election sees it, `None` when hostlb does not handle it
/// or it has no address yet.
pub fn service_info(
    svc: &ServiceRecord,
    scope: &Scope,
    endpoints: &EndpointIndex,
    errors: &mut Vec<ObjectError>,
) -> Option<ServiceInfo> {
    let b = svc.balanced.as_ref()?;
    if !scope.takes_class(b.class.as_deref()) {
        return None;
    }
    let mut addresses: Vec<IpAddr> = Vec::new();
    for (i, text) in b.ingress.iter().enumerate() {
        let Some(text) = text else { continue };
        match text.parse::<IpAddr>() {
            Ok(ip) if !addresses.contains(&ip) => addresses.push(ip),
            Ok(_) => {}
            Err(_) => errors.push(svc.error(format!(
                "status.loadBalancer.ingress[{i}].ip: {text:?} is not an IP address"
            ))),
        }
    }
    if addresses.is_empty() {
        return None;
    }
    Some(ServiceInfo {
        key: format!("{}/{}", svc.namespace, svc.name),
        labels: b.labels.iter().cloned().collect(),
        created: b.created,
        addresses,
        allocated_pool: b.allocated_pool.clone(),
        local_traffic: b.local_traffic,
        rebalance: b.rebalance,
        endpoints: endpoints.get(&svc.namespace, &svc.name),
        ports: ports(svc, b, errors),
    })
}

/// `spec.ports`, each once; a protocol hostlb cannot filter is reported
/// and its port left out (so the firewall keeps it closed).
fn ports(svc: &ServiceRecord, b: &Balanced, errors: &mut Vec<ObjectError>) -> Vec<ServicePort> {
    let mut out: Vec<ServicePort> = Vec::new();
    for (i, (port, protocol)) in b.ports.iter().enumerate() {
        let Some(protocol) = Protocol::parse(protocol.as_deref()) else {
            errors.push(svc.error(format!(
                "spec.ports[{i}].protocol: {:?} is not TCP, UDP or SCTP; the firewall keeps that port closed",
                protocol.as_deref().unwrap_or_default()
            )));
            continue;
        };
        let Ok(port) = u16::try_from(*port) else {
            errors.push(svc.error(format!("spec.ports[{i}].port: {port} is not a port")));
            continue;
        };
        let sp = ServicePort { protocol, port };
        if !out.contains(&sp) {
            out.push(sp);
        }
    }
    out.sort();
    out
}

/// Everything the election needs from the cluster's objects.
#[allow(clippy::too_many_arguments)]
pub fn cluster<'a>(
    scope: &Scope,
    nodes: impl IntoIterator<Item = &'a Node>,
    pools: impl IntoIterator<Item = &'a IPAddressPool>,
    advertisements: impl IntoIterator<Item = &'a L2Advertisement>,
    services: impl IntoIterator<Item = &'a ServiceRecord>,
    slices: impl IntoIterator<Item = &'a SliceEndpoints>,
) -> (Cluster, Vec<ObjectError>) {
    let mut errors = Vec::new();
    let in_scope = |meta: &ObjectMeta, kind: &str, errors: &mut Vec<ObjectError>| {
        let ok = meta.namespace.as_deref() == Some(scope.namespace.as_str());
        if !ok {
            errors.push(ObjectError::new(
                kind,
                meta,
                format!(
                    "not in namespace {}; hostlb does not read it",
                    scope.namespace
                ),
            ));
        }
        ok
    };
    let nodes = nodes.into_iter().map(node_info).collect();
    let mut seen_pools = BTreeSet::new();
    let mut out_pools = Vec::new();
    for p in pools {
        if in_scope(&p.metadata, "IPAddressPool", &mut errors) {
            let pool = pool(p, &mut errors);
            if seen_pools.insert(pool.name.clone()) {
                out_pools.push(pool);
            }
        }
    }
    let mut ads = Vec::new();
    for ad in advertisements {
        if !in_scope(&ad.metadata, "L2Advertisement", &mut errors) {
            continue;
        }
        ads.extend(advertisement(ad, &mut errors));
    }
    let index = EndpointIndex::build(slices);
    let services = services
        .into_iter()
        .filter_map(|s| service_info(s, scope, &index, &mut errors))
        .collect();
    (
        Cluster {
            nodes,
            pools: out_pools,
            advertisements: ads,
            services,
        },
        errors,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostlb_api::snapshot::Snapshot;

    fn load(yaml: &str) -> (Cluster, Vec<ObjectError>) {
        let mut s = Snapshot::default();
        s.add_str(yaml, "test").unwrap();
        cluster(
            &Scope::default(),
            &s.nodes,
            &s.pools,
            &s.advertisements,
            &ServiceRecord::of_all(&s.services),
            &SliceEndpoints::of_all(&s.endpoint_slices),
        )
    }

    #[test]
    fn preferred_nodes_are_read_with_weights_and_selectors() {
        let (c, errors) = load(
            r#"
apiVersion: hostlb.io/v1
kind: L2Advertisement
metadata: {name: ad, namespace: hostlb-system}
spec:
  ipAddressPools: [p]
  nodeSelectors: [{matchLabels: {role: lb}}]
  preferredNodeSelectors:
  - {weight: 60, preference: {matchLabels: {zone: primary}}}
  - weight: 50
    preference:
      matchExpressions: [{key: gpu, operator: Exists}]
"#,
        );
        assert!(errors.is_empty(), "{errors:?}");
        let ad = &c.advertisements[0];
        assert_eq!(ad.pools, vec!["p"]);
        assert_eq!(ad.node_selectors.len(), 1);
        let weights: Vec<u32> = ad.preferences.iter().map(|p| p.weight).collect();
        assert_eq!(weights, vec![60, 50]);
        let gpu: Labels = [("gpu".to_string(), "x".to_string())].into();
        assert!(!ad.preferences[0].selector.matches(&gpu));
        assert!(ad.preferences[1].selector.matches(&gpu));
    }

    #[test]
    fn bad_advertisements_are_reported_and_left_out_alone() {
        let (c, errors) = load(
            r#"
apiVersion: hostlb.io/v1
kind: L2Advertisement
metadata: {name: bad-op, namespace: hostlb-system}
spec:
  nodeSelectors: [{}, {matchExpressions: [{key: zone, operator: Near, values: [a]}]}]
---
apiVersion: hostlb.io/v1
kind: L2Advertisement
metadata: {name: bad-weight, namespace: hostlb-system}
spec:
  preferredNodeSelectors: [{weight: 0, preference: {}}]
---
apiVersion: hostlb.io/v1
kind: L2Advertisement
metadata: {name: bad-pref, namespace: hostlb-system}
spec:
  preferredNodeSelectors: [{weight: 5, preference: {matchLabels: {"bad key": x}}}]
---
apiVersion: hostlb.io/v1
kind: L2Advertisement
metadata: {name: elsewhere, namespace: default}
spec: {}
---
apiVersion: hostlb.io/v1
kind: L2Advertisement
metadata: {name: good, namespace: hostlb-system}
spec: {}
"#,
        );
        assert_eq!(c.advertisements.len(), 1);
        assert_eq!(c.advertisements[0].name, "good");
        let msgs: Vec<(String, String)> =
            errors.into_iter().map(|e| (e.object, e.message)).collect();
        assert_eq!(
            msgs,
            vec![
                (
                    "L2Advertisement/hostlb-system/bad-op".into(),
                    r#"spec.nodeSelectors[1]: "Near" is not a valid label selector operator"#.into()
                ),
                (
                    "L2Advertisement/hostlb-system/bad-weight".into(),
                    "spec.preferredNodeSelectors[0].weight: Invalid value: 0: must be between 1 and 100, inclusive".into()
                ),
                (
                    "L2Advertisement/hostlb-system/bad-pref".into(),
                    r#"spec.preferredNodeSelectors[0].preference: key: Invalid value: "bad key": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"#.into()
                ),
                (
                    "L2Advertisement/default/elsewhere".into(),
                    "not in namespace hostlb-system; hostlb does not read it".into()
                ),
            ]
        );
    }

    /// One typo must not withdraw a pool from every node: the edit is
    /// reported and the last valid form the allocator recorded in the
    /// object's status stays in force; without a record, an invalid
    /// advertisement is left out and a pool keeps its valid entries.
    #[test]
    fn an_invalid_edit_keeps_the_last_valid_form_recorded_in_status() {
        let run = |status: &str, address: &str, operator: &str| {
            let yaml = format!(
                r#"
apiVersion: hostlb.io/v1
kind: IPAddressPool
metadata: {{name: p, namespace: hostlb-system}}
spec: {{addresses: ["{address}", "10.0.1.0/30"]}}
{pool_status}
---
apiVersion: hostlb.io/v1
kind: L2Advertisement
metadata: {{name: ad, namespace: hostlb-system}}
spec:
  nodeSelectors: [{{matchExpressions: [{{key: zone, operator: {operator}}}]}}]
{ad_status}
"#,
                pool_status = if status.is_empty() {
                    String::new()
                } else {
                    "status: {lastValidAddresses: [10.0.0.0/30, 10.0.1.0/30]}".to_string()
                },
                ad_status = if status.is_empty() {
                    String::new()
                } else {
                    "status: {lastValidSpec: {nodeSelectors: [{matchLabels: {zone: a}}, {matchLabels: {zone: b}}]}}".to_string()
                },
            );
            let (c, errors) = load(&yaml);
            let ranges: Vec<String> = c.pools[0].ranges.iter().map(|r| r.to_string()).collect();
            let ads: Vec<usize> = c
                .advertisements
                .iter()
                .map(|a| a.node_selectors.len())
                .collect();
            let errors: Vec<String> = errors.into_iter().map(|e| e.message).collect();
            (ranges, ads, errors)
        };
        // Valid: the spec, whatever the record says.
        let (ranges, ads, errors) = run("recorded", "10.0.2.0/30", "Exists");
        assert_eq!(ranges, vec!["10.0.2.0-10.0.2.3", "10.0.1.0-10.0.1.3"]);
        assert_eq!(ads, vec![1]);
        assert!(errors.is_empty(), "{errors:?}");
        // Invalid, with a record: the record, and the edit reported.
        let (ranges, ads, errors) = run("recorded", "10.0.0.300", "Near");
        assert_eq!(ranges, vec!["10.0.0.0-10.0.0.3", "10.0.1.0-10.0.1.3"]);
        assert_eq!(ads, vec![2]);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors.iter().all(|e| e.ends_with(LAST_VALID_KEPT)),
            "{errors:?}"
        );
        // Invalid, no record: the pool's valid entries; no advertisement.
        let (ranges, ads, errors) = run("", "10.0.0.300", "Near");
        assert_eq!(ranges, vec!["10.0.1.0-10.0.1.3"]);
        assert!(ads.is_empty());
        assert!(
            errors.iter().all(|e| !e.ends_with(LAST_VALID_KEPT)),
            "{errors:?}"
        );
    }

    #[test]
    fn pools_keep_valid_entries_and_report_bad_ones() {
        let (c, errors) = load(
            r#"
apiVersion: hostlb.io/v1
kind: IPAddressPool
metadata: {name: p, namespace: hostlb-system, creationTimestamp: "2026-01-02T03:04:05Z"}
spec:
  addresses: [10.0.0.0/24, 10.0.1.300, "fd00::1-fd00::9"]
"#,
        );
        assert_eq!(c.pools[0].ranges.len(), 2);
        assert_eq!(c.pools[0].created, Some(1767323045));
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].object, "IPAddressPool/hostlb-system/p");
        assert!(
            errors[0]
                .message
                .starts_with(r#"spec.addresses[1]: invalid address "10.0.1.300""#)
        );
    }

    #[test]
    fn services_endpoints_and_classes() {
        let (c, errors) = load(
            r#"
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  labels: {app: web}
  annotations: {metallb.universe.tf/ip-allocated-from-pool: old-pool}
spec: {type: LoadBalancer, externalTrafficPolicy: Local}
status: {loadBalancer: {ingress: [{ip: 10.0.0.5}, {ip: "fd00::5"}, {hostname: lb.example}, {ip: nope}]}}
---
apiVersion: v1
kind: Service
metadata: {name: other-class, namespace: shop}
spec: {type: LoadBalancer, loadBalancerClass: example.com/other}
status: {loadBalancer: {ingress: [{ip: 10.0.0.6}]}}
---
apiVersion: v1
kind: Service
metadata: {name: cluster-ip, namespace: shop}
spec: {type: ClusterIP}
---
apiVersion: v1
kind: Service
metadata: {name: pending, namespace: shop}
spec: {type: LoadBalancer, loadBalancerClass: hostlb.io/lb}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
- {addresses: [10.1.0.1], nodeName: n1}
- {addresses: [10.1.0.2], nodeName: n2, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.1.0.3], nodeName: n3, conditions: {ready: false}}
- {addresses: [10.1.0.4], nodeName: n4, conditions: {ready: true}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-other-ns, namespace: elsewhere, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
- {addresses: [10.1.0.9], nodeName: n9}
"#,
        );
        assert_eq!(c.services.len(), 1);
        let s = &c.services[0];
        assert_eq!(s.key, "shop/web");
        assert_eq!(
            s.addresses,
            vec![
                "10.0.0.5".parse::<IpAddr>().unwrap(),
                "fd00::5".parse().unwrap()
            ]
        );
        assert!(s.local_traffic);
        assert_eq!(s.allocated_pool.as_deref(), Some("old-pool"));
        assert!(s.endpoints.any_usable);
        let nodes: Vec<&str> = s.endpoints.nodes.iter().map(String::as_str).collect();
        assert_eq!(nodes, vec!["n1", "n2", "n4"]);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].message.contains("\"nope\" is not an IP address"));
    }

    #[test]
    fn network_unavailable_condition() {
        let (c, _) = load(
            r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {conditions: [{type: NetworkUnavailable, status: "True"}, {type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Node
metadata: {name: n2}
status: {conditions: [{type: NetworkUnavailable, status: "False"}]}
"#,
        );
        assert!(c.nodes[0].network_unavailable);
        assert!(!c.nodes[1].network_unavailable);
    }

    /// The record holds what the writer and the Events read of a Service
    /// (its announcing annotations, version, uid), and of a Service of
    /// another type only its name.
    #[test]
    fn a_service_record_keeps_what_the_agent_reads_and_no_more() {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1",
                         "resourceVersion": "7", "labels": {"app": "web"},
                         "annotations": {"hostlb.io/announcing-IPv4": "n1,eth0",
                                         "example.com/note": "x"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
            "status": {"loadBalancer": {"ingress": [{"hostname": "h"}, {"ip": "10.0.0.1"}]}}
        }))
        .unwrap();
        let r = ServiceRecord::of(&svc);
        assert_eq!(
            r.announcing(hostlb_api::annotations::ANNOUNCING_IPV4),
            Some("n1,eth0")
        );
        assert_eq!(r.announcing(hostlb_api::annotations::ANNOUNCING_IPV6), None);
        assert_eq!(r.resource_version.as_deref(), Some("7"));
        let b = r.balanced.as_ref().unwrap();
        assert_eq!(b.ingress, [None, Some("10.0.0.1".to_string())]);
        assert_eq!(b.announcing.len(), 1, "other annotations are not kept");
        assert_eq!(
            r.object_ref(),
            kube::Resource::object_ref(&svc, &()),
            "Events name it as kube would"
        );

        let mut other = svc.clone();
        other.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        let r = ServiceRecord::of(&other);
        assert!(
            r.balanced.is_none()
                && r.announcing(hostlb_api::annotations::ANNOUNCING_IPV4)
                    .is_none()
        );
        let mut errors = Vec::new();
        assert_eq!(
            service_info(
                &r,
                &Scope::default(),
                &EndpointIndex::default(),
                &mut errors
            ),
            None
        );

        let mut bad = svc.clone();
        bad.status
            .as_mut()
            .unwrap()
            .load_balancer
            .as_mut()
            .unwrap()
            .ingress
            .as_mut()
            .unwrap()[1]
            .ip = Some("ten".into());
        service_info(
            &ServiceRecord::of(&bad),
            &Scope::default(),
            &EndpointIndex::default(),
            &mut errors,
        );
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].object, "Service/shop/web");
        assert!(
            errors[0].message.contains("ingress[1].ip"),
            "{}",
            errors[0].message
        );
    }
}
