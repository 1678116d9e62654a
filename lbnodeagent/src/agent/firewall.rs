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
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::telemetry::Telemetry;
use crate::firewall::apply;
use crate::model::FirewallPlan;
use crate::model::VipAddress;

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

/// Adds that wait for a firewall table closing their VIP. The kernel
/// worker parks them here and carries on with the batches after them: an
/// add of a covered VIP never waits behind one that is not (a renewal of a
/// previous run's address, whose Service is gone, once held a restarted
/// agent's adds of its new VIPs for 20 s). The core has at most one
/// operation in flight per VIP, so no later batch concerns a parked one.
#[derive(Debug, Default)]
pub struct Gate {
    parked: Vec<Parked>,
}

#[derive(Debug)]
struct Parked {
    vip: VipAddress,
    since: Instant,
    until: Instant,
}

/// What the gate lets through now.
#[derive(Debug, Default)]
pub struct Sorted {
    /// Adds whose VIP a table in force closes, with how long each waited.
    pub go: Vec<(VipAddress, Duration)>,
    /// Adds refused, with why: the firewall cannot be written, or no table
    /// closing the VIP came within the wait.
    pub refused: Vec<(VipAddress, String)>,
}

impl Gate {
    /// Sorts the parked adds and `new` ones (which may wait `within`) by
    /// what `guard` says at `now`; those still waiting stay parked.
    pub fn sort(
        &mut self,
        guard: &Guard,
        new: Vec<VipAddress>,
        within: Duration,
        now: Instant,
    ) -> Sorted {
        let mut out = Sorted::default();
        let arriving = new.into_iter().map(|vip| Parked {
            vip,
            since: now,
            until: now + within,
        });
        let waiting: Vec<Parked> = self.parked.drain(..).chain(arriving).collect();
        for p in waiting {
            match guard.covers(p.vip.ip) {
                Cover::Yes => out.go.push((p.vip, now.saturating_duration_since(p.since))),
                Cover::No(why) => out.refused.push((p.vip, format!("not added: {why}"))),
                Cover::Wait if now >= p.until => {
                    let waited = p.until.saturating_duration_since(p.since);
                    out.refused.push((
                        p.vip,
                        format!("not added: no firewall closing it was in force within {waited:?}"),
                    ));
                }
                Cover::Wait => self.parked.push(p),
            }
        }
        out
    }

    /// When the first parked add is refused unless a table comes first.
    pub fn deadline(&self) -> Option<Instant> {
        self.parked.iter().map(|p| p.until).min()
    }

    pub fn is_empty(&self) -> bool {
        self.parked.is_empty()
    }

    /// Every parked add, refused with `why` (the agent is ending).
    pub fn refuse_all(&mut self, why: &str) -> Vec<(VipAddress, String)> {
        self.parked
            .drain(..)
            .map(|p| (p.vip, why.to_string()))
            .collect()
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

    fn vip(s: &str) -> VipAddress {
        VipAddress {
            interface: "eth0".into(),
            ifindex: 2,
            ip: ip(s),
            prefix_len: 24,
            lifetime: crate::model::Lifetime::FOREVER,
        }
    }

    fn ips(v: &[(VipAddress, impl Sized)]) -> Vec<IpAddr> {
        v.iter().map(|(v, _)| v.ip).collect()
    }

    /// The gate lets an add through as soon as a table closes its VIP,
    /// refuses it at its deadline or on a failure, and never holds one
    /// covered add behind another that waits.
    #[test]
    fn adds_wait_for_the_table_that_closes_them_and_only_they_wait() {
        let within = Duration::from_secs(20);
        let t0 = Instant::now();
        let (v, w) = (ip("10.0.1.1"), ip("10.0.1.2"));
        let mut gate = Gate::default();
        let s = gate.sort(&Guard::Pending, vec![vip("10.0.1.1")], within, t0);
        assert!(s.go.is_empty() && s.refused.is_empty());
        assert_eq!(gate.deadline(), Some(t0 + within));
        // A table that closes v, not w: v goes (having waited), w arrives
        // and waits, and neither holds the other.
        let only_v = Guard::InForce {
            vips: Arc::new(BTreeSet::from([v])),
            failing: None,
        };
        let t1 = t0 + Duration::from_millis(30);
        let s = gate.sort(&only_v, vec![vip("10.0.1.2")], within, t1);
        assert_eq!(ips(&s.go), [v]);
        assert_eq!(s.go[0].1, Duration::from_millis(30));
        assert!(s.refused.is_empty());
        assert_eq!(gate.deadline(), Some(t1 + within), "w's own deadline");
        // A covered add arriving later goes at once, w still parked.
        let s = gate.sort(&only_v, vec![vip("10.0.1.1")], within, t1);
        assert_eq!(ips(&s.go), [v]);
        assert!(!gate.is_empty());
        // At its deadline w is refused, saying how long it waited.
        let s = gate.sort(&only_v, vec![], within, t1 + within);
        assert!(s.go.is_empty());
        assert_eq!(ips(&s.refused), [w]);
        assert!(s.refused[0].1.contains("within 20s"), "{:?}", s.refused);
        assert!(gate.is_empty() && gate.deadline().is_none());
        // A failure refuses at once what the table in force does not close.
        let failing = Guard::InForce {
            vips: Arc::new(BTreeSet::from([v])),
            failing: Some("nft refused".into()),
        };
        let s = gate.sort(&failing, vec![vip("10.0.1.1"), vip("10.0.1.2")], within, t1);
        assert_eq!(ips(&s.go), [v]);
        assert_eq!(
            s.refused,
            [(vip("10.0.1.2"), "not added: nft refused".to_string())]
        );
        assert!(gate.is_empty());
        // Ending: whatever waits is refused.
        gate.sort(&Guard::Pending, vec![vip("10.0.1.2")], within, t1);
        assert_eq!(ips(&gate.refuse_all("shutting down")), [w]);
        assert!(gate.is_empty());
    }
}
