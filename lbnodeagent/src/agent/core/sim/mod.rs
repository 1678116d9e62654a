//! Deterministic simulation of a cluster of agents' cores.
//!
//! [`run`] builds hosts from a seed, each with the real [`Core`], and drives
//! them on a simulated clock through a seeded schedule of faults and
//! changes ([`scenario`]): crashes, frozen and killed agents (with and
//! without systemd's cleanup), SIGTERM, switch ports going down, gossip-only
//! partitions, API outages (and agents restarted during one), kernels that
//! refuse operations, Services, endpoints, labels and advertisements
//! changing. Around the cores it models what the shell and the network
//! would do:
//!
//! - **the kernel** of each host: addresses with lifetimes that lapse,
//!   operations that take time and are carried out one batch after
//!   another, and that a powered-off host loses;
//! - **the LAN**: which hosts' kernels answer ARP for an address (powered,
//!   port up, address held), probes answered by them, gratuitous ARP heard
//!   by every agent that watches the address;
//! - **gossip**: each node's view of each other, learnt a gossip delay
//!   after a change (with loss), lost a detection delay after a node stops
//!   being reachable, given up at once on a graceful leave;
//! - **the API server**: cluster views delivered after a watch delay, none
//!   during an outage, and only endpoints when only endpoints changed.
//!
//! After every event the checker ([`check`]) judges what a client on the
//! LAN would see: never two hosts answering for one VIP longer than the
//! bound the situation allows, no VIP without an answer longer than a
//! bound while some node could serve it, no gap at all in a planned move,
//! and, once every fault has healed, one owner per VIP (the election's
//! winner) and no further change. A failing seed replays bit for bit:
//! `cargo run --release -p lbnodeagent --example sim -- --seed N --trace`.

mod check;
mod rng;
pub mod scenario;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::election::Member;
use crate::model::AnnounceConfig;
use crate::model::Claim;
use crate::model::{Applied, Interface, Lifetime, MacAddr, OwnedAddress, VipAddress};
use crate::model::{LocalState, MemberInfo, MembershipView, Status};

use super::links::Links;
use super::sessions::{Beat, Lapse, RELAY_TTL, Silent};
use super::{Actions, AgentRecord, BeatPlan, Core, Input, OpKind, OpResult, Settings};
pub use check::{Stats, Violation};
pub use rng::Rng;
use scenario::{Fault, Shape, Truth};

const ETH0: u32 = 2;
const KUBE_LB0: u32 = 3;
const GOSSIP_INTERVAL: Duration = Duration::from_millis(100);
/// A peer that stops answering is declared down this long after (the
/// failure detector's spread at small sizes, ms).
const DETECT_MS: (u64, u64) = (350, 650);
/// A peer that answers again is back in views this long after (ms).
const REJOIN_MS: (u64, u64) = (100, 400);
/// A published change reaches a peer this long after (ms), plus a gossip
/// interval for each lost message.
const SPREAD_MS: (u64, u64) = (5, 150);
/// A `leaving` pushed to peers, or a detector's leave message (ms).
const LEAVE_MS: (u64, u64) = (1, 10);
/// From an object change to the agents' watches (ms).
const WATCH_MS: (u64, u64) = (5, 60);
/// One frame across the LAN and into the other agent (ms).
const WIRE_MS: (u64, u64) = (0, 2);
/// A kernel batch: a fixed part plus a little per address.
const BATCH_MS: (u64, u64) = (1, 4);
const PER_ADDRESS: Duration = Duration::from_micros(20);
/// Beats reach an agent at least this often while they flow. Often enough
/// that no watcher's silence is ever due while they do: a watched owner
/// is suspected [`BEAT_MISS`](super::sessions::BEAT_MISS) after it was last heard, and the watcher's
/// step at that moment is handed the beats first. How often beats arrive
/// matters only when they stop, and then the last ones are handed over at
/// that moment (see [`World::deliver_beats`]).
const BEATS_EVERY: Duration = Duration::from_millis(100);
/// Share of operations a flaky kernel refuses.
const FLAKY_FAILS: f64 = 0.3;

/// Options of a run.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Print every event and decision of the world (not the cores' own
    /// logs: those go through `tracing`).
    pub trace: bool,
    /// Fold every line of the full trace into [`Outcome::digest`], without
    /// printing it: two builds whose runs are the same event for event
    /// give the same digests.
    pub digest: bool,
}

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    pub shape: Shape,
    pub stats: Stats,
    pub violation: Option<Violation>,
    /// Events processed.
    pub events: u64,
    /// The last lines of the trace (all of it with `trace`).
    pub trace: Vec<String>,
    /// With [`Options::digest`], a hash of every line of the full trace.
    pub digest: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Agent {
    Running,
    Frozen,
    /// Not running: never started, exited, killed, or the host is off.
    Stopped,
}

#[derive(Clone, Debug)]
struct Address {
    prefix_len: u8,
    expires: Option<Duration>,
}

/// What one node knows about another through gossip.
#[derive(Clone, Debug)]
struct Known {
    generation: u64,
    version: u64,
    state: LocalState,
    up: bool,
}

struct Host {
    name: String,
    mac: MacAddr,
    gossip_addr: SocketAddr,
    powered: bool,
    port_up: bool,
    /// Gossip dropped by a firewall; ARP still flows.
    blocked: bool,
    flaky: bool,
    agent: Agent,
    core: Option<Core>,
    /// Bumped at every agent start: events of an earlier run are dropped.
    generation: u64,
    kernel: BTreeMap<(u32, IpAddr), Address>,
    /// The kernel worker is busy until then.
    kernel_busy: Duration,
    /// The cluster version this agent's watches have.
    api_version: u64,
    wake_due: Option<Duration>,
    published: LocalState,
    pub_version: u64,
    known: Vec<Option<Known>>,
    view_dirty: bool,
    watched: BTreeSet<IpAddr>,
    /// Events that reached a frozen agent, handled when it thaws.
    deferred: Vec<Ev>,
    /// Killed (not stopped gracefully) and not started since.
    killed: bool,
    /// Since when the agent has not been running.
    stopped_at: Option<Duration>,
    /// Since when the agent is stalled (frozen for a moment).
    stalled_since: Option<Duration>,
    /// When the agent last started.
    started_at: Duration,
    /// Whom the agent beats, as it last said (kept after it stops: its
    /// last beats went out as it stopped).
    beat_plan: BeatPlan,
    /// When beats were last handed to this agent.
    beats_at: Option<Duration>,
    /// `cleanup` runs, since then.
    cleanup_since: Option<Duration>,
}

#[derive(Clone, Debug)]
enum Ev {
    NextFault,
    Churn,
    Recover(Fault),
    EndFaults,
    CheckWindow,
    Sweep,
    Input {
        host: usize,
        generation: u64,
        input: Box<Input>,
    },
    Wake {
        host: usize,
        generation: u64,
        at: Duration,
    },
    /// A link notification reaching the shell, which reads the links as
    /// they are then (as the real shell dumps them on a notification), so
    /// a late notification never carries an older state than an earlier one.
    LinksRead {
        host: usize,
        generation: u64,
    },
    Kernel {
        host: usize,
        generation: u64,
        add: Vec<VipAddress>,
        remove: Vec<VipAddress>,
        /// Read our addresses after the operations, for the core.
        read: bool,
    },
    Expire {
        host: usize,
        ifindex: u32,
        ip: IpAddr,
    },
    Gossip {
        to: usize,
        from: usize,
        generation: u64,
        version: u64,
        state: Box<LocalState>,
    },
    Suspect {
        observer: usize,
        subject: usize,
        epoch: u64,
    },
    Rejoin {
        observer: usize,
        subject: usize,
        epoch: u64,
    },
    Left {
        observer: usize,
        subject: usize,
    },
    Api {
        host: usize,
        generation: u64,
    },
    CleanupWait {
        host: usize,
        until: Duration,
    },
}

