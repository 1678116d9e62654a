//! The Lease: holding it, and writing only while it is surely this replica's (its renewal seen, with clock skew allowed for).

use std::time::Duration;

use super::Timing;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::watch;
use tracing::{info, warn};

/// How long a confirmation that this replica holds the Lease is trusted
/// before the Lease is read again (someone may have changed its holder).
pub(super) const LEASE_CHECK: Duration = Duration::from_millis(500);

/// The largest clock difference between replicas allowed for: another
/// replica judges our Lease expired on its own clock.
pub(super) const MAX_SKEW: Duration = Duration::from_secs(1);

/// Confirms, before writes, that the Lease is still ours for longer than a
/// write can take: the lease manager's view can lag when renewals fail.
pub(super) struct LeaseGuard {
    pub(super) api: Api<Lease>,
    pub(super) name: String,
    pub(super) identity: String,
    pub(super) timing: Timing,
    /// When the Lease was last read and found ours, and when it ends, both
    /// on this replica's monotonic clock.
    pub(super) confirmed: Option<(tokio::time::Instant, tokio::time::Instant)>,
}

impl LeaseGuard {
    pub(super) async fn holds(&mut self) -> bool {
        let needed = self.timing.needed();
        if let Some((read, until)) = self.confirmed
            && read.elapsed() < LEASE_CHECK
            && until > tokio::time::Instant::now() + needed
        {
            return true;
        }
        self.confirmed = None;
        // The Lease's end is a wall-clock time: it is mapped onto the
        // monotonic clock as of before the read, so the read's own latency
        // only makes the answer more careful.
        let asked = tokio::time::Instant::now();
        let wall = jiff::Timestamp::now();
        // Bounded: the loop waits on this, and an API that does not answer
        // in time cannot confirm anything anyway.
        let lease = match tokio::time::timeout(LEASE_CHECK * 4, self.api.get_opt(&self.name)).await
        {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                warn!(error = %e, "cannot confirm the lease; writes wait");
                return false;
            }
            Err(_) => {
                warn!("cannot confirm the lease in time; writes wait");
                return false;
            }
        };
        let spec = lease.and_then(|l| l.spec).unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let left = spec
            .renew_time
            .zip(spec.lease_duration_seconds)
            .and_then(|(t, d)| {
                t.0.checked_add(jiff::SignedDuration::from_secs(d.into()))
                    .ok()
            })
            .and_then(|end| Duration::try_from(end.duration_since(wall)).ok());
        let until = left.map(|l| asked + l);
        if ours && let Some(until) = until {
            self.confirmed = Some((asked, until));
            if until > tokio::time::Instant::now() + needed {
                return true;
            }
        }
        warn!(holder = ?spec.holder_identity, left = ?left, needed = ?needed,
            "the lease is not (or not surely long enough) ours; writes wait");
        false
    }
}

/// The Lease held and renewed, as `LeaseManager::watch` does, but retried
/// after an API error on the watches' capped backoff (at most 2 s) rather
/// than its own, which grows to 30 s: after a long outage the replica would
/// otherwise wait up to half a minute before renewing, and every write
/// waits on the Lease.
pub(super) fn watch_lease(
    manager: kube_lease_manager::LeaseManager,
) -> (
    watch::Receiver<bool>,
    tokio::task::JoinHandle<
        Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>,
    >,
) {
    let (sender, receiver) = watch::channel(false);
    let task = tokio::spawn(async move {
        let mut backoff = hostlb_api::watch::WatchBackoff::spread();
        let mut failing = false;
        loop {
            tokio::select! {
                biased;
                () = sender.closed() => {
                    manager.release().await?;
                    return Ok(manager);
                }
                result = manager.changed() => match result {
                    Ok(leader) => {
                        use kube::runtime::utils::Backoff;
                        backoff.reset();
                        if std::mem::take(&mut failing) {
                            info!("the lease can be read and renewed again");
                        }
                        if sender.send(leader).is_err() {
                            manager.release().await?;
                            return Ok(manager);
                        }
                    }
                    Err(e) => {
                        if !std::mem::replace(&mut failing, true) {
                            warn!(error = %e, "the lease cannot be read or renewed; retrying");
                        }
                        let wait = backoff.next().unwrap_or(hostlb_api::watch::WatchBackoff::MAX);
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        }
    });
    (receiver, task)
}
