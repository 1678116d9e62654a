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
//! An Event that cannot be written (the API server away, a 403 while a
//! restarted server fills its RBAC caches) waits in a [`Backlog`] (1,024
//! at most) and is written when the server answers again; a newer Event of
//! the same reason for the same Service replaces the one waiting. Only what
//! overflows it, or waited an hour (Events themselves expire after one), is
//! dropped, counted and logged.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hostlb_api::backlog::Backlog;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::telemetry::Telemetry;

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
/// Events waiting to be written, at most: a failover of 1,000 VIPs makes
/// two for each (one per node), and one per Service and reason is kept.
const EVENTS_WAITING: usize = 4096;
/// An Event that waited this long is dropped: Kubernetes would already have
/// expired it.
const EVENT_MAX_AGE: Duration = Duration::from_secs(3600);
/// How soon a failed Event is tried again.
const EVENT_RETRY: Duration = Duration::from_secs(1);
/// With no write in this long, the writer asks the server for its version
/// (one cheap GET over a new or pooled connection) to learn whether it
/// still takes requests: at 1,000 agents, 200 requests a second at most.
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// A probe or write that takes longer counts as failed.
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);

pub use super::core::{Announcing, EventRequest};

/// Whether the server took the request: a success, or an answer about the
/// object itself (gone, conflicting), which a retry cannot mend and which
/// says nothing about the server. Refusals (403), throttling and server
/// errors, timeouts and connection errors do not count.
fn took<T>(result: &Result<T, kube::Error>) -> bool {
    match result {
        Ok(_) => true,
        Err(kube::Error::Api(s)) => matches!(s.code, 404 | 409 | 410 | 422),
        Err(_) => false,
    }
}

/// Handles to the writer task.
pub struct ReportHandle {
    pub announcing: watch::Sender<Announcing>,
    pub events: mpsc::UnboundedSender<EventRequest>,
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
    pub fn event(&self, telemetry: &Telemetry, req: EventRequest) {
        if self.events.send(req).is_err() {
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
    // Unbounded, but the writer moves each Event at once into its bounded,
    // coalescing backlog.
    let (events, events_rx) = mpsc::unbounded_channel();
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
        bucket: Bucket::new(Instant::now()),
        waiting: Backlog::new(EVENTS_WAITING, EVENT_MAX_AGE),
        retry_at: Instant::now(),
        last_answer: Instant::now(),
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

/// A token bucket: [`WRITE_BURST`] writes at once, refilled at
/// [`WRITES_PER_SECOND`].
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(now: Instant) -> Self {
        Bucket {
            tokens: WRITE_BURST,
            at: now,
        }
    }

    /// Takes one token; how long to wait first when there is none.
    fn take(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * WRITES_PER_SECOND).min(WRITE_BURST);
        self.at = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / WRITES_PER_SECOND)
        }
    }

    /// When a write could go now.
    fn ready_at(&self) -> Instant {
        if self.tokens >= 1.0 {
            self.at
        } else {
            self.at + Duration::from_secs_f64((1.0 - self.tokens) / WRITES_PER_SECOND)
        }
    }
}

