//! `hostlb-demo`: hostlb working on one machine, for a newcomer's first five
//! minutes. Network namespaces make three hosts, an API server host and a
//! client on one bridge; the real `kube-testserver`, `allocator` and three
//! `lbnodeagent`s run there. The demo creates a LoadBalancer Service, shows
//! from the client's side which host answers ARP for its VIP, fails that
//! host, measures the outage, brings the host back and counts the replies
//! lost while it takes its VIP back. Run it through `./demo.sh` (as root),
//! which builds the binaries first.
//!
//! The last line is `demo: ok failover_ms=N reclaim_lost=N`, or
//! `demo: failed REASON` with a non-zero exit. Everything is torn down at
//! the end, on failure and on Ctrl-C; `--keep` leaves the cluster running
//! and prints how to reach it (a later run removes it first).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use hostlb_tests::netns::{Lan, NsRuntime, wait_for};
use hostlb_tests::probe::ArpProbe;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};

const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
const API_PORT: u16 = 6443;
const PROBE_EVERY: Duration = Duration::from_millis(10);
const RUN_DIR: &str = "/run/hostlb-demo";

/// What must go when the demo ends, however it ends: processes first, then
/// namespaces (a namespace with a process inside outlives `ip netns del`).
#[derive(Default)]
struct Teardown {
    children: Vec<Child>,
    namespaces: Vec<String>,
}

impl Teardown {
    fn run(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.children.clear();
        for ns in self.namespaces.drain(..) {
            // Quietly: the namespace may be gone already (dropped with the
            // LAN on the normal path).
            if let Ok(out) = Command::new("ip")
                .args(["netns", "pids", &ns])
                .stderr(Stdio::null())
                .output()
            {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill")
                        .args(["-9", pid])
                        .stderr(Stdio::null())
                        .status();
                }
            }
            let _ = Command::new("ip")
                .args(["netns", "del", &ns])
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(RUN_DIR);
    }
}

struct Demo {
    lan: Option<Lan>,
    api_rt: Option<NsRuntime>,
    teardown: Arc<Mutex<Teardown>>,
    bin: PathBuf,
    dir: PathBuf,
    kubeconfig: PathBuf,
    agents: Vec<Option<usize>>,
}

/// The blocked-signal mask of `pid`'s main thread, if it blocks SIGTERM
/// (signal 15, bit 14 of /proc's mask); `None` once the process is gone too.
fn sigterm_blocked(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))?
        .trim()
        .to_string();
    let bits = u64::from_str_radix(&mask, 16).ok()?;
    (bits & (1 << 14) != 0).then_some(mask)
}

fn say(line: &str) {
    println!("{line}");
}

fn phase(name: &str) {
    println!("\n== {name}");
}

fn waiting(what: &str) {
    println!("   … waiting for {what}");
}

fn main() {
    let keep = std::env::args().any(|a| a == "--keep");
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!(
            "usage: sudo ./demo.sh [--keep]\n  --keep  leave the cluster running and print how to reach it"
        );
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        println!(
            "demo: failed needs root: it creates network namespaces, links and addresses (run: sudo ./demo.sh)"
        );
        std::process::exit(1);
    }
    let teardown = Arc::new(Mutex::new(Teardown::default()));
    on_interrupt(teardown.clone());
    let result = run(teardown.clone(), keep);
    match result {
        Ok((failover, lost)) => {
            if keep {
                // Leave everything; the next run sweeps it.
                std::mem::take(&mut *teardown.lock().unwrap());
            } else {
                phase("teardown");
                teardown.lock().unwrap().run();
                say("   namespaces, processes and addresses removed");
            }
            println!("demo: ok failover_ms={failover} reclaim_lost={lost}");
        }
        Err(e) => {
            teardown.lock().unwrap().run();
            println!("demo: failed {}", format!("{e:#}").replace('\n', " "));
            std::process::exit(1);
        }
    }
}

/// Ctrl-C or SIGTERM: tear down from a thread of its own and exit.
///
/// Handlers, not a blocked mask waited on: a blocked mask is inherited by
/// every process the demo starts, and agents that cannot receive SIGTERM
/// cannot show a planned hand-over. (Handlers reset to the default in a
/// child at exec.)
fn on_interrupt(teardown: Arc<Mutex<Teardown>>) {
    let (ready_tx, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            let _ = ready_tx.send(());
            return;
        };
        let stopped = rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                let _ = ready_tx.send(());
                return false;
            };
            let _ = ready_tx.send(());
            tokio::select! {
                _ = int.recv() => true,
                _ = term.recv() => true,
            }
        });
        if stopped {
            println!("\n   interrupted: tearing down");
            if let Ok(mut t) = teardown.lock() {
                t.run();
            }
            println!("demo: failed interrupted");
            std::process::exit(130);
        }
    });
    // Handlers in place before anything is started.
    let _ = ready.recv();
}

