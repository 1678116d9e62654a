//! The checker: it judges only what a client saw on the wire (which MAC
//! answered each request, when) against what was true of the bed (which
//! faults were in force, which agents ran, which Service held each
//! address), and the end state after each round's quiet (see
//! [`endstate`](super::endstate)). What the agents believe plays no part.
//!
//! Its bounds ([`Bounds`]) come from the constants of the agent and the
//! table of docs/agent.md, "The simulation"; the campaign's own section of
//! docs/agent.md says where each comes from and what a client sees
//! meanwhile.
//!
//! Plain functions of plain data: the campaign's tests feed them made-up
//! histories.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use lbnodeagent::bounds as sim;

use super::nemesis::Applied;
use super::schedule::{Churn, Kind};
use super::unit::Event;

/// A request and the MACs that answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    pub at: Instant,
    /// MACs whose answer arrived before the next request.
    pub macs: BTreeSet<String>,
    /// Whether any answer arrived within [`Bounds::answer_within`].
    pub answered: bool,
}

/// Each request of a prober with what answered it.
pub fn windows(
    sent: &[Instant],
    replies: &[(Instant, String)],
    answer_within: Duration,
) -> Vec<Window> {
    let mut out = Vec::with_capacity(sent.len());
    for (i, &s) in sent.iter().enumerate() {
        // The last request's window is one period long.
        let next = sent
            .get(i + 1)
            .copied()
            .unwrap_or(s + super::bed::PROBE_EVERY);
        let first = replies.partition_point(|(t, _)| *t < s);
        let mut macs = BTreeSet::new();
        let mut answered = false;
        for (t, mac) in &replies[first..] {
            if *t > s + answer_within && *t >= next {
                break;
            }
            if *t <= s + answer_within {
                answered = true;
            }
            if *t < next {
                macs.insert(mac.clone());
            }
        }
        out.push(Window {
            at: s,
            macs,
            answered,
        });
    }
    out
}

/// The bounds the checker holds the wire to.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// A request counts as answered when an answer arrives this soon.
    pub answer_within: Duration,
    /// Two owners, whatever is in force: two live holders settle, a
    /// make-before-break move ends, two views agree, within this.
    pub two_owners: Duration,
    /// Two owners across a partition of any kind, after it heals.
    pub partition: Duration,
    /// Two owners while one is leaving, from its SIGTERM.
    pub leaving: Duration,
    /// Two owners while one is starting, from its start.
    pub starting: Duration,
    /// An agent not running keeps answering until its address lapses.
    pub lifetime: Duration,
    /// No owner while a candidate is live and reachable, when a node went
    /// away (see [`Inputs::someone_away`]); without one, less the
    /// detection.
    pub no_owner: Duration,
    /// The wire's failure detection, part of `no_owner`.
    pub detection: Duration,
    /// A started agent is a candidate once it reconciled: its watches
    /// synced after it reached the API.
    pub reconcile: Duration,
    /// Nothing in force or recent for this long: no second owner and no
    /// unanswered request at all.
    pub calm_after: Duration,
}

impl Bounds {
    /// `lifetime`: the agents' `address_lifetime`.
    pub fn new(lifetime: Duration) -> Bounds {
        Bounds {
            answer_within: ANSWER_WITHIN,
            two_owners: sim::AGREED_BOUND,
            partition: sim::PARTITION_BOUND,
            leaving: sim::LEAVING_BOUND,
            starting: sim::STARTING_BOUND,
            lifetime,
            no_owner: NO_OWNER_WIRE,
            detection: DETECTION_WIRE,
            reconcile: RECONCILE,
            calm_after: CALM_AFTER,
        }
    }
}

/// An answer later than this is a lost request to a client whose ARP
/// timer fires (Linux retransmits a solicitation after a second; 50 ms is
/// what an application's connect sees as a stall), and within it is what
/// a loaded host's softirq may take.
pub const ANSWER_WITHIN: Duration = Duration::from_millis(50);

/// The wire's failure detection: an owner's beats missed for `BEAT_MISS`
/// (150 ms) tell its successor at once; a node that no owner beats with is
/// found by the SWIM detector (its suspicion timeout at this size, about
/// a second busy: docs/agent-network.md), which from rest waits up to
/// three slower probe cycles more for a probe to find the dead node, as
/// the simulation's does ([`sim::REST_WAIT`]).
pub const DETECTION_WIRE: Duration = Duration::from_secs(1).saturating_add(sim::REST_WAIT);

/// [`sim::NO_OWNER_BOUND`] with the real detector's detection in place of
/// the simulated one's.
pub const NO_OWNER_WIRE: Duration = sim::NO_OWNER_BOUND
    .saturating_sub(sim::DETECTION)
    .saturating_add(DETECTION_WIRE);

/// From the API reached to the agent's first reconcile: its watches list
/// everything and the core's first view is built (a relist of a handful
/// of objects takes tens of milliseconds; the margin is the API client's
/// first retry, a second).
pub const RECONCILE: Duration = Duration::from_secs(2);

/// From the API server's return to the agents' knowing what changed while
/// it was away: a cut longer than the writer's notice (its probe every
/// 5 s, timing out after 3 s) is noticed over again within a second of the
/// heal and every watch lists anew (a failed list retries within 2 s); a
/// shorter one may go unnoticed, and TCP retransmits what the server sent
/// within 6.4 s of the heal (its timer doubling from 200 ms: the next
/// retransmission after a cut of 6.2-8 s is at 12.6 s). Rounded up.
pub const API_CATCH_UP: Duration = Duration::from_secs(7);

/// Since the last fault, agent start or stop: the longest tail any bound
/// gives ([`sim::PARTITION_BOUND`], 4.5 s) and a hand-over after it
/// ([`sim::HANDOVER_BOUND`], 3 s), rounded up.
pub const CALM_AFTER: Duration = Duration::from_secs(8);

/// A broken bound or promise.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    pub at: Instant,
    pub what: String,
}

