//! The Event writer both binaries use: a task of its own, so a loop never
//! waits for the API server to take an Event.
//!
//! An Event that cannot be written (the server away, a 403 while a
//! restarted server fills its RBAC caches) waits in a [`Backlog`] and is
//! written when the server answers again; a newer Event of the same reason
//! about the same object replaces the one waiting. Only what overflows it,
//! or waited an hour (Kubernetes expires Events after one), is dropped,
//! counted and logged. Writes go [`Settings::in_flight`] at a time through
//! a token [`Bucket`], so a failover that moves 1,000 VIPs is written in
//! seconds while a binary that keeps writing is held to a rate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::backlog::Backlog;

/// One Event to write.
pub struct Note {
    /// The object it is about, for coalescing and log lines
    /// (`namespace/name`, `IPAddressPool/name`).
    pub key: String,
    /// Its reason, one of the contract's constants: with `key`, what a
    /// newer Event replaces while both wait.
    pub reason: &'static str,
    pub event: Event,
    /// The object, or `None` to look it up by `key` when written: an
    /// object gone by then needs no Event any more.
    pub regarding: Option<ObjectReference>,
}

/// Looks an object up by [`Note::key`] when its Event is written.
pub type Resolve = Box<dyn Fn(&str) -> Option<ObjectReference> + Send>;

/// What the writer tells its binary.
pub trait Sink: Send + Sync + 'static {
    /// `n` Events will never be written.
    fn dropped(&self, n: usize);
    /// One write's outcome: `written`, and whether the server `answered`
    /// (see [`answered`]): readiness follows the latter.
    fn wrote(&self, written: bool, answered: bool);
}

/// How much the writer keeps and how fast it writes.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Events waiting, at most.
    pub capacity: usize,
    /// An Event that waited this long is dropped.
    pub max_age: Duration,
    /// Requests in flight at once.
    pub in_flight: usize,
    /// How soon a failed Event is tried again.
    pub retry: Duration,
    /// Writes per second sustained, and at once after a quiet spell.
    pub per_second: f64,
    pub burst: f64,
    /// A write that takes longer counts as failed.
    pub timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            capacity: 1024,
            max_age: Duration::from_secs(3600),
            in_flight: 8,
            retry: Duration::from_secs(1),
            per_second: 100.0,
            burst: 2000.0,
            timeout: Duration::from_secs(3),
        }
    }
}

/// How long a repeat of an Event counts in the first one's series, as
/// client-go and kube's own recorder count it.
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// Writes Events, a repeat within [`SERIES_TTL`] as a count on the first
/// (`series`), as kube's `Recorder` does. That one keeps a whole copy of
/// every Event it wrote for six minutes: after a cold start that took
/// 1,000 VIPs, about 3 MB, in a table that never shrinks. This keeps only
/// what a series patch needs: the Event's name and its count.
pub struct Recorder {
    client: kube::Client,
    reporter: Reporter,
    series: Mutex<HashMap<SeriesKey, Series>>,
}

/// What makes a repeat part of a series: the fields kube's recorder keys
/// on, the note aside (a series keeps its first note).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    warning: bool,
    action: String,
    reason: String,
    /// The object: its UID, or its kind, namespace and name.
    regarding: String,
    related: Option<String>,
}

#[derive(Clone, Debug)]
struct Series {
    namespace: String,
    name: String,
    count: i32,
    last: Instant,
}

fn object_key(r: &ObjectReference) -> String {
    match &r.uid {
        Some(uid) => uid.clone(),
        None => format!(
            "{}/{}/{}",
            r.kind.as_deref().unwrap_or_default(),
            r.namespace.as_deref().unwrap_or_default(),
            r.name.as_deref().unwrap_or_default()
        ),
    }
}

