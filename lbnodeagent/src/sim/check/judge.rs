//! The judgement of one VIP at one moment: how many hosts answer for it,
//! and, when that is not one, whether a bound allows it yet.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use super::*;

impl Checker {
    /// By when two owners must be down to one, for an episode that began
    /// at `since`, and what allows it.
    pub(super) fn allowance(
        &self,
        owners: &BTreeSet<usize>,
        ctx: &Context,
        since: Duration,
    ) -> (Duration, &'static str) {
        if let Some(cleanup) = owners
            .iter()
            .filter_map(|&h| ctx.hosts[h].cleanup_since)
            .max()
        {
            return (since.max(cleanup) + CLEANUP_BOUND, "cleanup hands over");
        }
        let dead = owners.iter().filter_map(|&h| ctx.hosts[h].stopped_at).max();
        if let Some(stopped) = dead {
            // Its address lasts until its lifetime runs out after its agent
            // stopped renewing it; `cleanup` waits at most a hand-over for
            // its peers.
            return (
                stopped + self.lifetime.max(HANDOVER_MAX) + Duration::from_secs(1),
                "agent not running",
            );
        }
        let (bound, kind, from) = self.bound(owners, ctx);
        // A pair that began while one agent was frozen is under the live
        // rules from its thaw: a frozen agent can neither let go nor say
        // it holds the VIP, and its peers' word of the views or the
        // hand-over reaches it only then.
        let thawed = owners
            .iter()
            .filter_map(|&h| ctx.hosts[h].thawed_at)
            .filter(|&t| t > since)
            .max();
        let from = from.or(thawed);
        (since.max(from.unwrap_or(since)).saturating_add(bound), kind)
    }

    /// The bound for two owners now, what allows it, and when its clock
    /// started if not when the two began to answer.
    pub(super) fn bound(
        &self,
        owners: &BTreeSet<usize>,
        ctx: &Context,
    ) -> (Duration, &'static str, Option<Duration>) {
        let pairs = owners
            .iter()
            .flat_map(|&a| owners.iter().map(move |&b| (a, b)))
            .filter(|(a, b)| a < b);
        if pairs
            .clone()
            .any(|(a, b)| !ctx.reach[a][b] && ctx.host_versions[a] != ctx.host_versions[b])
        {
            // Each side ranks itself first by its own view, and neither can
            // tell the other's: with no gossip and no API server to agree
            // on the objects, nothing settles it before one of them heals.
            return (Duration::MAX, "partition, views differ", None);
        }
        if pairs.clone().any(|(a, b)| !ctx.reach[a][b]) {
            return (PARTITION_BOUND, "gossip partition", None);
        }
        // A leaving node answers until its successors hold its VIPs, at
        // most `LEAVE_MAX` from its SIGTERM, whatever bound the pair was
        // under before: the earliest leave of the two ends it.
        if let Some(left) = owners.iter().filter_map(|&h| ctx.hosts[h].leaving).min() {
            return (LEAVING_BOUND, "leaving node", Some(left));
        }
        if pairs
            .clone()
            .any(|(a, b)| ctx.host_versions[a] != ctx.host_versions[b])
        {
            // Each ranks itself first by its own view; the one with the older
            // view lets go once it trusts the other's word, or after a
            // planned move's time.
            return (HANDOVER_BOUND, "views differ", None);
        }
        if owners.iter().any(|&h| !ctx.hosts[h].ready) {
            return (STARTING_BOUND, "starting node", None);
        }
        (HANDOVER_BOUND, "make before break", None)
    }