struct World {
    /// The world's own randomness: delays, losses, refusals. How much of it
    /// a run draws depends on what the cores do.
    rng: Rng,
    /// The scenario's: the cluster, the faults and changes and when they
    /// come. A separate stream, so that a change to the cores' decisions
    /// leaves a seed's schedule as it was.
    plan: Rng,
    base: Instant,
    t: Duration,
    seq: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    hosts: Vec<Host>,
    /// Per pair of hosts: reachable by gossip, and an epoch bumped at every
    /// change, so a stale detection or rejoin is dropped.
    reach: Vec<Vec<bool>>,
    epoch: Vec<Vec<u64>>,
    truth: Truth,
    /// Every version of the cluster, for the checker's election over what
    /// the agents know.
    versions: BTreeMap<u64, crate::election::Cluster>,
    api_up: bool,
    shape: Shape,
    settings: Settings,
    faulting: bool,
    checker: check::Checker,
    /// Each host's questions about each address, and how the last went.
    exchanges: BTreeMap<(usize, IpAddr), check::Exchange>,
    /// Each host's links as they are now ([`World::relink`]), and which
    /// of them have an on-link prefix.
    links: Vec<Links>,
    on_link: check::Mask,
    trace: Trace,
    handled: u64,
}

/// An event in the queue, in time order and, at one instant, in the order
/// it was scheduled (which keeps a seed's run the same on every build).
struct Scheduled {
    at: Duration,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

struct Trace {
    all: bool,
    /// FNV-1a over every line, when digesting.
    digest: Option<u64>,
    lines: std::collections::VecDeque<String>,
}

impl Trace {
    const KEEP: usize = 400;

    /// Whether every line is wanted (printed or digested), not only the
    /// notes kept for a failure's report.
    fn full(&self) -> bool {
        self.all || self.digest.is_some()
    }

