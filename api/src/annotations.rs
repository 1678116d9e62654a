//! Names on Services and Nodes that hostlb reads or writes (SPEC §3).
//!
//! Users may still carry MetalLB's annotations; [`service_annotation`] reads
//! them with hostlb's own form taking precedence, so Services migrate unchanged.

use std::collections::BTreeMap;

/// Requests a pool by name (user).
pub const ADDRESS_POOL: &str = "hostlb.io/address-pool";
/// Requests addresses, comma separated, at most one per family (user).
pub const LOAD_BALANCER_IPS: &str = "hostlb.io/loadBalancerIPs";
/// Sharing key: Services with the same key may share an address (user).
pub const ALLOW_SHARED_IP: &str = "hostlb.io/allow-shared-ip";
/// The pool the allocator took the Service's addresses from (allocator).
pub const IP_ALLOCATED_FROM_POOL: &str = "hostlb.io/ip-allocated-from-pool";
/// The Service status condition whose message holds the sharing terms
/// (key, ports, traffic policy) a shared address was given under
/// (allocator). After a restart two Services may claim one address on
/// terms that no longer match; the one whose terms still equal what it was
/// given under keeps it, the edited one is refused. A status condition, not
/// an annotation: whoever may edit a Service may write its annotations,
/// but only the allocator writes its status.
pub const SHARING_GRANTED: &str = "hostlb.io/SharingGranted";
/// `NODE,INTERFACE` of the agent answering for the IPv4 address (agent).
pub const ANNOUNCING_IPV4: &str = "hostlb.io/announcing-IPv4";
/// `NODE,INTERFACE` of the agent answering for the IPv6 address (agent).
pub const ANNOUNCING_IPV6: &str = "hostlb.io/announcing-IPv6";
/// The nodes holding the IPv4 address on their virtual interface for
/// routing software to export (agent): `NODE,NODE,...` by name. Every one
/// of them is a next hop, so it is a set, apart from the one-node
/// `announcing-IPv4`; an address can have both when some nodes have it
/// on-link and others not.
pub const ANNOUNCING_VIRTUAL_IPV4: &str = "hostlb.io/announcing-virtual-IPv4";
/// As [`ANNOUNCING_VIRTUAL_IPV4`], for the IPv6 address.
pub const ANNOUNCING_VIRTUAL_IPV6: &str = "hostlb.io/announcing-virtual-IPv6";
/// Names listed in a virtual annotation at most; more are counted
/// (`,+N more`), so that a Cluster-policy VIP on 1,000 nodes stays a
/// short value.
pub const VIRTUAL_NODES_LISTED: usize = 32;

/// The longest value an agent writes to `announcing-IPv4`/`-IPv6`: the
/// longest node name (a DNS subdomain, 253), a comma, the longest
/// interface name (15). The Service policy (`deploy/agent/policy.yaml`)
/// refuses longer ones.
pub const ANNOUNCING_MAX: usize = 253 + 1 + 15;
/// The longest value of a virtual announcing annotation:
/// [`VIRTUAL_NODES_LISTED`] of the longest node names and the count of the
/// rest, with room to spare; the policy refuses longer ones.
pub const ANNOUNCING_VIRTUAL_MAX: usize = 8_200;

/// The announcing annotation of `family`: the one node answering on its
/// LAN, or (`routed`) the nodes holding it for routing software.
pub fn announcing(family: crate::Family, routed: bool) -> &'static str {
    match (family, routed) {
        (crate::Family::V4, false) => ANNOUNCING_IPV4,
        (crate::Family::V6, false) => ANNOUNCING_IPV6,
        (crate::Family::V4, true) => ANNOUNCING_VIRTUAL_IPV4,
        (crate::Family::V6, true) => ANNOUNCING_VIRTUAL_IPV6,
    }
}

/// The value of a virtual announcing annotation for `nodes` (sorted here).
pub fn virtual_value<S: AsRef<str>>(nodes: &[S]) -> String {
    let mut names: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
    names.sort_unstable();
    let more = names.len().saturating_sub(VIRTUAL_NODES_LISTED);
    names.truncate(VIRTUAL_NODES_LISTED);
    let mut value = names.join(",");
    if more > 0 {
        value.push_str(&format!(",+{more} more"));
    }
    value
}

/// The `spec.loadBalancerClass` hostlb handles by default, besides no class.
pub const DEFAULT_LOAD_BALANCER_CLASS: &str = "hostlb.io/lb";
/// Nodes carrying this label (any value) never announce.
pub const EXCLUDE_FROM_EXTERNAL_LB: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";
/// On a Service whose addresses are placed sticky: while it is there, they
/// are placed as `Preferred` and move, make before break, to the nodes the
/// election ranks first. `kubectl hostlb rebalance` sets it, waits for the
/// moves, and takes it away; its value is when it was set (RFC 3339), for
/// the operator who finds one left behind.
pub const REBALANCE: &str = "hostlb.io/rebalance";
/// The namespace holding pools and advertisements.
pub const SYSTEM_NAMESPACE: &str = "hostlb-system";
/// Kubernetes' taint for a node shut down or out of service (any effect):
/// its agent drains it, as `spec.drain` would, while the taint is there.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// Whether `node` carries [`OUT_OF_SERVICE_TAINT`]. The agent drains its
/// own node by it and `kubectl hostlb explain` names it, so both read it
/// here.
pub fn out_of_service(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT))
}