impl Recorder {
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Recorder {
            client,
            reporter,
            series: Mutex::new(HashMap::new()),
        }
    }

    /// Writes `ev` about `regarding`: a new Event, or the next count of the
    /// series it repeats.
    pub async fn publish(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = SeriesKey {
            warning: matches!(ev.type_, EventType::Warning),
            action: ev.action.clone(),
            reason: ev.reason.clone(),
            regarding: object_key(regarding),
            related: ev.secondary.as_ref().map(object_key),
        };
        let now = Instant::now();
        let repeat = self.repeat(&key, now);
        let stamp = Timestamp::now();
        let written = match repeat {
            Some(s) => {
                let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &s.namespace);
                let patch = json!({"series": EventSeries {
                    count: s.count + 1,
                    last_observed_time: MicroTime(stamp),
                }});
                match events
                    .patch(&s.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => Series {
                        count: s.count + 1,
                        last: now,
                        ..s
                    },
                    // The first Event is gone (expired, or deleted by
                    // hand): this one starts a series of its own.
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        self.create(ev, regarding, stamp, now).await?
                    }
                    Err(e) => return Err(e),
                }
            }
            None => self.create(ev, regarding, stamp, now).await?,
        };
        self.series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, written);
        Ok(())
    }

    async fn create(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
        stamp: Timestamp,
        now: Instant,
    ) -> Result<Series, kube::Error> {
        let event = self.event(ev, regarding, stamp);
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        events.create(&PostParams::default(), &event).await?;
        Ok(Series {
            namespace,
            name: event.metadata.name.unwrap_or_default(),
            count: 1,
            last: now,
        })
    }

    /// The series `key` continues, if it is recent; those that are not
    /// are forgotten.
    fn repeat(&self, key: &SeriesKey, now: Instant) -> Option<Series> {
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        series.retain(|_, s| now.saturating_duration_since(s.last) < SERIES_TTL);
        series.get(key).cloned()
    }

    fn event(&self, ev: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
        let controller = &self.reporter.controller;
        K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            note: ev.note.clone(),
            metadata: ObjectMeta {
                // An Event with `eventTime` must live in a namespace; the
                // API server takes those of cluster-scoped objects in
                // `default`.
                namespace: Some(
                    regarding
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                ),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            related: ev.secondary.clone(),
            ..Default::default()
        }
    }
}

/// Whether the server took the request: a success, or an answer about the
/// object itself (gone, conflicting), which a retry cannot mend and which
/// says nothing about the server. Refusals (403), throttling and server
/// errors, timeouts and connection errors do not count.
pub fn answered<T>(result: &Result<T, kube::Error>) -> bool {
    match result {
        Ok(_) => true,
        Err(kube::Error::Api(s)) => matches!(s.code, 404 | 409 | 410 | 422),
        Err(_) => false,
    }
}

/// A token bucket: `burst` writes at once, refilled at `per_second`.
#[derive(Debug)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
    per_second: f64,
    burst: f64,
}

impl Bucket {
    pub fn new(now: Instant, per_second: f64, burst: f64) -> Self {
        Bucket {
            tokens: burst,
            at: now,
            per_second,
            burst,
        }
    }

