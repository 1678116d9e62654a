//! The invariants, judged as a client on the LAN sees it: which hosts
//! answer ARP/NS for each VIP, and for how long.
//!
//! - **Never two owners beyond a bound.** Two hosts may answer at once only
//!   while one of these lasts: a make-before-break move between live,
//!   connected agents ([`HANDOVER_MAX`] and a little), a node that is still
//!   starting giving up an address of its previous run once it sees a peer
//!   hold it, a gossip-only partition (the conflict rule settles it within
//!   a few probes), or an owner whose agent is not running (frozen, or
//!   killed with nobody to clean up), whose address lasts until its
//!   lifetime runs out. One double fault is not bounded: a gossip-only
//!   partition between two nodes whose views of the cluster differ (the
//!   API server went away while a change was on its way): each ranks itself
//!   first, and neither can learn better until gossip or the API server
//!   returns. The stats report how long it lasted.
//!   A pair that answers together again within [`REJOIN_GAP`] of letting
//!   go goes on with the same episode: a node made to let go that takes
//!   the VIP back at once does not restart the bound's clock.
//! - **No VIP without an owner beyond a bound** while the election, run
//!   over the ready agents, has a winner for it: failure detection, the
//!   probe window, a yield that outlives a dead owner's address, retries of
//!   a refused operation.
//! - **Planned moves lose nothing.** With no unplanned fault active or
//!   recent, a VIP that had an owner never goes without one while it has a
//!   candidate: SIGTERM, a node returning, Service, endpoint, label and
//!   advertisement changes are all make before break.
//! - **Two live holders with one view settle.** Two hosts whose agents run,
//!   are ready, hear each other through gossip and have the same view of
//!   the cluster answer together no longer than a hand-over: however the
//!   episode began (a partition, a lag, a restart), it ends within
//!   [`AGREED_BOUND`] of the moment all that holds.
//! - **A candidate is a node that reconciled.** An agent publishes `alive`
//!   only once it has a complete view of the cluster and has heard its
//!   peers, or waited the start's grace for them: a node its peers elect
//!   must be able to serve (judged by the world, see `World::publish`).
//! - **An agent that can be ready is, within [`READY_BOUND`]** of the
//!   moment nothing kept it from it (started, thawed, its API server or
//!   kernel back): the no-owner property counts only ready agents as
//!   candidates, and would not see a winner stuck short of ready.
//! - **Who may answer is the checker's own rule** ([`lan_on_link`]), not
//!   the core's `Links`: a defect there must not move the expected
//!   answer with it.
//! - **A dead owner's lapse is followed at once.** When the address of an
//!   owner whose agent is not running lapses, and the node that now wins
//!   the VIP was told when it would (the owner's beats, or a relay), that
//!   node answers within [`LAPSE_BOUND`] (SPEC: the successor answers at
//!   most 100 ms after the old address lapses).
//! - **Nothing flaps after a heal.** Once every fault has healed and the
//!   cluster has settled, no address is added, removed or lapses during
//!   [`STEADY_WINDOW`], and at the end every VIP is held exactly where the
//!   election says: by its winner, or (off-link) by every eligible node.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use super::scenario::{SUBNET_V4, SUBNET_V6};
use super::{ETH0, KUBE_LB0};
use crate::agent::core::HANDOVER_MAX;
use crate::agent::core::conflict::{PRECHECK, YIELD_HOLD};
use crate::election::{Cluster, Election, Member, NodeName, OnLink};

mod judge;
use crate::bounds::*;
pub use crate::bounds::{FOLLOW, LAPSE_BOUND, STEADY_WINDOW};

/// A change to the cluster reaches every agent, and their word that they
/// know it (a newer revision) reaches a leaving node, within this: the
/// slowest watch, the slowest gossip spread and a kernel batch. A leaving
/// node with no successor keeps its VIP a few gossip rounds for such news
/// (`LEAVE_GRACE_ROUNDS`); a change that names a successor later than
/// this before the leaving node lets go may miss it. The VIP is then dark
/// until the successor's add lands (the no-owner bound), not a broken
/// make-before-break: there was no one to make before.
pub const NEWS_LEAD: Duration =
    Duration::from_millis(super::WATCH_MS.1 + super::SPREAD_MS.1 + super::BATCH_MS.1);