/// Whether `node` is cordoned (`spec.unschedulable`): drained for the
/// addresses of advertisements with `drainCordonedNodes`. The agents elect
/// by it and `kubectl hostlb explain` names it, so both read it here.
pub fn cordoned(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// MetalLB prefixes accepted for the user-set annotations, newest first.
const MIGRATED_PREFIXES: [&str; 2] = ["metallb.io/", "metallb.universe.tf/"];

/// Event reasons.
pub mod reasons {
    pub const IP_ALLOCATED: &str = "IPAllocated";
    pub const ALLOCATION_FAILED: &str = "AllocationFailed";
    pub const ANNOUNCING_LOCAL: &str = "AnnouncingLocal";
    pub const ANNOUNCING_VIRTUAL: &str = "AnnouncingVirtual";
    pub const WITHDRAWN: &str = "Withdrawn";
    /// An IPAddressPool or L2Advertisement edit that cannot be used.
    pub const INVALID_CONFIG: &str = "InvalidConfig";
    /// A VIP no hostlb node held yet, not added because a host that is no
    /// hostlb node answered for it when asked first.
    pub const ADDRESS_IN_USE: &str = "AddressInUse";
    /// A VIP held here that a host that is no hostlb node answers for too.
    pub const ADDRESS_CONFLICT: &str = "AddressConflict";
    /// A VIP that moved to the node writing it: from which node, why, and
    /// how long it may have been dark.
    pub const MOVED: &str = "Moved";
}

/// Read a hostlb annotation, falling back to MetalLB's `metallb.io/` and then
/// `metallb.universe.tf/` forms of the same name.
pub fn service_annotation<'a>(
    annotations: Option<&'a BTreeMap<String, String>>,
    name: &str,
) -> Option<&'a str> {
    let annotations = annotations?;
    if let Some(v) = annotations.get(name) {
        return Some(v);
    }
    let suffix = name.strip_prefix("hostlb.io/")?;
    MIGRATED_PREFIXES
        .iter()
        .find_map(|p| annotations.get(&format!("{p}{suffix}")))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_virtual_value_names_its_nodes_sorted_and_counts_the_rest() {
        assert_eq!(virtual_value(&["node-c", "node-a"]), "node-a,node-c");
        assert_eq!(virtual_value::<&str>(&[]), "");
        let many: Vec<String> = (0..100).map(|i| format!("n{i:03}")).collect();
        let v = virtual_value(&many);
        assert!(v.starts_with("n000,n001,"), "{v}");
        assert!(v.ends_with(",n031,+68 more"), "{v}");
        assert_eq!(v.split(',').count(), VIRTUAL_NODES_LISTED + 1);
    }

    /// What an agent writes fits the caps, and the caps are the policy's:
    /// the longest names, and a million of them in a virtual value.
    #[test]
    fn the_longest_values_fit_the_policys_caps() {
        let node = "n".repeat(253);
        let local = format!("{node},{}", "i".repeat(15));
        assert_eq!(local.len(), ANNOUNCING_MAX);
        let many: Vec<String> = (0..1_000_000)
            .map(|i| format!("{node:.246}{i:07}"))
            .collect();
        assert!(virtual_value(&many).len() <= ANNOUNCING_VIRTUAL_MAX);
        for policy in ["policy.yaml", "policy-v1beta1.yaml"] {
            let path = format!("{}/../deploy/agent/{policy}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap();
            let cap = format!("? {ANNOUNCING_VIRTUAL_MAX} : {ANNOUNCING_MAX})");
            assert!(text.contains(&cap), "{policy} caps at {cap}");
        }
    }

    #[test]
    fn hostlb_form_wins_then_metallb_io_then_universe() {
        let mut a = BTreeMap::new();
        assert_eq!(service_annotation(Some(&a), ADDRESS_POOL), None);
        a.insert(
            "metallb.universe.tf/address-pool".to_string(),
            "old".to_string(),
        );
        assert_eq!(service_annotation(Some(&a), ADDRESS_POOL), Some("old"));
        a.insert("metallb.io/address-pool".to_string(), "new".to_string());
        assert_eq!(service_annotation(Some(&a), ADDRESS_POOL), Some("new"));
        a.insert(ADDRESS_POOL.to_string(), "ours".to_string());
        assert_eq!(service_annotation(Some(&a), ADDRESS_POOL), Some("ours"));
        assert_eq!(service_annotation(None, ADDRESS_POOL), None);
    }
}
