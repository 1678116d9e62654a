//! The `hostlb.io/v1` custom resources (SPEC §2).
//!
//! Field names and meanings follow MetalLB's `metallb.io/v1beta1` objects of
//! the same kind so a MetalLB manifest migrates by changing `apiVersion`.
//! The schema is generated from these types; `deploy/crds/` holds the result.

// `printcolumn(...)` repeats `type_ = ...` by design; clippy reads it as a duplicate.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::selector::{LabelSelector, Selector, parse_list};

pub const GROUP: &str = "hostlb.io";
pub const VERSION: &str = "v1";

/// Condition types on pools and advertisements.
pub mod conditions {
    /// The object is valid and in use.
    pub const READY: &str = "Ready";
    /// Some entry or selector cannot be used; the message says which.
    pub const INVALID: &str = "Invalid";
    /// The pool overlaps an older pool and is not used for allocation.
    pub const OVERLAPS: &str = "Overlaps";
    /// Hosts that are no hostlb nodes answer for addresses of the pool, so
    /// the agents do not take them (the agents' records say which).
    pub const ADDRESSES_IN_USE: &str = "AddressesInUse";
}

fn default_true() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A set of addresses the allocator may hand to LoadBalancer Services.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "hostlb.io",
    version = "v1",
    kind = "IPAddressPool",
    doc = "A set of addresses the allocator may hand to LoadBalancer Services.",
    namespaced,
    status = "IPAddressPoolStatus",
    shortname = "ipp",
    category = "hostlb",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(name = "Addresses", type_ = "string", json_path = ".spec.addresses"),
    printcolumn(
        name = "Auto Assign",
        type_ = "boolean",
        json_path = ".spec.autoAssign"
    ),
    printcolumn(
        name = "Assigned IPv4",
        type_ = "integer",
        json_path = ".status.assignedIPv4"
    ),
    printcolumn(
        name = "Assigned IPv6",
        type_ = "integer",
        json_path = ".status.assignedIPv6"
    ),
    printcolumn(
        name = "Available IPv4",
        type_ = "integer",
        json_path = ".status.availableIPv4"
    ),
    printcolumn(
        name = "Available IPv6",
        type_ = "integer",
        json_path = ".status.availableIPv6"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressPoolSpec {
    /// Addresses to hand out: CIDRs (`10.0.0.0/24`), ranges
    /// (`10.0.0.10-10.0.0.20`) or single addresses, IPv4 and IPv6 mixed.
    /// Within the pool the lowest free address is taken, in the order written.
    pub addresses: Vec<String>,
    /// When false, addresses are given only to Services that ask for this
    /// pool or for a specific address in it.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    #[schemars(extend("default" = true))]
    pub auto_assign: bool,
    /// Skip addresses ending in `.0` or `.255`, which some old clients drop.
    #[serde(default, rename = "avoidBuggyIPs", skip_serializing_if = "is_false")]
    pub avoid_buggy_ips: bool,
    /// Limits the pool to some namespaces or Services and orders it among
    /// other pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_allocation: Option<ServiceAllocation>,
    /// Services of different namespaces may share one of this pool's
    /// addresses when their `hostlb.io/allow-shared-ip` keys and terms
    /// agree. Off by default: a sharing key is then a namespace's own, so
    /// a tenant cannot join another tenant's address by copying its key.
    #[serde(default, skip_serializing_if = "is_false")]
    pub share_across_namespaces: bool,
}

/// Which Services a pool serves, and in what order pools are tried.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAllocation {
    /// Lower is tried first; pools without a priority come after those with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Namespaces whose Services may use the pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Namespaces, by label, whose Services may use the pool (ORed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespace_selectors: Vec<LabelSelector>,
    /// Services, by label, that may use the pool (ORed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_selectors: Vec<LabelSelector>,
}

