//! What the shell and the core say to each other: the settings, the
//! inputs a step takes and the actions it returns.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::election::{Cluster, Endpoints, NodeName};
use crate::model::Claim;
use crate::model::{AnnounceConfig, Target};
use crate::model::{Applied, Lifetime, MacAddr, OwnedAddress, VipAddress};
use crate::model::{LocalState, MembershipView};

use super::links::Links;
use super::sessions::{Beat, Lapse};

/// What the core needs from the configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub node: NodeName,
    pub lifetime: Lifetime,
    pub garp: AnnounceConfig,
    pub gossip_interval: Duration,
    /// The wire can be asked: a raw socket sends probes and another hears
    /// claims. Without, nothing is asked before a takeover and no second
    /// owner is looked for.
    pub wire: bool,
    /// Why this node cannot hold addresses at all (no CAP_NET_ADMIN): it
    /// then stays `starting` in gossip, no candidate, and its peers keep
    /// serving. A node that would win and hold nothing is the one outage
    /// a live candidate must never cause.
    pub unable: Option<Unable>,
    /// `firewall.enabled`: see [`super::firewall`].
    pub firewall: bool,
}

/// Why a node cannot hold addresses at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unable {
    /// CAP_NET_ADMIN missing from the process's effective capabilities.
    NoNetAdmin,
}

impl std::fmt::Display for Unable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unable::NoNetAdmin => f.write_str(
                "no CAP_NET_ADMIN: this agent cannot add addresses, so it is no candidate (run it as the packaged unit does, with AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW)",
            ),
        }
    }
}

/// `(namespace/name, annotation)` → the value this node writes there
/// (`None`: clear it).
pub type Announcing = BTreeMap<(String, &'static str), Option<String>>;

/// An Event on a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRequest {
    pub service: String,
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

/// A kernel operation the core asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Add, or renew: the backend's `add`.
    Add,
    Remove,
}

/// The result of one kernel operation, fed back as [`Input::Done`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpResult {
    pub ip: IpAddr,
    pub kind: OpKind,
    pub result: Result<Applied, OpError>,
}

/// Why a kernel operation did not happen. The core retries either the
/// same way and only logs the words each carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpError {
    /// The kernel refused it: netlink's error, as it said it.
    Kernel(String),
    /// Not tried: no firewall closing the VIP is in force (the shell's
    /// guard), with why.
    Unguarded(String),
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::Kernel(e) | OpError::Unguarded(e) => f.write_str(e),
        }
    }
}

/// Something that happened, for [`Core::step`].
#[derive(Clone, Debug)]
pub enum Input {
    /// A complete view of the cluster objects (every watch has listed), and
    /// the objects left out as unusable.
    Cluster {
        cluster: Cluster,
        errors: Vec<String>,
        /// How new the view is (the newest resourceVersion seen).
        revision: u64,
        /// What the view holds, as a digest (see `MemberInfo::digest`).
        digest: Option<u64>,
    },
    /// Only the endpoints of these Services (`namespace/name`) changed.
    Endpoints {
        changes: Vec<(String, Endpoints)>,
        revision: u64,
        digest: Option<u64>,
    },
    Members(MembershipView),
    /// Beats from session peers (see [`sessions`]), each with when it
    /// arrived: the shell holds those that change nothing but when their
    /// sender was last heard ([`Core::beat_is_routine`]) until its next
    /// step, so an agent watching an owner steps every few beats, not at
    /// every one.
    Beats(Vec<Beat>),
    Links(Links),
    /// Addresses a previous run of the agent left in the kernel (at start).
    Adopted(Vec<OwnedAddress>),
    /// One of our addresses disappeared without us removing it.
    AddressRemoved(OwnedAddress),
    /// Our addresses as the kernel has them: read when kernel events were
    /// lost, or when [`Actions::read_kernel`] asked, after every operation
    /// asked for before.
    KernelOwned(Vec<OwnedAddress>),
    /// Claims of addresses heard on the wire, judged in one step (one or
    /// many, as they came in together): a winner announces every
    /// VIP it took at once, and a node handing many over lets them all go
    /// in one batch, not one kernel operation per claim.
    Claims(Vec<Claim>),
    /// Results of kernel operations asked for earlier.
    Done(Vec<OpResult>),
    /// A deadline from [`Actions::wake`] passed (or any wake-up).
    Tick,
    /// SIGTERM or SIGINT: hand everything over and exit.
    Leave,
    /// A reloaded configuration, and the links read after it (the virtual
    /// interface may have another name): one step, so the core never acts
    /// on the new settings with the old links.
    Reloaded {
        settings: Settings,
        links: Links,
    },
    /// The agents' records in the API (`NodeAgent` objects), every one.
    Records(Vec<AgentRecord>),
    /// The interfaces whose default gateway answered and then stopped
    /// (see `agent::upstream`), every one each time.
    Upstream(crate::model::UpstreamLost),
    /// This node's NodeAgent `spec.drain`, as read at start (before the
    /// first cluster view, so a drained node never wins anything back on
    /// a restart) and at every change.
    Drain(bool),
}