/// The worst seen of each kind, for the report.
#[derive(Clone, Debug, Default)]
pub struct Worst {
    pub two_owners: Duration,
    pub two_owners_calm: Duration,
    pub dark_with_candidate: Duration,
    pub dark_calm: Duration,
    pub unanswered: u64,
    pub requests: u64,
    /// The unanswered requests by what was in force or recent when each
    /// was sent ([`cause_of`]): an outage of the product is told from
    /// requests a lossy wire dropped, or a host gone took with it.
    pub unanswered_by: BTreeMap<&'static str, u64>,
    /// Under each cause, the longest run of unanswered requests to one
    /// address that began under it: from the first of them to the next
    /// request answered (or the last judged, for a run still dark then).
    pub longest_unanswered_by: BTreeMap<&'static str, Duration>,
    /// Two-owner episodes by the bound that held them (the fault whose
    /// excuse lasted longest, or the base bound): the longest, and the
    /// least room left under its bound.
    pub by_bound: BTreeMap<&'static str, (Duration, Duration)>,
}

impl Worst {
    pub fn merge(&mut self, o: &Worst) {
        self.two_owners = self.two_owners.max(o.two_owners);
        self.two_owners_calm = self.two_owners_calm.max(o.two_owners_calm);
        self.dark_with_candidate = self.dark_with_candidate.max(o.dark_with_candidate);
        self.dark_calm = self.dark_calm.max(o.dark_calm);
        self.unanswered += o.unanswered;
        self.requests += o.requests;
        for (k, n) in &o.unanswered_by {
            *self.unanswered_by.entry(k).or_default() += n;
        }
        for (k, d) in &o.longest_unanswered_by {
            let e = self.longest_unanswered_by.entry(k).or_default();
            *e = (*e).max(*d);
        }
        for (k, &(len, room)) in &o.by_bound {
            self.held(k, len, room);
        }
    }

    /// A run of unanswered requests to one address (its cause and first
    /// request), if one was under way, ended at `at`.
    fn run_ended(&mut self, run: Option<(&'static str, Instant)>, at: Instant) {
        if let Some((cause, first)) = run {
            let e = self.longest_unanswered_by.entry(cause).or_default();
            *e = (*e).max(at.saturating_duration_since(first));
        }
    }

    fn held(&mut self, bound: &'static str, len: Duration, room: Duration) {
        let e = self.by_bound.entry(bound).or_insert((len, room));
        e.0 = e.0.max(len);
        e.1 = e.1.min(room);
    }
}

impl fmt::Display for Worst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "two owners {} ms (calm {} ms), dark with a candidate {} ms (calm {} ms), {} of {} requests unanswered",
            self.two_owners.as_millis(),
            self.two_owners_calm.as_millis(),
            self.dark_with_candidate.as_millis(),
            self.dark_calm.as_millis(),
            self.unanswered,
            self.requests
        )?;
        if !self.unanswered_by.is_empty() {
            let by: Vec<String> = self
                .unanswered_by
                .iter()
                .map(|(cause, n)| match self.longest_unanswered_by.get(cause) {
                    Some(longest) => format!("{cause} {n} (at most {} ms)", longest.as_millis()),
                    // Only within runs that began under another cause.
                    None => format!("{cause} {n}"),
                })
                .collect();
            write!(f, " (by what was in force: {})", by.join(", "))?;
        }
        for (bound, (len, room)) in &self.by_bound {
            write!(
                f,
                "; two owners under {bound}: longest {} ms, least room {} ms",
                len.as_millis(),
                room.as_millis()
            )?;
        }
        Ok(())
    }
}

/// One Service as the bed made it: its policy and its endpoints over time.
#[derive(Clone, Debug, Default)]
pub struct ServiceLife {
    pub local: bool,
    /// `(since, endpoint nodes)`.
    pub endpoints: Vec<(Instant, Vec<String>)>,
    /// When the campaign asked the API server to delete it. The timeline
    /// reads the Services every [`TIMELINE_EVERY`](super::bed::TIMELINE_EVERY), so it still shows the address
    /// a moment after; a request from then on is no longer one its
    /// address owes an answer.
    pub deleted: Option<Instant>,
}

impl ServiceLife {
    fn endpoints_at(&self, t: Instant) -> &[String] {
        self.endpoints
            .iter()
            .rev()
            .find(|(since, _)| *since <= t)
            .or(self.endpoints.first())
            .map_or(&[], |(_, e)| e)
    }
}

/// What the client heard about one address: its requests, and each
/// answer (time, MAC), in time order.
#[derive(Clone, Debug)]
pub struct Heard {
    pub ip: IpAddr,
    pub sent: Vec<Instant>,
    pub replies: Vec<(Instant, String)>,
}

/// Everything the checker reads about one stretch of the run.
pub struct Inputs<'a> {
    pub start: Instant,
    pub end: Instant,
    pub nodes: &'a [String],
    /// MAC to node.
    pub macs: &'a BTreeMap<String, String>,
    pub probes: &'a [Heard],
    pub faults: &'a [Applied],
    pub units: &'a BTreeMap<String, Vec<(Instant, Event)>>,
    /// The Services' addresses, each reading from when it was read.
    pub timeline: &'a [(Instant, BTreeMap<IpAddr, String>)],
    pub services: &'a BTreeMap<String, ServiceLife>,
}

