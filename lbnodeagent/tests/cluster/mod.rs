//! A small cluster on one machine for end-to-end tests of `lbnodeagent run`:
//! an API server in its own host namespace on a bridged LAN (the test server,
//! or with [`Cluster::real`] the real kube-apiserver, where the agents use
//! the ServiceAccount and RBAC of `deploy/agent/rbac.yaml`), three or more
//! hosts each running the real agent binary with its own config, run
//! directory and log, and a client host that probes VIPs. Objects are
//! written with the real `kubectl` as admin. Everything is torn down on drop.

#![allow(dead_code)]

pub mod failover;
pub mod many;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use hostlb_tests::apiserver::TestServer;
use hostlb_tests::netns::{Host, Lan, NsRuntime, require_root, require_tools, wait_for};
use hostlb_tests::probe::{ArpProbe, Outcome};
use hostlb_tests::realserver::RealServer;

pub const API_PORT: u16 = 6443;

pub struct Cluster {
    // Drop order: agents (killed in Drop), server, runtime, LAN, files.
    agents: BTreeMap<String, Child>,
    pub server: Option<TestServer>,
    pub real: Option<RealServer>,
    api_rt: NsRuntime,
    pub lan: Lan,
    pub dir: tempfile::TempDir,
    /// The admin's kubeconfig: for the test's own reads and writes.
    pub kubeconfig: PathBuf,
    pub nodes: Vec<String>,
    /// `announce.address_lifetime` of configs written from now on.
    pub lifetime: String,
    /// The hosts have IPv6 only (the API server too), and the Nodes IPv6
    /// InternalIPs.
    pub ipv6_only: bool,
    /// Nodes whose agent binary was replaced ([`Cluster::install`]): the
    /// path they start and run commands from.
    binaries: BTreeMap<String, PathBuf>,
    /// Last, so the cluster is gone before the next one starts.
    _alone: Alone,
}

