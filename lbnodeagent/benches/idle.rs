//! What an agent costs at rest: three real agents in network namespaces,
//! the test API server, one pool and `IDLE_VIPS` Services (default 1, each
//! with one IPv4 VIP), nothing happening. Per agent, over `IDLE_SECS`
//! (default 60) after a settling pause: CPU as a share of one core,
//! datagrams its host sent, wake-ups (context switches of all its
//! threads), and resident memory at the end.
//!
//! ```sh
//! cargo bench -p lbnodeagent --bench idle                    # 3 runs (root)
//! IDLE_RUNS=1 IDLE_SECS=20 IDLE_VIPS=1000 cargo bench -p lbnodeagent --bench idle
//! IDLE_HEAPTRACK=/tmp/ht IDLE_RUNS=1 ... # node-a under heaptrack, its file /tmp/ht.*
//! ```
//!
//! With more than one VIP, `node-a` is preferred and holds them all (the
//! memory row of docs/targets.md is the node holding 1,000). The agents log
//! at the shipped level (`info`) and renew addresses as shipped (15 s
//! lifetimes). Their process ids are printed when the
//! window opens, so `perf record -p` or `strace -c -f -p` can be pointed at
//! one meanwhile.

#[path = "../tests/cluster/mod.rs"]
mod cluster;

use std::time::{Duration, Instant};

use cluster::{Cluster, median};

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

fn env<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one agent had used so far.
#[derive(Clone, Copy)]
struct Used {
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

fn measure(vips: usize, secs: u64) -> Vec<Row> {
    let mut c = Cluster::new(&NODES);
    // The shipped lifetime: renewals are part of the cost at rest.
    c.lifetime = "15s".into();
    if vips == 1 {
        c.pool_and_ad(&["10.79.0.0/16"], "");
    } else {
        c.pool_and_ad(
            &["10.79.0.0/16"],
            "preferredNodeSelectors: [{weight: 100, preference: {matchLabels: {tier: edge}}}]",
        );
        c.kubectl(&["label", "node", "node-a", "tier=edge"]);
    }
    for node in NODES {
        c.host(node)
            .ns
            .ip("route add 10.79.0.0/16 dev eth0")
            .unwrap();
    }
    let shipped = [("RUST_LOG", "info,kube_client::client::builder=off")];
    for node in NODES {
        match std::env::var("IDLE_HEAPTRACK") {
            Ok(out) if node == "node-a" => {
                c.start_wrapped(node, &shipped, &["heaptrack", "-o", &out]);
            }
            _ => c.start_with_env(node, &shipped),
        }
    }
    c.wait_ready(Duration::from_secs(60));
    if vips == 1 {
        c.service("web", &["10.79.0.1"], &["node-a"], "");
    } else {
        c.bulk_services(vips, std::net::Ipv4Addr::new(10, 79, 0, 1), "node-a");
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let holder = if vips == 1 { None } else { Some("node-a") };
    loop {
        let held = match holder {
            Some(n) => c.held_count(n),
            None => NODES.iter().map(|n| c.held_count(n)).sum::<usize>(),
        };
        if held >= vips {
            break;
        }
        assert!(Instant::now() < deadline, "the VIPs were not all held");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Settle: the start's gossip, records and first reports are done.
    std::thread::sleep(Duration::from_secs(5));
    let pids: Vec<String> = NODES.iter().map(|n| format!("{n}={}", c.pid(n))).collect();
    eprintln!("window open for {secs} s: {}", pids.join(" "));
    let t0 = Instant::now();
    let before: Vec<Used> = NODES.iter().map(|n| used(&c, n)).collect();
    std::thread::sleep(Duration::from_secs(secs));
    let span = t0.elapsed().as_secs_f64();
    if std::env::var_os("IDLE_HEAPTRACK").is_none() {
        let parts: Vec<String> = cluster::many::memory(&c, "node-a")
            .into_iter()
            .map(|(kind, kib)| format!("{kind} {:.1}", kib as f64 / 1024.0))
            .collect();
        eprintln!("  node-a memory, MiB: {}", parts.join(", "));
    }
    NODES
        .iter()
        .zip(before)
        .map(|(n, b)| {
            let a = used(&c, n);
            Row {
                cpu_pct: (a.cpu - b.cpu).as_secs_f64() / span * 100.0,
                sent_per_s: (a.sent - b.sent) as f64 / span,
                wakeups_per_s: (a.wakeups - b.wakeups) as f64 / span,
                rss_mib: c.rss_kib(n) as f64 / 1024.0,
            }
        })
        .collect()
}

fn main() {
    hostlb_tests::netns::require_root();
    let runs: usize = env("IDLE_RUNS", 3);
    let secs: u64 = env("IDLE_SECS", 60);
    let vips: usize = env("IDLE_VIPS", 1);
    let mut all = Vec::new();
    for run in 0..runs {
        eprintln!("at rest, {vips} VIPs: run {}/{runs}", run + 1);
        let rows = measure(vips, secs);
        for (n, r) in NODES.iter().zip(&rows) {
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
        NODES.len(),
        lo(|r| r.cpu_pct),
        col(|r| r.cpu_pct),
        hi(|r| r.cpu_pct),
        col(|r| r.sent_per_s),
        col(|r| r.wakeups_per_s),
        col(|r| r.rss_mib),
        hi(|r| r.rss_mib),
    );
}
