//! `lbnodeagent run` end to end: three real agent processes on hosts of a
//! bridged LAN, the test API server, and a client probing the VIP with ARP
//! every 10 ms. Every assertion is about what the client sees on the wire
//! (which MAC answers) or what the hosts' kernels hold. Needs root, arping
//! and kubectl; fails (never skips) without them.

mod cluster;

use std::time::{Duration, Instant};

use cluster::Cluster;
use hostlb_tests::netns::wait_for;
use hostlb_tests::probe::{ArpProbe, judge};

const VIP: &str = "10.77.0.100";
const PROBE_EVERY: Duration = Duration::from_millis(10);

fn three_nodes() -> Cluster {
    let mut c = Cluster::new(&["node-a", "node-b", "node-c"]);
    c.pool_and_ad(
        &["10.77.0.100-10.77.0.120", "fd00:77::100-fd00:77::120"],
        "",
    );
    c.start_all();
    c
}

/// One MAC answers, from the host that holds the address, and the winner
/// says so in the Service's annotation.
fn settled(c: &Cluster, probe: &ArpProbe, timeout: Duration) -> String {
    let owner = c.wait_single_holder(VIP, timeout);
    let mac = c.host(&owner).mac().to_string();
    let t = Instant::now();
    probe
        .wait_for_mac(&mac, t, Duration::from_secs(3))
        .unwrap_or_else(|| panic!("{owner} holds {VIP} but its MAC {mac} does not answer"));
    std::thread::sleep(Duration::from_millis(300));
    let macs = probe.macs_between(t, Instant::now());
    assert_eq!(
        macs,
        vec![mac.clone()],
        "more than one MAC answers for {VIP}"
    );
    owner
}

fn probe(c: &Cluster) -> ArpProbe {
    let client = c.host("client");
    let source = client.ipv4.to_string();
    ArpProbe::start(&client.ns, "eth0", &source, VIP, PROBE_EVERY).unwrap()
}

/// Waits until `mac` is the only one answering, from `t` on; what the
/// client saw from `t` until then.
fn until_only(
    probe: &ArpProbe,
    mac: &str,
    t: Instant,
    timeout: Duration,
) -> hostlb_tests::probe::Outcome {
    let deadline = Instant::now() + timeout;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = Instant::now();
        let recent = probe.macs_between(now - Duration::from_millis(200), now);
        if recent == [mac.to_string()] {
            return judge(&probe.replies(), t, now, PROBE_EVERY);
        }
        assert!(
            Instant::now() < deadline,
            "{mac} is not the only MAC answering: {recent:?}"
        );
    }
}

