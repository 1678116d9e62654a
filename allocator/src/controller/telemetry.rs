//! What the allocator tells the outside: Prometheus metrics on `/metrics`,
//! liveness on `/healthz` (the loop is turning) and readiness on `/readyz`
//! (every watch completed its first list).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use hostlb_api::runtime::admin::{self, Admin, Liveness};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::engine::{PoolReport, PoolState};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
    family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolStateLabels {
    pool: String,
}

pub struct Telemetry {
    registry: Mutex<Registry>,
    allocations: Counter,
    failures: Counter,
    events_dropped: Counter,
    leader: Gauge,
    services: Gauge,
    assigned: Family<PoolLabels, Gauge>,
    available: Family<PoolLabels, Gauge>,
    pool_ready: Family<PoolStateLabels, Gauge>,
    /// Pools with series, so a deleted pool's series go with it.
    pools: Mutex<std::collections::BTreeSet<String>>,
    ready: AtomicBool,
    liveness: Liveness,
}

impl Telemetry {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("hostlb_allocator");
        let t = Telemetry {
            registry: Mutex::new(Registry::default()),
            allocations: Counter::default(),
            failures: Counter::default(),
            events_dropped: Counter::default(),
            leader: Gauge::default(),
            services: Gauge::default(),
            assigned: Family::default(),
            available: Family::default(),
            pool_ready: Family::default(),
            pools: Mutex::new(Default::default()),
            ready: AtomicBool::new(false),
            liveness: Liveness::default(),
        };
        registry.register(
            "allocations",
            "Addresses handed to Services",
            t.allocations.clone(),
        );
        registry.register(
            "allocation_failures",
            "Services that could not get an address",
            t.failures.clone(),
        );
        registry.register(
            "events_dropped",
            "Events never written: too many waited for the API server, or for an hour",
            t.events_dropped.clone(),
        );
        registry.register(
            "leader",
            "Whether this replica holds the Lease and writes",
            t.leader.clone(),
        );
        registry.register(
            "services",
            "LoadBalancer Services handled",
            t.services.clone(),
        );
        registry.register(
            "pool_assigned_addresses",
            "Addresses assigned from the pool",
            t.assigned.clone(),
        );
        registry.register(
            "pool_available_addresses",
            "Addresses of the pool nobody holds",
            t.available.clone(),
        );
        registry.register(
            "pool_ready",
            "Whether the pool hands out new addresses",
            t.pool_ready.clone(),
        );
        *t.registry.lock().expect("fresh") = registry;
        Arc::new(t)
    }

    pub fn events_dropped(&self, n: u64) {
        self.events_dropped.inc_by(n);
    }

    pub fn allocated(&self) {
        self.allocations.inc();
    }

    pub fn failed(&self) {
        self.failures.inc();
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(leader as i64);
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    pub fn set_services(&self, n: usize) {
        self.services.set(n as i64);
    }

    pub fn beat(&self) {
        self.liveness.turned();
    }

    /// Whole seconds since the loop last turned (`/healthz` fails at
    /// [`STUCK_AFTER_SECS`](hostlb_api::runtime::admin::STUCK_AFTER_SECS)).
    pub fn silent_secs(&self) -> i64 {
        self.liveness.silent_secs()
    }

    pub fn set_pools(&self, reports: &[PoolReport]) {
        let clamp = |n: u128| i64::try_from(n).unwrap_or(i64::MAX);
        let now: std::collections::BTreeSet<String> =
            reports.iter().map(|r| r.name.clone()).collect();
        let mut known = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        for gone in known.difference(&now) {
            for family in ["IPv4", "IPv6"] {
                let l = PoolLabels {
                    pool: gone.clone(),
                    family: family.to_string(),
                };
                self.assigned.remove(&l);
                self.available.remove(&l);
            }
            self.pool_ready
                .remove(&PoolStateLabels { pool: gone.clone() });
        }
        *known = now;
        drop(known);
        for r in reports {
            for (i, family) in ["IPv4", "IPv6"].iter().enumerate() {
                let l = PoolLabels {
                    pool: r.name.clone(),
                    family: family.to_string(),
                };
                self.assigned.get_or_create(&l).set(clamp(r.assigned[i]));
                self.available.get_or_create(&l).set(clamp(r.available[i]));
            }
            self.pool_ready
                .get_or_create(&PoolStateLabels {
                    pool: r.name.clone(),
                })
                .set((r.state == PoolState::Ready) as i64);
        }
    }

    pub fn render(&self) -> String {
        admin::encode(&self.registry.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Admin for Telemetry {
    const LOOP: &'static str = "the control loop";
    fn metrics(&self) -> String {
        self.render()
    }
    fn liveness(&self) -> &Liveness {
        &self.liveness
    }
    fn not_ready(&self) -> Option<String> {
        (!self.is_ready()).then(|| {
            "not ready: waiting for the first list of every watch, a failing watch, or writes the API server refuses".to_string()
        })
    }
}

/// `/metrics`, `/healthz`, `/readyz`.
pub fn router(t: Arc<Telemetry>) -> Router {
    admin::router(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(name: &str) -> PoolReport {
        PoolReport {
            name: name.into(),
            state: PoolState::Ready,
            assigned: [3, 0],
            available: [5, 0],
        }
    }

    #[test]
    fn a_deleted_pool_loses_its_series() {
        let t = Telemetry::new();
        t.set_pools(&[report("a"), report("b")]);
        let text = t.render();
        assert!(text.contains(r#"pool="a""#) && text.contains(r#"pool="b""#));
        t.set_pools(&[report("b")]);
        let text = t.render();
        assert!(!text.contains(r#"pool="a""#), "{text}");
        assert!(
            text.contains(r#"hostlb_allocator_pool_available_addresses{pool="b",family="IPv4"} 5"#)
        );
    }

    /// `/metrics` says it is OpenMetrics, which is what it writes.
    #[tokio::test]
    async fn metrics_are_served_as_openmetrics() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(Telemetry::new())).await });
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        conn.read_to_string(&mut response).await.unwrap();
        let lower = response.to_ascii_lowercase();
        assert!(
            lower.contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{response}"
        );
        assert!(response.trim_end().ends_with("# EOF"), "{response}");
    }
}
