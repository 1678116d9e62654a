//! What the election says about one VIP, for people and tools: the winner,
//! every candidate in election order, and why every other node sat out.

use std::fmt;
use std::net::IpAddr;

use serde::Serialize;

use super::view::OnLink;

/// Why a node is not a candidate for a VIP. The first rule a node fails is
/// the one reported, in the order of the variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// No L2Advertisement for this VIP has `nodeSelectors` matching the node
    /// (or no advertisement selects the VIP at all).
    NotEligible,
    /// Labelled `node.kubernetes.io/exclude-from-external-load-balancers`.
    ExcludeLabel,
    /// Node condition `NetworkUnavailable` is `True`.
    NetworkUnavailable,
    /// No agent is running there (not a gossip member).
    NotLive,
    /// The agent there is shutting down.
    Leaving,
    /// `externalTrafficPolicy: Local` and no usable endpoint on the node, or
    /// no usable endpoint anywhere.
    NoReadyEndpoint,
    /// No on-link prefix of any of the node's interfaces contains the VIP,
    /// and the agent there does not hold virtual addresses.
    NotOnLink,
    /// The node has an on-link prefix containing the VIP, but only on
    /// interfaces the advertisements do not allow (`interfaces`, or not the
    /// announce interface). It neither announces nor goes virtual.
    InterfaceNotAllowed,
    /// Drained, and other nodes hold the address on their virtual
    /// interfaces. (A drained node that would announce it on a LAN stays a
    /// candidate, last in order.)
    Drained,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotEligible => "not-eligible",
            Reason::ExcludeLabel => "exclude-label",
            Reason::NetworkUnavailable => "network-unavailable",
            Reason::NotLive => "not-live",
            Reason::Leaving => "leaving",
            Reason::NoReadyEndpoint => "no-ready-endpoint",
            Reason::NotOnLink => "not-on-link",
            Reason::InterfaceNotAllowed => "interface-not-allowed",
            Reason::Drained => "drained",
        }
    }

    /// A sentence for tables and logs.
    pub fn explain(self) -> &'static str {
        match self {
            Reason::NotEligible => "no advertisement for this address selects the node",
            Reason::ExcludeLabel => "node has the exclude-from-external-load-balancers label",
            Reason::NetworkUnavailable => "node condition NetworkUnavailable is True",
            Reason::NotLive => "no agent is running on the node",
            Reason::Leaving => "the agent on the node is shutting down",
            Reason::NoReadyEndpoint => "no usable endpoint of the Service on the node",
            // A node whose virtual mode is on holds such an address on its
            // virtual interface and is listed there, not excluded.
            Reason::NotOnLink => {
                "the address is on none of the node's links, and its agent's virtual mode is off (no kube-lb0 or turned off), so it does not route it"
            }
            Reason::InterfaceNotAllowed => {
                "the address is on-link only on interfaces its advertisements do not allow"
            }
            Reason::Drained => "the node is drained and other nodes route the address",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why no node at all can announce a VIP, when that is the case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// The address lies in no known IPAddressPool.
    NoPool,
    /// No L2Advertisement selects the pool for this Service.
    NoAdvertisement { pool: String },
    /// The Service has no usable endpoint anywhere.
    NoEndpoints,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::NoPool => f.write_str("the address is in no IPAddressPool"),
            Note::NoAdvertisement { pool } => {
                write!(f, "no L2Advertisement selects pool {pool} for this Service")
            }
            Note::NoEndpoints => f.write_str("the Service has no usable endpoint"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub node: String,
    /// Drained: ranked after every candidate that is not of last resort.
    pub drained: bool,
    /// Its default gateway toward the VIP's network stopped answering:
    /// ranked last too, as if drained.
    pub upstream_lost: bool,
    /// Holds a sticky VIP, as its gossip says: ranked before every
    /// candidate that does not (and after none of last resort).
    pub held: bool,
    pub score: u32,
    /// 1-based position among the candidates by hash alone: what the order
    /// would be without preferences.
    pub hash_rank: usize,
    /// `sha256(node + "#" + ip)`.
    pub hash: [u8; 32],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Excluded {
    pub node: String,
    pub reason: Reason,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VipReport {
    pub ip: IpAddr,
    /// `namespace/name`, oldest first; the first gives the Service-side inputs.
    pub services: Vec<String>,
    pub pool: Option<String>,
    pub winner: Option<String>,
    /// Where the winner holds the address: interface and on-link prefix.
    pub winner_on: Option<OnLink>,
    /// In election order: drained nodes and those whose gateway is lost
    /// last, then score descending, then
    /// hash ascending.
    pub candidates: Vec<Candidate>,
    /// Eligible live nodes with no on-link prefix for the VIP: they hold it on
    /// their virtual interface for routing software to export.
    pub virtual_nodes: Vec<String>,
    /// Every other node, by name.
    pub excluded: Vec<Excluded>,
    pub note: Option<Note>,
}
