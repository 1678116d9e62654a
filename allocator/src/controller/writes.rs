//! Writes to the API: Service status, pools' and advertisements' status, in bounded batches with deadlines, and what was written so a stale echo is not written again.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use hostlb_api::L2Advertisement;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tracing::{info, warn};

use super::status;
use super::{Loop, Timing};

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

    pub(super) async fn write_advertisement(&mut self, ad: &L2Advertisement) {
        let deadline = write_deadline(self.timing);
        match bounded(
            deadline,
            status::write_advertisement(&self.client, ad, deadline),
        )
        .await
        {
            Ok(Some(problem)) => {
                use kube::Resource;
                let key = format!("L2Advertisement/{}", ad.name_any());
                self.report_invalid(&key, problem, ad.object_ref(&()));
            }
            Ok(None) => {}
            Err(e) => {
                warn!(advertisement = %ad.name_any(), error = %e, "writing advertisement status failed; retrying");
                self.statuses_dirty = true;
            }
        }
    }

    pub(super) async fn write_advertisements(&mut self) {
        if self.ledger.is_none() || !self.leader || !self.lease_holds().await {
            return;
        }
        for ad in self.stores.advertisements.state() {
            if !self.lease_holds().await {
                self.statuses_dirty = true;
                return;
            }
            self.write_advertisement(&ad).await;
        }
    }

    /// Make the cluster match the ledger for `keys`, then the pool statuses.
    ///
    /// Writes go in batches of [`WRITE_BATCH`], [`WRITES_IN_FLIGHT`] at a
    /// time: one after another, a cold start over 2,000 Services waits on
    /// 2,000 round trips. Each batch starts only after the Lease is
    /// confirmed, and every write in it shares the deadline that
    /// confirmation covers, so none can land after another replica could
    /// take over. A batch holds each Service once, so the concurrent writes
    /// never touch one object twice.
    pub(super) async fn write(&mut self, keys: BTreeSet<String>) {
        if self.ledger.is_none() || !self.leader {
            return;
        }
        let mut refusals = self.ledger.as_mut().expect("checked").take_refusals();
        let mut keys = keys.into_iter().peekable();
        while keys.peek().is_some() {
            if !self.lease_holds().await {
                self.dirty.extend(keys);
                self.statuses_dirty = true;
                return;
            }
            let deadline = write_deadline(self.timing);
            let mut batch = Vec::new();
            for key in keys.by_ref().take(WRITE_BATCH) {
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
                batch.push((key, svc, before, answer, terms));
            }
            let client = &self.client;
            let results: Vec<_> = futures::stream::iter(batch)
                .map(|(key, svc, before, answer, terms)| async move {
                    let result = bounded(
                        deadline,
                        status::write_service(
                            client,
                            &svc,
                            &before,
                            answer.as_ref(),
                            terms,
                            deadline,
                        ),
                    )
                    .await;
                    (key, svc, before, answer, result)
                })
                .buffer_unordered(WRITES_IN_FLIGHT)
                .collect()
                .await;
            for (key, svc, before, answer, result) in results {
                match result {
                    Ok((after, rv)) => {
                        self.wrote(true);
                        let assigned = after.ips != before.ips && !after.ips.is_empty();
                        if after != status::Shown::of(&svc) {
                            self.written.insert(
                                key.clone(),
                                Written {
                                    shown: after,
                                    rv,
                                    before_rv: svc.metadata.resource_version.clone(),
                                },
                            );
                        }
                        self.report(&svc, &key, answer.as_ref(), assigned);
                    }
                    Err(e) => {
                        warn!(service = %key, error = %e, "writing status failed; retrying");
                        self.wrote(false);
                        self.dirty.insert(key.clone());
                        self.report(&svc, &key, answer.as_ref(), false);
                    }
                }
            }
        }
        self.write_pools().await;
    }

    pub(super) async fn write_pools(&mut self) {
        let Some(ledger) = &self.ledger else { return };
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
        for p in self.stores.pools.state() {
            if !self.lease_holds().await {
                self.statuses_dirty = true;
                break;
            }
            let Some(r) = reports.iter().find(|r| r.name == p.name_any()) else {
                continue;
            };
            let deadline = write_deadline(self.timing);
            let in_use = in_use.get(&r.name).map(Vec::as_slice).unwrap_or_default();
            match bounded(
                deadline,
                status::write_pool(&self.client, &p, r, in_use, deadline),
            )
            .await
            {
                Ok(Some(problem)) => {
                    use kube::Resource;
                    let key = format!("IPAddressPool/{}", p.name_any());
                    self.report_invalid(&key, problem, p.object_ref(&()));
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(pool = %r.name, error = %e, "writing pool status failed; retrying");
                    self.statuses_dirty = true;
                }
            }
        }
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
