//! A Kubernetes API server for tests: the real HTTP protocol (paths, verbs,
//! status codes, `Status` errors, watch streams, discovery) over an
//! in-memory store, so `kube` and `kubectl` work against it unchanged.
//!
//! ```no_run
//! # async fn demo() {
//! let server = hostlb_tests::apiserver::TestServer::start().await;
//! let client = server.client();
//! server.set_unavailable(); // every API call now gets 503
//! server.set_available();
//! # }
//! ```
//!
//! See `tests/README.md` for what it implements and how it differs from a
//! real API server.

pub mod error;
mod fields;
mod http;
mod openapi;
mod patch;
mod protobuf;
#[rustfmt::skip]
mod protobuf_schema;
mod registry;
mod schema;
mod selectors;
mod services;
mod store;
mod table;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use error::ApiError;
pub use registry::{GroupResource, ResourceDef};
pub use store::Store;

/// Whether the API answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Available,
    /// Every API request gets `503 ServiceUnavailable`.
    Unavailable,
    /// The listening socket is closed and open connections dropped, so
    /// clients get "connection refused".
    Refuse,
}

/// Fault injection, shared by the library handle and the control path.
pub struct Faults {
    mode: watch::Sender<Mode>,
    delay_ms: AtomicU64,
    cut: watch::Sender<u64>,
    /// The next this many writes whose path contains the pattern fail with
    /// `500 InternalError`.
    fail_writes: Mutex<(String, u64)>,
    /// Resource (plural) → how late its watch events reach watchers.
    watch_lag: Mutex<HashMap<String, Duration>>,
    /// User-Agent pattern → how long the writes of matching clients take.
    slow_writes: Mutex<HashMap<String, Duration>>,
}

impl Faults {
    fn new() -> Arc<Self> {
        Arc::new(Faults {
            mode: watch::channel(Mode::Available).0,
            delay_ms: AtomicU64::new(0),
            cut: watch::channel(0).0,
            fail_writes: Mutex::new((String::new(), 0)),
            watch_lag: Mutex::new(HashMap::new()),
            slow_writes: Mutex::new(HashMap::new()),
        })
    }

    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms.load(Ordering::Relaxed))
    }

    pub fn set_delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }

    /// End every open watch stream (clients see the stream close).
    pub fn cut_watches(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Fail the next `n` writes to paths containing `pattern` ("" for any)
    /// with `500 InternalError`, which clients do not retry by themselves.
    pub fn fail_writes(&self, pattern: &str, n: u64) {
        *self
            .fail_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = (pattern.to_string(), n);
    }

    /// Hold each watch event of `resource` (a plural, such as "namespaces")
    /// for `lag` before sending it, in order, as a slow watch does; zero to
    /// stop.
    pub fn set_watch_lag(&self, resource: &str, lag: Duration) {
        let mut m = self
            .watch_lag
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if lag.is_zero() {
            m.remove(resource);
        } else {
            m.insert(resource.to_string(), lag);
        }
    }

    pub fn watch_lag(&self, resource: &str) -> Duration {
        self.watch_lag
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(resource)
            .copied()
            .unwrap_or_default()
    }

    /// Make every write from a client whose User-Agent contains `pattern`
    /// take `d` before it is applied, as on an overloaded server: the write
    /// lands after `d` even if the client gave up on it, unless its `timeout`
    /// parameter is shorter (then it gets a 504 and is not applied). Zero
    /// to stop.
    pub fn set_slow_writes(&self, pattern: &str, d: Duration) {
        let mut m = self
            .slow_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if d.is_zero() {
            m.remove(pattern);
        } else {
            m.insert(pattern.to_string(), d);
        }
    }

    /// How long a write from this client takes (the longest matching).
    fn write_time(&self, user_agent: &str) -> Duration {
        self.slow_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(p, _)| user_agent.contains(p.as_str()))
            .map(|(_, d)| *d)
            .max()
            .unwrap_or_default()
    }

    /// Whether this write is one to fail, counting it down.
    fn take_write_failure(&self, path: &str) -> bool {
        let mut f = self
            .fail_writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if f.1 > 0 && path.contains(f.0.as_str()) {
            f.1 -= 1;
            true
        } else {
            false
        }
    }
}

/// One API request, for tests that check who wrote and what a client needs
/// permission for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// A watch, as opposed to a list or a get.
    pub watch: bool,
    pub field_manager: Option<String>,
    pub user_agent: String,
    pub status: u16,
}

impl RequestRecord {
    /// The RBAC verb the request needs.
    pub fn verb(&self) -> &'static str {
        let segments = self.path.trim_matches('/').split('/').count();
        // /api/v1/R, /api/v1/namespaces/N/R, /apis/G/V/R, /apis/G/V/namespaces/N/R
        let core = self.path.starts_with("/api/");
        let base = if core { 2 } else { 3 };
        let collection =
            segments == base + 1 || (segments == base + 3 && self.path.contains("/namespaces/"));
        match (self.method.as_str(), collection) {
            ("GET", true) if self.watch => "watch",
            ("GET", true) => "list",
            ("GET", false) => "get",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "deletecollection",
            ("DELETE", false) => "delete",
            _ => "unknown",
        }
    }
}