/// Written by the allocator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IPAddressPoolStatus {
    #[serde(default, rename = "assignedIPv4")]
    pub assigned_ipv4: i64,
    #[serde(default, rename = "assignedIPv6")]
    pub assigned_ipv6: i64,
    /// Saturates at the largest int64 for very large IPv6 pools.
    #[serde(default, rename = "availableIPv4")]
    pub available_ipv4: i64,
    /// Saturates at the largest int64 for very large IPv6 pools.
    #[serde(default, rename = "availableIPv6")]
    pub available_ipv6: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// `spec.addresses` as last written without an error, recorded by the
    /// allocator. While an edit leaves an entry that does not parse, these
    /// stay in force for the allocator and every agent alike, so a typo
    /// takes no address away.
    #[serde(
        default,
        rename = "lastValidAddresses",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_valid_addresses: Option<Vec<String>>,
}

/// What is kept in force while an edit cannot be used, said after the
/// problem in conditions, Events and logs.
pub const LAST_VALID_KEPT: &str = "; the last valid form stays in force";

impl IPAddressPool {
    /// Each entry of `spec.addresses` that does not parse, in Kubernetes'
    /// words; an empty list is a problem too.
    pub fn address_problems(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .spec
            .addresses
            .iter()
            .enumerate()
            .filter_map(|(i, a)| {
                crate::AddressRange::parse(a)
                    .err()
                    .map(|e| format!("spec.addresses[{i}]: {e}"))
            })
            .collect();
        if self.spec.addresses.is_empty() {
            out.push("spec.addresses is empty".to_string());
        }
        out
    }

    /// The address entries both binaries use: the spec's while they all
    /// parse; else the last valid ones the allocator recorded, if any
    /// (`true`: kept); else the spec's, whose valid entries are used.
    pub fn addresses_in_force(&self) -> (&[String], bool) {
        let last = self
            .status
            .as_ref()
            .and_then(|s| s.last_valid_addresses.as_deref());
        match last {
            Some(last) if !self.address_problems().is_empty() => (last, true),
            _ => (&self.spec.addresses, false),
        }
    }
}

/// Announces the addresses of some pools on the local network: one node per
/// address answers ARP/ND for it.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "hostlb.io",
    version = "v1",
    kind = "L2Advertisement",
    doc = "Announces the addresses of some pools on the local network: one node per address answers ARP/ND for it.",
    namespaced,
    status = "L2AdvertisementStatus",
    shortname = "l2ad",
    category = "hostlb",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(
        name = "IPAddressPools",
        type_ = "string",
        json_path = ".spec.ipAddressPools"
    ),
    printcolumn(
        name = "IPAddressPool Selectors",
        type_ = "string",
        json_path = ".spec.ipAddressPoolSelectors"
    ),
    printcolumn(name = "Interfaces", type_ = "string", json_path = ".spec.interfaces"),
    printcolumn(
        name = "Node Selectors",
        type_ = "string",
        json_path = ".spec.nodeSelectors",
        priority = "10"
    ),
    printcolumn(
        name = "Preferred Nodes",
        type_ = "string",
        json_path = ".spec.preferredNodeSelectors",
        priority = "10"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct L2AdvertisementSpec {
    /// Pools, by name, whose addresses this advertisement announces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_address_pools: Vec<String>,
    /// Pools, by label, whose addresses this advertisement announces (ORed
    /// with `ipAddressPools`). With neither set, every pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_address_pool_selectors: Vec<LabelSelector>,
    /// Nodes that may announce (ORed); empty means every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_selectors: Vec<LabelSelector>,
    /// Services this advertisement applies to (ORed); empty means every Service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_selectors: Vec<LabelSelector>,
    /// Announce only on these interfaces; empty means the default-route interface.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
    /// Soft preferences: among eligible nodes, those matching score the
    /// weight and are elected first; the others remain failover candidates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred_node_selectors: Vec<PreferredNodeSelector>,
    /// A cordoned node (`spec.unschedulable`, `kubectl cordon`) counts as
    /// drained for this advertisement's addresses: elected after every
    /// node that is not, so they leave it make before break, and stay
    /// only where no other node can serve them. Off by default: a cordon
    /// stops new pods, not the traffic to the ones that run.
    #[serde(default, skip_serializing_if = "is_false")]
    pub drain_cordoned_nodes: bool,
    /// Where each address stays: `Preferred` (the default) moves it to
    /// the node the election ranks first whenever that node can serve it,
    /// as when a preferred node comes back; `Sticky` leaves it with the
    /// node that holds it while that node can serve it, and moves it only
    /// when the holder cannot (gone, drained, tainted, its gateway lost)
    /// or an operator asks (`kubectl hostlb rebalance`). Every move back
    /// is an interruption its clients did not choose.
    #[serde(default, skip_serializing_if = "Placement::is_preferred")]
    pub placement: Placement,
}

/// How an address is placed once held (`L2Advertisement.spec.placement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Placement {
    /// On the election's first node, moving there whenever it can serve.
    #[default]
    Preferred,
    /// With its holder while the holder can serve it.
    Sticky,
}

