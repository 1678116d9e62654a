//! VIP moves on a real bridged LAN: the client's ARP and neighbour caches
//! follow the VIP at once because of the gratuitous ARP / unsolicited NA,
//! not because an entry expired. Needs root and arping, ndisc6, tcpdump;
//! fails (never skips) without them.

mod kernel;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hostlb_api::Family;
use hostlb_tests::netns::{Host, Lan, require_root, require_tools, wait_for};
use kernel::{Agent, SECOND};
use lbnodeagent::addrs::{AddressBackend, Applied, Lifetime, VipAddress};
use lbnodeagent::announce::{AnnounceConfig, Claims, Outcome, Target};

fn setup() -> (Lan, tempfile::TempDir) {
    require_root();
    require_tools(&["arping", "ndisc6", "tcpdump"]);
    let lan = Lan::new(&["a", "b", "client"]).unwrap();
    (lan, tempfile::tempdir().unwrap())
}

/// Adds `vip` on the agent's announce interface; returns the address and the
/// announcement target.
fn acquire(agent: &Agent, ip: IpAddr) -> (VipAddress, Target) {
    agent.with(move |b| async move {
        let eth0 = b.announce_interface(Family::of(ip), None).await.unwrap();
        let vip = eth0.vip(ip, Lifetime::FOREVER).unwrap();
        assert_eq!(b.add(&vip).await.unwrap(), Applied::Done);
        (vip, Target::on(&eth0, ip).expect("eth0 has a MAC"))
    })
}

fn release(agent: &Agent, vip: &VipAddress) {
    let vip = vip.clone();
    let applied = agent.with(move |b| async move { b.remove(&vip).await.unwrap() });
    assert_eq!(applied, Applied::Done);
}

fn announce(agent: &Agent, target: Target, config: AnnounceConfig) -> Outcome {
    agent.with_both(move |_, announcer| async move {
        announcer
            .announce(&target, &config, &mut || true)
            .await
            .unwrap()
    })
}

fn fast() -> AnnounceConfig {
    AnnounceConfig {
        count: 3,
        interval: Duration::from_millis(100),
        refresh: None,
    }
}

/// The MAC in the client's neighbour entry for `ip`, lower-case.
fn client_entry(client: &Host, ip: &str) -> Option<(String, String)> {
    let line = client.neighbour(ip).unwrap()?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let mac = words.iter().skip_while(|w| **w != "lladdr").nth(1)?;
    Some((mac.to_lowercase(), words.last()?.to_string()))
}

/// Gives `client` a REACHABLE neighbour entry for `ip` at `mac`, as traffic
/// to it a moment ago would: the kind of entry that would otherwise keep
/// pointing at the old owner for tens of seconds.
fn remember(client: &Host, ip: &str, mac: &str) {
    client
        .ns
        .ip(&format!(
            "neigh replace {ip} lladdr {mac} dev eth0 nud reachable"
        ))
        .unwrap();
    let (entry_mac, state) = client_entry(client, ip).expect("entry just set");
    assert_eq!((entry_mac.as_str(), state.as_str()), (mac, "REACHABLE"));
}

/// Moves `vip` from host A to host B as the reconcile loop will, and checks
/// that the client's neighbour entry follows B's announcement rather than
/// waiting for expiry. `probe` asks the network who has the VIP (arping,
/// ndisc6) and returns what the tool printed, lower-case; `check_frames`
/// gets what the client captured from B's MAC with `filter`, and B's MAC.
fn vip_moves_and_the_client_follows(
    vip: &str,
    probe: impl Fn(&Host) -> String,
    filter: &str,
    check_frames: impl FnOnce(&hostlb_tests::netns::Capture, &str),
) {
    let (lan, dir) = setup();
    let (a, b, client) = (lan.host("a"), lan.host("b"), lan.host("client"));
    let agent_a = Agent::on_host(a, &dir.path().join("a"));
    let agent_b = Agent::on_host(b, &dir.path().join("b"));

    let (vip_a, _) = acquire(&agent_a, vip.parse().unwrap());
    // The kernel on A answers for the VIP with A's MAC.
    let out = probe(client);
    assert!(out.contains(a.mac()), "the probe saw {out}");
    // The client talked to A a moment ago: a fresh entry pointing at A.
    remember(client, vip, a.mac());

    // Move: A lets go, B takes it. Until B announces, the client still
    // believes A (its entry would stay for many seconds).
    release(&agent_a, &vip_a);
    let (_, target_b) = acquire(&agent_b, vip.parse().unwrap());
    assert_eq!(client_entry(client, vip).unwrap().0, a.mac());

    let capture = client
        .ns
        .capture("eth0", &format!("{filter} and ether src {}", b.mac()))
        .unwrap();
    assert_eq!(
        announce(&agent_b, target_b, fast()),
        Outcome::Sent { rounds: 3 }
    );
    wait_for("the client's entry to move to B", SECOND, || {
        let (mac, _) = client_entry(client, vip)?;
        (mac == b.mac()).then_some(())
    })
    .unwrap();
    check_frames(&capture, b.mac());

    let out = probe(client);
    assert!(out.contains(b.mac()), "the probe saw {out}");
}

