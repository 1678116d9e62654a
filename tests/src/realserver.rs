//! The real Kubernetes API server (kube-apiserver v1.28.0 beside etcd),
//! started by `../shared/kube-apiserver/run.sh` inside a test host's
//! namespace. Tests that must show hostlb works against Kubernetes itself
//! (RBAC with API groups, 403s, a graceful shutdown that keeps watches open,
//! `410 Expired`) use it; the rest use [`crate::apiserver::TestServer`].
//!
//! The server is not part of the project: a machine without it still runs
//! the test suite. [`RealServer::available`] says why a test cannot run; a
//! test prints that reason and returns, except under `CI=true`, where a
//! missing server is a failure, so CI never passes without running them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::netns::Netns;

/// Where `run.sh` lives: `HOSTLB_KUBE_APISERVER` (a directory), else
/// `../shared/kube-apiserver` beside the workspace.
/// The flags that turn ValidatingAdmissionPolicy on in v1.28.
pub const POLICY_API: &str = "--feature-gates=ValidatingAdmissionPolicy=true --runtime-config=admissionregistration.k8s.io/v1beta1=true";

pub fn script() -> PathBuf {
    match std::env::var_os("HOSTLB_KUBE_APISERVER") {
        Some(dir) => PathBuf::from(dir).join("run.sh"),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/kube-apiserver/run.sh"),
    }
}

/// A client configuration from a kubeconfig file.
pub async fn kube_config(path: &Path) -> kube::Config {
    let kc = kube::config::Kubeconfig::read_from(path).expect("a kubeconfig");
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("a usable kubeconfig")
}

/// `n` LoadBalancer Services `s0`..`s{n-1}` in `namespace`, 32 created at a
/// time.
pub async fn create_load_balancers(client: &kube::Client, namespace: &str, n: usize) {
    use futures::StreamExt;
    let api: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), namespace);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let svc = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("s{i}")},
                    "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}))
                .expect("a Service");
                api.create(&Default::default(), &svc)
                    .await
                    .expect("the Service is created");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
}

/// A running real API server; stopped (hard) on drop.
pub struct RealServer {
    /// The network namespace it runs in; `None`: this one, on loopback.
    ns: Option<String>,
    dir: PathBuf,
    address: IpAddr,
    port: u16,
    etcd_port: u16,
    /// UTC second ranges (`YYYY-MM-DDTHH:MM:SS`, inclusive) in which the
    /// server was starting: ready, but its RBAC caches not yet filled, so
    /// it refuses (403) what it will allow a moment later. A window opens
    /// before the server starts and stays open ([`OPEN`]) until its grants
    /// are in force: a test that reads the log while a neighbour's server
    /// restarts must already see that restart's window.
    starting: std::sync::Mutex<Vec<(String, String)>>,
    /// The RBAC manifests applied ([`RealServer::wait_granted`]): a
    /// restarted server is starting until they are in force again.
    granted: std::sync::Mutex<Vec<String>>,
}

/// The start-up windows of every server this process ran.
fn any_starting() -> &'static std::sync::Mutex<Vec<(String, String)>> {
    static ALL: std::sync::OnceLock<std::sync::Mutex<Vec<(String, String)>>> =
        std::sync::OnceLock::new();
    ALL.get_or_init(Default::default)
}

/// The end of a window still open: sorts after every UTC second.
const OPEN: &str = "~";

/// Whether a log line stamped with a UTC RFC 3339 time at its start falls
/// in one of `windows` (inclusive UTC second ranges).
fn within(windows: &[(String, String)], line: &str) -> bool {
    let Some(second) = line.get(..19) else {
        return false;
    };
    windows
        .iter()
        .any(|(from, to)| from.as_str() <= second && second <= to.as_str())
}

fn utc_second(t: std::time::SystemTime) -> String {
    jiff::Timestamp::try_from(t)
        .expect("a time after 1970")
        .strftime("%Y-%m-%dT%H:%M:%S")
        .to_string()
}