/// The situation that broke its bound, followed until it ends.
#[derive(Clone, Copy, Debug)]
struct Follow {
    ip: IpAddr,
    /// The two owners, or none for a VIP without an owner.
    pair: Option<(usize, usize)>,
    since: Duration,
    bound: Duration,
}

#[derive(Clone, Debug)]
pub struct Violation {
    pub t: Duration,
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at {:.3}s: {}", self.t.as_secs_f64(), self.what)
    }
}

/// What was seen over a run, for the summary.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Addresses added to or removed from a kernel (renewals excluded),
    /// lapses included.
    pub kernel_changes: u64,
    pub lapsed: u64,
    /// Longest two-owner episode, by what allowed it.
    pub two_owners: BTreeMap<&'static str, Duration>,
    /// Longest time a VIP had no owner while it had a candidate.
    pub no_owner: Duration,
    /// Owners that let a VIP go to another while nothing unplanned was
    /// going on: the planned moves the make-before-break check watched.
    pub quiet_moves: u64,
    /// Of the VIPs dark for a moment in such a move, those whose successor
    /// was named too late for the old owner to hear (see [`NEWS_LEAD`]).
    pub late_successors: u64,
    /// Owners that stalled with nothing else going on: the stalls the
    /// no-spurious-takeover check watched.
    pub calm_stalls: u64,
    /// Of those, VIPs taken because every question of the pre-check, or
    /// its answer, was lost.
    pub unheard_takeovers: u64,
    /// Pairs of owners that became live, ready, connected and of one view
    /// while both answered (watched by [`AGREED_BOUND`]), and the longest
    /// they took to settle from then.
    pub agreed_pairs: u64,
    pub agreed_longest: Duration,
    /// Dead owners' lapses followed by a successor that knew when (watched
    /// by [`LAPSE_BOUND`]), and the longest gap.
    pub lapses_followed: u64,
    pub lapse_longest: Duration,
}

#[derive(Clone, Debug)]
pub struct HostState<'a> {
    pub name: &'a str,
    pub agent_running: bool,
    /// Since when the agent has not been running (frozen, killed, host
    /// off); its addresses lapse a lifetime after.
    pub stopped_at: Option<Duration>,
    /// When its frozen agent last ran again.
    pub thawed_at: Option<Duration>,
    /// `cleanup` runs since then: it removes each address once another
    /// host answers for it.
    pub cleanup_since: Option<Duration>,
    /// Its agent stalls (starved for a moment) since then.
    pub stalled_since: Option<Duration>,
    pub ready: bool,
    /// Leaving since then (its SIGTERM).
    pub leaving: Option<Duration>,
    /// Its kernel refuses a share of operations now.
    pub flaky: bool,
    /// It must be ready by then: its agent runs (not frozen), its API
    /// server answers it and its kernel is steady, since a moment that
    /// many [`READY_BOUND`] ago. `None` while any of that is not so.
    pub ready_due: Option<Duration>,
    /// Some unplanned fault is on this host now.
    pub faulty: bool,
    /// Its agent heard its record's drain (and gossips it).
    pub drained: bool,
    /// Its agent found its gateways lost (and gossips it).
    pub gateway_lost: bool,
    /// When its agent last found its gateways lost, or back.
    pub gateway_changed_at: Option<Duration>,
    /// Its latest published state: generation and version.
    pub published: (u64, u64),
    /// What it last heard of each host's published state, by host.
    pub(super) heard: &'a [Option<super::Known>],
}

impl HostState<'_> {
    /// It has heard the latest published state of `of`, host `i`.
    fn has_heard(&self, i: usize, of: &HostState) -> bool {
        self.heard
            .get(i)
            .and_then(Option::as_ref)
            .is_some_and(|k| (k.generation, k.version) >= of.published)
    }
}

/// How a host's questions on the wire about an address went lately: when
/// one (or its answer) was last lost, when one was last answered.
#[derive(Clone, Copy, Debug, Default)]
pub struct Exchange {
    pub lost: Option<Duration>,
    pub heard: Option<Duration>,
}