    fn push(&mut self, t: Duration, line: String) {
        let line = format!("{:>9.3}s {line}", t.as_secs_f64());
        if self.all {
            println!("{line}");
        }
        if let Some(d) = &mut self.digest {
            for b in line.bytes().chain([b'\n']) {
                *d = (*d ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        if self.lines.len() == Self::KEEP {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }
}

/// Runs one seed to the end or to its first violation.
pub fn run(seed: u64, options: &Options) -> Outcome {
    let mut plan = Rng::new(seed);
    let rng = Rng::new(plan.next_u64());
    let shape = Shape::draw(&mut plan);
    let names: Vec<String> = (0..shape.nodes).map(|i| format!("n{i:02}")).collect();
    let truth = Truth::generate(&mut plan, &names, shape.services);
    let settings = Settings {
        node: String::new(),
        lifetime: Lifetime::new(shape.lifetime),
        // Odd seeds refresh every held VIP each second: the rounds reach
        // every other host as claims, which the conflict rules must take
        // for the owner's own. (From the seed, not the generator, so that
        // a seed's scenario does not depend on it.)
        garp: AnnounceConfig {
            refresh: (seed % 2 == 1).then_some(Duration::from_secs(1)),
            ..AnnounceConfig::default()
        },
        gossip_interval: GOSSIP_INTERVAL,
        wire: true,
        unable: None,
    };
    let hosts = names
        .iter()
        .enumerate()
        .map(|(i, name)| Host {
            name: name.clone(),
            mac: MacAddr([2, 0, 0, 0, (i >> 8) as u8, i as u8]),
            gossip_addr: SocketAddr::from(([10, 0, 0, 10 + i as u8], 7934)),
            powered: true,
            port_up: true,
            blocked: false,
            flaky: false,
            agent: Agent::Stopped,
            core: None,
            generation: 0,
            kernel: BTreeMap::new(),
            kernel_busy: Duration::ZERO,
            api_version: 0,
            wake_due: None,
            beat_plan: BeatPlan::default(),
            beats_at: None,
            cleanup_since: None,
            published: LocalState::default(),
            pub_version: 0,
            known: vec![None; shape.nodes],
            view_dirty: false,
            watched: BTreeSet::new(),
            deferred: Vec::new(),
            killed: false,
            stopped_at: Some(Duration::ZERO),
            stalled_since: None,
            started_at: Duration::ZERO,
        })
        .collect();
    let n = shape.nodes;
    let mut w = World {
        rng,
        plan,
        base: Instant::now(),
        t: Duration::ZERO,
        seq: 0,
        queue: BinaryHeap::new(),
        hosts,
        reach: vec![vec![false; n]; n],
        epoch: vec![vec![0; n]; n],
        versions: BTreeMap::from([(truth.version, truth.cluster.clone())]),
        truth,
        api_up: true,
        shape: shape.clone(),
        settings,
        faulting: true,
        checker: check::Checker::new(shape.lifetime),
        exchanges: BTreeMap::new(),
        links: Vec::new(),
        on_link: 0,
        trace: Trace {
            all: options.trace,
            digest: options.digest.then_some(0xcbf2_9ce4_8422_2325),
            lines: Default::default(),
        },
        handled: 0,
    };
    w.links = w.hosts.iter().map(links_of).collect();
    for h in 0..n {
        w.relink(h);
    }
    w.trace.push(
        Duration::ZERO,
        format!(
            "seed {seed}: {} nodes, {} services, lifetime {:?}, gossip loss {}, refresh {:?}",
            shape.nodes, shape.services, shape.lifetime, shape.loss, w.settings.garp.refresh
        ),
    );
    for h in 0..n {
        let at = w.plan.ms(0, 1000);
        w.schedule(at, Ev::Recover(Fault::Start(h)));
    }
    w.schedule(Duration::from_secs(4), Ev::NextFault);
    w.schedule(Duration::from_secs(3), Ev::Churn);
    w.schedule(shape.faults_until, Ev::EndFaults);
    w.schedule(shape.end - check::STEADY_WINDOW, Ev::CheckWindow);
    w.schedule(Duration::from_millis(50), Ev::Sweep);
    let violation = w.run_until(shape.end);
    Outcome {
        seed,
        shape,
        stats: w.checker.stats.clone(),
        violation,
        events: w.handled,
        digest: w.trace.digest.unwrap_or(0),
        trace: w.trace.lines.into_iter().collect(),
    }
}

impl World {
    fn now(&self) -> Instant {
        self.base + self.t
    }

    fn schedule(&mut self, at: Duration, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled {
            at: at.max(self.t),
            seq: self.seq,
            ev,
        }));
    }

    fn after(&mut self, delay: Duration, ev: Ev) {
        self.schedule(self.t + delay, ev);
    }

    fn log(&mut self, line: impl FnOnce() -> String) {
        if self.trace.full() {
            let l = line();
            self.trace.push(self.t, l);
        }
    }

    fn note(&mut self, line: String) {
        self.trace.push(self.t, line);
    }

    fn run_until(&mut self, end: Duration) -> Option<Violation> {
        while let Some(Reverse(Scheduled { at, ev, .. })) = self.queue.pop() {
            if at > end {
                break;
            }
            self.t = at;
            self.handled += 1;
            self.handle(ev);
            self.deliver_views();
            if let Some(v) = self.checker.just_found() {
                self.note(format!(
                    "VIOLATION: {v} (followed for up to {:?})",
                    check::FOLLOW
                ));
            }
            if let Some(v) = self.checker.take_violation(self.t) {
                self.note(format!("VIOLATION: {v}"));
                return Some(v);
            }
        }
        self.t = end;
        self.final_check();
        self.checker.take_violation(end)
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::NextFault => {
                if self.faulting {
                    self.next_fault();
                    let next = self.plan.ms(500, 4000);
                    self.after(next, Ev::NextFault);
                }
            }
            Ev::Churn => {
                // Nobody changes objects while the API server is down.
                if self.faulting && !self.api_up {
                    let next = self.plan.ms(300, 3000);
                    self.after(next, Ev::Churn);
                } else if self.faulting {
                    let what = self.truth.churn(&mut self.plan);
                    self.versions
                        .insert(self.truth.version, self.truth.cluster.clone());
                    self.note(format!("change: {what}"));
                    self.truth_changed();
                    let next = self.plan.ms(300, 3000);
                    self.after(next, Ev::Churn);
                }
            }
            Ev::Recover(f) => {
                if self.faulting || matches!(f, Fault::Start(_) | Fault::Boot(_)) {
                    self.apply(f);
                }
            }
            Ev::EndFaults => self.end_faults(),
            Ev::CheckWindow => {
                let changes = self.checker.stats.kernel_changes;
                self.checker.steady_from(changes);
                self.note("steady window: no address may change from now on".into());
            }
            Ev::Sweep => {
                self.sweep();
                self.after(Duration::from_millis(50), Ev::Sweep);
            }
            Ev::Input {
                host,
                generation,
                input,
            } => {
                if self
                    .for_agent(host, generation, || Ev::Input {
                        host,
                        generation,
                        input: input.clone(),
                    })
                    .is_some()
                {
                    if let Input::Claim(c) = &*input
                        && !self.hosts[host].watched.contains(&c.ip)
                    {
                        return;
                    }
                    self.step(host, *input);
                }
            }
            Ev::LinksRead { host, generation } => {
                if self
                    .for_agent(host, generation, || Ev::LinksRead { host, generation })
                    .is_some()
                {
                    let links = self.links(host);
                    self.step(host, Input::Links(links));
                }
            }
            Ev::Wake {
                host,
                generation,
                at,
            } => {
                if self.hosts[host].generation != generation
                    || self.hosts[host].wake_due != Some(at)
                {
                    return;
                }
                if self
                    .for_agent(host, generation, || Ev::Wake {
                        host,
                        generation,
                        at,
                    })
                    .is_some()
                {
                    self.hosts[host].wake_due = None;
                    self.step(host, Input::Tick);
                }
            }
            Ev::Kernel {
                host,
                generation,
                add,
                remove,
                read,
            } => self.kernel_done(host, generation, add, remove, read),
            Ev::Expire { host, ifindex, ip } => self.expire(host, ifindex, ip),
            Ev::Gossip {
                to,
                from,
                generation,
                version,
                state,
            } => {
                if !self.reach[to][from] {
                    return;
                }
                if let Some(k) = &mut self.hosts[to].known[from]
                    && (k.generation, k.version) < (generation, version)
                {
                    k.generation = generation;
                    k.version = version;
                    k.state = *state;
                    self.hosts[to].view_dirty = true;
                }
            }
            Ev::Suspect {
                observer,
                subject,
                epoch,
            } => {
                if self.epoch[observer][subject] == epoch
                    && !self.reach[observer][subject]
                    && let Some(k) = &mut self.hosts[observer].known[subject]
                    && k.up
                {
                    k.up = false;
                    self.hosts[observer].view_dirty = true;
                }
            }
            Ev::Rejoin {
                observer,
                subject,
                epoch,
            } => {
                if self.epoch[observer][subject] == epoch && self.reach[observer][subject] {
                    let s = &self.hosts[subject];
                    let known = Known {
                        generation: s.generation,
                        version: s.pub_version,
                        state: s.published.clone(),
                        up: true,
                    };
                    self.hosts[observer].known[subject] = Some(known);
                    self.hosts[observer].view_dirty = true;
                }
            }
            Ev::Left { observer, subject } => {
                if let Some(k) = &mut self.hosts[observer].known[subject]
                    && k.up
                {
                    k.up = false;
                    self.hosts[observer].view_dirty = true;
                }
            }
            Ev::Api { host, generation } => {
                if self
                    .for_agent(host, generation, || Ev::Api { host, generation })
                    .is_some()
                {
                    self.deliver_records(host);
                    self.deliver_cluster(host);
                }
            }
            Ev::CleanupWait { host, until } => self.cleanup_wait(host, until),
        }
    }

    /// `Some` when the event may go to the host's agent now; a frozen
    /// agent gets it when it thaws (made by `again`), a stopped one never.
    fn for_agent(
        &mut self,
        host: usize,
        generation: u64,
        again: impl FnOnce() -> Ev,
    ) -> Option<()> {
        let h = &mut self.hosts[host];
        if h.generation != generation {
            return None;
        }
        match h.agent {
            Agent::Running => Some(()),
            Agent::Frozen => {
                h.deferred.push(again());
                None
            }
            Agent::Stopped => None,
        }
    }

    // ---- agents ----

    fn links(&self, host: usize) -> Links {
        self.links[host].clone()
    }

    /// A host's power or port changed: its links with it.
    fn relink(&mut self, host: usize) {
        self.links[host] = links_of(&self.hosts[host]);
        let bit = 1 << host;
        if self.links[host].on_link().is_empty() {
            self.on_link &= !bit;
        } else {
            self.on_link |= bit;
        }
    }

    fn start_agent(&mut self, host: usize) {
        let h = &self.hosts[host];
        if !h.powered || h.agent != Agent::Stopped {
            return;
        }
        let settings = Settings {
            node: h.name.clone(),
            ..self.settings.clone()
        };
        let core = Core::new(settings, self.links(host), self.now());
        let adopted = owned_addresses(h);
        let t = self.t;
        let h = &mut self.hosts[host];
        h.published = core.local_state();
        h.pub_version += 1;
        h.started_at = t;
        h.core = Some(core);
        h.agent = Agent::Running;
        h.killed = false;
        h.stopped_at = None;
        h.stalled_since = None;
        h.cleanup_since = None;
        h.generation += 1;
        h.api_version = 0;
        h.wake_due = None;
        h.known = vec![None; self.shape.nodes];
        h.beat_plan = BeatPlan::default();
        h.watched.clear();
        h.deferred.clear();
        h.view_dirty = true;
        let generation = h.generation;
        self.note(format!("{}: agent starts", self.hosts[host].name));
        self.judge_candidacy(host);
        self.reachability(host);
        self.step(host, Input::Adopted(adopted));
        if self.api_up {
            let d = self.rng.ms(50, 300);
            self.after(d, Ev::Api { host, generation });
        }
        self.records_changed(host);
    }

    /// `host`'s record changed (its agent started, or stopped and said
    /// so): the other agents' watches deliver the records again.
    fn records_changed(&mut self, host: usize) {
        if !self.api_up {
            return;
        }
        for j in 0..self.hosts.len() {
            if j == host || self.hosts[j].agent == Agent::Stopped {
                continue;
            }
            let d = self.rng.ms(WATCH_MS.0, WATCH_MS.1);
            let generation = self.hosts[j].generation;
            self.after(
                d,
                Ev::Api {
                    host: j,
                    generation,
                },
            );
        }
    }

    /// The agent is gone (killed, exited, host off): peers find out by
    /// detection, or at once after a graceful leave.
    fn stop_agent(&mut self, host: usize, graceful: bool) {
        if self.hosts[host].agent == Agent::Stopped {
            return;
        }
        if graceful {
            for j in 0..self.hosts.len() {
                if j != host && self.reach[host][j] {
                    let d = self.rng.ms(LEAVE_MS.0, LEAVE_MS.1);
                    self.after(
                        d,
                        Ev::Left {
                            observer: j,
                            subject: host,
                        },
                    );
                }
            }
        }
        let t = self.t;
        let h = &mut self.hosts[host];
        h.agent = Agent::Stopped;
        h.stopped_at = Some(t);
        h.stalled_since = None;
        h.core = None;
        h.wake_due = None;
        h.watched.clear();
        h.deferred.clear();
        self.reachability(host);
        if graceful {
            self.records_changed(host);
        }
    }

    fn step(&mut self, host: usize, input: Input) {
        if !matches!(input, Input::Beats(_))
            && self.hosts[host]
                .beats_at
                .is_none_or(|at| self.t >= at + BEATS_EVERY)
            && self.deliver_beats(host, None)
            && matches!(input, Input::Tick)
        {
            // The beats' step was this moment's step: a tick after it, at
            // the same instant, finds nothing more to do (the shell, too,
            // steps once for all that woke it).
            return;
        }
        let now = self.now();
        let span = self.trace.all.then(|| {
            tracing::info_span!("sim", t = format!("{:.3}", self.t.as_secs_f64()), node = %self.hosts[host].name)
                .entered()
        });
        let Some(core) = self.hosts[host].core.as_mut() else {
            return;
        };
        let actions = core.step(now, input);
        drop(span);
        self.carry_out(host, actions);
    }

    fn carry_out(&mut self, host: usize, a: Actions) {
        let generation = self.hosts[host].generation;
        if let Some(plan) = a.beat {
            self.hosts[host].beat_plan = plan;
        }
        if !a.add.is_empty() || !a.remove.is_empty() || a.read_kernel {
            let n = (a.add.len() + a.remove.len()) as u32;
            let took = self.rng.ms(BATCH_MS.0, BATCH_MS.1) + PER_ADDRESS * n;
            let h = &mut self.hosts[host];
            let done = h.kernel_busy.max(self.t) + took;
            h.kernel_busy = done;
            self.log(|| {
                format!(
                    "{host}: kernel batch +{:?} -{:?}",
                    ips(&a.add),
                    ips(&a.remove)
                )
            });
            self.schedule(
                done,
                Ev::Kernel {
                    host,
                    generation,
                    add: a.add,
                    remove: a.remove,
                    read: a.read_kernel,
                },
            );
        }
        let on_wire = self.hosts[host].powered && self.hosts[host].port_up;
        if a.leave {
            let generation = Some(self.hosts[host].generation);
            self.leaving_beats(host, generation, Duration::ZERO);
        }
        if on_wire {
            for t in &a.garp {
                for j in 0..self.hosts.len() {
                    if j == host || !self.hosts[j].powered || !self.hosts[j].port_up {
                        continue;
                    }
                    if self.rng.chance(self.shape.loss) {
                        continue;
                    }
                    let d = self.rng.ms(WIRE_MS.0, WIRE_MS.1);
                    let claim = Claim {
                        ip: t.ip,
                        mac: self.hosts[host].mac,
                    };
                    let g = self.hosts[j].generation;
                    self.after(
                        d,
                        Ev::Input {
                            host: j,
                            generation: g,
                            input: Box::new(Input::Claim(claim)),
                        },
                    );
                }
            }
            for t in &a.probe {
                for j in 0..self.hosts.len() {
                    if j != host && self.answers(j, t.ip) {
                        // The question or its answer lost on the way.
                        let lost =
                            self.rng.chance(self.shape.loss) || self.rng.chance(self.shape.loss);
                        let e = self.exchanges.entry((host, t.ip)).or_default();
                        if lost {
                            e.lost = Some(self.t);
                            continue;
                        }
                        e.heard = Some(self.t);
                        let d = self.rng.ms(WIRE_MS.0, WIRE_MS.1);
                        let claim = Claim {
                            ip: t.ip,
                            mac: self.hosts[j].mac,
                        };
                        self.after(
                            d,
                            Ev::Input {
                                host,
                                generation,
                                input: Box::new(Input::Claim(claim)),
                            },
                        );
                    }
                }
            }
        }
        if let Some(watched) = a.watch {
            self.hosts[host].watched = watched;
        }
        if let Some(local) = a.publish {
            self.publish(host, local);
        }
        if a.ready {
            self.log(|| format!("{host}: ready"));
        }
        // As the shell does: it sleeps until the core's latest word, later
        // or earlier than the one before (a wake-up that was pushed back
        // does not come).
        let at = a.wake.map(|at| at.saturating_duration_since(self.base));
        let h = &mut self.hosts[host];
        if at != h.wake_due {
            h.wake_due = at;
            if let Some(at) = at {
                self.schedule(
                    at,
                    Ev::Wake {
                        host,
                        generation,
                        at,
                    },
                );
            }
        }
        if a.exit {
            self.note(format!("{}: agent exits", self.hosts[host].name));
            self.stop_agent(host, true);
        }
    }

    fn publish(&mut self, host: usize, local: LocalState) {
        let leaving = local.status == Status::Leaving;
        let name = self.hosts[host].name.clone();
        self.log(|| {
            format!(
                "{name}: publishes {:?} revision {} vips {:?}",
                local.status, local.revision, local.vips
            )
        });
        let h = &mut self.hosts[host];
        let was = std::mem::replace(&mut h.published, local).status;
        h.pub_version += 1;
        let (generation, version) = (h.generation, h.pub_version);
        if was != Status::Alive {
            self.judge_candidacy(host);
        }
        for j in 0..self.hosts.len() {
            if j == host || !self.reach[host][j] {
                continue;
            }
            let mut d = if leaving {
                self.rng.ms(LEAVE_MS.0, LEAVE_MS.1)
            } else {
                self.rng.ms(SPREAD_MS.0, SPREAD_MS.1)
            };
            while self.rng.chance(self.shape.loss) {
                d += GOSSIP_INTERVAL;
            }
            let state = Box::new(self.hosts[host].published.clone());
            self.after(
                d,
                Ev::Gossip {
                    to: j,
                    from: host,
                    generation,
                    version,
                    state,
                },
            );
        }
    }

    /// A node that becomes `alive` stands in its peers' elections: it must
    /// have reconciled, with a complete view of the cluster, and have heard
    /// its peers or waited the start's grace for them.
    fn judge_candidacy(&mut self, host: usize) {
        let h = &self.hosts[host];
        if h.published.status != Status::Alive {
            return;
        }
        let heard_peers =
            h.known.iter().flatten().any(|k| k.up) || self.t >= h.started_at + super::STARTUP_GRACE;
        let why = if h.api_version == 0 {
            "without a view of the cluster"
        } else if !heard_peers {
            "before it heard its peers or waited the start's grace"
        } else {
            return;
        };
        let what = format!(
            "{} published itself a candidate ({}) {why}: its peers elect a node that cannot serve",
            h.name,
            Status::Alive.as_str()
        );
        let t = self.t;
        self.checker.unfit_candidate(t, what);
    }

    /// Beats are modelled as flowing without a gap while a sender's agent
    /// runs and gossip reaches the receiver: an agent is handed the beats
    /// of its senders before it steps (at most every [`BEATS_EVERY`]), and
    /// the last ones when the path breaks (`only`: that sender). Loss is
    /// not modelled: five beats lost in a row are about one in three
    /// million at 5% loss; a silent live owner comes from a frozen agent.
    /// True when the agent stepped.
    fn deliver_beats(&mut self, host: usize, only: Option<usize>) -> bool {
        if self.hosts[host].agent != Agent::Running || self.hosts[host].core.is_none() {
            return false;
        }
        let now = self.now();
        let addr = self.hosts[host].gossip_addr;
        let mut beats = Vec::new();
        for j in 0..self.hosts.len() {
            if j == host || only.is_some_and(|o| o != j) {
                continue;
            }
            if only.is_none() && !self.reach[j][host] {
                continue;
            }
            let plan = &self.hosts[j].beat_plan;
            let lapse = |l: Option<Lapse>| {
                l.map(|l| {
                    (
                        l.first.saturating_duration_since(now),
                        l.last.saturating_duration_since(now),
                    )
                })
            };
            let beat = Beat {
                node: self.hosts[j].name.clone(),
                generation: Some(self.hosts[j].generation),
                lapse: lapse(plan.lapse),
                leaving: false,
                watching: plan.sparse.contains(&addr),
                silent: None,
            };
            for r in plan.relays.iter().filter(|r| r.to.contains(&addr)) {
                beats.push(Beat {
                    silent: Some(Silent {
                        node: r.node.clone(),
                        generation: Some(r.generation),
                        lapse: lapse(r.lapse),
                    }),
                    ..beat.clone()
                });
            }
            if plan.dense.contains(&addr) || plan.sparse.contains(&addr) {
                beats.push(beat);
            }
        }
        if only.is_none() {
            self.hosts[host].beats_at = Some(self.t);
        }
        if beats.is_empty() {
            return false;
        }
        self.step(host, Input::Beats(beats));
        true
    }

    /// Membership views to the agents whose knowledge changed.
    fn deliver_views(&mut self) {
        for host in 0..self.hosts.len() {
            let h = &self.hosts[host];
            if !h.view_dirty || h.agent != Agent::Running {
                continue;
            }
            self.hosts[host].view_dirty = false;
            let view = self.view_of(host);
            self.step(host, Input::Members(view));
        }
    }

    fn view_of(&self, host: usize) -> MembershipView {
        let info = |i: usize, generation: u64, state: &LocalState| MemberInfo {
            node: self.hosts[i].name.clone(),
            generation,
            gossip_addr: self.hosts[i].gossip_addr,
            agent_version: String::new(),
            protocol: crate::model::PROTOCOL,
            status: state.status,
            virtual_mode: state.virtual_mode,
            on_link: state.on_link.clone(),
            vips: state.vips.clone(),
            macs: state.macs.clone(),
            revision: state.revision,
        };
        let h = &self.hosts[host];
        let local = info(host, h.generation, &h.published);
        let mut nodes = Vec::with_capacity(self.hosts.len());
        nodes.push(local.clone());
        let mut live = 1u64 << host;
        for (j, k) in h.known.iter().enumerate() {
            if let Some(k) = k
                && k.up
                && j != host
            {
                nodes.push(info(j, k.generation, &k.state));
                live |= 1 << j;
            }
        }
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        // Nodes not live here, as last heard of here or through a live peer
        // (gossip carries every node's state, not only live ones').
        let gone: Vec<MemberInfo> = (0..self.hosts.len())
            .filter(|&j| live & 1 << j == 0)
            .filter_map(|j| {
                let known = h.known[j].as_ref().or_else(|| {
                    (0..self.hosts.len())
                        .filter(|&k| h.known[k].as_ref().is_some_and(|x| x.up))
                        .filter_map(|k| self.hosts[k].known[j].as_ref())
                        .max_by_key(|x| (x.generation, x.version))
                })?;
                Some(info(j, known.generation, &known.state))
            })
            .collect();
        let members: Vec<Member> = nodes
            .iter()
            .filter(|n| n.status == Status::Alive)
            .map(MemberInfo::to_member)
            .collect();
        MembershipView {
            local,
            members,
            nodes,
            unconfirmed: 0,
            gone,
        }
    }

    /// Whether gossip flows between two hosts.
    fn gossips(&self, host: usize) -> bool {
        let h = &self.hosts[host];
        h.powered && h.port_up && !h.blocked && h.agent == Agent::Running
    }

    /// Re-evaluates the pairs of `host` after its state changed.
    fn reachability(&mut self, host: usize) {
        for j in 0..self.hosts.len() {
            if j == host {
                continue;
            }
            let now = self.gossips(host) && self.gossips(j);
            if now == self.reach[host][j] {
                continue;
            }
            if !now {
                // The last beats before the path broke.
                self.deliver_beats(j, Some(host));
                self.deliver_beats(host, Some(j));
            }
            self.reach[host][j] = now;
            self.reach[j][host] = now;
            for (observer, subject) in [(host, j), (j, host)] {
                self.epoch[observer][subject] += 1;
                let epoch = self.epoch[observer][subject];
                let ev = if now {
                    let d = self.rng.ms(REJOIN_MS.0, REJOIN_MS.1);
                    (
                        d,
                        Ev::Rejoin {
                            observer,
                            subject,
                            epoch,
                        },
                    )
                } else {
                    let d = self.rng.ms(DETECT_MS.0, DETECT_MS.1);
                    (
                        d,
                        Ev::Suspect {
                            observer,
                            subject,
                            epoch,
                        },
                    )
                };
                self.after(ev.0, ev.1);
            }
        }
    }

    /// Every agent's record in the API, as a watch delivers them: each
    /// host's MAC, fresh unless its agent stopped gracefully (a killed or
    /// crashed agent's record goes stale only after minutes).
    fn deliver_records(&mut self, host: usize) {
        if !self.api_up {
            return;
        }
        let records = self
            .hosts
            .iter()
            .map(|h| AgentRecord {
                node: h.name.clone(),
                macs: [h.mac].into(),
                fresh: h.agent != Agent::Stopped || h.killed || !h.powered,
            })
            .collect();
        self.step(host, Input::Records(records));
    }

    fn deliver_cluster(&mut self, host: usize) {
        if !self.api_up || self.hosts[host].api_version == self.truth.version {
            return;
        }
        let partial = self.hosts[host].api_version + 1 == self.truth.version;
        let revision = self.truth.version;
        let input = match (&self.truth.endpoints_only, partial) {
            (Some(keys), true) => Input::Endpoints {
                changes: keys
                    .iter()
                    .filter_map(|k| {
                        let s = self.truth.cluster.services.iter().find(|s| s.key == *k)?;
                        Some((k.clone(), s.endpoints.clone()))
                    })
                    .collect(),
                revision,
            },
            _ => Input::Cluster {
                cluster: self.truth.cluster.clone(),
                errors: Vec::new(),
                revision,
            },
        };
        self.hosts[host].api_version = self.truth.version;
        let name = self.hosts[host].name.clone();
        let version = self.truth.version;
        self.log(|| format!("{name}: cluster version {version}"));
        self.step(host, input);
    }

    /// The API server has a new version: every watching agent gets it.
    fn truth_changed(&mut self) {
        if !self.api_up {
            return;
        }
        for host in 0..self.hosts.len() {
            if self.hosts[host].agent == Agent::Stopped {
                continue;
            }
            let d = self.rng.ms(WATCH_MS.0, WATCH_MS.1);
            let generation = self.hosts[host].generation;
            self.after(d, Ev::Api { host, generation });
        }
    }

    // ---- kernel and wire ----

    /// Whether `host`'s kernel answers ARP/NS for `ip` on the LAN.
    fn answers(&self, host: usize, ip: IpAddr) -> bool {
        let h = &self.hosts[host];
        h.powered && h.port_up && h.kernel.contains_key(&(ETH0, ip))
    }

    fn kernel_done(
        &mut self,
        host: usize,
        generation: u64,
        add: Vec<VipAddress>,
        remove: Vec<VipAddress>,
        read: bool,
    ) {
        let h = &mut self.hosts[host];
        if h.generation != generation || !h.powered {
            return;
        }
        if h.agent == Agent::Frozen {
            h.deferred.push(Ev::Kernel {
                host,
                generation,
                add,
                remove,
                read,
            });
            return;
        }
        let mut results = Vec::with_capacity(add.len() + remove.len());
        let mut touched = Vec::new();
        for vip in &add {
            let fail = self.hosts[host].flaky && self.rng.chance(FLAKY_FAILS);
            let result = if fail {
                Err("the kernel refused (simulated)".to_string())
            } else {
                // The kernel counts whole seconds, as the agent asks.
                let expires = vip
                    .lifetime
                    .kernel_seconds()
                    .map(|s| self.t + Duration::from_secs(s.into()));
                let fresh = self.hosts[host]
                    .kernel
                    .insert(
                        (vip.ifindex, vip.ip),
                        Address {
                            prefix_len: vip.prefix_len,
                            expires,
                        },
                    )
                    .is_none();
                if fresh {
                    self.checker.stats.kernel_changes += 1;
                    touched.push(vip.ip);
                }
                if let Some(at) = expires {
                    self.schedule(
                        at,
                        Ev::Expire {
                            host,
                            ifindex: vip.ifindex,
                            ip: vip.ip,
                        },
                    );
                }
                Ok(Applied::Done)
            };
            results.push(OpResult {
                ip: vip.ip,
                kind: OpKind::Add,
                result,
            });
        }
        for vip in &remove {
            if self.hosts[host]
                .kernel
                .remove(&(vip.ifindex, vip.ip))
                .is_some()
            {
                self.checker.stats.kernel_changes += 1;
                touched.push(vip.ip);
            }
            results.push(OpResult {
                ip: vip.ip,
                kind: OpKind::Remove,
                result: Ok(Applied::Done),
            });
        }
        if !touched.is_empty() {
            let name = self.hosts[host].name.clone();
            self.log(|| format!("{name}: kernel now {:?}", touched));
        }
        for ip in touched {
            self.owners_changed(ip);
        }
        if self.hosts[host].agent == Agent::Running && !results.is_empty() {
            self.step(host, Input::Done(results));
        }
        if read && self.hosts[host].agent == Agent::Running {
            let owned = owned_addresses(&self.hosts[host]);
            self.step(host, Input::KernelOwned(owned));
        }
    }

    fn expire(&mut self, host: usize, ifindex: u32, ip: IpAddr) {
        let h = &mut self.hosts[host];
        let due = h
            .kernel
            .get(&(ifindex, ip))
            .and_then(|a| a.expires)
            .is_some_and(|e| e <= self.t);
        if !due || !h.powered {
            return;
        }
        let a = h.kernel.remove(&(ifindex, ip)).expect("present");
        self.checker.stats.kernel_changes += 1;
        self.checker.stats.lapsed += 1;
        let name = h.name.clone();
        let dead = h.agent != Agent::Running && h.cleanup_since.is_none();
        self.note(format!("{name}: {ip} lapsed"));
        self.owners_changed(ip);
        if dead && ifindex == ETH0 {
            // Whoever wins it now was told when it would lapse (its last
            // word says now, not a lapse an older renewal pushed back),
            // or not.
            // Judged only when the dead owner is the one trouble: every
            // other agent ready and healthy, and no other fault begun or
            // ended within a detection (a node that is starting, stalled or
            // just cut off may still win the VIP by its peers' elections).
            let mut successor = None;
            let detected = Duration::from_millis(DETECT_MS.1) + RELAY_TTL;
            self.judge(|c, ctx, t| {
                let alone = ctx
                    .hosts
                    .iter()
                    .enumerate()
                    .all(|(i, h)| i == host || (h.agent_running && h.ready && !h.faulty));
                if alone && c.unplanned_since(t) > detected {
                    successor = c.candidate(ip, ctx);
                }
            });
            let now = self.now();
            if let Some(s) = successor
                && self.hosts[s]
                    .core
                    .as_ref()
                    .and_then(|c| c.lapse_of(&name))
                    .is_some_and(|l| {
                        now + super::conflict::LAPSE_EARLY >= l.first
                            && now <= l.last + Duration::from_millis(10)
                    })
            {
                let t = self.t;
                self.checker.lapsed(ip, s, t);
            }
        }
        let removed = OwnedAddress {
            interface: if ifindex == ETH0 { "eth0" } else { "kube-lb0" }.into(),
            ifindex,
            ip,
            prefix_len: a.prefix_len,
        };
        let generation = self.hosts[host].generation;
        self.schedule(
            self.t,
            Ev::Input {
                host,
                generation,
                input: Box::new(Input::AddressRemoved(removed)),
            },
        );
    }

    fn owners_changed(&mut self, ip: IpAddr) {
        let owners: BTreeSet<usize> = (0..self.hosts.len())
            .filter(|&h| self.answers(h, ip))
            .collect();
        let mut line = None;
        self.judge(|checker, ctx, t| line = checker.owners(ip, owners, t, ctx));
        if let Some(line) = line {
            self.note(line);
        }
    }

    fn all_owners_changed(&mut self, host: usize) {
        let ips: Vec<IpAddr> = self.hosts[host]
            .kernel
            .keys()
            .filter(|(i, _)| *i == ETH0)
            .map(|(_, ip)| *ip)
            .collect();
        for ip in ips {
            self.owners_changed(ip);
        }
    }

    // ---- faults ----

    fn healthy(&self, host: usize) -> bool {
        let h = &self.hosts[host];
        h.powered
            && h.port_up
            && !h.blocked
            && !h.flaky
            && h.agent == Agent::Running
            && h.core.as_ref().is_some_and(|c| c.is_ready())
    }

    fn next_fault(&mut self) {
        let n = self.hosts.len();
        let unhealthy = (0..n).filter(|&h| !self.healthy(h)).count();
        // Keep most nodes serving: a third of them at most in trouble.
        let budget = (n / 3).max(1);
        let candidates: Vec<usize> = (0..n).filter(|&h| self.healthy(h)).collect();
        if unhealthy >= budget || candidates.is_empty() {
            if self.api_up && self.plan.chance(0.2) {
                self.apply(Fault::ApiDown);
                let d = self.plan.ms(1000, 15000);
                self.after(d, Ev::Recover(Fault::ApiUp));
            }
            return;
        }
        let h = *self.plan.pick(&candidates);
        let (fault, recovery, lo, hi) = match self.plan.below(12) {
            0 => (Fault::Crash(h), Fault::Boot(h), 1000, 8000),
            1 => (Fault::Freeze(h), Fault::Thaw(h), 200, 9000),
            2 => (Fault::Kill(h), Fault::Start(h), 500, 10000),
            3 => (Fault::KillCleanup(h), Fault::Start(h), 500, 5000),
            4 | 5 => (Fault::Term(h), Fault::Start(h), 1000, 5000),
            6 => (Fault::PortDown(h), Fault::PortUp(h), 300, 6000),
            7 => (Fault::Partition(h), Fault::Heal(h), 500, 8000),
            8 => (Fault::Flaky(h), Fault::Steady(h), 1000, 5000),
            9 if self.api_up => {
                // An outage, and an agent restarted during it.
                self.apply(Fault::ApiDown);
                // Long enough that an agent which cannot serve, but
                // stands as a candidate, leaves VIPs unowned for far
                // longer than any bound.
                let up = self.plan.ms(4000, 20000);
                self.after(up, Ev::Recover(Fault::ApiUp));
                (Fault::Kill(h), Fault::Start(h), 200, 1500)
            }
            10 => (Fault::Stall(h), Fault::Thaw(h), 50, 200),
            _ => (Fault::Term(h), Fault::Start(h), 300, 3000),
        };
        self.apply(fault);
        let d = self.plan.ms(lo, hi);
        self.after(d, Ev::Recover(recovery));
    }

    fn apply(&mut self, f: Fault) {
        self.note(format!("fault: {}", self.describe(f)));
        let restart_after_kill = matches!(f, Fault::Start(h) if self.hosts[h].killed);
        if !f.planned() || restart_after_kill {
            self.checker.unplanned(self.t);
        }
        match f {
            Fault::Crash(h) => {
                self.stop_agent(h, false);
                let host = &mut self.hosts[h];
                host.powered = false;
                self.relink(h);
                let host = &mut self.hosts[h];
                host.kernel.clear();
                host.kernel_busy = self.t;
                self.reachability(h);
                self.all_owners_rescan();
            }
            Fault::Boot(h) => {
                self.hosts[h].powered = true;
                self.relink(h);
                self.reachability(h);
                let d = self.plan.ms(300, 1000);
                self.after(d, Ev::Recover(Fault::Start(h)));
            }
            Fault::Freeze(h) => {
                if self.hosts[h].agent == Agent::Running {
                    self.hosts[h].agent = Agent::Frozen;
                    self.hosts[h].stopped_at = Some(self.t);
                    self.reachability(h);
                }
            }
            Fault::Stall(h) => {
                if self.hosts[h].agent == Agent::Running {
                    self.hosts[h].agent = Agent::Frozen;
                    self.hosts[h].stalled_since = Some(self.t);
                    self.reachability(h);
                    self.judge(|c, ctx, t| c.stalled(t, ctx));
                }
            }
            Fault::Thaw(h) => {
                if self.hosts[h].agent == Agent::Frozen {
                    self.hosts[h].agent = Agent::Running;
                    self.hosts[h].stopped_at = None;
                    self.hosts[h].stalled_since = None;
                    self.hosts[h].view_dirty = true;
                    self.reachability(h);
                    let deferred = std::mem::take(&mut self.hosts[h].deferred);
                    for ev in deferred {
                        self.schedule(self.t, ev);
                    }
                    let generation = self.hosts[h].generation;
                    self.schedule(
                        self.t,
                        Ev::Input {
                            host: h,
                            generation,
                            input: Box::new(Input::Tick),
                        },
                    );
                    if self.api_up {
                        self.schedule(
                            self.t,
                            Ev::Api {
                                host: h,
                                generation,
                            },
                        );
                    }
                }
            }
            Fault::Kill(h) => {
                self.stop_agent(h, false);
                self.hosts[h].killed = true;
            }
            Fault::KillCleanup(h) => {
                self.stop_agent(h, false);
                self.hosts[h].killed = true;
                // systemd starts `cleanup`: it tells the peers this node
                // left (a leaving beat to each, then gossip), waits for
                // another node to answer for each VIP, and removes it.
                // Mostly at once; now and then after the owner's
                // followers found it silent and its host still answering.
                let start = if self.plan.chance(0.8) {
                    self.plan.ms(5, 80)
                } else {
                    self.plan.ms(80, 400)
                };
                self.hosts[h].cleanup_since = Some(self.t + start);
                self.leaving_beats(h, None, start);
                for j in 0..self.hosts.len() {
                    if j != h && self.gossips(j) && self.hosts[h].powered && self.hosts[h].port_up {
                        let d = start + self.rng.ms(LEAVE_MS.0, LEAVE_MS.1);
                        self.after(
                            d,
                            Ev::Left {
                                observer: j,
                                subject: h,
                            },
                        );
                    }
                }
                let until = self.t + start + super::HANDOVER_MAX;
                self.after(start, Ev::CleanupWait { host: h, until });
            }
            Fault::Term(h) => {
                if self.hosts[h].agent == Agent::Running {
                    self.step(h, Input::Leave);
                }
            }
            Fault::Start(h) => {
                if self.hosts[h].agent == Agent::Stopped {
                    self.start_agent(h);
                } else if self.hosts[h].agent == Agent::Running
                    && self.hosts[h].core.as_ref().is_some_and(|c| c.is_leaving())
                {
                    // Still handing over: start once it has exited.
                    self.after(Duration::from_millis(500), Ev::Recover(Fault::Start(h)));
                }
            }
            Fault::PortDown(h) | Fault::PortUp(h) => {
                self.hosts[h].port_up = matches!(f, Fault::PortUp(_));
                self.relink(h);
                self.reachability(h);
                self.all_owners_changed(h);
                let generation = self.hosts[h].generation;
                let d = self.rng.ms(0, 5);
                self.after(
                    d,
                    Ev::LinksRead {
                        host: h,
                        generation,
                    },
                );
            }
            Fault::Partition(h) | Fault::Heal(h) => {
                self.hosts[h].blocked = matches!(f, Fault::Partition(_));
                self.reachability(h);
            }
            Fault::ApiDown => self.api_up = false,
            Fault::ApiUp => {
                self.api_up = true;
                self.truth_changed();
            }
            Fault::Flaky(h) | Fault::Steady(h) => {
                self.hosts[h].flaky = matches!(f, Fault::Flaky(_));
            }
        }
    }

    fn all_owners_rescan(&mut self) {
        let ips: Vec<IpAddr> = self.checker.known_ips();
        for ip in ips {
            self.owners_changed(ip);
        }
    }

    /// `host`'s leaving beat (its agent's on SIGTERM, or `cleanup`'s,
    /// which knows no generation), sent `after` from now to every host its
    /// wire reaches.
    fn leaving_beats(&mut self, host: usize, generation: Option<u64>, after: Duration) {
        let reaches = |h: &Host| h.powered && h.port_up && !h.blocked;
        if !reaches(&self.hosts[host]) {
            return;
        }
        let beat = Beat {
            node: self.hosts[host].name.clone(),
            generation,
            lapse: None,
            leaving: true,
            watching: false,
            silent: None,
        };
        for j in 0..self.hosts.len() {
            if j != host && reaches(&self.hosts[j]) {
                let d = after + self.rng.ms(0, 3);
                let generation = self.hosts[j].generation;
                self.after(
                    d,
                    Ev::Input {
                        host: j,
                        generation,
                        input: Box::new(Input::Beats(vec![beat.clone()])),
                    },
                );
            }
        }
    }

    /// `cleanup` removes each VIP of the host once another node answers
    /// for it (it sees the claims on the wire), and the rest at `until`.
    fn cleanup_wait(&mut self, host: usize, until: Duration) {
        if self.hosts[host].agent != Agent::Stopped {
            return;
        }
        let n = self.hosts.len();
        let answered = |w: &World, ip: IpAddr| (0..n).any(|j| j != host && w.answers(j, ip));
        let eth0: Vec<IpAddr> = self.hosts[host]
            .kernel
            .keys()
            .filter(|(i, _)| *i == ETH0)
            .map(|(_, ip)| *ip)
            .collect();
        let taken: Vec<IpAddr> = eth0
            .iter()
            .copied()
            .filter(|ip| answered(self, *ip))
            .collect();
        let done = self.t >= until || taken.len() == eth0.len();
        let h = &mut self.hosts[host];
        let gone: Vec<IpAddr> = if done {
            h.cleanup_since = None;
            std::mem::take(&mut h.kernel)
                .into_keys()
                .map(|(_, ip)| ip)
                .collect()
        } else {
            h.kernel
                .retain(|(i, ip), _| !(*i == ETH0 && taken.contains(ip)));
            taken
        };
        if !done {
            self.after(Duration::from_millis(5), Ev::CleanupWait { host, until });
        }
        if !gone.is_empty() {
            self.checker.stats.kernel_changes += gone.len() as u64;
            self.note(format!(
                "{}: cleanup removed {gone:?}",
                self.hosts[host].name
            ));
            for ip in gone {
                self.owners_changed(ip);
            }
        }
    }

    /// Faults are over: everything heals now; the rest of the run settles.
    fn end_faults(&mut self) {
        self.faulting = false;
        self.note("faults over: every host heals".into());
        for h in 0..self.hosts.len() {
            if !self.hosts[h].powered {
                self.apply(Fault::Boot(h));
            }
            if self.hosts[h].agent == Agent::Frozen {
                self.apply(Fault::Thaw(h));
            }
            if !self.hosts[h].port_up {
                self.apply(Fault::PortUp(h));
            }
            if self.hosts[h].blocked {
                self.apply(Fault::Heal(h));
            }
            if self.hosts[h].flaky {
                self.apply(Fault::Steady(h));
            }
            if self.hosts[h].agent == Agent::Stopped && self.hosts[h].powered {
                self.apply(Fault::Start(h));
            }
        }
        if !self.api_up {
            self.apply(Fault::ApiUp);
        }
    }

    fn describe(&self, f: Fault) -> String {
        let name = |h: usize| self.hosts[h].name.clone();
        match f {
            Fault::Crash(h) => format!("{} loses power", name(h)),
            Fault::Boot(h) => format!("{} boots", name(h)),
            Fault::Freeze(h) => format!("{}'s agent frozen", name(h)),
            Fault::Thaw(h) => format!("{}'s agent thawed", name(h)),
            Fault::Stall(h) => format!("{}'s agent stalls", name(h)),
            Fault::Kill(h) => format!("{}'s agent killed", name(h)),
            Fault::KillCleanup(h) => format!("{}'s agent killed, cleanup runs", name(h)),
            Fault::Term(h) => format!("{}'s agent gets SIGTERM", name(h)),
            Fault::Start(h) => format!("{}'s agent started", name(h)),
            Fault::PortDown(h) => format!("{}'s switch port down", name(h)),
            Fault::PortUp(h) => format!("{}'s switch port up", name(h)),
            Fault::Partition(h) => format!("gossip to and from {} dropped", name(h)),
            Fault::Heal(h) => format!("gossip to and from {} flows again", name(h)),
            Fault::ApiDown => "API server down".into(),
            Fault::ApiUp => "API server back".into(),
            Fault::Flaky(h) => format!("{}'s kernel refuses operations", name(h)),
            Fault::Steady(h) => format!("{}'s kernel steady again", name(h)),
        }
    }

    // ---- judging ----

    /// Hands the checker what it needs to know about the world now.
    fn judge(&mut self, f: impl FnOnce(&mut check::Checker, &check::Context, Duration)) {
        // Out of the world while the context borrows the rest of it.
        let mut checker = std::mem::replace(&mut self.checker, check::Checker::new(Duration::ZERO));
        let ctx = context(self);
        f(&mut checker, &ctx, self.t);
        self.checker = checker;
    }

    fn sweep(&mut self) {
        self.judge(|checker, ctx, t| checker.sweep(t, ctx));
    }

    fn final_check(&mut self) {
        let held: Vec<BTreeSet<(u32, IpAddr)>> = self
            .hosts
            .iter()
            .map(|h| h.kernel.keys().copied().collect())
            .collect();
        self.judge(|checker, ctx, t| checker.finish(t, ctx, &held));
    }
}

/// What the checker needs to know about the hosts now.
fn context(w: &World) -> check::Context<'_> {
    let hosts = &w.hosts;
    let ready =
        |h: &Host| h.agent == Agent::Running && h.core.as_ref().is_some_and(|c| c.is_ready());
    // The newest view a running agent has: no agent can serve a Service
    // none of them has heard of (created just before the API server went
    // away), and one that knows better acts on it (a leaving node that
    // learns nobody may hold a VIP any more lets it go).
    let newest = hosts
        .iter()
        .filter(|h| h.agent == Agent::Running)
        .map(|h| h.api_version)
        .max()
        .unwrap_or(w.truth.version);
    check::Context {
        hosts: hosts
            .iter()
            .map(|h| check::HostState {
                agent_running: h.agent == Agent::Running,
                stopped_at: h.stopped_at.filter(|_| h.agent != Agent::Running),
                cleanup_since: h.cleanup_since,
                stalled_since: h.stalled_since,
                ready: ready(h),
                leaving: h.core.as_ref().is_some_and(|c| c.is_leaving()),
                flaky: h.flaky,
                faulty: !h.powered
                    || (h.agent == Agent::Frozen && h.stalled_since.is_none())
                    || h.killed
                    || !h.port_up
                    || h.blocked
                    || h.flaky,
                name: &h.name,
            })
            .collect(),
        reach: &w.reach,
        links: &w.links,
        on_link: w.on_link,
        ready: check::mask(hosts.iter().map(ready)),
        versions: &w.versions,
        host_versions: hosts.iter().map(|h| h.api_version.max(1)).collect(),
        newest: newest.max(1),
        latest: w.truth.version,
        api_up: w.api_up,
        exchanges: &w.exchanges,
    }
}

/// What the host's kernel holds, all of it the agent's.
fn owned_addresses(h: &Host) -> Vec<OwnedAddress> {
    h.kernel
        .iter()
        .map(|((ifindex, ip), a)| OwnedAddress {
            interface: if *ifindex == ETH0 { "eth0" } else { "kube-lb0" }.into(),
            ifindex: *ifindex,
            ip: *ip,
            prefix_len: a.prefix_len,
        })
        .collect()
}

/// A simulated host's links: `eth0` on the LAN, `kube-lb0` for virtual
/// addresses.
fn links_of(h: &Host) -> Links {
    let eth0 = Interface {
        name: "eth0".into(),
        index: ETH0,
        mac: Some(h.mac),
        carrier: h.powered && h.port_up,
        prefixes: vec![
            scenario::SUBNET_V4.parse().expect("valid"),
            scenario::SUBNET_V6.parse().expect("valid"),
        ],
    };
    let virtual_link = Interface {
        name: "kube-lb0".into(),
        index: KUBE_LB0,
        mac: None,
        carrier: true,
        prefixes: Vec::new(),
    };
    Links {
        all: vec![eth0, virtual_link.clone()],
        announce_v4: Some(ETH0),
        announce_v6: Some(ETH0),
        virtual_link: Some(virtual_link),
    }
}

fn ips(vips: &[VipAddress]) -> Vec<IpAddr> {
    vips.iter().map(|v| v.ip).collect()
}

/// A line per seed for a summary.
pub fn summary(o: &Outcome) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "seed {} nodes {} services {} events {}",
        o.seed, o.shape.nodes, o.shape.services, o.events
    );
    if let Some(v) = &o.violation {
        let _ = write!(s, " VIOLATION {v}");
    }
    s
}

