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
/// The sharing terms (key, ports, traffic policy) a shared address was
/// given under (allocator). After a restart two Services may claim one
/// address on terms that no longer match; the one whose terms still equal
/// what it was given under keeps it, the edited one is refused.
pub const ALLOCATED_SHARING: &str = "hostlb.io/allocated-sharing";
/// `NODE,INTERFACE` of the agent answering for the IPv4 address (agent).
pub const ANNOUNCING_IPV4: &str = "hostlb.io/announcing-IPv4";
/// `NODE,INTERFACE` of the agent answering for the IPv6 address (agent).
pub const ANNOUNCING_IPV6: &str = "hostlb.io/announcing-IPv6";

/// The `spec.loadBalancerClass` hostlb handles by default, besides no class.
pub const DEFAULT_LOAD_BALANCER_CLASS: &str = "hostlb.io/lb";
/// Nodes carrying this label (any value) never announce.
pub const EXCLUDE_FROM_EXTERNAL_LB: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";
/// The namespace holding pools and advertisements.
pub const SYSTEM_NAMESPACE: &str = "hostlb-system";

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
