//! Writing what this node does back to the API: the `announcing-IPv4/-IPv6`
//! annotations (`NODE,INTERFACE`), the `announcing-virtual-IPv4/-IPv6`
//! ones (`NODE,NODE,...`) and the `AnnouncingLocal`, `AnnouncingVirtual`
//! and `Withdrawn` Events.
//!
//! Only the winner writes a VIP's annotation. When no node wins (no
//! endpoints, no candidate), one designated live member, the first by name,
//! clears it: somebody has to, and every node computes who. The same
//! member names the nodes holding a VIP on their virtual interfaces: they
//! hold it all at once, and one writer keeps them from overwriting each
//! other. The loop hands
//! the writer the whole set of values this node is responsible for; the
//! writer compares it with the cached Services and patches only what
//! differs, and a repeated pass writes nothing. Writes go [`IN_FLIGHT`] at
//! a time through a token bucket: a start or a failover that makes 1,000
//! Services this node's is written in about a second, while an agent that
//! goes on writing (a flapping Service, a bug) is held to
//! [`WRITES_PER_SECOND`]. Failed writes are tried again on the next pass.
//!
//! Each patch names the Service's resourceVersion it was worked out on, and
//! the server refuses it if the Service changed since. A write that timed
//! out during an API outage is not gone: it waits in the connection's send
//! buffer, and TCP delivers it on its next retransmission, up to half a
//! minute after the path is back. Without the precondition it would land
//! then over the annotation the VIP's new holder wrote meanwhile, and name
//! a node that let the address go. Refused, it is worked out again on the
//! fresh copy [`CONFLICT_RETRY`] later, twice as long after each pass that
//! is refused again (a watch that stopped bringing new copies), up to
//! [`RESYNC`].
//!
//! Events go through the shared writer ([`hostlb_api::runtime::events`]),
//! which keeps those the server does not take yet and writes them when it
//! answers again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hostlb_api::runtime::events::Recorder;
use hostlb_api::runtime::events::{self, Bucket, Events, Note, answered};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::telemetry::Telemetry;
use super::watches::ServiceRecords;
use crate::inputs::ServiceRecord;

/// The field manager and Event reporter name.
pub const FIELD_MANAGER: &str = "hostlb-lbnodeagent";
/// Writes per second sustained, annotation patches and Events together.
/// What one agent writes is bounded by what it holds (each VIP it takes
/// or gives up costs an annotation and an Event), so the whole fleet's
/// writes follow the number of VIPs that move, not the number of nodes;
/// this rate only caps an agent that keeps writing.
const WRITES_PER_SECOND: f64 = 100.0;
/// Writes allowed at once after a quiet spell: an annotation and an Event
/// for each of 1,000 Services.
const WRITE_BURST: f64 = 2000.0;
/// Requests in flight at once.
const IN_FLIGHT: usize = 8;
/// A value written is not written again while the cached Service is the
/// one seen when writing it (the cache has not caught up with our own
/// write), for at most this long.
const WRITTEN_GRACE: Duration = Duration::from_secs(10);
/// Passes over the whole set this often even without a change, to retry
/// failed writes and repair annotations someone edited.
const RESYNC: Duration = Duration::from_secs(10);
/// After a write refused because the Service changed since the copy it
/// was worked out on, the next pass: time for the watch to bring the new
/// copy.
const CONFLICT_RETRY: Duration = Duration::from_millis(250);
/// Events waiting to be written, at most: a failover of 1,000 VIPs makes
/// two for each (one per node), and one per Service and reason is kept.
const EVENTS_WAITING: usize = 4096;
/// With no write in this long, the writer asks the server for its version
/// (one cheap GET over a new or pooled connection) to learn whether it
/// still takes requests: at 1,000 agents, 200 requests a second at most.
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// A probe or write that takes longer counts as failed (the record's
/// writes too).
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(3);

pub use super::core::{Announcing, EventRequest};

