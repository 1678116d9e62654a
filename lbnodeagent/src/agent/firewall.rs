//! The shell's side of the firewall: a task that puts the core's plans in
//! force with `nft`, off the loop. Only the latest plan matters, so plans
//! that arrive while one is being written are folded into the next run; a
//! failure is shown as a warning and tried again until one succeeds.
//!
//! It also says what the table in force covers ([`Guard`]): the kernel
//! worker adds a VIP only once a table that closes it is in force, so no
//! VIP reaches every port of the host for a moment (the first run's table
//! is written after the first view of the cluster, a new Service's plan a
//! few tens of milliseconds after its address is known).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::telemetry::Telemetry;
use crate::firewall::apply;
use crate::model::FirewallPlan;

/// A rule set `nft` refused, or could not be run for, is tried again this
/// often.
const RETRY: Duration = Duration::from_secs(10);

/// What the firewall in force covers, as the kernel worker needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Guard {
    /// `firewall.enabled = false`: any VIP may be added.
    Off,
    /// No table written by this run yet, and no failure either.
    Pending,
    /// The table in force closes these VIPs; `failing` while the latest
    /// plan could not be written (a VIP it would add waits for nothing).
    InForce {
        vips: Arc<BTreeSet<IpAddr>>,
        failing: Option<String>,
    },
    /// No table could be written by this run: why.
    Failed(String),
}

/// Whether a VIP may be added under a [`Guard`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cover {
    Yes,
    /// Not yet: a table being written may cover it.
    Wait,
    /// Not while the firewall cannot be written: why.
    No(String),
}

impl Guard {
    pub fn covers(&self, ip: IpAddr) -> Cover {
        match self {
            Guard::Off => Cover::Yes,
            Guard::Pending => Cover::Wait,
            Guard::InForce { vips, .. } if vips.contains(&ip) => Cover::Yes,
            Guard::InForce {
                failing: Some(why), ..
            }
            | Guard::Failed(why) => Cover::No(why.clone()),
            Guard::InForce { failing: None, .. } => Cover::Wait,
        }
    }
}

/// The task's handles: the loop sends plans; the kernel worker reads the
/// guard.
pub(super) struct Firewall {
    plans: watch::Sender<Option<FirewallPlan>>,
    guard: watch::Receiver<Guard>,
}

impl Firewall {
    pub(super) fn send_replace(&self, plan: Option<FirewallPlan>) {
        self.plans.send_replace(plan);
    }

    pub(super) fn guard(&self) -> watch::Receiver<Guard> {
        self.guard.clone()
    }
}

/// Starts the task. `enabled`: the firewall setting at start (a reload
/// that turns it off sends [`FirewallPlan::Off`], which lifts the guard).
pub(super) fn start(telemetry: Arc<Telemetry>, enabled: bool) -> Firewall {
    let (plans, rx) = watch::channel(None);
    let (guard_tx, guard) = watch::channel(if enabled { Guard::Pending } else { Guard::Off });
    tokio::spawn(run(rx, guard_tx, telemetry));
    Firewall { plans, guard }
}

async fn run(
    mut plans: watch::Receiver<Option<FirewallPlan>>,
    guard: watch::Sender<Guard>,
    telemetry: Arc<Telemetry>,
) {
    let mut failed = false;
    let mut said_on = false;
    loop {
        let plan = plans.borrow_and_update().clone();
        if let Some(plan) = plan {
            let started = std::time::Instant::now();
            match apply(&plan).await {
                Ok(()) => {
                    let vips = match &plan {
                        FirewallPlan::On(f) => f.vips.len(),
                        FirewallPlan::Off => 0,
                    };
                    // Adds wait for the table that closes them: how long
                    // each took is what a slow add is traced to.
                    debug!(
                        vips,
                        took_ms = started.elapsed().as_millis() as u64,
                        "firewall table in force"
                    );
                    guard.send_replace(match &plan {
                        FirewallPlan::On(f) => Guard::InForce {
                            vips: Arc::new(f.vips.clone()),
                            failing: None,
                        },
                        FirewallPlan::Off => Guard::Off,
                    });
                    match &plan {
                        FirewallPlan::On(f) if !said_on => {
                            info!(
                                vips,
                                ports = f.open.len(),
                                "firewall on: traffic to a VIP reaches this host only on its Services' ports and as ICMP"
                            );
                            said_on = true;
                        }
                        FirewallPlan::Off => {
                            info!(
                                "firewall off (firewall.enabled = false): the VIPs reach every port of this host"
                            );
                            said_on = false;
                        }
                        FirewallPlan::On(_) => {}
                    }
                    if failed {
                        info!("firewall in force again");
                    }
                    failed = false;
                    telemetry.firewall_applied(vips);
                }
                Err(e) => {
                    let message = format!("firewall not in force: {e}");
                    guard.send_modify(|g| {
                        *g = match std::mem::replace(g, Guard::Pending) {
                            Guard::InForce { vips, .. } => Guard::InForce {
                                vips,
                                failing: Some(message.clone()),
                            },
                            _ => Guard::Failed(message.clone()),
                        }
                    });
                    if telemetry.firewall_failed(message.clone()) {
                        warn!(
                            "{message}; trying again every {}s, and adding no VIP it does not close meanwhile",
                            RETRY.as_secs()
                        );
                    }
                    failed = true;
                }
            }
        }
        if failed {
            tokio::select! {
                changed = plans.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(RETRY) => {}
            }
        } else if plans.changed().await.is_err() {
            return;
        }
    }
}