    pub(super) fn judge(&mut self, ip: IpAddr, t: Duration, ctx: &Context) {
        let v = self.vips.entry(ip).or_default();
        if v.owners.len() <= 1 && v.pairs.is_empty() {
            // Most of the time: one owner or none, nothing to pair.
            let unowned = v.owners.is_empty();
            return self.judge_none(ip, unowned, t, ctx);
        }
        let owners = v.owners.clone();
        // Two owners, pair by pair.
        let current: BTreeSet<(usize, usize)> = owners
            .iter()
            .flat_map(|&a| owners.iter().map(move |&b| (a, b)))
            .filter(|(a, b)| a < b)
            .collect();
        let ended: Vec<((usize, usize), Episode)> = {
            let v = self.vips.entry(ip).or_default();
            let gone: Vec<(usize, usize)> = v
                .pairs
                .keys()
                .filter(|p| !current.contains(p))
                .copied()
                .collect();
            gone.into_iter()
                .filter_map(|p| v.pairs.remove(&p).map(|e| (p, e)))
                .collect()
        };
        for ((a, b), e) in ended {
            // Remembered first: the follow of a broken bound ends here
            // only if the pair does not come back (see `REJOIN_GAP`).
            if self.rejoin {
                let v = self.vips.entry(ip).or_default();
                v.ended.insert((a, b), (t, ctx.newest, e.clone()));
            }
            self.ended(ip, Some((a, b)), t);
            self.record_two(e.kind, t - e.since);
            if let Some(agreed) = e.agreed {
                self.stats.agreed_pairs += 1;
                self.stats.agreed_longest = self.stats.agreed_longest.max(t - agreed);
            }
            if t > e.deadline {
                self.fail(
                    t,
                    format!(
                        "{ip} answered by {} and {} for {:?}, {:?} longer than allowed ({})",
                        ctx.hosts[a].name,
                        ctx.hosts[b].name,
                        t - e.since,
                        t - e.deadline,
                        e.kind
                    ),
                );
            }
        }
        for (a, b) in current {
            let pair: BTreeSet<usize> = [a, b].into();
            let (last_fault, rejoin) = (self.last_fault, self.rejoin);
            let v = self.vips.entry(ip).or_default();
            // A pair that answers again soon after it ended, with nothing
            // carried out and no change of the cluster since, goes on with
            // its episode (see `REJOIN_GAP`); any other begins one now.
            // An agent finding its gateways lost or back meanwhile begins
            // one too: it finds them seconds after the router's silence
            // began, a fault's effect (seed 5001674549: a pair ended 50 ms
            // after a host's gateway went silent, and the host found it
            // lost 0.5 s later and handed its VIPs over). Such an episode
            // keeps the deadline of the one before if that is later, so
            // that it is never judged more strictly than the two as one.
            if rejoin
                && !v.pairs.contains_key(&(a, b))
                && let Some((at, version, e)) = v.ended.remove(&(a, b))
                && t - at < REJOIN_GAP
                && version == ctx.newest
                && last_fault.is_none_or(|f| f <= at)
            {
                let gateway_news = ctx
                    .hosts
                    .iter()
                    .any(|h| h.gateway_changed_at.is_some_and(|g| g > at));
                let since = if gateway_news { t } else { e.since };
                v.pairs.insert(
                    (a, b),
                    Episode {
                        since,
                        agreed: None,
                        ..e
                    },
                );
            }
            let since = v.pairs.get(&(a, b)).map_or(t, |e| e.since);
            let (deadline, kind) = self.allowance(&pair, ctx, since);
            let v = self.vips.entry(ip).or_default();
            let e = v.pairs.entry((a, b)).or_insert(Episode {
                since,
                deadline,
                kind,
                agreed: None,
            });
            if deadline > e.deadline {
                e.deadline = deadline;
                e.kind = kind;
            }
            let agree = |h: usize| {
                let s = &ctx.hosts[h];
                s.agent_running
                    && s.ready
                    && s.leaving.is_none()
                    && !s.flaky
                    && s.stalled_since.is_none()
            };
            e.agreed = (agree(a)
                && agree(b)
                && ctx.reach[a][b]
                && ctx.host_versions[a] == ctx.host_versions[b])
                .then(|| e.agreed.unwrap_or(t));
            let (since, deadline, kind, agreed) = (e.since, e.deadline, e.kind, e.agreed);
            let follow = |bound| Follow {
                ip,
                pair: Some((a, b)),
                since,
                bound,
            };
            if let Some(agreed) = agreed
                && t - agreed > AGREED_BOUND
            {
                self.fail_open(
                    t,
                    format!(
                        "{ip} answered by {} and {} for {:?} after both were live, ready, connected and of one view of the cluster (bound {AGREED_BOUND:?}): they do not settle",
                        ctx.hosts[a].name,
                        ctx.hosts[b].name,
                        t - agreed
                    ),
                    follow(agreed + AGREED_BOUND),
                );
            }
            self.record_two(kind, t - since);
            if t > deadline {
                self.fail_open(
                    t,
                    format!(
                        "{ip} answered by {} and {} for {:?}, longer than allowed ({kind}, {:?})",
                        ctx.hosts[a].name,
                        ctx.hosts[b].name,
                        t - since,
                        deadline - since
                    ),
                    follow(deadline),
                );
            }
        }
        self.judge_none(ip, owners.is_empty(), t, ctx);
    }