    /// Takes one token; how long to wait first when there is none.
    pub fn take(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.at = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.per_second)
        }
    }

    /// When a write could go now.
    pub fn ready_at(&self) -> Instant {
        if self.tokens >= 1.0 {
            self.at
        } else {
            self.at + Duration::from_secs_f64((1.0 - self.tokens) / self.per_second)
        }
    }

    /// Takes one token, waiting for it if need be.
    pub async fn pace(&mut self) {
        let wait = self.take(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// The handle a loop keeps; dropping it stops the writer.
pub struct Events {
    tx: mpsc::UnboundedSender<Note>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Events {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Events {
    /// Starts the writer.
    pub fn start(
        recorder: Recorder,
        resolve: Resolve,
        sink: Arc<dyn Sink>,
        settings: Settings,
    ) -> Events {
        // Unbounded, but the writer moves each Note at once into its
        // bounded, coalescing backlog.
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = Writer {
            recorder: Arc::new(recorder),
            resolve,
            sink,
            waiting: Backlog::new(settings.capacity, settings.max_age),
            bucket: Bucket::new(Instant::now(), settings.per_second, settings.burst),
            retry_at: Instant::now(),
            outage: false,
            settings,
        };
        Events {
            tx,
            task: tokio::spawn(writer.run(rx)),
        }
    }

    /// Hands an Event to the writer; never waits.
    pub fn send(&self, note: Note) {
        // The writer lives as long as this handle.
        let _ = self.tx.send(note);
    }
}

struct Writer {
    recorder: Arc<Recorder>,
    resolve: Resolve,
    sink: Arc<dyn Sink>,
    /// Events not written yet, by object and reason, oldest first.
    waiting: Backlog<(String, &'static str), Note>,
    bucket: Bucket,
    /// After a failed Event, the next is tried no sooner than this.
    retry_at: Instant,
    /// The last write failed: the rest of this outage logs at debug.
    outage: bool,
    settings: Settings,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Note>) {
        loop {
            tokio::select! {
                note = rx.recv() => match note {
                    Some(note) => {
                        let mut dropped = 0;
                        for n in std::iter::once(note).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                            dropped += self.waiting.push((n.key.clone(), n.reason), n, Instant::now());
                        }
                        self.dropped(dropped, "too many Events wait to be written");
                    }
                    None => return,
                },
                // A few at a time, paced, so new ones keep coming in.
                () = tokio::time::sleep_until(self.retry_at.max(self.bucket.ready_at()).into()),
                    if !self.waiting.is_empty() => self.write().await,
            }
        }
    }

    fn dropped(&self, n: usize, why: &str) {
        if n > 0 {
            self.sink.dropped(n);
            warn!(
                dropped = n,
                waiting = self.waiting.len(),
                "{why}; Events dropped"
            );
        }
    }

    /// Writes the oldest waiting Events, up to `in_flight` at once; if one
    /// fails, the next try waits `retry`. While the server refuses, one
    /// Event at a time tells whether it is back.
    async fn write(&mut self) {
        let mut batch = Vec::new();
        while batch.len() < self.settings.in_flight {
            let (next, expired) = self.waiting.pop(Instant::now());
            self.dropped(expired, "Events waited too long for the API server");
            let Some((_, note, since)) = next else { break };
            let Some(regarding) = note.regarding.clone().or_else(|| (self.resolve)(&note.key))
            else {
                continue;
            };
            self.bucket.pace().await;
            batch.push((note, since, regarding));
            if self.outage {
                break;
            }
        }
        let recorder = &self.recorder;
        let timeout = self.settings.timeout;
        let results =
            futures::future::join_all(batch.iter().map(|(note, _, regarding)| async move {
                tokio::time::timeout(timeout, recorder.publish(&note.event, regarding))
                    .await
                    .unwrap_or_else(|_| Err(kube::Error::Service("the write timed out".into())))
            }))
            .await;
        let mut failed = false;
        // Newest first: each failed one is put back in front of the queue.
        for ((note, since, _), result) in batch.into_iter().zip(results).rev() {
            self.sink.wrote(result.is_ok(), answered(&result));
            if let Err(e) = result {
                failed = true;
                let (key, reason) = (note.key.clone(), note.reason);
                if self.outage {
                    debug!(object = %key, reason, error = %e, "cannot write the Event; it waits for the API server");
                } else {
                    warn!(object = %key, reason, error = %e, "cannot write the Event; it waits for the API server");
                }
                let over = self.waiting.put_back((key, reason), note, since);
                self.dropped(over, "the queue of Events to write again is full");
            }
        }
        self.outage = failed;
        if failed {
            self.retry_at = Instant::now() + self.settings.retry;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_lets_a_burst_through_then_holds_the_rate() {
        let (rate, burst) = (100.0, 2000.0);
        let t0 = Instant::now();
        let mut b = Bucket::new(t0, rate, burst);
        for _ in 0..burst as usize {
            assert_eq!(b.take(t0), Duration::ZERO);
        }
        // Empty: the next write waits for one token's refill.
        let wait = b.take(t0);
        assert_eq!(wait, Duration::from_secs_f64(1.0 / rate));
        // A second later, a second's worth of writes goes at once (less the
        // one owed), and no more.
        let t1 = t0 + Duration::from_secs(1);
        let free = (0..1000).take_while(|_| b.take(t1).is_zero()).count();
        assert_eq!(free, rate as usize - 1);
        assert!(b.ready_at() > t1);
        // A long quiet spell refills it to the burst, not beyond.
        let t2 = t1 + Duration::from_secs(3600);
        let free = (0..10_000).take_while(|_| b.take(t2).is_zero()).count();
        assert_eq!(free, burst as usize);
    }

    #[test]
    fn only_answers_about_the_object_count_as_the_server_answering() {
        let api = |code| {
            Err::<(), _>(kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            ))
        };
        assert!(answered(&Ok::<(), kube::Error>(())));
        for code in [404, 409, 410, 422] {
            assert!(answered(&api(code)), "{code}");
        }
        for code in [403, 429, 500, 503] {
            assert!(!answered(&api(code)), "{code}");
        }
    }
}
