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
//! VIP being asked about is [`State::Probing`](slot::State) until its
//! window ends, a VIP in the kernel's hands has an operation in flight
//! until its result comes back as an input. So every VIP of a dead node
//! is asked about in the same window and added in the same batch, and the
//! shell keeps serving its other inputs meanwhile.
//!
//! # One VIP
//!
//! Each VIP this node deals with has a [`Slot`]: what the election and the
//! links want here (`want`), and one [`State`](slot::State) for what the
//! kernel does for it: free, asked about on the LAN, being added, or held
//! (a [`Held`](slot::Held) that carries what only a held VIP has: its
//! hand-over, contest, announcements and expiry, gone with it) with at
//! most one operation on it in flight (a renewal, an add at a new place,
//! a release, the removal of an old place). Each state carries only what
//! is legal in it, and the slot's methods are its only transitions.
//! [`Core::decide`] is the one place a VIP's next move is chosen:
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

mod acquire;
mod api;
mod cadence;
pub mod conflict;
mod dating;
mod guard;
mod isolation;
mod kernel;
pub mod links;
mod membership;
pub mod moves;
mod orphans;
mod outputs;
mod own;
mod reason;
mod release;
mod sent;
mod services;
pub mod sessions;
mod settling;
mod slot;
#[cfg(test)]
mod tests;
pub mod upstream;
mod view;
mod vips;
mod watching;
mod wire;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::election::{Cluster, Election, NodeName};
use crate::model::VipAddress;
use crate::model::{Firewall, FirewallPlan, MembershipView};
use conflict::Conflicts;
use links::{Links, Mode, Want};
use sessions::{Beat, Lapse, Sessions};

pub use api::{
    Actions, AgentRecord, Announcing, BeatPlan, ConflictKind, ConflictOutcome, ConflictSeen,
    EventRequest, Input, Metric, Move, MoveCause, OpError, OpKind, OpName, OpResult, Relay,
    Settings, Unable,
};
use slot::{Held, State};

/// Longest wait, when giving a VIP to a live winner, for its gossip state to
/// show it holds the address before this node removes it anyway.
pub const HANDOVER_MAX: Duration = Duration::from_secs(2);
/// How long a change to the cluster takes to reach every agent's view and
/// its word of it every peer: a watch (tens of ms) and a few gossip rounds.
/// An orphan nobody answers for waits this long for its winner to catch up
/// (see [`Core::orphans`]), not [`HANDOVER_MAX`].
pub const VIEW_SPREAD: Duration = Duration::from_millis(250);
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
/// A VIP this node won but whose add the kernel refused is dark until the
/// add lands (or still answers where it was, if it was moving): for
/// [`ADD_FAST_FOR`] its retries double no further than this, so that it
/// answers this soon after a brief refusal ends. Each retry costs a
/// netlink request and the pre-check's questions on the wire; nobody
/// answering costs every client of the VIP.
pub const ADD_RETRY_MAX: Duration = Duration::from_millis(400);
/// How long refused adds are retried at most [`ADD_RETRY_MAX`] apart. A
/// kernel that refuses longer (a lasting error: permissions, an address
/// the interface will not take) is asked with the usual backoff, up to
/// [`RETRY_MAX`], and not with three ARP questions per VIP every 0.4 s.
pub const ADD_FAST_FOR: Duration = Duration::from_secs(10);
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
    /// When membership settles, and when a new candidate may take VIPs:
    /// a few gossip rounds after it became one, so peers that became
    /// candidates at the same moment are seen by then (see
    /// [`Core::settle`]); and what it let go while starting (see
    /// [`Core::starting_comebacks`]).
    settling: settling::Settling,
    /// The last step that followed a full read of the wire (a
    /// [`Input::Tick`]: the shell reads every claim that arrived before a
    /// deadline first). A pre-check concludes that nobody answered only
    /// at such a step: on a busy host another input (beats, a kernel
    /// result) can be stepped after the deadline while the answer still
    /// waits in the socket.
    wire_read: Instant,
    election: Election,
    /// Whether the election has had a cluster view, and how new it is.
    dating: dating::Dating,
    /// This node as its own election sees it: its drain, its networks,
    /// the member the election last had.
    own: own::Own,
    /// The cluster's Services by address, and the objects left out.
    services: services::Services,
    links: Links,
    /// Membership as gossip reports it and as this node acts on it.
    membership: membership::Membership,
    sessions: Sessions,
    /// Which nodes' gateways count as lost, and since when a change waits
    /// to count.
    upstream: upstream::Upstream,
    /// The move Events told, per VIP.
    move_notes: moves::MoveNotes,
    /// Which owners this node watches for silence, and when that is
    /// worked out again.
    watching: watching::Watching,
    /// Every VIP this node deals with, which to decide, and every
    /// address this run held.
    vips: vips::Vips,
    /// VIPs whose winner is a live peer with an older view of the cluster
    /// that does not show them held, and their wait (see [`Core::orphans`]).
    orphans: orphans::Orphans,
    /// Who answers on the wire for what, the agents' records, and this
    /// node's yields to outranking owners.
    conflicts: Conflicts,
    /// Who runs elsewhere, and whether gossip is isolated from them.
    isolation: isolation::Isolation,
    /// When addresses are renewed and refreshed, and the LAN asked.
    cadence: cadence::Cadence,
    /// What was last given out, and what must be worked out again.
    sent: sent::Sent,
    /// [`Actions::wake`] of the last step.
    wake: Option<Instant>,
    /// The firewall the cluster calls for, and the plan last given out.
    guard: guard::Guard,
}