#[test]
fn a_service_vip_answers_from_one_host_and_fails_over() {
    let mut c = three_nodes();
    let probe = probe(&c);

    let created = Instant::now();
    c.service("web", &[VIP], &["node-a"], "");
    let owner = settled(&c, &probe, Duration::from_secs(20));
    let first_reply = probe.since(created).first().map(|r| r.at).unwrap();
    eprintln!(
        "service created -> first ARP answer: {} ms",
        (first_reply - created).as_millis()
    );
    wait_for("the announcing annotation", Duration::from_secs(10), || {
        (c.annotation("web", "hostlb.io/announcing-IPv4") == format!("{owner},eth0")).then_some(())
    })
    .unwrap();

    // The owner's agent is killed and systemd's ExecStopPost runs
    // `cleanup`: the host lets go at once and another takes over.
    let killed_at = Instant::now();
    c.kill(&owner);
    let config = c.config_path(&owner);
    let (ok, out, err) =
        c.agent_command(&owner, &["cleanup", "--config", config.to_str().unwrap()]);
    assert!(ok, "cleanup failed: {out} {err}");
    assert!(out.contains("removed 1 addresses"), "{out}");
    let next = c.wait_single_holder(VIP, Duration::from_secs(5));
    assert_ne!(next, owner);
    let next_mac = c.host(&next).mac().to_string();
    let o = until_only(&probe, &next_mac, killed_at, Duration::from_secs(5));
    eprintln!(
        "SIGKILL + cleanup: outage {} ms, two owners {} ms",
        o.outage.as_millis(),
        o.two_owners.as_millis()
    );
    assert!(o.outage < Duration::from_millis(1500), "{o:?}");
    assert_eq!(o.two_owners, Duration::ZERO, "{o:?}");
    wait_for("the annotation to follow", Duration::from_secs(10), || {
        (c.annotation("web", "hostlb.io/announcing-IPv4") == format!("{next},eth0")).then_some(())
    })
    .unwrap();

    // It comes back: the election is pure hash, so it wins its VIP back,
    // make before break.
    let back_at = Instant::now();
    c.start(&owner);
    let owner_mac = c.host(&owner).mac().to_string();
    let o = until_only(&probe, &owner_mac, back_at, Duration::from_secs(10));
    assert_eq!(c.wait_single_holder(VIP, Duration::from_secs(5)), owner);
    eprintln!(
        "reclaim: lost {} probes, two owners {} ms",
        o.lost,
        o.two_owners.as_millis()
    );
    assert!(o.lost <= 2, "reclaim lost replies: {o:?}");

    // The owner's switch port goes down: its peers see it fail, the client
    // sees another MAC, and the owner itself released (carrier lost).
    let down_at = Instant::now();
    c.lan.set_port(&owner, false).unwrap();
    let o = wait_for(
        "a new owner after the port went down",
        Duration::from_secs(5),
        || c.holders(VIP).into_iter().find(|n| *n != owner),
    )
    .map(|n| until_only(&probe, c.host(&n).mac(), down_at, Duration::from_secs(5)))
    .unwrap();
    eprintln!("switch port down: outage {} ms", o.outage.as_millis());
    assert!(o.outage < Duration::from_millis(2000), "{o:?}");
    wait_for(
        "the isolated host to release",
        Duration::from_secs(5),
        || (!c.holders(VIP).contains(&owner)).then_some(()),
    )
    .unwrap();
    c.lan.set_port(&owner, true).unwrap();
    wait_for(
        "the owner to win its VIP back",
        Duration::from_secs(10),
        || (c.holders(VIP) == [owner.clone()]).then_some(()),
    )
    .unwrap();
    until_only(&probe, &owner_mac, Instant::now(), Duration::from_secs(5));

    // SIGTERM: the owner hands over before it exits, and exits 0.
    let term_at = Instant::now();
    c.signal(&owner, "TERM");
    assert_eq!(c.wait_exit(&owner, Duration::from_secs(10)), Some(0));
    let after = c.wait_single_holder(VIP, Duration::from_secs(5));
    assert_ne!(after, owner);
    let o = until_only(
        &probe,
        c.host(&after).mac(),
        term_at,
        Duration::from_secs(5),
    );
    eprintln!(
        "SIGTERM handover: lost {} probes, two owners {} ms",
        o.lost,
        o.two_owners.as_millis()
    );
    assert!(o.lost <= 2, "SIGTERM handover lost replies: {o:?}");
}

/// With no service manager to run `cleanup`, a killed agent's host keeps
/// answering only until the address lifetime (6 s in these configs) runs
/// out, not forever as keepalived's does.
#[test]
fn a_killed_agent_stops_answering_within_the_address_lifetime() {
    let mut c = three_nodes();
    let probe = probe(&c);
    c.service("web", &[VIP], &["node-a"], "");
    let owner = settled(&c, &probe, Duration::from_secs(20));
    let killed_at = Instant::now();
    c.kill(&owner);
    let next = wait_for("a new owner", Duration::from_secs(5), || {
        c.holders(VIP).into_iter().find(|n| *n != owner)
    })
    .unwrap();
    let o = until_only(
        &probe,
        c.host(&next).mac(),
        killed_at,
        Duration::from_secs(10),
    );
    let gone = wait_for(
        "the dead agent's address to lapse",
        Duration::from_secs(10),
        || (!c.holders(VIP).contains(&owner)).then(Instant::now),
    )
    .unwrap();
    eprintln!(
        "SIGKILL without cleanup: outage {} ms, two owners {} ms, address gone after {} ms",
        o.outage.as_millis(),
        o.two_owners.as_millis(),
        (gone - killed_at).as_millis()
    );
    assert!(o.outage < Duration::from_millis(1500), "{o:?}");
    assert!(gone - killed_at < Duration::from_secs(8));
}