/// One cluster at a time in a test binary. The tests judge, to tens of
/// milliseconds, what a client sees while agents move VIPs; two clusters
/// of debug-built agents on a two-core machine starve each other's loops,
/// and their windows then grow with the other test, not with the agent.
/// A test may build a second cluster while it holds one: the thread that
/// holds the turn keeps it.
struct Alone(Option<std::sync::MutexGuard<'static, ()>>);

static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

thread_local! {
    static HOLDS_TURN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Alone {
    fn take() -> Alone {
        if HOLDS_TURN.get() {
            return Alone(None);
        }
        let guard = TURN.lock().unwrap_or_else(|e| e.into_inner());
        HOLDS_TURN.set(true);
        Alone(Some(guard))
    }
}

impl Drop for Alone {
    fn drop(&mut self) {
        if self.0.take().is_some() {
            HOLDS_TURN.set(false);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A failed test shows what each running agent decided, beside its
        // log: the members, their views and each VIP's winner.
        if std::thread::panicking() {
            let mut running: Vec<&String> = self.agents.keys().collect();
            running.sort();
            for n in running {
                let (_, out, err) = self.agent_command(n, &["status"]);
                eprintln!("----- {n} status -----\n{out}{err}");
            }
        }
        for (_, mut c) in std::mem::take(&mut self.agents) {
            let _ = c.kill();
            let _ = c.wait();
        }
        // HOSTLB_TEST_LOGS=DIR keeps every agent's log (a bench run, or a
        // test that passed but should be read).
        if let Some(keep) = std::env::var_os("HOSTLB_TEST_LOGS") {
            let keep = PathBuf::from(keep);
            let _ = std::fs::create_dir_all(&keep);
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0);
            for n in &self.nodes {
                let _ = std::fs::copy(self.log_path(n), keep.join(format!("{stamp}-{n}.log")));
            }
        }
        if std::thread::panicking() {
            for n in &self.nodes {
                if let Ok(log) = std::fs::read_to_string(self.log_path(n)) {
                    // Gossip's routine lines (every membership change of
                    // every round) would push the decisions out of what a
                    // reader of a failed run is shown: counted, not shown.
                    let (left_out, kept): (Vec<&str>, Vec<&str>) = log
                        .lines()
                        .partition(|l| ROUTINE.iter().any(|r| l.contains(r)));
                    eprintln!(
                        "----- {n} log ({} routine gossip lines left out) -----\n{}",
                        left_out.len(),
                        kept.join("\n")
                    );
                }
            }
        }
    }
}

/// Log lines a failed test's dump leaves out: gossip's bookkeeping, which
/// says nothing of a VIP's fate.
const ROUTINE: &[&str] = &["membership changed", "gossip state held back"];

impl Cluster {
    /// `nodes` hosts with agents (not started), an API server with the CRDs,
    /// the system namespace and Node objects, and a `client` host.
    pub fn new(nodes: &[&str]) -> Cluster {
        Self::build(nodes, false, false)
    }

    /// [`new`](Self::new) on a LAN with no IPv4 at all: every host keeps
    /// only its IPv6 address and route, and the agents' gossip settings
    /// are the defaults.
    pub fn ipv6_only(nodes: &[&str]) -> Cluster {
        Self::build(nodes, false, true)
    }

    /// [`new`](Self::new) on the real kube-apiserver, with the agents
    /// running as the `hostlb-agent` ServiceAccount that
    /// `deploy/agent/rbac.yaml` grants. `None` (after saying why) on a
    /// machine without the real server; under `CI=true` that panics.
    pub fn real(nodes: &[&str]) -> Option<Cluster> {
        if let Err(why) = RealServer::available() {
            eprintln!("NOT RUN: {why}");
            return None;
        }
        Some(Self::build_with(nodes, true, false, true))
    }

    /// [`real`](Self::real) without the Service policy
    /// (`deploy/agent/policy-v1beta1.yaml`): a cluster whose operator
    /// forgot it, or whose server does not enforce it.
    pub fn real_without_policy(nodes: &[&str]) -> Option<Cluster> {
        if let Err(why) = RealServer::available() {
            eprintln!("NOT RUN: {why}");
            return None;
        }
        Some(Self::build_with(nodes, true, false, false))
    }

    fn build(nodes: &[&str], real: bool, ipv6_only: bool) -> Cluster {
        Self::build_with(nodes, real, ipv6_only, true)
    }

    fn build_with(nodes: &[&str], real: bool, ipv6_only: bool, policy: bool) -> Cluster {
        require_root();
        require_tools(&["arping", "kubectl", "python3", "ndisc6", "nft"]);
        let alone = Alone::take();
        let mut roles = vec!["api"];
        roles.extend_from_slice(nodes);
        roles.push("client");
        let lan = Lan::new(&roles).unwrap();
        if ipv6_only {
            for h in &lan.hosts {
                h.ns.ip("-4 route flush table main").unwrap();
                h.ns.ip("-4 addr flush dev eth0").unwrap();
            }
        }
        let api = lan.host("api");
        let api_rt = api.ns.runtime().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (server, real, kubeconfig) = if real {
            let r = RealServer::start(&api.ns, api.ipv4.into(), API_PORT, &dir.path().join("k8s"));
            let kc = r.admin_kubeconfig();
            (None, Some(r), kc)
        } else {
            let ip: std::net::IpAddr = if ipv6_only {
                api.ipv6.into()
            } else {
                api.ipv4.into()
            };
            let listen = std::net::SocketAddr::new(ip, API_PORT);
            let server =
                api_rt.run(move || async move { TestServer::start_on(listen).await.unwrap() });
            let kc = dir.path().join("kubeconfig");
            server.write_kubeconfig(&kc).unwrap();
            (Some(server), None, kc)
        };
        std::fs::write(
            dir.path().join("gossip.key"),
            "6b5e1f0d9a3c47e2b8d4f1a6c3e9b7d2a5f8c1e4b7d0a3f6c9e2b5d8a1f4c7e0\n",
        )
        .unwrap();
        std::fs::set_permissions(
            dir.path().join("gossip.key"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let c = Cluster {
            agents: BTreeMap::new(),
            server,
            real,
            api_rt,
            lan,
            dir,
            kubeconfig,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            lifetime: "6s".into(),
            ipv6_only,
            binaries: BTreeMap::new(),
            _alone: alone,
        };
        let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
        c.kubectl(&["apply", "-f", crds.to_str().unwrap()]);
        c.apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: hostlb-system}\n");
        if let Some(r) = &c.real {
            let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/agent");
            for f in ["rbac.yaml", "policy-v1beta1.yaml"] {
                if f.starts_with("policy") && !policy {
                    continue;
                }
                c.kubectl(&["apply", "-f", deploy.join(f).to_str().unwrap()]);
            }
            r.wait_granted(&std::fs::read_to_string(deploy.join("rbac.yaml")).unwrap());
            // One identity per node, made by the shipped script.
            for n in nodes {
                r.node_identity(n, &c.identity_dir(n));
            }
        }
        for n in nodes {
            let host = c.lan.host(n);
            let ip: std::net::IpAddr = if ipv6_only {
                host.ipv6.into()
            } else {
                host.ipv4.into()
            };
            c.apply(&format!(
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: {n}\n  labels: {{kubernetes.io/hostname: {n}}}\n"
            ));
            c.kubectl(&[
                "patch",
                "node",
                n,
                "--subresource=status",
                "--type=merge",
                "-p",
                &format!(
                    r#"{{"status":{{"addresses":[{{"type":"InternalIP","address":"{ip}"}}]}}}}"#
                ),
            ]);
        }
        c
    }

    /// Where `node`'s identity (kubeconfig and token) lives on a real
    /// server.
    pub fn identity_dir(&self, node: &str) -> PathBuf {
        self.dir.path().join("identity").join(node)
    }

    /// The kubeconfig `node`'s agent runs with: its own identity on a real
    /// server, the test server's one otherwise.
    pub fn agent_kubeconfig(&self, node: &str) -> PathBuf {
        if self.real.is_some() {
            self.identity_dir(node).join("kubeconfig")
        } else {
            self.kubeconfig.clone()
        }
    }

    pub fn host(&self, role: &str) -> &Host {
        self.lan.host(role)
    }

    pub fn log_path(&self, node: &str) -> PathBuf {
        self.dir.path().join(format!("{node}.log"))
    }

    pub fn config_path(&self, node: &str) -> PathBuf {
        self.dir.path().join(format!("{node}.toml"))
    }

    pub fn run_dir(&self, node: &str) -> PathBuf {
        self.dir.path().join(format!("{node}-run"))
    }

    /// The agent's config: gossip at its defaults (listen on `[::]`,
    /// advertise the announce interface's address, seeds from the Nodes'
    /// InternalIPs), a short address lifetime, quick announcements.
    pub fn write_config(&self, node: &str, extra: &str) {
        let text = format!(
            r#"node_name = "{node}"
kubeconfig = "{kubeconfig}"
run_dir = "{run}"
[gossip]
key_file = "{key}"
[announce]
address_lifetime = "{lifetime}"
garp_count = 2
garp_interval = "200ms"
{extra}
"#,
            kubeconfig = self.agent_kubeconfig(node).display(),
            run = self.run_dir(node).display(),
            key = self.dir.path().join("gossip.key").display(),
            lifetime = self.lifetime,
        );
        std::fs::write(self.config_path(node), text).unwrap();
    }

    /// Starts the real agent on `node` (writing a default config first if
    /// there is none).
    pub fn start(&mut self, node: &str) {
        self.start_with_env(node, &[]);
    }

    /// [`start`](Self::start) with extra environment variables.
    pub fn start_with_env(&mut self, node: &str, env: &[(&str, &str)]) {
        self.start_wrapped(node, env, &[]);
    }

    /// [`start`](Self::start) through `wrapper` (a program and its
    /// arguments that then runs the agent, e.g. `setpriv ...`).
    pub fn start_wrapped(&mut self, node: &str, env: &[(&str, &str)], wrapper: &[&str]) {
        if !self.config_path(node).exists() {
            self.write_config(node, "");
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(node))
            .unwrap();
        let config = self.config_path(node);
        let mut argv: Vec<&str> = wrapper.to_vec();
        let binary = self.binary(node);
        argv.extend([
            binary.to_str().unwrap(),
            "run",
            "--config",
            config.to_str().unwrap(),
        ]);
        let mut cmd = self.lan.host(node).ns.command(argv[0], &argv[1..]);
        cmd.env(
            "RUST_LOG",
            "info,lbnodeagent=debug,kube_client::client::builder=off",
        )
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(log);
        let child = cmd.spawn().unwrap();
        self.agents.insert(node.to_string(), child);
    }

    /// Replaces `node`'s agent binary by a copy of `from`, as a package
    /// upgrade unpacks the new one while the old process still runs: the
    /// next start, and `cleanup` from then on, run the copy.
    pub fn install(&mut self, node: &str, from: &std::path::Path) {
        let dir = self.dir.path().join(format!("{node}-bin"));
        std::fs::create_dir_all(&dir).unwrap();
        let to = dir.join("lbnodeagent");
        let staged = to.with_extension("new");
        std::fs::copy(from, &staged).unwrap();
        std::fs::rename(&staged, &to).unwrap();
        self.binaries.insert(node.to_string(), to);
    }

    /// The agent binary `node` runs: unless a test swapped it, the one
    /// `HOSTLB_AGENT_BINARY` names (a packaged build, say), else this
    /// build's.
    pub fn binary(&self, node: &str) -> PathBuf {
        self.binaries.get(node).cloned().unwrap_or_else(|| {
            std::env::var_os("HOSTLB_AGENT_BINARY")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_lbnodeagent")))
        })
    }

    pub fn start_all(&mut self) {
        for n in self.nodes.clone() {
            self.start(&n);
        }
    }

    /// The agent's process id (of the binary, not of `ip netns exec`, which
    /// execs it).
    pub fn pid(&self, node: &str) -> u32 {
        self.agents[node].id()
    }

    pub fn signal(&self, node: &str, signal: &str) {
        let pid = self.pid(node).to_string();
        hostlb_tests::netns::run("kill", &["-s", signal, &pid]).unwrap();
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self, node: &str) {
        let mut c = self.agents.remove(node).expect("running");
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Waits for the agent to exit by itself; its exit code.
    pub fn wait_exit(&mut self, node: &str, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            let c = self.agents.get_mut(node).expect("started");
            if let Some(status) = c.try_wait().unwrap() {
                self.agents.remove(node);
                return status.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `lbnodeagent ARGS` on `node`'s host; (success, stdout, stderr).
    pub fn agent_command(&self, node: &str, args: &[&str]) -> (bool, String, String) {
        let out = self
            .lan
            .host(node)
            .ns
            .command(self.binary(node).to_str().unwrap(), args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// What `node`'s NodeAgent record holds at `jsonpath` (kubectl's
    /// template, e.g. `{.status.state}`); panics if kubectl fails.
    pub fn record(&self, node: &str, jsonpath: &str) -> String {
        self.kubectl(&[
            "get",
            "nodeagent",
            node,
            "-o",
            &format!("jsonpath={jsonpath}"),
        ])
    }

    /// `kubectl ARGS` from the API host; panics on failure.
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args)
            .unwrap_or_else(|e| panic!("kubectl {}: {e}", args.join(" ")))
    }

    pub fn try_kubectl(&self, args: &[&str]) -> Result<String, String> {
        let kc = self.kubeconfig.to_str().unwrap().to_string();
        let mut argv = vec!["--kubeconfig", kc.as_str()];
        argv.extend_from_slice(args);
        let out = self
            .lan
            .host("api")
            .ns
            .command("kubectl", &argv)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// `kubectl apply` of a YAML document.
    pub fn apply(&self, yaml: &str) {
        let path = self.dir.path().join(format!(
            "apply-{}.yaml",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::write(&path, yaml).unwrap();
        self.kubectl(&["apply", "-f", path.to_str().unwrap()]);
    }

    /// A pool over `addresses` and one advertisement (`ad_spec` is the rest
    /// of its spec, YAML flow style, may be empty).
    pub fn pool_and_ad(&self, addresses: &[&str], ad_spec: &str) {
        self.apply(&format!(
            "apiVersion: hostlb.io/v1\nkind: IPAddressPool\nmetadata: {{name: pool, namespace: hostlb-system}}\nspec:\n  addresses: [{}]\n",
            addresses.join(", ")
        ));
        self.apply(&format!(
            "apiVersion: hostlb.io/v1\nkind: L2Advertisement\nmetadata: {{name: ad, namespace: hostlb-system}}\nspec: {{{ad_spec}}}\n"
        ));
    }

    /// A LoadBalancer Service `name` in `default` holding `ips` in its
    /// status (as the allocator would write it), with ready endpoints on
    /// `endpoint_nodes`. Returns when the status write was sent: the moment
    /// the addresses exist.
    pub fn service(
        &self,
        name: &str,
        ips: &[&str],
        endpoint_nodes: &[&str],
        spec_extra: &str,
    ) -> Instant {
        self.apply(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: LoadBalancer\n  ports: [{{port: 80, protocol: TCP}}]\n  {spec_extra}\n"
        ));
        self.endpoints(name, endpoint_nodes);
        let ingress: Vec<String> = ips.iter().map(|ip| format!(r#"{{"ip":"{ip}"}}"#)).collect();
        self.set_status(name, &ingress.join(","))
    }

    /// Writes `status.loadBalancer.ingress` (a JSON list body) through the
    /// test server's client, skipping kubectl's start-up time so the
    /// returned instant is when the write was sent.
    pub fn set_status(&self, name: &str, ingress: &str) -> Instant {
        let config = self.admin_config();
        let name = name.to_string();
        let patch: serde_json::Value = serde_json::from_str(&format!(
            r#"{{"status":{{"loadBalancer":{{"ingress":[{ingress}]}}}}}}"#
        ))
        .unwrap();
        self.api_rt.run(move || async move {
            let client = kube::Client::try_from(config).expect("a client");
            let api: kube::Api<k8s_openapi::api::core::v1::Service> =
                kube::Api::namespaced(client, "default");
            let sent = Instant::now();
            api.patch_status(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
            sent
        })
    }

    /// A client config with the admin's identity.
    pub fn admin_config(&self) -> kube::Config {
        if let Some(s) = &self.server {
            return s.config();
        }
        let path = self.kubeconfig.clone();
        self.api_rt.run(move || async move {
            let kc = kube::config::Kubeconfig::read_from(&path).expect("admin kubeconfig");
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .expect("admin config")
        })
    }

    /// Lines of the agents' logs that show the API refused them (a 403)
    /// or that something they meant to say was dropped: a test against
    /// the real server asserts there are none. A 403 while the real server
    /// was starting (its RBAC caches not yet filled) is the server's, not
    /// the RBAC's, and is left out.
    pub fn refusals(&self) -> Vec<String> {
        let mut out = Vec::new();
        for n in &self.nodes {
            let log = std::fs::read_to_string(self.log_path(n)).unwrap_or_default();
            out.extend(
                log.lines()
                    .filter(|l| {
                        let refused = l.contains("forbidden") || l.contains(" 403");
                        let starting = self.real.as_ref().is_some_and(|r| r.while_starting(l));
                        (refused && !starting) || l.contains("dropped")
                    })
                    .map(|l| format!("{n}: {l}")),
            );
        }
        out
    }

    /// The Service's EndpointSlice: one ready endpoint per node.
    pub fn endpoints(&self, name: &str, nodes: &[&str]) {
        let eps: Vec<String> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                format!(
                    "- {{addresses: [10.244.0.{}], nodeName: {n}, conditions: {{ready: true}}}}",
                    i + 10
                )
            })
            .collect();
        self.apply(&format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-slice\n  namespace: default\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nendpoints:{}\n",
            if eps.is_empty() { " []".to_string() } else { format!("\n{}", eps.join("\n")) }
        ));
    }

    /// GET `path` from the agent's HTTP listener on its host; (status line,
    /// body).
    /// Waits until every agent says it is ready (`/readyz`); when each
    /// did, in order of the nodes.
    pub fn wait_ready(&self, timeout: Duration) -> Vec<Instant> {
        let nodes: Vec<&str> = self.nodes.iter().map(String::as_str).collect();
        self.wait_ready_of(&nodes, timeout)
    }

    /// [`wait_ready`](Self::wait_ready) for some of the nodes.
    pub fn wait_ready_of(&self, nodes: &[&str], timeout: Duration) -> Vec<Instant> {
        nodes
            .iter()
            .map(|n| {
                wait_for(&format!("{n} to be ready"), timeout, || {
                    (self.http_get(n, "/readyz").0 == "200").then(Instant::now)
                })
                .unwrap()
            })
            .collect()
    }

    pub fn http_get(&self, node: &str, path: &str) -> (String, String) {
        let script = format!(
            "import urllib.request, urllib.error\n\
             try:\n    r = urllib.request.urlopen('http://127.0.0.1:7472{path}', timeout=5)\n    print(r.status)\n    print(r.read().decode())\n\
             except urllib.error.HTTPError as e:\n    print(e.code)\n    print(e.read().decode())\n\
             except urllib.error.URLError as e:\n    print(0)\n    print(e.reason)\n"
        );
        let out = self
            .lan
            .host(node)
            .ns
            .run(&["python3", "-c", &script])
            .unwrap();
        let (status, body) = out.split_once('\n').unwrap_or((out.as_str(), ""));
        (status.trim().to_string(), body.to_string())
    }

    /// A Service annotation, or "" when unset.
    pub fn annotation(&self, service: &str, key: &str) -> String {
        let escaped = key.replace('.', "\\.").replace('/', "\\/");
        self.kubectl(&[
            "get",
            "service",
            service,
            "-o",
            &format!("jsonpath={{.metadata.annotations.{escaped}}}"),
        ])
    }

    /// Which agents hold `ip` in their kernel (by `ip addr`).
    pub fn holders(&self, ip: &str) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| {
                self.lan
                    .host(n)
                    .ns
                    .ip("-o addr show")
                    .map(|out| out.lines().any(|l| l.contains(&format!(" {ip}/"))))
                    .unwrap_or(false)
            })
            .cloned()
            .collect()
    }

    /// The node whose eth0 has `mac`.
    pub fn node_of_mac(&self, mac: &str) -> Option<String> {
        self.nodes
            .iter()
            .find(|n| self.lan.host(n).mac() == mac)
            .cloned()
    }

    /// Waits until exactly one agent holds `ip`; its name.
    pub fn wait_single_holder(&self, ip: &str, timeout: Duration) -> String {
        wait_for(&format!("one holder of {ip}"), timeout, || {
            let h = self.holders(ip);
            (h.len() == 1).then(|| h[0].clone())
        })
        .unwrap_or_else(|e| panic!("{e}: holders now {:?}", self.holders(ip)))
    }

    /// The node every running agent names as `ip`'s winner in its
    /// `/status`, when they all agree; `None` otherwise.
    pub fn agreed_winner(&self, ip: &str) -> Option<String> {
        let ip: std::net::IpAddr = ip.parse().ok()?;
        let mut agreed: Option<String> = None;
        for n in self.agents.keys() {
            let (code, body) = self.http_get(n, "/status");
            if code != "200" {
                return None;
            }
            let doc: serde_json::Value = serde_json::from_str(&body).ok()?;
            let winner = doc["vips"]
                .as_array()?
                .iter()
                .find(|v| v["ip"].as_str().and_then(|s| s.parse().ok()) == Some(ip))?["winner"]
                .as_str()?
                .to_string();
            match &agreed {
                Some(w) if *w != winner => return None,
                _ => agreed = Some(winner),
            }
        }
        agreed
    }

    /// Waits until exactly one agent holds `ip` and every running agent
    /// names it the winner: the election has settled, not only the
    /// kernels (a node may hold a VIP for a while whose winner's view is
    /// behind, and hand it on when that view catches up).
    pub fn wait_elected_holder(&self, ip: &str, timeout: Duration) -> String {
        wait_for(&format!("one elected holder of {ip}"), timeout, || {
            let h = self.holders(ip);
            (h.len() == 1 && self.agreed_winner(ip).as_ref() == Some(&h[0])).then(|| h[0].clone())
        })
        .unwrap_or_else(|e| {
            panic!(
                "{e}: holders now {:?}, winner {:?}",
                self.holders(ip),
                self.agreed_winner(ip)
            )
        })
    }

    /// `n` Services `bulk-0..n` with one address each from `first` on
    /// (IPv4, consecutive), ready endpoints on `endpoint_node`, created
    /// through the API directly (kubectl would take minutes for 1,000).
    pub fn bulk_services(&self, n: usize, first: std::net::Ipv4Addr, endpoint_node: &str) {
        let config = self.admin_config();
        let node = endpoint_node.to_string();
        self.api_rt.run(move || async move {
            use k8s_openapi::api::core::v1::Service;
            use k8s_openapi::api::discovery::v1::EndpointSlice;
            let client = kube::Client::try_from(config).expect("a client");
            let services: kube::Api<Service> = kube::Api::namespaced(client.clone(), "default");
            let slices: kube::Api<EndpointSlice> = kube::Api::namespaced(client, "default");
            let pp = kube::api::PostParams::default();
            for i in 0..n {
                let name = format!("bulk-{i}");
                let ip = std::net::Ipv4Addr::from(u32::from(first) + i as u32);
                let svc: Service = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}
                }))
                .unwrap();
                services.create(&pp, &svc).await.unwrap();
                let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("{name}-slice"), "namespace": "default",
                                 "labels": {"kubernetes.io/service-name": name}},
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": ["10.244.0.10"], "nodeName": node,
                                   "conditions": {"ready": true}}]
                }))
                .unwrap();
                slices.create(&pp, &slice).await.unwrap();
                let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": ip.to_string()}]}}});
                services
                    .patch_status(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                    .await
                    .unwrap();
            }
        });
    }

    /// Addresses held on `node`'s eth0 besides its own.
    pub fn held_count(&self, node: &str) -> usize {
        let out = self
            .lan
            .host(node)
            .ns
            .ip("-o -4 addr show dev eth0")
            .unwrap_or_default();
        out.lines().count().saturating_sub(1)
    }

    /// Resident memory of the agent on `node`, in KiB.
    pub fn rss_kib(&self, node: &str) -> u64 {
        self.proc_status_kib(node, "VmRSS:")
    }

    /// A `/proc/PID/status` figure of the agent on `node` (`RssAnon:`,
    /// `RssFile:`, ...), in KiB.
    pub fn proc_status_kib(&self, node: &str, key: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid(node))).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// CPU time the agent on `node` used so far (user + system).
    pub fn cpu_time(&self, node: &str) -> Duration {
        hostlb_tests::netns::cpu_time(self.pid(node))
    }
}

/// The median of `v` (the upper one of an even count); NaN when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// The largest of `v`; NaN when empty.
pub fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

/// How often the end-to-end tests' client asks about a VIP.
pub const PROBE_EVERY: Duration = Duration::from_millis(10);

/// Waits until `mac` is the only one answering, from `t` on; what the
/// client saw from `t` until then.
pub fn until_only(probe: &ArpProbe, mac: &str, t: Instant, timeout: Duration) -> Outcome {
    let deadline = Instant::now() + timeout;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = Instant::now();
        let recent = probe.macs_between(now - Duration::from_millis(200), now);
        if recent == [mac.to_string()] {
            return probe.judge(t, now);
        }
        assert!(
            Instant::now() < deadline,
            "{mac} is not the only MAC answering: {recent:?}"
        );
    }
}