#[test]
fn ipv4_vip_moves_and_gratuitous_arp_repoints_the_client() {
    let vip = "10.77.0.100";
    let arping = |client: &Host| {
        client
            .ns
            .run(&["arping", "-c", "1", "-w", "2", "-I", "eth0", vip])
            .unwrap()
            .to_lowercase()
    };
    vip_moves_and_the_client_follows(vip, arping, "arp", |capture, b_mac| {
        // On the wire: per round a request and a reply, VIP as sender and
        // target, broadcast, from B's MAC.
        let frames = capture
            .wait_for(6, 2 * SECOND, |l| l.contains("ARP"))
            .unwrap();
        let requests = frames
            .iter()
            .filter(|l| l.contains(&format!("Request who-has {vip} tell {vip}")))
            .count();
        let replies = frames
            .iter()
            .filter(|l| l.contains(&format!("Reply {vip} is-at {b_mac}")))
            .count();
        assert_eq!((requests, replies), (3, 3), "{frames:#?}");
        assert!(
            frames.iter().all(|l| l.contains("> ff:ff:ff:ff:ff:ff")),
            "{frames:#?}"
        );
    });
}

#[test]
fn ipv6_vip_moves_and_neighbor_advertisement_repoints_the_client() {
    let vip = "fd00:77::100";
    let ndisc6 = |client: &Host| {
        client
            .ns
            .run(&["ndisc6", "-1", "-r", "3", "-w", "500", vip, "eth0"])
            .unwrap()
            .to_lowercase()
    };
    vip_moves_and_the_client_follows(vip, ndisc6, "icmp6", |capture, b_mac| {
        let frames = capture
            .wait_for(3, 2 * SECOND, |l| l.contains("neighbor advertisement"))
            .unwrap();
        for f in &frames {
            assert!(f.contains("> 33:33:00:00:00:01"), "{f}");
            assert!(
                f.contains(&format!("{vip} > ff02::1")),
                "source is the VIP: {f}"
            );
            assert!(f.contains("hlim 255"), "{f}");
            assert!(f.contains("icmp6 sum ok"), "{f}");
            assert!(f.contains(&format!("tgt is {vip}")), "{f}");
            assert!(
                f.contains("Flags [override]"),
                "override only, not solicited: {f}"
            );
            assert!(f.contains(b_mac), "target link-layer address option: {f}");
        }
        assert_eq!(frames.len(), 3, "{frames:#?}");
    });
}

#[test]
fn announcing_stops_as_soon_as_ownership_is_lost() {
    let (lan, dir) = setup();
    let (a, client) = (lan.host("a"), lan.host("client"));
    let agent = Agent::on_host(a, &dir.path().join("a"));
    let (_, target) = acquire(&agent, "10.77.0.100".parse().unwrap());
    let capture = client
        .ns
        .capture("eth0", &format!("arp and ether src {}", a.mac()))
        .unwrap();

    // Owned for two checks out of five rounds.
    let checks = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&checks);
    let outcome = agent.with_both(move |_, announcer| async move {
        let mut owned = move || c.fetch_add(1, Ordering::SeqCst) < 2;
        let config = AnnounceConfig {
            count: 5,
            interval: Duration::from_millis(50),
            refresh: None,
        };
        announcer
            .announce(&target, &config, &mut owned)
            .await
            .unwrap()
    });
    assert_eq!(outcome, Outcome::Lost { rounds: 2 });
    assert_eq!(checks.load(Ordering::SeqCst), 3);

    // Exactly what was sent reaches the wire, nothing after the end.
    capture
        .wait_for(4, 2 * SECOND, |l| l.contains("ARP"))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let ours: Vec<_> = capture
        .lines()
        .into_iter()
        .filter(|l| l.contains("ARP"))
        .collect();
    assert_eq!(
        ours.len(),
        4,
        "two rounds, each a request and a reply: {ours:#?}"
    );
}