impl Input {
    /// The same input, its beats arriving at `at`: for callers that deliver
    /// each beat at the step it arrives (the simulation, the core's tests).
    pub fn arriving(mut self, at: Instant) -> Input {
        if let Input::Beats(beats) = &mut self {
            for b in beats {
                b.at = at;
            }
        }
        self
    }

    /// Its kind, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Input::Cluster { .. } => "cluster",
            Input::Endpoints { .. } => "endpoints",
            Input::Members(_) => "members",
            Input::Beats(_) => "beats",
            Input::Links(_) => "links",
            Input::Adopted(_) => "adopted",
            Input::AddressRemoved(_) => "address removed",
            Input::KernelOwned(_) => "kernel owned",
            Input::Claims(_) => "claims",
            Input::Done(_) => "done",
            Input::Tick => "tick",
            Input::Leave => "leave",
            Input::Reloaded { .. } => "reloaded",
            Input::Records(_) => "records",
            Input::Drain(_) => "drain",
            Input::Upstream(_) => "upstream",
        }
    }
}

/// A second host seen answering for a VIP held (or about to be) here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConflictSeen {
    pub ip: IpAddr,
    pub mac: MacAddr,
    /// The hostlb node whose MAC it is, if any.
    pub node: Option<String>,
    pub outcome: ConflictOutcome,
}

/// A kernel operation, as metrics name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpName {
    Add,
    Renew,
    Remove,
}

impl OpName {
    /// The `op` label of `hostlb_agent_address_operations_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            OpName::Add => "add",
            OpName::Renew => "renew",
            OpName::Remove => "remove",
        }
    }
}

/// Whose MAC answered as a second owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConflictKind {
    /// Another hostlb node's.
    Hostlb,
    /// A MAC no hostlb node publishes: a host configured by hand, a DHCP
    /// lease, or a node gossip never showed.
    Foreign,
    /// Such a MAC answered when this node asked before its first claim of
    /// a VIP no hostlb node held: the VIP was not added.
    InUse,
}

impl ConflictKind {
    /// The `kind` label of `hostlb_agent_conflicts_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConflictKind::Hostlb => "hostlb",
            ConflictKind::Foreign => "foreign",
            ConflictKind::InUse => "in_use",
        }
    }
}

/// What this node did about a second owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConflictOutcome {
    /// It outranks the other and keeps answering.
    Kept,
    /// The other outranks it: it let go.
    Yielded,
    /// A foreign MAC: reported, and kept.
    Reported,
    /// A foreign MAC answered before the first claim: not taken, asked
    /// again later.
    NotTaken,
}

impl ConflictOutcome {
    /// As the NodeAgent record and `/status` show it.
    pub fn as_str(self) -> &'static str {
        match self {
            ConflictOutcome::Kept => "kept",
            ConflictOutcome::Yielded => "yielded",
            ConflictOutcome::Reported => "reported",
            ConflictOutcome::NotTaken => "not-taken",
        }
    }
}

/// One agent's record in the API, as far as the core needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentRecord {
    pub node: String,
    /// The MACs its VIPs are answered from.
    pub macs: BTreeSet<MacAddr>,
    /// Written recently: its agent runs.
    pub fresh: bool,
}

/// A figure for the metrics.
#[derive(Clone, Debug, PartialEq)]
pub enum Metric {
    /// A kernel operation's result.
    Op { op: OpName, ok: bool },
    /// A second owner seen on the wire.
    Conflict(ConflictKind),
    /// From the last beat heard from an owner gone or silent to this node
    /// holding one of its VIPs, by the move's cause.
    Takeover(MoveCause, Duration),
    /// The election was updated.
    Elected,
}

/// Why a VIP came to this node from another, as this node judged when it
/// took it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoveCause {
    /// Gossip lost the previous holder: its host is gone or cut off.
    Gone,
    /// The previous holder's beats stopped while gossip still showed it:
    /// a stalled agent or host.
    Silent,
    /// The previous holder shut down (its leaving beat).
    Leaving,
    /// The previous holder is drained (`spec.drain` or the out-of-service
    /// taint on its Node).
    Drained,
    /// The previous holder's Node is cordoned, and an advertisement of the
    /// address counts a cordon as a drain.
    Cordoned,
    /// The previous holder's default gateway toward the address's network
    /// stopped answering (see `announce::gateway`): clients beyond the
    /// router no longer reached it there.
    Upstream,
    /// The previous holder can no longer serve the address: its carrier,
    /// its interface, or the objects (node selector, endpoints) left it
    /// out.
    Ineligible,
    /// The previous holder could still serve it, but this node ranks
    /// first: a preferred node came back or gained preference.
    Preference,
}

