//! A drain as an operator follows it: which VIPs are still on the node,
//! where each one that left answers now, which stay and why, and when it
//! is over. `kubectl hostlb drain` fills a [`Snapshot`] from the API (the
//! announcing annotations, the records, the election over them) and
//! `lbnodeagent drain` from the local agent's `/status`; both show it
//! through one [`Progress`], so the two read and end alike.
//!
//! Nothing here moves a VIP: the drain itself is the node's NodeAgent
//! `spec.drain`, which its agent gossips and every agent elects by (a
//! drained node is a candidate of last resort).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Why `spec.drain` could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(
        "no NodeAgent record {0}: no agent ever ran there, or deploy/agent/kubeconfig.sh was not run for it"
    )]
    NoRecord(String),
    #[error("cannot write NodeAgent {node}: {source}")]
    Write { node: String, source: kube::Error },
}

/// Writes `node`'s `spec.drain` (`false` removes it), for both commands:
/// from the host with the agent's own credential, which may write only
/// this node's record, and from kubectl with the operator's.
pub async fn write(client: &kube::Client, node: &str, drain: bool) -> Result<(), WriteError> {
    let value = if drain {
        serde_json::json!(true)
    } else {
        serde_json::Value::Null
    };
    let patch = serde_json::json!({"spec": {"drain": value}});
    match kube::Api::<hostlb_api::NodeAgent>::all(client.clone())
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(WriteError::NoRecord(node.into())),
        Err(source) => Err(WriteError::Write {
            node: node.into(),
            source,
        }),
    }
}

/// The node's VIPs at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// VIPs the node still answers or routes for, with their Services.
    pub held: BTreeMap<IpAddr, String>,
    /// Of those, the ones that stay because no node that is not drained
    /// can serve them, with why.
    pub staying: BTreeMap<IpAddr, String>,
    /// Where VIPs that are no longer on the node answer now (`node-b`,
    /// `routed via node-a,node-b`), as far as known.
    pub now_at: BTreeMap<IpAddr, String>,
    /// `Ok` once the node's agent acts on the drain; else what it waits
    /// for (the agent to hear of it, an older agent in the cluster).
    pub in_force: Result<(), String>,
}

/// How a drain ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing left that can move.
    Done,
    /// The time given ran out with VIPs left that could move.
    TimedOut,
}

/// How long the VIPs that stay must have stayed, the same ones, before a
/// drain that leaves them on the node is over. Whether a VIP can move is
/// read off one moment's view of the cluster: a busy host's detector may
/// take its peers for gone for a moment (they are back within a second or
/// two, as they rejoin), and a drain that ended on that view would say
/// "stays" of VIPs that were about to move, and the operator would stop
/// the host with them on it. Waiting costs only this much at the end of a
/// drain that leaves something behind; one that moves all ends at once.
pub const STAYING_SETTLE: Duration = Duration::from_secs(3);

/// A drain followed from snapshot to snapshot.
pub struct Progress {
    node: String,
    started: Instant,
    /// The VIPs on the node at the first snapshot.
    first: Option<BTreeSet<IpAddr>>,
    /// VIPs whose move was already printed.
    told: BTreeSet<IpAddr>,
    /// The VIPs that stay, and since when they have been those.
    staying: Option<(BTreeSet<IpAddr>, Instant)>,
}

impl Progress {
    pub fn new(node: &str, started: Instant) -> Progress {
        Progress {
            node: node.to_string(),
            started,
            first: None,
            told: BTreeSet::new(),
            staying: None,
        }
    }

