//! `kubectl hostlb rebalance svc/NAME | --all`: sticky addresses moved to
//! the nodes the election ranks first. Each Service gets the
//! `hostlb.io/rebalance` annotation, which places its addresses as
//! `Preferred` while it is there: the agents move them make before break,
//! as for any change of preference. The moves are followed from the API
//! alone (the announcing annotations say where each address answers, the
//! election over the agents' records where it goes), and the annotation is
//! taken away at the end, whatever the outcome: the addresses are sticky
//! again where they then are.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hostlb_api::Family;
use hostlb_api::annotations::REBALANCE;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
pub use lbnodeagent::drain::Outcome;

use crate::Fleet;
use crate::explain::{ExplainError, handled};
use crate::status::{addresses, announcing};

/// One address of a Service being rebalanced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spot {
    pub ip: IpAddr,
    /// `namespace/name`.
    pub service: String,
    /// The node announcing it now, by the Service's annotation.
    pub at: Option<String>,
    /// The node the election ranks first for it; `None` when none can
    /// serve it.
    pub to: Option<String>,
}

impl Spot {
    /// It still has to move.
    pub fn pending(&self) -> bool {
        self.to.is_some() && self.at != self.to
    }
}

/// The Services to rebalance, as `(namespace, name)`: the one named, or
/// every Service hostlb handles with an address placed sticky.
pub fn targets(
    fleet: &Fleet,
    one: Option<(&str, &str)>,
) -> Result<Vec<(String, String)>, ExplainError> {
    let key = |s: &Service| {
        (
            s.metadata.namespace.clone().unwrap_or_default(),
            s.metadata.name.clone().unwrap_or_default(),
        )
    };
    if let Some((namespace, name)) = one {
        return Ok(vec![key(handled(fleet, namespace, name)?)]);
    }
    let election = fleet.election();
    Ok(fleet
        .load_balancers()
        .filter(|s| addresses(s).iter().any(|ip| election.sticky(*ip)))
        .map(key)
        .collect())
}

/// Where the addresses of `targets` are, and where the election puts them
/// now.
pub fn snapshot(fleet: &Fleet, targets: &[(String, String)]) -> Vec<Spot> {
    let election = fleet.election();
    let mut out = Vec::new();
    for svc in fleet.load_balancers() {
        let (ns, name) = (
            svc.metadata.namespace.as_deref().unwrap_or_default(),
            svc.metadata.name.as_deref().unwrap_or_default(),
        );
        if !targets.iter().any(|(n, s)| n == ns && s == name) {
            continue;
        }
        for ip in addresses(svc) {
            out.push(Spot {
                ip,
                service: format!("{ns}/{name}"),
                at: announcing(svc, Family::of(ip))
                    .map(|(n, _)| n)
                    .filter(|n| !n.is_empty()),
                to: election.winner(ip).map(str::to_string),
            });
        }
    }
    out.sort_by_key(|s| s.ip);
    out
}

/// Follows the moves: a line when an address is found to move and when it
/// arrives, and the summary last.
#[derive(Debug, Default)]
pub struct Progress {
    /// Addresses seen pending, with where they were and since when.
    moving: BTreeMap<IpAddr, (Option<String>, Duration)>,
    moved: usize,
}

impl Progress {
    /// The lines for a new snapshot taken `elapsed` after the start, and
    /// whether nothing is left to move.
    pub fn observe(&mut self, spots: &[Spot], elapsed: Duration) -> (Vec<String>, bool) {
        let mut lines = Vec::new();
        for s in spots {
            match (s.pending(), self.moving.get(&s.ip)) {
                (true, None) => {
                    lines.push(format!(
                        "{} ({}): {} -> {}",
                        s.ip,
                        s.service,
                        s.at.as_deref().unwrap_or("nobody"),
                        s.to.as_deref().unwrap_or("nobody")
                    ));
                    self.moving.insert(s.ip, (s.at.clone(), elapsed));
                }
                (false, Some((from, since))) => {
                    if s.at != *from {
                        lines.push(format!(
                            "{} ({}): now on {} ({:.2} s)",
                            s.ip,
                            s.service,
                            s.at.as_deref().unwrap_or("nobody"),
                            elapsed.saturating_sub(*since).as_secs_f64()
                        ));
                        self.moved += 1;
                    }
                    self.moving.remove(&s.ip);
                }
                _ => {}
            }
        }
        (lines, spots.iter().all(|s| !s.pending()))
    }