fn run(teardown: Arc<Mutex<Teardown>>, keep: bool) -> Result<(u128, u64)> {
    let bin = std::env::current_exe()?
        .parent()
        .ok_or_else(|| anyhow!("no directory for the binaries"))?
        .to_path_buf();
    for b in ["lbnodeagent", "allocator", "kube-testserver"] {
        if !bin.join(b).exists() {
            bail!(
                "{} is missing; run the demo through ./demo.sh, which builds it",
                bin.join(b).display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(RUN_DIR);
    std::fs::create_dir_all(RUN_DIR)?;
    let dir = PathBuf::from(RUN_DIR);
    say("hostlb demo: three hosts, an API server and a client on one bridge (10.77.0.0/24)");

    phase("cluster");
    let mut roles = vec!["api"];
    roles.extend(NODES);
    roles.push("client");
    let lan = Lan::new(&roles).context("creating network namespaces")?;
    {
        let mut t = teardown.lock().unwrap();
        t.namespaces.push(lan.switch.name().to_string());
        t.namespaces
            .extend(lan.hosts.iter().map(|h| h.ns.name().to_string()));
    }
    let mut demo = Demo {
        api_rt: Some(lan.host("api").ns.runtime()?),
        lan: Some(lan),
        teardown,
        bin,
        kubeconfig: dir.join("kubeconfig"),
        dir,
        agents: vec![None; NODES.len()],
    };
    let result = demo.story();
    if keep && result.is_ok() {
        demo.print_keep();
        // The namespaces and processes stay; only this process's handles go.
        std::mem::forget(demo.lan.take());
        std::mem::forget(demo.api_rt.take());
    }
    result
}

impl Demo {
    fn lan(&self) -> &Lan {
        self.lan.as_ref().expect("set up")
    }

    fn spawn(&mut self, host: &str, program: &str, args: &[&str], log: &str) -> Result<usize> {
        let log = std::fs::File::create(self.dir.join(log))?;
        let path = self.bin.join(program);
        let child = self
            .lan()
            .host(host)
            .ns
            .command(path.to_str().unwrap(), args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {program} on {host}"))?;
        let pid = child.id();
        let index = {
            let mut t = self.teardown.lock().unwrap();
            t.children.push(child);
            t.children.len() - 1
        };
        // What is started here must take signals as under systemd: a
        // blocked SIGTERM would hide the planned hand-over. A program's
        // thread that starts a child blocks every signal for the instant of
        // the clone (glibc's posix_spawn does), so one reading may show a
        // full mask; only a mask that keeps SIGTERM blocked is the fault.
        let unblocked = wait_for("SIGTERM unblocked", Duration::from_secs(2), || {
            sigterm_blocked(pid).is_none().then_some(())
        });
        if unblocked.is_err()
            && let Some(mask) = sigterm_blocked(pid)
        {
            bail!("{program} on {host} starts with signals blocked (SigBlk {mask})");
        }
        Ok(index)
    }

    fn kill(&mut self, index: usize) {
        let mut t = self.teardown.lock().unwrap();
        let _ = t.children[index].kill();
        let _ = t.children[index].wait();
    }

    /// Runs `f` with an API client, inside the API host's namespace.
    fn api<T, F, Fut>(&self, f: F) -> T
    where
        F: FnOnce(kube::Client) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let url = format!("http://{}:{API_PORT}", self.lan().host("api").ipv4);
        self.api_rt
            .as_ref()
            .expect("set up")
            .run(move || async move {
                let config = kube::Config::new(url.parse().expect("valid url"));
                f(kube::Client::try_from(config).expect("a client")).await
            })
    }

    fn story(&mut self) -> Result<(u128, u64)> {
        self.start_cluster()?;
        let (ip, owner) = self.create_service()?;
        let failover = self.fail_owner(&ip, &owner)?;
        let lost = self.bring_back(&ip, &owner)?;
        self.show_status()?;
        self.show_fleet()?;
        Ok((failover, lost))
    }

    fn start_cluster(&mut self) -> Result<()> {
        let api_ip = self.lan().host("api").ipv4;
        let listen = format!("{api_ip}:{API_PORT}");
        let kubeconfig = self.kubeconfig.to_str().unwrap().to_string();
        self.spawn(
            "api",
            "kube-testserver",
            &["--listen", &listen, "--kubeconfig", &kubeconfig],
            "kube-testserver.log",
        )?;
        wait_for("the API server", Duration::from_secs(20), || {
            self.api(|c| async move { c.apiserver_version().await.is_ok() })
                .then_some(())
        })?;
        say(&format!("   api server   {listen}  (kube-testserver)"));

        let nodes: Vec<(String, Ipv4Addr)> = NODES
            .iter()
            .map(|n| (n.to_string(), self.lan().host(n).ipv4))
            .collect();
        self.api(move |c| async move { seed_objects(c, nodes).await })?;
        self.spawn(
            "api",
            "allocator",
            &[
                "run",
                "--kubeconfig",
                &kubeconfig,
                "--no-leader-election",
                "--identity",
                "demo",
                "--listen",
                "127.0.0.1:7473",
            ],
            "allocator.log",
        )?;
        say("   allocator    running (one replica)");

        let key = self.dir.join("gossip.key");
        let out = Command::new(self.bin.join("lbnodeagent"))
            .arg("keygen")
            .output()?;
        std::fs::write(&key, &out.stdout)?;
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        for (i, n) in NODES.iter().enumerate() {
            self.write_config(n, &key)?;
            self.start_agent(i)?;
            let h = self.lan().host(n);
            say(&format!(
                "   {n}       {}  mac {}  lbnodeagent running",
                h.ipv4,
                h.mac()
            ));
        }
        let client = self.lan().host("client");
        say(&format!(
            "   client       {}  mac {}",
            client.ipv4,
            client.mac()
        ));
        Ok(())
    }

    fn write_config(&self, node: &str, key: &Path) -> Result<()> {
        let text = format!(
            "node_name = \"{node}\"\nkubeconfig = \"{}\"\nrun_dir = \"{}\"\n[gossip]\nlisten = \"{}:7934\"\nkey_file = \"{}\"\n",
            self.kubeconfig.display(),
            self.dir.join(node).display(),
            self.lan().host(node).ipv4,
            key.display()
        );
        std::fs::write(self.dir.join(format!("{node}.toml")), text)?;
        Ok(())
    }

    fn start_agent(&mut self, i: usize) -> Result<()> {
        let n = NODES[i];
        let config = self.dir.join(format!("{n}.toml"));
        let idx = self.spawn(
            n,
            "lbnodeagent",
            &["run", "--config", config.to_str().unwrap()],
            &format!("{n}.log"),
        )?;
        self.agents[i] = Some(idx);
        Ok(())
    }

    fn node_of_mac(&self, mac: &str) -> String {
        NODES
            .iter()
            .find(|n| self.lan().host(n).mac() == mac)
            .map(|n| n.to_string())
            .unwrap_or_else(|| format!("unknown host {mac}"))
    }

    fn probe(&self, ip: &str) -> Result<ArpProbe> {
        let c = self.lan().host("client");
        Ok(ArpProbe::start(
            &c.ns,
            "eth0",
            &c.ipv4.to_string(),
            ip,
            PROBE_EVERY,
        )?)
    }

    fn create_service(&mut self) -> Result<(String, String)> {
        phase("a LoadBalancer Service");
        say("   pool demo: 10.77.0.100-10.77.0.120; L2Advertisement prefers node-1 (weight 50)");
        let created = Instant::now();
        self.api(|c| async move { create_web(c).await })?;
        waiting("the allocator to assign an address");
        let ip = wait_for(
            "an address in the Service's status",
            Duration::from_secs(30),
            || self.api(|c| async move { ingress_ip(c).await }),
        )?;
        say(&format!(
            "   shop/web got {ip} from the allocator in {} ms",
            created.elapsed().as_millis()
        ));
        let assigned = Instant::now();
        let probe = self.probe(&ip)?;
        waiting(&format!("a host to answer ARP for {ip}"));
        let first = wait_for("an ARP answer", Duration::from_secs(30), || {
            probe.since(assigned).first().cloned()
        })?;
        std::thread::sleep(Duration::from_millis(500));
        let macs = probe.macs_between(first.at, Instant::now());
        let owner = self.node_of_mac(&first.mac);
        say(&format!(
            "   {ip} answers from {owner} ({}), the preferred node",
            first.mac
        ));
        if macs.len() != 1 {
            bail!("{} hosts answer for {ip}: {macs:?}", macs.len());
        }
        say(&format!(
            "   exactly one MAC answered {} probes",
            probe.since(first.at).len()
        ));
        Ok((ip, owner))
    }

    fn fail_owner(&mut self, ip: &str, owner: &str) -> Result<u128> {
        phase(&format!("{owner} fails (agent killed, cable pulled)"));
        let probe = self.probe(ip)?;
        std::thread::sleep(Duration::from_millis(300));
        let i = NODES.iter().position(|n| n == &owner).expect("a node");
        let t = Instant::now();
        if let Some(idx) = self.agents[i].take() {
            self.kill(idx);
        }
        self.lan().set_port(owner, false)?;
        waiting("another host to answer");
        let owner_mac = self.lan().host(owner).mac().to_string();
        let next = wait_for("a new owner", Duration::from_secs(10), || {
            probe.since(t).into_iter().find(|r| r.mac != owner_mac)
        })?;
        std::thread::sleep(Duration::from_millis(500));
        let o = probe.judge(t, Instant::now());
        let new_owner = self.node_of_mac(&next.mac);
        say(&format!(
            "   {ip} answers from {new_owner} ({}) after an outage of {} ms",
            next.mac,
            o.outage.as_millis()
        ));
        Ok(o.outage.as_millis())
    }

    fn bring_back(&mut self, ip: &str, owner: &str) -> Result<u64> {
        phase(&format!("{owner} comes back"));
        let i = NODES.iter().position(|n| n == &owner).expect("a node");
        // The agent first, then the cable: a restarted agent removes the
        // address its killed predecessor left, before the host is heard.
        self.start_agent(i)?;
        std::thread::sleep(Duration::from_secs(1));
        let probe = self.probe(ip)?;
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        self.lan().set_port(owner, true)?;
        waiting(&format!("{owner} to take {ip} back"));
        let owner_mac = self.lan().host(owner).mac().to_string();
        wait_for(
            "the preferred node to answer again",
            Duration::from_secs(20),
            || {
                let now = Instant::now();
                let recent = probe.macs_between(now - Duration::from_millis(300), now);
                (recent == [owner_mac.clone()]).then_some(())
            },
        )?;
        let o = probe.judge(t, Instant::now());
        say(&format!(
            "   {ip} answers from {owner} again; replies lost: {}, two hosts answered for {} ms (make before break)",
            o.lost,
            o.two_owners.as_millis()
        ));
        Ok(o.lost)
    }

    fn show_status(&self) -> Result<()> {
        let node = NODES[1];
        phase(&format!("lbnodeagent status on {node}"));
        let config = self.dir.join(format!("{node}.toml"));
        let out = self
            .lan()
            .host(node)
            .ns
            .run(&[
                self.bin.join("lbnodeagent").to_str().unwrap(),
                "status",
                "--config",
                config.to_str().unwrap(),
            ])
            .context("lbnodeagent status")?;
        for line in out.lines() {
            println!("   {line}");
        }
        Ok(())
    }

    /// The same cluster from the API alone, as an operator's kubectl sees
    /// it: the agents' records and `kubectl hostlb`.
    fn show_fleet(&self) -> Result<()> {
        let kubeconfig = self.kubeconfig.to_str().unwrap().to_string();
        let plugin = self.bin.join("kubectl-hostlb");
        // A restarted agent's record says Ready, with its members, within
        // the record's 5 s write gap: shown before that, the computation
        // would leave it out while its annotation says it announces.
        let settled = || -> Option<()> {
            let out = self
                .lan()
                .host("api")
                .ns
                .run(&[
                    plugin.to_str()?,
                    "--kubeconfig",
                    &kubeconfig,
                    "explain",
                    "svc/web",
                    "-n",
                    "shop",
                    "-o",
                    "json",
                ])
                .ok()?;
            let doc: serde_json::Value = serde_json::from_str(&out).ok()?;
            let addresses = doc["addresses"].as_array()?;
            (!addresses.is_empty() && addresses.iter().all(|a| a["agrees"] == true)).then_some(())
        };
        if wait_for(
            "the agents' records to settle",
            Duration::from_secs(20),
            settled,
        )
        .is_err()
        {
            say("   (the records have not settled: what follows may disagree)");
        }
        for args in [&["status"][..], &["explain", "svc/web", "-n", "shop"]] {
            phase(&format!("kubectl hostlb {}", args.join(" ")));
            let mut argv = vec![plugin.to_str().unwrap(), "--kubeconfig", &kubeconfig];
            argv.extend_from_slice(args);
            let out = self
                .lan()
                .host("api")
                .ns
                .run(&argv)
                .with_context(|| format!("kubectl hostlb {}", args.join(" ")))?;
            for line in out.lines() {
                println!("   {line}");
            }
        }
        Ok(())
    }

    fn print_keep(&self) {
        phase("the cluster stays up (--keep)");
        say(&format!("   kubeconfig: {}", self.kubeconfig.display()));
        let api = self.lan().host("api");
        say(&format!(
            "   kubectl:    ip netns exec {} kubectl --kubeconfig {} get svc -A",
            api.ns.name(),
            self.kubeconfig.display()
        ));
        for n in NODES {
            let h = self.lan().host(n);
            say(&format!(
                "   {n}:     ip netns exec {} {} status --config {}",
                h.ns.name(),
                self.bin.join("lbnodeagent").display(),
                self.dir.join(format!("{n}.toml")).display()
            ));
        }
        say(&format!(
            "   client:     ip netns exec {} arping -I eth0 10.77.0.100",
            self.lan().host("client").ns.name()
        ));
        say("   logs:       /run/hostlb-demo/*.log; the next ./demo.sh removes this cluster first");
    }
}

async fn seed_objects(c: kube::Client, nodes: Vec<(String, Ipv4Addr)>) -> Result<()> {
    let pp = PostParams::default();
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    for (_, crd) in hostlb_api::crds::all() {
        crds.create(&pp, &crd).await.context("creating CRDs")?;
    }
    let namespaces: Api<Namespace> = Api::all(c.clone());
    for ns in ["hostlb-system", "shop"] {
        let obj: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?;
        namespaces.create(&pp, &obj).await?;
    }
    let node_api: Api<Node> = Api::all(c.clone());
    for (name, ip) in nodes {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}
        }))?;
        node_api.create(&pp, &node).await?;
        let status = serde_json::json!({"status": {"addresses": [{"type": "InternalIP", "address": ip.to_string()}]}});
        node_api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
    }
    // The CRDs are served once established; wait for that before objects.
    let pools = dynamic(&c, "IPAddressPool", "ipaddresspools");
    let ads = dynamic(&c, "L2Advertisement", "l2advertisements");
    let pool: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "hostlb.io/v1", "kind": "IPAddressPool",
        "metadata": {"name": "demo", "namespace": "hostlb-system"},
        "spec": {"addresses": ["10.77.0.100-10.77.0.120"]}
    }))?;
    let ad: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "hostlb.io/v1", "kind": "L2Advertisement",
        "metadata": {"name": "demo", "namespace": "hostlb-system"},
        "spec": {"ipAddressPools": ["demo"], "preferredNodeSelectors": [
            {"weight": 50, "preference": {"matchLabels": {"kubernetes.io/hostname": "node-1"}}}
        ]}
    }))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match pools.create(&pp, &pool).await {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = e;
            }
            Err(e) => return Err(e).context("creating the IPAddressPool"),
        }
    }
    ads.create(&pp, &ad)
        .await
        .context("creating the L2Advertisement")?;
    Ok(())
}

fn dynamic(c: &kube::Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk("hostlb.io", "v1", kind);
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(c.clone(), "hostlb-system", &ar)
}

async fn create_web(c: kube::Client) -> Result<()> {
    let pp = PostParams::default();
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "web"},
                 "ports": [{"port": 80, "protocol": "TCP"}]}
    }))?;
    Api::<Service>::namespaced(c.clone(), "shop")
        .create(&pp, &svc)
        .await
        .context("creating the Service")?;
    let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-1", "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.1.10"], "nodeName": "node-2",
                       "conditions": {"ready": true}}],
        "ports": [{"port": 8080, "protocol": "TCP"}]
    }))?;
    Api::<EndpointSlice>::namespaced(c, "shop")
        .create(&pp, &slice)
        .await
        .context("creating the EndpointSlice")?;
    Ok(())
}

async fn ingress_ip(c: kube::Client) -> Option<String> {
    let svc = Api::<Service>::namespaced(c, "shop")
        .get("web")
        .await
        .ok()?;
    let ip = svc
        .status?
        .load_balancer?
        .ingress?
        .into_iter()
        .find_map(|i| i.ip)?;
    ip.parse::<IpAddr>().ok().map(|_| ip)
}