/// The world as the checker needs it.
/// One version of the cluster objects, and when the API server made it.
pub struct Version {
    pub cluster: Cluster,
    pub made: Duration,
}

pub struct Context<'a> {
    pub hosts: Vec<HostState<'a>>,
    pub reach: &'a [Vec<bool>],
    /// The hosts whose LAN port has carrier now (powered, port up): by the
    /// checker's own rule ([`lan_on_link`]), those may answer on the LAN.
    pub on_link: Mask,
    /// The hosts whose agents run and are ready.
    pub ready: Mask,
    /// Every version of the cluster objects.
    pub versions: &'a BTreeMap<u64, Version>,
    /// The version each host's agent has.
    pub host_versions: Vec<u64>,
    /// The newest version a running agent has.
    pub newest: u64,
    /// The API server's version now.
    pub latest: u64,
    pub api_up: bool,
    pub exchanges: &'a BTreeMap<(usize, IpAddr), Exchange>,
}

#[derive(Clone)]
struct Episode {
    since: Duration,
    /// It must be over by then: the latest of what the situations seen
    /// during it allow.
    deadline: Duration,
    kind: &'static str,
    /// Since when both are live, ready, connected and of one view (see
    /// [`AGREED_BOUND`]).
    agreed: Option<Duration>,
}

#[derive(Default)]
struct VipState {
    owners: BTreeSet<usize>,
    /// Each pair of hosts answering together, judged on its own: one
    /// episode may chain several causes (a frozen owner, then a partition
    /// with another), each with its own bound.
    pairs: BTreeMap<(usize, usize), Episode>,
    /// Pairs whose episode ended lately, when, and the newest view of the
    /// cluster then: one that answers again within [`REJOIN_GAP`], with
    /// nothing carried out and no change of the cluster since, goes on
    /// with the same episode, its clock not restarted.
    ended: BTreeMap<(usize, usize), (Duration, u64, Episode)>,
    none: Option<Duration>,
    /// A dead owner's address lapsed then, and this host, which knew when
    /// it would, is to answer (see [`LAPSE_BOUND`]).
    lapsed: Option<(Duration, usize)>,
}

impl VipState {
    /// One owner, no pair of owners, no gap and no lapse being watched:
    /// nothing for a sweep to judge.
    fn settled(&self) -> bool {
        self.owners.len() == 1
            && self.pairs.is_empty()
            && self.none.is_none()
            && self.lapsed.is_none()
    }
}

/// A set of hosts, one bit each (a run has at most 20).
pub type Mask = u64;

/// Elections over ready agents, by cluster version, which agents count
/// and which have on-link prefixes; rebuilt only when those change.
type Oracles = BTreeMap<(u64, Mask, Mask, Mask, Mask), Election>;

pub struct Checker {
    lifetime: Duration,
    vips: BTreeMap<IpAddr, VipState>,
    violation: Option<Violation>,
    /// The open situation behind `violation`, while it lasts.
    follow: Option<Follow>,
    /// `violation` was told to the trace.
    told: bool,
    pub stats: Stats,
    /// The last time an unplanned fault began or ended.
    last_unplanned: Option<Duration>,
    /// The last time any fault or planned change was carried out.
    last_fault: Option<Duration>,
    /// Whether a pair that answers again soon goes on with its episode
    /// (see [`REJOIN_GAP`]).
    rejoin: bool,
    /// `kernel_changes` when the steady window began.
    steady: Option<u64>,
    oracles: Oracles,
    /// Room for a sweep's addresses, kept from one sweep to the next.
    scratch: Vec<IpAddr>,
    /// The cluster version whose addresses the last sweep made sure of.
    swept_version: Option<u64>,
}

impl Checker {
    pub fn new(lifetime: Duration) -> Checker {
        Checker {
            lifetime,
            vips: BTreeMap::new(),
            violation: None,
            follow: None,
            told: false,
            stats: Stats::default(),
            last_unplanned: None,
            last_fault: None,
            rejoin: true,
            steady: None,
            oracles: Oracles::new(),
            scratch: Vec::new(),
            swept_version: None,
        }
    }