/// Handles to the writer task.
pub struct ReportHandle {
    pub announcing: watch::Sender<Announcing>,
    events: Events,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ReportHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ReportHandle {
    /// Hands an Event to the writer, which keeps it in its bounded backlog
    /// until written; never slows the loop.
    pub fn event(&self, req: EventRequest) {
        self.events.send(Note {
            key: req.service,
            reason: req.reason,
            event: Event {
                type_: if req.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: req.reason.into(),
                note: Some(req.note),
                action: "Announce".into(),
                secondary: None,
            },
            regarding: None,
        });
    }
}

pub fn start(
    client: Client,
    node: &str,
    services: ServiceRecords,
    telemetry: Arc<Telemetry>,
) -> ReportHandle {
    let (announcing, rx) = watch::channel(Announcing::new());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(node.to_string()),
        },
    );
    // A Service gone from the cache by the time its Event is written needs
    // no Event any more.
    let cache = services.clone();
    let resolve = Box::new(move |key: &str| {
        let (ns, name) = key.split_once('/')?;
        Some(cache.get(ns, name)?.object_ref())
    });
    let events = Events::start(
        recorder,
        resolve,
        telemetry.clone(),
        events::Settings {
            capacity: EVENTS_WAITING,
            per_second: WRITES_PER_SECOND,
            burst: WRITE_BURST,
            in_flight: IN_FLIGHT,
            timeout: WRITE_TIMEOUT,
            ..events::Settings::default()
        },
    );
    let task = tokio::spawn(Writer::new(client, services, telemetry).run(rx));
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
    services: ServiceRecords,
    telemetry: Arc<Telemetry>,
    written: HashMap<(String, &'static str), Written>,
    /// Annotation patches; Events have a bucket of their own.
    bucket: Bucket,
    /// When the server last took a write or answered a probe.
    last_answer: Instant,
    /// A write was refused on an old copy: pass again then.
    again: Option<tokio::time::Instant>,
    /// Passes in a row that had a write refused.
    refused_passes: u32,
}

impl Writer {
    fn new(client: Client, services: ServiceRecords, telemetry: Arc<Telemetry>) -> Writer {
        Writer {
            client,
            services,
            telemetry,
            written: HashMap::new(),
            bucket: Bucket::new(Instant::now(), WRITES_PER_SECOND, WRITE_BURST),
            last_answer: Instant::now(),
            again: None,
            refused_passes: 0,
        }
    }

