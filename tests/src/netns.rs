//! Network namespaces for real-kernel tests: hosts on a bridged LAN, commands
//! and async Rust code run inside them, packet captures, and cleanup on
//! `Drop` even when a test panics.
//!
//! ```no_run
//! use hostlb_tests::netns::{Lan, require_root};
//! require_root();
//! let lan = Lan::new(&["a", "client"]).unwrap();
//! let a = lan.host("a");
//! let rt = a.ns.runtime().unwrap();
//! let up = rt.run(|| async { 1 + 1 }); // on a thread inside a's namespace
//! lan.host("client").ns.run(&["arping", "-c", "1", "-I", "eth0", "10.77.0.11"]).unwrap();
//! # let _ = up;
//! ```
//!
//! Namespace names carry the process id (`hlb<pid>-<n>-<role>`), so test
//! binaries running in parallel never collide, and namespaces left by a
//! process that was killed are removed by the next run. Every address lives
//! inside these namespaces (10.77.0.0/24, fd00:77::/64): nothing reaches the
//! host's own network.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::pin::Pin;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::thread;
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};

pub type Result<T, E = NetnsError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot run `{command}`: {source}; is it installed?")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("cannot enter network namespace {name}: {reason}")]
    Enter { name: String, reason: String },
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
}

/// The address plan of [`Lan`].
pub const LAN_V4_PREFIX: &str = "10.77.0.0/24";
pub const LAN_V6_PREFIX: &str = "fd00:77::/64";
/// Default routes point here; nothing answers unless a test adds a router
/// ([`Lan::add_gateway`]): most need only the route to exist.
pub const LAN_V4_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
pub const LAN_V6_GATEWAY: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 1);

/// Panics unless the test can create network namespaces. Real-kernel tests
/// call this first so that a run without privileges fails loudly instead of
/// passing without testing anything.
pub fn require_root() {
    if !nix::unistd::geteuid().is_root() {
        panic!(
            "needs root (CAP_NET_ADMIN) and network namespaces; run as root (CI does), e.g. sudo -E cargo test"
        );
    }
    if let Err(e) = Netns::new("probe") {
        panic!(
            "needs root (CAP_NET_ADMIN) and network namespaces; run as root: creating a namespace failed: {e}"
        );
    }
}

/// CPU time process `pid` used so far, all its threads, user and system;
/// zero once it is gone.
pub fn cpu_time(pid: u32) -> std::time::Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return std::time::Duration::ZERO;
    };
    // Fields after the command name, which may hold spaces: state is the
    // first, utime the 12th, stime the 13th.
    let after = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    let hz = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse::<u64>().ok())
        .unwrap_or(100);
    std::time::Duration::from_micros(ticks * 1_000_000 / hz)
}

/// Panics unless every program is on PATH, naming the package to install.
pub fn require_tools(programs: &[&str]) {
    for p in programs {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            panic!(
                "this test needs `{p}`; install the test tools with: apt-get install -y iputils-arping ndisc6 tcpdump iproute2 nftables ethtool (or the package that provides it)"
            );
        }
    }
}