impl Placement {
    fn is_preferred(&self) -> bool {
        *self == Placement::Preferred
    }
}

impl L2AdvertisementSpec {
    /// The preferences with weights checked (1..=100) and selectors
    /// compiled; the first problem, in Kubernetes' words, otherwise.
    pub fn preferences(&self) -> Result<Vec<(u32, Selector)>, String> {
        self.preferred_node_selectors
            .iter()
            .enumerate()
            .map(|(i, p)| {
                if !(1..=100).contains(&p.weight) {
                    return Err(format!(
                        "spec.preferredNodeSelectors[{i}].weight: Invalid value: {}: must be between 1 and 100, inclusive",
                        p.weight
                    ));
                }
                let selector = Selector::parse(&p.preference)
                    .map_err(|e| format!("spec.preferredNodeSelectors[{i}].preference: {e}"))?;
                Ok((p.weight as u32, selector))
            })
            .collect()
    }

    /// Every selector compiled, or the first problem: what makes the
    /// advertisement unusable.
    pub fn validate(&self) -> Result<(), String> {
        self.preferences()?;
        parse_list(
            "spec.ipAddressPoolSelectors",
            &self.ip_address_pool_selectors,
        )?;
        parse_list("spec.nodeSelectors", &self.node_selectors)?;
        parse_list("spec.serviceSelectors", &self.service_selectors)?;
        Ok(())
    }
}

/// A weighted soft preference, shaped like Kubernetes' `PreferredSchedulingTerm`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PreferredNodeSelector {
    /// Added to the score of each eligible node the preference matches.
    #[schemars(extend("minimum" = 1, "maximum" = 100))]
    pub weight: i32,
    /// The nodes the weight applies to; empty matches every eligible node.
    pub preference: LabelSelector,
}

/// Written by the allocator after it validates the advertisement.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct L2AdvertisementStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec as last written without an error, recorded by the
    /// allocator. While the spec cannot be used, every agent announces by
    /// this one instead, so a typo moves no VIP and all agents agree.
    #[serde(
        default,
        rename = "lastValidSpec",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_valid_spec: Option<L2AdvertisementSpec>,
}

impl L2Advertisement {
    /// The spec the agents announce by: the spec while it is valid; else
    /// the last valid one the allocator recorded (`Err` carries the
    /// problem, `Ok` whether it was kept); else the problem.
    pub fn spec_in_force(&self) -> Result<(&L2AdvertisementSpec, Option<String>), String> {
        match self.spec.validate() {
            Ok(()) => Ok((&self.spec, None)),
            Err(problem) => match self
                .status
                .as_ref()
                .and_then(|s| s.last_valid_spec.as_ref())
            {
                Some(last) if last.validate().is_ok() => Ok((last, Some(problem))),
                _ => Err(problem),
            },
        }
    }
}

