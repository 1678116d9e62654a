//! The agent's decisions, apart from every socket, clock and system call:
//! which VIPs this node holds, when it takes one over, when it hands one
//! over, when it backs off.
//!
//! [`Core::step`] takes the time and one [`Input`] (a cluster view, a
//! membership view, the links, a kernel event, a claim heard on the wire,
//! the results of earlier actions, a tick) and returns the [`Actions`] the
//! shell (`agent/mod.rs`) carries out: kernel address operations in one
//! batch, one probe window, announcement rounds, the gossip state to
//! publish, annotations and Events, readiness, and when to wake it next.
//! Everything that takes time is a state with a deadline, never a wait: a
//! VIP being asked about is `probing` until its window ends, a VIP in the
//! kernel's hands has an operation in flight until its result comes back
//! as an input. So every VIP of a dead node is asked about in the same
//! window and added in the same batch, and the shell keeps serving its
//! other inputs meanwhile.
//!
//! # One VIP
//!
//! Each VIP this node deals with has a [`Slot`]: what the election and the
//! links want here (`want`), what the kernel holds for us (`held`), and the
//! transient states in between. [`Core::decide`] is the one place a VIP's
//! next move is chosen:
//!
//! - wanted and not held: wait out a retry backoff or a yield to an
//!   outranking owner ([`conflict`]); if the VIP had another holder that is
//!   not handing it over (it crashed, froze, or gossip cannot reach it),
//!   ask the LAN and listen for [`PRECHECK`]; then add it;
//! - held and no longer wanted: release at once if the winner is not a live
//!   peer, the link is down or the address is virtual; otherwise keep
//!   answering (but stop announcing) until the winner's gossip state shows
//!   it holds the address, at most [`HANDOVER_MAX`]: make before break;
//! - added: announce it (`garp_count` rounds), publish it, report it.
//!
//! The election says only what changed: a membership view re-elects the
//! VIPs a changed member can affect and only those are decided again; a
//! cluster view, new links or a change of this node's own state decide
//! every VIP; an EndpointSlice change decides only its Service's VIPs.
//!
//! # Phases
//!
//! A starting agent publishes `starting` and is no candidate: it waits for
//! a complete cluster view and for membership to settle (see
//! [`Core::settle`]); addresses a previous run left stay until then, and go
//! as soon as another node shows them held. Then it runs (`alive`). On
//! SIGTERM it leaves: `leaving` is published, every VIP is handed over make
//! before break (at most [`LEAVE_MAX`]), what is left is removed, and
//! [`Actions::exit`] is set.

pub mod conflict;
pub mod links;
pub mod sessions;
#[doc(hidden)]
pub mod sim;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hostlb_api::Family;
use hostlb_api::annotations::{self, reasons};
use tracing::{debug, info, warn};

use crate::addrs::{Applied, Lifetime, MacAddr, OwnedAddress, VipAddress};
use crate::announce::packet::Claim;
use crate::announce::{AnnounceConfig, Target};
use crate::election::{Cluster, Election, Endpoints, Member, Reason};
use crate::gossip::{LocalState, MembershipView, Status};
use conflict::{
    Conflicts, Hold, LAPSE_EARLY, LAPSE_PROBE, OWNER_PROBE, PRECHECK, PRECHECK_EVERY,
    PRECHECK_PROBES, Verdict, YIELD_PROBE, lapsing,
};
use links::{Links, Mode, Want};
use sessions::{Beat, Lapse, Sessions};

use super::status::{HeldDoc, MemberDoc, StatusDoc, VipDoc};

/// Longest wait, when giving a VIP to a live winner, for its gossip state to
/// show it holds the address before this node removes it anyway.
pub const HANDOVER_MAX: Duration = Duration::from_secs(2);
/// Longest a SIGTERM waits for the new winners before removing everything.
pub const LEAVE_MAX: Duration = Duration::from_secs(3);
/// Gossip rounds a leaving node keeps a VIP nobody else may hold by its
/// view, for a newer view (in which somebody may) to arrive.
const LEAVE_GRACE_ROUNDS: u32 = 3;
/// How long a starting agent that hears from no peer waits before it acts
/// alone.
pub const STARTUP_GRACE: Duration = Duration::from_secs(2);
/// Longest wait, after the first peer shows up, for the failure detector to
/// confirm the nodes gossip reports.
pub const UNCONFIRMED_GRACE: Duration = Duration::from_secs(10);
/// A failed kernel operation on a VIP is retried after this, doubling.
pub const RETRY_MIN: Duration = Duration::from_millis(200);
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// Gossip rounds within which a change a peer publishes has reached this
/// node, losses included (see [`Core::holds`]).
const GOSSIP_ROUNDS_TO_SETTLE: u32 = 5;
/// Least time between two workings-out of the owners to watch.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// How long an agent whose gossip reaches no peer, while the API shows
/// other agents running, waits before it takes itself as isolated: a
/// start's grace and a few gossip rounds to the seeds.
pub const ISOLATED_AFTER: Duration = Duration::from_secs(5);
/// How long a takeover may follow the loss of the member that held the VIP
/// and still count as its takeover (the `takeover_seconds` metric).
const TAKEOVER_WINDOW: Duration = Duration::from_secs(10);

/// What the core needs from the configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub node: String,
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
    pub unable: Option<String>,
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
    /// The error's message on failure.
    pub result: Result<Applied, String>,
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
    },
    /// Only the endpoints of these Services (`namespace/name`) changed.
    Endpoints {
        changes: Vec<(String, Endpoints)>,
        revision: u64,
    },
    Members(MembershipView),
    /// Beats from session peers (see [`sessions`]), as they arrived.
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
    /// A host on the wire claims an address.
    Claim(Claim),
    /// Results of kernel operations asked for earlier.
    Done(Vec<OpResult>),
    /// A deadline from [`Actions::wake`] passed (or any wake-up).
    Tick,
    /// SIGTERM or SIGINT: hand everything over and exit.
    Leave,
    /// A reloaded configuration.
    Settings(Settings),
    /// The agents' records in the API (`NodeAgent` objects), every one.
    Records(Vec<AgentRecord>),
}