    /// With `rejoin` (the default), a pair that answers together again
    /// within [`REJOIN_GAP`] of letting go, with nothing between, goes on
    /// with its episode; without it, each episode is judged apart, and a
    /// flap whose episodes are each under their bound goes unseen.
    pub fn with_rejoin(mut self, rejoin: bool) -> Checker {
        self.rejoin = rejoin;
        self
    }

    /// The violation once it is complete: at once, or once the situation
    /// behind it ended or has lasted [`FOLLOW`] more.
    pub fn take_violation(&mut self, t: Duration) -> Option<Violation> {
        let v = self.violation.as_mut()?;
        if self.follow.is_some() {
            if t < v.t + FOLLOW {
                return None;
            }
            v.what.push_str(&format!("; still so {FOLLOW:?} later"));
            self.follow = None;
        }
        self.violation.take()
    }

    /// A violation just found, once, for the trace.
    pub fn just_found(&mut self) -> Option<String> {
        let v = self.violation.as_ref()?;
        (!std::mem::replace(&mut self.told, true)).then(|| v.to_string())
    }

    /// The followed situation ended now.
    fn ended(&mut self, ip: IpAddr, pair: Option<(usize, usize)>, t: Duration) {
        let Some(f) = self.follow else { return };
        if f.ip != ip || f.pair != pair {
            return;
        }
        self.follow = None;
        if let Some(v) = &mut self.violation {
            v.what.push_str(&format!(
                "; it lasted {:?} in all, {:?} beyond its bound",
                t - f.since,
                t - f.bound
            ));
        }
    }

    /// A bound broken by a situation that lasts: the run follows it.
    fn fail_open(&mut self, t: Duration, what: String, follow: Follow) {
        if self.violation.is_none() {
            self.follow = Some(follow);
        }
        self.fail(t, what);
    }

    fn fail(&mut self, t: Duration, what: String) {
        match &mut self.violation {
            None => self.violation = Some(Violation { t, what }),
            // Several at once (the settled end): all of them.
            Some(v) if v.t == t => {
                v.what.push_str("; ");
                v.what.push_str(&what);
            }
            Some(_) => {}
        }
    }

    /// A node stood as a candidate before it could serve.
    pub fn unfit_candidate(&mut self, t: Duration, what: String) {
        self.fail(t, what);
    }

    /// How long ago an unplanned fault last began or ended.
    pub fn unplanned_since(&self, t: Duration) -> Duration {
        self.last_unplanned.map_or(t, |u| t.saturating_sub(u))
    }

    /// An unplanned fault began or ended.
    pub fn unplanned(&mut self, t: Duration) {
        self.last_unplanned = Some(t);
    }

    /// A fault or a planned change (a stop, a start, a drain) was carried
    /// out: a pair that answers again after it begins an episode of its own.
    pub fn fault(&mut self, t: Duration) {
        self.last_fault = Some(t);
    }

    pub fn steady_from(&mut self, kernel_changes: u64) {
        self.steady = Some(kernel_changes);
    }

    pub fn known_ips(&self) -> Vec<IpAddr> {
        self.vips.keys().copied().collect()
    }

    /// Quiet: no unplanned fault on any host or the API server now, and
    /// none began or ended for a while (long enough for a dead agent's
    /// address to lapse and the yields to it to end).
    fn quiet(&self, t: Duration, ctx: &Context) -> bool {
        let settle = self.lifetime + YIELD_HOLD + Duration::from_secs(2);
        ctx.api_up
            && ctx.hosts.iter().all(|h| !h.faulty)
            && self
                .last_unplanned
                .is_none_or(|u| t.saturating_sub(u) >= settle)
    }

    /// Calm enough that nothing may move a stalled owner's VIP: no other
    /// fault on any host or the API server, none for [`CALM`], every agent
    /// on the same view of the cluster, and gossip between every pair.
    fn calm(&self, t: Duration, ctx: &Context) -> bool {
        ctx.api_up
            && ctx.hosts.iter().all(|h| !h.faulty)
            && self
                .last_unplanned
                .is_none_or(|u| t.saturating_sub(u) >= CALM)
            && ctx.host_versions.iter().all(|v| *v == ctx.newest)
            && ctx.reach.iter().enumerate().all(|(a, row)| {
                row.iter().enumerate().all(|(b, r)| {
                    a == b || *r || !ctx.hosts[a].agent_running || !ctx.hosts[b].agent_running
                })
            })
    }

