//! `lbnodeagent run` measured as a client sees it: three real agents on a
//! bridged LAN in network namespaces, the test API server, and a client that
//! sends an ARP request every 10 ms and records which MAC answers.
//!
//! ```sh
//! cargo bench -p lbnodeagent --bench agent            # 5 runs (root)
//! AGENT_BENCH_RUNS=10 cargo bench -p lbnodeagent --bench agent
//! AGENT_BENCH_SCALE=0 ...                              # skip the 1,000-Service part
//! ```
//!
//! Per run: Service created → first ARP answer; owner SIGKILL followed by
//! `lbnodeagent cleanup` (systemd's `ExecStopPost`); the old owner returning
//! (make-before-break reclaim); the owner's switch port going down (a host
//! failure, detected by gossip); SIGTERM (planned handover); SIGKILL with no
//! cleanup (the host keeps answering until the address lifetime). Then, once:
//! 1,000 Services with 1,000 VIPs over 3 agents, time until all are held,
//! agent RSS and idle CPU, and the time a restarted agent takes to be ready.

#[path = "../tests/cluster/mod.rs"]
mod cluster;

use std::time::{Duration, Instant};

use cluster::{Cluster, max, median};
use hostlb_tests::netns::wait_for;
use hostlb_tests::probe::{ArpProbe, Outcome};

const VIP: &str = "10.77.0.100";
const EVERY: Duration = Duration::from_millis(10);

fn probe(c: &Cluster) -> ArpProbe {
    let client = c.host("client");
    ArpProbe::start(&client.ns, "eth0", &client.ipv4.to_string(), VIP, EVERY).unwrap()
}

/// Waits until only `mac` answers; what the client saw from `t`.
fn until_only(p: &ArpProbe, mac: &str, t: Instant) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = Instant::now();
        if p.macs_between(now - Duration::from_millis(200), now) == [mac.to_string()] {
            return p.judge(t, now);
        }
        assert!(Instant::now() < deadline, "{mac} never answered alone");
    }
}

fn holder_other_than(c: &Cluster, not: &str) -> String {
    wait_for("a new holder", Duration::from_secs(20), || {
        c.holders(VIP).into_iter().find(|n| n != not)
    })
    .unwrap()
}

#[derive(Default)]
struct Figures {
    created_ms: Vec<f64>,
    cleanup: Vec<Outcome>,
    reclaim: Vec<Outcome>,
    port_down: Vec<Outcome>,
    sigterm: Vec<Outcome>,
    no_cleanup: Vec<Outcome>,
}

fn one_run(f: &mut Figures) {
    let mut c = Cluster::new(&["node-a", "node-b", "node-c"]);
    c.pool_and_ad(&["10.77.0.100-10.77.0.120"], "");
    c.start_all();
    std::thread::sleep(Duration::from_secs(2));
    let p = probe(&c);
    let created = c.service("web", &[VIP], &["node-a"], "");
    let owner = c.wait_single_holder(VIP, Duration::from_secs(20));
    let owner_mac = c.host(&owner).mac().to_string();
    let first = p
        .wait_for_mac(&owner_mac, created, Duration::from_secs(10))
        .unwrap();
    f.created_ms.push((first - created).as_secs_f64() * 1e3);
    until_only(&p, &owner_mac, created);

    let t = Instant::now();
    c.kill(&owner);
    let config = c.config_path(&owner);
    let (ok, _, _) = c.agent_command(&owner, &["cleanup", "--config", config.to_str().unwrap()]);
    assert!(ok);
    let next = holder_other_than(&c, &owner);
    f.cleanup.push(until_only(&p, c.host(&next).mac(), t));

    let t = Instant::now();
    c.start(&owner);
    f.reclaim.push(until_only(&p, &owner_mac, t));

    let t = Instant::now();
    c.lan.set_port(&owner, false).unwrap();
    let next = holder_other_than(&c, &owner);
    f.port_down.push(until_only(&p, c.host(&next).mac(), t));
    c.lan.set_port(&owner, true).unwrap();
    until_only(&p, &owner_mac, Instant::now());

    let t = Instant::now();
    c.signal(&owner, "TERM");
    assert_eq!(c.wait_exit(&owner, Duration::from_secs(10)), Some(0));
    let next = holder_other_than(&c, &owner);
    f.sigterm.push(until_only(&p, c.host(&next).mac(), t));

    // The new owner is killed with nobody to clean up.
    c.start(&owner);
    until_only(&p, &owner_mac, Instant::now());
    let t = Instant::now();
    c.kill(&owner);
    let next = holder_other_than(&c, &owner);
    f.no_cleanup.push(until_only(&p, c.host(&next).mac(), t));
}