/// Runs `seeds` on every core; the first failing seed (lowest) with the end
/// of its trace, if any.
pub fn run_many(seeds: std::ops::Range<u64>, options: &Options) -> (u64, Option<Outcome>) {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let next = AtomicU64::new(seeds.start);
    let stop = AtomicBool::new(false);
    let ran = AtomicU64::new(0);
    let failed: Mutex<Option<Outcome>> = Mutex::new(None);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= seeds.end {
                        return;
                    }
                    let o = run(seed, options);
                    ran.fetch_add(1, Ordering::Relaxed);
                    if o.violation.is_some() {
                        stop.store(true, Ordering::Relaxed);
                        let mut f = failed.lock().unwrap_or_else(|e| e.into_inner());
                        if f.as_ref().is_none_or(|p| p.seed > o.seed) {
                            *f = Some(o);
                        }
                    }
                }
            });
        }
    });
    (
        ran.load(Ordering::Relaxed),
        failed.into_inner().unwrap_or_else(|e| e.into_inner()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The invariants over many seeded runs (`HOSTLB_SIM_SEEDS` sets how
    /// many; `.ci/run` runs thousands more with a release build). A failure
    /// prints the seed, the end of its trace and the command that replays
    /// it.
    #[test]
    fn the_invariants_hold_over_many_seeded_runs() {
        let n: u64 = std::env::var("HOSTLB_SIM_SEEDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        let started = std::time::Instant::now();
        let (ran, failed) = run_many(0..n, &Options::default());
        if let Some(o) = failed {
            for line in &o.trace {
                eprintln!("{line}");
            }
            panic!(
                "{}\nreplay: cargo run --release -p lbnodeagent --example sim -- --seed {} --trace",
                summary(&o),
                o.seed
            );
        }
        eprintln!("{ran} seeds in {:.1} s", started.elapsed().as_secs_f64());
        assert_eq!(ran, n);
    }

    /// A run is a function of its seed: replaying gives the same events.
    #[test]
    fn a_seed_replays_the_same_run() {
        let a = run(7, &Options::default());
        let b = run(7, &Options::default());
        assert_eq!(a.events, b.events);
        assert_eq!(a.trace, b.trace);
        assert_eq!(a.stats.kernel_changes, b.stats.kernel_changes);
    }
}