    /// Takes a snapshot, read at `now`: a line for each VIP that moved
    /// since the last one, and whether the drain is over (nothing left, or
    /// nothing but VIPs that have stayed for [`STAYING_SETTLE`], with the
    /// drain in force).
    pub fn observe(&mut self, s: &Snapshot, now: Instant) -> (Vec<String>, bool) {
        let first = self
            .first
            .get_or_insert_with(|| s.held.keys().copied().collect());
        let mut lines = Vec::new();
        for ip in first.iter() {
            if s.held.contains_key(ip) || self.told.contains(ip) {
                continue;
            }
            let Some(at) = s.now_at.get(ip) else {
                // Gone from here, not yet seen anywhere: said once it is.
                continue;
            };
            self.told.insert(*ip);
            lines.push(format!("moved {ip} to {at}"));
        }
        let (staying, movable): (BTreeSet<IpAddr>, BTreeSet<IpAddr>) =
            s.held.keys().partition(|ip| s.staying.contains_key(ip));
        let since = match &self.staying {
            Some((same, since)) if *same == staying => *since,
            _ => {
                self.staying = Some((staying, now));
                now
            }
        };
        let settled = now.saturating_duration_since(since) >= STAYING_SETTLE;
        let done = movable.is_empty() && (s.held.is_empty() || (s.in_force.is_ok() && settled));
        (lines, done)
    }

    /// One line for a terminal's status line: how far it is.
    pub fn counter(&self, s: &Snapshot, now: Instant) -> String {
        let first = self.first.as_ref().map_or(0, BTreeSet::len);
        let left = s.held.len()
            - s.held
                .keys()
                .filter(|ip| s.staying.contains_key(ip))
                .count();
        let moved = first.saturating_sub(s.held.len());
        let width = 30;
        let filled = (width * moved).checked_div(first).unwrap_or(width);
        format!(
            "draining {}: [{}{}] {moved}/{first} moved, {left} to go, {:.1} s",
            self.node,
            "#".repeat(filled),
            ".".repeat(width - filled),
            now.saturating_duration_since(self.started).as_secs_f64()
        )
    }

    /// The closing words: what moved in how long, what stays and why, and
    /// what could still move when time ran out.
    pub fn summary(&self, s: &Snapshot, outcome: &Outcome, now: Instant) -> String {
        let took = now.saturating_duration_since(self.started);
        let first = self.first.as_ref().map_or(0, BTreeSet::len);
        let moved = first.saturating_sub(s.held.len());
        let mut out = match outcome {
            Outcome::Done => format!(
                "{} drained: {moved} of {first} VIPs moved in {}\n",
                self.node,
                seconds(took)
            ),
            Outcome::TimedOut => format!(
                "{} not drained after {}: {moved} of {first} VIPs moved\n",
                self.node,
                seconds(took)
            ),
        };
        if let Err(why) = &s.in_force {
            out.push_str(&format!("the drain is not in force: {why}\n"));
        }
        for (ip, why) in &s.staying {
            if let Some(services) = s.held.get(ip) {
                out.push_str(&format!("stays: {ip} ({services}): {why}\n"));
            }
        }
        if *outcome == Outcome::TimedOut {
            for (ip, services) in &s.held {
                if !s.staying.contains_key(ip) {
                    out.push_str(&format!("not moved yet: {ip} ({services})\n"));
                }
            }
        }
        out
    }
}