fn report(name: &str, outcomes: &[Outcome]) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let outage: Vec<f64> = outcomes.iter().map(|o| ms(o.outage)).collect();
    let two: Vec<f64> = outcomes.iter().map(|o| ms(o.two_owners)).collect();
    let lost: Vec<f64> = outcomes.iter().map(|o| o.lost as f64).collect();
    println!(
        "{name:<34} outage median {:>6.0} ms max {:>6.0} ms | lost probes median {:>4.0} max {:>4.0} | two MACs median {:>5.0} ms max {:>5.0} ms",
        median(outage.clone()),
        max(&outage),
        median(lost.clone()),
        max(&lost),
        median(two.clone()),
        max(&two)
    );
}

fn scale() {
    let n = 1000usize;
    let mut c = Cluster::new(&["node-a", "node-b", "node-c"]);
    c.pool_and_ad(&["10.77.0.0/24", "10.78.0.0/16"], "");
    // The VIPs are on-link: one /16 route on every host.
    for node in c.nodes.clone() {
        c.host(&node)
            .ns
            .ip("route add 10.78.0.0/16 dev eth0")
            .unwrap();
    }
    c.start_all();
    std::thread::sleep(Duration::from_secs(3));
    let idle_rss: Vec<u64> = c.nodes.iter().map(|n| c.rss_kib(n)).collect();
    let t = Instant::now();
    c.bulk_services(n, "10.78.0.1".parse().unwrap(), "node-a");
    let created = t.elapsed();
    wait_for("every VIP held", Duration::from_secs(120), || {
        let total: usize = c.nodes.iter().map(|n| c.held_count(n)).sum();
        (total == n).then_some(())
    })
    .unwrap();
    let all_held = t.elapsed();
    std::thread::sleep(Duration::from_secs(3));
    let cpu0: Vec<Duration> = c.nodes.iter().map(|n| c.cpu_time(n)).collect();
    std::thread::sleep(Duration::from_secs(10));
    let cpu: Vec<f64> = c
        .nodes
        .iter()
        .zip(&cpu0)
        .map(|(n, t0)| (c.cpu_time(n) - *t0).as_secs_f64() / 10.0 * 100.0)
        .collect();
    let rss: Vec<u64> = c.nodes.iter().map(|n| c.rss_kib(n)).collect();
    let anon: Vec<u64> = c
        .nodes
        .iter()
        .map(|n| c.proc_status_kib(n, "RssAnon:"))
        .collect();
    let held: Vec<usize> = c.nodes.iter().map(|n| c.held_count(n)).collect();
    println!(
        "1,000 Services: created through the API in {:.1} s; all {n} VIPs held {:.1} s after the first was created",
        created.as_secs_f64(),
        all_held.as_secs_f64()
    );
    println!(
        "  VIPs per agent {held:?}; RSS {rss:?} KiB, of which heap and stacks {anon:?} KiB (with no Service: {idle_rss:?} KiB); idle CPU {cpu:.2?} % of one core"
    );
    // Ready after a restart with 1,000 Services.
    let node = c.nodes[1].clone();
    let config = c.config_path(&node);
    c.signal(&node, "TERM");
    c.wait_exit(&node, Duration::from_secs(10));
    let t = Instant::now();
    c.start(&node);
    wait_for(
        "the restarted agent to be ready",
        Duration::from_secs(60),
        || {
            let (ok, out, _) = c.agent_command(
                &node,
                &["status", "--json", "--config", config.to_str().unwrap()],
            );
            (ok && out.contains("\"ready\": true")).then_some(())
        },
    )
    .unwrap();
    println!(
        "  a restarted agent is ready in {:.2} s (status polled every ~50 ms)",
        t.elapsed().as_secs_f64()
    );
}

fn main() {
    hostlb_tests::netns::require_root();
    // `cargo bench` passes `--bench`; nothing else is taken.
    let runs: usize = std::env::var("AGENT_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let mut f = Figures::default();
    for i in 0..runs {
        eprintln!("run {}/{runs}", i + 1);
        one_run(&mut f);
    }
    println!("\n{runs} runs, 3 agents, client ARP probe every 10 ms");
    println!(
        "Service created -> first ARP answer  median {:.0} ms, max {:.0} ms",
        median(f.created_ms.clone()),
        max(&f.created_ms)
    );
    report("SIGKILL + cleanup (ExecStopPost)", &f.cleanup);
    report("preferred (hash) owner returns", &f.reclaim);
    report("owner's switch port down", &f.port_down);
    report("SIGTERM", &f.sigterm);
    report("SIGKILL, no cleanup", &f.no_cleanup);
    if std::env::var("AGENT_BENCH_SCALE").as_deref() != Ok("0") {
        scale();
    }
}
