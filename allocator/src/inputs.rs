//! Kubernetes objects to engine inputs: Services to [`ServiceRequest`]s,
//! IPAddressPools to [`PoolSpec`]s. Shared by the controller and `plan`, so
//! both read objects the same way.

use std::net::IpAddr;

use hostlb_api::annotations::{
    ADDRESS_POOL, ALLOW_SHARED_IP, IP_ALLOCATED_FROM_POOL, LOAD_BALANCER_IPS, service_annotation,
};
use hostlb_api::{Family, IPAddressPool};
use k8s_openapi::api::core::v1::Service;

use crate::engine::{
    AllocationSpec, Backend, FamilyPolicy, Labels, PoolSpec, Port, ServiceRequest,
};

pub use hostlb_api::Scope;

pub fn service_key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

fn parse_family(s: &str) -> Option<Family> {
    match s {
        "IPv4" => Some(Family::V4),
        "IPv6" => Some(Family::V6),
        _ => None,
    }
}

/// The addresses a Service asks for: `hostlb.io/loadBalancerIPs` (or its
/// MetalLB forms), else `spec.loadBalancerIP`. Both set, with the field's
/// address not among the annotation's, is an error naming both: which one
/// was meant is not ours to guess.
fn requested(svc: &Service) -> Result<Vec<IpAddr>, String> {
    let annotations = svc.metadata.annotations.as_ref();
    let field = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_ip.clone())
        .filter(|ip| !ip.is_empty());
    let (source, list) = match (service_annotation(annotations, LOAD_BALANCER_IPS), &field) {
        (Some(v), _) => (LOAD_BALANCER_IPS, v.to_string()),
        (None, Some(ip)) => ("spec.loadBalancerIP", ip.clone()),
        (None, None) => return Ok(Vec::new()),
    };
    let mut out: Vec<IpAddr> = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let ip: IpAddr = part
            .parse()
            .map_err(|_| format!("{source}: {part:?} is not an IP address"))?;
        if let Some(other) = out.iter().find(|x| Family::of(**x) == Family::of(ip)) {
            return Err(format!(
                "{source}: more than one {} address ({other}, {ip}); give at most one per family",
                Family::of(ip)
            ));
        }
        out.push(ip);
    }
    if source == LOAD_BALANCER_IPS
        && let Some(f) = field
        && !f.parse::<IpAddr>().is_ok_and(|ip| out.contains(&ip))
    {
        return Err(format!(
            "{LOAD_BALANCER_IPS} ({}) and spec.loadBalancerIP ({f}) differ; set one of them",
            list.trim()
        ));
    }
    Ok(out)
}

/// The Service as the engine sees it.
pub fn service_request(svc: &Service) -> ServiceRequest {
    let spec = svc.spec.clone().unwrap_or_default();
    let annotations = svc.metadata.annotations.as_ref();
    let primary = spec
        .ip_families
        .as_ref()
        .and_then(|f| f.first())
        .and_then(|f| parse_family(f))
        .or_else(|| {
            spec.cluster_ips
                .iter()
                .flatten()
                .chain(spec.cluster_ip.iter())
                .find_map(|ip| ip.parse::<IpAddr>().ok())
                .map(Family::of)
        });
    let families: Vec<Family> = spec
        .ip_families
        .iter()
        .flatten()
        .filter_map(|f| parse_family(f))
        .collect();
    let policy = match spec.ip_family_policy.as_deref() {
        Some("PreferDualStack") => FamilyPolicy::PreferDualStack,
        Some("RequireDualStack") => FamilyPolicy::RequireDualStack,
        _ => FamilyPolicy::SingleStack,
    };
    let selector = spec.selector.as_ref().filter(|s| !s.is_empty());
    let backend = match (spec.external_traffic_policy.as_deref(), selector) {
        (Some("Local"), Some(sel)) => Backend::Local(
            sel.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
        ),
        (Some("Local"), None) => Backend::LocalUnselected,
        _ => Backend::Cluster,
    };
    let ports = spec
        .ports
        .iter()
        .flatten()
        .map(|p| Port {
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            port: p.port,
        })
        .collect();
    let current = ingress_ips(svc);
    let (requested, request_error) = match requested(svc) {
        Ok(v) => (v, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    ServiceRequest {
        key: service_key(svc),
        namespace: svc.metadata.namespace.clone().unwrap_or_default(),
        labels: svc.metadata.labels.clone().unwrap_or_default(),
        created: svc
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second()),
        primary,
        policy,
        families,
        requested,
        request_error,
        requested_pool: service_annotation(annotations, ADDRESS_POOL).map(str::to_string),
        sharing_key: service_annotation(annotations, ALLOW_SHARED_IP).map(str::to_string),
        backend,
        ports,
        current,
        current_pool: service_annotation(annotations, IP_ALLOCATED_FROM_POOL).map(str::to_string),
        granted_terms: granted_terms(svc),
    }
}

/// The sharing terms the Service's address was given under, from the
/// allocator's status condition ([`SHARING_GRANTED`]).
pub fn granted_terms(svc: &Service) -> Option<String> {
    svc.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == hostlb_api::annotations::SHARING_GRANTED && c.status == "True")
        .map(|c| c.message.clone())
}