#[test]
fn a_round_that_fails_while_the_link_is_down_does_not_end_the_announcement() {
    let (lan, dir) = setup();
    let (a, client) = (lan.host("a"), lan.host("client"));
    let agent = Agent::on_host(a, &dir.path().join("a"));
    let (_, target) = acquire(&agent, "10.77.0.100".parse().unwrap());
    let capture = client
        .ns
        .capture("eth0", &format!("arp and ether src {}", a.mac()))
        .unwrap();
    // Down for the first round (sending fails), up again before the second.
    a.ns.ip("link set eth0 down").unwrap();
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(150));
            a.ns.ip("link set eth0 up").unwrap();
        });
        agent.with_both(move |_, announcer| async move {
            let config = AnnounceConfig {
                count: 3,
                interval: Duration::from_millis(400),
                refresh: None,
            };
            announcer.announce(&target, &config, &mut || true).await
        })
    });
    assert_eq!(outcome.unwrap(), Outcome::Sent { rounds: 2 });
    let frames = capture
        .wait_for(4, 2 * SECOND, |l| l.contains("ARP"))
        .unwrap();
    assert_eq!(
        frames.len(),
        4,
        "two rounds of request and reply: {frames:#?}"
    );

    // Down for every round: only then an error.
    a.ns.ip("link set eth0 down").unwrap();
    let err = agent.with_both(move |_, announcer| async move {
        let config = AnnounceConfig {
            count: 2,
            interval: Duration::from_millis(10),
            refresh: None,
        };
        announcer
            .announce(&target, &config, &mut || true)
            .await
            .unwrap_err()
    });
    assert!(err.to_string().contains("10.77.0.100"), "{err}");
}

/// An answer that has reached the host is read at once, with no task
/// reading the wire in between: the agent's loop reads what is queued
/// before it steps a deadline (a pre-check's end), so an owner's answer
/// that came in time counts even when the reading task had no turn yet.
/// IPv4 (ARP) and IPv6 (NDP).
#[test]
fn an_answer_the_host_received_is_read_without_waiting() {
    let (lan, dir) = setup();
    let (a, b) = (lan.host("a"), lan.host("b"));
    let owner = Agent::on_host(a, &dir.path().join("a"));
    let asker = Agent::on_host(b, &dir.path().join("b"));
    let a_mac = a.mac().to_ascii_lowercase();
    for ip in ["10.77.0.100", "fd00:77::100"] {
        let ip: IpAddr = ip.parse().unwrap();
        acquire(&owner, ip);
        let heard = asker.with_both(move |backend, announcer| async move {
            let claims = Claims::open().expect("claim sockets");
            let eth0 = backend
                .announce_interface(Family::of(ip), None)
                .await
                .unwrap();
            let target = Target::on(&eth0, ip).expect("eth0 has a MAC");
            announcer.probe(&target).await.unwrap();
            // No await from here on: only this reads the sockets.
            std::thread::sleep(Duration::from_millis(200));
            let mut heard = Vec::new();
            while let Some(c) = claims.try_next().unwrap() {
                heard.push(c);
            }
            (heard, eth0.index)
        });
        let (heard, eth0) = heard;
        // The kernel's own answer, as the agent takes it: on the
        // interface the address is asked about on, and (IPv6) with the
        // hop limit of a message sent on the link.
        assert!(
            heard.iter().any(|c| c.claim.ip == ip
                && c.claim.mac.to_string() == a_mac
                && c.ifindex == eth0
                && c.on_link),
            "{ip}: the owner's answer, read without waiting: {heard:?}"
        );
    }
}