struct Writer {
    client: Client,
    services: Store<Service>,
    recorder: Recorder,
    telemetry: Arc<Telemetry>,
    written: HashMap<(String, &'static str), Written>,
    bucket: Bucket,
    /// Events not written yet, by Service and reason, oldest first.
    waiting: Backlog<(String, &'static str), EventRequest>,
    /// After a failed Event, the next is tried no sooner than this.
    retry_at: Instant,
    /// When the server last took a write or answered a probe.
    last_answer: Instant,
}

impl Writer {
    async fn run(
        mut self,
        mut announcing: watch::Receiver<Announcing>,
        mut events: mpsc::UnboundedReceiver<EventRequest>,
    ) {
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
                ev = events.recv() => match ev {
                    Some(ev) => {
                        let mut dropped = 0;
                        for ev in std::iter::once(ev).chain(std::iter::from_fn(|| events.try_recv().ok())) {
                            let key = (ev.service.clone(), ev.reason);
                            dropped += self.waiting.push(key, ev, Instant::now());
                        }
                        self.dropped(dropped, "too many Events wait to be written");
                        continue;
                    }
                    None => return,
                },
                // A few Events at a time, paced, so new ones keep coming in.
                () = tokio::time::sleep_until(self.retry_at.max(self.bucket.ready_at()).into()),
                    if !self.waiting.is_empty() =>
                {
                    self.write_events().await;
                    continue;
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
            }
            let want = announcing.borrow_and_update().clone();
            self.annotate(&want).await;
        }
    }

    /// The cached Service `namespace/name`.
    fn cached(&self, key: &str) -> Option<Arc<Service>> {
        let (ns, name) = key.split_once('/')?;
        self.services
            .get(&kube::runtime::reflector::ObjectRef::new(name).within(ns))
    }

    async fn pace(&mut self) {
        let wait = self.bucket.take(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    async fn annotate(&mut self, want: &Announcing) {
        let now = Instant::now();
        self.written
            .retain(|_, (_, _, at)| now - *at < WRITTEN_GRACE);
        let mut jobs = Vec::new();
        for ((key, name_of), value) in want {
            let name_of = *name_of;
            let Some(svc) = self.cached(key) else {
                continue;
            };
            let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
            let current = svc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(name_of))
                .cloned();
            if current == *value {
                continue;
            }
            let k = (key.clone(), name_of);
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
            jobs.push((k, ns, name, name_of, value.clone(), version));
        }
        for chunk in jobs.chunks(IN_FLIGHT) {
            for _ in chunk {
                self.pace().await;
            }
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let results =
                futures::future::join_all(chunk.iter().map(|(_, ns, name, name_of, value, _)| {
                    let api: Api<Service> = Api::namespaced(self.client.clone(), ns);
                    let patch = json!({"metadata": {"annotations": {*name_of: value}}});
                    let params = &params;
                    async move {
                        tokio::time::timeout(
                            WRITE_TIMEOUT,
                            api.patch(name, params, &Patch::Merge(&patch)),
                        )
                        .await
                        .unwrap_or_else(|_| Err(kube::Error::Service("the write timed out".into())))
                    }
                }))
                .await;
            for ((k, _, _, name_of, value, version), result) in chunk.iter().zip(results) {
                self.answered(took(&result));
                let key = &k.0;
                match result {
                    Ok(_) => {
                        self.telemetry.write("annotate", true);
                        debug!(service = %key, annotation = name_of, value = ?value, "annotated");
                        self.written
                            .insert(k.clone(), (value.clone(), version.clone(), Instant::now()));
                    }
                    Err(e) => {
                        self.telemetry.write("annotate", false);
                        warn!(service = %key, annotation = name_of, error = %e, "cannot write the annotation; retrying");
                    }
                }
            }
        }
    }

    /// Notes whether the server took a request, for `/readyz`.
    fn answered(&mut self, ok: bool) {
        if ok {
            self.last_answer = Instant::now();
        }
        let was = self
            .telemetry
            .api_writable
            .swap(ok, std::sync::atomic::Ordering::Relaxed);
        if was && !ok {
            warn!("the API server does not take requests; degraded until it does");
        } else if !was && ok {
            tracing::info!("the API server takes requests again");
        }
    }

    fn dropped(&self, n: usize, why: &str) {
        if n > 0 {
            self.telemetry.events_dropped.inc_by(n as u64);
            warn!(
                dropped = n,
                waiting = self.waiting.len(),
                "{why}; Events dropped"
            );
        }
    }

    /// Writes the oldest waiting Events, up to [`IN_FLIGHT`] at once; if
    /// one fails, the next try waits [`EVENT_RETRY`].
    async fn write_events(&mut self) {
        let mut batch = Vec::new();
        while batch.len() < IN_FLIGHT {
            let (next, expired) = self.waiting.pop(Instant::now());
            self.dropped(expired, "Events waited an hour for the API server");
            let Some((_, req, since)) = next else { break };
            // A Service gone from the cache needs no Event any more.
            let Some(svc) = self.cached(&req.service) else {
                continue;
            };
            self.pace().await;
            let ev = Event {
                type_: if req.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: req.reason.into(),
                note: Some(req.note.clone()),
                action: "Announce".into(),
                secondary: None,
            };
            batch.push((req, since, ev, svc.object_ref(&())));
            // Only the first try of an outage is paid in full: while the
            // server refuses, one Event at a time tells whether it is back.
            if self.retry_at > since {
                break;
            }
        }
        let recorder = &self.recorder;
        let results =
            futures::future::join_all(batch.iter().map(|(_, _, ev, regarding)| async move {
                tokio::time::timeout(WRITE_TIMEOUT, recorder.publish(ev, regarding))
                    .await
                    .unwrap_or_else(|_| Err(kube::Error::Service("the write timed out".into())))
            }))
            .await;
        let mut failed = false;
        // Newest first: each failed one is put back in front of the queue.
        for ((req, since, _, _), result) in batch.into_iter().zip(results).rev() {
            let retrying = self.retry_at > since;
            failed |= !self.written_or_waits(req, since, retrying, result);
        }
        if failed {
            self.retry_at = Instant::now() + EVENT_RETRY;
        }
    }

    /// Notes the outcome of one Event; on failure it waits in the queue
    /// (first failed at `since`). Whether it was written. The first failure
    /// of an outage is a warning, the rest are debug lines.
    fn written_or_waits(
        &mut self,
        req: EventRequest,
        since: Instant,
        retrying: bool,
        result: Result<(), kube::Error>,
    ) -> bool {
        let was_writable = self
            .telemetry
            .api_writable
            .load(std::sync::atomic::Ordering::Relaxed);
        self.answered(took(&result));
        self.telemetry.write("event", result.is_ok());
        match result {
            Ok(()) => true,
            Err(e) => {
                // Once per outage; the rest of its failures are debug lines.
                let first = !retrying && was_writable;
                let service = req.service.clone();
                let reason = req.reason;
                if first {
                    warn!(%service, reason, error = %e, "cannot write the Event; it waits for the API server");
                } else {
                    debug!(%service, reason, error = %e, "cannot write the Event; it waits for the API server");
                }
                let key = (req.service.clone(), req.reason);
                let over = self.waiting.put_back(key, req, since);
                self.dropped(over, "the queue of Events to write again is full");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_lets_a_burst_through_then_holds_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        for _ in 0..WRITE_BURST as usize {
            assert_eq!(b.take(t0), Duration::ZERO);
        }
        // Empty: the next write waits for one token's refill.
        let wait = b.take(t0);
        assert_eq!(wait, Duration::from_secs_f64(1.0 / WRITES_PER_SECOND));
        // A second later, a second's worth of writes goes at once (less the
        // one owed), and no more.
        let t1 = t0 + Duration::from_secs(1);
        let free = (0..1000).take_while(|_| b.take(t1).is_zero()).count();
        assert_eq!(free, WRITES_PER_SECOND as usize - 1);
        assert!(b.ready_at() > t1);
        // A long quiet spell refills it to the burst, not beyond.
        let t2 = t1 + Duration::from_secs(3600);
        let free = (0..10_000).take_while(|_| b.take(t2).is_zero()).count();
        assert_eq!(free, WRITE_BURST as usize);
    }
}