/// One node agent's own record, written only by that node's agent (its
/// name is the Node's): what it runs, whether it serves, and what other
/// agents need to know of it without gossip: its gossip address and the
/// MAC addresses it answers from, so that a second owner of a VIP is
/// recognised as a hostlb node and settled even when gossip never
/// connected.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "hostlb.io",
    version = "v1",
    kind = "NodeAgent",
    doc = "One node agent's own record, written by that node's agent: what it runs, whether it serves, and how other agents reach and recognise it.",
    status = "NodeAgentStatus",
    shortname = "na",
    category = "hostlb",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "VIPs", type_ = "integer", json_path = ".status.heldVIPs"),
    printcolumn(name = "Members", type_ = "integer", json_path = ".status.members"),
    printcolumn(
        name = "Isolated",
        type_ = "boolean",
        json_path = ".status.gossipIsolated"
    ),
    printcolumn(name = "Drain", type_ = "boolean", json_path = ".spec.drain"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(name = "Changed", type_ = "date", json_path = ".status.lastChangeTime"),
    printcolumn(
        name = "Heartbeat",
        type_ = "date",
        json_path = ".status.heartbeatTime"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.reason",
        priority = "10"
    )
)]
pub struct NodeAgentSpec {
    /// Move every VIP off this node, make-before-break, and keep them off
    /// (`kubectl hostlb drain`, `lbnodeagent drain`): the node still runs
    /// and answers until each new owner holds, and wins only VIPs that no
    /// other node can serve. The one field of the record that is an order,
    /// and only to its own node: an agent's credential writes no other
    /// record.
    #[serde(default, skip_serializing_if = "is_false")]
    pub drain: bool,
}

/// Written by the node's agent on every change (at most one write every few
/// seconds) and at least once a minute.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeAgentStatus {
    /// When the agent last wrote; three minutes older than now, the agent
    /// is taken as not running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// When what the record says last changed, the heartbeat aside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_change_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// The agent's release.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// The gossip protocol the agent speaks: agents one protocol apart work
    /// together, so a fleet mid-upgrade shows two values and no more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u32>,
    /// A hash of the configuration in force (12 hex digits of SHA-256):
    /// agents configured alike show the same one, the node name aside.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub config_hash: String,
    /// `Starting`, `Ready` or `Degraded` (see `reason`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
    /// Why the agent is not ready, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Where the agent gossips (`ip:port`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gossip_address: String,
    /// The node's own public key (`ed25519:` and base64), made by its
    /// agent: peers count the node's beats and gossip state only under it.
    /// Only this node's credential may write this record, so no other host
    /// can speak for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// The MAC addresses of the node's interfaces: a VIP answered from one
    /// of them is this node's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub macs: Vec<String>,
    /// Other nodes run agents (their records are fresh) and gossip has
    /// reached none of them: this agent acts as if partitioned.
    #[serde(default, skip_serializing_if = "is_false")]
    pub gossip_isolated: bool,
    /// Live gossip members this agent sees, itself included.
    #[serde(default)]
    pub members: i64,
    /// Their names, the first 256 by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub member_names: Vec<String>,
    /// A hash of all their names (12 hex digits of SHA-256): agents that
    /// see the same members show the same one, however many there are.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub members_hash: String,
    /// The agent runs virtual mode (off-link VIPs on its virtual interface).
    #[serde(default, skip_serializing_if = "is_false")]
    pub virtual_mode: bool,
    /// The drain of `spec.drain` is in force: the agent gossips it and
    /// every member elects by it (an agent of an older protocol in the
    /// cluster holds it off).
    #[serde(default, skip_serializing_if = "is_false")]
    pub drained: bool,
    /// The node's interfaces with an on-link prefix or a MAC.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<NodeAgentInterface>,
    /// VIPs this node holds.
    #[serde(default, rename = "heldVIPs")]
    pub held_vips: i64,
    /// The first 64 of them.
    #[serde(default, rename = "vips", skip_serializing_if = "Vec::is_empty")]
    pub vips: Vec<String>,
    /// Objects this agent left out as unusable, with the reason (the
    /// first 32).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invalid_objects: Vec<String>,
    /// The last time another host answered for a VIP held here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_conflict: Option<NodeAgentConflict>,
    /// The last VIPs that moved to this node from another since its agent
    /// started, oldest first (at most 8).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_moves: Vec<NodeAgentMove>,
}

