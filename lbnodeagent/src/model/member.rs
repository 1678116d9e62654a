//! Members, as gossip shows them, and this node's published state.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::MacAddr;
use crate::election::{Member, NodeName, OnLink};

/// The gossip port, UDP (SPEC).
pub const DEFAULT_PORT: u16 = 7934;
/// The version of what agents exchange with each other: the frame and beat
/// formats, these keys and what their values mean, and the election rule.
/// It goes up when one of those changes in a way an agent of the previous
/// protocol would misread; an addition an older agent skips (a new key, a
/// longer beat) does not need it. Agents one protocol apart must work
/// together: a newer one keeps reading and writing what the older one
/// understands, and a rule both must apply alike (the election) switches
/// only once every member publishes the newer protocol. See docs/agent.md,
/// "Compatibility".
pub const PROTOCOL: u32 = 3;
/// The first protocol whose agents elect a drained node last (the gossip
/// key `drained`): a drain is in force only once every member speaks it,
/// so a fleet mid-upgrade elects as the older agents do.
pub const PROTOCOL_DRAIN: u32 = 2;
/// The first protocol whose agents have an identity of their own (see
/// `identity`): each publishes its key in its record and proves its beats
/// and gossip state with it. A record of this protocol or later without a
/// key is no older agent's (a NodeAgent CRD older than the agent dropped
/// the field): nothing in that node's name is believed until it shows.
pub const PROTOCOL_IDENTITY: u32 = 3;
/// The protocol of an agent that does not say: every release before the
/// `protocol` key spoke protocol 1.
pub const PROTOCOL_UNSAID: u32 = 1;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Status {
    #[default]
    Alive,
    /// Running, but not serving yet: the agent has not applied its first
    /// reconcile (no complete cluster view, membership not settled), so it
    /// is no candidate and its peers keep its VIPs. An agent restarted while
    /// the API server is unreachable stays here.
    Starting,
    /// Shutting down: peers drop it from their live view at once.
    Leaving,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Alive => "alive",
            Status::Starting => "starting",
            Status::Leaving => "leaving",
        }
    }

    /// Anything but `alive` keeps the node out of elections: when in doubt
    /// (a status a newer agent may invent), not a candidate, and as good as
    /// gone. (An agent older than `starting` reads it so too, which is right.)
    pub(crate) fn parse(text: &str) -> Status {
        match text {
            "alive" => Status::Alive,
            "starting" => Status::Starting,
            _ => Status::Leaving,
        }
    }
}

/// The state this node publishes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalState {
    pub status: Status,
    /// The agent holds off-link VIPs on its virtual interface.
    pub virtual_mode: bool,
    /// Shared with the [`MemberInfo`] peers make of it.
    pub on_link: Arc<[OnLink]>,
    pub vips: Arc<BTreeSet<IpAddr>>,
    /// MACs of the interfaces the node announces on.
    pub macs: Arc<BTreeSet<MacAddr>>,
    /// How new the node's view of the cluster is (see `KEY_REVISION`); 0
    /// before its first view, or from an agent that does not say.
    pub revision: u64,
    /// What the node's view of the cluster holds, as a digest (see
    /// `KEY_VIEW`): two views with the same digest are the same view,
    /// whatever their revisions. `None` before the first view, or from an
    /// agent that does not say.
    pub digest: Option<u64>,
    /// The node's operator drained it (its NodeAgent's `spec.drain`).
    pub drained: bool,
    /// Peers this node has found behind its view of the cluster for a
    /// hand-over's time (see `KEY_BEHIND`).
    pub behind: Arc<BTreeSet<NodeName>>,
}

/// One node as seen through gossip.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    pub node: NodeName,
    /// Chitchat generation: start time in ns; a restart makes a new one.
    pub generation: u64,
    pub gossip_addr: SocketAddr,
    pub agent_version: String,
    /// [`PROTOCOL`] of that agent ([`PROTOCOL_UNSAID`] for one from before
    /// the key).
    pub protocol: u32,
    pub status: Status,
    pub virtual_mode: bool,
    /// Shared, like the sets below: a view is copied for every change of
    /// any node, and most nodes are as they were.
    pub on_link: Arc<[OnLink]>,
    pub vips: Arc<BTreeSet<IpAddr>>,
    pub macs: Arc<BTreeSet<MacAddr>>,
    pub revision: u64,
    pub digest: Option<u64>,
    pub drained: bool,
    pub behind: Arc<BTreeSet<NodeName>>,
}

impl MemberInfo {
    /// The election's view of this node.
    pub fn to_member(&self) -> Member {
        Member {
            node: self.node.clone(),
            leaving: self.status != Status::Alive,
            drained: self.drained,
            virtual_mode: self.virtual_mode,
            on_link: self.on_link.clone(),
        }
    }
}

/// Membership as the reconcile loop sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipView {
    /// This node, as peers see it.
    pub local: MemberInfo,
    /// The election's input: live members whose status is `alive`, this node
    /// included while it is, one per node name (highest generation), sorted
    /// by name.
    pub members: Vec<Member>,
    /// Every live node, leaving ones included, with everything it publishes
    /// (held VIPs, agent version): for `lbnodeagent status` and for a
    /// leaving node to see that others have taken over its VIPs. Each
    /// node's record is shared: a view is made again at every change of
    /// any node, and most nodes are as they were.
    pub nodes: Vec<Arc<MemberInfo>>,
    /// Nodes gossip reports alive that the failure detector has not heard
    /// from yet (not in `members`): many right after this node starts,
    /// until its detector has reached them. The reconcile loop waits for
    /// them before its first election.
    pub unconfirmed: usize,
    /// Nodes whose state gossip still carries but that are not live (dead,
    /// unreachable, or not confirmed yet), as last published. A node that
    /// started after one of them was cut off learns from them which MACs
    /// are hostlb nodes' and who held which VIP: a second owner on the
    /// wire is then recognised, not taken for a stranger.
    pub gone: Vec<Arc<MemberInfo>>,
}

impl MembershipView {
    /// No member at all, before gossip has produced a view.
    pub fn empty() -> MembershipView {
        MembershipView {
            local: MemberInfo {
                node: NodeName::default(),
                generation: 0,
                gossip_addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                agent_version: String::new(),
                protocol: PROTOCOL,
                status: Status::Starting,
                virtual_mode: false,
                on_link: Default::default(),
                vips: Default::default(),
                macs: Default::default(),
                revision: 0,
                digest: None,
                drained: false,
                behind: Default::default(),
            },
            members: Vec::new(),
            nodes: Vec::new(),
            unconfirmed: 0,
            gone: Vec::new(),
        }
    }

    /// A live, alive member by name.
    pub fn member(&self, node: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.node == node)
    }

    pub fn node(&self, node: &str) -> Option<&MemberInfo> {
        self.nodes.iter().find(|m| m.node == node).map(|m| &**m)
    }
}
