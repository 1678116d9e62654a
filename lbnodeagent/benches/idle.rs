//! What an agent costs at rest: `IDLE_NODES` real agents (default 3) in
//! network namespaces, the test API server, one pool and `IDLE_VIPS`
//! Services (default 1, each with one IPv4 VIP), nothing happening. Per
//! agent, over `IDLE_SECS` (default 60) after a settling pause: CPU as a
//! share of one core, datagrams its host sent, wake-ups (context switches
//! of all its threads), and resident memory at the end. Then the floor:
//! what a bare thread pays on this machine to send one datagram every
//! beat interval between the same two hosts (see [`floor`]).
//!
//! ```sh
//! cargo bench -p lbnodeagent --bench idle                    # 3 runs (root)
//! IDLE_RUNS=1 IDLE_SECS=20 IDLE_VIPS=1000 cargo bench -p lbnodeagent --bench idle
//! IDLE_NODES=10 IDLE_RUNS=1 cargo bench -p lbnodeagent --bench idle
//! IDLE_HEAPTRACK=/tmp/ht IDLE_RUNS=1 ... # node-a under heaptrack, its file /tmp/ht.*
//! IDLE_CALLGRIND=/tmp/cg IDLE_RUNS=1 ... # node-a and node-b under callgrind
//! HOSTLB_AGENT_BINARY=target/x86_64-unknown-linux-gnu/release/lbnodeagent ... # the packaged build
//! IDLE_RX=threaded ...  # frames received by kernel threads, not inside the sender's sendto
//! IDLE_LIFETIME=0s ...  # addresses kept forever: no renewals (the shipped 15 s otherwise)
//! ```
//!
//! Under callgrind (`IDLE_CALLGRIND=DIR`) the two agents' profiles are
//! dumped into DIR at the window's end: the functions a holder and a
//! bystander run from start to rest, which `lbnodeagent/link/hot.py` turns
//! into the release binary's hot-code layout. The figures of such a run say
//! nothing about the agent itself.
//!
//! Each agent here shares two cores with all the others, which no fleet of
//! hosts does: on a 2-core machine the in-process test API server stops
//! taking connections at about 30 agents (each lists 1,000 Services and
//! their EndpointSlices as it starts), and 20 agents holding 1,000 VIPs
//! between them starve each other's beats (see docs/agent-network.md, "An
//! agent at rest"). Larger clusters are the membership bench's.
//!
//! With more than one VIP and at most three nodes, `node-a` is preferred
//! and holds them all (the memory row of docs/targets.md is the node
//! holding 1,000); with more nodes the election spreads them. The agents log
//! at the shipped level (`info`) and renew addresses as shipped (15 s
//! lifetimes). Their process ids are printed when the
//! window opens, so `perf record -p` or `strace -c -f -p` can be pointed at
//! one meanwhile.

#[path = "../tests/cluster/mod.rs"]
mod cluster;

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cluster::{Cluster, median};
use lbnodeagent::agent::START_OVER;
use lbnodeagent::agent::core::sessions::BEAT_INTERVAL;

/// `node-a`, `node-b`, ...: `node-a` is the preferred one.
fn node_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match u8::try_from(i) {
            Ok(i) if i < 26 => format!("node-{}", char::from(b'a' + i)),
            _ => format!("node-{i}"),
        })
        .collect()
}

fn env<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one agent had used so far.
#[derive(Clone, Copy)]
struct Used {
    at: Instant,
    cpu: Duration,
    sent: u64,
    wakeups: u64,
}

