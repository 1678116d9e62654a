//! The agent's firewall at size: how long one whole table takes to put in
//! force with `nft -f` (what the agent does at every change of the
//! Services' addresses or ports), in a network namespace of its own, and
//! how long the agent takes to write the script.
//!
//! `cargo bench -p lbnodeagent --bench firewall`
//!
//! `FIREWALL_SIZES` (Services, default `1000,10000`) and `FIREWALL_RUNS`
//! (default 5); each Service has an address of its own, half IPv4 and half
//! IPv6, and two TCP ports. Medians are printed. Needs root and nft.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use hostlb_tests::median;
use hostlb_tests::netns::{Netns, require_root, require_tools};
use lbnodeagent::election::{Protocol, ServicePort};
use lbnodeagent::model::{Firewall, FirewallPlan};

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// `n` Services, each on an address of its own with ports 80 and 443.
fn plan(n: usize) -> FirewallPlan {
    let mut f = Firewall {
        vips: BTreeSet::new(),
        open: BTreeSet::new(),
    };
    for i in 0..n as u32 {
        let ip: IpAddr = if i % 2 == 0 {
            Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 80, 0, 0)) + i).into()
        } else {
            Ipv6Addr::from(u128::from("fd00:80::".parse::<Ipv6Addr>().unwrap()) + u128::from(i))
                .into()
        };
        f.vips.insert(ip);
        for port in [80, 443] {
            f.open.insert((
                ip,
                ServicePort {
                    protocol: Protocol::Tcp,
                    port,
                },
            ));
        }
    }
    FirewallPlan::On(f)
}

fn main() {
    require_root();
    require_tools(&["nft"]);
    let runs = env_list("FIREWALL_RUNS", &[5])
        .first()
        .copied()
        .unwrap_or(5)
        .max(1);
    for n in env_list("FIREWALL_SIZES", &[1000, 10_000]) {
        let plan = plan(n);
        let mut render = Vec::new();
        for _ in 0..runs {
            let t = Instant::now();
            std::hint::black_box(lbnodeagent::firewall::script(&plan));
            render.push(t.elapsed());
        }
        let ns = Netns::new("fwbench").unwrap();
        let mut apply = Vec::new();
        for _ in 0..runs {
            let p = plan.clone();
            let took = ns
                .block_on(move || async move {
                    let t = Instant::now();
                    lbnodeagent::firewall::apply(&p).await.unwrap();
                    t.elapsed()
                })
                .unwrap();
            apply.push(took);
        }
        // Even indices are IPv4, odd ones IPv6, two ports each.
        for (set, services) in [("open4", n.div_ceil(2)), ("open6", n / 2)] {
            let listed = ns
                .run(&["nft", "list", "set", "inet", "hostlb", set])
                .unwrap();
            let pairs = listed.matches(" . tcp . ").count();
            assert_eq!(
                pairs,
                2 * services,
                "the address and port pairs in force in {set}"
            );
        }
        println!(
            "{n} Services ({} address and port pairs): the table put in force in {:.0} ms (median of {runs}, nft -f in a fresh namespace), its script written in {:.1} ms",
            2 * n,
            median(apply).as_secs_f64() * 1000.0,
            median(render).as_secs_f64() * 1000.0,
        );
    }
}