impl RealServer {
    /// `Err(reason)` when this machine cannot run the real server. Under
    /// `CI=true` that is a panic instead: CI must run these tests.
    pub fn available() -> Result<(), String> {
        let reason = if !script().exists() {
            Some(format!(
                "the real API server is not here ({} is missing)",
                script().display()
            ))
        } else {
            ["etcd", "kubectl", "curl", "openssl", "xz"]
                .iter()
                .find(|p| {
                    !std::process::Command::new("sh")
                        .args(["-c", &format!("command -v {p}")])
                        .output()
                        .is_ok_and(|o| o.status.success())
                })
                .map(|p| format!("`{p}` is missing (apt-get install etcd-server kubectl curl openssl xz-utils)"))
        };
        match reason {
            None => Ok(()),
            Some(r) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("CI=true and this test needs the real API server: {r}")
            }
            Some(r) => Err(r),
        }
    }

    /// Starts etcd and the API server in `ns`, listening on `address:port`;
    /// state under `dir`. Returns once `/readyz` is ok.
    pub fn start(ns: &Netns, address: IpAddr, port: u16, dir: &Path) -> RealServer {
        Self::launch(Some(ns.name().to_string()), address, port, 2379, dir)
    }

    /// Starts it in this network namespace on 127.0.0.1: the API server on
    /// `port`, etcd on `etcd_port` and the next port (each test its own, so
    /// tests run side by side and miss a host's own etcd on 2379). Needs no
    /// root.
    pub fn start_local(port: u16, etcd_port: u16, dir: &Path) -> RealServer {
        Self::launch(None, IpAddr::from([127, 0, 0, 1]), port, etcd_port, dir)
    }

    fn launch(
        ns: Option<String>,
        address: IpAddr,
        port: u16,
        etcd_port: u16,
        dir: &Path,
    ) -> RealServer {
        let s = RealServer {
            ns,
            dir: dir.to_path_buf(),
            address,
            port,
            etcd_port,
            starting: Default::default(),
            granted: Default::default(),
        };
        let window = s.open_window();
        let out = s.run_sh(&["start"]);
        assert!(
            out.status.success(),
            "run.sh start: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        s.wait_rbac(window);
        s
    }

    /// Opens a start-up window from now, in this server's list and the
    /// process's; the indexes for [`RealServer::wait_rbac`] to close it.
    fn open_window(&self) -> (usize, usize) {
        let window = (utc_second(std::time::SystemTime::now()), OPEN.to_string());
        let mut mine = self.starting.lock().unwrap();
        let mut all = any_starting().lock().unwrap();
        mine.push(window.clone());
        all.push(window);
        (mine.len() - 1, all.len() - 1)
    }

    /// Waits until RBAC decisions are served from filled caches (a
    /// bootstrap role answers yes, and so does every grant of the
    /// manifests applied before a restart), then closes the start-up
    /// window a second later.
    fn wait_rbac(&self, (mine, all): (usize, usize)) {
        self.wait_yes(&[
            "auth".into(),
            "can-i".into(),
            "list".into(),
            "nodes".into(),
            "--as=system:kube-scheduler".into(),
        ]);
        let applied = self.granted.lock().unwrap().clone();
        for manifest in &applied {
            self.wait_in_force(manifest);
        }
        let to = utc_second(std::time::SystemTime::now() + Duration::from_secs(1));
        self.starting.lock().unwrap()[mine].1 = to.clone();
        any_starting().lock().unwrap()[all].1 = to;
    }

    /// Whether a log line stamped with a UTC RFC 3339 time at its start
    /// falls in a window in which the server was starting.
    pub fn while_starting(&self, line: &str) -> bool {
        within(&self.starting.lock().unwrap(), line)
    }

    /// Whether a log line falls in a window in which any server of this
    /// process was starting. Tests that run side by side in one process
    /// and share one log see each other's servers restart: a 403 from a
    /// neighbour's restart is not a refusal of this test's binary. (A
    /// refusal of this test's binary in that second is missed too; one
    /// that RBAC causes recurs as the watch retries, outside it.)
    pub fn while_any_starting(line: &str) -> bool {
        within(&any_starting().lock().unwrap(), line)
    }

    /// A command run in the server's namespace.
    fn command(&self, program: &str) -> std::process::Command {
        match &self.ns {
            Some(ns) => {
                let mut c = std::process::Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => std::process::Command::new(program),
        }
    }

    fn run_sh(&self, args: &[&str]) -> Output {
        let dir = self.dir.to_str().expect("a UTF-8 path");
        self.command("bash")
            .arg(script())
            .arg(args[0])
            .arg(dir)
            .args(&args[1..])
            .env("ADDRESS", self.address.to_string())
            .env("API_PORT", self.port.to_string())
            .env("ETCD_PORT", self.etcd_port.to_string())
            // ValidatingAdmissionPolicy, beta and off by default in v1.28:
            // deploy/agent/policy-v1beta1.yaml confines the agents with it.
            .env(
                "APISERVER_ARGS",
                std::env::var("APISERVER_ARGS").unwrap_or_else(|_| POLICY_API.to_string()),
            )
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run.sh runs")
    }

    /// One node's identity as an operator makes it: the shipped
    /// `deploy/agent/kubeconfig.sh NODE OUT_DIR`, run as the admin in the
    /// server's namespace, with the kubeconfig naming `OUT_DIR/token`.
    /// `deploy/agent/rbac.yaml` must be applied first.
    pub fn node_identity(&self, node: &str, out: &Path) -> PathBuf {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/agent/kubeconfig.sh");
        let o = self
            .command("bash")
            .arg(script)
            .arg(node)
            .arg(out)
            .env("KUBECONFIG", self.admin_kubeconfig())
            .env("TOKEN_FILE", out.join("token"))
            .stdin(std::process::Stdio::null())
            .output()
            .expect("kubeconfig.sh runs");
        assert!(
            o.status.success(),
            "kubeconfig.sh {node}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        self.wait_yes(&[
            "auth".into(),
            "can-i".into(),
            "patch".into(),
            format!("nodeagents.hostlb.io/{node}"),
            format!("--as=system:serviceaccount:hostlb-agents:{node}"),
        ]);
        out.join("kubeconfig")
    }

    /// The `system:masters` kubeconfig: for the test's own writes only,
    /// never for a hostlb binary.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// `kubectl` as the admin, in the server's namespace; its output.
    /// Panics when it fails: a test's setup that fails is a broken test.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self
            .admin_kubectl()
            .args(args)
            .output()
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl` as the admin, in the server's namespace, to be given its
    /// arguments.
    fn admin_kubectl(&self) -> std::process::Command {
        let mut c = self.command("kubectl");
        c.arg("--kubeconfig").arg(self.admin_kubeconfig());
        c
    }

    /// `curl` to the server as the admin (its token, the server's CA), to
    /// be given the request; and the server's URL.
    fn admin_curl(&self) -> (std::process::Command, String) {
        let admin =
            std::fs::read_to_string(self.dir.join("pki/admin.token")).expect("the admin token");
        let host = match self.address {
            IpAddr::V6(a) => format!("[{a}]"),
            IpAddr::V4(a) => a.to_string(),
        };
        let mut c = self.command("curl");
        c.args(["-sS", "--cacert"])
            .arg(self.dir.join("pki/ca.crt"))
            .arg("-H")
            .arg(format!("Authorization: Bearer {}", admin.trim()));
        (c, format!("https://{host}:{}", self.port))
    }

    /// What an operator applies before running a hostlb binary: the
    /// namespace, the CRDs (established) and `rbac`, a manifest under
    /// `deploy/` such as `allocator/rbac.yaml`.
    pub fn install_hostlb(&self, rbac: &str) {
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let path = |p: &str| deploy.join(p).to_str().expect("a UTF-8 path").to_string();
        self.kubectl(&["apply", "-f", &path("namespace.yaml")]);
        self.kubectl(&["apply", "-f", &path("crds")]);
        self.kubectl(&["apply", "-f", &path(rbac)]);
        self.kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=30s",
        ]);
        let text = std::fs::read_to_string(path(rbac)).expect("the RBAC manifest");
        self.wait_granted(&text);
    }

    /// Waits until every rule that `manifest`'s bindings grant is in force
    /// for their subjects. The server authorizes from caches its informers
    /// fill a moment after an apply, so a binary started at once may be
    /// refused what the manifest grants.
    pub fn wait_granted(&self, manifest: &str) {
        self.granted.lock().unwrap().push(manifest.to_string());
        self.wait_in_force(manifest);
    }

    /// [`RealServer::wait_granted`] without noting the manifest.
    fn wait_in_force(&self, manifest: &str) {
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(manifest).expect("a YAML manifest");
        let key = |d: &serde_json::Value| {
            let m = &d["metadata"];
            (
                d["kind"].as_str().unwrap_or("").to_string(),
                m["namespace"].as_str().unwrap_or("").to_string(),
                m["name"].as_str().unwrap_or("").to_string(),
            )
        };
        let roles: std::collections::HashMap<_, _> = docs
            .iter()
            .filter(|d| matches!(d["kind"].as_str(), Some("Role" | "ClusterRole")))
            .map(|d| (key(d), d["rules"].clone()))
            .collect();
        for binding in docs.iter().filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("RoleBinding" | "ClusterRoleBinding")
            )
        }) {
            let (_, namespace, _) = key(binding);
            let role = &binding["roleRef"];
            let role_ns = if role["kind"] == "Role" {
                namespace.clone()
            } else {
                String::new()
            };
            let Some(rules) = roles.get(&(
                role["kind"].as_str().unwrap_or("").to_string(),
                role_ns,
                role["name"].as_str().unwrap_or("").to_string(),
            )) else {
                continue;
            };
            for subject in binding["subjects"].as_array().into_iter().flatten() {
                let name = subject["name"].as_str().unwrap_or("");
                let who: Vec<String> = match subject["kind"].as_str() {
                    Some("ServiceAccount") => vec![format!(
                        "--as=system:serviceaccount:{}:{name}",
                        subject["namespace"].as_str().unwrap_or("")
                    )],
                    Some("Group") => vec!["--as=rbac-check".into(), format!("--as-group={name}")],
                    _ => vec![format!("--as={name}")],
                };
                for rule in rules.as_array().into_iter().flatten() {
                    let group = rule["apiGroups"][0].as_str().unwrap_or("");
                    let verb = rule["verbs"][0].as_str().unwrap_or("get");
                    for resource in rule["resources"].as_array().into_iter().flatten() {
                        let resource = resource.as_str().unwrap_or("");
                        let (resource, sub) = resource.split_once('/').unwrap_or((resource, ""));
                        let mut what = if group.is_empty() {
                            resource.to_string()
                        } else {
                            format!("{resource}.{group}")
                        };
                        if let Some(n) = rule["resourceNames"][0].as_str() {
                            what = format!("{what}/{n}");
                        }
                        let mut args = vec!["auth".to_string(), "can-i".into(), verb.into(), what];
                        if !sub.is_empty() {
                            args.push(format!("--subresource={sub}"));
                        }
                        if !namespace.is_empty() {
                            args.push(format!("--namespace={namespace}"));
                        }
                        args.extend(who.iter().cloned());
                        self.wait_yes(&args);
                    }
                }
            }
        }
    }

    /// Waits until `deploy/agent/policy-v1beta1.yaml` is in force: an
    /// agent's change to the spec of Service `namespace/service`, tried
    /// as a dry run, is denied. Like RBAC, the policy is enforced from a
    /// cache filled a moment after the apply.
    pub fn wait_agent_policy(&self, namespace: &str, service: &str) {
        // kubectl patch reads the object first, which an agent may not;
        // the request goes as the agent would send it.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (mut curl, server) = self.admin_curl();
            let o = curl
                .args(["-X", "PATCH"])
                .args([
                    "-H",
                    "Impersonate-User: system:serviceaccount:hostlb-agents:policy-check",
                    "-H",
                    "Impersonate-Group: system:serviceaccounts:hostlb-agents",
                    "-H",
                    "Content-Type: application/merge-patch+json",
                    "-d",
                    r#"{"spec":{"externalIPs":["10.0.0.9"]}}"#,
                ])
                .arg(format!(
                    "{server}/api/v1/namespaces/{namespace}/services/{service}?dryRun=All"
                ))
                .output()
                .expect("curl runs");
            let body = String::from_utf8_lossy(&o.stdout);
            if body.contains("\"code\": 422") || body.contains("\"code\":422") {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the agent policy is not in force 60 s after the apply: {body}{}",
                String::from_utf8_lossy(&o.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Asks `kubectl auth can-i` until it says yes (60 s at most).
    fn wait_yes(&self, args: &[String]) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let o = self
                .admin_kubectl()
                .args(args)
                .output()
                .expect("kubectl runs");
            if String::from_utf8_lossy(&o.stdout).trim() == "yes" {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not granted within 60 s: kubectl {}: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A kubeconfig for ServiceAccount `namespace/name`, written to `out`:
    /// a token from the TokenRequest API (what `kubectl create token` and
    /// `deploy/agent/kubeconfig.sh` ask for), requested with curl so that
    /// no particular kubectl release is needed.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str, out: &Path) {
        let (mut curl, server) = self.admin_curl();
        let o = curl
            .arg("--fail-with-body")
            .args(["-H", "Content-Type: application/json", "-X", "POST"])
            .arg(format!(
                "{server}/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
            ))
            .args([
                "-d",
                r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":86400}}"#,
            ])
            .output()
            .expect("curl runs");
        let body: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            panic!(
                "TokenRequest for {namespace}/{name}: {e}: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        });
        let token = body["status"]["token"]
            .as_str()
            .unwrap_or_else(|| panic!("TokenRequest for {namespace}/{name}: {body}"));
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: \"{server}\", certificate-authority: {ca}}}\nusers:\n- name: system:serviceaccount:{namespace}:{name}\n  user: {{token: \"{token}\"}}\ncontexts:\n- name: test\n  context: {{cluster: test, user: \"system:serviceaccount:{namespace}:{name}\"}}\ncurrent-context: test\n",
            ca = self.dir.join("pki/ca.crt").display()
        );
        std::fs::write(out, kubeconfig).expect("kubeconfig written");
    }

    fn pid(&self, which: &str) -> Option<i32> {
        std::fs::read_to_string(self.dir.join(format!("{which}.pid")))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// SIGTERM to the API server, as a host shutting it down: new
    /// connections are refused at once, open watches last up to 60 s.
    /// Does not wait.
    pub fn stop_apiserver(&self) {
        if let Some(p) = self.pid("apiserver") {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }

    /// SIGKILL to the API server: every connection drops at once.
    pub fn kill_apiserver(&self) {
        if let Some(p) = self.pid("apiserver") {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
            self.wait_gone(p, Duration::from_secs(90));
        }
    }

    fn wait_gone(&self, pid: i32, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        while nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the API server again (after [`stop_apiserver`] or
    /// [`kill_apiserver`]); returns once `/readyz` is ok.
    ///
    /// [`stop_apiserver`]: Self::stop_apiserver
    /// [`kill_apiserver`]: Self::kill_apiserver
    pub fn start_apiserver(&self) {
        if let Some(p) = self.pid("apiserver") {
            // run.sh waits for a stopping server to exit; make it quick.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
            self.wait_gone(p, Duration::from_secs(10));
        }
        let window = self.open_window();
        let o = self.run_sh(&["restart-apiserver"]);
        assert!(
            o.status.success(),
            "run.sh restart-apiserver: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        self.wait_rbac(window);
    }

    /// The API server's log so far (for 403s and the like).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("apiserver.log")).unwrap_or_default()
    }
}

impl Drop for RealServer {
    fn drop(&mut self) {
        for which in ["apiserver", "etcd"] {
            if let Some(p) = self.pid(which) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
                self.wait_gone(p, Duration::from_secs(10));
            }
        }
    }
}
