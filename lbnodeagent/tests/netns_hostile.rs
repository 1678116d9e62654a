//! What the wire can do to a VIP, tried as an attacker would, against real
//! agents on a bridged LAN (the test API server, a client probing with
//! ARP). Needs root, python3 and kubectl; fails (never skips) without them.

mod cluster;

use std::time::{Duration, Instant};

use cluster::{Cluster, PROBE_EVERY};
use hostlb_tests::flood::Flood;
use hostlb_tests::probe::ArpProbe;

const VIP4: &str = "10.77.0.100";
const VIP6: &str = "fd00:77::100";
const NEW4: &str = "10.77.0.101";
const NEW6: &str = "fd00:77::101";

/// Lines an agent may log about strangers' claims during the flood: one a
/// minute per address (`REPORT_EVERY`), for the two addresses it may hold
/// of each kind, and slack for a line at each end of the minute.
const LOG_LINES_MAX: usize = 8;
/// What an agent's anonymous resident memory may grow by during the flood:
/// the forged claims keep nothing (a few MACs per address at most), so
/// this is the allocator's own noise on a debug build, with a margin; the
/// unbounded record of every MAC heard grew it by 2.6 MB over 50,000
/// advertisements.
const RSS_GROWTH_MAX_KIB: u64 = 1_024;

fn stranger_lines(c: &Cluster, node: &str) -> usize {
    std::fs::read_to_string(c.log_path(node))
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.contains("is no hostlb node")
                || l.contains("not taking the address")
                || l.contains("second owner on the wire")
        })
        .count()
}

