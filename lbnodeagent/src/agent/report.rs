//! Writing what this node does back to the API: the `announcing-IPv4/-IPv6`
//! annotations (`NODE,INTERFACE`) and the `AnnouncingLocal`,
//! `AnnouncingVirtual` and `Withdrawn` Events.
//!
//! Only the winner writes a VIP's annotation. When no node wins (no
//! endpoints, no candidate), one designated live member, the first by name,
//! clears it: somebody has to, and every node computes who. The loop hands
//! the writer the whole set of values this node is responsible for; the
//! writer compares it with the cached Services and patches only what
//! differs, at a bounded rate, so a start with 1 000 Services does not
//! hammer the API server and a repeated pass writes nothing. Failed writes
//! are tried again on the next pass.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hostlb_api::Family;
use hostlb_api::annotations::{ANNOUNCING_IPV4, ANNOUNCING_IPV6};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::telemetry::Telemetry;

/// The field manager and Event reporter name.
pub const FIELD_MANAGER: &str = "hostlb-lbnodeagent";
/// Writes per second, annotation patches and Events together.
const WRITES_PER_SECOND: u64 = 50;
/// A value written is not written again while the cached Service is the
/// one seen when writing it (the cache has not caught up with our own
/// write), for at most this long.
const WRITTEN_GRACE: Duration = Duration::from_secs(10);
/// Passes over the whole set this often even without a change, to retry
/// failed writes and repair annotations someone edited.
const RESYNC: Duration = Duration::from_secs(10);

pub use super::core::{Announcing, EventRequest};

pub fn annotation(family: Family) -> &'static str {
    match family {
        Family::V4 => ANNOUNCING_IPV4,
        Family::V6 => ANNOUNCING_IPV6,
    }
}

/// Handles to the writer task.
pub struct ReportHandle {
    pub announcing: watch::Sender<Announcing>,
    pub events: mpsc::Sender<EventRequest>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ReportHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ReportHandle {
    /// Queue an Event; dropped (and counted) when the queue is full rather
    /// than slowing the loop.
    pub fn event(&self, telemetry: &Telemetry, req: EventRequest) {
        if self.events.try_send(req).is_err() {
            telemetry.events_dropped.inc();
        }
    }
}

pub fn start(
    client: Client,
    node: &str,
    services: Store<Service>,
    telemetry: Arc<Telemetry>,
) -> ReportHandle {
    let (announcing, rx) = watch::channel(Announcing::new());
    let (events, events_rx) = mpsc::channel(1024);
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(node.to_string()),
        },
    );
    let writer = Writer {
        client,
        services,
        recorder,
        telemetry,
        written: HashMap::new(),
        next_write: Instant::now(),
    };
    let task = tokio::spawn(writer.run(rx, events_rx));
    ReportHandle {
        announcing,
        events,
        task,
    }
}

/// A value written, the cached Service's resourceVersion then, and when.
type Written = (Option<String>, Option<String>, Instant);

struct Writer {
    client: Client,
    services: Store<Service>,
    recorder: Recorder,
    telemetry: Arc<Telemetry>,
    written: HashMap<(String, Family), Written>,
    next_write: Instant,
}

impl Writer {
    async fn run(
        mut self,
        mut announcing: watch::Receiver<Announcing>,
        mut events: mpsc::Receiver<EventRequest>,
    ) {
        let mut resync = tokio::time::interval(RESYNC);
        loop {
            tokio::select! {
                changed = announcing.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                ev = events.recv() => match ev {
                    Some(ev) => {
                        self.publish(ev).await;
                        continue;
                    }
                    None => return,
                },
                _ = resync.tick() => {}
            }
            let want = announcing.borrow_and_update().clone();
            self.annotate(&want).await;
        }
    }

    async fn pace(&mut self) {
        tokio::time::sleep_until(self.next_write.into()).await;
        self.next_write =
            Instant::now().max(self.next_write) + Duration::from_millis(1000 / WRITES_PER_SECOND);
    }

    async fn annotate(&mut self, want: &Announcing) {
        let now = Instant::now();
        self.written
            .retain(|_, (_, _, at)| now - *at < WRITTEN_GRACE);
        for ((key, family), value) in want {
            let Some((ns, name)) = key.split_once('/') else {
                continue;
            };
            let Some(svc) = self
                .services
                .get(&kube::runtime::reflector::ObjectRef::new(name).within(ns))
            else {
                continue;
            };
            let name_of = annotation(*family);
            let current = svc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(name_of))
                .cloned();
            if current == *value {
                continue;
            }
            let k = (key.clone(), *family);
            // Written already and the cache has not moved since: our write
            // is on its way. Once the cache moves on and still differs
            // (another node wrote after us), it is written again.
            let version = svc.metadata.resource_version.clone();
            if self
                .written
                .get(&k)
                .is_some_and(|(v, seen, _)| v == value && *seen == version)
            {
                continue;
            }
            self.pace().await;
            let api: Api<Service> = Api::namespaced(self.client.clone(), ns);
            let patch = json!({"metadata": {"annotations": {name_of: value}}});
            let result = api
                .patch(
                    name,
                    &PatchParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..PatchParams::default()
                    },
                    &Patch::Merge(&patch),
                )
                .await;
            match result {
                Ok(_) => {
                    self.telemetry.write("annotate", true);
                    debug!(service = %key, annotation = name_of, value = ?value, "annotated");
                    self.written
                        .insert(k, (value.clone(), version, Instant::now()));
                }
                Err(e) => {
                    self.telemetry.write("annotate", false);
                    warn!(service = %key, annotation = name_of, error = %e, "cannot write the annotation; retrying");
                }
            }
        }
    }

    async fn publish(&mut self, req: EventRequest) {
        let Some((ns, name)) = req.service.split_once('/') else {
            return;
        };
        let Some(svc) = self
            .services
            .get(&kube::runtime::reflector::ObjectRef::new(name).within(ns))
        else {
            return;
        };
        self.pace().await;
        let ev = Event {
            type_: if req.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: req.reason.into(),
            note: Some(req.note),
            action: "Announce".into(),
            secondary: None,
        };
        let ok = self
            .recorder
            .publish(&ev, &svc.object_ref(&()))
            .await
            .inspect_err(
                |e| warn!(service = %req.service, reason = req.reason, error = %e, "cannot write the Event"),
            )
            .is_ok();
        self.telemetry.write("event", ok);
    }
}
