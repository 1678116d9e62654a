//! Writes to the API: Service status, pools' and advertisements' status,
//! in rounds off the loop (results come back as an input, as the agent's
//! kernel batches do), in bounded batches with deadlines; and what was
//! written, so a stale echo is not written again.

use std::collections::BTreeSet;
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use hostlb_api::{IPAddressPool, L2Advertisement};
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use tracing::{info, warn};

use super::lease::LeaseGuard;
use super::status;
use super::{Loop, Timing};
use crate::engine::PoolReport;
use crate::ledger::Answer;

impl Loop {
    /// Notes whether the server took a write (or an Event).
    pub(super) fn wrote(&mut self, ok: bool) {
        if ok {
            self.last_write = std::time::Instant::now();
        }
        if ok != self.writes_ok {
            self.writes_ok = ok;
            if ok {
                info!("the API server takes writes again");
            } else {
                warn!("the API server refuses writes; not ready until it takes one");
            }
            self.update_ready();
        }
    }

    /// Services (by key) to write, with the pool statuses after them.
    /// The writes go in a [`Round`] off the loop: it goes on taking
    /// events while they are in flight.
    pub(super) fn write(&mut self, keys: BTreeSet<String>) {
        if self.ledger.is_none() || !self.leader {
            return;
        }
        self.pending.extend(keys);
        self.pools_due = true;
        self.start_round();
    }

    pub(super) fn write_pools(&mut self) {
        self.pools_due = true;
        self.start_round();
    }

    pub(super) fn write_advertisements(&mut self) {
        self.ads_due = true;
        self.start_round();
    }

    /// The next round, unless one is in flight (one at a time, so two
    /// writes never touch one object at once and each starts from what
    /// the last one left).
    pub(super) fn start_round(&mut self) {
        if self.round || self.ledger.is_none() || !self.leader {
            return;
        }
        if self.pending.is_empty() && !self.pools_due && !self.ads_due {
            return;
        }
        let mut services = Vec::new();
        let mut refusals = self.ledger.as_mut().expect("checked").take_refusals();
        for key in std::mem::take(&mut self.pending) {
            let Some((ns, name)) = key.split_once('/') else {
                continue;
            };
            let Some(svc) = self.stores.services.get(&ObjectRef::new(name).within(ns)) else {
                continue;
            };
            let ledger = self.ledger.as_ref().expect("checked");
            if ledger.undecided(&key) {
                // Its namespace is not known yet; its status stays as it is.
                continue;
            }
            let answer = ledger.answer(&key).cloned();
            if let Some(r) = refusals.remove(&key) {
                self.report_refusal(&svc, &key, &r);
            }
            let before = self
                .overlay(&svc)
                .unwrap_or_else(|| status::Shown::of(&svc));
            let terms = crate::inputs::service_request(&svc).sharing_terms();
            // Until the round is back, what it writes is what the Service
            // shows (an event meanwhile carries the old status).
            self.in_flight.insert(
                key.clone(),
                status::Shown::of_answer(answer.as_ref(), terms.clone()),
            );
            services.push(ServiceWrite {
                key,
                svc,
                before,
                answer,
                terms,
            });
        }
        let pools = if std::mem::take(&mut self.pools_due) {
            self.pool_writes()
        } else {
            Vec::new()
        };
        let advertisements = if std::mem::take(&mut self.ads_due) {
            self.stores.advertisements.state()
        } else {
            Vec::new()
        };
        let round = Round {
            epoch: self.epoch,
            services,
            pools,
            advertisements,
            stopping: self.stopping.clone(),
        };
        self.round = true;
        let client = self.client.clone();
        let timing = self.timing;
        let guard = self.guard.take();
        let tx = self.rounds.clone();
        tokio::spawn(async move {
            let done = round.run(client, timing, guard).await;
            let _ = tx.send(done);
        });
    }

    /// The pools' statuses as the ledger and the records say now.
    fn pool_writes(&mut self) -> Vec<PoolWrite> {
        let Some(ledger) = &self.ledger else {
            return Vec::new();
        };
        let reports = ledger.report();
        self.telemetry.set_pools(&reports);
        self.telemetry.set_services(ledger.len());
        // Addresses another host answers for, by the pool holding them.
        let mut in_use: std::collections::HashMap<String, Vec<(String, String, String)>> =
            std::collections::HashMap::new();
        for (address, (node, mac)) in &self.in_use {
            if let Some(pool) = address.parse().ok().and_then(|ip| ledger.pool_holding(ip)) {
                in_use.entry(pool.to_string()).or_default().push((
                    address.clone(),
                    node.clone(),
                    mac.clone(),
                ));
            }
        }
        self.stores
            .pools
            .state()
            .into_iter()
            .filter_map(|pool| {
                let report = reports.iter().find(|r| r.name == pool.name_any())?.clone();
                let in_use = in_use.remove(&report.name).unwrap_or_default();
                Some(PoolWrite {
                    pool,
                    report,
                    in_use,
                })
            })
            .collect()
    }