/// A VIP that moved to the node writing the record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeAgentMove {
    pub address: String,
    /// The node that held it before.
    pub from: String,
    /// Why: `host-gone`, `stalled`, `shutdown`, `drain`, `cordon`,
    /// `upstream`, `not-a-candidate` or `preference`.
    pub cause: String,
    /// For a host gone or stalled: from its last beat to this node holding
    /// the address, the longest no host may have answered. Absent for a
    /// planned move (make before break).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dark_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// One interface of a node, as its agent sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeAgentInterface {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// On-link prefixes (CIDR), from the main routing table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
    /// The default-route interface of a family: where advertisements
    /// without `interfaces` put their VIPs.
    #[serde(default, skip_serializing_if = "is_false")]
    pub announce: bool,
}

/// A second host answering for a VIP held here.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeAgentConflict {
    pub address: String,
    pub mac: String,
    /// The hostlb node whose MAC it is; none for a host configured by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// What this node did: `kept`, `yielded`, `reported`, or `not-taken`
    /// (a new VIP another host answered for when asked first).
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// An agent writes its record at least this often.
pub const NODE_AGENT_HEARTBEAT_SECS: i64 = 60;
/// A record not written for this long is an agent that does not run.
pub const NODE_AGENT_STALE_SECS: i64 = 3 * NODE_AGENT_HEARTBEAT_SECS;
/// How far ahead of the reader's clock a heartbeat may be and still count:
/// hosts run NTP, and a minute covers a bad day.
pub const HEARTBEAT_SKEW_SECS: i64 = 60;

impl NodeAgent {
    /// The record stands for an agent that runs now: not `Stopped`, and
    /// written within [`NODE_AGENT_STALE_SECS`]. A heartbeat from the
    /// future (beyond clock skew) is a forged or broken record, not one
    /// fresh forever.
    pub fn fresh(&self, now: jiff::Timestamp) -> bool {
        let Some(status) = &self.status else {
            return false;
        };
        status.state != "Stopped"
            && status.heartbeat_time.as_ref().is_some_and(|t| {
                let age = now.duration_since(t.0).as_secs();
                age > -HEARTBEAT_SKEW_SECS && age < NODE_AGENT_STALE_SECS
            })
    }
}

/// New VIPs an agent did not take because a host that is no hostlb node
/// answered for them (its record's last conflict, `not-taken`), that no
/// running agent holds now: address, with the agent that asked and the
/// MAC that answered. What `kubectl hostlb` reports and the allocator
/// puts on the pool.
pub fn addresses_in_use(
    records: &[NodeAgent],
    now: jiff::Timestamp,
) -> std::collections::BTreeMap<String, (String, String)> {
    let held = |address: &str| {
        records.iter().any(|a| {
            a.fresh(now)
                && a.status
                    .as_ref()
                    .is_some_and(|s| s.vips.iter().any(|v| v == address))
        })
    };
    records
        .iter()
        .filter_map(|a| {
            let c = a.status.as_ref()?.last_conflict.as_ref()?;
            (c.outcome == "not-taken" && !held(&c.address)).then(|| {
                (
                    c.address.clone(),
                    (a.metadata.name.clone().unwrap_or_default(), c.mac.clone()),
                )
            })
        })
        .collect()
}
