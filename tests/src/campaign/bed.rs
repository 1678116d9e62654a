//! The bed: hosts in network namespaces on the breakable switch, each
//! running the release agent under [`unit`](super::unit)'s systemd; the
//! allocator and an API server (the real kube-apiserver where this machine
//! has it, with the RBAC and identities we ship, else the test server) on
//! a host of their own; and a client host probing every address of the
//! pool, ARP and NS every 10 ms, stamped by the kernel.
//!
//! What it records for the checker: every probe and answer, every unit's
//! events, and the Services' addresses over time (read by the admin every
//! 200 ms: the API host's own traffic never crosses the switch, so an
//! outage of the nodes' API leaves the admin, the allocator and this
//! record working).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::apiserver::TestServer;
use crate::netns::{Lan, NsRuntime, require_root, require_tools};
use crate::probe::ArpProbe;
use crate::realserver::RealServer;

use super::unit::{Spec, Unit};

pub const API_PORT: u16 = 6443;
/// How often the client asks about each address.
pub const PROBE_EVERY: Duration = Duration::from_millis(10);
/// How often the Services' addresses are read.
pub const TIMELINE_EVERY: Duration = Duration::from_millis(200);

/// The binaries the bed runs.
#[derive(Clone, Debug)]
pub struct Bins {
    pub agent: PathBuf,
    pub allocator: PathBuf,
    pub plugin: PathBuf,
}

impl Bins {
    /// `lbnodeagent`, `allocator` and `kubectl-hostlb` from `dir`.
    pub fn in_dir(dir: &Path) -> Result<Bins, String> {
        let b = Bins {
            agent: dir.join("lbnodeagent"),
            allocator: dir.join("allocator"),
            plugin: dir.join("kubectl-hostlb"),
        };
        for p in [&b.agent, &b.allocator, &b.plugin] {
            if !p.exists() {
                return Err(format!(
                    "{} is missing: build the release binaries (packaging/build.sh, or cargo build --release -p lbnodeagent -p hostlb-allocator -p kubectl-hostlb) and name their folder with --bin-dir",
                    p.display()
                ));
            }
        }
        Ok(b)
    }
}

/// The Services' LoadBalancer addresses as read at one time.
pub type Assigned = BTreeMap<IpAddr, String>;

pub struct Bed {
    // Field order is drop order: the agents first (their cleanup needs the
    // LAN), then the probers, the allocator, the servers, the LAN.
    pub units: BTreeMap<String, Unit>,
    pub probes: Vec<(IpAddr, ArpProbe)>,
    allocator: Option<Child>,
    timeline: Arc<Mutex<Vec<(Instant, Assigned)>>>,
    server: Option<TestServer>,
    real: Option<RealServer>,
    pub api_rt: NsRuntime,
    pub lan: Lan,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub bins: Bins,
    pub nodes: Vec<String>,
    /// The pool, IPv4 addresses first.
    pub pool: Vec<IpAddr>,
    pub pool_size: usize,
}