    /// No owner while a candidate lives.
    pub(super) fn judge_none(&mut self, ip: IpAddr, unowned: bool, t: Duration, ctx: &Context) {
        let orphan = unowned && self.has_candidate(ip, ctx);
        let v = self.vips.entry(ip).or_default();
        let since_unplanned = self.last_unplanned;
        let lapsed = v.lapsed;
        // The one to answer is another now (a change of the objects, a
        // node back): its own bounds apply.
        let moved = lapsed.is_some_and(|(_, h)| unowned && self.candidate(ip, ctx) != Some(h));
        if !unowned {
            self.ended(ip, None, t);
        }
        let v = self.vips.entry(ip).or_default();
        match lapsed {
            // Another fault came since, or another node is to answer, with
            // bounds of their own.
            Some((at, _)) if moved || since_unplanned.is_some_and(|u| u > at) => v.lapsed = None,
            // Past its bound: answered late (between two sweeps), or not
            // yet, and then followed to see how long it lasts.
            Some((at, h)) if t - at > LAPSE_BOUND => {
                v.lapsed = None;
                let (gap, successor) = (t - at, ctx.hosts[h].name);
                if unowned {
                    self.fail_open(
                        t,
                        format!(
                            "{ip} has had no owner for {gap:?} since its dead owner's address lapsed, and {successor}, which knew when it would, does not answer (bound {LAPSE_BOUND:?})"
                        ),
                        Follow {
                            ip,
                            pair: None,
                            since: at,
                            bound: at + LAPSE_BOUND,
                        },
                    );
                } else {
                    self.fail(
                        t,
                        format!(
                            "{ip} had no owner for {gap:?} after its dead owner's address lapsed, though {successor}, which knew when it would, was to answer within {LAPSE_BOUND:?}"
                        ),
                    );
                }
                return;
            }
            Some((at, _)) if !unowned => {
                v.lapsed = None;
                self.stats.lapses_followed += 1;
                self.stats.lapse_longest = self.stats.lapse_longest.max(t - at);
            }
            _ => {}
        }
        let v = self.vips.entry(ip).or_default();
        match (orphan, v.none) {
            (true, None) => v.none = Some(t),
            (true, Some(since)) => {
                let gap = t - since;
                self.stats.no_owner = self.stats.no_owner.max(gap);
                if gap > NO_OWNER_BOUND {
                    self.fail_open(
                        t,
                        format!(
                            "{ip} has had no owner for {gap:?} while the election has a winner among ready agents (bound {NO_OWNER_BOUND:?})"
                        ),
                        Follow {
                            ip,
                            pair: None,
                            since,
                            bound: since + NO_OWNER_BOUND,
                        },
                    );
                }
            }
            (false, Some(since)) => {
                self.stats.no_owner = self.stats.no_owner.max(t - since);
                v.none = None;
            }
            (false, None) => {}
        }
    }

    pub(super) fn record_two(&mut self, kind: &'static str, d: Duration) {
        let max = self.stats.two_owners.entry(kind).or_default();
        *max = (*max).max(d);
    }
}
