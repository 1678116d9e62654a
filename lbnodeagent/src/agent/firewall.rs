//! The shell's side of the firewall: a task that puts the core's plans in
//! force with `nft`, off the loop. Only the latest plan matters, so plans
//! that arrive while one is being written are folded into the next run; a
//! failure is shown as a warning and tried again until one succeeds.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use super::core::firewall::FirewallPlan;
use super::telemetry::Telemetry;
use crate::firewall::apply;

/// A rule set `nft` refused, or could not be run for, is tried again this
/// often.
const RETRY: Duration = Duration::from_secs(10);

/// Starts the task; the loop sends the core's plans to the sender.
pub(super) fn start(telemetry: Arc<Telemetry>) -> watch::Sender<Option<FirewallPlan>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(run(rx, telemetry));
    tx
}

async fn run(mut plans: watch::Receiver<Option<FirewallPlan>>, telemetry: Arc<Telemetry>) {
    let mut failed = false;
    let mut said_on = false;
    loop {
        let plan = plans.borrow_and_update().clone();
        if let Some(plan) = plan {
            match apply(&plan).await {
                Ok(()) => {
                    let vips = match &plan {
                        FirewallPlan::On(f) => f.vips.len(),
                        FirewallPlan::Off => 0,
                    };
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
                    if telemetry.firewall_failed(message.clone()) {
                        warn!("{message}; trying again every {}s", RETRY.as_secs());
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
