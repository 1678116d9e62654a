//! Many VIPs on one host, as a client sees them: three agents, `n`
//! Services whose advertisement prefers `node-a` (so it holds every VIP),
//! and a client asking about a sample of them by ARP every 10 ms. Cutting
//! `node-a` off shows when the first and the last VIP answer from another
//! host; a SIGTERM shows whether the hand-over of all of them loses a
//! reply; a cold start shows how soon after readiness every VIP answers.
//! The survivors' kernels are also polled, for the VIPs outside the
//! sample.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hostlb_tests::netns::wait_for;
use hostlb_tests::probe::ArpSweep;

use super::Cluster;

pub const EVERY: Duration = Duration::from_millis(10);
/// The VIPs' subnet, on-link on every host through a route on eth0.
const SUBNET: &str = "10.78.0.0/16";
const FIRST: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
/// VIPs the client asks about: the first, the last and evenly between.
const SAMPLE: usize = 24;

/// A cluster whose `node-a` holds `n` VIPs.
pub struct Bed {
    pub c: Cluster,
    pub ips: Vec<String>,
    pub sample: Vec<String>,
}

impl Bed {
    /// Three agents; with `services_first`, the Services exist before the
    /// agents start (a cold start), else they are created once the agents
    /// run and `node-a` holds them all on return.
    pub fn new(n: usize, services_first: bool) -> Bed {
        let c = Cluster::new(&["node-a", "node-b", "node-c"]);
        c.pool_and_ad(
            &[SUBNET],
            "preferredNodeSelectors: [{weight: 100, preference: {matchLabels: {tier: edge}}}]",
        );
        c.kubectl(&["label", "node", "node-a", "tier=edge"]);
        for node in c.nodes.clone() {
            c.host(&node)
                .ns
                .ip(&format!("route add {SUBNET} dev eth0"))
                .unwrap();
        }
        let ips: Vec<String> = (0..n)
            .map(|i| Ipv4Addr::from(u32::from(FIRST) + i as u32).to_string())
            .collect();
        let sample: Vec<String> = if n <= SAMPLE {
            ips.clone()
        } else {
            (0..SAMPLE)
                .map(|k| ips[k * (n - 1) / (SAMPLE - 1)].clone())
                .collect()
        };
        if services_first {
            c.bulk_services(n, FIRST, "node-a");
        }
        let mut bed = Bed { c, ips, sample };
        if !services_first {
            bed.c.start_all();
            bed.wait_ready(Duration::from_secs(30));
            bed.c.bulk_services(n, FIRST, "node-a");
            bed.wait_held("node-a", Duration::from_secs(120));
            // Nodes that took some while node-a's view lagged hand them
            // back one removal at a time: a run starts after that.
            bed.wait_released("node-b", Duration::from_secs(120));
            bed.wait_released("node-c", Duration::from_secs(120));
        }
        bed
    }

    /// Waits until `node` holds no VIP.
    pub fn wait_released(&self, node: &str, timeout: Duration) {
        wait_for(&format!("{node} to let go"), timeout, || {
            (self.c.held_count(node) == 0).then_some(())
        })
        .unwrap();
    }

    pub fn sweep(&self) -> ArpSweep {
        let client = self.c.host("client");
        ArpSweep::start(
            &client.ns,
            "eth0",
            &client.ipv4.to_string(),
            &self.sample,
            EVERY,
        )
        .unwrap()
    }

    /// Every agent reports ready; when each did, in order of the nodes.
    pub fn wait_ready(&self, timeout: Duration) -> Vec<Instant> {
        self.c.wait_ready(timeout)
    }

    /// Waits until every agent sees every other live in gossip: a planned
    /// stop is judged from a whole cluster, not from the instant a cut
    /// heals (a node that still sees no peer has nobody to hand over to).
    pub fn wait_members(&self, timeout: Duration) {
        let n = self.c.nodes.len();
        for node in &self.c.nodes {
            wait_for(&format!("{node} to see {n} members"), timeout, || {
                let (_, body) = self.c.http_get(node, "/metrics");
                body.lines()
                    .any(|l| l == format!("hostlb_agent_live_members {n}"))
                    .then_some(())
            })
            .unwrap();
        }
    }