    /// A stalled owner lost a VIP it wins to another host that added it
    /// while nothing else was going on: a spurious takeover (SPEC: an
    /// agent starved for up to 200 ms keeps its VIPs).
    fn spurious_takeover(
        &mut self,
        ip: IpAddr,
        before: &BTreeSet<usize>,
        owners: &BTreeSet<usize>,
        t: Duration,
        ctx: &Context,
    ) {
        let added: Vec<usize> = owners.difference(before).copied().collect();
        if added.is_empty() || !self.calm(t, ctx) {
            return;
        }
        for &i in before.intersection(owners) {
            let Some(since) = ctx.hosts[i].stalled_since else {
                continue;
            };
            // Every agent that runs counts, ready or not: one that just
            // started may rightly win the VIP and take it over.
            let counted = mask(ctx.hosts.iter().map(|h| h.agent_running)) | 1 << i;
            if self.oracle(ctx, ctx.newest, counted).winner(ip) != Some(ctx.hosts[i].name) {
                continue;
            }
            // Every host that took it had not heard this owner's latest
            // word: the stall kept it from spreading (a drain lifted, a
            // gateway back, a VIP taken a moment before), and by what the
            // taker last heard it may take the VIP, make before break, as
            // a planned move (fresh seed 5001819101: an owner undrained,
            // took its VIPs back and stalled 41 ms later; a node that still
            // had it drained counted its own gateway back and took two of
            // them). The stalled owner cannot let go; the two owners this
            // makes are judged as any hand-over's. A takeover for the
            // silence alone comes from a node that heard the owner's last
            // word: a stall is long past that.
            if added
                .iter()
                .all(|&h| !ctx.hosts[h].has_heard(i, &ctx.hosts[i]))
            {
                continue;
            }
            // Its gateways changed and had not settled everywhere
            // (`UPSTREAM_COUNTED`): by its peers' word it may still be cut
            // off from them (its return not yet counted, or not yet told
            // when it stalled), and a node that counts its own gateway as
            // sound takes its VIPs, make before break, as from any holder
            // cut off. The stalled owner cannot let go; the two owners
            // this makes are judged as any hand-over's.
            if ctx.hosts[i]
                .gateway_changed_at
                .is_some_and(|at| t.saturating_sub(at) < UPSTREAM_COUNTED)
            {
                continue;
            }
            // The LAN was asked, and every question or answer of the
            // pre-check was lost: what a dead owner looks like. Counted,
            // and the two owners it makes are judged like any other.
            let window = PRECHECK + PRECHECK_SLACK;
            let unheard = |h: usize| {
                ctx.exchanges.get(&(h, ip)).is_some_and(|e| {
                    e.lost.is_some_and(|l| t.saturating_sub(l) <= window)
                        && e.heard.is_none_or(|a| t.saturating_sub(a) > window)
                })
            };
            if added.iter().all(|&h| unheard(h)) {
                self.stats.unheard_takeovers += 1;
                continue;
            }
            let names: Vec<&str> = added.iter().map(|&h| ctx.hosts[h].name).collect();
            self.fail(
                t,
                format!(
                    "{ip}: {names:?} took it from its winner {}, whose agent only stalled {:?} ago (a spurious takeover)",
                    ctx.hosts[i].name,
                    t.saturating_sub(since)
                ),
            );
        }
    }