/// Follows a drain with `read` every `every` until nothing that can
/// move is left, or `timeout`: moves to standard output, a progress bar
/// to a terminal's standard error, the summary last. Both commands' loop.
pub async fn follow<F, Fut, E>(
    node: &str,
    timeout: Duration,
    every: Duration,
    mut read: F,
) -> Result<Outcome, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Snapshot, E>>,
{
    use std::io::IsTerminal as _;
    let started = Instant::now();
    let mut progress = Progress::new(node, started);
    let tty = std::io::stderr().is_terminal();
    loop {
        let s = read().await?;
        let (lines, done) = progress.observe(&s, Instant::now());
        if tty {
            eprint!("\r\x1b[K");
        }
        for line in lines {
            println!("{line}");
        }
        let now = Instant::now();
        let outcome = if done {
            Some(Outcome::Done)
        } else if now.duration_since(started) >= timeout {
            Some(Outcome::TimedOut)
        } else {
            None
        };
        if let Some(outcome) = outcome {
            print!("{}", progress.summary(&s, &outcome, now));
            return Ok(outcome);
        }
        if tty {
            eprint!("{}", progress.counter(&s, now));
        }
        tokio::time::sleep(every).await;
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Why no node that is not drained can take a VIP, from its election's
/// exclusions: the reasons, most common first, with up to three nodes
/// each.
pub fn why_it_stays(report: &crate::election::VipReport, node: &str) -> String {
    let others_drained: Vec<&str> = report
        .candidates
        .iter()
        .filter(|c| c.node != node && c.drained)
        .map(|c| c.node.as_str())
        .collect();
    let mut by_reason: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for x in &report.excluded {
        if x.node != node {
            by_reason
                .entry(x.reason.explain())
                .or_default()
                .push(&x.node);
        }
    }
    let mut reasons: Vec<(&str, Vec<&str>)> = by_reason.into_iter().collect();
    reasons.sort_by_key(|(_, nodes)| std::cmp::Reverse(nodes.len()));
    let mut parts: Vec<String> = reasons
        .iter()
        .map(|(reason, nodes)| {
            let more = nodes.len().saturating_sub(3);
            let mut names = nodes[..nodes.len().min(3)].join(", ");
            if more > 0 {
                names.push_str(&format!(" and {more} more"));
            }
            format!("{names}: {reason}")
        })
        .collect();
    if !others_drained.is_empty() {
        parts.insert(0, format!("{}: drained too", others_drained.join(", ")));
    }
    if parts.is_empty() {
        "no other node is a candidate".into()
    } else {
        format!("no other node can serve it ({})", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn snapshot(held: &[&str], staying: &[&str], now_at: &[(&str, &str)]) -> Snapshot {
        Snapshot {
            held: held.iter().map(|h| (ip(h), format!("ns/{h}"))).collect(),
            staying: staying
                .iter()
                .map(|h| (ip(h), "no other node can serve it".to_string()))
                .collect(),
            now_at: now_at.iter().map(|(a, b)| (ip(a), b.to_string())).collect(),
            in_force: Ok(()),
        }
    }

    #[test]
    fn each_move_is_told_once_and_the_drain_ends_when_only_what_stays_is_left() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut p = Progress::new("node-c", t0);
        let s = snapshot(&["10.0.0.1", "10.0.0.2", "10.0.0.3"], &["10.0.0.3"], &[]);
        assert_eq!(p.observe(&s, at(0)), (vec![], false));
        assert!(p.counter(&s, t0).contains("0/3 moved, 2 to go"));

        // 10.0.0.2 left, but nobody shows it yet: not told, not over.
        let s = snapshot(&["10.0.0.1", "10.0.0.3"], &["10.0.0.3"], &[]);
        assert_eq!(p.observe(&s, at(200)), (vec![], false));
        let s = snapshot(
            &["10.0.0.1", "10.0.0.3"],
            &["10.0.0.3"],
            &[("10.0.0.2", "node-a")],
        );
        assert_eq!(
            p.observe(&s, at(400)),
            (vec!["moved 10.0.0.2 to node-a".into()], false)
        );
        assert_eq!(p.observe(&s, at(600)), (vec![], false), "told once");

        let s = snapshot(
            &["10.0.0.3"],
            &["10.0.0.3"],
            &[
                ("10.0.0.2", "node-a"),
                ("10.0.0.1", "routed via node-a,node-b"),
            ],
        );
        let (lines, done) = p.observe(&s, at(800));
        assert_eq!(lines, vec!["moved 10.0.0.1 to routed via node-a,node-b"]);
        assert!(!done, "what is left has stayed for less than the settle");
        assert!(!p.observe(&s, at(2_999)).1);
        assert!(p.observe(&s, at(3_000)).1, "what is left stays");
        let summary = p.summary(&s, &Outcome::Done, at(3_000));
        assert!(summary.starts_with("node-c drained: 2 of 3 VIPs moved in 3.00 s"));
        assert!(summary.contains("stays: 10.0.0.3 (ns/10.0.0.3): no other node can serve it"));
    }

    /// A moment's view in which every peer looks gone (a busy host's
    /// detector) makes every VIP look as if it stays; the drain goes on,
    /// and the VIPs move once the peers are back.
    #[test]
    fn a_drain_does_not_end_on_a_moment_in_which_everything_stays() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut p = Progress::new("node-c", t0);
        let all = ["10.0.0.1", "10.0.0.2", "10.0.0.3"];
        let s = snapshot(&all, &all, &[]);
        assert!(!p.observe(&s, at(0)).1, "stays, for now");
        assert!(!p.observe(&s, at(1_000)).1);
        // The peers are back: two can move, one still stays.
        let s = snapshot(&all, &["10.0.0.3"], &[]);
        assert!(!p.observe(&s, at(1_200)).1);
        let s = snapshot(
            &["10.0.0.3"],
            &["10.0.0.3"],
            &[("10.0.0.1", "node-a"), ("10.0.0.2", "node-b")],
        );
        assert!(
            !p.observe(&s, at(2_000)).1,
            "what stays has not stayed long enough"
        );
        let (_, done) = p.observe(&s, at(4_200));
        assert!(done, "10.0.0.3 has stayed since 1.2 s");
        let summary = p.summary(&s, &Outcome::Done, at(4_200));
        assert!(
            summary.starts_with("node-c drained: 2 of 3 VIPs moved"),
            "{summary}"
        );
    }

    #[test]
    fn a_drain_not_in_force_is_not_over_while_anything_is_left() {
        let t0 = Instant::now();
        let mut p = Progress::new("node-c", t0);
        let mut s = snapshot(&["10.0.0.3"], &["10.0.0.3"], &[]);
        s.in_force = Err("node-c's agent has not heard of it yet".into());
        assert!(!p.observe(&s, t0).1);
        assert!(!p.observe(&s, t0 + STAYING_SETTLE).1);
        let mut empty = snapshot(&[], &[], &[]);
        empty.in_force = Err("whatever".into());
        assert!(p.observe(&empty, t0).1, "nothing left: over either way");
    }

    /// What a drain says of a VIP that stays: each other node with the
    /// rule that keeps it out (`NotEligible` is what an advertisement's
    /// `nodeSelectors` give a node they do not select), drained peers
    /// first.
    #[test]
    fn a_vip_that_stays_says_which_rule_keeps_each_other_node_out() {
        use crate::election::{Candidate, Excluded, Reason, VipReport};
        let out = |node: &str, reason| Excluded {
            node: node.into(),
            reason,
        };
        let report = VipReport {
            ip: ip("10.0.0.3"),
            services: vec!["shop/web".into()],
            pool: Some("p".into()),
            winner: Some("node-c".into()),
            winner_on: None,
            candidates: vec![
                Candidate {
                    node: "node-c".into(),
                    drained: true,
                    upstream_lost: false,
                    held: false,
                    score: 0,
                    hash_rank: 1,
                    hash: [0; 32],
                },
                Candidate {
                    node: "node-d".into(),
                    drained: true,
                    upstream_lost: false,
                    held: false,
                    score: 0,
                    hash_rank: 2,
                    hash: [1; 32],
                },
            ],
            virtual_nodes: vec![],
            excluded: vec![
                out("node-a", Reason::NotEligible),
                out("node-b", Reason::NotEligible),
                out("node-e", Reason::NoReadyEndpoint),
            ],
            note: None,
        };
        assert_eq!(
            why_it_stays(&report, "node-c"),
            "no other node can serve it (node-d: drained too; \
             node-a, node-b: no advertisement for this address selects the node; \
             node-e: no usable endpoint of the Service on the node)"
        );
        let alone = VipReport {
            candidates: report.candidates[..1].to_vec(),
            excluded: vec![],
            ..report
        };
        assert_eq!(
            why_it_stays(&alone, "node-c"),
            "no other node is a candidate"
        );
    }

    #[test]
    fn a_timeout_names_what_could_still_move() {
        let t0 = Instant::now();
        let mut p = Progress::new("node-c", t0);
        let s = snapshot(&["10.0.0.1", "10.0.0.3"], &["10.0.0.3"], &[]);
        p.observe(&s, t0);
        let summary = p.summary(&s, &Outcome::TimedOut, t0 + Duration::from_secs(60));
        assert!(summary.starts_with("node-c not drained after 60.00 s: 0 of 2 VIPs moved"));
        assert!(summary.contains("not moved yet: 10.0.0.1 (ns/10.0.0.1)"));
        assert!(!summary.contains("not moved yet: 10.0.0.3"));
    }
}