    async fn run(mut self, mut announcing: watch::Receiver<Announcing>) {
        let mut resync = tokio::time::interval(RESYNC);
        // Each second: a probe is due after PROBE_EVERY without a write,
        // or at once while the server refuses (to see it back soon).
        let mut probe = tokio::time::interval(Duration::from_secs(1));
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = announcing.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = probe.tick() => {
                    let writable = self
                        .telemetry
                        .api_writable
                        .load(std::sync::atomic::Ordering::Relaxed);
                    if !writable || self.last_answer.elapsed() >= PROBE_EVERY {
                        let ok = matches!(
                            tokio::time::timeout(WRITE_TIMEOUT, self.client.apiserver_version()).await,
                            Ok(Ok(_))
                        );
                        self.answered(ok);
                    }
                    continue;
                }
                _ = resync.tick() => {}
                // The pass below sets the next one, if any.
                () = super::sleep_until(self.again) => {}
            }
            let want = announcing.borrow_and_update().clone();
            self.annotate(&want).await;
        }
    }

    /// The cached Service `namespace/name`.
    fn cached(&self, key: &str) -> Option<ServiceRecord> {
        let (ns, name) = key.split_once('/')?;
        self.services.get(ns, name)
    }

    async fn annotate(&mut self, want: &Announcing) {
        let now = Instant::now();
        self.written
            .retain(|_, (_, _, at)| now - *at < WRITTEN_GRACE);
        // One patch per Service, with every annotation of it that differs:
        // two patches on the same copy would have the second refused.
        let mut jobs: Vec<Job> = Vec::new();
        for ((key, name_of), value) in want {
            let name_of = *name_of;
            let Some(svc) = self.cached(key) else {
                continue;
            };
            let current = svc.announcing(name_of);
            if current == value.as_deref() {
                continue;
            }
            // Written already and the cache has not moved since: our write
            // is on its way. Once the cache moves on and still differs
            // (another node wrote after us), it is written again.
            let version = svc.resource_version.clone();
            if self
                .written
                .get(&(key.clone(), name_of))
                .is_some_and(|(v, seen, _)| v == value && *seen == version)
            {
                continue;
            }
            match jobs.last_mut() {
                // `want` is sorted by Service: its annotations come together.
                Some(job) if job.key == *key => job.values.push((name_of, value.clone())),
                _ => jobs.push(Job {
                    key: key.clone(),
                    namespace: svc.namespace,
                    name: svc.name,
                    version,
                    values: vec![(name_of, value.clone())],
                }),
            }
        }
        let mut refused = false;
        for chunk in jobs.chunks(IN_FLIGHT) {
            for _ in chunk {
                self.bucket.pace().await;
            }
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let results = futures::future::join_all(chunk.iter().map(|job| {
                let api: Api<Service> = Api::namespaced(self.client.clone(), &job.namespace);
                let patch = annotations_patch(&job.values, job.version.as_deref());
                let params = &params;
                async move {
                    tokio::time::timeout(
                        WRITE_TIMEOUT,
                        api.patch(&job.name, params, &Patch::Merge(&patch)),
                    )
                    .await
                    .unwrap_or_else(|_| Err(kube::Error::Service("the write timed out".into())))
                }
            }))
            .await;
            for (job, result) in chunk.iter().zip(results) {
                self.answered(answered(&result));
                let key = &job.key;
                match result {
                    Ok(_) => {
                        self.telemetry.write("annotate", true);
                        for (name_of, value) in &job.values {
                            debug!(service = %key, annotation = name_of, value = ?value, "annotated");
                            self.written.insert(
                                (key.clone(), name_of),
                                (value.clone(), job.version.clone(), Instant::now()),
                            );
                        }
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        // Not a failure: the server took the request and
                        // kept a newer Service from an older word.
                        debug!(service = %key, "the Service changed since the copy this write was worked out on; working it out again");
                        refused = true;
                    }
                    Err(e) => {
                        self.telemetry.write("annotate", false);
                        warn!(service = %key, error = %e, "cannot write the annotations; retrying");
                    }
                }
            }
        }
        self.refused_passes = if refused {
            self.refused_passes.saturating_add(1)
        } else {
            0
        };
        self.again =
            refused.then(|| tokio::time::Instant::now() + conflict_retry(self.refused_passes));
    }

    /// Notes whether the server took a request, for `/readyz`.
    fn answered(&mut self, ok: bool) {
        if ok {
            self.last_answer = Instant::now();
        }
        self.telemetry.api_answered(ok);
    }
}