/// The agent's count of refused claims; 0 where it has none (an agent
/// from before the count, run for comparison).
fn refused(c: &Cluster, node: &str, reason: &str) -> u64 {
    let metrics = c.http_get(node, "/metrics").1;
    let key = format!("hostlb_agent_claims_refused_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// 50,000 unsolicited advertisements for the IPv6 VIPs over 10 s, hop
/// limit 64 as a packet routed from anywhere arrives with, each naming a
/// new MAC; and at the same time, on every host, gratuitous ARP for the
/// IPv4 VIPs from a pod's veth (a second interface of the host), 10,000
/// each. Nothing changes owner, a Service created meanwhile is taken on
/// both families, and each agent's log and memory stay within bounds. The
/// figures are printed (`--nocapture`).
#[test]
fn forged_claims_from_off_the_link_or_another_interface_change_nothing() {
    let mut c = Cluster::new(&["node-a", "node-b", "node-c"]);
    c.pool_and_ad(
        &["10.77.0.100-10.77.0.120", "fd00:77::100-fd00:77::120"],
        "",
    );
    c.start_all();
    let all = ["node-a", "node-b", "node-c"];
    c.service("web", &[VIP4, VIP6], &all, "");
    let client = c.host("client");
    let probe = ArpProbe::start(
        &client.ns,
        "eth0",
        &client.ipv4.to_string(),
        VIP4,
        PROBE_EVERY,
    )
    .unwrap();
    let probe6 = ArpProbe::start(
        &client.ns,
        "eth0",
        &client.ipv6.to_string(),
        VIP6,
        PROBE_EVERY,
    )
    .unwrap();
    let owner4 = c.wait_single_holder(VIP4, Duration::from_secs(20));
    let owner6 = c.wait_single_holder(VIP6, Duration::from_secs(20));
    c.wait_ready(Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(2));
    let rss_before: Vec<u64> = all
        .iter()
        .map(|n| c.proc_status_kib(n, "RssAnon:"))
        .collect();
    let lines_before: Vec<usize> = all.iter().map(|n| stranger_lines(&c, n)).collect();

    // A pod's veth on every host: its far end sends, the host's end hears.
    for n in all {
        let ns = &c.host(n).ns;
        ns.ip("link add podveth type veth peer name podside")
            .unwrap();
        ns.ip("link set podveth up").unwrap();
        ns.ip("link set podside up").unwrap();
    }
    let t0 = Instant::now();
    let over = Duration::from_secs(10);
    let na = Flood::start(&client.ns, "eth0", &[VIP6, NEW6], 64, 50_000, over).unwrap();
    let arps: Vec<Flood> = all
        .iter()
        .map(|n| Flood::start(&c.host(n).ns, "podside", &[VIP4, NEW4], 255, 10_000, over).unwrap())
        .collect();
    // Meanwhile a new Service, whose addresses the flood claims too.
    std::thread::sleep(Duration::from_secs(2));
    c.service("fresh", &[NEW4, NEW6], &all, "");
    // Taken within 6 s, by one node: `None` if not (the assertion comes
    // after the figures are printed).
    let taken = |ip: &str| {
        hostlb_tests::netns::wait_for(
            &format!("one holder of {ip}"),
            Duration::from_secs(6),
            || {
                let h = c.holders(ip);
                (h.len() == 1).then(|| h[0].clone())
            },
        )
        .ok()
    };
    let (new4, new6) = (taken(NEW4), taken(NEW6));
    let sent_na = na.wait().unwrap();
    let sent_arp: u64 = arps.into_iter().map(|f| f.wait().unwrap()).sum();
    let flooded = t0.elapsed();
    std::thread::sleep(Duration::from_secs(1));

    let rss_after: Vec<u64> = all
        .iter()
        .map(|n| c.proc_status_kib(n, "RssAnon:"))
        .collect();
    let lines_after: Vec<usize> = all.iter().map(|n| stranger_lines(&c, n)).collect();
    println!(
        "flood: {sent_na} advertisements (hop limit 64) and {sent_arp} ARP replies from pod veths in {flooded:?}; \
         new VIPs taken by {new4:?} and {new6:?}; {VIP4} held by {:?}, {VIP6} by {:?}",
        c.holders(VIP4),
        c.holders(VIP6)
    );
    for (i, n) in all.iter().enumerate() {
        println!(
            "{n}: RssAnon {} -> {} KiB, stranger log lines {} -> {}, refused off_link {} other_interface {}",
            rss_before[i],
            rss_after[i],
            lines_before[i],
            lines_after[i],
            refused(&c, n, "off_link"),
            refused(&c, n, "other_interface"),
        );
    }
    assert!(
        new4.is_some() && new6.is_some(),
        "a new VIP is taken during the flood"
    );
    assert_eq!(c.holders(VIP4), vec![owner4.clone()], "no owner change");
    assert_eq!(c.holders(VIP6), vec![owner6.clone()], "no owner change");
    let mac4 = c.host(&owner4).mac().to_string();
    let mac6 = c.host(&owner6).mac().to_string();
    assert_eq!(probe.macs_between(t0, Instant::now()), vec![mac4]);
    assert_eq!(probe6.macs_between(t0, Instant::now()), vec![mac6]);
    for (i, n) in all.iter().enumerate() {
        assert!(
            rss_after[i] <= rss_before[i] + RSS_GROWTH_MAX_KIB,
            "{n}: RssAnon grew from {} to {} KiB",
            rss_before[i],
            rss_after[i]
        );
        assert!(
            lines_after[i] - lines_before[i] <= LOG_LINES_MAX,
            "{n}: {} lines about strangers",
            lines_after[i] - lines_before[i]
        );
    }
    // The advertisements reached the owners of the IPv6 VIPs, the ARP
    // their hosts' veths; each was counted, not acted on.
    assert!(refused(&c, &owner6, "off_link") > 1_000);
    assert!(refused(&c, &owner4, "other_interface") > 1_000);
}

/// On a cluster without the Service policy (forgotten, or not enforced by
/// the server), the agents' credentials could rewrite any Service: each
/// agent finds out by a dry run under its own identity and says so, in
/// `/readyz` and as `Degraded` in its record. On the real API server.
#[test]
fn an_agent_says_when_the_service_policy_is_not_in_force() {
    let Some(mut c) = Cluster::real_without_policy(&["node-a", "node-b"]) else {
        return;
    };
    c.pool_and_ad(&["10.77.0.100-10.77.0.120"], "");
    c.start_all();
    c.service("web", &[VIP4], &["node-a", "node-b"], "");
    for n in ["node-a", "node-b"] {
        hostlb_tests::netns::wait_for(
            &format!("{n} to say the policy is not in force"),
            Duration::from_secs(30),
            || {
                let (code, body) = c.http_get(n, "/readyz");
                (code != "200" && body.contains("the Service policy is not in force")).then_some(())
            },
        )
        .unwrap();
        hostlb_tests::netns::wait_for(
            &format!("{n}'s record Degraded"),
            Duration::from_secs(30),
            || (c.record(n, "{.status.state}") == "Degraded").then_some(()),
        )
        .unwrap();
    }
    let labels = c.kubectl(&["get", "service", "web", "-o", "jsonpath={.metadata.labels}"]);
    assert!(
        !labels.contains("policy-probe"),
        "a dry run writes nothing: {labels}"
    );
}

/// What root on one host can do with the gossip key it holds, in the
/// owner's name: leaving beats sent from the owner's own address (added
/// to the forger's loopback), and gossip state in the
/// owner's name, both as a newer run that leaves and as the owner's own
/// run with versions far above the owner's (to hide its real state). The
/// peers believe none of it: the owner signed none. Nobody takes the VIP,
/// a client hears the owner alone throughout, and the peers count what
/// they refused.
#[test]
fn a_key_holder_cannot_speak_for_another_node() {
    use lbnodeagent::gossip::{
        AuthTransport, DEFAULT_REPLAY_WINDOW, GossipConfig, GossipKeys, LocalState, Membership,
        Status,
    };
    let mut c = Cluster::new(&["node-a", "node-b", "node-c"]);
    c.pool_and_ad(&["10.77.0.100-10.77.0.120"], "");
    c.start_all();
    let all = ["node-a", "node-b", "node-c"];
    c.service("web", &[VIP4], &all, "");
    let client = c.host("client");
    let probe = ArpProbe::start(
        &client.ns,
        "eth0",
        &client.ipv4.to_string(),
        VIP4,
        PROBE_EVERY,
    )
    .unwrap();
    let owner = c.wait_single_holder(VIP4, Duration::from_secs(20));
    c.wait_ready(Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(1));
    let owner_mac = c.host(&owner).mac().to_string();
    let owner_ip: std::net::IpAddr = c.host(&owner).ipv4.into();
    let others: Vec<String> = all
        .iter()
        .filter(|n| **n != owner)
        .map(|n| n.to_string())
        .collect();
    let forger = others[0].clone();
    let generation: u64 =
        std::fs::read_to_string(c.run_dir(&owner).join(lbnodeagent::agent::GENERATION_FILE))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    let peers: Vec<std::net::SocketAddr> = others
        .iter()
        .map(|n| {
            std::net::SocketAddr::new(c.host(n).ipv4.into(), lbnodeagent::gossip::DEFAULT_PORT)
        })
        .collect();
    let key = c.dir.path().join("gossip.key");
    // The forger's own identity key: what root on its host has (an agent
    // of a release before identities has none; then any key will do).
    let own_key = lbnodeagent::identity::NodeKey::load_existing(&c.run_dir(&forger))
        .unwrap_or_else(|| lbnodeagent::identity::NodeKey::from_seed([7; 32]));
    let forger_ip: std::net::IpAddr = c.host(&forger).ipv4.into();
    // The owner's address on the forger's loopback, not answered for on
    // its LAN (root on a host can send from any address it likes).
    {
        let ns = &c.host(&forger).ns;
        ns.sysctl("net.ipv4.conf.all.arp_ignore", "1").unwrap();
        ns.sysctl("net.ipv4.conf.all.arp_announce", "2").unwrap();
        ns.ip(&format!("addr add {owner_ip}/32 dev lo")).unwrap();
    }
    let t0 = Instant::now();
    let name = owner.clone();
    c.host(&forger)
        .ns
        .block_on(move || async move {
            let keys = || GossipKeys::load(&key).unwrap();
            // Leaving beats from the owner's address, unproved and proved
            // with the forger's own key.
            let transport = AuthTransport::new(keys(), DEFAULT_REPLAY_WINDOW);
            let send = transport
                .sender(std::net::SocketAddr::new(owner_ip, 0))
                .unwrap();
            for key in [None, Some(&own_key)] {
                lbnodeagent::gossip::beats::send_leaving(
                    &name,
                    Some(generation),
                    key,
                    &lbnodeagent::gossip::beats::Counter::default(),
                    &peers,
                    |to, p| send.send(to, p),
                )
                .await;
            }
            let sent = transport.counters().snapshot();
            assert!(
                sent.frames_sent > 0 && sent.send_failed == 0,
                "the spoofed beats went out: {sent:?}"
            );
            // Gossip state in the owner's name: its run, versions pushed
            // far past its own, leaving; and a newer run that leaves.
            let mut forged = Vec::new();
            for (i, g) in [generation, generation + (1 << 20)].into_iter().enumerate() {
                let mut config = GossipConfig::for_test(
                    &name,
                    std::net::SocketAddr::new(forger_ip, 17_934 + i as u16),
                );
                config.cluster_id = lbnodeagent::gossip::DEFAULT_CLUSTER_ID.into();
                config.advertise = Some(std::net::SocketAddr::new(
                    owner_ip,
                    lbnodeagent::gossip::DEFAULT_PORT,
                ));
                config.seeds = peers.iter().map(|p| p.to_string()).collect();
                config.generation = Some(g);
                let transport = AuthTransport::new(keys(), DEFAULT_REPLAY_WINDOW)
                    .with_destinations([config.listen]);
                let leaving = LocalState {
                    status: Status::Leaving,
                    ..LocalState::default()
                };
                let m = Membership::start(&config, leaving.clone(), &transport, &transport)
                    .await
                    .unwrap();
                for revision in 0..500 {
                    m.publish(LocalState {
                        revision,
                        ..leaving.clone()
                    })
                    .await;
                }
                forged.push((m, transport));
            }
            tokio::time::sleep(Duration::from_secs(4)).await;
            drop(forged);
        })
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let macs = probe.macs_between(t0, Instant::now());
    println!(
        "after the forgeries: {VIP4} held by {:?} (the owner: {owner}); MACs a client heard: {macs:?}",
        c.holders(VIP4)
    );
    assert_eq!(c.holders(VIP4), vec![owner.clone()], "nobody took it");
    assert_eq!(macs, vec![owner_mac], "a client hears the owner alone");
    let told = &others[1];
    let metrics = c.http_get(told, "/metrics").1;
    let counter = |key: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map_or(0, |n| n.trim().parse().unwrap())
    };
    let beats = counter("hostlb_agent_beats_refused_total{reason=\"unproved\"} ");
    let state = counter("hostlb_agent_gossip_state_refused_total{reason=\"refused\"} ");
    println!("{told}: forged beats refused {beats}, forged state refused {state}");
    assert!(
        beats >= 2 * u64::from(lbnodeagent::gossip::beats::LEAVING_ROUNDS) - 1,
        "every forged leaving beat refused: {beats}"
    );
    assert!(state > 0, "forged state refused: {metrics}");
    for n in &others {
        let log = std::fs::read_to_string(c.log_path(n)).unwrap();
        assert!(
            !log.contains("its leaving beat says it goes"),
            "{n} took a forged leaving beat for the owner's"
        );
    }
}

/// Anyone who reaches UDP 7934 can send datagrams the size of the largest
/// gossip frame; none of it is authenticated, and none of it is kept: an
/// agent's memory and its peers' view of it are unchanged by 20,000 of
/// them over 10 s (1.3 GB), each with the gossip frame's magic so that it
/// is read as far as its tag. The figures are printed (`--nocapture`).
#[test]
fn a_flood_of_unauthenticated_datagrams_costs_no_memory() {
    let mut c = Cluster::new(&["node-a", "node-b", "node-c"]);
    c.pool_and_ad(&["10.77.0.100-10.77.0.120"], "");
    c.start_all();
    let all = ["node-a", "node-b", "node-c"];
    c.service("web", &[VIP4], &all, "");
    let owner = c.wait_single_holder(VIP4, Duration::from_secs(20));
    c.wait_ready(Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(2));
    let before = c.proc_status_kib(&owner, "RssAnon:");
    let to = std::net::SocketAddr::new(
        c.host(&owner).ipv4.into(),
        lbnodeagent::gossip::DEFAULT_PORT,
    );
    let t0 = Instant::now();
    let flood = hostlb_tests::flood::udp(
        &c.host("client").ns,
        to,
        &lbnodeagent::gossip::frame::MAGIC,
        65_000,
        20_000,
        Duration::from_secs(10),
    )
    .unwrap();
    let mut peak = before;
    while t0.elapsed() < Duration::from_secs(11) {
        peak = peak.max(c.proc_status_kib(&owner, "RssAnon:"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let sent = flood.wait().unwrap();
    let after = c.proc_status_kib(&owner, "RssAnon:");
    let metrics = c.http_get(&owner, "/metrics").1;
    // Every reason: most have a tag count past what a frame may carry
    // (malformed), the rest a wrong tag (bad_mac).
    let dropped: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("hostlb_agent_gossip_frames_dropped_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    println!(
        "{sent} datagrams of 65,000 bytes to {owner} in {:?}: RssAnon {before} KiB before, {peak} at most, {after} after; {dropped} dropped as unauthenticated",
        t0.elapsed()
    );
    assert!(dropped > 1_000, "the flood reached the agent: {dropped}");
    assert!(
        peak <= before + RSS_GROWTH_MAX_KIB,
        "RssAnon grew from {before} to {peak} KiB"
    );
    assert_eq!(c.holders(VIP4), vec![owner.clone()], "no owner change");
    for n in all.iter().filter(|n| **n != owner) {
        let members: u64 = c
            .http_get(n, "/metrics")
            .1
            .lines()
            .find_map(|l| l.strip_prefix("hostlb_agent_live_members "))
            .map_or(0, |v| v.trim().parse().unwrap());
        assert_eq!(members, 3, "{n} still sees every member");
    }
}