/// Kept for callers that only look at writes.
pub type WriteRecord = RequestRecord;

pub(crate) struct App {
    store: Mutex<Store>,
    faults: Arc<Faults>,
    addr: SocketAddr,
    requests: Mutex<Vec<RequestRecord>>,
    bookmark_interval: Duration,
}

/// A running test server; it stops when dropped.
pub struct TestServer {
    app: Arc<App>,
    shutdown: watch::Sender<bool>,
}

impl TestServer {
    /// Start on `127.0.0.1` with a free port.
    pub async fn start() -> TestServer {
        TestServer::start_on("127.0.0.1:0".parse().expect("literal"))
            .await
            .expect("bind 127.0.0.1:0")
    }

    pub async fn start_on(addr: SocketAddr) -> std::io::Result<TestServer> {
        let listener = TcpListener::bind(addr).await?;
        let app = Arc::new(App {
            store: Mutex::new(Store::new()),
            faults: Faults::new(),
            addr: listener.local_addr()?,
            requests: Mutex::new(Vec::new()),
            bookmark_interval: Duration::from_secs(1),
        });
        let (shutdown, rx) = watch::channel(false);
        tokio::spawn(serve(app.clone(), listener, rx));
        Ok(TestServer { app, shutdown })
    }

    pub fn addr(&self) -> SocketAddr {
        self.app.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.app.addr)
    }

    /// A client configuration for this server (namespace `default`).
    pub fn config(&self) -> kube::Config {
        kube::Config::new(self.url().parse().expect("valid url"))
    }

    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config()).expect("client for a plain HTTP server")
    }

    /// A kubeconfig pointing at this server, for `kubectl` and agents.
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig_yaml(&self.url())
    }

    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    pub fn faults(&self) -> &Faults {
        &self.app.faults
    }

    /// Every API request now gets `503 ServiceUnavailable`.
    pub fn set_unavailable(&self) {
        self.app.faults.set_mode(Mode::Unavailable);
    }

    /// Close the listening socket and drop open connections.
    pub fn set_refusing(&self) {
        self.app.faults.set_mode(Mode::Refuse);
    }

    pub fn set_available(&self) {
        self.app.faults.set_mode(Mode::Available);
    }

    pub fn cut_watches(&self) {
        self.app.faults.cut_watches();
    }

    /// Fail the next `n` writes to paths containing `pattern` ("" for any)
    /// with `500 InternalError`.
    pub fn fail_writes(&self, pattern: &str, n: u64) {
        self.app.faults.fail_writes(pattern, n);
    }

    /// Delay every API response by `d`.
    pub fn set_delay(&self, d: Duration) {
        self.app.faults.set_delay(d);
    }

    /// Writes from clients whose User-Agent contains `pattern` take `d`
    /// (see [`Faults::set_slow_writes`]).
    pub fn set_slow_writes(&self, pattern: &str, d: Duration) {
        self.app.faults.set_slow_writes(pattern, d);
    }

    /// Deliver the watch events of `resource` (a plural) `lag` late.
    pub fn set_watch_lag(&self, resource: &str, lag: Duration) {
        self.app.faults.set_watch_lag(resource, lag);
    }

    /// Forget the event history: watches from older resourceVersions get 410.
    pub fn compact(&self) {
        self.app
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .compact();
    }

    /// Direct access to the store, for setup and assertions.
    pub fn with_store<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        f(&mut self
            .app
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner))
    }

    /// Requests that could change state, oldest first.
    pub fn writes(&self) -> Vec<RequestRecord> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }

    /// Every API request, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.app
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn clear_writes(&self) {
        self.app
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
    }
}

pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: testserver
  cluster:
    server: {url}
users:
- name: testserver
  user: {{}}
contexts:
- name: testserver
  context:
    cluster: testserver
    user: testserver
    namespace: default
current-context: testserver
"
    )
}

/// Accept connections until shutdown; in `Refuse` mode close the listener
/// and every connection, and bind again when the mode changes back.
async fn serve(app: Arc<App>, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let router = Router::new().fallback(http::handle).with_state(app.clone());
    let mut mode = app.faults.mode.subscribe();
    let mut listener = Some(listener);
    let mut conns = JoinSet::new();
    loop {
        if *mode.borrow_and_update() == Mode::Refuse {
            listener = None;
            conns.abort_all();
            tokio::select! {
                _ = mode.changed() => continue,
                _ = shutdown.changed() => return,
            }
        }
        let l = match &listener {
            Some(l) => l,
            None => match TcpListener::bind(app.addr).await {
                Ok(l) => listener.insert(l),
                Err(e) => {
                    tracing::warn!(error = %e, addr = %app.addr, "rebinding the test server");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        tokio::select! {
            accepted = l.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let svc = TowerToHyperService::new(router.clone());
                conns.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
            _ = mode.changed() => {}
            _ = shutdown.changed() => {
                conns.abort_all();
                return;
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}