impl MoveCause {
    /// As metrics, Events and the NodeAgent record name it.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveCause::Gone => "host-gone",
            MoveCause::Silent => "stalled",
            MoveCause::Leaving => "shutdown",
            MoveCause::Drained => "drain",
            MoveCause::Cordoned => "cordon",
            MoveCause::Upstream => "upstream",
            MoveCause::Ineligible => "not-a-candidate",
            MoveCause::Preference => "preference",
        }
    }

    /// A fault took the VIP from its holder: no host may have answered for
    /// a while. Otherwise the move was planned, make before break.
    pub fn is_fault(self) -> bool {
        matches!(self, MoveCause::Gone | MoveCause::Silent)
    }

    /// An operator should look: a fault, or a holder cut off from its
    /// gateway (the move itself was make before break).
    pub fn is_warning(self) -> bool {
        self.is_fault() || self == MoveCause::Upstream
    }
}

/// A VIP that came to this node from another, reported when it is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub ip: IpAddr,
    /// The node that last published it held.
    pub from: String,
    pub cause: MoveCause,
    /// From the last beat (or, unwatched, the gossip loss) of a holder
    /// gone or silent to this node holding the address: how long no host
    /// may have answered, as this node measured it. `None` for a planned
    /// move, where the old holder answers until the new one does.
    pub dark: Option<Duration>,
}

/// What the shell must do after a step.
#[derive(Clone, Debug, Default)]
pub struct Actions {
    /// Addresses to add or renew, as one batch (the backend's `add`).
    pub add: Vec<VipAddress>,
    /// Addresses to remove, as one batch, after the adds.
    pub remove: Vec<VipAddress>,
    /// One announcement round (gratuitous ARP / unsolicited NA) for each.
    pub garp: Vec<Target>,
    /// One probe (ARP probe / DAD-style solicitation) for each.
    pub probe: Vec<Target>,
    /// This node's gossip state, when it changed.
    pub publish: Option<LocalState>,
    /// The addresses whose claims on the wire matter, each with the index
    /// of the only interface a claim on it counts from, when that changed.
    pub watch: Option<BTreeMap<IpAddr, u32>>,
    /// The annotations this node is responsible for, when they changed.
    pub announcing: Option<Announcing>,
    pub events: Vec<EventRequest>,
    /// Start leaving gossip (push `leaving` to peers; systemd `STOPPING=1`).
    pub leave: bool,
    /// The first reconcile is applied: ready (systemd `READY=1`).
    pub ready: bool,
    /// systemd `STATUS=`, when it changed.
    pub status: Option<String>,
    pub metrics: Vec<Metric>,
    /// Everything is handed over and removed: exit.
    pub exit: bool,
    /// Step again (with [`Input::Tick`]) at this time at the latest.
    pub wake: Option<Instant>,
    /// Whom to send beats to and what they say, when that changed.
    pub beat: Option<BeatPlan>,
    /// Whether gossip is isolated (see [`Core::isolated`]), when that
    /// changed.
    pub isolated: Option<bool>,
    /// Read our addresses from the kernel, after the operations asked for
    /// so far, and give them back as [`Input::KernelOwned`].
    pub read_kernel: bool,
    /// The firewall to put in force, when it changed.
    pub firewall: Option<crate::model::FirewallPlan>,
    /// VIPs this node now holds that another held before.
    pub moves: Vec<Move>,
}

/// Whom this node beats, and what its beats say (see [`sessions`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BeatPlan {
    /// Beaten every [`sessions::BEAT_INTERVAL`]: the nodes watching this
    /// one.
    pub dense: Vec<SocketAddr>,
    /// The owners this node watches, told so every
    /// [`sessions::SPARSE_EVERY`] intervals (densely if also in `dense`).
    pub sparse: Vec<SocketAddr>,
    /// When this node's addresses on the wire lapse if it renews nothing
    /// more.
    pub lapse: Option<Lapse>,
    /// Every [`sessions::RELAY_EVERY`]: the silent owners this node
    /// watches, told to the others next in line for their VIPs.
    pub relays: Vec<Relay>,
}

/// A silent owner, and whom to tell (see [`sessions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relay {
    pub node: NodeName,
    pub generation: u64,
    /// When its addresses lapse, as its last beat said.
    pub lapse: Option<Lapse>,
    pub to: Vec<SocketAddr>,
}