/// One Service's annotation patch, worked out on its copy at `version`.
struct Job {
    key: String,
    namespace: String,
    name: String,
    version: Option<String>,
    /// Each annotation and its value (`None`: removed).
    values: Vec<(&'static str, Option<String>)>,
}

/// The merge patch that sets (or, `None`, removes) a Service's
/// annotations, refused by the server unless the Service is still at
/// `version` (when known): see the module's doc.
fn annotations_patch(
    values: &[(&'static str, Option<String>)],
    version: Option<&str>,
) -> serde_json::Value {
    let annotations: serde_json::Map<String, serde_json::Value> = values
        .iter()
        .map(|(k, v)| ((*k).to_string(), json!(v)))
        .collect();
    let mut metadata = json!({ "annotations": annotations });
    if let Some(v) = version {
        metadata["resourceVersion"] = json!(v);
    }
    json!({ "metadata": metadata })
}

/// The wait before the next pass after `passes` refused in a row (at
/// least one): [`CONFLICT_RETRY`], doubled with each, at most [`RESYNC`].
fn conflict_retry(passes: u32) -> Duration {
    CONFLICT_RETRY
        .saturating_mul(1 << passes.saturating_sub(1).min(16))
        .min(RESYNC)
}

impl events::Sink for Telemetry {
    fn dropped(&self, n: usize) {
        self.events_dropped.inc_by(n as u64);
    }

    fn wrote(&self, written: bool, answered: bool) {
        self.write("event", written);
        self.api_answered(answered);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::PostParams;
    use kube::runtime::watcher;

    /// A write worked out on an old copy of the Service (one that timed out
    /// during an outage and lands late) does not overwrite what was written
    /// since: the server refuses it. Worked out again on the fresh copy,
    /// it lands, with the Service's other annotation in the same patch.
    #[tokio::test]
    async fn a_write_on_an_old_copy_does_not_land_over_a_newer_one() {
        let server = hostlb_tests::apiserver::TestServer::start().await;
        let client = server.client();
        let api = Api::<Service>::namespaced(client.clone(), "default");
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}
        }))
        .unwrap();
        let old = api.create(&PostParams::default(), &svc).await.unwrap();
        let key = hostlb_api::annotations::ANNOUNCING_IPV4;
        // The VIP's new holder writes while this node's copy is still old.
        let newer = api
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {key: "n2,eth0"}}})),
            )
            .await
            .unwrap();
        let services = ServiceRecords::default();
        services.apply(&watcher::Event::Apply(old));
        let mut writer = Writer::new(client, services.clone(), Telemetry::new());
        let mut want = Announcing::new();
        want.insert(("default/a".into(), key), Some("n1,eth0".into()));
        writer.annotate(&want).await;
        let now = api.get("a").await.unwrap();
        let written = |s: &Service| s.metadata.annotations.as_ref().unwrap()[key].clone();
        assert_eq!(written(&now), "n2,eth0", "a write on an old copy landed");
        assert!(writer.again.is_some(), "no pass again after the refusal");

        // Both families of the Service in one pass: one patch, not two on
        // the same copy (the second would be refused).
        services.apply(&watcher::Event::Apply(newer));
        let v6 = hostlb_api::annotations::ANNOUNCING_IPV6;
        want.insert(("default/a".into(), v6), Some("n1,eth0".into()));
        writer.annotate(&want).await;
        let now = api.get("a").await.unwrap();
        assert_eq!(written(&now), "n1,eth0");
        assert_eq!(now.metadata.annotations.as_ref().unwrap()[v6], "n1,eth0");
        assert!(writer.again.is_none(), "a pass again after all landed");
    }

    #[test]
    fn refused_passes_back_off_to_the_resync() {
        assert_eq!(conflict_retry(1), CONFLICT_RETRY);
        assert_eq!(conflict_retry(2), CONFLICT_RETRY * 2);
        assert_eq!(conflict_retry(3), CONFLICT_RETRY * 4);
        assert_eq!(conflict_retry(7), RESYNC);
        assert_eq!(conflict_retry(u32::MAX), RESYNC);
    }

    #[test]
    fn a_patch_names_the_version_it_was_worked_out_on() {
        use hostlb_api::annotations::{ANNOUNCING_IPV4 as V4, ANNOUNCING_IPV6 as V6};
        assert_eq!(
            annotations_patch(&[(V4, Some("n1,eth0".into()))], Some("42")),
            json!({"metadata": {"resourceVersion": "42", "annotations": {V4: "n1,eth0"}}})
        );
        assert_eq!(
            annotations_patch(&[(V4, None), (V6, Some("n1,eth0".into()))], None),
            json!({"metadata": {"annotations": {V4: null, V6: "n1,eth0"}}})
        );
    }
}