fn command_line(program: &str, args: &[&str]) -> String {
    std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs a command and returns its standard output, or an error carrying its
/// standard error.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let command = command_line(program, args);
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| NetnsError::Spawn {
            command: command.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(NetnsError::Failed {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Polls `check` until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            return Err(NetnsError::Timeout {
                what: what.to_string(),
                after: timeout,
            });
        }
        thread::sleep(Duration::from_millis(20));
    }
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);
static SWEEP: Once = Once::new();

const PREFIX: &str = "hlb";

/// Deletes namespaces named by this harness whose process is gone (a test
/// run killed before its `Drop`s ran). Never touches other names.
fn sweep_stale() {
    let Ok(list) = run("ip", &["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            // Processes left inside (a demo kept with --keep, agents of a
            // killed test run) would keep the namespace alive after `del`.
            if let Ok(pids) = run("ip", &["netns", "pids", name]) {
                for p in pids.split_whitespace() {
                    let _ = run("kill", &["-9", p]);
                }
            }
            let _ = run("ip", &["netns", "del", name]);
        }
    }
}

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// A new empty namespace with loopback up; `role` makes the name readable
    /// in `ip netns list`.
    pub fn new(role: &str) -> Result<Netns> {
        SWEEP.call_once(sweep_stale);
        let name = format!(
            "{PREFIX}{}-{}-{role}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        run("ip", &["netns", "add", &name])?;
        let ns = Netns { name };
        ns.ip("link set lo up")?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n NAME ARGS`, with `args` split on whitespace.
    pub fn ip(&self, args: &str) -> Result<String> {
        let mut argv = vec!["-n", &self.name];
        argv.extend(args.split_whitespace());
        run("ip", &argv)
    }

    /// A command that runs inside the namespace (`ip netns exec`).
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]).args(args);
        c.stdin(Stdio::null());
        c
    }

    /// Runs `argv` inside the namespace; its standard output, or an error.
    pub fn run(&self, argv: &[&str]) -> Result<String> {
        let mut full = vec!["netns", "exec", &self.name];
        full.extend_from_slice(argv);
        run("ip", &full)
    }

    /// Runs `argv` inside the namespace and returns its output whatever its
    /// exit status, for commands expected to fail.
    pub fn output(&self, argv: &[&str]) -> Result<Output> {
        let (program, args) = argv.split_first().expect("a program to run");
        self.command(program, args)
            .output()
            .map_err(|source| NetnsError::Spawn {
                command: command_line(program, args),
                source,
            })
    }

    /// Sets a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.run(&["sysctl", "-q", "-w", &format!("{key}={value}")])
            .map(drop)
    }

    /// A thread inside the namespace running a Tokio runtime, for async code
    /// whose sockets must belong to the namespace.
    pub fn runtime(&self) -> Result<NsRuntime> {
        NsRuntime::start(&self.name)
    }

    /// Runs one async function to completion inside the namespace, on a
    /// fresh thread and current-thread runtime.
    pub fn block_on<F, Fut, T>(&self, f: F) -> Result<T>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
        T: Send + 'static,
    {
        let name = self.name.clone();
        thread::spawn(move || {
            enter(&name)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| NetnsError::Enter {
                    name: name.clone(),
                    reason: format!("building a runtime: {e}"),
                })?;
            Ok(rt.block_on(f()))
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// Starts `tcpdump` on `interface` with `filter` and waits until it
    /// listens, so nothing sent afterwards is missed.
    pub fn capture(&self, interface: &str, filter: &str) -> Result<Capture> {
        Capture::start(self, interface, filter)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Links inside go with the namespace; veth peers elsewhere too.
        if let Err(e) = run("ip", &["netns", "del", &self.name]) {
            eprintln!("cleanup: {e}");
        }
    }
}

pub(crate) fn enter(name: &str) -> Result<()> {
    let path = format!("/run/netns/{name}");
    let f = std::fs::File::open(&path).map_err(|e| NetnsError::Enter {
        name: name.to_string(),
        reason: format!("opening {path}: {e}"),
    })?;
    setns(&f, CloneFlags::CLONE_NEWNET).map_err(|e| NetnsError::Enter {
        name: name.to_string(),
        reason: e.to_string(),
    })
}

type Job = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// A thread inside a namespace that runs async jobs on a current-thread Tokio
/// runtime. Tasks a job spawns keep running between jobs (a netlink
/// connection, an event listener), so objects created in one job can be
/// used from later ones. Dropping it stops the runtime and joins the thread.
pub struct NsRuntime {
    name: String,
    jobs: Option<tokio::sync::mpsc::UnboundedSender<Job>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl NsRuntime {
    fn start(name: &str) -> Result<NsRuntime> {
        let (jobs, mut rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread_name = name.to_string();
        let thread = thread::Builder::new()
            .name(format!("netns-{name}"))
            .spawn(move || {
                let rt = enter(&thread_name).and_then(|()| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| NetnsError::Enter {
                            name: thread_name.clone(),
                            reason: format!("building a runtime: {e}"),
                        })
                });
                let rt = match rt {
                    Ok(rt) => {
                        let _ = ready_tx.send(Ok(()));
                        rt
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, async move {
                    while let Some(job) = rx.recv().await {
                        tokio::task::spawn_local(job());
                    }
                });
            })
            .map_err(|e| NetnsError::Enter {
                name: name.to_string(),
                reason: format!("spawning a thread: {e}"),
            })?;
        ready_rx.recv().map_err(|_| NetnsError::Enter {
            name: name.to_string(),
            reason: "the namespace thread died".to_string(),
        })??;
        Ok(NsRuntime {
            name: name.to_string(),
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Runs `f` inside the namespace and waits for its result. Panics if the
    /// job panicked (its message is printed by the panic hook).
    pub fn run<F, Fut, T>(&self, f: F) -> T
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::channel();
        let job: Job = Box::new(move || {
            Box::pin(async move {
                let _ = tx.send(f().await);
            })
        });
        self.jobs
            .as_ref()
            .expect("running")
            .send(job)
            .unwrap_or_else(|_| panic!("the runtime of namespace {} has stopped", self.name));
        rx.recv()
            .unwrap_or_else(|_| panic!("a job in namespace {} panicked", self.name))
    }
}

impl Drop for NsRuntime {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A running `tcpdump`, its output collected line by line (a packet's
/// continuation lines joined to it). Killed on drop.
pub struct Capture {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Capture {
    fn start(ns: &Netns, interface: &str, filter: &str) -> Result<Capture> {
        let mut args = vec!["-i", interface, "-n", "-e", "-l", "-vv"];
        args.extend(filter.split_whitespace());
        let mut child = ns
            .command("tcpdump", &args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| NetnsError::Spawn {
                command: command_line("tcpdump", &args),
                source,
            })?;
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let stdout = child.stdout.take().expect("piped");
        let sink = Arc::clone(&lines);
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                let mut lines = sink.lock().unwrap_or_else(|e| e.into_inner());
                match lines.last_mut() {
                    Some(last) if line.starts_with(char::is_whitespace) => {
                        last.push(' ');
                        last.push_str(line.trim());
                    }
                    _ => lines.push(line),
                }
            }
        });
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().expect("piped");
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                if line.contains("listening on") {
                    let _ = ready_tx.send(());
                }
            }
        });
        let timeout = Duration::from_secs(5);
        if ready_rx.recv_timeout(timeout).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(NetnsError::Timeout {
                what: format!("tcpdump to listen on {interface} in {}", ns.name()),
                after: timeout,
            });
        }
        Ok(Capture { child, lines })
    }

    /// The packets seen so far, one line each.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until `count` packets matching `pred` have been seen and
    /// returns them.
    pub fn wait_for(
        &self,
        count: usize,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>> {
        wait_for(&format!("{count} captured packets"), timeout, || {
            let hits: Vec<String> = self.lines().into_iter().filter(|l| pred(l)).collect();
            (hits.len() >= count).then_some(hits)
        })
        .map_err(|e| match e {
            NetnsError::Timeout { what, after } => NetnsError::Timeout {
                what: format!("{what}; captured: {:#?}", self.lines()),
                after,
            },
            e => e,
        })
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A host on a [`Lan`]: its namespace and `eth0` facing the switch.
#[derive(Debug)]
pub struct Host {
    pub role: String,
    pub ns: Netns,
    /// The switch port (in the switch namespace) its `eth0` is plugged into.
    pub port: String,
    pub mac: String,
    pub ipv4: Ipv4Addr,
    pub ipv6: Ipv6Addr,
}

impl Host {
    /// `eth0`'s MAC address as `ip` prints it (lower-case).
    pub fn mac(&self) -> &str {
        &self.mac
    }

    /// The neighbour entry for `ip` as `ip neigh` prints it, e.g.
    /// `10.77.0.100 dev eth0 lladdr 02:.. REACHABLE`; `None` when absent.
    pub fn neighbour(&self, ip: &str) -> Result<Option<String>> {
        let out = self.ns.ip(&format!("neigh show {ip} dev eth0"))?;
        Ok(out.lines().next().map(|l| l.trim().to_string()))
    }
}

/// Hosts plugged into one bridge, the "switch", in its own namespace. Each
/// host has `eth0` with 10.77.0.(11+i)/24 and fd00:77::(11+i)/64 and default
/// routes via .1 and ::1.
pub struct Lan {
    // Field order is drop order: the userspace switch, the hosts, then
    // the switch's namespace.
    /// On a LAN made by [`Lan::switched`], the switch that can be broken.
    pub wire: Option<crate::switch::Switch>,
    pub hosts: Vec<Host>,
    pub switch: Netns,
}

impl Lan {
    pub fn new(roles: &[&str]) -> Result<Lan> {
        let switch = Netns::new("switch")?;
        // No multicast snooping: without an MLD querier it would need
        // reports before forwarding solicited-node multicast.
        switch.ip("link add br0 type bridge mcast_snooping 0")?;
        switch.ip("link set br0 up")?;
        let mut lan = Lan {
            wire: None,
            hosts: Vec::new(),
            switch,
        };
        for (i, role) in roles.iter().enumerate() {
            lan.plug(role, i, true)?;
        }
        Ok(lan)
    }

    /// [`Lan::new`] with the userspace [`Switch`](crate::switch::Switch)
    /// (faults drawn from `seed`) in place of the bridge. Its ports and the
    /// hosts' `eth0` have their offloads off (needs `ethtool`): a packet
    /// socket reads what the veth carries, and a host's segmentation or
    /// checksum left to the "hardware" would reach the switch undone.
    /// [`Lan::add_interface`] and [`Lan::add_network`] need the bridge.
    pub fn switched(roles: &[&str], seed: u64) -> Result<Lan> {
        let switch = Netns::new("switch")?;
        let mut lan = Lan {
            wire: None,
            hosts: Vec::new(),
            switch,
        };
        for (i, role) in roles.iter().enumerate() {
            lan.plug(role, i, false)?;
        }
        let offloads = [
            "tx", "off", "rx", "off", "sg", "off", "tso", "off", "gso", "off", "gro", "off",
        ];
        for (ns, ifname) in lan.link_ends() {
            let mut argv = vec!["ethtool", "-K", ifname];
            argv.extend(offloads);
            ns.run(&argv)?;
        }
        let ports = lan
            .hosts
            .iter()
            .map(|h| (h.role.clone(), h.port.clone()))
            .collect::<Vec<_>>();
        lan.wire = Some(crate::switch::Switch::start(
            lan.switch.name(),
            &ports,
            seed,
        )?);
        Ok(lan)
    }

    /// Both ends of every host's link to the LAN: its `eth0`, and its port
    /// in the switch's namespace.
    pub fn link_ends(&self) -> impl Iterator<Item = (&Netns, &str)> {
        self.hosts
            .iter()
            .flat_map(|h| [(&h.ns, "eth0"), (&self.switch, h.port.as_str())])
    }

    fn plug(&mut self, role: &str, i: usize, bridged: bool) -> Result<()> {
        let ns = Netns::new(role)?;
        let port = format!("p{i}");
        let n = 11 + i as u8;
        let ipv4 = Ipv4Addr::new(10, 77, 0, n);
        let ipv6 = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, u16::from(n));
        self.switch.ip(&format!(
            "link add {port} type veth peer name eth0 netns {}",
            ns.name()
        ))?;
        if bridged {
            self.switch.ip(&format!("link set {port} master br0 up"))?;
        } else {
            self.switch.ip(&format!("link set {port} up"))?;
        }
        ns.ip("link set eth0 up")?;
        ns.ip(&format!("addr add {ipv4}/24 dev eth0"))?;
        ns.ip(&format!("-6 addr add {ipv6}/64 dev eth0 nodad"))?;
        ns.ip(&format!("route add default via {LAN_V4_GATEWAY}"))?;
        ns.ip(&format!("-6 route add default via {LAN_V6_GATEWAY}"))?;
        let mac = link_mac(&ns, "eth0")?;
        self.hosts.push(Host {
            role: role.to_string(),
            ns,
            port,
            mac,
            ipv4,
            ipv6,
        });
        Ok(())
    }

    pub fn host(&self, role: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.role == role)
            .unwrap_or_else(|| panic!("no host {role:?} on this LAN"))
    }

    /// Switches the host's port on or off: its `eth0` loses or regains
    /// carrier while staying administratively up, as when a cable is pulled.
    pub fn set_port(&self, role: &str, up: bool) -> Result<()> {
        let port = &self.host(role).port;
        self.switch
            .ip(&format!(
                "link set {port} {}",
                if up { "up" } else { "down" }
            ))
            .map(drop)
    }

    /// Plugs a second interface of `role` into the switch, named `ifname`,
    /// with no addresses.
    pub fn add_interface(&self, role: &str, ifname: &str) -> Result<()> {
        let host = self.host(role);
        let port = format!("{}{ifname}", host.port);
        self.switch.ip(&format!(
            "link add {port} type veth peer name {ifname} netns {}",
            host.ns.name()
        ))?;
        self.switch.ip(&format!("link set {port} master br0 up"))?;
        host.ns.ip(&format!("link set {ifname} up")).map(drop)
    }
}

impl Lan {
    /// `count` pings from `from` to `to` (IPv4), 10 ms apart: each round
    /// trip, `None` for one lost (no answer within a second).
    pub fn round_trips(&self, from: &str, to: &str, count: u32) -> Vec<Option<Duration>> {
        let target = self.host(to).ipv4.to_string();
        let out = self
            .host(from)
            .ns
            .output(&[
                "ping",
                "-n",
                "-c",
                &count.to_string(),
                "-i",
                "0.01",
                "-W",
                "1",
                &target,
            ])
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let mut got = vec![None; count as usize];
        for line in out.lines() {
            let seq = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("icmp_seq="))
                .and_then(|s| s.parse::<usize>().ok());
            let ms = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("time="))
                .and_then(|s| s.parse::<f64>().ok());
            if let (Some(seq), Some(ms)) = (seq, ms)
                && (1..=count as usize).contains(&seq)
            {
                got[seq - 1] = Some(Duration::from_secs_f64(ms / 1000.0));
            }
        }
        got
    }
}

impl Lan {
    /// A second L2 network: a bridge of its own (`bridge`) on the switch,
    /// reaching each of `roles` through a new interface `ifname` with
    /// `10.{subnet}.0.X/24` and `fd00:{subnet}::X/64` (X as on the first
    /// network) and no route beyond it. As a VLAN would, it shares the
    /// hosts but not the wire.
    pub fn add_network(
        &self,
        bridge: &str,
        ifname: &str,
        subnet: u8,
        roles: &[&str],
    ) -> Result<()> {
        self.switch
            .ip(&format!("link add {bridge} type bridge mcast_snooping 0"))?;
        self.switch.ip(&format!("link set {bridge} up"))?;
        for role in roles {
            let host = self.host(role);
            let port = format!("{}{ifname}", host.port);
            self.switch.ip(&format!(
                "link add {port} type veth peer name {ifname} netns {}",
                host.ns.name()
            ))?;
            self.switch
                .ip(&format!("link set {port} master {bridge} up"))?;
            let x = host.ipv4.octets()[3];
            host.ns.ip(&format!("link set {ifname} up"))?;
            host.ns
                .ip(&format!("addr add 10.{subnet}.0.{x}/24 dev {ifname}"))?;
            host.ns.ip(&format!(
                "-6 addr add fd00:{subnet}::{x:x}/64 dev {ifname} nodad"
            ))?;
        }
        Ok(())
    }
}

impl Lan {
    /// A router on the LAN at the hosts' default gateway (the addresses
    /// their default routes point to), forwarding both families, with a
    /// second network behind it: its `eth1` with 10.{subnet}.0.1/24 and
    /// fd00:{subnet}::1/64, wired to `eth0` of a namespace returned beside
    /// it (10.{subnet}.0.2, fd00:{subnet}::2, default routes via the
    /// router): a client that reaches the LAN only through the router.
    pub fn add_gateway(&self, subnet: u8) -> Result<(Netns, Netns)> {
        let router = Netns::new("router")?;
        let outside = Netns::new("outside")?;
        self.switch.ip(&format!(
            "link add pgw type veth peer name eth0 netns {}",
            router.name()
        ))?;
        self.switch.ip("link set pgw master br0 up")?;
        router.ip("link set eth0 up")?;
        router.ip(&format!("addr add {LAN_V4_GATEWAY}/24 dev eth0"))?;
        router.ip(&format!("-6 addr add {LAN_V6_GATEWAY}/64 dev eth0 nodad"))?;
        router.ip(&format!(
            "link add eth1 type veth peer name eth0 netns {}",
            outside.name()
        ))?;
        router.ip("link set eth1 up")?;
        router.ip(&format!("addr add 10.{subnet}.0.1/24 dev eth1"))?;
        router.ip(&format!("-6 addr add fd00:{subnet}::1/64 dev eth1 nodad"))?;
        router.sysctl("net.ipv4.ip_forward", "1")?;
        router.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        outside.ip("link set eth0 up")?;
        outside.ip(&format!("addr add 10.{subnet}.0.2/24 dev eth0"))?;
        outside.ip(&format!("-6 addr add fd00:{subnet}::2/64 dev eth0 nodad"))?;
        outside.ip(&format!("route add default via 10.{subnet}.0.1"))?;
        outside.ip(&format!("-6 route add default via fd00:{subnet}::1"))?;
        Ok((router, outside))
    }
}

/// A link's MAC address as `ip` prints it.
pub fn link_mac(ns: &Netns, ifname: &str) -> Result<String> {
    let out = ns.ip(&format!("-o link show dev {ifname}"))?;
    out.split_whitespace()
        .skip_while(|w| !w.starts_with("link/"))
        .nth(1)
        .map(str::to_string)
        .ok_or_else(|| NetnsError::Failed {
            command: format!("ip -n {} link show dev {ifname}", ns.name()),
            status: "no link/ether address in the output".to_string(),
            stderr: out,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_named_by_process_and_removed_on_drop() {
        require_root();
        let ns = Netns::new("t").unwrap();
        let name = ns.name().to_string();
        assert!(
            name.starts_with(&format!("hlb{}-", std::process::id())),
            "{name}"
        );
        assert!(run("ip", &["netns", "list"]).unwrap().contains(&name));
        drop(ns);
        assert!(!run("ip", &["netns", "list"]).unwrap().contains(&name));
    }

    #[test]
    fn async_code_runs_inside_the_namespace() {
        require_root();
        let lan = Lan::new(&["a", "b"]).unwrap();
        let (a, b) = (lan.host("a"), lan.host("b"));
        // Binding a host's address works only inside that host's namespace.
        let bound =
            a.ns.block_on(|| async { tokio::net::UdpSocket::bind("10.77.0.11:0").await.is_ok() })
                .unwrap();
        assert!(bound);
        let bound =
            b.ns.block_on(|| async { tokio::net::UdpSocket::bind("10.77.0.11:0").await.is_ok() })
                .unwrap();
        assert!(!bound, "b does not hold a's address");

        // A datagram from a reaches b across the switch; the runtimes keep
        // the receiving socket alive between jobs.
        let rt_a = a.ns.runtime().unwrap();
        let rt_b = b.ns.runtime().unwrap();
        let socket = rt_b.run(|| async {
            std::sync::Arc::new(
                tokio::net::UdpSocket::bind("10.77.0.12:9000")
                    .await
                    .unwrap(),
            )
        });
        let rx = std::sync::Arc::clone(&socket);
        let (tx, got) = std::sync::mpsc::channel();
        rt_b.run(move || async move {
            tokio::task::spawn_local(async move {
                let mut buf = [0u8; 16];
                let (n, from) = rx.recv_from(&mut buf).await.unwrap();
                let _ = tx.send((buf[..n].to_vec(), from.ip()));
            });
        });
        rt_a.run(|| async {
            let s = tokio::net::UdpSocket::bind("10.77.0.11:0").await.unwrap();
            s.send_to(b"hello", "10.77.0.12:9000").await.unwrap();
        });
        let (payload, from) = got.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(payload, b"hello");
        assert_eq!(from, std::net::IpAddr::from(a.ipv4));
    }

    #[test]
    fn pulling_a_port_drops_the_hosts_carrier() {
        require_root();
        let lan = Lan::new(&["a"]).unwrap();
        let a = lan.host("a");
        lan.set_port("a", false).unwrap();
        let link = a.ns.ip("link show dev eth0").unwrap();
        assert!(
            link.contains("NO-CARRIER") && link.contains(",UP"),
            "{link}"
        );
        lan.set_port("a", true).unwrap();
        wait_for("carrier", Duration::from_secs(3), || {
            let link = a.ns.ip("link show dev eth0").ok()?;
            link.contains("LOWER_UP").then_some(())
        })
        .unwrap();
    }

    #[test]
    fn failed_commands_carry_their_error_output() {
        let err = run("ip", &["link", "show", "dev", "no-such-link0"]).unwrap_err();
        assert!(matches!(err, NetnsError::Failed { .. }), "{err}");
        assert!(err.to_string().contains("no-such-link0"), "{err}");
    }
}
