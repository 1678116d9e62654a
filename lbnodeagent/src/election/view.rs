//! What the election is computed from: plain values, already validated.
//!
//! The agent builds a [`Cluster`] from its Kubernetes watches and [`Member`]s
//! from gossip; `simulate` builds the same from YAML files. Objects that could
//! not be parsed never get here: the conversion reports them and leaves them
//! out, so everything in a view is usable.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use hostlb_api::{AddressRange, Prefix, Selector};

use super::node::NodeName;

pub type Labels = BTreeMap<String, String>;

/// The cluster objects the election reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cluster {
    pub nodes: Vec<NodeInfo>,
    pub pools: Vec<Pool>,
    pub advertisements: Vec<Advertisement>,
    pub services: Vec<ServiceInfo>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: Labels,
    /// The Node condition `NetworkUnavailable` is `True`.
    pub network_unavailable: bool,
    /// `status.addresses` that are IP addresses: never firewalled, even
    /// when a pool wrongly holds one.
    pub addresses: Vec<IpAddr>,
    /// `spec.unschedulable`: drained for the addresses of advertisements
    /// that say so ([`Advertisement::drain_cordoned`]).
    pub cordoned: bool,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pool {
    pub name: String,
    pub labels: Labels,
    /// Creation time in seconds; when pools overlap, the older one owns the
    /// addresses they share.
    pub created: Option<i64>,
    pub ranges: Vec<AddressRange>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Advertisement {
    pub name: String,
    /// Pools by name.
    pub pools: Vec<String>,
    /// Pools by label (ORed with `pools`); with neither, every pool.
    pub pool_selectors: Vec<Selector>,
    /// Hard eligibility (ORed); empty means every node.
    pub node_selectors: Vec<Selector>,
    /// Which Services (ORed); empty means every Service.
    pub service_selectors: Vec<Selector>,
    /// Announce only on these interfaces; empty means the announce interface.
    pub interfaces: Vec<String>,
    pub preferences: Vec<Preference>,
    /// Cordoned nodes count as drained for its addresses.
    pub drain_cordoned: bool,
    /// `placement: Sticky`: an address stays with the node that holds it
    /// while that node is a candidate (see [`Election::set_holders`](super::Election::set_holders)).
    pub sticky: bool,
}

/// `preferredNodeSelectors` entry, weight already checked to be 1..=100.
#[derive(Clone, Debug, PartialEq)]
pub struct Preference {
    pub weight: u32,
    pub selector: Selector,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceInfo {
    /// `namespace/name`.
    pub key: String,
    pub labels: Labels,
    /// Creation time in seconds; the oldest Service sharing an address gives
    /// the Service-side inputs of its election.
    pub created: Option<i64>,
    /// The LoadBalancer addresses in status, each elected separately.
    pub addresses: Vec<IpAddr>,
    /// `hostlb.io/ip-allocated-from-pool`.
    pub allocated_pool: Option<String>,
    /// `externalTrafficPolicy: Local`.
    pub local_traffic: bool,
    /// `hostlb.io/rebalance`: its sticky addresses are placed as preferred
    /// while it is set.
    pub rebalance: bool,
    pub endpoints: Endpoints,
    /// `spec.ports`: what the agent's firewall lets through to the
    /// addresses.
    pub ports: Vec<ServicePort>,
}

/// A port a Service serves on its addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePort {
    pub protocol: Protocol,
    pub port: u16,
}

/// The transport protocols a Service port can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// As Kubernetes spells it (`spec.ports[].protocol`, `TCP` when unset).
    pub fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// As nftables spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl ServiceInfo {
    /// Oldest first, then by name, so every node orders Services the same way.
    pub(crate) fn age_key(&self) -> (i64, &str) {
        hostlb_api::rules::age_key(self.created, &self.key)
    }
}

/// Where a Service has usable endpoints (EndpointSlice `ready` unset or true,
/// or `serving` true).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Endpoints {
    /// Some usable endpoint exists, wherever it runs.
    pub any_usable: bool,
    /// Nodes running a usable endpoint.
    pub nodes: BTreeSet<String>,
}

impl Endpoints {
    /// Usable endpoints on the given nodes.
    pub fn on<'a>(nodes: impl IntoIterator<Item = &'a str>) -> Self {
        let nodes: BTreeSet<String> = nodes.into_iter().map(str::to_string).collect();
        Endpoints {
            any_usable: !nodes.is_empty(),
            nodes,
        }
    }
}

/// A live gossip member: an agent that is running now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Equals the Kubernetes Node name.
    pub node: NodeName,
    /// Shutting down: never a candidate, even before it disappears.
    pub leaving: bool,
    /// Drained by its operator (`kubectl hostlb drain`): a candidate of
    /// last resort, winning only a VIP that no other node can serve, so
    /// that a drain moves everything that can move and strands nothing.
    pub drained: bool,
    /// The agent holds off-link addresses on its virtual interface.
    pub virtual_mode: bool,
    /// Shared with the gossip view it came from.
    pub on_link: Arc<[OnLink]>,
}

impl Member {
    /// A live member with the given on-link prefixes on its announce interface.
    pub fn alive(node: &str, prefixes: impl IntoIterator<Item = Prefix>) -> Self {
        Member {
            node: node.into(),
            leaving: false,
            drained: false,
            virtual_mode: true,
            on_link: prefixes
                .into_iter()
                .map(|prefix| OnLink {
                    prefix,
                    interface: String::new(),
                    announce: true,
                    upstream_lost: false,
                })
                .collect(),
        }
    }
}

/// An on-link route prefix on one of the member's interfaces. A member
/// publishes the prefixes of every interface, not only the ones it announces
/// on: a node that has a VIP's prefix on an interface it may not announce on
/// must be known as such, or it would hold the VIP in virtual mode and its
/// kernel would answer ARP for it there.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OnLink {
    pub prefix: Prefix,
    pub interface: String,
    /// On the interface the agent announces on by default (the default-route
    /// interface or the configured one).
    pub announce: bool,
    /// The interface's default gateway of this family answered the agent's
    /// probes once and has stopped (see `agent::upstream`): the node is a
    /// candidate of last resort for the VIPs it would hold here, as if
    /// drained, so they move to a node that can forward, and stay put
    /// when no candidate can.
    pub upstream_lost: bool,
}