impl Bed {
    /// Builds the bed in `dir` (kept: logs, configs, the servers' state)
    /// with `nodes` agents and `pool_size` addresses of each family;
    /// switch faults drawn from `seed`. Agents are started, not yet the
    /// Services.
    pub fn start(dir: &Path, bins: Bins, nodes: usize, pool_size: usize, seed: u64) -> Bed {
        require_root();
        require_tools(&["kubectl", "python3", "nft", "ethtool"]);
        let nodes: Vec<String> = (1..=nodes).map(|i| format!("n{i}")).collect();
        let mut roles = vec!["api"];
        roles.extend(nodes.iter().map(String::as_str));
        roles.push("client");
        let lan = Lan::switched(&roles, seed).expect("the switched LAN");
        let api = lan.host("api");
        let api_rt = api.ns.runtime().expect("a runtime in the API host");
        std::fs::create_dir_all(dir).expect("the campaign's folder");
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let (server, real, kubeconfig) = match RealServer::available() {
            Ok(()) => {
                let r = RealServer::start(&api.ns, api.ipv4.into(), API_PORT, &dir.join("k8s"));
                let kc = r.admin_kubeconfig();
                (None, Some(r), kc)
            }
            Err(why) => {
                eprintln!("campaign: the test API server stands in ({why})");
                let listen = std::net::SocketAddr::new(api.ipv4.into(), API_PORT);
                let server =
                    api_rt.run(move || async move { TestServer::start_on(listen).await.unwrap() });
                let kc = dir.join("kubeconfig");
                server.write_kubeconfig(&kc).expect("the kubeconfig");
                (Some(server), None, kc)
            }
        };
        let pool: Vec<IpAddr> = (0..pool_size)
            .map(|i| IpAddr::from([10, 77, 0, 200 + i as u8]))
            .chain((0..pool_size).map(|i| {
                IpAddr::from(std::net::Ipv6Addr::new(
                    0xfd00,
                    0x77,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0x200 + i as u16,
                ))
            }))
            .collect();
        let mut bed = Bed {
            units: BTreeMap::new(),
            probes: Vec::new(),
            allocator: None,
            timeline: Arc::default(),
            server,
            real,
            api_rt,
            lan,
            dir: dir.to_path_buf(),
            kubeconfig,
            bins,
            nodes,
            pool,
            pool_size,
        };
        bed.kubectl(&["apply", "-f", deploy.join("crds").to_str().unwrap()]);
        bed.kubectl(&[
            "apply",
            "-f",
            deploy.join("namespace.yaml").to_str().unwrap(),
        ]);
        let allocator_kc = if let Some(r) = &bed.real {
            for f in [
                "agent/rbac.yaml",
                "agent/policy-v1beta1.yaml",
                "allocator/rbac.yaml",
            ] {
                bed.kubectl(&["apply", "-f", deploy.join(f).to_str().unwrap()]);
            }
            r.wait_granted(&std::fs::read_to_string(deploy.join("agent/rbac.yaml")).unwrap());
            r.wait_granted(&std::fs::read_to_string(deploy.join("allocator/rbac.yaml")).unwrap());
            for n in &bed.nodes {
                r.node_identity(n, &bed.dir.join("identity").join(n));
            }
            let kc = bed.dir.join("allocator.kubeconfig");
            r.service_account_kubeconfig("hostlb-system", "hostlb-allocator", &kc);
            kc
        } else {
            bed.kubeconfig.clone()
        };
        for n in bed.nodes.clone() {
            let ip = bed.lan.host(&n).ipv4;
            bed.apply(&format!(
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: {n}\n  labels: {{kubernetes.io/hostname: {n}}}\n"
            ));
            bed.kubectl(&[
                "patch",
                "node",
                &n,
                "--subresource=status",
                "--type=merge",
                "-p",
                &format!(
                    r#"{{"status":{{"addresses":[{{"type":"InternalIP","address":"{ip}"}}]}}}}"#
                ),
            ]);
        }
        let v4: Vec<String> = bed.pool[..pool_size]
            .iter()
            .map(|a| format!("{a}/32"))
            .collect();
        let v6: Vec<String> = bed.pool[pool_size..]
            .iter()
            .map(|a| format!("{a}/128"))
            .collect();
        bed.apply(&format!(
            "apiVersion: hostlb.io/v1\nkind: IPAddressPool\nmetadata: {{name: pool, namespace: hostlb-system}}\nspec:\n  addresses: [{}]\n",
            v4.iter().chain(&v6).cloned().collect::<Vec<_>>().join(", ")
        ));
        bed.preferences(&[]).expect("the advertisement");

        // The allocator, one replica (no Lease: the campaign's faults are
        // the agents').
        let log = std::fs::File::create(bed.dir.join("allocator.log")).expect("its log");
        let allocator = bed
            .lan
            .host("api")
            .ns
            .command(
                bed.bins.allocator.to_str().unwrap(),
                &[
                    "run",
                    "--kubeconfig",
                    allocator_kc.to_str().unwrap(),
                    "--no-leader-election",
                    "--identity",
                    "campaign",
                    "--listen",
                    "127.0.0.1:7473",
                ],
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the allocator");
        bed.allocator = Some(allocator);

        // The agents' shared gossip key, and each one's config.
        let key = bed.dir.join("gossip.key");
        let out = std::process::Command::new(&bed.bins.agent)
            .arg("keygen")
            .output()
            .expect("lbnodeagent keygen");
        std::fs::write(&key, &out.stdout).expect("the key");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("the key's mode");
        for n in bed.nodes.clone() {
            let kc = if bed.real.is_some() {
                bed.dir.join("identity").join(&n).join("kubeconfig")
            } else {
                bed.kubeconfig.clone()
            };
            let config = bed.dir.join(format!("{n}.toml"));
            std::fs::write(
                &config,
                format!(
                    "node_name = \"{n}\"\nkubeconfig = \"{}\"\nrun_dir = \"{}\"\n[gossip]\nkey_file = \"{}\"\n",
                    kc.display(),
                    bed.dir.join(format!("{n}-run")).display(),
                    key.display()
                ),
            )
            .expect("the config");
            let unit = Unit::start(Spec {
                node: n.clone(),
                netns: bed.lan.host(&n).ns.name().to_string(),
                binary: bed.bins.agent.clone(),
                config,
                log: bed.log_path(&n),
                notify: bed.dir.join(format!("{n}.notify")),
                env: vec![(
                    "RUST_LOG".into(),
                    "info,lbnodeagent=debug,kube_client::client::builder=off".into(),
                )],
            });
            bed.units.insert(n, unit);
        }

        // The client asks about every address of the pool.
        let client = bed.lan.host("client");
        let mut probes = Vec::new();
        for ip in &bed.pool {
            let source = match ip {
                IpAddr::V4(_) => client.ipv4.to_string(),
                IpAddr::V6(_) => client.ipv6.to_string(),
            };
            probes.push((
                *ip,
                ArpProbe::start(&client.ns, "eth0", &source, &ip.to_string(), PROBE_EVERY)
                    .expect("a prober"),
            ));
        }
        bed.probes = probes;
        bed.watch_services();
        bed
    }

    pub fn log_path(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.log"))
    }

    pub fn is_real(&self) -> bool {
        self.real.is_some()
    }

    /// `kubectl` as the admin, from the API host; its output, or its error.
    pub fn try_kubectl(&self, args: &[&str]) -> Result<String, String> {
        let mut argv = vec!["--kubeconfig", self.kubeconfig.to_str().unwrap()];
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

    pub fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args)
            .unwrap_or_else(|e| panic!("kubectl {}: {e}", args.join(" ")))
    }