    /// A round is back: what it wrote is remembered until the cache shows
    /// it, what failed is tried again soon, and the next round starts with
    /// what came meanwhile.
    pub(super) fn round_done(&mut self, done: Done) {
        self.guard = done.guard;
        self.round = false;
        let current = done.epoch == self.epoch && self.ledger.is_some();
        if !current {
            // Written for a lease this replica no longer holds: only
            // whether the server took writes counts.
            if let Some(g) = &mut self.guard {
                g.confirmed = None;
            }
            for (_, result) in &done.services {
                self.wrote(result.is_ok());
            }
            self.start_round();
            return;
        }
        for (w, result) in done.services {
            self.in_flight.remove(&w.key);
            match result {
                Ok((after, rv)) => {
                    self.wrote(true);
                    let assigned = after.ips != w.before.ips && !after.ips.is_empty();
                    if after != status::Shown::of(&w.svc) {
                        self.written.insert(
                            w.key.clone(),
                            Written {
                                shown: after,
                                rv,
                                before_rv: w.svc.metadata.resource_version.clone(),
                            },
                        );
                    }
                    self.report(&w.svc, &w.key, w.answer.as_ref(), assigned);
                }
                Err(e) => {
                    warn!(service = %w.key, error = %e, "writing status failed; retrying");
                    self.wrote(false);
                    self.dirty.insert(w.key.clone());
                    self.report(&w.svc, &w.key, w.answer.as_ref(), false);
                }
            }
        }
        for key in done.unwritten {
            self.in_flight.remove(&key);
            self.dirty.insert(key);
        }
        if done.statuses_failed {
            self.statuses_dirty = true;
        }
        for (key, problem, regarding) in done.invalid {
            self.report_invalid(&key, problem, regarding);
        }
        self.start_round();
    }
}

/// One Service's write, with what it was decided from.
pub(super) struct ServiceWrite {
    key: String,
    svc: Arc<Service>,
    before: status::Shown,
    answer: Option<Answer>,
    terms: Option<String>,
}

pub(super) struct PoolWrite {
    pool: Arc<IPAddressPool>,
    report: PoolReport,
    in_use: Vec<(String, String, String)>,
}

/// Writes that go out together, off the loop, in the order the loop would
/// have made them: Services, then pools, then advertisements.
pub(super) struct Round {
    /// The loop's lease epoch when the round was made: a round that
    /// comes back after the Lease was lost decides nothing.
    epoch: u64,
    services: Vec<ServiceWrite>,
    pools: Vec<PoolWrite>,
    advertisements: Vec<Arc<L2Advertisement>>,
    /// Set at shutdown: no batch starts after it, so the Lease is
    /// released once the one in flight is over.
    stopping: Arc<AtomicBool>,
}

/// What a Service shows after its write, and the resourceVersion written.
type ServiceResult = Result<(status::Shown, Option<String>), kube::Error>;

/// What a [`Round`] did.
pub(super) struct Done {
    epoch: u64,
    /// The Lease guard, lent to the round (it confirms the Lease before
    /// each batch) and handed back.
    guard: Option<LeaseGuard>,
    services: Vec<(ServiceWrite, ServiceResult)>,
    /// Services not tried: the Lease could not be confirmed.
    unwritten: Vec<String>,
    /// A pool or advertisement status was not written.
    statuses_failed: bool,
    /// Objects found invalid by their write: key, problem, object.
    invalid: Vec<(String, String, ObjectReference)>,
}

impl Done {
    /// A pool's or advertisement's status write is back: the problem it
    /// found is reported, a failure retried.
    fn status_written<K>(
        &mut self,
        what: &str,
        object: &K,
        result: Result<Option<String>, kube::Error>,
    ) where
        K: Resource<DynamicType = ()>,
    {
        let key = format!("{}/{}", K::kind(&()), object.name_any());
        match result {
            Ok(Some(problem)) => self.invalid.push((key, problem, object.object_ref(&()))),
            Ok(None) => {}
            Err(e) => {
                warn!(object = %key, error = %e, "writing {what} status failed; retrying");
                self.statuses_failed = true;
            }
        }
    }
}

