//! Many VIPs on one host, measured as a client sees them (see
//! `tests/cluster/many.rs`): three real agents in network namespaces,
//! `node-a` holding every VIP, a client asking about 24 of them by ARP
//! every 10 ms, and the survivors' kernels polled for all of them.
//!
//! ```sh
//! cargo bench -p lbnodeagent --bench vips                 # 1, 100, 1,000 VIPs, 3 runs each (root)
//! VIPS_RUNS=5 VIPS_SIZES=1000 cargo bench -p lbnodeagent --bench vips
//! ```
//!
//! Per size: `node-a`'s switch port goes down; when the first and the last
//! VIP answered from another host (on the wire for the sample, in the
//! kernel for all). Then, at the largest size: a drain and an undrain
//! (`lbnodeagent drain`: how long, probes lost), a SIGTERM hand-over (probes
//! lost), the preferred node back (its hand-back: how soon it holds them
//! all and the others none), that node failing during its hand-back (how
//! soon what the others had let go of comes back, first to last), a cold start with every Service already there (how soon after
//! readiness every VIP answers), and where an agent's memory goes.

#[path = "../tests/cluster/mod.rs"]
mod cluster;

use std::time::Duration;

use cluster::many::{self, Bed};
use cluster::{max, median};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    hostlb_tests::netns::require_root();
    let runs: usize = std::env::var("VIPS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let sizes: Vec<usize> = std::env::var("VIPS_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 100, 1000]);
    let largest = *sizes.iter().max().unwrap_or(&1000);

    println!(
        "| VIPs on the failed host | first VIP moved, ms (median / max) | last VIP moved, ms | last minus first, ms | kernel: first / last, ms |"
    );
    println!("|---|---|---|---|---|");
    for &n in &sizes {
        eprintln!("{n} VIPs: setting up");
        let mut bed = Bed::new(n, false);
        let mut first = Vec::new();
        let mut last = Vec::new();
        let mut spread = Vec::new();
        let mut kernel = Vec::new();
        for run in 0..runs {
            eprintln!("{n} VIPs: cut off, run {}/{runs}", run + 1);
            let o = many::cut_off(&bed);
            first.push(ms(o.wire_first));
            last.push(ms(o.wire_last));
            spread.push(ms(o.wire_last - o.wire_first));
            kernel.push((ms(o.kernel_first), ms(o.kernel_last)));
        }
        let kf: Vec<f64> = kernel.iter().map(|k| k.0).collect();
        let kl: Vec<f64> = kernel.iter().map(|k| k.1).collect();
        println!(
            "| {n} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} / {:.0} |",
            median(first.clone()),
            max(&first),
            median(last.clone()),
            max(&last),
            median(spread.clone()),
            max(&spread),
            median(kf),
            median(kl)
        );
        if n == largest {
            eprintln!("{n} VIPs: drain");
            let d = many::drain(&mut bed);
            println!(
                "\nlbnodeagent drain of the host holding {n} VIPs: the others held all {:.0} ms after it began, and the command ended, the host holding none, after {:.0} ms; at most {} probes lost on any sampled VIP, longest silence {:.0} ms",
                ms(d.others_hold_all),
                ms(d.command),
                d.lost,
                ms(d.outage)
            );
            // `many::drain` checked that each move was told and that the
            // command ended by itself; a drain is make before break.
            assert_eq!(d.lost, 0, "a drain of {n} VIPs lost probes: {d:?}");
            eprintln!("{n} VIPs: SIGTERM");
            let (lost, outage) = many::sigterm(&mut bed);
            println!(
                "\nSIGTERM of the host holding {n} VIPs: at most {lost} probes lost on any sampled VIP, longest silence {:.0} ms",
                ms(outage)
            );
            eprintln!("{n} VIPs: the preferred node back");
            let h = many::hand_back(&mut bed);
            println!(
                "The preferred node back: it held all {n} VIPs {:.0} ms after its agent started, the others none {:.0} ms after; at most {} probes lost on any sampled VIP",
                ms(h.held_all),
                ms(h.released_all),
                h.lost
            );
            eprintln!("{n} VIPs: the preferred node fails during its hand-back");
            let f = many::fail_during_hand_back(&mut bed);
            println!(
                "The preferred node cut off during its hand-back: of the {} VIPs the others had let go of, the first was in another kernel {:.0} ms after the cut and the last {:.0} ms after (last minus first {:.0} ms); the longest silence of the {} sampled among them {:.0} ms",
                f.stranded,
                ms(f.kernel_first),
                ms(f.kernel_last),
                ms(f.kernel_last - f.kernel_first),
                f.sampled,
                ms(f.outage)
            );
        }
    }

    eprintln!("{largest} Services: cold start");
    let mut bed = Bed::new(largest, true);
    let cold = many::cold_start(&mut bed);
    println!(
        "\nCold start with {largest} Services: every VIP in a kernel {:.0} ms after the last agent was ready ({:.0} ms after the first); the sampled ones answered {:.0} ms after the last was ready",
        ms(cold.after_last_ready),
        ms(cold.after_first_ready),
        ms(cold.wire_after_last_ready)
    );
    std::thread::sleep(Duration::from_secs(5));
    for node in bed.c.nodes.clone() {
        if node == "node-a" && std::env::var_os("HOSTLB_HEAPTRACK").is_some() {
            // Its process is heaptrack's wrapper, not the agent.
            println!("{node}: under heaptrack, not measured here");
            continue;
        }
        let rss = bed.c.rss_kib(&node);
        let held = bed.c.held_count(&node);
        let parts = many::memory(&bed.c, &node);
        let text: Vec<String> = parts
            .iter()
            .filter(|(_, kib)| **kib >= 64)
            .map(|(k, kib)| format!("{k} {:.1}", *kib as f64 / 1024.0))
            .collect();
        println!(
            "{node}: {held} VIPs, RSS {:.1} MiB: {}",
            rss as f64 / 1024.0,
            text.join(", ")
        );
    }
}