/// Context switches of every thread of `pid`: each one is the thread
/// going to sleep or being put off, so at rest they count wake-ups.
fn wakeups(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|s| {
            s.lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// UDP datagrams sent from `node`'s network namespace (the agent is its
/// only UDP user): gossip, beats and their relay over loopback.
fn udp_sent(c: &Cluster, node: &str) -> u64 {
    let snmp = c.host(node).ns.run(&["cat", "/proc/net/snmp"]).unwrap();
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "OutDatagrams")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

fn used(c: &Cluster, node: &str) -> Used {
    let pid = c.pid(node);
    Used {
        at: Instant::now(),
        cpu: c.cpu_time(node),
        sent: udp_sent(c, node),
        wakeups: wakeups(pid),
    }
}

struct Row {
    cpu_pct: f64,
    sent_per_s: f64,
    wakeups_per_s: f64,
    rss_mib: f64,
}

/// A veth pair delivers a frame inside the sender's `sendto`: the
/// receiving side's whole path (the bridge, the peer's UDP and nftables)
/// is charged to the sending agent, which no host with a NIC of its own
/// pays. `IDLE_RX=threaded` turns on NAPI (GRO) and threaded polling at
/// both ends of every host's link, so kernel threads receive the frames
/// and an agent pays for its own sends and reads only. TSO goes off: a
/// veth hands a datagram of a device with TSO on to the peer's NAPI only
/// when the peer forwards UDP GRO, and otherwise still receives it inline.
fn receive_in_kernel_threads(c: &Cluster) {
    for (ns, ifname) in c.lan.link_ends() {
        ns.run(&["ethtool", "-K", ifname, "gro", "on", "tso", "off"])
            .expect("GRO on and TSO off on a veth");
        let threaded = format!("echo 1 > /sys/class/net/{ifname}/threaded");
        ns.run(&["sh", "-c", &threaded])
            .expect("threaded NAPI on a veth");
    }
}

/// CPU time of the calling thread alone.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// What the floor loop measured.
struct Floor {
    /// % of a core of a thread that sleeps to each tick and sends.
    sending: f64,
    /// % of a core of the same thread sleeping to the ticks only.
    sleeping: f64,
    received: u64,
    ticks: u64,
}

/// The least any sender of beats pays on this bed, whatever its code: a
/// bare thread in `from`'s namespace that sleeps to each tick,
/// `BEAT_INTERVAL` apart, and sends one datagram of a beat's size to a
/// socket a thread reads in `to`'s namespace; then the same thread
/// sleeping to the ticks without sending. Only that thread's own CPU time
/// counts, so it is the cost of a wake-up and a `sendto` on this machine,
/// the receiving namespace's path included as it is for the agents'
/// beats. Run while the agents still run, as they were measured.
fn floor(c: &Cluster, from: &str, to: &str, secs: u64) -> Floor {
    const PORT: u16 = 7999;
    let stop = Arc::new(AtomicBool::new(false));
    let reader_ns = &c.host(to).ns;
    let target = SocketAddr::from((c.host(to).ipv4, PORT));
    let ticks = secs * 1000 / BEAT_INTERVAL.as_millis() as u64;
    let run = move |send: bool| {
        let socket = UdpSocket::bind(("0.0.0.0", 0)).expect("bind the floor's sender");
        let payload = [7u8; 120];
        let start = Instant::now();
        let cpu = thread_cpu();
        for k in 1..=ticks {
            let due = start + BEAT_INTERVAL * k as u32;
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if send {
                socket
                    .send_to(&payload, target)
                    .expect("send a floor datagram");
            }
        }
        (thread_cpu() - cpu).as_secs_f64() / start.elapsed().as_secs_f64() * 100.0
    };
    let (sending, sleeping, received) = std::thread::scope(|s| {
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let reader_stop = stop.clone();
        let reader = s.spawn(move || {
            reader_ns.block_on(move || async move {
                let socket = UdpSocket::bind(("0.0.0.0", PORT)).expect("bind the floor's reader");
                socket
                    .set_read_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                bound_tx.send(()).unwrap();
                let mut buf = [0u8; 1500];
                let mut received = 0u64;
                while !reader_stop.load(Ordering::Relaxed) {
                    if socket.recv(&mut buf).is_ok() {
                        received += 1;
                    }
                }
                received
            })
        });
        bound_rx.recv().expect("the floor's reader bound");
        let (sending, sleeping) = c
            .host(from)
            .ns
            .block_on(move || async move { (run(true), run(false)) })
            .expect("run in the sender's namespace");
        stop.store(true, Ordering::Relaxed);
        let received = reader
            .join()
            .expect("the floor's reader")
            .expect("run in the reader's namespace");
        (sending, sleeping, received)
    });
    Floor {
        sending,
        sleeping,
        received,
        ticks,
    }
}

fn measure(nodes: &[&str], vips: usize, secs: u64) -> (Vec<Row>, Option<Floor>) {
    let mut c = Cluster::new(nodes);
    let rx = std::env::var("IDLE_RX").unwrap_or_default();
    match rx.as_str() {
        "" | "inline" => {}
        "threaded" => receive_in_kernel_threads(&c),
        other => panic!("IDLE_RX={other}: `inline` (the default) or `threaded`"),
    }
    // The shipped lifetime: renewals are part of the cost at rest.
    // `IDLE_LIFETIME=0s` (forever) shows what they cost.
    c.lifetime = std::env::var("IDLE_LIFETIME").unwrap_or_else(|_| "15s".into());
    // With many VIPs on a small cluster, `node-a` holds them all (the
    // memory row); on a large one the election spreads them.
    let preferred = vips > 1 && nodes.len() <= 3;
    if !preferred {
        c.pool_and_ad(&["10.79.0.0/16"], "");
    } else {
        c.pool_and_ad(
            &["10.79.0.0/16"],
            "preferredNodeSelectors: [{weight: 100, preference: {matchLabels: {tier: edge}}}]",
        );
        c.kubectl(&["label", "node", "node-a", "tier=edge"]);
    }
    for &node in nodes {
        c.host(node)
            .ns
            .ip("route add 10.79.0.0/16 dev eth0")
            .unwrap();
    }
    let shipped = [("RUST_LOG", "info,kube_client::client::builder=off")];
    // Ten at a time, each ten ready before the next: a hundred agents
    // starting at once on two cores starve each other's failure detectors,
    // which no fleet of hosts with their own cores sees.
    for batch in nodes.chunks(10) {
        for &node in batch {
            let callgrind = std::env::var("IDLE_CALLGRIND")
                .ok()
                .filter(|_| node == "node-a" || node == "node-b");
            match (std::env::var("IDLE_HEAPTRACK"), callgrind) {
                (Ok(out), _) if node == "node-a" => {
                    c.start_wrapped(node, &shipped, &["heaptrack", "-o", &out]);
                }
                (_, Some(dir)) => {
                    let out = format!("--callgrind-out-file={dir}/{node}.%p");
                    let wrapper = [
                        "valgrind",
                        "--tool=callgrind",
                        "--demangle=no",
                        "--dump-instr=no",
                        &out,
                    ];
                    c.start_wrapped(node, &shipped, &wrapper);
                }
                _ => c.start_with_env(node, &shipped),
            }
        }
        c.wait_ready_of(batch, Duration::from_secs(60));
    }
    if vips == 1 {
        c.service("web", &["10.79.0.1"], &["node-a"], "");
    } else {
        c.bulk_services(vips, std::net::Ipv4Addr::new(10, 79, 0, 1), "node-a");
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let holder = preferred.then_some("node-a");
    loop {
        let held = match holder {
            Some(n) => c.held_count(n),
            None => nodes.iter().map(|n| c.held_count(n)).sum::<usize>(),
        };
        if held >= vips {
            break;
        }
        assert!(Instant::now() < deadline, "the VIPs were not all held");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Settle: the start's gossip, records and first reports are done.
    std::thread::sleep(Duration::from_secs(5));
    let pids: Vec<String> = nodes
        .iter()
        .take(3)
        .map(|n| format!("{n}={}", c.pid(n)))
        .collect();
    eprintln!("window open for {secs} s: {}", pids.join(" "));
    let before: Vec<Used> = nodes.iter().map(|n| used(&c, n)).collect();
    std::thread::sleep(Duration::from_secs(secs));
    if std::env::var_os("IDLE_CALLGRIND").is_some() {
        // Dumped while it runs: the cluster's end kills the agents.
        for node in ["node-a", "node-b"] {
            let pid = c.pid(node).to_string();
            let dumped = std::process::Command::new("callgrind_control")
                .args(["-d", &pid])
                .status()
                .expect("callgrind_control (valgrind) is installed");
            assert!(dumped.success(), "callgrind_control -d {pid} failed");
        }
    }
    if std::env::var_os("IDLE_HEAPTRACK").is_none() {
        let memory = cluster::many::memory(&c, "node-a");
        let parts: Vec<String> = memory
            .iter()
            .map(|(kind, kib)| format!("{kind} {:.1}", *kib as f64 / 1024.0))
            .collect();
        eprintln!("  node-a memory, MiB: {}", parts.join(", "));
        // The window opens once every agent is ready: after `START_OVER`
        // more, start-up's code pages are gone and what stays is the code
        // run at rest.
        let judged_after = START_OVER + Duration::from_secs(5);
        if Duration::from_secs(secs) > judged_after {
            hot_list_check(&c, "node-a", memory.get("binary").copied().unwrap_or(0));
        } else {
            eprintln!(
                "  (a window under {} s is too short to judge the hot-code list: start-up's code is unmapped {} s after the agent is ready)",
                judged_after.as_secs(),
                START_OVER.as_secs()
            );
        }
    }
    let rows = nodes
        .iter()
        .zip(before)
        .map(|(n, b)| {
            let a = used(&c, n);
            // Each node's own window: reading a hundred nodes takes a while.
            let span = (a.at - b.at).as_secs_f64();
            Row {
                cpu_pct: (a.cpu - b.cpu).as_secs_f64() / span * 100.0,
                sent_per_s: (a.sent - b.sent) as f64 / span,
                wakeups_per_s: (a.wakeups - b.wakeups) as f64 / span,
                rss_mib: c.rss_kib(n) as f64 / 1024.0,
            }
        })
        .collect();
    // Between the first two hosts, whichever owns or watches: what it
    // measures is the machine's, not an agent's.
    let floor = (nodes.len() >= 2 && std::env::var_os("IDLE_CALLGRIND").is_none())
        .then(|| floor(&c, nodes[0], nodes[1], secs.min(20)));
    (rows, floor)
}

/// How much more of its binary an agent keeps resident (`resident` KiB,
/// from its smaps) than its hot code, and a word when that points at an
/// aged hot-code list. The link lays the
/// code an agent runs at rest together (`link/hot.ld`); code the list does
/// not name (new or renamed since it was made) lands among cold code, and
/// each such function keeps its 64 KiB neighbourhood resident. With a
/// fresh list the holder of 1,000 VIPs kept 1.8-1.9 MiB beyond `.text.hot`
/// (constants, tables and the code outside it); with one aged over 39
/// commits, 3.3-3.6 MiB. CI's guard (`link/matched.py`) cannot see this:
/// an aged list still matches what it names.
fn hot_list_check(c: &Cluster, node: &str, resident: u64) {
    /// 2.6 MiB: between the two figures above.
    const AGED_BEYOND_HOT_KIB: u64 = 2_662;
    let Some(hot) = std::fs::read(c.binary(node))
        .ok()
        .and_then(|elf| section_size(&elf, ".text.hot"))
    else {
        eprintln!("  {node}: its binary has no .text.hot (a build without the hot-code list)");
        return;
    };
    let beyond = resident.saturating_sub(hot / 1024);
    eprintln!(
        "  {node}: binary resident {:.1} MiB, {:.1} MiB beyond its .text.hot ({:.1} MiB)",
        resident as f64 / 1024.0,
        beyond as f64 / 1024.0,
        hot as f64 / (1024.0 * 1024.0)
    );
    if beyond > AGED_BEYOND_HOT_KIB {
        eprintln!(
            "  {node}: that is more than a fresh hot-code list leaves (about 1.9 MiB): the list has likely aged; run lbnodeagent/link/refresh.sh"
        );
    }
}

/// The size of the section `name` of a 64-bit little-endian ELF file.
fn section_size(elf: &[u8], name: &str) -> Option<u64> {
    let u16_at = |at: usize| Some(u16::from_le_bytes(elf.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(elf.get(at..at + 8)?.try_into().ok()?));
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let shoff = usize::try_from(u64_at(0x28)?).ok()?;
    let (entsize, count, names) = (
        usize::from(u16_at(0x3a)?),
        usize::from(u16_at(0x3c)?),
        usize::from(u16_at(0x3e)?),
    );
    let header = |i: usize| shoff + i * entsize;
    let strtab = usize::try_from(u64_at(header(names) + 0x18)?).ok()?;
    (0..count).find_map(|i| {
        let at = strtab + usize::try_from(u32_at(header(i))?).ok()?;
        let end = at + elf.get(at..)?.iter().position(|&b| b == 0)?;
        (elf.get(at..end)? == name.as_bytes())
            .then(|| u64_at(header(i) + 0x20))
            .flatten()
    })
}

fn main() {
    hostlb_tests::netns::require_root();
    let runs: usize = env("IDLE_RUNS", 3);
    let secs: u64 = env("IDLE_SECS", 60);
    let vips: usize = env("IDLE_VIPS", 1);
    let names = node_names(env("IDLE_NODES", 3));
    let nodes: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut all = Vec::new();
    let mut floors = Vec::new();
    for run in 0..runs {
        eprintln!(
            "at rest, {} members, {vips} VIPs: run {}/{runs}",
            nodes.len(),
            run + 1
        );
        let (rows, floor) = measure(&nodes, vips, secs);
        if let Some(f) = floor {
            eprintln!(
                "  floor, a bare thread on {} sending to {} every {} ms: {:.2}% of a core sending, {:.2}% sleeping to the same ticks ({} of {} received)",
                nodes[0],
                nodes[1],
                BEAT_INTERVAL.as_millis(),
                f.sending,
                f.sleeping,
                f.received,
                f.ticks
            );
            floors.push(f);
        }
        // Every node of a small cluster; of a large one, the holder and
        // two others (the table has them all).
        let shown = if nodes.len() <= 5 { nodes.len() } else { 3 };
        for (n, r) in nodes.iter().zip(&rows).take(shown) {
            eprintln!(
                "  {n}: cpu {:.2}%, sent {:.0}/s, wake-ups {:.0}/s, rss {:.1} MiB",
                r.cpu_pct, r.sent_per_s, r.wakeups_per_s, r.rss_mib
            );
        }
        all.extend(rows);
    }
    let col = |f: fn(&Row) -> f64| median(all.iter().map(f).collect());
    let lo = |f: fn(&Row) -> f64| all.iter().map(f).fold(f64::INFINITY, f64::min);
    let hi = |f: fn(&Row) -> f64| all.iter().map(f).fold(0.0, f64::max);
    println!(
        "| members | VIPs | CPU per agent, % of a core (min / median / max) | datagrams sent per s | wake-ups per s | RSS MiB |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| {} | {vips} | {:.2} / {:.2} / {:.2} | {:.0} | {:.0} | {:.1} / {:.1} |",
        nodes.len(),
        lo(|r| r.cpu_pct),
        col(|r| r.cpu_pct),
        hi(|r| r.cpu_pct),
        col(|r| r.sent_per_s),
        col(|r| r.wakeups_per_s),
        col(|r| r.rss_mib),
        hi(|r| r.rss_mib),
    );
    if !floors.is_empty() {
        println!(
            "floor of one sender of a datagram every {} ms on this machine, median of {}: {:.2}% of a core ({:.2}% of it the wake-ups alone)",
            BEAT_INTERVAL.as_millis(),
            floors.len(),
            median(floors.iter().map(|f| f.sending).collect()),
            median(floors.iter().map(|f| f.sleeping).collect()),
        );
    }
}