    pub fn summary(&self, spots: &[Spot], outcome: &Outcome) -> String {
        let left: Vec<String> = spots
            .iter()
            .filter(|s| s.pending())
            .map(|s| {
                format!(
                    "  {} ({}): on {}, not yet on {}\n",
                    s.ip,
                    s.service,
                    s.at.as_deref().unwrap_or("nobody"),
                    s.to.as_deref().unwrap_or("nobody")
                )
            })
            .collect();
        match outcome {
            Outcome::Done => format!(
                "rebalanced: {} moved, {} already in place\n",
                self.moved,
                spots.len().saturating_sub(self.moved)
            ),
            Outcome::TimedOut => format!(
                "timed out with {} still to move (they stay sticky where they are):\n{}",
                left.len(),
                left.concat()
            ),
        }
    }
}

/// Sets (`Some(value)`) or takes away (`None`) the rebalance annotation.
pub async fn annotate(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    value: Option<&str>,
) -> kube::Result<()> {
    let api: Api<Service> = Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({"metadata": {"annotations": {REBALANCE: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Annotates `targets`, follows the moves until none is left or
/// `timeout`, and takes the annotations away.
pub async fn run(
    client: &kube::Client,
    scope: &hostlb_api::Scope,
    targets: &[(String, String)],
    timeout: Duration,
) -> anyhow::Result<Outcome> {
    let stamp = jiff::Timestamp::now().to_string();
    for (ns, name) in targets {
        annotate(client, ns, name, Some(&stamp)).await?;
    }
    let followed = follow(client, scope, targets, timeout).await;
    let mut cleared = Ok(());
    for (ns, name) in targets {
        if let Err(e) = annotate(client, ns, name, None).await {
            cleared = Err(anyhow::anyhow!(
                "could not take {REBALANCE} away from {ns}/{name} (its addresses are placed as preferred until it is): {e}"
            ));
        }
    }
    let outcome = followed?;
    cleared?;
    Ok(outcome)
}

async fn follow(
    client: &kube::Client,
    scope: &hostlb_api::Scope,
    targets: &[(String, String)],
    timeout: Duration,
) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let mut progress = Progress::default();
    // The agents hear of the annotation a watch's delay after it is set:
    // until a first address is seen pending or this long has passed, "all
    // in place" may only mean "not heard yet".
    let heard = Duration::from_secs(2);
    loop {
        let fleet = Fleet::load(client, scope).await?;
        let spots = snapshot(&fleet, targets);
        let elapsed = started.elapsed();
        let (lines, done) = progress.observe(&spots, elapsed);
        for line in lines {
            println!("{line}");
        }
        let settled = done && (elapsed >= heard || progress.moved > 0);
        if settled || elapsed >= timeout {
            let outcome = if settled {
                Outcome::Done
            } else {
                Outcome::TimedOut
            };
            print!("{}", progress.summary(&spots, &outcome));
            return Ok(outcome);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spot(ip: &str, at: Option<&str>, to: Option<&str>) -> Spot {
        Spot {
            ip: ip.parse().unwrap(),
            service: "shop/web".into(),
            at: at.map(str::to_string),
            to: to.map(str::to_string),
        }
    }

    /// A move is named when first seen and when it arrives, with how long
    /// it took; an address nobody can serve is not waited for.
    #[test]
    fn progress_names_each_move_and_ends_when_none_is_left() {
        let mut p = Progress::default();
        let (lines, done) = p.observe(
            &[
                spot("10.0.0.1", Some("b"), Some("a")),
                spot("10.0.0.2", Some("a"), Some("a")),
                spot("10.0.0.3", None, None),
            ],
            Duration::from_millis(250),
        );
        assert_eq!(lines, vec!["10.0.0.1 (shop/web): b -> a"]);
        assert!(!done);
        let (lines, done) = p.observe(
            &[
                spot("10.0.0.1", Some("a"), Some("a")),
                spot("10.0.0.2", Some("a"), Some("a")),
                spot("10.0.0.3", None, None),
            ],
            Duration::from_millis(1500),
        );
        assert_eq!(lines, vec!["10.0.0.1 (shop/web): now on a (1.25 s)"]);
        assert!(done);
        let spots = [spot("10.0.0.1", Some("a"), Some("a"))];
        assert_eq!(
            p.summary(&spots, &Outcome::Done),
            "rebalanced: 1 moved, 0 already in place\n"
        );
        let spots = [spot("10.0.0.1", Some("b"), Some("a"))];
        assert_eq!(
            p.summary(&spots, &Outcome::TimedOut),
            "timed out with 1 still to move (they stay sticky where they are):\n  10.0.0.1 (shop/web): on b, not yet on a\n"
        );
    }
}