impl Core {
    pub fn new(settings: Settings, links: Links, now: Instant) -> Core {
        Core {
            settings,
            now,
            phase: Phase::Starting,
            settling: settling::Settling::new(now),
            wire_read: now,
            election: Election::new(&Cluster::default(), []),
            dating: dating::Dating::new(now),
            own: own::Own::new(&links),
            services: services::Services::default(),
            links,
            membership: membership::Membership::new(),
            sessions: Sessions::default(),
            upstream: upstream::Upstream::default(),
            move_notes: moves::MoveNotes::default(),
            watching: watching::Watching::new(now),
            vips: vips::Vips::default(),
            orphans: orphans::Orphans::default(),
            conflicts: Conflicts::default(),
            isolation: isolation::Isolation::new(now),
            cadence: cadence::Cadence::new(now),
            sent: sent::Sent::default(),
            wake: None,
            guard: guard::Guard::default(),
        }
    }

    pub fn node(&self) -> &str {
        &self.settings.node
    }

    /// VIPs this node would hold on its virtual interface, that nobody
    /// serves, while its virtual mode is off (see
    /// [`Election::routed_unserved`]).
    pub fn routed_unserved(&self) -> Vec<IpAddr> {
        self.election.routed_unserved(&self.settings.node)
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn links(&self) -> &Links {
        &self.links
    }

    /// The prefixes this node publishes, marked where the gateway is lost.
    pub fn on_link(&self) -> std::sync::Arc<[crate::election::OnLink]> {
        self.own.on_link()
    }

    /// The interfaces whose gateway is lost, by family.
    pub fn upstream_lost(&self) -> &crate::model::UpstreamLost {
        self.own.upstream_lost()
    }

    pub fn view(&self) -> &MembershipView {
        self.membership.view()
    }

    /// Addresses the kernel holds for us now.
    pub fn held(&self) -> impl Iterator<Item = (&IpAddr, &Want)> {
        self.vips
            .iter()
            .filter_map(|(ip, s)| s.held_at().map(|h| (ip, h)))
    }

    /// Held addresses, each with whether it is being handed over.
    pub fn holdings(&self) -> impl Iterator<Item = (IpAddr, &Want, bool)> {
        self.vips
            .iter()
            .filter_map(|(ip, s)| s.held().map(|h| (*ip, &h.at, h.handover.is_some())))
    }

    /// The agents the API shows running elsewhere, while gossip reaches
    /// none of them (empty unless isolated).
    pub fn isolated_from(&self) -> Vec<String> {
        self.isolation.from()
    }

    /// The interface a claim on `ip` counts from, while claims on it are
    /// watched.
    pub fn watched_interface(&self, ip: IpAddr) -> Option<u32> {
        self.sent.watched(ip)
    }

    pub fn held_count(&self) -> usize {
        self.vips.held_count()
    }

    /// Of [`held_count`](Self::held_count), those on the virtual interface.
    pub fn held_virtual_count(&self) -> usize {
        self.vips
            .values()
            .filter(|s| s.held_at().is_some_and(|h| h.mode == Mode::Virtual))
            .count()
    }

    pub fn object_errors(&self) -> &[String] {
        self.services.errors()
    }

    /// The first reconcile is applied (and the agent is not leaving).
    pub fn is_ready(&self) -> bool {
        self.sent.ready() && matches!(self.phase, Phase::Running)
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
        self.sent.beats()
    }

    /// The firewall last given out, if any yet.
    pub fn firewall(&self) -> Option<&FirewallPlan> {
        self.guard.sent()
    }

    /// The election as this node has it.
    pub fn election(&self) -> &Election {
        &self.election
    }

    /// Whether `beat` changes nothing but when its sender was last heard
    /// and when its addresses lapse ([`Sessions::routine`]), and says
    /// nothing of leaving or of another run. Handed over later with its
    /// arrival time, before any other input, such a beat makes the same
    /// decisions as at once: only a step judges a silence, and the loop
    /// steps by the wake-up the core asks for (a watched owner's is its
    /// silence's deadline from the beats the core has), handing the
    /// waiting beats over first.
    ///
    /// [`Sessions::routine`]: sessions::Sessions::routine
    pub fn beat_is_routine(&self, beat: &Beat) -> bool {
        !beat.leaving
            && !self.membership.left(&beat.node)
            && !self.membership.of_another_run(&beat.node, beat.generation)
            && self.sessions.routine(beat)
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
                digest,
            } => {
                self.services.set(&cluster, errors);
                self.set_revision(revision, digest);
                self.election.set_cluster(&cluster);
                // A VIP just made sticky stays where gossip shows it held.
                self.set_holders();
                self.guard.set_rules(Firewall::of(&cluster));
                let services = &self.services;
                self.vips.keep_ever_held(|ip| services.has(ip));
                // Which records name a Node may have changed; what the
                // records listed before the first view hold is said now.
                let first = self.dating.know();
                self.learn_records(first);
                self.watching.moved(now);
                self.vips.refresh_all();
                self.sent.touch_report();
                out.metrics.push(Metric::Elected);
            }
            Input::Endpoints {
                changes,
                revision,
                digest,
            } => {
                self.set_revision(revision, digest);
                for (key, endpoints) in changes {
                    let touched = self.election.set_endpoints(&key, &endpoints);
                    self.mark(touched);
                }
                self.watching.moved(now);
                self.sent.touch_report();
                out.metrics.push(Metric::Elected);
            }
            Input::Members(view) => {
                self.membership.set_gossip(view);
                self.apply_view(now, out);
            }
            Input::Beats(beats) => {
                let mut changed = false;
                for b in beats {
                    // Counted from when it arrived: a routine beat may have
                    // waited for this step (never from after it).
                    let at = b.at.min(now);
                    if let Some(silent) = &b.silent {
                        if silent.node == self.settings.node
                            || self
                                .membership
                                .of_another_run(&silent.node, silent.generation)
                        {
                            continue;
                        }
                        let owner = silent.node.clone();
                        if self.sessions.heard(b, at) {
                            warn!(%owner, "its watcher finds the owner silent; taking over what it holds unless it still answers");
                            changed = true;
                        }
                    } else if self.membership.of_another_run(&b.node, b.generation) {
                        // A restarted agent's beats say nothing of the
                        // run gossip still shows, whose addresses may be
                        // gone: the new run counts once gossip has it.
                        debug!(node = %b.node, "a beat of a run gossip does not show yet");
                    } else if b.leaving {
                        changed |= self.membership.left_by_beat(
                            &self.settings.node,
                            b.node,
                            b.generation,
                            now,
                        );
                    } else {
                        // Heard alive under its own key (the shell
                        // believes a beat only of its node's proof, and
                        // every beat of a leaving run says it leaves): a
                        // leaving mark on this run was not its own.
                        if self.membership.alive_by_beat(&b.node, b.generation) {
                            warn!(node = %b.node, "a node marked as leaving beats as alive under its own key; the mark was not its own, and ends");
                            changed = true;
                        }
                        if self.sessions.heard(b, at) {
                            info!("a silent owner is heard again");
                            changed = true;
                        }
                    }
                }
                if changed {
                    self.apply_view(now, out);
                }
            }
            Input::Links(links) => self.set_links(now, links),
            Input::Adopted(found) => {
                if !found.is_empty() {
                    info!(count = found.len(), "found addresses of a previous run");
                }
                for a in found {
                    let held = Held::adopted(self.adopted_want(&a), now);
                    self.vips.found_held(a.ip, held);
                }
                self.sent.touch_publish();
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
                if self.vips.get(&a.ip).is_some_and(|s| {
                    !s.busy() && s.held_at().is_some_and(|h| h.vip.ifindex == a.ifindex)
                }) {
                    debug!(ip = %a.ip, interface = %a.interface,
                        "the kernel reports the address removed; reading the kernel again");
                    out.read_kernel = true;
                }
            }
            Input::KernelOwned(owned) => self.kernel_owned(owned),
            Input::Claims(claims) => {
                for claim in claims {
                    self.on_claim(claim, now, out);
                }
            }
            Input::Done(results) => {
                let worked = results.iter().any(|r| r.result.is_ok());
                for r in results {
                    self.on_done(r, now, out);
                }
                if worked {
                    // The kernel takes operations again: what failed before
                    // is tried soon, not after a backoff grown while it
                    // refused everything.
                    self.vips.hasten_retries(now, RETRY_MIN);
                }
            }
            Input::Tick => self.wire_read = now,
            Input::Records(records) => {
                self.conflicts.set_records(records, now);
                self.learn_records(true);
            }
            Input::Drain(drain) => {
                if self.own.set_drain(drain) {
                    info!(drain, "this node's drain changed");
                    self.sent.touch_publish();
                    self.sent.touch_report();
                    self.elect_members();
                }
            }
            Input::Upstream(lost) => {
                for (interface, family) in lost.difference(self.own.upstream_lost()) {
                    warn!(%interface, %family,
                        "the default gateway stopped answering: last resort for the VIPs on this network, which move to a node that reaches its gateway");
                }
                for (interface, family) in self.own.upstream_lost().difference(&lost) {
                    info!(%interface, %family, "the default gateway answers again");
                }
                if self.own.set_upstream(lost, &self.links) {
                    self.sent.touch_publish();
                    self.sent.touch_report();
                    self.elect_members();
                    self.vips.refresh_all();
                    self.orphans.rescan();
                }
            }
            Input::Leave => self.begin_leave(now, out),
            Input::Reloaded { settings, links } => {
                if settings != self.settings {
                    if settings.garp.refresh != self.settings.garp.refresh {
                        self.cadence.restart_refresh();
                    }
                    self.settings = Settings {
                        node: self.settings.node.clone(),
                        ..settings
                    };
                    self.vips.refresh_all();
                    self.guard.touch();
                }
                self.set_links(now, links);
            }
        }
    }

    /// Everything that follows from the state: settle, decide, announce,
    /// probe, renew, report, and the next wake-up.
    /// The records' MACs and which other agents run, from the records last
    /// listed and the Nodes known now. What is ignored is logged when the
    /// records were just listed (`listed`), not again on every cluster view.
    fn learn_records(&mut self, listed: bool) {
        let me = &self.settings.node;
        let election = &self.election;
        let ignored = self.conflicts.learn_records(me, |n| election.is_node(n));
        // Before a first view of the cluster no name is known to be a
        // Node's: nothing to say yet.
        if listed && self.dating.known() {
            for line in ignored {
                warn!("{line}");
            }
        }
        self.isolation.set_running_elsewhere(
            self.conflicts
                .records()
                .iter()
                .filter(|r| r.fresh && r.node != *me && election.is_node(&r.node))
                .map(|r| NodeName::from(r.node.as_str()))
                .collect(),
        );
    }

    /// The host's links and routes as read now.
    fn set_links(&mut self, now: Instant, links: Links) {
        if links != self.links {
            debug!("links or routes changed");
            if links.local != self.links.local {
                self.guard.touch();
            }
            self.own.set_links(&links);
            self.links = links;
            self.sent.touch_publish();
            self.elect_members();
            self.watching.moved(now);
            self.vips.refresh_all();
        }
    }

    /// The firewall, when what the cluster and the settings call for is
    /// not what was last given out. Nothing before a first view of the
    /// cluster: a table a previous run left stays until then. Nothing from
    /// a node that cannot hold addresses (nor change the firewall).
    fn plan_firewall(&mut self, out: &mut Actions) {
        // The host's own addresses, as its kernel shows them, are left
        // open: a pool that wrongly holds one must not lock operators out
        // of the host. Own: local and never held by this run, nor on its
        // way here; a VIP just let go still shows as local until the next
        // links read.
        let own = || {
            self.links
                .local
                .iter()
                .filter(|ip| {
                    !self.vips.ever_held(ip)
                        && self
                            .vips
                            .get(ip)
                            .is_none_or(|s| matches!(s.state(), State::Free | State::Probing(_)))
                })
                .copied()
                .collect()
        };
        if let Some(plan) =
            self.guard
                .plan(self.settings.unable.is_some(), self.settings.firewall, own)
        {
            out.firewall = Some(plan);
        }
    }

    fn advance(&mut self, now: Instant, out: &mut Actions) {
        let (silent, changed) = self.sessions.expire(now);
        if !silent.is_empty() {
            let told = self.sessions.plan().relays;
            warn!(owners = ?silent, ?told, "owner silent for {} ms; taking over what it holds unless it still answers, and telling the others next in line",
                sessions::BEAT_MISS.as_millis());
        }
        if changed {
            self.apply_view(now, out);
        }
        if self.upstream.due(now, self.upstream_settle()) {
            // Lost gateways count now: winners move, and with them which
            // VIPs fall back past a peer whose view is older.
            self.elect_members();
            self.orphans.rescan();
        }
        if self.phase == Phase::Starting && self.settings.unable.is_none() && self.settle(now) {
            info!(
                peers = self.membership.view().nodes.len().saturating_sub(1),
                "membership settled and the cluster known; electing"
            );
            self.phase = Phase::Running;
            self.settling.running(self.settings.gossip_interval, now);
            self.sent.touch_publish();
            self.elect_members();
            self.vips.refresh_all();
            // Orphans are looked for only while running: those found
            // while starting (a view newer than the peers') are due now.
            self.orphans.rescan();
        }
        self.starting_comebacks(now, out);
        self.note_isolation(now, out);
        if self.dating.take_spread(now) && self.any_older_peer() {
            // Peers still older than this view are behind now, not
            // catching up: what falls back past them is decided again.
            self.orphans.rescan();
            self.vips.refresh_all();
        }
        if self.orphans.take_scan() {
            self.orphans(now);
        }
        self.orphans_unanswered(now);
        let due: Vec<IpAddr> = self
            .orphans
            .iter()
            .filter(|(ip, since)| {
                self.orphan_due(*ip, *since, now)
                    && self.vips.get(ip).is_none_or(|s| s.want.is_none())
            })
            .map(|(ip, _)| ip)
            .collect();
        self.mark(due);
        self.publish_behind(now);
        if self.vips.take_refresh_all() {
            self.refresh_wants();
        }
        if let Phase::Leaving { since } = self.phase {
            let local_left = self.vips.values().any(|s| {
                s.held_at().is_some_and(|h| h.mode == Mode::Local) || s.adding().is_some()
            });
            if !local_left || now.saturating_duration_since(since) >= LEAVE_MAX {
                self.phase = Phase::Finishing;
                let all = self.vips.ips();
                self.mark(all);
            }
        }
        let ips: Vec<IpAddr> = self.vips.unsettled().iter().copied().collect();
        for ip in ips {
            self.decide(ip, now, out);
        }
        self.renew(now, out);
        self.plan_firewall(out);
        if !out.add.is_empty() {
            // What the beats say of when this node's addresses lapse.
            self.sent.touch_beats();
        }
        self.probe_wire(now, out);
        if self.phase == Phase::Finishing && self.vips.values().all(|s| !s.busy()) {
            let left: Vec<VipAddress> = self
                .vips
                .values()
                .filter_map(|s| s.held_at().map(|h| h.vip.clone()))
                .collect();
            if left.is_empty() {
                info!("left");
                self.phase = Phase::Done;
                self.sent.touch_publish();
                out.exit = true;
            }
        }
        self.watch_owners(now);
        self.report(now, out);
        out.wake = self.next_wake(now);
        self.wake = out.wake;
    }
}
