//! The admin server both binaries serve: `/metrics` in OpenMetrics text,
//! `/healthz` (the loop is turning) and `/readyz` (the binary can do its
//! job). A binary adds its own routes (the agent's `/status`) by merging a
//! router of its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

/// What `/metrics` says it serves. prometheus_client writes OpenMetrics
/// text (ending in `# EOF`); without this a scraper parses it as the older
/// format.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A loop that has not turned for this long is stuck: `/healthz` fails and
/// the supervisor (kubelet, systemd's watchdog) restarts the process. Long
/// enough that no healthy loop comes near it: every loop wakes at least
/// once a second.
pub const STUCK_AFTER_SECS: i64 = 30;

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// When the loop last turned, read by `/healthz` from another task.
#[derive(Debug)]
pub struct Liveness(AtomicI64);

impl Default for Liveness {
    fn default() -> Self {
        Liveness(AtomicI64::new(unix_now()))
    }
}

impl Liveness {
    /// The loop turned now.
    pub fn turned(&self) {
        self.0.store(unix_now(), Ordering::Relaxed);
    }

    pub fn alive(&self) -> bool {
        self.silent_secs() < STUCK_AFTER_SECS
    }

    /// Whole seconds since the loop last turned.
    pub fn silent_secs(&self) -> i64 {
        unix_now() - self.0.load(Ordering::Relaxed)
    }
}

/// `registry` as OpenMetrics text, ending in `# EOF\n`.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

/// What a binary tells its admin server.
pub trait Admin: Send + Sync + 'static {
    /// The name `/healthz` gives the loop when it is stuck.
    const LOOP: &'static str;
    /// The whole `/metrics` body, OpenMetrics text.
    fn metrics(&self) -> String;
    fn liveness(&self) -> &Liveness;
    /// Why the binary is not ready, or `None` when it is.
    fn not_ready(&self) -> Option<String>;
    /// Lines added to a ready answer: conditions that do not stop the
    /// binary serving but need an operator.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
}

/// `/metrics`, `/healthz` and `/readyz` over `admin`.
pub fn router<A: Admin>(admin: Arc<A>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(a): State<Arc<A>>| async move {
                ([("content-type", OPENMETRICS)], a.metrics())
            }),
        )
        .route(
            "/healthz",
            get(|State(a): State<Arc<A>>| async move {
                if a.liveness().alive() {
                    (StatusCode::OK, "ok".to_string()).into_response()
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("{} is stuck", A::LOOP),
                    )
                        .into_response()
                }
            }),
        )
        .route(
            "/readyz",
            get(|State(a): State<Arc<A>>| async move {
                match a.not_ready() {
                    None => {
                        let mut body = "ok".to_string();
                        for w in a.warnings() {
                            body.push_str("\nwarning: ");
                            body.push_str(&w);
                        }
                        (StatusCode::OK, body).into_response()
                    }
                    Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
                }
            }),
        )
        .with_state(admin)
}

/// Binds `listen` (an error names the address) and serves `router` on a
/// task of its own; a server that stops later is logged, the binary goes on.
pub async fn serve(listen: SocketAddr, router: Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("listening on {listen}: {e}")))?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "the admin server stopped");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    struct Fake {
        liveness: Liveness,
        ready: AtomicBool,
    }

    impl Admin for Fake {
        const LOOP: &'static str = "the fake loop";
        fn metrics(&self) -> String {
            let mut r = Registry::default();
            let c = prometheus_client::metrics::counter::Counter::<u64>::default();
            c.inc();
            r.register("things", "Things", c);
            encode(&r)
        }
        fn liveness(&self) -> &Liveness {
            &self.liveness
        }
        fn not_ready(&self) -> Option<String> {
            (!self.ready.load(Ordering::Relaxed)).then(|| "not yet".to_string())
        }
        fn warnings(&self) -> Vec<String> {
            vec!["mind the gap".into()]
        }
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut response = String::new();
        conn.read_to_string(&mut response).await.unwrap();
        response
    }

    /// The three routes answer from what the binary says: OpenMetrics
    /// with its content type, a stuck loop named, readiness and warnings.
    #[tokio::test]
    async fn the_routes_answer_from_the_binary() {
        let fake = Arc::new(Fake {
            liveness: Liveness::default(),
            ready: AtomicBool::new(false),
        });
        let addr = serve("127.0.0.1:0".parse().unwrap(), router(fake.clone()))
            .await
            .unwrap();
        let metrics = get(addr, "/metrics").await;
        assert!(
            metrics
                .to_ascii_lowercase()
                .contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{metrics}"
        );
        assert!(metrics.contains("things_total 1"), "{metrics}");
        assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.0 200"));
        let not_ready = get(addr, "/readyz").await;
        assert!(
            not_ready.starts_with("HTTP/1.0 503") && not_ready.ends_with("not yet"),
            "{not_ready}"
        );
        fake.ready.store(true, Ordering::Relaxed);
        let ready = get(addr, "/readyz").await;
        assert!(
            ready.starts_with("HTTP/1.0 200") && ready.ends_with("ok\nwarning: mind the gap"),
            "{ready}"
        );
        fake.liveness
            .0
            .store(unix_now() - STUCK_AFTER_SECS, Ordering::Relaxed);
        let stuck = get(addr, "/healthz").await;
        assert!(
            stuck.starts_with("HTTP/1.0 503") && stuck.ends_with("the fake loop is stuck"),
            "{stuck}"
        );
    }

    #[tokio::test]
    async fn a_taken_port_is_named() {
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let e = serve(addr, Router::new()).await.unwrap_err();
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }
}