impl Inputs<'_> {
    /// The Service whose address `ip` was when a request went out at `t`:
    /// as the timeline last read it, unless the Service was deleted by
    /// then.
    fn service_of(&self, ip: IpAddr, t: Instant) -> Option<&str> {
        let i = self.timeline.partition_point(|(at, _)| *at <= t);
        let (_, assigned) = self.timeline.get(i.checked_sub(1)?)?;
        let service = assigned.get(&ip)?;
        let deleted = self.services.get(service).and_then(|l| l.deleted);
        if deleted.is_some_and(|d| d <= t) {
            return None;
        }
        Some(service)
    }

    /// Whether anything happened within `calm_after` of the window whose
    /// request was sent at `sent`: a fault in force or recent, an agent
    /// that started, stopped or exited. The window's answers come up to
    /// `answer_within` after its request, so a fault carried out meanwhile
    /// (a SIGTERM whose agent hands over at once) is in force for them.
    /// An API outage ends for the agents [`API_CATCH_UP`] after it healed.
    fn calm(&self, sent: Instant, bounds: &Bounds) -> bool {
        let (t, calm_after) = (sent + bounds.answer_within, bounds.calm_after);
        let recent = |a: Instant, b: Instant| a <= t && t <= b + calm_after;
        if self.faults.iter().any(|f| {
            let tail = if matches!(f.fault.kind, Kind::ApiOutage) {
                API_CATCH_UP
            } else {
                Duration::ZERO
            };
            recent(f.start, f.end + tail)
        }) {
            return false;
        }
        !self.units.values().flatten().any(|(at, e)| {
            matches!(
                e,
                Event::Started { .. } | Event::Exited { .. } | Event::Stopped | Event::Continued
            ) && recent(*at, *at)
        })
    }

    /// Intervals during which `node`'s port was down.
    fn port_down(&self, node: &str) -> Vec<(Instant, Instant)> {
        let mut out = Vec::new();
        for f in self.faults {
            match &f.fault.kind {
                Kind::HostGone { node: n } if n == node => out.push((f.start, f.end)),
                Kind::LinkFlap { node: n, flaps } if n == node => {
                    let len = f.end.saturating_duration_since(f.start);
                    let changes = 2 * flaps;
                    for k in 0..*flaps {
                        let down = f.start + len * (2 * k) / changes;
                        let up = f.start + len * (2 * k + 1) / changes;
                        out.push((down, up));
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// Whether a fault that takes an agent or a host away from its peers
    /// (or their messages from each other) was in force during the dark
    /// run from `s` to `e`, or ended less than a detection before it:
    /// only then must the others find something out before the VIP may
    /// answer elsewhere, and the no-owner bound carries the failure
    /// detector's time. An `ip addr del` on a live host, an API outage, a
    /// Service's churn, a drain or a preference edit leave every agent
    /// where its peers see it.
    fn someone_away(&self, s: Instant, e: Instant, bounds: &Bounds) -> bool {
        self.faults.iter().any(|f| {
            let away = matches!(
                f.fault.kind,
                Kind::HostGone { .. }
                    | Kind::LinkFlap { .. }
                    | Kind::Stall { .. }
                    | Kind::KillCleanup { .. }
                    | Kind::KillNoCleanup { .. }
                    | Kind::Upgrade { .. }
                    | Kind::Lossy { .. }
                    | Kind::OneWay { .. }
                    | Kind::Partition { .. }
                    | Kind::GossipCut { .. }
            );
            away && f.start <= e && s <= f.end + bounds.detection
        })
    }

    /// While the agents could not know what the API says: each outage and
    /// its catch-up.
    fn api_away(&self) -> Vec<(Instant, Instant)> {
        self.faults
            .iter()
            .filter(|f| matches!(f.fault.kind, Kind::ApiOutage))
            .map(|f| (f.start, f.end + API_CATCH_UP))
            .collect()
    }

    /// Intervals during which `node` could answer and stand: its agent ran
    /// (not stopped), had reached the API and reconciled since it started,
    /// and its port was up.
    fn available(&self, node: &str, bounds: &Bounds) -> Vec<(Instant, Instant)> {
        let events = self.units.get(node).map_or(&[][..], Vec::as_slice);
        let mut runs: Vec<(Instant, Instant)> = Vec::new();
        let mut started: Option<Instant> = None;
        let mut ready: Option<Instant> = None;
        let mut stopped_at: Option<Instant> = None;
        let far = self.end + Duration::from_secs(3600);
        let close = |from: Option<Instant>, to: Instant, runs: &mut Vec<(Instant, Instant)>| {
            if let Some(f) = from
                && f < to
            {
                runs.push((f, to));
            }
        };
        for (at, e) in events {
            match e {
                Event::Started { .. } => {
                    started = Some(*at);
                    ready = None;
                }
                Event::Ready if started.is_some() => ready = Some(*at),
                Event::Stopped => {
                    close(ready, *at, &mut runs);
                    stopped_at = Some(*at);
                }
                Event::Continued => {
                    // A thawed agent acts again at once, on what it had.
                    stopped_at = None;
                    ready = ready.map(|_| *at);
                }
                Event::Exited { .. } | Event::Signalled { signal: "TERM" } => {
                    if stopped_at.is_none() {
                        close(ready, *at, &mut runs);
                    }
                    ready = None;
                    stopped_at = None;
                    if matches!(e, Event::Exited { .. }) {
                        started = None;
                    }
                }
                _ => {}
            }
        }
        if stopped_at.is_none() {
            close(ready, far, &mut runs);
        }
        // A run counts once it reconciled: the API reachable (its port up,
        // no outage) from some time after it was ready, plus `reconcile`.
        let mut blocked = self.port_down(node);
        blocked.extend(self.api_away());
        let runs: Vec<(Instant, Instant)> = runs
            .into_iter()
            .filter_map(|(a, b)| {
                let mut from = a;
                // Push `from` past every block it falls in.
                loop {
                    let moved = blocked
                        .iter()
                        .filter(|(x, y)| *x <= from && from < *y)
                        .map(|(_, y)| *y)
                        .max();
                    match moved {
                        Some(y) => from = y,
                        None => break,
                    }
                }
                let from = from + bounds.reconcile;
                (from < b).then_some((from, b))
            })
            .collect();
        subtract(&runs, &self.port_down(node))
    }
}

/// `a` minus every interval of `b`.
fn subtract(a: &[(Instant, Instant)], b: &[(Instant, Instant)]) -> Vec<(Instant, Instant)> {
    let mut out = a.to_vec();
    for &(x, y) in b {
        out = out
            .into_iter()
            .flat_map(|(s, e)| {
                let mut v = Vec::new();
                if x >= e || y <= s {
                    v.push((s, e));
                } else {
                    if s < x {
                        v.push((s, x));
                    }
                    if y < e {
                        v.push((y, e));
                    }
                }
                v
            })
            .collect();
    }
    out
}

/// Where a fault lets two hosts answer, and until when (from the
/// simulation's table: each kind of episode and its bound).
fn excuses(inputs: &Inputs<'_>, bounds: &Bounds) -> Vec<(Instant, Instant, &'static str)> {
    let mut out = Vec::new();
    for f in inputs.faults {
        let (from, until) = match &f.fault.kind {
            Kind::HostGone { .. }
            | Kind::LinkFlap { .. }
            | Kind::OneWay { .. }
            | Kind::Partition { .. }
            | Kind::GossipCut { .. } => (f.start, f.end + bounds.partition),
            // Not running: its kernel answers until the address lapses;
            // thawed, it is a live holder again.
            Kind::Stall { .. } => (
                f.start,
                (f.end.min(f.start + bounds.lifetime)) + bounds.two_owners,
            ),
            Kind::KillNoCleanup { .. } => (
                f.start,
                f.end.max(f.start + bounds.lifetime) + bounds.starting,
            ),
            Kind::Upgrade { .. } => (f.start, f.start + bounds.leaving),
            // Views that differ (one agent caught up, another not yet)
            // settle as a hand-over would, once all have caught up.
            Kind::ApiOutage => (f.start, f.end + API_CATCH_UP + bounds.two_owners),
            _ => continue,
        };
        out.push((from, until, f.fault.kind.name()));
    }
    // Every start of an agent: it may answer beside a peer until the
    // peer's state reaches it.
    for events in inputs.units.values() {
        for (at, e) in events {
            if let Event::Started { .. } = e {
                out.push((*at, *at + bounds.starting, "an agent starting"));
            }
        }
    }
    out
}

/// Judges one stretch of the run; the violations and the worst seen.
pub fn judge(inputs: &Inputs<'_>, bounds: &Bounds) -> (Vec<Violation>, Worst) {
    let mut violations = Vec::new();
    let mut worst = Worst::default();
    let excuses = excuses(inputs, bounds);
    let available: BTreeMap<&str, Vec<(Instant, Instant)>> = inputs
        .nodes
        .iter()
        .map(|n| (n.as_str(), inputs.available(n, bounds)))
        .collect();
    let node_name = |mac: &str| {
        inputs
            .macs
            .get(mac)
            .cloned()
            .unwrap_or_else(|| format!("a host that is no node ({mac})"))
    };
    for Heard { ip, sent, replies } in inputs.probes {
        // A request is judged once its answer had time to come before
        // the history was read: the last ones of a run were sent while it
        // was read, and their answers recorded after (seed 1102 reported
        // the run's very last request as "no answer for 10 ms").
        let sent: Vec<Instant> = sent
            .iter()
            .copied()
            .filter(|s| *s >= inputs.start && *s + bounds.answer_within <= inputs.end)
            .collect();
        let ws = windows(&sent, replies, bounds.answer_within);
        // Two owners.
        for (s, e, macs) in episodes(&ws, |w| w.macs.len() > 1, Duration::from_millis(50)) {
            let len = e.saturating_duration_since(s);
            let names: Vec<String> = macs.iter().map(|m| node_name(m)).collect();
            let calm = inputs.calm(s, bounds);
            worst.two_owners = worst.two_owners.max(len);
            if calm {
                worst.two_owners_calm = worst.two_owners_calm.max(len);
                violations.push(Violation {
                    at: s,
                    what: format!(
                        "{ip}: {} answered together for {} ms with nothing in force or recent",
                        names.join(" and "),
                        len.as_millis()
                    ),
                });
                continue;
            }
            let (allowed, bound) = allowance(&excuses, s, e, bounds);
            if e <= allowed {
                worst.held(bound, len, allowed - e);
            } else {
                violations.push(Violation {
                    at: s,
                    what: format!(
                        "{ip}: {} answered together for {} ms, {} ms past its bound ({})",
                        names.join(" and "),
                        len.as_millis(),
                        (e - allowed).as_millis(),
                        why(&excuses, s, allowed, bounds)
                    ),
                });
            }
        }
        // No owner, while the address was a Service's.
        let assigned = |w: &Window| inputs.service_of(*ip, w.at).is_some();
        worst.requests += ws.iter().filter(|w| assigned(w)).count() as u64;
        // The Service each answer since its address was assigned was for,
        // and the run of unanswered requests under way: its cause and
        // first request.
        let mut announced: Option<&str> = None;
        let mut run: Option<(&'static str, Instant)> = None;
        for w in &ws {
            let service = inputs.service_of(*ip, w.at);
            if w.answered || service.is_none() {
                worst.run_ended(run.take(), w.at);
            }
            let Some(service) = service else {
                announced = None;
                continue;
            };
            if announced != Some(service) {
                announced = None;
            }
            if w.answered {
                announced = Some(service);
                continue;
            }
            worst.unanswered += 1;
            // Dark until first announced is a new address, not an outage
            // (as the no-owner check below takes it).
            let cause = match announced {
                None => NOT_YET_ANNOUNCED,
                Some(_) => cause_of(inputs, w.at, bounds),
            };
            *worst.unanswered_by.entry(cause).or_default() += 1;
            run.get_or_insert((cause, w.at));
        }
        if let Some(last) = ws.last() {
            worst.run_ended(run, last.at);
        }
        for (s, e, _) in episodes(&ws, |w| !w.answered && assigned(w), Duration::ZERO) {
            let Some(service) = inputs.service_of(*ip, s) else {
                continue;
            };
            // Newly assigned: dark until first answered is no outage.
            if !ws
                .iter()
                .any(|w| w.at < s && w.answered && inputs.service_of(*ip, w.at) == Some(service))
            {
                continue;
            }
            let life = inputs.services.get(service);
            let candidates: Vec<&str> = match life {
                Some(l) if l.local => l.endpoints_at(s).iter().map(String::as_str).collect(),
                _ => inputs.nodes.iter().map(String::as_str).collect(),
            };
            let mut with: Vec<(Instant, Instant)> = candidates
                .iter()
                .flat_map(|n| available.get(n).cloned().unwrap_or_default())
                .filter_map(|(a, b)| {
                    let (a, b) = (a.max(s), b.min(e));
                    (a < b).then_some((a, b))
                })
                .collect();
            let longest = longest_union(&mut with);
            let len = e.saturating_duration_since(s);
            let (bound, why) = if inputs.someone_away(s, e, bounds) {
                (bounds.no_owner, "")
            } else {
                (
                    bounds.no_owner.saturating_sub(bounds.detection),
                    ", no node away",
                )
            };
            worst.dark_with_candidate = worst.dark_with_candidate.max(longest);
            if inputs.calm(s, bounds) && longest > Duration::ZERO {
                worst.dark_calm = worst.dark_calm.max(len);
                violations.push(Violation {
                    at: s,
                    what: format!(
                        "{ip} ({service}): no answer for {} ms with nothing in force or recent",
                        len.as_millis()
                    ),
                });
            } else if longest > bound {
                violations.push(Violation {
                    at: s,
                    what: format!(
                        "{ip} ({service}): no answer for {} ms, {} ms of them while a candidate ran and was reachable (bound {} ms{why})",
                        len.as_millis(),
                        longest.as_millis(),
                        bound.as_millis()
                    ),
                });
            }
        }
    }
    violations.extend(units(inputs));
    violations.sort_by_key(|v| v.at);
    (violations, worst)
}

/// What an unanswered request is counted under when its address had not
/// answered yet for its Service.
const NOT_YET_ANNOUNCED: &str = "a new address not announced yet";

/// What a request sent at `at` that went unanswered is counted under:
/// the fault that began last of those in force then or ended within
/// the no-owner bound before (its tail: the takeover it set off), else an
/// agent started within the starting bound, else nothing.
fn cause_of(inputs: &Inputs<'_>, at: Instant, bounds: &Bounds) -> &'static str {
    let fault = inputs
        .faults
        .iter()
        .filter(|f| f.start <= at && at <= f.end + bounds.no_owner)
        .max_by_key(|f| f.start);
    if let Some(f) = fault {
        return f.fault.kind.name();
    }
    let starting =
        inputs.units.values().flatten().any(|(t, e)| {
            matches!(e, Event::Started { .. }) && *t <= at && at <= *t + bounds.starting
        });
    if starting {
        "an agent starting"
    } else {
        "nothing in force or recent"
    }
}

/// By when an episode of two owners that began at `s` must end, and the
/// fault whose excuse holds it there.
///
/// The base bound runs from `s`; a fault that begins before the episode's
/// allowance so far has run out gives it its own (a partition that comes
/// while an earlier cut's tail still excuses the pair is a partition in
/// force, and its bound is the table's, from its heal), as the
/// simulation's checker takes the latest deadline of every situation seen
/// during an episode. A fault that begins once the allowance has run out
/// comes too late: the episode had already broken its bound; one that
/// begins after the episode ended (at `e`) had nothing to excuse.
fn allowance(
    excuses: &[(Instant, Instant, &'static str)],
    s: Instant,
    e: Instant,
    bounds: &Bounds,
) -> (Instant, &'static str) {
    let mut held = (s + bounds.two_owners, "the base bound");
    loop {
        let next = excuses
            .iter()
            .filter(|(a, b, _)| *a <= held.0.min(e) && *b > held.0 && *b >= s)
            .map(|(_, b, n)| (*b, *n))
            .max();
        match next {
            Some(later) => held = later,
            None => return held,
        }
    }
}

/// What excused two owners that began at `s`, until `allowed`, for the
/// message.
fn why(
    excuses: &[(Instant, Instant, &'static str)],
    s: Instant,
    allowed: Instant,
    bounds: &Bounds,
) -> String {
    let names: BTreeSet<&str> = excuses
        .iter()
        .filter(|(a, b, _)| *a <= allowed && *b >= s)
        .map(|(_, _, n)| *n)
        .collect();
    if names.is_empty() {
        format!(
            "{} ms with nothing that allows more",
            bounds.two_owners.as_millis()
        )
    } else {
        names.into_iter().collect::<Vec<_>>().join(", ")
    }
}

/// The units' own failures: an agent that exited unasked, or whose
/// `check` failed.
fn units(inputs: &Inputs<'_>) -> Vec<Violation> {
    let mut out = Vec::new();
    for (node, events) in inputs.units {
        for (at, e) in events {
            if *at < inputs.start || *at > inputs.end {
                continue;
            }
            match e {
                Event::Exited {
                    status,
                    asked: false,
                } => out.push(Violation {
                    at: *at,
                    what: format!("{node}: the agent exited by itself ({status})"),
                }),
                Event::CheckFailed { output } => out.push(Violation {
                    at: *at,
                    what: format!("{node}: `lbnodeagent check` failed: {output}"),
                }),
                _ => {}
            }
        }
    }
    out
}

/// Runs of windows for which `is` holds, merged across gaps shorter than
/// `merge`: `(first request, last request + a period, MACs seen)`.
fn episodes(
    ws: &[Window],
    is: impl Fn(&Window) -> bool,
    merge: Duration,
) -> Vec<(Instant, Instant, BTreeSet<String>)> {
    let mut out: Vec<(Instant, Instant, BTreeSet<String>)> = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        if !is(w) {
            continue;
        }
        let until = ws
            .get(i + 1)
            .map_or(w.at + Duration::from_millis(10), |n| n.at);
        match out.last_mut() {
            Some((_, e, macs)) if w.at <= *e + merge => {
                *e = until;
                macs.extend(w.macs.iter().cloned());
            }
            _ => out.push((w.at, until, w.macs.clone())),
        }
    }
    out
}

/// The longest stretch covered by the union of `v`.
fn longest_union(v: &mut [(Instant, Instant)]) -> Duration {
    v.sort();
    let mut best = Duration::ZERO;
    let mut cur: Option<(Instant, Instant)> = None;
    for &(a, b) in v.iter() {
        cur = match cur {
            Some((s, e)) if a <= e => Some((s, e.max(b))),
            Some((s, e)) => {
                best = best.max(e - s);
                Some((a, b))
            }
            None => Some((a, b)),
        };
    }
    if let Some((s, e)) = cur {
        best = best.max(e - s);
    }
    best
}

/// The Services' lives from the bed's initial Services and the churn that
/// was carried out.
pub fn service_lives(
    initial: &[(String, bool, Vec<String>)],
    t0: Instant,
    faults: &[Applied],
) -> BTreeMap<String, ServiceLife> {
    let mut out: BTreeMap<String, ServiceLife> = initial
        .iter()
        .map(|(n, local, eps)| {
            (
                n.clone(),
                ServiceLife {
                    local: *local,
                    endpoints: vec![(t0, eps.clone())],
                    deleted: None,
                },
            )
        })
        .collect();
    for f in faults {
        if f.note.as_deref().is_some_and(|n| n.starts_with("refused")) {
            continue;
        }
        match &f.fault.kind {
            Kind::Churn(Churn::Create {
                name,
                local,
                endpoints,
            }) => {
                out.insert(
                    name.clone(),
                    ServiceLife {
                        local: *local,
                        endpoints: vec![(f.start, endpoints.clone())],
                        deleted: None,
                    },
                );
            }
            Kind::Churn(Churn::Delete { name }) => {
                if let Some(l) = out.get_mut(name) {
                    l.deleted = Some(f.start);
                }
            }
            Kind::Churn(Churn::Endpoints { name, endpoints }) => {
                if let Some(l) = out.get_mut(name) {
                    l.endpoints.push((f.start, endpoints.clone()));
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::schedule::{Fault, Sides};

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    /// A prober's history: a request every 10 ms over `[0, until)`, each
    /// answered 1 ms later by whoever `who(n)` names.
    fn history(
        t0: Instant,
        until: u64,
        who: impl Fn(u64) -> Vec<&'static str>,
    ) -> (Vec<Instant>, Vec<(Instant, String)>) {
        let sent: Vec<Instant> = (0..until / 10).map(|k| ms(t0, k * 10)).collect();
        let mut replies = Vec::new();
        for k in 0..until / 10 {
            for mac in who(k * 10) {
                replies.push((ms(t0, k * 10 + 1), mac.to_string()));
            }
        }
        (sent, replies)
    }

    fn applied(t0: Instant, at: u64, len: u64, kind: Kind) -> Applied {
        Applied {
            round: 0,
            fault: Fault {
                at: Duration::from_millis(at),
                len: Duration::from_millis(len),
                kind,
            },
            start: ms(t0, at),
            end: ms(t0, at + len),
            note: None,
        }
    }

    struct World {
        t0: Instant,
        nodes: Vec<String>,
        macs: BTreeMap<String, String>,
        units: BTreeMap<String, Vec<(Instant, Event)>>,
        timeline: Vec<(Instant, BTreeMap<IpAddr, String>)>,
        services: BTreeMap<String, ServiceLife>,
    }

    fn world() -> World {
        let t0 = Instant::now();
        let nodes: Vec<String> = ["n1", "n2"].map(String::from).to_vec();
        let macs = [("m1", "n1"), ("m2", "n2")]
            .map(|(m, n)| (m.to_string(), n.to_string()))
            .into();
        // Both agents ran and were ready long before.
        let units = nodes
            .iter()
            .map(|n| {
                (
                    n.clone(),
                    vec![
                        (t0 - Duration::from_secs(60), Event::Started { pid: 1 }),
                        (t0 - Duration::from_secs(59), Event::Ready),
                    ],
                )
            })
            .collect();
        let timeline = vec![(
            t0 - Duration::from_secs(30),
            [("10.0.0.1".parse().unwrap(), "svc".to_string())].into(),
        )];
        let services = [(
            "svc".to_string(),
            ServiceLife {
                local: false,
                endpoints: vec![(t0 - Duration::from_secs(30), nodes.clone())],
                deleted: None,
            },
        )]
        .into();
        World {
            t0,
            nodes,
            macs,
            units,
            timeline,
            services,
        }
    }

    fn judge_with(
        w: &World,
        history: (Vec<Instant>, Vec<(Instant, String)>),
        faults: &[Applied],
    ) -> Vec<Violation> {
        judge_all(w, history, faults).0
    }

    fn judge_all(
        w: &World,
        history: (Vec<Instant>, Vec<(Instant, String)>),
        faults: &[Applied],
    ) -> (Vec<Violation>, Worst) {
        let probes = vec![Heard {
            ip: "10.0.0.1".parse().unwrap(),
            sent: history.0,
            replies: history.1,
        }];
        let inputs = Inputs {
            start: w.t0,
            end: w.t0 + Duration::from_secs(60),
            nodes: &w.nodes,
            macs: &w.macs,
            probes: &probes,
            faults,
            units: &w.units,
            timeline: &w.timeline,
            services: &w.services,
        };
        judge(&inputs, &Bounds::new(Duration::from_secs(15)))
    }

    #[test]
    fn a_steady_owner_is_no_violation() {
        let w = world();
        assert!(judge_with(&w, history(w.t0, 20_000, |_| vec!["m1"]), &[]).is_empty());
    }

    #[test]
    fn two_owners_in_calm_are_a_violation_however_short() {
        let w = world();
        let h = history(w.t0, 20_000, |t| {
            if (10_000..10_030).contains(&t) {
                vec!["m1", "m2"]
            } else {
                vec!["m1"]
            }
        });
        let v = judge_with(&w, h, &[]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].what
                .contains("n1 and n2 answered together for 30 ms with nothing"),
            "{v:?}"
        );
    }

    #[test]
    fn a_fault_carried_out_while_a_request_waits_for_its_answers_is_in_force() {
        let w = world();
        // n1 is sent SIGTERM at 10.004 s and hands over at once: the
        // request sent at 10 s hears both; the fault was in force then.
        let term = applied(w.t0, 10_004, 1, Kind::Upgrade { node: "n1".into() });
        let h = history(w.t0, 20_000, |t| match t {
            0..10_000 => vec!["m1"],
            10_000..10_010 => vec!["m1", "m2"],
            _ => vec!["m2"],
        });
        let v = judge_with(&w, h.clone(), std::slice::from_ref(&term));
        assert!(v.is_empty(), "{v:?}");
        // Carried out 60 ms after: the two answered with nothing in force.
        let late = applied(w.t0, 10_060, 1, Kind::Upgrade { node: "n1".into() });
        let v = judge_with(&w, h, &[late]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].what.contains("with nothing in force"), "{v:?}");
    }

    #[test]
    fn a_partition_excuses_two_owners_until_its_bound_after_the_heal() {
        let w = world();
        let cut = applied(
            w.t0,
            5_000,
            5_000,
            Kind::Partition {
                side: vec!["n1".into()],
            },
        );
        // Two owners from 5.2 s to 12 s: healed at 10 s, settled 2 s later
        // (the bound is 4.5 s after the heal).
        let h = history(w.t0, 20_000, |t| {
            if (5_200..12_000).contains(&t) {
                vec!["m1", "m2"]
            } else {
                vec!["m1"]
            }
        });
        let (v, worst) = judge_all(&w, h, std::slice::from_ref(&cut));
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(
            worst.by_bound.get("partition"),
            Some(&(Duration::from_millis(6_800), Duration::from_millis(2_500))),
            "held by the partition's bound, 2.5 s short of it"
        );
        // Until 16 s: 1.5 s past it.
        let h = history(w.t0, 20_000, |t| {
            if (5_200..16_000).contains(&t) {
                vec!["m1", "m2"]
            } else {
                vec!["m1"]
            }
        });
        let v = judge_with(&w, h, &[cut]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].what.contains("1500 ms past its bound (partition)"),
            "{v:?}"
        );
    }

    #[test]
    fn a_partition_that_begins_within_an_earlier_excuse_gives_its_own_bound() {
        let w = world();
        // A one-way cut from 5 s to 10 s (its excuse runs to 14.5 s), then
        // a partition from 12 s to 20 s (to 24.5 s): two owners from 5.2 s
        // to 22 s are within the second's bound though it began more than
        // the base bound after the episode did.
        let one_way = applied(
            w.t0,
            5_000,
            5_000,
            Kind::OneWay {
                sides: Sides {
                    from: vec!["n2".into()],
                    to: vec!["n1".into()],
                },
            },
        );
        let two_owners = |t| {
            if (5_200..22_000).contains(&t) {
                vec!["m1", "m2"]
            } else {
                vec!["m1"]
            }
        };
        let partition = |at| {
            applied(
                w.t0,
                at,
                8_000,
                Kind::Partition {
                    side: vec!["n1".into()],
                },
            )
        };
        let (v, worst) = judge_all(
            &w,
            history(w.t0, 30_000, two_owners),
            &[one_way.clone(), partition(12_000)],
        );
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(
            worst.by_bound.get("partition"),
            Some(&(Duration::from_millis(16_800), Duration::from_millis(2_500)))
        );
        // An agent that starts after the episode ended excuses nothing
        // and does not hold it.
        let late_start = applied(w.t0, 22_500, 1, Kind::Upgrade { node: "n2".into() });
        let (_, worst) = judge_all(
            &w,
            history(w.t0, 30_000, two_owners),
            &[one_way.clone(), partition(12_000), late_start],
        );
        assert_eq!(
            worst.by_bound.keys().copied().collect::<Vec<_>>(),
            ["partition"]
        );
        // The same partition from 15 s: the one-way cut's excuse had run
        // out at 14.5 s, and the episode had broken its bound by then.
        let v = judge_with(
            &w,
            history(w.t0, 30_000, two_owners),
            &[one_way, partition(15_000)],
        );
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].what
                .contains("7500 ms past its bound (one-way partition)"),
            "{v:?}"
        );
    }

    #[test]
    fn a_planned_move_may_overlap_but_not_past_the_hand_over_bound() {
        let w = world();
        let drain = applied(w.t0, 5_000, 8_000, Kind::Drain { node: "n1".into() });
        let h = history(w.t0, 20_000, |t| match t {
            0..5_050 => vec!["m1"],
            5_050..5_100 => vec!["m1", "m2"],
            _ => vec!["m2"],
        });
        assert!(judge_with(&w, h, std::slice::from_ref(&drain)).is_empty());
        let h = history(w.t0, 20_000, |t| match t {
            0..5_050 => vec!["m1"],
            5_050..9_100 => vec!["m1", "m2"],
            _ => vec!["m2"],
        });
        let v = judge_with(&w, h, &[drain]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].what
                .contains("past its bound (3000 ms with nothing that allows more)"),
            "{v:?}"
        );
    }

    #[test]
    fn no_owner_counts_only_while_a_candidate_runs_and_is_reachable() {
        let mut w = world();
        // n1 owns and its port goes down at 5 s for 6 s; n2 takes over at
        // 5.2 s: within the bound.
        let gone = applied(w.t0, 5_000, 6_000, Kind::HostGone { node: "n1".into() });
        let h = history(w.t0, 20_000, |t| match t {
            0..5_000 => vec!["m1"],
            5_000..5_200 => vec![],
            _ => vec!["m2"],
        });
        assert!(judge_with(&w, h, std::slice::from_ref(&gone)).is_empty());
        // Nobody for 5 s while n2 ran: too long (the last requests before
        // 10 s count as answered by the answers within 50 ms).
        let h = history(w.t0, 20_000, |t| match t {
            0..5_000 => vec!["m1"],
            5_000..10_000 => vec![],
            _ => vec!["m2"],
        });
        let v = judge_with(&w, h.clone(), std::slice::from_ref(&gone));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].what.contains("no answer for 4960 ms, 4960 ms of them"),
            "{v:?}"
        );
        // The same silence while n2 was stopped (SIGSTOP) until 9 s: only
        // the second after counts.
        w.units.get_mut("n2").unwrap().extend([
            (ms(w.t0, 4_000), Event::Stopped),
            (ms(w.t0, 9_000), Event::Continued),
        ]);
        let stall = applied(w.t0, 4_000, 5_000, Kind::Stall { node: "n2".into() });
        assert!(judge_with(&w, h, &[gone, stall]).is_empty());
    }

    /// Detection is part of the no-owner bound only when a node went away:
    /// an address removed on a live host must be back within the rest.
    #[test]
    fn no_owner_counts_detection_only_when_a_node_went_away() {
        let w = world();
        let dark_3s = || {
            history(w.t0, 20_000, |t| match t {
                0..5_000 => vec!["m1"],
                5_000..8_000 => vec![],
                _ => vec!["m1"],
            })
        };
        let del = applied(
            w.t0,
            5_000,
            10,
            Kind::AddrDel {
                index: 0,
                ipv6: false,
            },
        );
        let without = NO_OWNER_WIRE - DETECTION_WIRE;
        assert!(without < Duration::from_millis(2_960) && NO_OWNER_WIRE > Duration::from_secs(3));
        let v = judge_with(&w, dark_3s(), std::slice::from_ref(&del));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].what
                .contains(&format!("(bound {} ms, no node away)", without.as_millis())),
            "{v:?}"
        );
        // The same silence with n1's host gone meanwhile: within the bound
        // that carries the detection.
        let gone = applied(w.t0, 4_990, 2_000, Kind::HostGone { node: "n1".into() });
        assert!(judge_with(&w, dark_3s(), &[del.clone(), gone]).is_empty());
        // A host gone long before (its detection over) gives nothing.
        let long_before = applied(w.t0, 1_000, 500, Kind::HostGone { node: "n1".into() });
        assert_eq!(judge_with(&w, dark_3s(), &[long_before, del]).len(), 1);
    }

    /// Each unanswered request is counted under the fault that began last
    /// of those in force or in their tail when it was sent, or under
    /// nothing; one before its address first answered, as not announced
    /// yet.
    #[test]
    fn unanswered_requests_are_counted_by_what_was_in_force() {
        let w = world();
        let dark = history(w.t0, 40_000, |t| match t {
            0..100 | 5_000..5_200 | 8_000..8_100 | 15_100..15_200 | 30_000..30_100 => vec![],
            _ => vec!["m1"],
        });
        let gone = applied(w.t0, 4_990, 2_000, Kind::HostGone { node: "n1".into() });
        let lossy = applied(
            w.t0,
            15_000,
            1_000,
            Kind::Lossy {
                node: "n2".into(),
                faults: crate::switch::LinkFaults {
                    loss: 0.2,
                    ..Default::default()
                },
            },
        );
        let (_, worst) = judge_all(&w, dark, &[gone, lossy]);
        let by = |cause: &str| worst.unanswered_by.get(cause).copied().unwrap_or(0);
        // A request every 10 ms, answered if the light is back within
        // 50 ms of it: 6 before the address first answered, 16 while the
        // host was gone, 6 in the takeover its end set off, 6 on the
        // lossy wire, 6 with nothing to blame.
        assert_eq!(by(NOT_YET_ANNOUNCED), 6, "{worst}");
        assert_eq!(by("host gone"), 22, "{worst}");
        assert_eq!(by("loss, delay, duplication"), 6, "{worst}");
        assert_eq!(by("nothing in force or recent"), 6, "{worst}");
        assert_eq!(worst.unanswered, 40);
        // Its longest run: 5,000 to the first request answered, 5,160.
        assert_eq!(
            worst.longest_unanswered_by.get("host gone"),
            Some(&Duration::from_millis(160))
        );
        assert!(
            worst.to_string().contains("host gone 22 (at most 160 ms)"),
            "the report says it: {worst}"
        );
        // A run still dark when the judged stretch ends counts up to its
        // last request: 39,000 to 39,990.
        let dark_at_the_end = history(w.t0, 40_000, |t| match t {
            39_000.. => vec![],
            _ => vec!["m1"],
        });
        let (_, worst) = judge_all(&w, dark_at_the_end, &[]);
        assert_eq!(
            worst
                .longest_unanswered_by
                .get("nothing in force or recent"),
            Some(&Duration::from_millis(990)),
            "{worst}"
        );
    }

    /// The timeline reads the Services every 200 ms, so it shows a deleted
    /// Service's address a moment after the deletion: requests from the
    /// deletion on are no longer the address's to answer.
    #[test]
    fn requests_after_a_service_is_deleted_are_not_owed_an_answer() {
        let mut w = world();
        let delete = Applied {
            round: 0,
            fault: Fault {
                at: Duration::from_millis(20_000),
                len: Duration::ZERO,
                kind: Kind::Churn(Churn::Delete { name: "svc".into() }),
            },
            start: ms(w.t0, 20_000),
            end: ms(w.t0, 20_000),
            note: None,
        };
        w.timeline.push((ms(w.t0, 20_190), BTreeMap::new()));
        let answered_until_deleted = || {
            history(
                w.t0,
                40_000,
                |t| {
                    if t < 20_000 { vec!["m1"] } else { vec![] }
                },
            )
        };
        // The timeline alone still counts the 19 requests before its
        // next reading, 20,000 to 20,180.
        let (_, worst) = judge_all(&w, answered_until_deleted(), &[]);
        assert_eq!(worst.unanswered, 19, "{worst}");
        w.services = service_lives(
            &[("svc".into(), false, w.nodes.clone())],
            w.t0 - Duration::from_secs(30),
            std::slice::from_ref(&delete),
        );
        assert_eq!(w.services["svc"].deleted, Some(ms(w.t0, 20_000)));
        let (v, worst) = judge_all(&w, answered_until_deleted(), std::slice::from_ref(&delete));
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(worst.unanswered, 0, "{worst}");
        assert_eq!(worst.requests, 2_000, "{worst}");
    }

    #[test]
    fn an_unasked_exit_is_a_violation() {
        let mut w = world();
        w.units.get_mut("n2").unwrap().push((
            ms(w.t0, 3_000),
            Event::Exited {
                status: "signal: 6 (SIGABRT)".into(),
                asked: false,
            },
        ));
        let v = judge_with(&w, history(w.t0, 20_000, |_| vec!["m1"]), &[]);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].what.contains("n2: the agent exited by itself"),
            "{v:?}"
        );
    }

    /// The requests of the run's last moments, sent while the history was
    /// read, have no answer in it yet: they are not judged.
    #[test]
    fn a_request_sent_as_the_history_is_read_is_not_judged() {
        let w = world();
        let end = 60_000;
        let (mut sent, replies) = history(w.t0, end, |_| vec!["m1"]);
        // One more request 5 ms before the end, its answer not read.
        sent.push(ms(w.t0, end - 5));
        let v = judge_with(&w, (sent, replies), &[]);
        assert!(v.is_empty(), "{v:?}");
    }

    #[test]
    fn a_late_answer_is_unanswered_and_windows_split_by_request() {
        let t0 = Instant::now();
        let sent = vec![ms(t0, 0), ms(t0, 10), ms(t0, 20)];
        let replies = vec![
            (ms(t0, 1), "a".to_string()),
            (ms(t0, 2), "b".to_string()),
            (ms(t0, 75), "a".to_string()),
        ];
        let ws = windows(&sent, &replies, ANSWER_WITHIN);
        assert_eq!(ws[0].macs.len(), 2);
        assert!(ws[0].answered);
        assert!(
            !ws[1].answered,
            "75 ms is past the 50 ms an answer may take"
        );
        assert!(!ws[2].answered, "nor 55 ms after the third");
        assert!(ws[1].macs.is_empty() && ws[2].macs.is_empty());
    }
}