impl Round {
    /// Writes go in batches of [`WRITE_BATCH`], [`WRITES_IN_FLIGHT`] at a
    /// time: one after another, a cold start over 2,000 Services waits on
    /// 2,000 round trips. Each batch starts only after the Lease is
    /// confirmed, and every write in it shares the deadline that
    /// confirmation covers, so none can land after another replica could
    /// take over. A batch holds each Service once, so the concurrent writes
    /// never touch one object twice.
    async fn run(self, client: Client, timing: Timing, mut guard: Option<LeaseGuard>) -> Done {
        let mut done = Done {
            epoch: self.epoch,
            guard: None,
            services: Vec::new(),
            unwritten: Vec::new(),
            statuses_failed: false,
            invalid: Vec::new(),
        };
        let mut services = self.services.into_iter().peekable();
        while services.peek().is_some() {
            if !holds(&mut guard, &self.stopping).await {
                done.unwritten.extend(services.map(|w| w.key));
                done.statuses_failed = true;
                done.guard = guard;
                return done;
            }
            let deadline = write_deadline(timing);
            let batch: Vec<ServiceWrite> = services.by_ref().take(WRITE_BATCH).collect();
            let client = &client;
            let results: Vec<_> = futures::stream::iter(batch)
                .map(|w| async move {
                    let result = bounded(
                        deadline,
                        status::write_service(
                            client,
                            &w.svc,
                            &w.before,
                            w.answer.as_ref(),
                            w.terms.clone(),
                            deadline,
                        ),
                    )
                    .await;
                    (w, result)
                })
                .buffer_unordered(WRITES_IN_FLIGHT)
                .collect()
                .await;
            done.services.extend(results);
        }
        for w in &self.pools {
            if !holds(&mut guard, &self.stopping).await {
                done.statuses_failed = true;
                break;
            }
            let deadline = write_deadline(timing);
            let result = bounded(
                deadline,
                status::write_pool(&client, &w.pool, &w.report, &w.in_use, deadline),
            )
            .await;
            done.status_written("pool", &*w.pool, result);
        }
        for ad in &self.advertisements {
            if !holds(&mut guard, &self.stopping).await {
                done.statuses_failed = true;
                break;
            }
            let deadline = write_deadline(timing);
            let result =
                bounded(deadline, status::write_advertisement(&client, ad, deadline)).await;
            done.status_written("advertisement", &**ad, result);
        }
        done.guard = guard;
        done
    }
}

/// Writes go out only while the Lease is surely ours (always, without
/// leader election), and not once the replica is stopping.
async fn holds(guard: &mut Option<LeaseGuard>, stopping: &AtomicBool) -> bool {
    if stopping.load(Ordering::Relaxed) {
        return false;
    }
    match guard {
        Some(g) => g.holds().await,
        None => true,
    }
}

/// Writes the allocator has in flight at once. The API server takes them in
/// parallel; more would only queue there and compete with everything else
/// it serves.
pub(super) const WRITES_IN_FLIGHT: usize = 32;

/// Services written per Lease confirmation: two rounds of requests, well
/// within the deadline they share on a slow server too.
pub(super) const WRITE_BATCH: usize = 2 * WRITES_IN_FLIGHT;

/// The longest a write may take, whatever the Lease duration.
pub(super) const MAX_WRITE: Duration = Duration::from_secs(5);

/// When a write started now must be done, on both sides.
pub(super) fn write_deadline(timing: Timing) -> tokio::time::Instant {
    tokio::time::Instant::now() + timing.write
}

/// `write`, failed if it is not done by `deadline` (the server was told the
/// same, so it does not apply it later either).
pub(super) async fn bounded<T>(
    deadline: tokio::time::Instant,
    write: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    tokio::time::timeout_at(deadline, write)
        .await
        .unwrap_or_else(|_| Err(kube::Error::Service("no answer in time".into())))
}

/// What we wrote to a Service before the cache showed it.
pub(super) struct Written {
    pub(super) shown: status::Shown,
    /// resourceVersion our last write returned.
    pub(super) rv: Option<String>,
    /// resourceVersion of the cached object when we wrote.
    pub(super) before_rv: Option<String>,
}

impl Written {
    /// The cached object is at least as new as our write, so it is the
    /// truth again (someone may have changed it after us). resourceVersions
    /// are compared as numbers when both are (etcd revisions); otherwise any
    /// version other than the one we wrote over counts as newer.
    pub(super) fn superseded_by(&self, svc: &Service) -> bool {
        let cached = svc.metadata.resource_version.as_deref();
        let as_num = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok());
        match (as_num(cached), as_num(self.rv.as_deref())) {
            (Some(c), Some(w)) => c >= w,
            _ => cached != self.before_rv.as_deref(),
        }
    }
}
