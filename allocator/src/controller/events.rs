//! Events: what the loop decided (an address given, a failure, a refused
//! edit, an unusable pool), handed to the shared writer
//! ([`hostlb_api::runtime::events`]), which writes them off the loop.

use std::sync::Arc;

use hostlb_api::runtime::events::{Note, Sink};
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use tracing::{info, warn};

use super::Loop;
use super::telemetry::Telemetry;

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

    /// Hands an Event about `key` to the writer, which keeps it until the
    /// server takes it; never waits.
    pub(super) fn publish(
        &mut self,
        key: &str,
        ev: kube::runtime::events::Event,
        regarding: ObjectReference,
    ) {
        self.events.send(Note {
            key: key.to_string(),
            reason: reason_of(&ev),
            event: ev,
            regarding: Some(regarding),
        });
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

/// What the Event writer tells the loop: a write's outcome counts for
/// readiness like any other write.
pub(super) struct Outcomes {
    pub telemetry: Arc<Telemetry>,
    pub tx: tokio::sync::mpsc::UnboundedSender<bool>,
}

impl Sink for Outcomes {
    fn dropped(&self, n: usize) {
        if n > 0 {
            self.telemetry.events_dropped(n as u64);
        }
    }

    fn wrote(&self, written: bool, _answered: bool) {
        let _ = self.tx.send(written);
    }
}

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
