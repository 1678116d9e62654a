//! Events: queued, published with a bounded backlog, and refusals and problems reported on the objects they concern.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use tracing::{debug, info, warn};

use super::Loop;
use super::writes::{WRITES_IN_FLIGHT, bounded};

impl Loop {
    /// A Warning on a pool or advertisement whose edit cannot be used, once
    /// per distinct problem (the condition says it for as long as it lasts).
    pub(super) fn report_invalid(
        &mut self,
        key: &str,
        problem: String,
        regarding: ObjectReference,
    ) {
        let ev = kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Warning,
            reason: hostlb_api::annotations::reasons::INVALID_CONFIG.into(),
            note: Some(problem),
            action: "Validate".into(),
            secondary: None,
        };
        self.publish(key, ev, regarding);
    }

    /// Queues an Event about `key` for [`Loop::flush_events`].
    pub(super) fn publish(
        &mut self,
        key: &str,
        ev: kube::runtime::events::Event,
        regarding: ObjectReference,
    ) {
        self.outbox.push((key.to_string(), ev, regarding));
    }

    /// Writes the queued Events, [`WRITES_IN_FLIGHT`] at a time. One the
    /// server does not take waits in [`Loop::events`] and is written again
    /// with the other retries; while some already wait, new ones queue
    /// behind them, in order.
    pub(super) async fn flush_events(&mut self) {
        let outbox = std::mem::take(&mut self.outbox);
        if outbox.is_empty() {
            return;
        }
        let now = std::time::Instant::now();
        if !self.events.is_empty() {
            // One that timed out must not hold up a healthy server's
            // others until the next retry tick.
            self.retry_events().await;
        }
        if !self.events.is_empty() {
            for (key, ev, regarding) in outbox {
                let dropped = self
                    .events
                    .push((key, reason_of(&ev)), (ev, regarding), now);
                self.events_dropped(dropped);
            }
            return;
        }
        let recorder = &self.recorder;
        let results: Vec<_> = futures::stream::iter(outbox)
            .map(|(key, ev, regarding)| async move {
                let result = bounded(
                    tokio::time::Instant::now() + Duration::from_secs(3),
                    recorder.publish(&ev, &regarding),
                )
                .await;
                (key, ev, regarding, result)
            })
            .buffered(WRITES_IN_FLIGHT)
            .collect()
            .await;
        let mut failed = 0;
        for (key, ev, regarding, result) in results {
            self.wrote(result.is_ok());
            if let Err(e) = result {
                if failed == 0 {
                    warn!(service = %key, error = %e, "cannot write an Event; it waits for the API server");
                }
                failed += 1;
                let dropped = self
                    .events
                    .push((key, reason_of(&ev)), (ev, regarding), now);
                self.events_dropped(dropped);
            }
        }
        if failed > 1 {
            warn!(
                failed,
                "Events wait for the API server; they are written when it takes writes again"
            );
        }
    }

    /// Writes a waiting Event again; put back in front if it fails (its
    /// first failure was logged when it was queued).
    pub(super) async fn try_publish(
        &mut self,
        key: &str,
        ev: kube::runtime::events::Event,
        regarding: ObjectReference,
        since: std::time::Instant,
    ) -> bool {
        let result = bounded(
            tokio::time::Instant::now() + Duration::from_secs(3),
            self.recorder.publish(&ev, &regarding),
        )
        .await;
        self.wrote(result.is_ok());
        match result {
            Ok(()) => true,
            Err(e) => {
                debug!(service = %key, error = %e, "an Event still waits for the API server");
                let reason = reason_of(&ev);
                let dropped =
                    self.events
                        .put_back((key.to_string(), reason), (ev, regarding), since);
                self.events_dropped(dropped);
                false
            }
        }
    }

    pub(super) fn events_dropped(&self, n: usize) {
        if n > 0 {
            self.telemetry.events_dropped(n as u64);
            warn!(
                dropped = n,
                waiting = self.events.len(),
                "Events dropped: too many wait for the API server"
            );
        }
    }

    /// Writes the waiting Events, oldest first, until one fails again.
    pub(super) async fn retry_events(&mut self) {
        loop {
            let (next, expired) = self.events.pop(std::time::Instant::now());
            if expired > 0 {
                self.telemetry.events_dropped(expired as u64);
                warn!(
                    dropped = expired,
                    "Events dropped: they waited an hour for the API server"
                );
            }
            let Some(((key, _), (ev, regarding), since)) = next else {
                return;
            };
            if !self.try_publish(&key, ev, regarding, since).await {
                return;
            }
        }
    }

    /// A Warning that the Service's edit no longer fit the address it
    /// shared, which stays with the others.
    pub(super) fn report_refusal(
        &mut self,
        svc: &Service,
        key: &str,
        why: &crate::engine::AllocError,
    ) {
        warn!(service = %key, reason = %why, "edit refused");
        let ev = kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Warning,
            reason: hostlb_api::annotations::reasons::ALLOCATION_FAILED.into(),
            note: Some(why.to_string()),
            action: "Allocate".into(),
            secondary: None,
        };
        use kube::Resource;
        self.publish(key, ev, svc.object_ref(&()));
    }

    /// Events for what changed: an address given, or a failure (once per
    /// distinct reason; again if publishing it failed).
    pub(super) fn report(
        &mut self,
        svc: &Service,
        key: &str,
        answer: Option<&crate::ledger::Answer>,
        assigned: bool,
    ) {
        use hostlb_api::annotations::reasons;
        // A failure, or a request not applied while the addresses are kept:
        // a Warning once per distinct reason.
        let failure = match answer {
            Some(Ok(a)) => a.pending.as_ref().map(|why| {
                let ips: Vec<String> = a.ips.iter().map(|i| i.to_string()).collect();
                format!("keeping {}: {why}", ips.join(", "))
            }),
            Some(Err(e)) => Some(e.to_string()),
            None => return,
        };
        let (type_, reason, note, failure) = match (failure, answer) {
            (Some(msg), _) => {
                if self.reported.get(key) == Some(&msg) {
                    return;
                }
                warn!(service = %key, reason = %msg, "allocation failed or not applied");
                (
                    kube::runtime::events::EventType::Warning,
                    reasons::ALLOCATION_FAILED,
                    msg.clone(),
                    Some(msg),
                )
            }
            (None, Some(Ok(a))) if assigned => {
                self.reported.remove(key);
                self.telemetry.allocated();
                let ips: Vec<String> = a.ips.iter().map(|i| i.to_string()).collect();
                info!(service = %key, addresses = %ips.join(","), pool = %a.pool, "assigned");
                (
                    kube::runtime::events::EventType::Normal,
                    reasons::IP_ALLOCATED,
                    format!("Assigned {} from pool {}", ips.join(", "), a.pool),
                    None,
                )
            }
            _ => {
                // Applied: the next failure is news again.
                self.reported.remove(key);
                return;
            }
        };
        let ev = kube::runtime::events::Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Allocate".into(),
            secondary: None,
        };
        use kube::Resource;
        // Written now or waiting to be: either way it is reported.
        self.publish(key, ev, svc.object_ref(&()));
        if let Some(msg) = failure {
            self.telemetry.failed();
            self.reported.insert(key.to_string(), msg);
        }
    }
}

/// Events waiting for the API server, at most (the oldest go first).
pub(super) const EVENTS_WAITING: usize = 1024;

/// An Event that waited this long is dropped: Kubernetes would already have
/// expired it.
pub(super) const EVENT_MAX_AGE: Duration = Duration::from_secs(3600);

/// An Event's key in the backlog: its reason (one of the constants).
pub(super) fn reason_of(ev: &kube::runtime::events::Event) -> &'static str {
    use hostlb_api::annotations::reasons;
    [
        reasons::IP_ALLOCATED,
        reasons::ALLOCATION_FAILED,
        reasons::INVALID_CONFIG,
    ]
    .into_iter()
    .find(|r| *r == ev.reason)
    .unwrap_or("other")
}