/// A second host seen answering for a VIP held (or about to be) here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConflictSeen {
    pub ip: IpAddr,
    pub mac: MacAddr,
    /// The hostlb node whose MAC it is, if any.
    pub node: Option<String>,
    /// `kept`, `yielded` or `reported`.
    pub outcome: &'static str,
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
    /// A kernel operation's result: `add`, `renew` or `remove`.
    Op { op: &'static str, ok: bool },
    /// A second owner seen on the wire: `hostlb` or `foreign`.
    Conflict(&'static str),
    /// From a member's loss to this node holding one of its VIPs.
    Takeover(Duration),
    /// The election was updated.
    Elected,
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
    /// The addresses whose claims on the wire matter, when that changed.
    pub watch: Option<BTreeSet<IpAddr>>,
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
    pub node: String,
    pub generation: u64,
    /// When its addresses lapse, as its last beat said.
    pub lapse: Option<Lapse>,
    pub to: Vec<SocketAddr>,
}

/// A kernel operation in flight for a VIP.
#[derive(Clone, Debug)]
enum Op {
    Add {
        want: Want,
        renew: bool,
    },
    Remove {
        vip: VipAddress,
        why: String,
        /// The old place of a VIP that moved to another interface: the VIP
        /// stays held at its new place.
        stale: bool,
    },
}

#[derive(Clone, Copy, Debug)]
struct Retry {
    at: Instant,
    delay: Duration,
}

/// A pre-check under way: [`PRECHECK_PROBES`] questions on the wire,
/// [`PRECHECK_EVERY`] apart, and the window ends at `until`.
#[derive(Clone, Copy, Debug)]
struct Probing {
    until: Instant,
    /// When the next question goes out, while some are left.
    next: Instant,
    left: u32,
}

#[derive(Clone, Copy, Debug)]
struct Garp {
    left: u32,
    next: Instant,
}

/// One VIP this node deals with. See the module docs.
#[derive(Clone, Debug, Default)]
struct Slot {
    /// Where the election and the links say this node holds it now.
    want: Option<Want>,
    /// What the kernel holds for us, as last confirmed.
    held: Option<Want>,
    op: Option<Op>,
    /// Asking the LAN before taking it.
    probing: Option<Probing>,
    /// Giving it to a live winner, since then.
    handover: Option<Instant>,
    /// The hostlb node whose MAC claimed it on the wire during the
    /// hand-over: the winner answering is as good as its gossip saying so.
    answered_by: Option<String>,
    /// Held and won here, and a live peer shows it held too, since then:
    /// the two views of the cluster differ (see [`Core::contest`]).
    contested: Option<Instant>,
    retry: Option<Retry>,
    garp: Option<Garp>,
    /// Left by a previous run and not yet decided by a reconcile.
    adopted: bool,
    /// When a second owner that this node outranks was last answered with
    /// an announcement: one a second at most, so two nodes that each think
    /// they outrank the other do not trade announcements at wire speed.
    kept_at: Option<Instant>,
    /// Still answering, past the hand-over time, for a VIP whose winner has
    /// a view of the cluster other than this node's (see
    /// [`Core::may_release`]): published as held again.
    kept_for_views: bool,
    /// Since when `held` has been this node's: a peer's gossip saying it
    /// holds the VIP counts only if published after that (see
    /// [`Core::holds`]).
    held_since: Option<Instant>,
    /// When the kernel drops `held` unless it is renewed.
    expires: Option<Instant>,
}

impl Slot {
    fn idle(&self) -> bool {
        self.want.is_none()
            && self.held.is_none()
            && self.op.is_none()
            && self.retry.is_none()
            && self.probing.is_none()
    }

    /// Nothing to decide until an input changes it.
    fn settled(&self) -> bool {
        self.op.is_none()
            && self.probing.is_none()
            && self.handover.is_none()
            && self.garp.is_none()
            && self.contested.is_none()
            && !self.adopted
            && match (&self.want, &self.held) {
                (Some(w), Some(h)) => same_place(w, h),
                (None, None) => self.retry.is_none(),
                _ => false,
            }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not a candidate yet: waiting for a cluster view and for membership
    /// to settle.
    Starting,
    Running,
    /// Handing VIPs over after SIGTERM.
    Leaving {
        since: Instant,
    },
    /// Removing what is left.
    Finishing,
    Done,
}

/// The agent's state and decisions. See the module docs.
pub struct Core {
    settings: Settings,
    /// The time of the current step.
    now: Instant,
    phase: Phase,
    started: Instant,
    /// When gossip first showed a peer, while starting.
    first_peer: Option<Instant>,
    /// Nothing is taken before this: a few gossip rounds after this node
    /// became a candidate, so peers that became candidates at the same
    /// moment are seen by then (see [`Core::settle`]).
    acquire_from: Instant,
    election: Election,
    /// The election has had a cluster view.
    cluster_known: bool,
    /// How new that view is: the newest resourceVersion it was built from.
    revision: u64,
    /// This node's own member as the election last had it.
    own_member: Option<Member>,
    /// Services by address, oldest first.
    services_of: BTreeMap<IpAddr, Vec<String>>,
    object_errors: Vec<String>,
    links: Links,
    /// `links.on_link()`, worked out when the links change: this node's
    /// member is handed to the election at every membership change.
    on_link: Arc<[crate::election::OnLink]>,
    /// Membership as gossip reports it.
    gossip_view: Arc<MembershipView>,
    /// Membership as this node acts on it: gossip's, without the owners
    /// its sessions found silent. Most of the time gossip's own, shared.
    view: Arc<MembershipView>,
    sessions: Sessions,
    /// Nodes whose leaving beat said they go (their agent on SIGTERM, or
    /// `cleanup` for a dead one), with the gossip generation they had
    /// then: acted on as leaving (as if gossip said so already) until
    /// gossip shows another generation or loses them.
    left: BTreeMap<String, u64>,
    /// The owners to watch are worked out again then (the election moved).
    watch_due: Option<Instant>,
    watched_at: Instant,
    /// The owners to watch as last worked out, and the election's epoch
    /// and this node's candidacy they were worked out for.
    watching: (Option<(u64, bool)>, sessions::Owners),
    beat_plan: Option<BeatPlan>,
    /// The beat plan may have changed beyond what `publish_dirty` and the
    /// sessions say: peers' addresses, or a renewal.
    beat_dirty: bool,
    slots: BTreeMap<IpAddr, Slot>,
    /// Slots that are not [`Slot::settled`], decided at every step.
    unsettled: BTreeSet<IpAddr>,
    /// VIPs whose winner is a live peer with an older view of the cluster
    /// that does not show them held, since when (see [`Core::orphans`]).
    orphans: BTreeMap<IpAddr, Instant>,
    orphan_scan: bool,
    conflicts: Conflicts,
    /// Addresses someone else holds on this host: reported once each.
    foreign: BTreeSet<IpAddr>,
    /// When each member was last seen live, for the takeover metric.
    lost_at: BTreeMap<String, Instant>,
    /// Other nodes whose agents' records in the API are fresh.
    running_elsewhere: BTreeSet<String>,
    last_conflict: Option<ConflictSeen>,
    /// Gossip last showed a live peer then (or the agent started).
    peer_seen: Instant,
    isolated: bool,
    /// When each node's published VIPs last changed in our views.
    vips_changed: BTreeMap<String, Instant>,
    next_renew: Option<Instant>,
    next_owner_probe: Instant,
    /// The next refresh round of every held VIP, while
    /// `announce.refresh_interval` is set.
    next_refresh: Option<Instant>,
    next_yield_probe: Instant,
    next_lapse_probe: Instant,
    /// Re-decide every VIP at the next step.
    all_dirty: bool,
    report_dirty: bool,
    publish_dirty: bool,
    published: Option<LocalState>,
    watched: BTreeSet<IpAddr>,
    announced: Option<Announcing>,
    ready: bool,
    last_status: Option<(usize, usize)>,
    /// [`Actions::wake`] of the last step.
    wake: Option<Instant>,
}

impl Core {
    pub fn new(settings: Settings, links: Links, now: Instant) -> Core {
        Core {
            settings,
            now,
            phase: Phase::Starting,
            started: now,
            first_peer: None,
            acquire_from: now,
            election: Election::new(&Cluster::default(), []),
            cluster_known: false,
            revision: 0,
            own_member: None,
            services_of: BTreeMap::new(),
            object_errors: Vec::new(),
            on_link: links.on_link().into(),
            links,
            gossip_view: Arc::new(MembershipView::empty()),
            view: Arc::new(MembershipView::empty()),
            sessions: Sessions::default(),
            left: BTreeMap::new(),
            watch_due: None,
            watching: (None, BTreeMap::new()),
            watched_at: now,
            beat_plan: None,
            beat_dirty: true,
            slots: BTreeMap::new(),
            unsettled: BTreeSet::new(),
            orphans: BTreeMap::new(),
            orphan_scan: false,
            conflicts: Conflicts::default(),
            foreign: BTreeSet::new(),
            lost_at: BTreeMap::new(),
            running_elsewhere: BTreeSet::new(),
            last_conflict: None,
            peer_seen: now,
            isolated: false,
            vips_changed: BTreeMap::new(),
            next_renew: None,
            next_owner_probe: now + OWNER_PROBE,
            next_refresh: None,
            next_yield_probe: now + YIELD_PROBE,
            next_lapse_probe: now,
            all_dirty: true,
            report_dirty: true,
            publish_dirty: true,
            published: None,
            watched: BTreeSet::new(),
            announced: None,
            ready: false,
            last_status: None,
            wake: None,
        }
    }

    /// The state to publish in gossip before the first step.
    pub fn local_state(&self) -> LocalState {
        LocalState {
            status: match self.phase {
                Phase::Starting => Status::Starting,
                Phase::Running => Status::Alive,
                _ => Status::Leaving,
            },
            virtual_mode: self.links.virtual_link.is_some(),
            on_link: Arc::clone(&self.on_link),
            // Not what is being handed over: this node does not mean to
            // keep it, and a peer that holds it too need not contest it.
            vips: self
                .slots
                .iter()
                .filter(|(_, s)| {
                    (s.handover.is_none() || s.kept_for_views)
                        && s.held.as_ref().is_some_and(|h| h.mode == Mode::Local)
                })
                .map(|(ip, _)| *ip)
                .collect::<BTreeSet<_>>()
                .into(),
            macs: self.links.macs().into(),
            revision: self.revision,
        }
    }

    pub fn node(&self) -> &str {
        &self.settings.node
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn links(&self) -> &Links {
        &self.links
    }

    pub fn view(&self) -> &MembershipView {
        &self.view
    }

    /// Addresses the kernel holds for us now.
    pub fn held(&self) -> impl Iterator<Item = (&IpAddr, &Want)> {
        self.slots
            .iter()
            .filter_map(|(ip, s)| s.held.as_ref().map(|h| (ip, h)))
    }

    pub fn held_count(&self) -> usize {
        self.slots.values().filter(|s| s.held.is_some()).count()
    }

    /// Of [`held_count`](Self::held_count), those on the virtual interface.
    pub fn held_virtual_count(&self) -> usize {
        self.slots
            .values()
            .filter(|s| s.held.as_ref().is_some_and(|h| h.mode == Mode::Virtual))
            .count()
    }

    pub fn object_errors(&self) -> &[String] {
        &self.object_errors
    }

    /// The first reconcile is applied (and the agent is not leaving).
    pub fn is_ready(&self) -> bool {
        self.ready && matches!(self.phase, Phase::Running)
    }

    pub fn is_leaving(&self) -> bool {
        matches!(
            self.phase,
            Phase::Leaving { .. } | Phase::Finishing | Phase::Done
        )
    }

    /// When the core wants to be stepped again at the latest (the last
    /// step's [`Actions::wake`]).
    pub fn wake_hint(&self) -> Option<Instant> {
        self.wake
    }

    /// When `node`'s addresses lapse, as its beats (or a relay) last said.
    pub fn lapse_of(&self, node: &str) -> Option<Lapse> {
        self.sessions.lapse(node)
    }

    /// Whom this node beats now (see [`sessions`]).
    pub fn beats(&self) -> Option<&BeatPlan> {
        self.beat_plan.as_ref()
    }

    /// The election as this node has it.
    pub fn election(&self) -> &Election {
        &self.election
    }

    /// Feeds one input; returns what to do.
    pub fn step(&mut self, now: Instant, input: Input) -> Actions {
        let mut out = Actions::default();
        self.now = now;
        self.take(now, input, &mut out);
        self.advance(now, &mut out);
        out
    }

    fn take(&mut self, now: Instant, input: Input, out: &mut Actions) {
        match input {
            Input::Cluster {
                cluster,
                errors,
                revision,
            } => {
                self.note_object_errors(errors);
                self.set_revision(revision);
                self.services_of.clear();
                let mut services: Vec<_> = cluster.services.iter().collect();
                services.sort_by(|a, b| {
                    hostlb_api::rules::age_key(a.created, &a.key)
                        .cmp(&hostlb_api::rules::age_key(b.created, &b.key))
                });
                for s in services {
                    for ip in &s.addresses {
                        let list = self.services_of.entry(*ip).or_default();
                        if !list.contains(&s.key) {
                            list.push(s.key.clone());
                        }
                    }
                }
                self.election.set_cluster(&cluster);
                self.watch_due.get_or_insert(now);
                self.cluster_known = true;
                self.all_dirty = true;
                self.report_dirty = true;
                out.metrics.push(Metric::Elected);
            }
            Input::Endpoints { changes, revision } => {
                self.set_revision(revision);
                for (key, endpoints) in changes {
                    let touched = self.election.set_endpoints(&key, &endpoints);
                    self.mark(touched);
                }
                self.watch_due.get_or_insert(now);
                self.report_dirty = true;
                out.metrics.push(Metric::Elected);
            }
            Input::Members(view) => {
                self.gossip_view = Arc::new(view);
                self.apply_view(now, out);
            }
            Input::Beats(beats) => {
                let mut changed = false;
                for b in beats {
                    if let Some(silent) = &b.silent {
                        if silent.node == self.settings.node
                            || self.of_another_run(&silent.node, silent.generation)
                        {
                            continue;
                        }
                        let owner = silent.node.clone();
                        if self.sessions.heard(b, now) {
                            warn!(%owner, "its watcher finds the owner silent; taking over what it holds unless it still answers");
                            changed = true;
                        }
                    } else if self.of_another_run(&b.node, b.generation) {
                        // A restarted agent's beats say nothing of the
                        // run gossip still shows, whose addresses may be
                        // gone: the new run counts once gossip has it.
                        debug!(node = %b.node, "a beat of a run gossip does not show yet");
                    } else if b.leaving {
                        changed |= self.left_by_beat(b.node);
                    } else if self.sessions.heard(b, now) {
                        info!("a silent owner is heard again");
                        changed = true;
                    }
                }
                if changed {
                    self.apply_view(now, out);
                }
            }
            Input::Links(links) => {
                if links != self.links {
                    debug!("links or routes changed");
                    self.on_link = links.on_link().into();
                    self.links = links;
                    self.publish_dirty = true;
                    self.elect_members();
                    self.watch_due.get_or_insert(now);
                    self.all_dirty = true;
                }
            }
            Input::Adopted(found) => {
                if !found.is_empty() {
                    info!(count = found.len(), "found addresses of a previous run");
                }
                for a in found {
                    let want = self.adopted_want(&a);
                    let slot = self.slots.entry(a.ip).or_default();
                    slot.held = Some(want);
                    slot.held_since = Some(now);
                    slot.adopted = true;
                    self.unsettled.insert(a.ip);
                }
                self.publish_dirty = true;
            }
            Input::AddressRemoved(a) => {
                // Not taken at its word: the event may be older than the
                // operation that put the address back (a frozen agent
                // reads, on thawing, the removals of addresses that lapsed
                // meanwhile, after its renewal added them again), and a
                // VIP the core believes gone but the kernel still answers
                // for would have two owners until it lapses. The kernel
                // is read again, after the operations already asked for,
                // and `KernelOwned` says what is there.
                if self.slots.get(&a.ip).is_some_and(|s| {
                    s.op.is_none() && s.held.as_ref().is_some_and(|h| h.vip.ifindex == a.ifindex)
                }) {
                    debug!(ip = %a.ip, interface = %a.interface,
                        "the kernel reports the address removed; reading the kernel again");
                    out.read_kernel = true;
                }
            }
            Input::KernelOwned(owned) => self.kernel_owned(owned),
            Input::Claim(claim) => self.on_claim(claim, now, out),
            Input::Done(results) => {
                let worked = results.iter().any(|r| r.result.is_ok());
                for r in results {
                    self.on_done(r, now, out);
                }
                if worked {
                    // The kernel takes operations again: what failed before
                    // is tried soon, not after a backoff grown while it
                    // refused everything.
                    for (ip, s) in &mut self.slots {
                        if let Some(r) = &mut s.retry
                            && r.at > now + RETRY_MIN
                        {
                            r.at = now + RETRY_MIN;
                            self.unsettled.insert(*ip);
                        }
                    }
                }
            }
            Input::Tick => {}
            Input::Records(records) => {
                let me = self.settings.node.clone();
                for r in &records {
                    if r.node != me {
                        self.conflicts.learn_macs(&r.node, r.macs.iter().copied());
                    }
                }
                self.running_elsewhere = records
                    .into_iter()
                    .filter(|r| r.fresh && r.node != me)
                    .map(|r| r.node)
                    .collect();
            }
            Input::Leave => self.begin_leave(now, out),
            Input::Settings(settings) => {
                if settings != self.settings {
                    if settings.garp.refresh != self.settings.garp.refresh {
                        self.next_refresh = None;
                    }
                    self.settings = Settings {
                        node: self.settings.node.clone(),
                        ..settings
                    };
                    self.all_dirty = true;
                }
            }
        }
    }

    /// Our addresses as the kernel has them, read after every operation
    /// asked for before: the truth, for every VIP with no operation in
    /// flight. One held here but gone from the kernel (removed by hand,
    /// lapsed) is put back if still ours; one the kernel holds that the
    /// core does not (a removal it was told of that had not happened) is
    /// held again, and kept or released like any other.
    fn kernel_owned(&mut self, owned: Vec<OwnedAddress>) {
        let there: BTreeSet<(u32, IpAddr)> = owned.iter().map(|o| (o.ifindex, o.ip)).collect();
        for (ip, s) in &mut self.slots {
            if s.op.is_none()
                && s.held
                    .as_ref()
                    .is_some_and(|h| !there.contains(&(h.vip.ifindex, *ip)))
            {
                warn!(%ip, "address removed outside the agent; putting it back if still ours");
                s.held = None;
                s.held_since = None;
                s.garp = None;
                s.handover = None;
                s.kept_for_views = false;
                self.unsettled.insert(*ip);
                self.publish_dirty = true;
                self.report_dirty = true;
            }
        }
        for o in owned {
            if self
                .slots
                .get(&o.ip)
                .is_some_and(|s| s.op.is_some() || s.held.is_some())
            {
                continue;
            }
            info!(ip = %o.ip, interface = %o.interface,
                "the kernel holds an address of ours the agent thought gone; deciding it again");
            let want = self.adopted_want(&o);
            let slot = self.slots.entry(o.ip).or_default();
            slot.held = Some(want);
            // Not a VIP just handed to this node: a peer's word that it
            // holds it stands at once (see `holds`).
            slot.held_since = None;
            self.unsettled.insert(o.ip);
            self.publish_dirty = true;
            self.report_dirty = true;
        }
    }

    /// Whether a beat's `generation` of `node` is another run than the
    /// one gossip shows.
    fn of_another_run(&self, node: &str, generation: Option<u64>) -> bool {
        generation.is_some_and(|g| {
            self.gossip_view
                .node(node)
                .is_some_and(|n| n.generation != g)
        })
    }

    /// `node`'s leaving beat says it goes: its addresses answer until
    /// others do. True when that is news.
    fn left_by_beat(&mut self, node: String) -> bool {
        if node == self.settings.node {
            return false;
        }
        let Some(generation) = self.gossip_view.node(&node).map(|n| n.generation) else {
            debug!(%node, "leaving beat from a node gossip does not show live");
            return false;
        };
        if self.left.get(&node) == Some(&generation) {
            return false;
        }
        info!(%node, "its leaving beat says it goes; taking its addresses as from a leaving node");
        self.left.insert(node, generation);
        true
    }

    /// Acts on membership: gossip's view without the owners whose
    /// sessions went silent (see [`sessions`]), and with the nodes whose
    /// leaving beat came as leaving.
    fn apply_view(&mut self, now: Instant, out: &mut Actions) {
        let gossip = &self.gossip_view;
        self.left
            .retain(|n, g| gossip.node(n).is_some_and(|i| i.generation == *g));
        let view = if self.left.is_empty() && !self.sessions.any_suspect() {
            Arc::clone(&self.gossip_view)
        } else {
            let mut view = (*self.gossip_view).clone();
            if !self.left.is_empty() {
                view.members.retain(|m| !self.left.contains_key(&m.node));
                for n in &mut view.nodes {
                    if n.status == Status::Alive && self.left.contains_key(&n.node) {
                        n.status = Status::Leaving;
                    }
                }
            }
            if self.sessions.any_suspect() {
                // A node whose leaving beat came is leaving, not silent:
                // its host answers until others do, and it is handed over
                // as such.
                let suspect = |n: &str| {
                    n != self.settings.node
                        && self.sessions.is_suspect(n)
                        && !self.left.contains_key(n)
                };
                view.members.retain(|m| !suspect(&m.node));
                let (silent, nodes): (Vec<_>, Vec<_>) =
                    view.nodes.into_iter().partition(|n| suspect(&n.node));
                view.nodes = nodes;
                view.gone.extend(silent);
            }
            Arc::new(view)
        };
        // Most views are of a peer's state (its held VIPs), with the same
        // members: the election has them already, and nobody was lost.
        let members_changed = self.view.members != view.members;
        if members_changed {
            let members: BTreeSet<&str> = view.members.iter().map(|m| m.node.as_str()).collect();
            for m in &self.view.members {
                if !members.contains(m.node.as_str()) {
                    self.lost_at.insert(m.node.clone(), now);
                }
            }
        }
        self.lost_at
            .retain(|_, t| now.saturating_duration_since(*t) < TAKEOVER_WINDOW * 3);
        // The previous view by name, live nodes over gone ones.
        let before: BTreeMap<&str, (&crate::gossip::MemberInfo, bool)> = self
            .view
            .gone
            .iter()
            .map(|n| (n.node.as_str(), (n, false)))
            .chain(self.view.nodes.iter().map(|n| (n.node.as_str(), (n, true))))
            .collect();
        for n in &view.nodes {
            let live_before = before.get(n.node.as_str()).filter(|(_, live)| *live);
            if live_before.is_none_or(|(b, _)| b.vips != n.vips || b.generation != n.generation) {
                self.vips_changed.insert(n.node.clone(), now);
            }
        }
        if self.vips_changed.len() > view.nodes.len() {
            let live: BTreeSet<&str> = view.nodes.iter().map(|n| n.node.as_str()).collect();
            self.vips_changed
                .retain(|node, _| live.contains(node.as_str()));
        }
        // The live last, so that who holds a VIP now wins over a
        // gone node's last word. Only what changed: a view comes with
        // every gossip update, and most of its nodes are as they were.
        let news = |n: &&crate::gossip::MemberInfo| {
            before
                .get(n.node.as_str())
                .is_none_or(|(b, _)| b.macs != n.macs || b.vips != n.vips)
        };
        self.conflicts.learn(
            view.gone.iter().chain(&view.nodes).filter(news),
            &self.settings.node,
        );
        self.view = view;
        self.orphan_scan = true;
        if members_changed {
            self.elect_members();
        }
        self.report_dirty = true;
        out.metrics.push(Metric::Elected);
        // Adopted addresses another node now holds, VIPs handed
        // over, and VIPs a peer holds too may be decided now.
        let mut waiting: BTreeSet<IpAddr> = self
            .slots
            .iter()
            .filter(|(_, s)| s.handover.is_some() || s.adopted || s.contested.is_some())
            .map(|(ip, _)| *ip)
            .collect();
        for n in self.alive_peers() {
            waiting.extend(
                n.vips
                    .iter()
                    .filter(|ip| self.slots.get(ip).is_some_and(|s| s.held.is_some())),
            );
        }
        self.mark(waiting);
        self.watch_due.get_or_insert(now);
        self.beat_dirty = true;
    }

    /// Everything that follows from the state: settle, decide, announce,
    /// probe, renew, report, and the next wake-up.
    fn advance(&mut self, now: Instant, out: &mut Actions) {
        let (silent, changed) = self.sessions.expire(now);
        if !silent.is_empty() {
            warn!(owners = ?silent, "owner silent for {} ms; taking over what it holds unless it still answers, and telling the others next in line",
                sessions::BEAT_MISS.as_millis());
        }
        if changed {
            self.apply_view(now, out);
        }
        if self.phase == Phase::Starting && self.settings.unable.is_none() && self.settle(now) {
            info!(
                peers = self.view.nodes.len().saturating_sub(1),
                "membership settled and the cluster known; electing"
            );
            self.phase = Phase::Running;
            self.acquire_from = now + self.settings.gossip_interval * 3;
            self.publish_dirty = true;
            self.elect_members();
            self.all_dirty = true;
            // Orphans are looked for only while running: those found
            // while starting (a view newer than the peers') are due now.
            self.orphan_scan = true;
        }
        self.note_isolation(now, out);
        if self.orphan_scan {
            self.orphans(now);
        }
        let due: Vec<IpAddr> = self
            .orphans
            .iter()
            .filter(|(ip, since)| {
                now.saturating_duration_since(**since) >= HANDOVER_MAX
                    && self.slots.get(ip).is_none_or(|s| s.want.is_none())
            })
            .map(|(ip, _)| *ip)
            .collect();
        self.mark(due);
        if self.all_dirty {
            self.all_dirty = false;
            self.refresh_wants();
        }
        if let Phase::Leaving { since } = self.phase {
            let local_left = self.slots.values().any(|s| {
                s.held.as_ref().is_some_and(|h| h.mode == Mode::Local)
                    || matches!(s.op, Some(Op::Add { .. }))
            });
            if !local_left || now.saturating_duration_since(since) >= LEAVE_MAX {
                self.phase = Phase::Finishing;
                let all: Vec<IpAddr> = self.slots.keys().copied().collect();
                self.mark(all);
            }
        }
        let ips: Vec<IpAddr> = self.unsettled.iter().copied().collect();
        for ip in ips {
            self.decide(ip, now, out);
        }
        self.renew(now, out);
        if !out.add.is_empty() {
            // What the beats say of when this node's addresses lapse.
            self.beat_dirty = true;
        }
        self.probe_wire(now, out);
        if self.phase == Phase::Finishing && self.slots.values().all(|s| s.op.is_none()) {
            let left: Vec<VipAddress> = self
                .slots
                .values()
                .filter_map(|s| s.held.as_ref().map(|h| h.vip.clone()))
                .collect();
            if left.is_empty() {
                info!("left");
                self.phase = Phase::Done;
                self.publish_dirty = true;
                out.exit = true;
            }
        }
        self.watch_owners(now);
        self.report(now, out);
        out.wake = self.next_wake(now);
        self.wake = out.wake;
    }

    /// Works out again which owners this node watches, once the election
    /// moved (at most every [`WATCH_EVERY`]: one election per VIP): those
    /// for whose lowest VIP it comes next, each with the others next in
    /// line for its VIPs.
    fn watch_owners(&mut self, now: Instant) {
        let Some(due) = self.watch_due else { return };
        if now < due || now < self.watched_at + WATCH_EVERY {
            return;
        }
        self.watch_due = None;
        self.watched_at = now;
        let running = self.phase == Phase::Running;
        let key = (self.election.epoch(), running);
        if self.watching.0 != Some(key) {
            // One election per VIP: only when the election changed.
            let owners = if running {
                sessions::watched_by(&self.settings.node, &self.election.runners_up())
            } else {
                BTreeMap::new()
            };
            self.watching = (Some(key), owners);
        }
        let gossip = &self.gossip_view;
        self.sessions
            .watch(self.watching.1.clone(), |n| gossip.node(n).is_some());
    }

    /// Whom to beat and what to tell them: the session peers, when the
    /// addresses this node answers for lapse, and the silent owners.
    fn next_beat_plan(&self) -> BeatPlan {
        let plan = self.sessions.plan();
        let gossip = &self.gossip_view;
        let known = || gossip.nodes.iter().chain(&gossip.gone);
        let addrs = |names: &BTreeSet<String>| -> Vec<SocketAddr> {
            known()
                .filter(|n| names.contains(&n.node) && n.node != self.settings.node)
                .map(|n| n.gossip_addr)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect()
        };
        let relays = plan
            .relays
            .iter()
            .filter_map(|(node, to)| {
                let generation = known().find(|n| n.node == *node)?.generation;
                Some(Relay {
                    node: node.clone(),
                    generation,
                    lapse: self.sessions.lapse(node),
                    to: addrs(to),
                })
            })
            .collect();
        // An add or renewal in flight may land, even if this agent dies
        // now (the kernel has the request): then its address lapses a
        // lifetime from now, and a follower told only the older lapse
        // would stop asking before the address goes.
        let expiries = self
            .slots
            .values()
            .filter(|s| s.held.as_ref().is_some_and(|h| h.mode == Mode::Local))
            .filter_map(|s| s.expires)
            .chain(self.slots.values().filter_map(|s| match &s.op {
                Some(Op::Add { want, .. }) if want.mode == Mode::Local => expiry(want, self.now),
                _ => None,
            }));
        let lapse = expiries.fold(None, |acc: Option<Lapse>, e| {
            Some(match acc {
                None => Lapse { first: e, last: e },
                Some(l) => Lapse {
                    first: l.first.min(e),
                    last: l.last.max(e),
                },
            })
        });
        BeatPlan {
            dense: addrs(&plan.dense),
            sparse: addrs(&plan.sparse),
            lapse,
            relays,
        }
    }

    /// The lifetime of an address taken now: so that it lapses with the
    /// ones renewed at the last renewal (to the second, the kernel's unit),
    /// and a follower learns one moment when all of them lapse.
    fn aligned_lifetime(&self, now: Instant) -> Lifetime {
        // A renewal due now renews the others in this very step, to the
        // whole lifetime; it skips this address (its add is in flight), so
        // the address must outlast the renewal after that one too.
        match (self.settings.lifetime.renew_every(), self.next_renew) {
            (Some(every), Some(next)) if next > now => Lifetime::new(next + every * 2 - now),
            _ => self.settings.lifetime,
        }
    }

    /// Whether a starting agent may elect: the cluster is known, and gossip
    /// has had time to show the other members. A node that elected before
    /// hearing from its peers would win every VIP alone and put them on the
    /// wire beside their real owners. Settled once a peer was seen, a few
    /// rounds passed (so its state, held VIPs included, arrived) and the
    /// failure detector has confirmed every node gossip reports (in a large
    /// cluster that takes a few seconds), or after [`STARTUP_GRACE`] with
    /// nobody to hear from (the first node of a cluster). Nodes the
    /// detector cannot reach hold it back for at most [`UNCONFIRMED_GRACE`].
    ///
    /// Peers that are still starting are no candidates, so two nodes that
    /// settle at the same moment would each elect as if the other were
    /// absent, and both add the VIPs the other wins. So a node that
    /// settles publishes `alive` at once but takes nothing for three more
    /// gossip rounds (`acquire_from`), by when it sees every peer that
    /// settled with it; one that settles later takes over from it make
    /// before break, as any returning node does.
    fn settle(&mut self, now: Instant) -> bool {
        let peers = self.view.unconfirmed > 0
            || self.view.nodes.iter().any(|n| n.node != self.settings.node);
        let settled = if peers {
            let first = *self.first_peer.get_or_insert(now);
            let waited = now.saturating_duration_since(first);
            let settled = (waited >= self.settings.gossip_interval * 3
                && self.view.unconfirmed == 0)
                || waited >= UNCONFIRMED_GRACE;
            if settled && self.view.unconfirmed > 0 {
                warn!(
                    unconfirmed = self.view.unconfirmed,
                    "electing although the failure detector has not reached every node gossip reports alive"
                );
            }
            settled
        } else {
            now.saturating_duration_since(self.started) >= STARTUP_GRACE
        };
        settled && self.cluster_known
    }

    /// This node as the election should see it: from its own links and
    /// phase, not from the echo of its gossip state, which lags.
    fn own_member(&self) -> Option<Member> {
        (self.phase == Phase::Running).then(|| Member {
            node: self.settings.node.clone(),
            leaving: false,
            virtual_mode: self.links.virtual_link.is_some(),
            on_link: Arc::clone(&self.on_link),
        })
    }

    /// Hands the membership (with this node as it is now) to the election
    /// and marks what it says moved.
    fn elect_members(&mut self) {
        let own = self.own_member();
        let me = self.settings.node.as_str();
        let moved = self.election.set_members(
            self.view
                .members
                .iter()
                .filter(|m| m.node != me)
                .chain(own.as_ref()),
        );
        if own != self.own_member {
            // Its interfaces or its candidacy changed: any duty may have.
            self.own_member = own;
            self.all_dirty = true;
        } else {
            self.mark(moved);
        }
    }

    /// Re-reads what this node should hold for the given addresses.
    fn mark(&mut self, ips: impl IntoIterator<Item = IpAddr>) {
        for ip in ips {
            let want = self.want_of(ip);
            match self.slots.get_mut(&ip) {
                Some(s) => s.want = want,
                None if want.is_some() => {
                    self.slots.insert(
                        ip,
                        Slot {
                            want,
                            ..Slot::default()
                        },
                    );
                }
                None => continue,
            }
            self.unsettled.insert(ip);
        }
    }

    fn want_of(&self, ip: IpAddr) -> Option<Want> {
        if self.phase != Phase::Running {
            return None;
        }
        let duty = self
            .election
            .duty(&self.settings.node, ip)
            .or_else(|| self.orphan_duty(ip))?;
        let (wants, missing) = self
            .links
            .wants(std::slice::from_ref(&duty), self.settings.lifetime);
        for (ip, what) in missing {
            debug!(%ip, missing = %what, "won, but the interface is not there");
        }
        wants.into_values().next()
    }

    /// Every duty again (a cluster view, new links, this node's own state).
    fn refresh_wants(&mut self) {
        let mut wants = if self.phase == Phase::Running {
            let mut duties = self.election.duties(&self.settings.node);
            let orphans: Vec<IpAddr> = self.orphans.keys().copied().collect();
            duties.extend(orphans.into_iter().filter_map(|ip| self.orphan_duty(ip)));
            let (wants, missing) = self.links.wants(&duties, self.settings.lifetime);
            for (ip, what) in missing {
                debug!(%ip, missing = %what, "won, but the interface is not there");
            }
            wants
        } else {
            BTreeMap::new()
        };
        for (ip, s) in &mut self.slots {
            let want = wants.remove(ip);
            if s.want != want {
                s.want = want;
                self.unsettled.insert(*ip);
            } else if !s.settled() {
                self.unsettled.insert(*ip);
            }
        }
        for (ip, want) in wants {
            self.slots.insert(
                ip,
                Slot {
                    want: Some(want),
                    ..Slot::default()
                },
            );
            self.unsettled.insert(ip);
        }
        self.report_dirty = true;
    }

    /// The one place a VIP's next move is chosen; see the module docs.
    fn decide(&mut self, ip: IpAddr, now: Instant, out: &mut Actions) {
        let Some(slot) = self.slots.get(&ip) else {
            self.unsettled.remove(&ip);
            return;
        };
        if slot.op.is_some() {
            return;
        }
        if let Some(r) = slot.retry
            && r.at > now
        {
            return;
        }
        let (want, held) = (slot.want.clone(), slot.held.clone());
        match (want, held) {
            (Some(want), Some(held)) if same_place(&want, &held) => {
                let slot = self.slots.get_mut(&ip).expect("present");
                slot.probing = None;
                let handed_back = slot.handover.take().is_some();
                slot.kept_for_views = false;
                if handed_back {
                    info!(%ip, "kept: this node wins it again");
                }
                if std::mem::take(&mut slot.adopted) {
                    info!(%ip, interface = %want.vip.interface, "kept an address of a previous run");
                    // Renewed now, and announced: a peer may have answered
                    // for it while this node was away.
                    slot.op = Some(Op::Add {
                        want: want.clone(),
                        renew: false,
                    });
                    out.add.push(want.vip.clone());
                }
                slot.held = Some(want.clone());
                if handed_back {
                    self.publish_dirty = true;
                }
                if self.slots[&ip].op.is_none()
                    && let Some((peer, why)) = self.contest(ip, now)
                {
                    warn!(%ip, reason = %why, "another live node holds it too; letting go");
                    // And stays off while it answers, even if gossip loses it.
                    self.conflicts.yield_to(ip, &peer, want.clone(), now);
                    let slot = self.slots.get_mut(&ip).expect("present");
                    slot.garp = None;
                    slot.contested = None;
                    slot.op = Some(Op::Remove {
                        vip: want.vip.clone(),
                        why,
                        stale: false,
                    });
                    out.remove.push(want.vip);
                }
            }
            (Some(want), held) => self.acquire(ip, want, held.is_some(), now, out),
            (None, Some(held)) => {
                if let Some(why) = self.may_release(ip, &held, now) {
                    // Whatever the hand-over came to, the cause is the stop.
                    let why = if self.is_leaving() && !why.starts_with("shutting down") {
                        format!("shutting down; {why}")
                    } else {
                        why
                    };
                    let slot = self.slots.get_mut(&ip).expect("present");
                    slot.garp = None;
                    slot.op = Some(Op::Remove {
                        vip: held.vip.clone(),
                        why,
                        stale: false,
                    });
                    out.remove.push(held.vip);
                }
            }
            (None, None) => {
                let slot = self.slots.get_mut(&ip).expect("present");
                slot.probing = None;
                slot.retry = None;
                self.conflicts.forget(ip);
            }
        }
        let slot = self.slots.get(&ip).expect("present");
        if slot.idle() {
            self.slots.remove(&ip);
            self.unsettled.remove(&ip);
        } else if slot.settled() {
            self.unsettled.remove(&ip);
        }
    }

    fn acquire(
        &mut self,
        ip: IpAddr,
        want: Want,
        held_here: bool,
        now: Instant,
        out: &mut Actions,
    ) {
        if self.phase != Phase::Running || now < self.acquire_from {
            return;
        }
        // A live peer with a newer view of the cluster holds it: by that
        // view it is where it belongs (this node's view lags, or lost a
        // contest over it; see `contest`).
        let newer_holder = (!held_here)
            .then(|| {
                self.alive_peers()
                    .find(|n| n.revision > self.revision && n.vips.contains(&ip))
                    .map(|n| n.node.clone())
            })
            .flatten();
        if let Some(peer) = newer_holder {
            self.conflicts.yield_to(ip, &peer, want, now);
            self.slots.get_mut(&ip).expect("present").probing = None;
            return;
        }
        let view = &self.view;
        let sessions = &self.sessions;
        let checked = match self.conflicts.holding_off(
            ip,
            now,
            |n| view.node(n).is_some(),
            |n| sessions.lapse(n),
        ) {
            Hold::Off => {
                self.slots.get_mut(&ip).expect("present").probing = None;
                return;
            }
            Hold::Released { checked } => checked,
            Hold::Free => false,
        };
        if checked {
            info!(%ip, "the gone owner's address lapsed and nobody answers; taking it");
        }
        if want.mode == Mode::Local && !held_here && !checked && self.needs_precheck(ip) {
            let slot = self.slots.get_mut(&ip).expect("present");
            match &mut slot.probing {
                None => {
                    debug!(%ip, "asking the LAN before taking it");
                    slot.probing = Some(Probing {
                        until: now + PRECHECK,
                        next: now + PRECHECK_EVERY,
                        left: PRECHECK_PROBES - 1,
                    });
                    out.probe.extend(want.target);
                    return;
                }
                Some(p) if now < p.until => {
                    if p.left > 0 && now >= p.next {
                        p.left -= 1;
                        p.next = now + PRECHECK_EVERY;
                        out.probe.extend(want.target);
                    }
                    return;
                }
                Some(_) => {}
            }
        }
        let mut want = want;
        if !held_here {
            want.vip.lifetime = self.aligned_lifetime(now);
        }
        let slot = self.slots.get_mut(&ip).expect("present");
        slot.probing = None;
        out.add.push(want.vip.clone());
        slot.op = Some(Op::Add { want, renew: false });
    }

    /// Gossip is isolated: the API shows agents running on other nodes (their
    /// records are fresh) and gossip has reached none of them for
    /// [`ISOLATED_AFTER`] (a firewall on UDP 7934, another key or cluster
    /// id, an advertise address nobody can reach). Such an agent would
    /// otherwise act alone and take every VIP. It acts as if partitioned
    /// instead: it asks the LAN before taking any VIP, and the conflict
    /// rule, which knows the other agents' MACs from their records, settles
    /// any second owner by the election's order.
    pub fn isolated(&self) -> bool {
        self.isolated
    }

    /// Gossip shows no live peer while the API shows other agents running:
    /// a start before gossip connected, or isolation. Nothing is taken
    /// without asking the LAN first meanwhile.
    pub fn lonely(&self) -> bool {
        !self.running_elsewhere.is_empty() && self.gossip_alone()
    }

    /// Addresses of the cluster's Services that the election gives to no
    /// node (no live, eligible, on-link candidate, and no node to hold it
    /// on its virtual interface). Before a first cluster view, none.
    pub fn vips_without_candidate(&self) -> usize {
        self.services_of
            .keys()
            .filter(|ip| {
                self.election.winner(**ip).is_none() && self.election.virtual_nodes(**ip).is_empty()
            })
            .count()
    }

    pub fn last_conflict(&self) -> Option<&ConflictSeen> {
        self.last_conflict.as_ref()
    }

    /// Gossip shows no live peer.
    pub fn gossip_alone(&self) -> bool {
        let me = &self.settings.node;
        !self.gossip_view.members.iter().any(|m| m.node != *me)
    }

    fn note_isolation(&mut self, now: Instant, out: &mut Actions) {
        if !self.lonely() {
            self.peer_seen = now;
        }
        let isolated =
            self.lonely() && now.saturating_duration_since(self.peer_seen) >= ISOLATED_AFTER;
        if isolated != self.isolated {
            self.isolated = isolated;
            out.isolated = Some(isolated);
            if isolated {
                warn!(
                    running = ?self.running_elsewhere,
                    "gossip reaches no other agent while the API shows agents running on other nodes; acting as if partitioned (check UDP {} between the hosts, gossip.key_file and gossip.cluster_id)",
                    crate::gossip::DEFAULT_PORT
                );
            } else {
                info!("gossip reaches other agents again");
            }
        }
    }

    /// Whether to ask the LAN before taking `ip`: unless a live node shows
    /// it held, and so hands it over make before break (both answer until
    /// it sees this node hold it), every takeover asks first. Its holder
    /// may have crashed, frozen, stalled, or be out of gossip's reach; and
    /// what this node has heard of who held it proves nothing: an owner
    /// that took it a moment ago may not have told yet (its state lost or
    /// late, or this agent just started).
    fn needs_precheck(&self, ip: IpAddr) -> bool {
        self.settings.wire
            && !self
                .view
                .nodes
                .iter()
                .any(|n| n.node != self.settings.node && n.vips.contains(&ip))
    }

    /// Why a held VIP this node no longer wins may go now, or `None` while
    /// it must stay. A live winner that has not yet shown the VIP in its
    /// gossip state gets up to [`HANDOVER_MAX`]; meanwhile this node stops
    /// announcing but keeps answering, so no request goes unanswered.
    fn may_release(&mut self, ip: IpAddr, held: &Want, now: Instant) -> Option<String> {
        let adopted = self.slots.get(&ip).is_some_and(|s| s.adopted);
        let link_up = self
            .links
            .by_index(held.vip.ifindex)
            .is_some_and(|l| l.carrier);
        if adopted && !link_up {
            return Some("its link has no carrier".into());
        }
        if adopted && self.phase == Phase::Starting {
            // Not decided before the first reconcile, unless another node
            // has taken it over meanwhile.
            let taken = self
                .view
                .members
                .iter()
                .any(|m| m.node != self.settings.node && self.holds(&m.node, ip));
            return taken.then(|| "another node holds it now".into());
        }
        if held.mode == Mode::Virtual || self.phase == Phase::Finishing {
            return Some(self.release_reason(ip));
        }
        if !link_up {
            return Some(format!("{} has no carrier", held.vip.interface));
        }
        let Some(mut winner) = self
            .election
            .winner(ip)
            .filter(|w| *w != self.settings.node)
            .map(str::to_string)
        else {
            if let Phase::Leaving { since } = self.phase
                && let Some(why) = self.leaving_without_successor(ip, since, now)
            {
                return why;
            }
            return Some(self.release_reason(ip));
        };
        // A winner with an older view of the cluster may not know the VIP;
        // the nodes that do take it then (see `orphans`): the first of them
        // is who to hand it to.
        if self
            .view
            .node(&winner)
            .is_some_and(|n| n.revision < self.revision)
        {
            let older = self.older_peers();
            if let Some(w) = self
                .election
                .winner_without(ip, |n| older.contains(n))
                .filter(|w| *w != self.settings.node)
            {
                winner = w.to_string();
            }
        }
        if self.holds(&winner, ip) {
            return Some(format!("{winner} holds it now"));
        }
        if self.slots.get(&ip).is_some_and(|s| {
            s.handover.is_some() && s.answered_by.as_deref() == Some(winner.as_str())
        }) {
            return Some(format!("{winner} answers for it on the wire"));
        }
        // A live peer whose view of the cluster is newer than ours holds it:
        // by the newer view, that is where it belongs. (Not any peer: one
        // with the same view that shows it may be letting it go right now.)
        if let Some(p) = self
            .alive_peers()
            .filter(|n| n.revision > self.revision)
            .map(|n| n.node.clone())
            .find(|n| self.holds(n, ip))
        {
            return Some(format!(
                "{p} holds it now, with a newer view of the cluster"
            ));
        }
        // Kept for differing views (below), and so is it on a peer with the
        // same view: the one the election ranks first keeps it.
        if self.slots.get(&ip).is_some_and(|s| s.kept_for_views)
            && let Some(p) = self
                .alive_peers()
                .filter(|n| {
                    n.revision == self.revision
                        && self.election.outranks(ip, &n.node, &self.settings.node) == Some(true)
                })
                .map(|n| n.node.clone())
                .find(|n| self.holds(n, ip))
        {
            return Some(format!("{p} keeps it too and ranks first"));
        }
        let winner_revision = self.view.node(&winner).map_or(0, |n| n.revision);
        let slot = self.slots.get_mut(&ip).expect("present");
        slot.garp = None;
        slot.contested = None;
        if slot.handover.is_none() {
            debug!(%ip, %winner, "handing over: waiting for the winner to hold it");
            slot.handover = Some(now);
            slot.answered_by = None;
            self.publish_dirty = true;
        }
        let since = slot.handover.expect("just set");
        if now.saturating_duration_since(since) >= HANDOVER_MAX {
            if winner_revision != self.revision {
                // The two views of the cluster differ (watches lag, or the
                // API server went away before both heard of a change). An
                // older winner may not know this address yet; a newer one
                // evidently does not think it wins. Either way, letting go
                // would leave nobody answering: keep answering until the
                // views agree or someone with the newer view holds it.
                debug!(%ip, %winner, winner_revision, revision = self.revision,
                    "the winner's view of the cluster differs; still answering");
                slot.handover = Some(now);
                // Shown as held again: this node answers for it until the
                // views agree, and another that keeps it too must see so.
                if !std::mem::replace(&mut slot.kept_for_views, true) {
                    self.publish_dirty = true;
                }
                return None;
            }
            warn!(%ip, %winner, "the winner did not show the address in time; releasing anyway");
            return Some(format!("{winner} wins it and did not show it held in time"));
        }
        None
    }

    /// A VIP this node holds and wins, which a live peer shows held too
    /// for [`HANDOVER_MAX`]: no planned move takes that long (the old
    /// owner stops showing a VIP it hands over), so the two nodes'
    /// views of the cluster differ: one's watches lag, or the API server
    /// went away while a change was on its way. The node with the older
    /// view lets go; with equal views (the memberships differ), the one the
    /// election ranks lower, liveness aside. Both sides compute the same.
    fn contest(&mut self, ip: IpAddr, now: Instant) -> Option<(String, String)> {
        let me = self.settings.node.as_str();
        let peers: Vec<(String, u64)> = self
            .alive_peers()
            .filter(|n| n.vips.contains(&ip))
            .map(|n| (n.node.clone(), n.revision))
            .collect();
        let slot = self.slots.get_mut(&ip).expect("present");
        if peers.is_empty() {
            slot.contested = None;
            return None;
        }
        let since = *slot.contested.get_or_insert(now);
        // A newer view settles it at once (once its word is fresh enough
        // to trust); equal views only after a planned move had its time.
        if let Some(peer) = peers
            .iter()
            .find(|(peer, revision)| *revision > self.revision && self.holds(peer, ip))
        {
            let why = format!("{} holds it too, with a newer view of the cluster", peer.0);
            return Some((peer.0.clone(), why));
        }
        if now.saturating_duration_since(since) < HANDOVER_MAX {
            return None;
        }
        peers.into_iter().find_map(|(peer, revision)| {
            if revision > self.revision {
                let why = format!("{peer} holds it too, with a newer view of the cluster");
                Some((peer, why))
            } else if revision == self.revision
                && self.election.outranks(ip, &peer, me) == Some(true)
            {
                let why = format!("{peer} holds it too and outranks this node");
                Some((peer, why))
            } else {
                None
            }
        })
    }

    /// Whether `node`'s gossip shows it holding `ip`. Right after this node
    /// came to hold `ip`, only in a state published since: an older one may
    /// be that of the node that just handed the VIP to this one, whose word
    /// that it let go has not arrived yet. After a few gossip rounds that
    /// word would have come, and the state stands.
    fn holds(&self, node: &str, ip: IpAddr) -> bool {
        let settle = self.settings.gossip_interval * GOSSIP_ROUNDS_TO_SETTLE;
        let fresh_since = self
            .slots
            .get(&ip)
            .and_then(|s| s.held_since)
            .filter(|since| self.now.saturating_duration_since(*since) < settle);
        self.view.node(node).is_some_and(|n| n.vips.contains(&ip))
            && fresh_since
                .is_none_or(|since| self.vips_changed.get(node).is_some_and(|t| *t > since))
    }

    /// Leaving, and by this node's view nobody else may hold `ip`. A live
    /// peer may know better: a change that makes it eligible (an
    /// advertisement widened a moment ago) can be on its way here. So the
    /// VIP is kept while a live peer has a newer view, or for
    /// [`LEAVE_GRACE_ROUNDS`] gossip rounds after the leave began, unless a
    /// live peer already holds it. `None`: not this rule's case.
    fn leaving_without_successor(
        &self,
        ip: IpAddr,
        since: Instant,
        now: Instant,
    ) -> Option<Option<String>> {
        let peers: Vec<&crate::gossip::MemberInfo> = self.alive_peers().collect();
        if peers.is_empty() {
            return None;
        }
        if let Some(p) = peers.iter().find(|n| self.holds(&n.node, ip)) {
            return Some(Some(format!("{} holds it now", p.node)));
        }
        let newer = peers.iter().any(|n| n.revision > self.revision);
        let grace = self.settings.gossip_interval * LEAVE_GRACE_ROUNDS;
        (newer || now.saturating_duration_since(since) < grace).then_some(None)
    }

    /// Why this node no longer holds `ip`, in words: the first rule it
    /// fails, or who wins.
    fn release_reason(&self, ip: IpAddr) -> String {
        if self.is_leaving() {
            return "shutting down".into();
        }
        let Some(report) = self.election.explain(ip) else {
            return "no Service has the address any more".into();
        };
        if let Some(x) = report
            .excluded
            .iter()
            .find(|x| x.node == self.settings.node)
        {
            return match x.reason {
                Reason::NoReadyEndpoint => match report.note {
                    Some(n) => n.to_string(),
                    None => x.reason.explain().to_string(),
                },
                r => r.explain().to_string(),
            };
        }
        match (report.winner, report.note) {
            (Some(w), _) => format!("{w} wins it"),
            (None, Some(n)) => n.to_string(),
            (None, None) => "this node no longer wins it".into(),
        }
    }

    fn on_done(&mut self, r: OpResult, now: Instant, out: &mut Actions) {
        let Some(slot) = self.slots.get_mut(&r.ip) else {
            return;
        };
        let Some(op) = slot.op.take() else {
            return;
        };
        self.unsettled.insert(r.ip);
        let ip = r.ip;
        match (op, r.result) {
            (Op::Add { want, renew: true }, Ok(Applied::Done)) => {
                out.metrics.push(Metric::Op {
                    op: "renew",
                    ok: true,
                });
                if slot.held.as_ref().is_some_and(|h| same_place(h, &want)) {
                    slot.expires = expiry(&want, now);
                    slot.held = Some(want);
                    self.beat_dirty = true;
                }
            }
            (Op::Add { renew: true, .. }, Ok(Applied::NotOurs)) => {
                warn!(%ip, "address is no longer ours (added by hand?); leaving it alone");
                slot.held = None;
                slot.held_since = None;
                slot.garp = None;
                self.publish_dirty = true;
                self.report_dirty = true;
            }
            (Op::Add { renew: true, .. }, Err(e)) => {
                out.metrics.push(Metric::Op {
                    op: "renew",
                    ok: false,
                });
                warn!(%ip, error = %e, "renewing failed; retrying at the next renewal");
            }
            (Op::Add { want, .. }, Ok(Applied::Done)) => {
                out.metrics.push(Metric::Op {
                    op: "add",
                    ok: true,
                });
                slot.retry = None;
                slot.expires = expiry(&want, now);
                let previous = slot.held.replace(want.clone());
                if previous.is_none() {
                    slot.held_since = Some(now);
                }
                slot.handover = None;
                slot.kept_for_views = false;
                if let Some(target) = want.target {
                    out.garp.push(target);
                    slot.garp = (self.settings.garp.count > 1).then(|| Garp {
                        left: self.settings.garp.count - 1,
                        next: now + self.settings.garp.interval,
                    });
                }
                let fresh = previous.is_none();
                let moved = previous.filter(|p| p.vip.ifindex != want.vip.ifindex);
                let fresh = fresh || moved.is_some();
                if let Some(p) = moved {
                    slot.op = Some(Op::Remove {
                        vip: p.vip.clone(),
                        why: format!("moved to {}", want.vip.interface),
                        stale: true,
                    });
                    out.remove.push(p.vip);
                }
                self.foreign.remove(&ip);
                self.publish_dirty = true;
                self.report_dirty = true;
                if fresh {
                    info!(%ip, interface = %want.vip.interface, prefix_len = want.vip.prefix_len,
                        mode = ?want.mode, "acquired");
                    self.observe_takeover(ip, now, out);
                    let (reason, note) = match want.mode {
                        Mode::Local => (
                            reasons::ANNOUNCING_LOCAL,
                            format!(
                                "{} answers for {ip} on {}",
                                self.settings.node, want.vip.interface
                            ),
                        ),
                        Mode::Virtual => (
                            reasons::ANNOUNCING_VIRTUAL,
                            format!(
                                "{} holds {ip} on {} for routing",
                                self.settings.node, want.vip.interface
                            ),
                        ),
                    };
                    self.event_for(ip, false, reason, note, out);
                }
            }
            (Op::Add { want, .. }, Ok(Applied::NotOurs)) => {
                out.metrics.push(Metric::Op {
                    op: "add",
                    ok: true,
                });
                // Looked at again later, in case it is taken away.
                self.backoff(ip);
                if self.foreign.insert(ip) {
                    warn!(%ip, interface = %want.vip.interface,
                        "won, but the host already holds this address and the agent did not add it; leaving it alone");
                    let note = format!(
                        "{} won {ip} but {} already holds it, added outside hostlb; it is left alone",
                        self.settings.node, want.vip.interface
                    );
                    self.event_for(ip, true, "AddressConflict", note, out);
                }
            }
            (Op::Add { .. }, Err(e)) => {
                out.metrics.push(Metric::Op {
                    op: "add",
                    ok: false,
                });
                let delay = self.backoff(ip);
                warn!(%ip, error = %e, retry_in = ?delay, "cannot add the address");
            }
            (Op::Remove { vip, why, stale }, Ok(_)) => {
                out.metrics.push(Metric::Op {
                    op: "remove",
                    ok: true,
                });
                if stale {
                    return;
                }
                slot.held = None;
                slot.held_since = None;
                slot.garp = None;
                slot.handover = None;
                slot.kept_for_views = false;
                slot.retry = None;
                let adopted = std::mem::take(&mut slot.adopted);
                self.publish_dirty = true;
                self.report_dirty = true;
                if adopted {
                    info!(%ip, interface = %vip.interface, reason = %why,
                        "removed an address of a previous run");
                } else {
                    info!(%ip, interface = %vip.interface, reason = %why, "released");
                    let note = format!("{} no longer answers for {ip} ({why})", self.settings.node);
                    self.event_for(ip, false, reasons::WITHDRAWN, note, out);
                }
            }
            (Op::Remove { vip, .. }, Err(e)) => {
                out.metrics.push(Metric::Op {
                    op: "remove",
                    ok: false,
                });
                let delay = self.backoff(ip);
                warn!(%ip, interface = %vip.interface, error = %e, retry_in = ?delay,
                    "cannot remove the address");
            }
        }
    }

    /// Schedules the next try at `ip`, doubling the delay each time.
    fn backoff(&mut self, ip: IpAddr) -> Duration {
        let now_retry = self.slots.get(&ip).and_then(|s| s.retry);
        let delay = now_retry
            .map(|r| (r.delay * 2).min(RETRY_MAX))
            .unwrap_or(RETRY_MIN);
        let at = self.now + delay;
        if let Some(s) = self.slots.get_mut(&ip) {
            s.retry = Some(Retry { at, delay });
        }
        delay
    }

    fn on_claim(&mut self, claim: Claim, now: Instant, out: &mut Actions) {
        let Some(slot) = self.slots.get(&claim.ip) else {
            // Only yielded VIPs, which may have no slot, refresh their yield.
            self.judge(claim, None, now);
            return;
        };
        if slot.handover.is_some()
            && let Some(node) = self.conflicts.owner_of(claim.mac)
            && node != self.settings.node
        {
            let node = node.to_string();
            let slot = self.slots.get_mut(&claim.ip).expect("present");
            if slot.answered_by.as_ref() != Some(&node) {
                debug!(ip = %claim.ip, %node, "answered for on the wire while handing over");
                slot.answered_by = Some(node);
                self.unsettled.insert(claim.ip);
            }
        }
        let Some(slot) = self.slots.get(&claim.ip) else {
            return;
        };
        // While asking the LAN, the VIP is judged as if held here: an owner
        // that outranks this node makes it stay off.
        let held = if slot.probing.is_some() {
            slot.want.clone()
        } else {
            slot.held
                .clone()
                .filter(|h| h.mode == Mode::Local && slot.handover.is_none() && slot.op.is_none())
        };
        let probing = slot.probing.is_some();
        let mut verdict = self.judge(claim, held.as_ref(), now);
        if let Verdict::Keep { other } = &verdict
            && self.phase != Phase::Running
        {
            // Not a candidate (still starting, without a view of the
            // cluster to rank by, or leaving): the other hostlb node that
            // answers keeps it.
            let to = other.clone();
            if let Some(want) = held.clone() {
                self.conflicts.yield_to(claim.ip, &to, want, now);
            }
            verdict = Verdict::Yield { to };
        }
        match verdict {
            Verdict::Ignore => {}
            Verdict::Keep { other } => {
                if probing {
                    return;
                }
                let slot = self.slots.get_mut(&claim.ip).expect("present");
                if slot.garp.is_some()
                    || slot
                        .kept_at
                        .is_some_and(|t| now.saturating_duration_since(t) < OWNER_PROBE)
                {
                    return;
                }
                slot.kept_at = Some(now);
                warn!(ip = %claim.ip, %other, mac = %claim.mac,
                    "second owner on the wire; this node outranks it and keeps the address");
                out.metrics.push(Metric::Conflict("hostlb"));
                self.last_conflict = Some(ConflictSeen {
                    ip: claim.ip,
                    mac: claim.mac,
                    node: Some(other),
                    outcome: "kept",
                });
                if let Some(t) = held.and_then(|h| h.target) {
                    out.garp.push(t);
                    slot.garp = (self.settings.garp.count > 1).then(|| Garp {
                        left: self.settings.garp.count - 1,
                        next: now + self.settings.garp.interval,
                    });
                    self.unsettled.insert(claim.ip);
                }
            }
            Verdict::Yield { to } => {
                out.metrics.push(Metric::Conflict("hostlb"));
                self.last_conflict = Some(ConflictSeen {
                    ip: claim.ip,
                    mac: claim.mac,
                    node: Some(to.clone()),
                    outcome: "yielded",
                });
                let slot = self.slots.get_mut(&claim.ip).expect("present");
                self.unsettled.insert(claim.ip);
                if probing {
                    warn!(ip = %claim.ip, winner = %to, mac = %claim.mac,
                        "won, but a node that outranks this one still answers for it; staying off while it does");
                    slot.probing = None;
                    return;
                }
                warn!(ip = %claim.ip, winner = %to, mac = %claim.mac,
                    "second owner on the wire; it outranks this node, which lets go while it answers");
                if let Some(h) = slot.held.clone() {
                    slot.garp = None;
                    slot.op = Some(Op::Remove {
                        vip: h.vip.clone(),
                        why: "another node that outranks this one answers for it".into(),
                        stale: false,
                    });
                    out.remove.push(h.vip);
                }
            }
            Verdict::Foreign { first } => {
                if probing {
                    if first {
                        // Reported once the address is held here and it
                        // still answers.
                        self.conflicts.forget_report(claim.ip, claim.mac);
                    }
                    return;
                }
                out.metrics.push(Metric::Conflict("foreign"));
                self.last_conflict = Some(ConflictSeen {
                    ip: claim.ip,
                    mac: claim.mac,
                    node: None,
                    outcome: "reported",
                });
                if first {
                    warn!(ip = %claim.ip, mac = %claim.mac,
                        "another host answers for this address and it is no hostlb node; not fighting over it");
                    let note = format!(
                        "{} holds {} but the host with MAC {} answers for it too, and it is no hostlb node",
                        self.settings.node, claim.ip, claim.mac
                    );
                    self.event_for(claim.ip, true, "AddressConflict", note, out);
                }
            }
        }
    }

    fn judge(&mut self, claim: Claim, held: Option<&Want>, now: Instant) -> Verdict {
        let view = &self.view;
        self.conflicts.judge(
            claim,
            &self.settings.node,
            &self.links.macs(),
            held,
            &self.election,
            |n| view.node(n).is_some(),
            now,
        )
    }

    fn begin_leave(&mut self, now: Instant, out: &mut Actions) {
        if self.is_leaving() {
            return;
        }
        info!(
            held = self.held_count(),
            "leaving: handing VIPs over before exit"
        );
        out.leave = true;
        self.phase = Phase::Leaving { since: now };
        self.publish_dirty = true;
        self.elect_members();
        self.all_dirty = true;
    }

    /// Renews every held address each third of its lifetime, in one batch.
    fn renew(&mut self, now: Instant, out: &mut Actions) {
        let Some(every) = self.settings.lifetime.renew_every() else {
            self.next_renew = None;
            return;
        };
        let due = *self.next_renew.get_or_insert(now + every);
        if now < due {
            return;
        }
        self.next_renew = Some(now + every);
        for s in self.slots.values_mut() {
            if s.op.is_some() {
                continue;
            }
            if let Some(h) = &s.held {
                let mut want = h.clone();
                want.vip.lifetime = self.settings.lifetime;
                out.add.push(want.vip.clone());
                s.op = Some(Op::Add { want, renew: true });
            }
        }
    }

    /// Asks the LAN about every VIP held here (each [`OWNER_PROBE`]) and
    /// every VIP yielded to another node (each [`YIELD_PROBE`]); sends the
    /// announcement rounds that are due.
    fn probe_wire(&mut self, now: Instant, out: &mut Actions) {
        for s in self.slots.values_mut() {
            let (Some(g), Some(h)) = (s.garp, &s.held) else {
                continue;
            };
            if g.next > now {
                continue;
            }
            if let Some(t) = h.target {
                out.garp.push(t);
            }
            s.garp = (g.left > 1).then(|| Garp {
                left: g.left - 1,
                next: now + self.settings.garp.interval,
            });
        }
        if let Some(every) = self.settings.garp.refresh {
            let due = *self.next_refresh.get_or_insert(now + every);
            if now >= due {
                self.next_refresh = Some(now + every);
                // One batch for every VIP: a round is two frames, so even
                // a thousand VIPs are a moment's burst. Those still in
                // their first rounds, in dispute, or on their way out are
                // left alone.
                out.garp.extend(
                    self.slots
                        .values()
                        .filter(|s| {
                            s.garp.is_none()
                                && s.handover.is_none()
                                && s.contested.is_none()
                                // A renewal in flight leaves it held; the
                                // two timers may well keep step.
                                && matches!(s.op, None | Some(Op::Add { renew: true, .. }))
                        })
                        .filter_map(|s| s.held.as_ref())
                        .filter(|h| h.mode == Mode::Local)
                        .filter_map(|h| h.target),
                );
            }
        }
        if !self.settings.wire {
            return;
        }
        if now >= self.next_yield_probe {
            self.next_yield_probe = now + YIELD_PROBE;
            self.next_lapse_probe = now + LAPSE_PROBE;
            out.probe
                .extend(self.conflicts.yielded().filter_map(|(_, y)| y.want.target));
        } else if now >= self.next_lapse_probe {
            self.next_lapse_probe = now + LAPSE_PROBE;
            let sessions = &self.sessions;
            out.probe.extend(
                self.conflicts
                    .yielded()
                    .filter(|(_, y)| lapsing(sessions.lapse(&y.to), now))
                    .filter_map(|(_, y)| y.want.target),
            );
        }
        if now >= self.next_owner_probe {
            self.next_owner_probe = now + OWNER_PROBE;
            out.probe.extend(
                self.slots
                    .values()
                    .filter(|s| s.handover.is_none() && s.op.is_none())
                    .filter_map(|s| s.held.as_ref())
                    .filter(|h| h.mode == Mode::Local)
                    .filter_map(|h| h.target),
            );
        }
    }

    /// The outputs that follow the state: gossip, the watched addresses,
    /// annotations, readiness and status.
    fn report(&mut self, now: Instant, out: &mut Actions) {
        // Held addresses change with what is published; worked out only
        // then, not at every step (beats arrive many times a second).
        let peers_changed = self.sessions.take_changed();
        if std::mem::take(&mut self.beat_dirty) || self.publish_dirty || peers_changed {
            let plan = self.next_beat_plan();
            if self.beat_plan.as_ref() != Some(&plan) {
                self.beat_plan = Some(plan.clone());
                out.beat = Some(plan);
            }
        }
        if self.publish_dirty {
            self.publish_dirty = false;
            let local = self.local_state();
            if self.published.as_ref() != Some(&local) {
                self.published = Some(local.clone());
                out.publish = Some(local);
            }
        }
        // Compared in place (every step comes here), built only when it
        // changed.
        let watched = || {
            merged(
                self.slots
                    .iter()
                    .filter(|(_, s)| s.held.is_some() || s.probing.is_some())
                    .map(|(ip, _)| *ip),
                self.conflicts.yielded().map(|(ip, _)| *ip),
            )
        };
        if !watched().eq(self.watched.iter().copied()) {
            let watched: BTreeSet<IpAddr> = watched().collect();
            self.watched = watched.clone();
            out.watch = Some(watched);
        }
        if self.report_dirty && self.cluster_known {
            self.report_dirty = false;
            let announcing = self.announcing();
            if self.announced.as_ref() != Some(&announcing) {
                self.announced = Some(announcing.clone());
                out.announcing = Some(announcing);
            }
        }
        if self.phase == Phase::Running
            && !self.ready
            && now >= self.acquire_from
            && self
                .slots
                .values()
                .all(|s| s.op.is_none() && s.probing.is_none())
        {
            self.ready = true;
            info!(
                held = self.held_count(),
                members = self.view.members.len(),
                "first reconcile applied; ready"
            );
            out.ready = true;
        }
        let status = (self.held_count(), self.view.members.len());
        if self.ready && self.last_status != Some(status) {
            self.last_status = Some(status);
            out.status = Some(format!(
                "holding {} VIPs; {} live members",
                status.0, status.1
            ));
        }
    }

    /// The annotations this node is responsible for: the VIPs it holds and
    /// wins; and, on the first live member by name, clearing those nobody
    /// announces and naming the nodes that hold each VIP on their virtual
    /// interfaces (several hold it at once, so no one of them can say).
    fn announcing(&self) -> Announcing {
        let mut out = Announcing::new();
        let janitor = self
            .view
            .members
            .first()
            .is_some_and(|m| m.node == self.settings.node);
        for (ip, svcs) in &self.services_of {
            let family = Family::of(*ip);
            let slot = self.slots.get(ip);
            let local = match slot.and_then(|s| s.want.as_ref().zip(s.held.as_ref())) {
                Some((w, h)) if w.mode == Mode::Local && same_place(w, h) => {
                    Some(Some(format!("{},{}", self.settings.node, w.vip.interface)))
                }
                _ if janitor && self.election.winner(*ip).is_none() => Some(None),
                _ => None,
            };
            let routed = janitor.then(|| {
                let nodes = self.election.virtual_nodes(*ip);
                (!nodes.is_empty()).then(|| annotations::virtual_value(&nodes))
            });
            for s in svcs {
                if let Some(v) = &local {
                    out.insert(
                        (s.clone(), annotations::announcing(family, false)),
                        v.clone(),
                    );
                }
                if let Some(v) = &routed {
                    out.insert(
                        (s.clone(), annotations::announcing(family, true)),
                        v.clone(),
                    );
                }
            }
        }
        out
    }

    fn next_wake(&self, now: Instant) -> Option<Instant> {
        // Only deadlines still ahead: one that has passed was acted on in
        // this step, or waits on something else that has its own deadline
        // (a VIP whose retry is due while a yield holds it off). Waking
        // for it again now would spin.
        let mut wake: Option<Instant> = None;
        let mut at = |t: Instant| {
            if t > now {
                wake = Some(wake.map_or(t, |w| w.min(t)));
            }
        };
        for ip in &self.unsettled {
            let Some(s) = self.slots.get(ip) else {
                continue;
            };
            if s.op.is_some() {
                continue;
            }
            if let Some(r) = s.retry {
                at(r.at);
            }
            if let Some(p) = s.probing {
                at(p.until);
                if p.left > 0 {
                    at(p.next);
                }
            }
            if let Some(h) = s.handover {
                at(h + HANDOVER_MAX);
            }
            if let Some(c) = s.contested {
                at(c + HANDOVER_MAX);
            }
            if let Some(g) = s.garp {
                at(g.next);
            }
            if let Some(y) = self.conflicts.yield_of(*ip) {
                let lapse = self.sessions.lapse(&y.to);
                at(conflict::yield_ends(y.seen, lapse, now));
                if let Some(l) = lapse {
                    at(l.first.checked_sub(LAPSE_EARLY).unwrap_or(l.first));
                }
            }
        }
        if let Some(r) = self.next_renew
            && self.slots.values().any(|s| s.held.is_some())
        {
            at(r);
        }
        if let Some(r) = self.next_refresh
            && self.settings.garp.refresh.is_some()
            && self.slots.values().any(|s| s.held.is_some())
        {
            at(r);
        }
        for since in self.orphans.values() {
            at(*since + HANDOVER_MAX);
        }
        if let Some(d) = self.sessions.deadline() {
            at(d);
        }
        if !self.isolated && self.lonely() {
            at(self.peer_seen + ISOLATED_AFTER);
        }
        if let Some(due) = self.watch_due {
            at(due.max(self.watched_at + WATCH_EVERY));
        }
        if self.settings.wire {
            if self.conflicts.yielded().next().is_some() {
                at(self.next_yield_probe);
            }
            if self
                .conflicts
                .yielded()
                .any(|(_, y)| lapsing(self.sessions.lapse(&y.to), now))
            {
                at(self.next_lapse_probe);
            }
            if self.slots.values().any(|s| s.held.is_some()) {
                at(self.next_owner_probe);
            }
        }
        match self.phase {
            Phase::Starting => match self.first_peer {
                Some(first) => {
                    at(first + self.settings.gossip_interval * 3);
                    at(first + UNCONFIRMED_GRACE);
                }
                None => at(self.started + STARTUP_GRACE),
            },
            Phase::Leaving { since } => {
                at(since + self.settings.gossip_interval * LEAVE_GRACE_ROUNDS);
                at(since + LEAVE_MAX);
            }
            Phase::Running if now < self.acquire_from => at(self.acquire_from),
            _ => {}
        }
        wake
    }

    fn observe_takeover(&mut self, ip: IpAddr, now: Instant, out: &mut Actions) {
        // The previous holder per gossip, if it is one we saw go.
        let from = self
            .lost_at
            .iter()
            .filter(|(node, _)| self.conflicts.last_holder(ip) == Some(node.as_str()))
            .map(|(_, t)| *t)
            .max();
        if let Some(t) = from
            && now.saturating_duration_since(t) < TAKEOVER_WINDOW
        {
            out.metrics
                .push(Metric::Takeover(now.saturating_duration_since(t)));
        }
    }

    fn event_for(
        &self,
        ip: IpAddr,
        warning: bool,
        reason: &'static str,
        note: String,
        out: &mut Actions,
    ) {
        for svc in self.services_of.get(&ip).into_iter().flatten() {
            out.events.push(EventRequest {
                service: svc.clone(),
                warning,
                reason,
                note: note.clone(),
            });
        }
    }

    fn set_revision(&mut self, revision: u64) {
        if revision != self.revision {
            self.revision = revision;
            self.publish_dirty = true;
            self.orphan_scan = true;
        }
    }

    /// Live peers whose view of the cluster is older than this node's.
    /// The other nodes gossip shows live and `alive` (candidates, not
    /// starting or leaving), with what they publish.
    fn alive_peers(&self) -> impl Iterator<Item = &crate::gossip::MemberInfo> {
        self.view
            .nodes
            .iter()
            .filter(|n| n.node != self.settings.node && n.status == Status::Alive)
    }

    fn older_peers(&self) -> BTreeSet<String> {
        self.alive_peers()
            .filter(|n| n.revision < self.revision)
            .map(|n| n.node.clone())
            .collect()
    }

    /// VIPs nobody may serve because their winner does not know them: its
    /// view of the cluster is older than this node's (its watches lag, or
    /// the API server went away before it heard of the Service), and it
    /// does not show them held. After [`HANDOVER_MAX`] the nodes that do
    /// know take them: the first of them in the election's order (each
    /// computes the same), until the views agree again and the winner
    /// takes over, make before break.
    fn orphans(&mut self, now: Instant) {
        self.orphan_scan = false;
        let older = self.older_peers();
        let mut found = BTreeMap::new();
        if !older.is_empty() && self.phase == Phase::Running {
            for (ip, winner) in self.election.winners() {
                let Some(w) = winner.filter(|w| older.contains(*w)) else {
                    continue;
                };
                // Whoever else holds it meanwhile (an earlier fallback) does
                // not make it the winner's: the fallback's order decides.
                // Nor does the winner showing it held, once this node has
                // taken it as the fallback: an older winner answers for it
                // only until a node with the newer view holds it (see
                // `may_release`), so if this node let go to it in turn,
                // each would let go to the other and nobody would answer.
                let taken_here = self
                    .orphans
                    .get(&ip)
                    .is_some_and(|since| now.saturating_duration_since(*since) >= HANDOVER_MAX)
                    && self
                        .slots
                        .get(&ip)
                        .is_some_and(|s| s.held.is_some() && s.handover.is_none());
                if taken_here || !self.view.node(w).is_some_and(|n| n.vips.contains(&ip)) {
                    found.insert(ip, self.orphans.get(&ip).copied().unwrap_or(now));
                }
            }
        }
        let changed: Vec<IpAddr> = found
            .keys()
            .filter(|ip| !self.orphans.contains_key(ip))
            .chain(self.orphans.keys().filter(|ip| !found.contains_key(ip)))
            .copied()
            .collect();
        if !changed.is_empty() {
            debug!(
                orphans = found.len(),
                "VIPs whose winner has an older view of the cluster"
            );
        }
        self.orphans = found;
        self.mark(changed);
    }

    /// The duty for an orphaned VIP whose grace has passed.
    fn orphan_duty(&self, ip: IpAddr) -> Option<crate::election::Duty> {
        let since = self.orphans.get(&ip)?;
        if self.now.saturating_duration_since(*since) < HANDOVER_MAX {
            return None;
        }
        let older = self.older_peers();
        self.election
            .duty_without(&self.settings.node, ip, |n| older.contains(n))
    }

    fn note_object_errors(&mut self, errors: Vec<String>) {
        for e in errors.iter().filter(|e| !self.object_errors.contains(e)) {
            warn!(error = %e, "object left out");
        }
        self.object_errors = errors;
    }

    /// An address of a previous run as a held VIP.
    fn adopted_want(&self, a: &OwnedAddress) -> Want {
        let virtual_link = self
            .links
            .virtual_link
            .as_ref()
            .is_some_and(|v| v.index == a.ifindex);
        Want {
            vip: a.vip(self.settings.lifetime),
            mode: if virtual_link {
                Mode::Virtual
            } else {
                Mode::Local
            },
            target: if virtual_link {
                None
            } else {
                self.links
                    .by_index(a.ifindex)
                    .and_then(|i| Target::on(i, a.ip))
            },
        }
    }

    /// The peers' gossip addresses, for `cleanup`.
    pub fn peers(&self) -> Vec<SocketAddr> {
        let mut peers: Vec<SocketAddr> = self
            .view
            .nodes
            .iter()
            .filter(|n| n.node != self.settings.node)
            .map(|n| n.gossip_addr)
            .collect();
        peers.sort();
        peers
    }

    /// `/status`: `not_ready` and `api_healthy` come from the shell.
    pub fn status_doc(&self, not_ready: Option<&str>, api_healthy: bool) -> StatusDoc {
        StatusDoc {
            node: self.settings.node.clone(),
            ready: not_ready.is_none(),
            not_ready: not_ready.map(str::to_string),
            api_healthy,
            warnings: Vec::new(),
            isolated_from: if self.isolated {
                self.running_elsewhere.iter().cloned().collect()
            } else {
                Vec::new()
            },
            members: self
                .view
                .nodes
                .iter()
                .map(|n| MemberDoc {
                    node: n.node.clone(),
                    status: n.status.as_str().to_string(),
                    gossip: n.gossip_addr.to_string(),
                    version: n.agent_version.clone(),
                    protocol: n.protocol,
                    prefixes: n
                        .on_link
                        .iter()
                        .map(|o| {
                            format!(
                                "{}@{}{}",
                                o.prefix,
                                o.interface,
                                if o.announce { "*" } else { "" }
                            )
                        })
                        .collect(),
                    vips: n.vips.len(),
                })
                .collect(),
            held: self
                .slots
                .iter()
                .filter_map(|(ip, s)| {
                    let h = s.held.as_ref()?;
                    Some(HeldDoc {
                        ip: *ip,
                        interface: h.vip.interface.clone(),
                        prefix_len: h.vip.prefix_len,
                        mode: format!("{:?}", h.mode).to_lowercase(),
                        handing_over: s.handover.is_some(),
                    })
                })
                .collect(),
            vips: self
                .election
                .report_all()
                .iter()
                .map(VipDoc::from_report)
                .collect(),
            object_errors: self.object_errors.clone(),
        }
    }
}

/// When the kernel drops an address added or renewed `now` (the kernel
/// counts whole seconds from when it took the request, a moment earlier).
fn expiry(want: &Want, now: Instant) -> Option<Instant> {
    want.vip
        .lifetime
        .kernel_seconds()
        .map(|s| now + Duration::from_secs(s.into()))
}

/// Two ascending iterators as one, each item once.
fn merged<T: Ord + Copy>(
    a: impl Iterator<Item = T>,
    b: impl Iterator<Item = T>,
) -> impl Iterator<Item = T> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if x < y => a.next(),
        (Some(x), Some(y)) if y < x => b.next(),
        (Some(_), Some(_)) => {
            b.next();
            a.next()
        }
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}

fn same_place(a: &Want, b: &Want) -> bool {
    a.vip.ifindex == b.vip.ifindex && a.vip.prefix_len == b.vip.prefix_len && a.mode == b.mode
}