/// Waits until `guard` says whether each of `ips` may be added, at most
/// `within` (a table `nft` still writes then is taken as failed): the
/// ones that may, and the others with why not.
pub async fn covered(
    guard: &mut watch::Receiver<Guard>,
    ips: &[IpAddr],
    within: Duration,
) -> Vec<Result<(), String>> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let verdicts: Vec<Cover> = {
            let g = guard.borrow_and_update();
            ips.iter().map(|ip| g.covers(*ip)).collect()
        };
        let waiting = verdicts.contains(&Cover::Wait);
        if !waiting || tokio::time::Instant::now() >= deadline {
            return verdicts
                .into_iter()
                .map(|v| match v {
                    Cover::Yes => Ok(()),
                    Cover::Wait => Err(format!(
                        "not added: no firewall closing it was in force within {within:?}"
                    )),
                    Cover::No(why) => Err(format!("not added: {why}")),
                })
                .collect();
        }
        match tokio::time::timeout_at(deadline, guard.changed()).await {
            Ok(Ok(())) | Err(_) => {}
            // The firewall task is gone with the agent.
            Ok(Err(_)) => return ips.iter().map(|_| Err("shutting down".into())).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_vip_is_covered_only_by_a_table_in_force_that_closes_it() {
        let (v, w) = (ip("10.0.1.1"), ip("10.0.1.2"));
        let vips = Arc::new(BTreeSet::from([v]));
        assert_eq!(Guard::Off.covers(v), Cover::Yes);
        assert_eq!(Guard::Pending.covers(v), Cover::Wait);
        let in_force = Guard::InForce {
            vips: vips.clone(),
            failing: None,
        };
        assert_eq!(in_force.covers(v), Cover::Yes);
        assert_eq!(
            in_force.covers(w),
            Cover::Wait,
            "its plan may be on its way"
        );
        let failing = Guard::InForce {
            vips,
            failing: Some("nft refused".into()),
        };
        assert_eq!(
            failing.covers(v),
            Cover::Yes,
            "the table in force still closes it"
        );
        assert_eq!(failing.covers(w), Cover::No("nft refused".into()));
        assert_eq!(
            Guard::Failed("no nft".into()).covers(v),
            Cover::No("no nft".into())
        );
    }

    /// The worker's wait: it ends as soon as a table covers the VIP, and
    /// refuses at the deadline or on a failure.
    #[tokio::test(start_paused = true)]
    async fn adds_wait_for_the_table_that_closes_them() {
        let v = ip("10.0.1.1");
        let (tx, mut rx) = watch::channel(Guard::Pending);
        let set = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            tx.send_replace(Guard::InForce {
                vips: Arc::new(BTreeSet::from([v])),
                failing: None,
            });
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(tx);
        });
        let t0 = tokio::time::Instant::now();
        assert_eq!(
            covered(&mut rx, &[v], Duration::from_secs(20)).await,
            [Ok(())]
        );
        assert_eq!(t0.elapsed(), Duration::from_millis(30));
        let w = ip("10.0.1.2");
        let got = covered(&mut rx, &[v, w], Duration::from_secs(1)).await;
        assert_eq!(got[0], Ok(()));
        assert!(got[1].as_ref().unwrap_err().contains("within"), "{got:?}");
        set.abort();
        let (_tx, mut rx) = watch::channel(Guard::Failed("no nft".into()));
        let got = covered(&mut rx, &[v], Duration::from_secs(20)).await;
        assert_eq!(got, [Err("not added: no nft".to_string())]);
    }
}