    /// Another host took a sticky VIP from the one host answering for it
    /// while nothing else was going on, and that holder could still serve
    /// it: running, ready, not stalled, leaving, drained or cut off from its
    /// gateway, its port up, and a candidate by the cluster every agent has
    /// had for a while (a rebalance asked, or taken back, moves VIPs as a
    /// change of the cluster). The move back sticky placement is there to
    /// prevent: a preferred node that comes back, or gains preference.
    fn sticky_taken(
        &mut self,
        ip: IpAddr,
        before: &BTreeSet<usize>,
        owners: &BTreeSet<usize>,
        t: Duration,
        ctx: &Context,
    ) {
        let (Some(&holder), Some(&taker)) = (
            before.first().filter(|_| before.len() == 1),
            owners.difference(before).next(),
        ) else {
            return;
        };
        let made = ctx.versions[&ctx.newest].made;
        if !self.calm(t, ctx) || t.saturating_sub(made) < CALM {
            return;
        }
        // A change of some host's gateways counts in the elections only
        // once it has settled everywhere (`UPSTREAM_COUNTED`): until
        // then a holder whose gateway just came back is still last resort
        // by its peers' word, and a node that never lost its own (one
        // started during a router's silence) may take its VIPs, make
        // before break, as from any holder cut off from its gateway.
        if ctx.hosts.iter().any(|h| {
            h.gateway_changed_at
                .is_some_and(|at| t.saturating_sub(at) < UPSTREAM_COUNTED)
        }) {
            return;
        }
        let h = &ctx.hosts[holder];
        if !h.agent_running
            || !h.ready
            || h.stalled_since.is_some()
            || h.leaving.is_some()
            || h.drained
            || h.gateway_lost
            || ctx.on_link & 1 << holder == 0
        {
            return;
        }
        let e = self.oracle(ctx, ctx.newest, ctx.ready);
        if !e.sticky(ip) || e.winner_without(ip, |n| n != h.name) != Some(h.name) {
            return;
        }
        self.fail(
            t,
            format!(
                "{ip} is placed sticky and {} took it from {}, which could still serve it (a move back)",
                ctx.hosts[taker].name, h.name
            ),
        );
    }

    /// A host's agent began to stall: counted when the check watches it.
    pub fn stalled(&mut self, t: Duration, ctx: &Context) {
        if self.calm(t, ctx) {
            self.stats.calm_stalls += 1;
        }
    }

    /// The election over cluster `version` among the hosts `counted`
    /// (ready agents, with their links as they are now).
    fn oracle(&mut self, ctx: &Context, version: u64, counted: Mask) -> &Election {
        let drained = mask(ctx.hosts.iter().map(|h| h.drained));
        let gateway_lost = mask(ctx.hosts.iter().map(|h| h.gateway_lost));
        let key = (version, counted, ctx.on_link, drained, gateway_lost);
        if self.oracles.len() > 1024 {
            self.oracles.clear();
        }
        self.oracles
            .entry(key)
            .or_insert_with(|| election(ctx, version, counted))
    }

    /// Some ready agent could serve `ip`, by what the agents know: the
    /// election over the newest view among them has a winner that knows
    /// as much, or that wins by its own older view too, or the nodes with
    /// the newest view have a candidate among themselves (they take over
    /// from a winner that cannot know). A Service no ready agent has heard
    /// of, or one whose only possible node does not know it may serve it,
    /// has no candidate. Off-link VIPs are nobody's to answer.
    fn has_candidate(&mut self, ip: IpAddr, ctx: &Context) -> bool {
        self.candidate(ip, ctx).is_some()
    }

    /// `ip` had no candidate by the cluster as it was [`NEWS_LEAD`] ago:
    /// whoever may serve it now was named too late for a leaving owner to
    /// hear of it (see [`NEWS_LEAD`]).
    fn successor_news(&mut self, ip: IpAddr, t: Duration, ctx: &Context) -> bool {
        let Some(then) = t.checked_sub(NEWS_LEAD) else {
            return false;
        };
        let Some((&version, _)) = ctx.versions.iter().rev().find(|(_, v)| v.made <= then) else {
            return false;
        };
        if version == ctx.newest {
            return false;
        }
        let excused = self.oracle(ctx, version, ctx.ready).winner(ip).is_none();
        if excused {
            self.stats.late_successors += 1;
        }
        excused
    }