    /// Waits until `node` holds every VIP.
    pub fn wait_held(&self, node: &str, timeout: Duration) {
        let n = self.ips.len();
        wait_for(&format!("{node} to hold all {n} VIPs"), timeout, || {
            (self.c.held_count(node) >= n).then_some(())
        })
        .unwrap();
    }
}

/// When each VIP first showed up in the kernel of one of `nodes`, polled
/// every few milliseconds from a thread of its own until all have or
/// `stop` is set.
pub struct KernelWatch {
    seen: Arc<Mutex<BTreeMap<String, Instant>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KernelWatch {
    pub fn start(bed: &Bed, nodes: &[&str]) -> KernelWatch {
        KernelWatch::start_for(bed, nodes, bed.ips.iter().cloned().collect())
    }

    /// [`start`](Self::start) for the VIPs `wanted` only.
    pub fn start_for(bed: &Bed, nodes: &[&str], wanted: BTreeSet<String>) -> KernelWatch {
        let seen: Arc<Mutex<BTreeMap<String, Instant>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let namespaces: Vec<String> = nodes
            .iter()
            .map(|n| bed.c.host(n).ns.name().to_string())
            .collect();
        let thread = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for ns in &namespaces {
                        let out = hostlb_tests::netns::run(
                            "ip",
                            &["-n", ns, "-o", "-4", "addr", "show", "dev", "eth0"],
                        )
                        .unwrap_or_default();
                        let now = Instant::now();
                        let mut s = seen.lock().unwrap();
                        for line in out.lines() {
                            let Some(addr) = line.split_whitespace().nth(3) else {
                                continue;
                            };
                            let ip = addr.split('/').next().unwrap_or_default();
                            if wanted.contains(ip) {
                                s.entry(ip.to_string()).or_insert(now);
                            }
                        }
                        if s.len() == wanted.len() {
                            return;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        KernelWatch {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// Waits until every VIP was seen; (first, last) since `t0`.
    pub fn all(&mut self, n: usize, t0: Instant, timeout: Duration) -> (Duration, Duration) {
        wait_for("every VIP on a survivor", timeout, || {
            (self.seen.lock().unwrap().len() >= n).then_some(())
        })
        .unwrap();
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let s = self.seen.lock().unwrap();
        let first = s.values().min().copied().unwrap_or(t0);
        let last = s.values().max().copied().unwrap_or(t0);
        (first - t0, last - t0)
    }
}

impl Drop for KernelWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One host cut off while it holds every VIP.
#[derive(Clone, Debug)]
pub struct CutOff {
    /// The first and the last sampled VIP answering from another MAC.
    pub wire_first: Duration,
    pub wire_last: Duration,
    /// The first and the last of all VIPs in a survivor's kernel.
    pub kernel_first: Duration,
    pub kernel_last: Duration,
}

/// `node-a`'s switch port goes down; the bed is put back afterwards
/// (port up, `node-a` holding everything again).
pub fn cut_off(bed: &Bed) -> CutOff {
    let sweep = bed.sweep();
    let old = bed.c.host("node-a").mac().to_string();
    std::thread::sleep(Duration::from_millis(500));
    let mut watch = KernelWatch::start(bed, &["node-b", "node-c"]);
    let t0 = Instant::now();
    bed.c.lan.set_port("node-a", false).unwrap();
    let (kernel_first, kernel_last) = watch.all(bed.ips.len(), t0, Duration::from_secs(60));
    let moved = wait_for(
        "every sampled VIP to answer elsewhere",
        Duration::from_secs(10),
        || {
            let m = sweep.moved(&bed.sample, &old, t0);
            m.iter().all(Option::is_some).then_some(m)
        },
    )
    .unwrap();
    let times: Vec<Duration> = moved.iter().flatten().map(|at| *at - t0).collect();
    bed.c.lan.set_port("node-a", true).unwrap();
    bed.wait_held("node-a", Duration::from_secs(60));
    bed.wait_members(Duration::from_secs(30));
    // The survivors let go of their copies too before the next run starts,
    // so it measures a move, not a leftover.
    for node in ["node-b", "node-c"] {
        bed.wait_released(node, Duration::from_secs(60));
    }
    CutOff {
        wire_first: *times.iter().min().unwrap(),
        wire_last: *times.iter().max().unwrap(),
        kernel_first,
        kernel_last,
    }
}

/// A SIGTERM to `node-a` while it holds every VIP: the most probes any
/// sampled VIP lost, and its longest silence.
pub fn sigterm(bed: &mut Bed) -> (u64, Duration) {
    bed.wait_members(Duration::from_secs(30));
    let sweep = bed.sweep();
    std::thread::sleep(Duration::from_millis(500));
    let mut watch = KernelWatch::start(bed, &["node-b", "node-c"]);
    let t0 = Instant::now();
    bed.c.signal("node-a", "TERM");
    assert_eq!(
        bed.c.wait_exit("node-a", Duration::from_secs(20)),
        Some(0),
        "node-a exits 0 after handing over"
    );
    watch.all(bed.ips.len(), t0, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    let end = Instant::now();
    let mut lost = 0;
    let mut outage = Duration::ZERO;
    for ip in &bed.sample {
        let o = sweep.judge(ip, t0, end);
        lost = lost.max(o.lost);
        outage = outage.max(o.outage);
    }
    (lost, outage)
}

/// The preferred node back after [`sigterm`]: from its agent's start, when
/// it held every VIP and when the others held none, and the most probes
/// a sampled VIP lost (a hand-back is make before break: none).
pub struct HandBack {
    pub held_all: Duration,
    pub released_all: Duration,
    pub lost: u64,
}

pub fn hand_back(bed: &mut Bed) -> HandBack {
    let sweep = bed.sweep();
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    bed.c.start("node-a");
    let n = bed.ips.len();
    let mut held_all = None;
    let released_all = wait_for("the hand-back", Duration::from_secs(120), || {
        if held_all.is_none() && bed.c.held_count("node-a") >= n {
            held_all = Some(t0.elapsed());
        }
        let others = bed.c.held_count("node-b") + bed.c.held_count("node-c");
        (held_all.is_some() && others == 0).then(|| t0.elapsed())
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let end = Instant::now();
    let lost = bed
        .sample
        .iter()
        .map(|ip| sweep.judge(ip, t0, end).lost)
        .max()
        .unwrap_or(0);
    HandBack {
        held_all: held_all.expect("set before the wait ends"),
        released_all,
        lost,
    }
}

/// The preferred node back, and it fails in the middle of its hand-back:
/// `node-a`'s agent starts while `node-b` and `node-c` hold its VIPs, and
/// once it holds them all and the others have let go of at least half
/// but not all, `node-a`'s switch port goes down. The VIPs the others had already
/// let go of (`stranded`) must come back as any failed host's do, all at
/// once, though the others are busy letting go of the rest: a takeover
/// must not queue behind a hand-back. When the first and the last of them
/// was in another kernel, after the cut; and the longest silence of a
/// sampled one among them, on the wire. The port then comes back and the
/// bed ends as [`hand_back`] leaves it.
#[derive(Debug)]
pub struct FailedHandBack {
    pub stranded: usize,
    pub kernel_first: Duration,
    pub kernel_last: Duration,
    pub sampled: usize,
    pub outage: Duration,
}

/// Which of the bed's VIPs `node`'s kernel holds.
fn held_ips(bed: &Bed, node: &str) -> BTreeSet<String> {
    let wanted: BTreeSet<&str> = bed.ips.iter().map(String::as_str).collect();
    let out = bed
        .c
        .host(node)
        .ns
        .ip("-o -4 addr show dev eth0")
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|a| a.split('/').next())
        .filter(|ip| wanted.contains(ip))
        .map(str::to_string)
        .collect()
}

pub fn fail_during_hand_back(bed: &mut Bed) -> FailedHandBack {
    bed.wait_members(Duration::from_secs(30));
    // node-a away, its VIPs on the others.
    bed.c.signal("node-a", "TERM");
    assert_eq!(
        bed.c.wait_exit("node-a", Duration::from_secs(20)),
        Some(0),
        "node-a exits 0 after handing over"
    );
    let n = bed.ips.len();
    wait_for(
        "node-b and node-c to hold every VIP",
        Duration::from_secs(60),
        || (bed.c.held_count("node-b") + bed.c.held_count("node-c") >= n).then_some(()),
    )
    .unwrap();
    let sweep = bed.sweep();
    std::thread::sleep(Duration::from_millis(500));
    bed.c.start("node-a");
    wait_for(
        "the hand-back to be under way",
        Duration::from_secs(60),
        || {
            let others = bed.c.held_count("node-b") + bed.c.held_count("node-c");
            (bed.c.held_count("node-a") >= n && others > 0 && others <= n / 2).then_some(())
        },
    )
    .unwrap();
    let t0 = Instant::now();
    bed.c.lan.set_port("node-a", false).unwrap();
    // Read at once: nobody takes node-a's VIPs before its beats have been
    // missed (150 ms).
    let kept: BTreeSet<String> = held_ips(bed, "node-b")
        .into_iter()
        .chain(held_ips(bed, "node-c"))
        .collect();
    let stranded: BTreeSet<String> = bed
        .ips
        .iter()
        .filter(|ip| !kept.contains(*ip))
        .cloned()
        .collect();
    assert!(!stranded.is_empty(), "the others had let go of some");
    let mut watch = KernelWatch::start_for(bed, &["node-b", "node-c"], stranded.clone());
    let (kernel_first, kernel_last) = watch.all(stranded.len(), t0, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let end = Instant::now();
    let sampled: Vec<&String> = bed
        .sample
        .iter()
        .filter(|ip| stranded.contains(*ip))
        .collect();
    let outage = sampled
        .iter()
        .map(|ip| sweep.judge(ip, t0, end).outage)
        .max()
        .unwrap_or_default();
    bed.c.lan.set_port("node-a", true).unwrap();
    bed.wait_members(Duration::from_secs(30));
    bed.wait_held("node-a", Duration::from_secs(60));
    for node in ["node-b", "node-c"] {
        bed.wait_released(node, Duration::from_secs(60));
    }
    FailedHandBack {
        stranded: stranded.len(),
        kernel_first,
        kernel_last,
        sampled: sampled.len(),
        outage,
    }
}

/// `lbnodeagent drain` on `node-a` while it holds every VIP: when the
/// others held every VIP, when the command ended (`node-a`'s agent holding
/// none), and the most probes a sampled VIP lost (a drain is make before break:
/// none). `lbnodeagent undrain` then gives them back, and the bed is as
/// before.
#[derive(Debug)]
pub struct Drained {
    pub others_hold_all: Duration,
    pub command: Duration,
    pub lost: u64,
    pub outage: Duration,
    /// The sampled VIP that lost the most, and what its client saw.
    pub worst: Option<String>,
}

pub fn drain(bed: &mut Bed) -> Drained {
    bed.wait_members(Duration::from_secs(30));
    let n = bed.ips.len();
    // After a fault, node-a takes its VIPs back first.
    wait_for("node-a to hold every VIP", Duration::from_secs(60), || {
        let others = bed.c.held_count("node-b") + bed.c.held_count("node-c");
        (bed.c.held_count("node-a") >= n && others == 0).then_some(())
    })
    .unwrap();
    let sweep = bed.sweep();
    std::thread::sleep(Duration::from_millis(500));
    let mut watch = KernelWatch::start(bed, &["node-b", "node-c"]);
    let config = bed.c.config_path("node-a");
    let config = config.to_str().unwrap().to_string();
    let t0 = Instant::now();
    let (ok, out, err) = bed.c.agent_command(
        "node-a",
        &["drain", "--config", &config, "--timeout", "120"],
    );
    let command = t0.elapsed();
    assert!(ok, "drain: {out} {err}");
    assert!(
        out.contains(&format!("node-a drained: {n} of {n} VIPs moved")),
        "{out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.starts_with("moved ")).count(),
        n,
        "each move told"
    );
    let (_, others_hold_all) = watch.all(n, t0, Duration::from_secs(60));
    assert_eq!(bed.c.held_count("node-a"), 0, "drained: node-a holds none");
    std::thread::sleep(Duration::from_millis(500));
    let end = Instant::now();
    let (mut lost, mut outage) = (0, Duration::ZERO);
    let mut worst = None;
    for ip in &bed.sample {
        let o = sweep.judge(ip, t0, end);
        if o.lost > lost {
            worst = Some(format!("{ip}: {o:?}"));
        }
        lost = lost.max(o.lost);
        outage = outage.max(o.outage);
    }
    let (ok, out, err) = bed
        .c
        .agent_command("node-a", &["undrain", "--config", &config]);
    assert!(ok, "undrain: {out} {err}");
    wait_for(
        "node-a to hold every VIP again",
        Duration::from_secs(60),
        || {
            let others = bed.c.held_count("node-b") + bed.c.held_count("node-c");
            (bed.c.held_count("node-a") >= n && others == 0).then_some(())
        },
    )
    .unwrap();
    Drained {
        others_hold_all,
        command,
        lost,
        outage,
        worst,
    }
}

/// A cold start with every Service already there: how long after the
/// first and the last agent was ready every VIP was in some kernel, and
/// the sampled ones answered on the wire.
pub struct ColdStart {
    pub after_first_ready: Duration,
    pub after_last_ready: Duration,
    pub wire_after_last_ready: Duration,
}

pub fn cold_start(bed: &mut Bed) -> ColdStart {
    let sweep = bed.sweep();
    let mut watch = KernelWatch::start(bed, &["node-a", "node-b", "node-c"]);
    let t0 = Instant::now();
    match std::env::var("HOSTLB_HEAPTRACK") {
        Ok(out) => {
            bed.c
                .start_wrapped("node-a", &[], &["heaptrack", "-o", &out]);
            bed.c.start("node-b");
            bed.c.start("node-c");
        }
        Err(_) => bed.c.start_all(),
    }
    let ready = bed.wait_ready(Duration::from_secs(60));
    let (_, last) = watch.all(bed.ips.len(), t0, Duration::from_secs(60));
    let all_in = t0 + last;
    let first_ready = *ready.iter().min().unwrap();
    let last_ready = *ready.iter().max().unwrap();
    let answered = wait_for(
        "every sampled VIP to answer",
        Duration::from_secs(10),
        || {
            let firsts: Vec<Option<Instant>> = bed
                .sample
                .iter()
                .map(|ip| sweep.replies(ip).first().map(|r| r.at))
                .collect();
            firsts
                .iter()
                .all(Option::is_some)
                .then(|| firsts.into_iter().flatten().max().unwrap())
        },
    )
    .unwrap();
    ColdStart {
        after_first_ready: all_in.saturating_duration_since(first_ready),
        after_last_ready: all_in.saturating_duration_since(last_ready),
        wire_after_last_ready: answered.saturating_duration_since(last_ready),
    }
}

/// Where an agent's resident memory is, from `/proc/PID/smaps`: KiB by
/// kind of mapping (the binary, shared libraries, heap, thread stacks and
/// other anonymous memory).
pub fn memory(c: &Cluster, node: &str) -> BTreeMap<String, u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", c.pid(node))).unwrap();
    // The binary it runs, wherever it is (`HOSTLB_AGENT_BINARY` may name
    // another file).
    let exe = std::fs::read_link(format!("/proc/{}/exe", c.pid(node))).unwrap_or_default();
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    let mut kind = String::new();
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or_default();
        if first.contains('-') && first.chars().all(|ch| ch.is_ascii_hexdigit() || ch == '-') {
            let path = line.split_whitespace().nth(5).unwrap_or_default();
            kind = if path.ends_with("lbnodeagent") || std::path::Path::new(path) == exe {
                "binary".into()
            } else if path.contains(".so") {
                "libraries".into()
            } else if path == "[heap]" {
                "heap (brk)".into()
            } else if path.starts_with("[stack") {
                "main stack".into()
            } else if path.is_empty() {
                "anonymous (malloc arenas, thread stacks)".into()
            } else {
                path.to_string()
            };
        } else if let Some(v) = line.strip_prefix("Rss:") {
            let kib: u64 = v
                .split_whitespace()
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
            *out.entry(kind.clone()).or_default() += kib;
        }
    }
    out
}