    pub fn try_apply(&self, yaml: &str) -> Result<String, String> {
        let path = self.dir.join("apply.yaml");
        std::fs::write(&path, yaml).map_err(|e| e.to_string())?;
        self.try_kubectl(&["apply", "-f", path.to_str().unwrap()])
    }

    pub fn apply(&self, yaml: &str) {
        self.try_apply(yaml)
            .unwrap_or_else(|e| panic!("kubectl apply: {e}\n{yaml}"));
    }

    /// The advertisement, preferring nodes by `weights` (0 or absent: no
    /// preference for that node).
    pub fn preferences(&self, weights: &[(String, u32)]) -> Result<String, String> {
        let prefs: Vec<String> = weights
            .iter()
            .filter(|(_, w)| *w > 0)
            .map(|(n, w)| {
                format!(
                    "{{weight: {w}, preference: {{matchLabels: {{kubernetes.io/hostname: {n}}}}}}}"
                )
            })
            .collect();
        self.try_apply(&format!(
            "apiVersion: hostlb.io/v1\nkind: L2Advertisement\nmetadata: {{name: ad, namespace: hostlb-system}}\nspec:\n  preferredNodeSelectors: [{}]\n",
            prefs.join(", ")
        ))
    }

    /// A dual-stack LoadBalancer Service with ready endpoints on
    /// `endpoints`.
    pub fn create_service(
        &self,
        name: &str,
        local: bool,
        endpoints: &[String],
    ) -> Result<(), String> {
        let policy = if local { "Local" } else { "Cluster" };
        self.try_apply(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  type: LoadBalancer\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  externalTrafficPolicy: {policy}\n  ports: [{{name: web, port: 80, protocol: TCP}}]\n"
        ))?;
        self.endpoints(name, endpoints)
    }

    pub fn delete_service(&self, name: &str) -> Result<(), String> {
        self.try_kubectl(&["delete", "service", name, "--wait=false"])?;
        self.try_kubectl(&[
            "delete",
            "endpointslice",
            &format!("{name}-slice"),
            "--ignore-not-found",
            "--wait=false",
        ])
        .map(drop)
    }

    pub fn service_port(&self, name: &str, port: u16) -> Result<(), String> {
        self.try_kubectl(&[
            "patch",
            "service",
            name,
            "--type=json",
            "-p",
            &format!(r#"[{{"op":"replace","path":"/spec/ports/0/port","value":{port}}}]"#),
        ])
        .map(drop)
    }

    /// The Service's EndpointSlice: one ready endpoint on each node.
    pub fn endpoints(&self, name: &str, nodes: &[String]) -> Result<(), String> {
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
        self.try_apply(&format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-slice\n  namespace: default\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports: [{{name: web, port: 8080, protocol: TCP}}]\nendpoints:\n{}\n",
            eps.join("\n")
        ))
        .map(drop)
    }

    /// `kubectl hostlb drain NODE --no-wait`, or `undrain`.
    pub fn drain(&self, node: &str, drain: bool) -> Result<(), String> {
        let mut args = vec![if drain { "drain" } else { "undrain" }, node];
        if drain {
            args.push("--no-wait");
        }
        let out = self
            .lan
            .host("api")
            .ns
            .command(self.bins.plugin.to_str().unwrap(), &args)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// A client with the admin's identity, for reads from the API host.
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

    /// Records the Services' addresses every [`TIMELINE_EVERY`], each time
    /// they change (and the first time).
    fn watch_services(&self) {
        let config = self.admin_config();
        let sink = self.timeline.clone();
        self.api_rt.run(move || async move {
            tokio::task::spawn_local(async move {
                let client = kube::Client::try_from(config).expect("a client");
                let api: kube::Api<k8s_openapi::api::core::v1::Service> = kube::Api::all(client);
                let mut tick = tokio::time::interval(TIMELINE_EVERY);
                loop {
                    tick.tick().await;
                    let Ok(list) = api.list(&Default::default()).await else {
                        continue;
                    };
                    let now = Instant::now();
                    let mut assigned = Assigned::new();
                    for s in list.items {
                        let name = s.metadata.name.clone().unwrap_or_default();
                        for i in s
                            .status
                            .and_then(|st| st.load_balancer)
                            .and_then(|lb| lb.ingress)
                            .unwrap_or_default()
                        {
                            if let Some(ip) = i.ip.and_then(|ip| ip.parse().ok()) {
                                assigned.insert(ip, name.clone());
                            }
                        }
                    }
                    let mut t = sink.lock().unwrap_or_else(|e| e.into_inner());
                    if t.last().is_none_or(|(_, last)| *last != assigned) {
                        t.push((now, assigned));
                    }
                }
            });
        });
    }

    /// The Services' addresses over time, as read.
    pub fn timeline(&self) -> Vec<(Instant, Assigned)> {
        self.timeline
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The node whose `eth0` has `mac`.
    pub fn node_of_mac(&self, mac: &str) -> Option<String> {
        self.nodes
            .iter()
            .find(|n| self.lan.host(n).mac() == mac)
            .cloned()
    }

    /// The addresses of the pool in `node`'s kernel, on any interface, with
    /// their prefix length and interface.
    pub fn kernel_vips(&self, node: &str) -> Vec<(IpAddr, u8, String)> {
        let out = self
            .lan
            .host(node)
            .ns
            .ip("-o addr show")
            .unwrap_or_default();
        let mut vips = Vec::new();
        for line in out.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            let Some(i) = w.iter().position(|x| *x == "inet" || *x == "inet6") else {
                continue;
            };
            let Some((ip, len)) = w.get(i + 1).and_then(|a| a.split_once('/')) else {
                continue;
            };
            let (Ok(ip), Ok(len)) = (ip.parse::<IpAddr>(), len.parse::<u8>()) else {
                continue;
            };
            if self.pool.contains(&ip) {
                vips.push((
                    ip,
                    len,
                    w.get(1).unwrap_or(&"").trim_end_matches(':').to_string(),
                ));
            }
        }
        vips
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // Units first, all told at once (each one's drop then waits for its
        // agent's leave and cleanup).
        for u in self.units.values() {
            u.send(super::unit::Order::Shutdown);
        }
        self.units.clear();
        if let Some(mut a) = self.allocator.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
    }
}