/// The addresses in `status.loadBalancer.ingress` (hostnames and entries
/// that do not parse are not addresses anyone can hold).
pub fn ingress_ips(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

pub fn pool_spec(p: &IPAddressPool) -> PoolSpec {
    PoolSpec {
        name: p.metadata.name.clone().unwrap_or_default(),
        created: p
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second()),
        addresses: p.addresses_in_force().0.to_vec(),
        auto_assign: p.spec.auto_assign,
        avoid_buggy_ips: p.spec.avoid_buggy_ips,
        share_across_namespaces: p.spec.share_across_namespaces,
        service_allocation: p.spec.service_allocation.as_ref().map(|a| AllocationSpec {
            priority: a.priority,
            namespaces: a.namespaces.clone(),
            namespace_selectors: a.namespace_selectors.clone(),
            service_selectors: a.service_selectors.clone(),
        }),
    }
}

pub fn namespace_labels(ns: &k8s_openapi::api::core::v1::Namespace) -> (String, Labels) {
    (
        ns.metadata.name.clone().unwrap_or_default(),
        ns.metadata.labels.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn reads_every_input_of_a_service() {
        let s = svc(json!({
            "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"},
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": {"hostlb.io/loadBalancerIPs": "10.0.0.5, fd00::5",
                                         "metallb.universe.tf/address-pool": "old",
                                         "hostlb.io/address-pool": "new",
                                         "metallb.io/allow-shared-ip": "dns",
                                         "hostlb.io/ip-allocated-from-pool": "new"}},
            "spec": {"type": "LoadBalancer", "ipFamilies": ["IPv6", "IPv4"], "ipFamilyPolicy": "RequireDualStack",
                     "externalTrafficPolicy": "Local", "selector": {"b": "2", "a": "1"},
                     "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.5"}, {"hostname": "x"}, {"ip": "junk"}]}}
        }));
        let r = service_request(&s);
        assert_eq!(r.key, "shop/web");
        assert_eq!(r.created, Some(1767225600));
        assert_eq!(r.primary, Some(Family::V6));
        assert_eq!(r.policy, FamilyPolicy::RequireDualStack);
        assert_eq!(
            r.requested,
            vec![
                "10.0.0.5".parse::<IpAddr>().unwrap(),
                "fd00::5".parse().unwrap()
            ]
        );
        assert_eq!(r.requested_pool.as_deref(), Some("new"), "hostlb form wins");
        assert_eq!(
            r.sharing_key.as_deref(),
            Some("dns"),
            "MetalLB form honoured"
        );
        assert_eq!(r.backend, Backend::Local("a=1,b=2".into()));
        assert_eq!(r.ports.len(), 2);
        assert_eq!(r.ports[1].protocol, "TCP");
        assert_eq!(r.current, vec!["10.0.0.5".parse::<IpAddr>().unwrap()]);
        assert_eq!(r.current_pool.as_deref(), Some("new"));
    }

    #[test]
    fn traffic_policy_and_selector_make_the_backend() {
        let backend = |spec: serde_json::Value| {
            service_request(&svc(
                json!({"metadata": {"name": "s", "namespace": "d"}, "spec": spec}),
            ))
            .backend
        };
        assert_eq!(backend(json!({"selector": {"app": "x"}})), Backend::Cluster);
        assert_eq!(
            backend(json!({"externalTrafficPolicy": "Local", "selector": {"app": "x"}})),
            Backend::Local("app=x".into())
        );
        assert_eq!(
            backend(json!({"externalTrafficPolicy": "Local"})),
            Backend::LocalUnselected
        );
        assert_eq!(
            backend(json!({"externalTrafficPolicy": "Local", "selector": {}})),
            Backend::LocalUnselected,
            "an empty selector selects nothing either"
        );
    }

    #[test]
    fn requested_address_errors_and_fallbacks() {
        let with = |ann: serde_json::Value, lb_ip: Option<&str>| {
            let mut spec = json!({"type": "LoadBalancer", "clusterIP": "fd00:96::1"});
            if let Some(ip) = lb_ip {
                spec["loadBalancerIP"] = json!(ip);
            }
            service_request(&svc(
                json!({"metadata": {"name": "s", "namespace": "d", "annotations": ann}, "spec": spec}),
            ))
        };
        let r = with(json!({}), Some("10.0.0.9"));
        assert_eq!(r.requested, vec!["10.0.0.9".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            r.primary,
            Some(Family::V6),
            "family from clusterIP when ipFamilies is unset"
        );
        let r = with(
            json!({"hostlb.io/loadBalancerIPs": "10.0.0.1,10.0.0.2"}),
            None,
        );
        assert_eq!(
            r.request_error.as_deref(),
            Some(
                "hostlb.io/loadBalancerIPs: more than one IPv4 address (10.0.0.1, 10.0.0.2); give at most one per family"
            )
        );
        let r = with(json!({}), Some("10.0.0.x"));
        assert_eq!(
            r.request_error.as_deref(),
            Some("spec.loadBalancerIP: \"10.0.0.x\" is not an IP address")
        );
        let r = with(
            json!({"metallb.universe.tf/loadBalancerIPs": "10.0.0.3"}),
            Some("10.0.0.4"),
        );
        assert_eq!(
            r.request_error.as_deref(),
            Some(
                "hostlb.io/loadBalancerIPs (10.0.0.3) and spec.loadBalancerIP (10.0.0.4) differ; set one of them"
            ),
            "no silent choice between the two"
        );
        let r = with(
            json!({"hostlb.io/loadBalancerIPs": "10.0.0.3,fd00::3"}),
            Some("10.0.0.3"),
        );
        assert_eq!(r.request_error, None, "the same address in both is fine");
        assert_eq!(r.requested.len(), 2);
    }
}