    /// The host that should answer for `ip` now, by [`Checker::has_candidate`]'s
    /// rules.
    pub fn candidate(&mut self, ip: IpAddr, ctx: &Context) -> Option<usize> {
        let ready = ctx.ready;
        let w = self
            .oracle(ctx, ctx.newest, ready)
            .winner(ip)
            .and_then(|winner| ctx.hosts.iter().position(|h| h.name == winner))?;
        let winner = ctx.hosts[w].name;
        if ctx.hosts[w].flaky {
            // Its kernel refuses operations: nothing it must add answers
            // meanwhile, and the others rightly wait (no node takes a VIP
            // from a live winner that only fails to add it). Its next try
            // comes within `ADD_RETRY_MAX` of the kernel steadying, which
            // the no-owner bound counts from then.
            return None;
        }
        let known = ctx.host_versions[w];
        if known == ctx.newest {
            return Some(w);
        }
        if self.oracle(ctx, known, ready).winner(ip) == Some(winner) {
            return Some(w);
        }
        let newest = ready & mask(ctx.host_versions.iter().map(|v| *v == ctx.newest));
        let fallback = self.oracle(ctx, ctx.newest, newest).winner(ip)?;
        // A fallback whose kernel refuses is excused as a winner is.
        ctx.hosts
            .iter()
            .position(|h| h.name == fallback)
            .filter(|f| !ctx.hosts[*f].flaky)
    }

    /// A dead owner's address on `ip` lapsed now and `successor`, which
    /// knew when it would, wins the VIP: it must answer within
    /// [`LAPSE_BOUND`].
    pub fn lapsed(&mut self, ip: IpAddr, successor: usize, t: Duration) {
        let v = self.vips.entry(ip).or_default();
        if v.owners.is_empty() {
            v.lapsed = Some((t, successor));
        }
    }

    /// Who answers for `ip` changed. Returns a line for the trace.
    pub fn owners(
        &mut self,
        ip: IpAddr,
        owners: BTreeSet<usize>,
        t: Duration,
        ctx: &Context,
    ) -> Option<String> {
        let v = self.vips.entry(ip).or_default();
        if v.owners == owners {
            return None;
        }
        let before = std::mem::replace(&mut v.owners, owners.clone());
        let names: Vec<&str> = owners.iter().map(|&h| ctx.hosts[h].name).collect();
        let line = format!("{ip} answered by {names:?}");
        self.spurious_takeover(ip, &before, &owners, t, ctx);
        self.sticky_taken(ip, &before, &owners, t, ctx);
        if self.quiet(t, ctx) {
            if !owners.is_empty() && before.iter().any(|h| !owners.contains(h)) {
                self.stats.quiet_moves += 1;
            }
            if !before.is_empty()
                && owners.is_empty()
                && self.has_candidate(ip, ctx)
                && !self.successor_news(ip, t, ctx)
            {
                self.fail(
                    t,
                    format!("{ip} lost its last owner in a planned move (nothing unplanned for a while): make before break broken"),
                );
            }
        }
        self.judge(ip, t, ctx);
        Some(line)
    }

    /// Every VIP's episodes against their bounds; runs every 50 ms. A VIP
    /// with one owner and nothing pending (most of them, most of the time)
    /// has nothing to judge and is passed over: [`Checker::judge`] would
    /// change nothing for it.
    pub fn sweep(&mut self, t: Duration, ctx: &Context) {
        if self.swept_version != Some(ctx.newest) {
            self.swept_version = Some(ctx.newest);
            for s in &ctx.versions[&ctx.newest].cluster.services {
                for ip in &s.addresses {
                    self.vips.entry(*ip).or_default();
                }
            }
        }
        let following = self.follow.is_some();
        let mut ips = std::mem::take(&mut self.scratch);
        ips.clear();
        ips.extend(
            self.vips
                .iter()
                .filter(|(_, v)| following || !v.settled())
                .map(|(ip, _)| *ip),
        );
        for ip in &ips {
            self.judge(*ip, t, ctx);
        }
        self.scratch = ips;
        self.judge_readiness(t, ctx);
    }

    /// An agent that could have become ready [`READY_BOUND`] ago and is
    /// not: the no-owner property counts only ready agents as candidates,
    /// so a winner stuck short of ready would leave its VIPs dark unseen.
    fn judge_readiness(&mut self, t: Duration, ctx: &Context) {
        for h in &ctx.hosts {
            if let Some(due) = h.ready_due
                && !h.ready
                && t > due
            {
                self.fail(
                    t,
                    format!(
                        "{} is not ready {:?} after it could have been: its agent runs, the API server answers it and its kernel is steady (bound {READY_BOUND:?})",
                        h.name,
                        t - due + READY_BOUND
                    ),
                );
            }
        }
    }

