//! What the userspace switch (`hostlb_tests::switch`) adds to a frame's
//! latency: round trips through it against through the kernel's bridge,
//! both idle, `SWITCH_BENCH_PINGS` pings (default 2,000) 10 ms apart each
//! way. Needs root. docs/agent.md ("The fault campaign") has the figures.
//!
//! ```sh
//! cargo bench -p hostlb-tests --bench switch
//! ```

use std::time::Duration;

use hostlb_tests::netns::{Lan, require_root, require_tools};

fn percentile(v: &[Duration], p: usize) -> Duration {
    v[(v.len() * p / 100).min(v.len() - 1)]
}

fn main() {
    require_root();
    require_tools(&["ethtool", "ping"]);
    let count: u32 = std::env::var("SWITCH_BENCH_PINGS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000);
    let measure = |lan: &Lan| {
        let got = lan.round_trips("a", "b", count);
        let lost = got.iter().filter(|d| d.is_none()).count();
        let mut v: Vec<Duration> = got.into_iter().flatten().collect();
        v.sort();
        (percentile(&v, 50), percentile(&v, 99), v[v.len() - 1], lost)
    };
    let bridge = measure(&Lan::new(&["a", "b"]).unwrap());
    let switch = measure(&Lan::switched(&["a", "b"], 1).unwrap());
    println!("| {count} round trips, idle | median | 99th percentile | max | lost |");
    println!("|---|---|---|---|---|");
    for (name, (p50, p99, max, lost)) in [("kernel bridge", bridge), ("userspace switch", switch)] {
        println!(
            "| {name} | {} µs | {} µs | {} µs | {lost} |",
            p50.as_micros(),
            p99.as_micros(),
            max.as_micros()
        );
    }
    println!(
        "the switch adds {} µs to a round trip at the median (two frames), {} µs at the 99th percentile",
        switch.0.as_micros() as i128 - bridge.0.as_micros() as i128,
        switch.1.as_micros() as i128 - bridge.1.as_micros() as i128
    );
}