    /// The settled end: no change during the steady window, every agent
    /// ready, every VIP exactly where the election says.
    pub fn finish(&mut self, t: Duration, ctx: &Context, held: &[BTreeSet<(u32, IpAddr)>]) {
        self.sweep(t, ctx);
        if self.follow.take().is_some()
            && let Some(v) = &mut self.violation
        {
            v.what.push_str("; still so at the end of the run");
            return;
        }
        if let Some(at) = self.steady
            && self.stats.kernel_changes != at
        {
            self.fail(
                t,
                format!(
                    "{} address changes in the last {STEADY_WINDOW:?}, after every fault had healed: something flaps",
                    self.stats.kernel_changes - at
                ),
            );
        }
        for h in &ctx.hosts {
            if !h.ready {
                self.fail(
                    t,
                    format!("{} is not ready after every fault healed", h.name),
                );
            }
        }
        let mut expected: Vec<BTreeSet<(u32, IpAddr)>> = vec![BTreeSet::new(); ctx.hosts.len()];
        let all = mask(ctx.hosts.iter().map(|_| true));
        // A sticky VIP is expected where it is held, if its holder may
        // serve it: the election with the holders the kernels show.
        let mut e = election(ctx, ctx.latest, all);
        e.set_holders(held.iter().enumerate().flat_map(|(i, h)| {
            h.iter()
                .filter(|(ifindex, _)| *ifindex == ETH0)
                .map(move |(_, ip)| (*ip, ctx.hosts[i].name))
        }));
        let reports = e.report_all();
        let index: BTreeMap<&str, usize> = ctx
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (h.name, i))
            .collect();
        for r in &reports {
            if let Some(w) = r.winner.as_deref().and_then(|w| index.get(w)) {
                expected[*w].insert((ETH0, r.ip));
            }
            for n in &r.virtual_nodes {
                if let Some(i) = index.get(n.as_str()) {
                    expected[*i].insert((KUBE_LB0, r.ip));
                }
            }
        }
        for (i, h) in ctx.hosts.iter().enumerate() {
            if held[i] != expected[i] {
                let extra: Vec<_> = held[i].difference(&expected[i]).collect();
                let missing: Vec<_> = expected[i].difference(&held[i]).collect();
                self.fail(
                    t,
                    format!(
                        "{} settled holding the wrong addresses: extra {extra:?}, missing {missing:?} (2 = eth0, 3 = kube-lb0)",
                        h.name
                    ),
                );
            }
        }
    }
}

/// The election over cluster `version` among the hosts `counted`, as the
/// checker sees them (its own rule for their links).
fn election(ctx: &Context, version: u64, counted: Mask) -> Election {
    let members: Vec<Member> = ctx
        .hosts
        .iter()
        .enumerate()
        .filter(|(i, _)| counted & 1 << i != 0)
        .map(|(i, h)| Member {
            node: NodeName::from(h.name),
            leaving: false,
            drained: h.drained,
            virtual_mode: true,
            on_link: lan_on_link(ctx.on_link & 1 << i != 0, h.gateway_lost).into(),
        })
        .collect();
    Election::new(&ctx.versions[&version].cluster, members)
}

/// What a simulated host publishes as on-link, by the checker's own
/// small rule rather than the core's `Links::on_link`, so that a defect
/// there does not move the expected answer with it: a host whose LAN port
/// has carrier reaches the LAN's two subnets from `eth0`, which announces
/// both; one without carrier reaches none (its virtual interface is no
/// subnet). Where its agent found its gateways lost, both are marked so.
pub fn lan_on_link(carrier: bool, gateway_lost: bool) -> Vec<OnLink> {
    if !carrier {
        return Vec::new();
    }
    let mut out: Vec<OnLink> = [SUBNET_V4, SUBNET_V6]
        .iter()
        .map(|p| OnLink {
            prefix: p.parse().expect("a valid subnet"),
            interface: "eth0".into(),
            announce: true,
            upstream_lost: gateway_lost,
        })
        .collect();
    out.sort();
    out
}

/// The hosts for which `bits` says true, as a [`Mask`].
pub fn mask(bits: impl IntoIterator<Item = bool>) -> Mask {
    bits.into_iter()
        .enumerate()
        .fold(0, |m, (i, b)| if b { m | 1 << i } else { m })
}
