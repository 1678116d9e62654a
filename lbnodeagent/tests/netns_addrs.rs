//! The netlink address backend against a real kernel, in network namespaces.
//! Needs root; fails (never skips) without it.

mod kernel;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hostlb_api::{Family, Prefix};
use hostlb_tests::netns::{Lan, Netns, require_root, wait_for};
use kernel::{Agent, SECOND, address_line, valid_lft};
use lbnodeagent::addrs::{
    AddressBackend, Applied, Error, KernelEvent, Lifetime, MacAddr, NetlinkConfig, OwnedAddress,
    VipAddress,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn prefix(s: &str) -> Prefix {
    s.parse().unwrap()
}

/// The VIP on `a`'s eth0 with its on-link prefix.
fn vip_on(agent: &Agent, family: Family, addr: &str, lifetime: Lifetime) -> VipAddress {
    let addr = ip(addr);
    agent.with(move |b| async move {
        b.announce_interface(family, None)
            .await
            .unwrap()
            .vip(addr, lifetime)
            .expect("the VIP is on-link")
    })
}

fn add(agent: &Agent, vip: &VipAddress) -> Applied {
    let vip = vip.clone();
    agent.with(move |b| async move { b.add(&vip).await.unwrap() })
}

fn remove(agent: &Agent, vip: &VipAddress) -> Applied {
    let vip = vip.clone();
    agent.with(move |b| async move { b.remove(&vip).await.unwrap() })
}

fn adopt(agent: &Agent) -> BTreeSet<IpAddr> {
    agent.with(|b| async move { b.adopt().await.unwrap().into_iter().map(|o| o.ip).collect() })
}

/// `ip -batch` lines adding `count` /32 host addresses in `net` (the first
/// two octets, e.g. "10.88") to `dev`.
fn host_addresses(net: &str, dev: &str, count: usize) -> String {
    (0..count)
        .map(|i| format!("addr add {net}.{}.{}/32 dev {dev}\n", i / 250, i % 250 + 1))
        .collect()
}

/// `count` host addresses added to `dev` and then deleted, as `ip -batch`
/// lines: the deletions' notifications reach the event socket, the
/// additions' do not (see `new_address_notifications_never_reach_the_agent`).
fn host_addresses_come_and_go(net: &str, dev: &str, count: usize) -> String {
    let added = host_addresses(net, dev, count);
    let deleted = added.replace("addr add", "addr del");
    added + &deleted
}

/// Runs the `ip -batch` file `batch` while nobody reads `agent`'s event
/// socket, then collects its events up to the first Resync (for at most 5 s).
fn events_through_a_burst(agent: &Agent, batch: std::path::PathBuf) -> Vec<KernelEvent> {
    events_through_a_burst_until(agent, batch, |e| *e == KernelEvent::Resync)
}

/// As [`events_through_a_burst`], up to the first event `last` accepts,
/// and what follows it within 200 ms (an overrun's carrier changes come
/// just before its Resync).
fn events_through_a_burst_until(
    agent: &Agent,
    batch: std::path::PathBuf,
    last: fn(&KernelEvent) -> bool,
) -> Vec<KernelEvent> {
    agent.with(move |b| async move {
        let mut events = b.subscribe().await.unwrap();
        // Blocks this namespace's only runtime thread, so nobody reads the
        // event socket while the kernel fills it.
        let status = std::process::Command::new("ip")
            .arg("-batch")
            .arg(&batch)
            .status()
            .unwrap();
        assert!(status.success());
        let mut seen = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(e) = events.recv().await {
                let done = last(&e);
                seen.push(e);
                if done {
                    return;
                }
            }
        })
        .await;
        if seen
            .last()
            .is_some_and(|e| last(e) && *e != KernelEvent::Resync)
        {
            let _ = tokio::time::timeout(Duration::from_millis(200), async {
                while let Some(e) = events.recv().await {
                    seen.push(e);
                }
            })
            .await;
        }
        seen
    })
}

/// Only links that answer ARP have a MAC here: `lo` (which reports
/// 00:00:00:00:00:00) and a NOARP link have none, so neither is named in an
/// ARP warning or a record; an Ethernet link keeps its own.
#[test]
fn only_links_that_answer_arp_have_a_mac() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::on_host(a, dir.path());
    a.ns.ip("link set lo up").unwrap();
    lan.add_interface("a", "eth1").unwrap();
    a.ns.ip("link set eth1 arp off").unwrap();
    let all = agent.with(|b| async move { b.interfaces().await.unwrap() });
    let mac_of = |name: &str| {
        all.iter()
            .find(|i| i.name == name)
            .unwrap_or_else(|| panic!("{name} listed: {all:?}"))
            .mac
    };
    assert_eq!(mac_of("lo"), None);
    assert_eq!(mac_of("eth1"), None, "a NOARP link");
    assert_eq!(mac_of("eth0"), Some(a.mac().parse::<MacAddr>().unwrap()));
}

/// The one read the agent makes every second says what the three calls it
/// stands for say, errors included.
fn one_read_matches_the_calls(agent: &Agent, configured: Option<&'static str>) {
    type Said = Result<String, String>;
    let said = |r: Result<String, Error>| -> Said { r.map_err(|e| e.to_string()) };
    let (one, calls): ([Said; 3], [Said; 3]) = agent.with(move |b| async move {
        let read = b.links_and_announce(configured).await;
        let (all, [v4, v6]) = (read.all, read.announce);
        let one = [
            said(all.map(|a| format!("{a:?}"))),
            said(v4.map(|i| format!("{i:?}"))),
            said(v6.map(|i| format!("{i:?}"))),
        ];
        let calls = [
            said(b.interfaces().await.map(|a| format!("{a:?}"))),
            said(
                b.announce_interface(Family::V4, configured)
                    .await
                    .map(|i| format!("{i:?}")),
            ),
            said(
                b.announce_interface(Family::V6, configured)
                    .await
                    .map(|i| format!("{i:?}")),
            ),
        ];
        (one, calls)
    });
    assert_eq!(one, calls, "configured {configured:?}");
}

#[test]
fn announce_interface_follows_the_default_route_with_the_lowest_metric() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::on_host(a, dir.path());

    let eth0 = agent.with(|b| async move { b.announce_interface(Family::V4, None).await.unwrap() });
    assert_eq!(eth0.name, "eth0");
    assert_eq!(eth0.mac, Some(a.mac().parse::<MacAddr>().unwrap()));
    assert!(eth0.carrier);
    assert_eq!(
        eth0.prefixes,
        vec![prefix("10.77.0.0/24"), prefix("fd00:77::/64")],
        "fe80::/64 and the kernel's local and multicast routes are left out"
    );
    let v6 = agent.with(|b| async move { b.announce_interface(Family::V6, None).await.unwrap() });
    assert_eq!(v6, eth0);
    one_read_matches_the_calls(&agent, None);

    // A second uplink whose default route has a lower metric takes over IPv4.
    lan.add_interface("a", "eth1").unwrap();
    a.ns.ip("addr add 10.78.0.11/24 dev eth1").unwrap();
    a.ns.ip("route del default via 10.77.0.1").unwrap();
    a.ns.ip("route add default via 10.77.0.1 dev eth0 metric 100")
        .unwrap();
    a.ns.ip("route add default via 10.78.0.1 dev eth1 metric 10")
        .unwrap();
    let v4 = agent.with(|b| async move { b.announce_interface(Family::V4, None).await.unwrap() });
    assert_eq!(v4.name, "eth1");
    assert_eq!(v4.prefixes, vec![prefix("10.78.0.0/24")]);
    let v6 = agent.with(|b| async move { b.announce_interface(Family::V6, None).await.unwrap() });
    assert_eq!(v6.name, "eth0");
    one_read_matches_the_calls(&agent, None);

    // A configured interface wins over routes; a wrong name says what to fix.
    let configured = agent.with(|b| async move {
        b.announce_interface(Family::V4, Some("eth0"))
            .await
            .unwrap()
    });
    assert_eq!(configured.name, "eth0");
    let err = agent.with(|b| async move { b.interface("eth9").await.unwrap_err() });
    assert!(matches!(err, Error::NoSuchInterface { .. }), "{err}");
    assert!(err.to_string().contains("announce.interface"), "{err}");
    one_read_matches_the_calls(&agent, Some("eth0"));
    one_read_matches_the_calls(&agent, Some("eth9"));
    // An alternative name, which the kernel resolves and a dump does not list.
    a.ns.ip("link property add dev eth1 altname uplink1")
        .unwrap();
    let alt = agent.with(|b| async move { b.interface("uplink1").await.unwrap() });
    assert_eq!(alt.name, "eth1");
    one_read_matches_the_calls(&agent, Some("uplink1"));

    a.ns.ip("-6 route del default").unwrap();
    let err =
        agent.with(|b| async move { b.announce_interface(Family::V6, None).await.unwrap_err() });
    assert!(
        matches!(err, Error::NoDefaultRoute { family: Family::V6 }),
        "{err}"
    );
    one_read_matches_the_calls(&agent, None);
}

#[test]
fn dhcpv6_host_address_still_finds_its_64_from_the_route() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    // What a DHCPv6 client and router advertisements leave: a /128 address,
    // the /64 as an RA route, a default route via the router's link-local.
    a.ns.ip("-6 addr flush dev eth0 scope global").unwrap();
    a.ns.ip("-6 route flush dev eth0 proto boot").unwrap();
    a.ns.ip("-6 addr add fd00:1::7/128 dev eth0 nodad").unwrap();
    a.ns.ip("-6 route add fd00:1::/64 dev eth0 proto ra metric 100")
        .unwrap();
    a.ns.ip("-6 route add default via fe80::1 dev eth0 proto ra metric 1024")
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::on_host(a, dir.path());
    let eth0 = agent.with(|b| async move { b.announce_interface(Family::V6, None).await.unwrap() });
    assert_eq!(eth0.name, "eth0");
    assert_eq!(
        eth0.prefixes_of(Family::V6).copied().collect::<Vec<_>>(),
        vec![prefix("fd00:1::/64")]
    );
    let vip = eth0.vip(ip("fd00:1::100"), Lifetime::FOREVER).unwrap();
    assert_eq!(vip.prefix_len, 64);
    assert_eq!(add(&agent, &vip), Applied::Done);

    let line = address_line(&a.ns, "eth0", "fd00:1::100").expect("VIP added");
    assert!(line.contains("fd00:1::100/64"), "{line}");
    assert!(line.contains("nodad"), "{line}");
    assert!(line.contains("noprefixroute"), "{line}");
    assert!(line.contains("valid_lft forever"), "{line}");
    assert!(
        line.contains("deprecated") && line.contains("preferred_lft 0sec"),
        "IPv6 VIPs stay out of source address selection: {line}"
    );
    // No second route for the /64: the RA route is the only one.
    let routes = a.ns.ip("-6 route show fd00:1::/64").unwrap();
    assert_eq!(routes.lines().count(), 1, "{routes}");
}

#[test]
fn added_address_has_prefix_flags_lifetime_and_our_tag() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::on_host(a, dir.path());
    let life = Lifetime::new(Duration::from_secs(30));
    let v4 = vip_on(&agent, Family::V4, "10.77.0.100", life);
    let v6 = vip_on(&agent, Family::V6, "fd00:77::100", life);
    assert_eq!(add(&agent, &v4), Applied::Done);
    assert_eq!(add(&agent, &v6), Applied::Done);

    let line = address_line(&a.ns, "eth0", "10.77.0.100").unwrap();
    assert!(line.contains("10.77.0.100/24"), "{line}");
    assert!(line.contains("secondary"), "{line}");
    assert!(line.contains("noprefixroute"), "{line}");
    assert!(matches!(valid_lft(&line), Some(28..=30)), "{line}");
    let line = address_line(&a.ns, "eth0", "fd00:77::100").unwrap();
    assert!(
        line.contains("fd00:77::100/64") && line.contains("nodad"),
        "{line}"
    );
    assert!(matches!(valid_lft(&line), Some(28..=30)), "{line}");

    // The tag alone identifies them: a fresh backend without the record
    // adopts both (the kernel here keeps IFA_PROTO).
    std::fs::remove_file(dir.path().join("addresses.json")).unwrap();
    drop(agent);
    let again = Agent::on_host(a, dir.path());
    assert_eq!(
        adopt(&again),
        BTreeSet::from([ip("10.77.0.100"), ip("fd00:77::100")])
    );

    // Adding the same VIP again only renews it: still one address.
    assert_eq!(add(&again, &v4), Applied::Done);
    let out = a.ns.ip("addr show dev eth0").unwrap();
    assert_eq!(out.matches("10.77.0.100/").count(), 1, "{out}");

    // Removing is idempotent.
    assert_eq!(remove(&again, &v4), Applied::Done);
    assert_eq!(remove(&again, &v4), Applied::Done);
    assert_eq!(address_line(&a.ns, "eth0", "10.77.0.100"), None);
    assert!(
        address_line(&a.ns, "eth0", &a.ipv4.to_string()).is_some(),
        "the host's own address stays"
    );
}

/// An IPv6 add is done only once the kernel answers solicitations for
/// the address: it joins the address's solicited-node group from a
/// workqueue after the netlink add returns, and a node that announced the
/// VIP before then would let the node handing it over go while nobody
/// answered. Checked right as the adds return, one address and a batch of
/// 200 (the workqueue takes them one by one), in the backend's own thread.
#[test]
fn an_ipv6_add_returns_once_the_kernel_answers_for_the_address() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::on_host(a, dir.path());
    let life = Lifetime::new(Duration::from_secs(30));
    let one = vip_on(&agent, Family::V6, "fd00:77::2:1", life);
    let batch: Vec<VipAddress> = (0..200)
        .map(|i| vip_on(&agent, Family::V6, &format!("fd00:77::3:{i:x}"), life))
        .collect();
    // The solicited-node group of each, as `/proc/net/igmp6` writes it.
    let group = |v: &VipAddress| match v.ip {
        IpAddr::V6(ip) => {
            let o = ip.octets();
            format!(
                "ff0200000000000000000001ff{:02x}{:02x}{:02x}",
                o[13], o[14], o[15]
            )
        }
        IpAddr::V4(_) => unreachable!(),
    };
    let (one_group, groups): (String, Vec<String>) =
        (group(&one), batch.iter().map(group).collect());
    let (single, many) = agent.with(move |b| async move {
        let listened = || std::fs::read_to_string("/proc/thread-self/net/igmp6").unwrap();
        b.add(&one).await.unwrap();
        let single = listened();
        let results = b.add_many(&batch).await;
        assert!(results.iter().all(|r| matches!(r, Ok(Applied::Done))));
        (single, listened())
    });
    assert!(
        single.contains(&one_group),
        "{one_group} not joined yet:\n{single}"
    );
    let missing: Vec<&String> = groups
        .iter()
        .filter(|g| !many.contains(g.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "not joined yet when the batch returned: {missing:?}"
    );
}

#[test]
fn renewal_restores_the_lifetime_and_an_unrenewed_address_expires() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::on_host(a, dir.path());
    let life = Lifetime::new(Duration::from_secs(3));
    let vips = [
        vip_on(&agent, Family::V4, "10.77.0.100", life),
        vip_on(&agent, Family::V6, "fd00:77::100", life),
    ];
    let (tx, rx) = std::sync::mpsc::channel();
    // Subscribed first, so the expiry below is seen as an event.
    agent.with(move |b| async move {
        let mut events = b.subscribe().await.unwrap();
        tokio::task::spawn_local(async move {
            while let Some(e) = events.recv().await {
                let _ = tx.send(e);
            }
        });
    });
    for v in &vips {
        assert_eq!(add(&agent, v), Applied::Done);
    }
    std::thread::sleep(Duration::from_millis(2100));
    for v in &vips {
        let text = v.ip.to_string();
        let before = valid_lft(&address_line(&a.ns, "eth0", &text).unwrap()).unwrap();
        assert!(before <= 1, "{text}: {before} s left after 2.1 s of 3");
        assert_eq!(add(&agent, v), Applied::Done);
        let after = valid_lft(&address_line(&a.ns, "eth0", &text).unwrap()).unwrap();
        assert!(after >= 2, "{text}: renewal set {after} s, want 3");
    }

    // No more renewals: the kernel drops both within about the lifetime,
    // and the event stream reports each as ours and removed.
    let renewed = Instant::now();
    for v in &vips {
        let text = v.ip.to_string();
        wait_for(&format!("{text} to expire"), 6 * SECOND, || {
            address_line(&a.ns, "eth0", &text).is_none().then_some(())
        })
        .unwrap();
    }
    let took = renewed.elapsed();
    assert!(
        took >= Duration::from_millis(1900),
        "expired after {took:?}, before its lifetime"
    );
    let mut removed = BTreeSet::new();
    while removed.len() < 2 {
        match rx
            .recv_timeout(2 * SECOND)
            .expect("an AddressRemoved event per VIP")
        {
            KernelEvent::AddressRemoved(o) => {
                removed.insert(o.ip);
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(removed, BTreeSet::from([vips[0].ip, vips[1].ip]));
    assert!(address_line(&a.ns, "eth0", &a.ipv4.to_string()).is_some());
}

#[test]
fn an_address_the_agent_did_not_add_is_never_touched() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::on_host(a, dir.path());
    // By hand, equal to VIPs the agent is about to be given.
    a.ns.ip("addr add 10.77.0.100/24 dev eth0").unwrap();
    a.ns.ip("-6 addr add fd00:77::100/64 dev eth0 nodad")
        .unwrap();
    let life = Lifetime::new(Duration::from_secs(30));
    for (family, addr) in [(Family::V4, "10.77.0.100"), (Family::V6, "fd00:77::100")] {
        let vip = vip_on(&agent, family, addr, life);
        let before = address_line(&a.ns, "eth0", addr).unwrap();
        assert_eq!(add(&agent, &vip), Applied::NotOurs);
        assert_eq!(remove(&agent, &vip), Applied::NotOurs);
        let after = address_line(&a.ns, "eth0", addr).expect("still there");
        assert_eq!(
            after, before,
            "unchanged: no lifetime, flags or tag of ours"
        );
        assert!(after.contains("valid_lft forever"), "{after}");
    }
    assert_eq!(adopt(&agent), BTreeSet::new());

    // Ours once, then deleted and re-added by hand: now it is someone
    // else's, and the kernel's missing tag says so despite the record.
    let vip = vip_on(&agent, Family::V4, "10.77.0.101", life);
    assert_eq!(add(&agent, &vip), Applied::Done);
    a.ns.ip("addr del 10.77.0.101/24 dev eth0").unwrap();
    a.ns.ip("addr add 10.77.0.101/24 dev eth0").unwrap();
    assert_eq!(remove(&agent, &vip), Applied::NotOurs);
    assert!(address_line(&a.ns, "eth0", "10.77.0.101").is_some());
    // The host's own addresses survive adopt and everything above.
    assert!(address_line(&a.ns, "eth0", &a.ipv4.to_string()).is_some());
    assert!(address_line(&a.ns, "eth0", &a.ipv6.to_string()).is_some());
}

/// The batch calls: 300 VIPs of both families added in one call, each with
/// our tag and lifetime, one record listing them all; a hand-added one in
/// the batch is left alone; a second call renews; one removal call takes
/// ours away and leaves the hand-added one and the host's own addresses.
#[test]
fn batches_add_renew_and_remove_many_and_leave_others_alone() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::on_host(a, dir.path());
    a.ns.ip("addr add 10.77.0.50/24 dev eth0").unwrap();
    let life = Lifetime::new(Duration::from_secs(30));
    let mut vips: Vec<VipAddress> = (0..250)
        .map(|i| vip_on(&agent, Family::V4, &format!("10.77.0.{}", i + 2), life))
        .filter(|v| v.ip != ip(&a.ipv4.to_string()))
        .collect();
    vips.extend((0..50).map(|i| vip_on(&agent, Family::V6, &format!("fd00:77::1:{i:x}"), life)));
    let hand_added = ip("10.77.0.50");
    let batch = vips.clone();
    let results = agent.with(move |b| async move { b.add_many(&batch).await });
    assert_eq!(results.len(), vips.len());
    for (v, r) in vips.iter().zip(&results) {
        let want = if v.ip == hand_added {
            Applied::NotOurs
        } else {
            Applied::Done
        };
        assert_eq!(r.as_ref().ok(), Some(&want), "{}", v.ip);
    }
    for v in vips.iter().filter(|v| v.ip != hand_added) {
        let line = address_line(&a.ns, "eth0", &v.ip.to_string()).expect("added");
        assert!(valid_lft(&line).is_some_and(|s| s <= 30), "{line}");
    }
    let hand = address_line(&a.ns, "eth0", "10.77.0.50").unwrap();
    assert!(hand.contains("forever"), "the hand-added one: {hand}");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("addresses.json")).unwrap())
            .unwrap();
    assert_eq!(
        record["addresses"].as_array().unwrap().len(),
        vips.len() - 1,
        "one record with every address the batch added"
    );
    // The kernel's tag alone identifies them too: a fresh backend without
    // the record adopts exactly the batch, not the hand-added address.
    std::fs::remove_file(dir.path().join("addresses.json")).unwrap();
    drop(agent);
    let agent = Agent::on_host(a, dir.path());
    let want: BTreeSet<_> = vips
        .iter()
        .map(|v| v.ip)
        .filter(|ip| *ip != hand_added)
        .collect();
    assert_eq!(adopt(&agent), want);

    // A renewal is another batch: lifetimes start over, nothing else moves.
    std::thread::sleep(Duration::from_secs(2));
    let batch = vips.clone();
    let renewed = agent.with(move |b| async move { b.add_many(&batch).await });
    assert!(renewed.iter().all(|r| r.is_ok()));
    let line = address_line(&a.ns, "eth0", &vips[0].ip.to_string()).unwrap();
    assert!(valid_lft(&line).is_some_and(|s| s >= 29), "renewed: {line}");

    let batch = vips.clone();
    let removed = agent.with(move |b| async move { b.remove_many(&batch).await });
    for (v, r) in vips.iter().zip(&removed) {
        let want = if v.ip == hand_added {
            Applied::NotOurs
        } else {
            Applied::Done
        };
        assert_eq!(r.as_ref().ok(), Some(&want), "{}", v.ip);
    }
    for v in vips.iter().filter(|v| v.ip != hand_added) {
        assert!(
            address_line(&a.ns, "eth0", &v.ip.to_string()).is_none(),
            "{} removed",
            v.ip
        );
    }
    assert_eq!(address_line(&a.ns, "eth0", "10.77.0.50"), Some(hand));
    assert!(address_line(&a.ns, "eth0", &a.ipv4.to_string()).is_some());
    assert!(address_line(&a.ns, "eth0", &a.ipv6.to_string()).is_some());
    assert_eq!(adopt(&agent), BTreeSet::new());
    // The record catches up after the removal's results came back.
    wait_for("the record to list nothing", 2 * SECOND, || {
        let text = std::fs::read_to_string(dir.path().join("addresses.json")).ok()?;
        let record: serde_json::Value = serde_json::from_str(&text).ok()?;
        (record["addresses"] == serde_json::json!([])).then_some(())
    })
    .unwrap();
}

#[test]
fn adopt_returns_exactly_what_a_previous_run_left() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let dir = tempfile::tempdir().unwrap();
    let previous = Agent::on_host(a, dir.path());
    for (family, addr) in [(Family::V4, "10.77.0.101"), (Family::V6, "fd00:77::101")] {
        let vip = vip_on(&previous, family, addr, Lifetime::FOREVER);
        assert_eq!(add(&previous, &vip), Applied::Done);
    }
    // The previous run dies without cleaning up; someone adds an address.
    drop(previous);
    a.ns.ip("addr add 10.77.0.102/24 dev eth0").unwrap();

    let agent = Agent::on_host(a, dir.path());
    let adopted = agent.with(|b| async move { b.adopt().await.unwrap() });
    let eth0 = a.ns.ip("-o link show dev eth0").unwrap();
    let ifindex: u32 = eth0.split(':').next().unwrap().parse().unwrap();
    assert_eq!(
        adopted,
        vec![
            OwnedAddress {
                interface: "eth0".into(),
                ifindex,
                ip: ip("10.77.0.101"),
                prefix_len: 24
            },
            OwnedAddress {
                interface: "eth0".into(),
                ifindex,
                ip: ip("fd00:77::101"),
                prefix_len: 64
            },
        ]
    );
    let owned = agent.with(|b| async move { b.owned().await.unwrap() });
    assert_eq!(owned, adopted);

    // The caller decides to let them go: both leave, the hand-made one stays,
    // and the record is empty.
    for o in adopted {
        let vip = VipAddress {
            interface: o.interface,
            ifindex: o.ifindex,
            ip: o.ip,
            prefix_len: o.prefix_len,
            lifetime: Lifetime::FOREVER,
        };
        assert_eq!(remove(&agent, &vip), Applied::Done);
        assert_eq!(address_line(&a.ns, "eth0", &o.ip.to_string()), None);
    }
    assert!(address_line(&a.ns, "eth0", "10.77.0.102").is_some());
    let record = std::fs::read_to_string(dir.path().join("addresses.json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(record["addresses"], serde_json::json!([]));
}

#[test]
fn without_ifa_proto_the_record_alone_identifies_our_addresses() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let dir = tempfile::tempdir().unwrap();
    // As on a RHEL 8/9 kernel: no tag is sent or trusted.
    let life = Lifetime::new(Duration::from_secs(30));
    let old_kernel = || NetlinkConfig {
        ifa_proto: false,
        address_lifetime: life,
        ..NetlinkConfig::for_test(dir.path())
    };
    let previous = Agent::start(&a.ns, old_kernel());
    let vip = vip_on(&previous, Family::V4, "10.77.0.101", life);
    assert_eq!(add(&previous, &vip), Applied::Done);
    drop(previous);
    a.ns.ip("addr add 10.77.0.102/24 dev eth0").unwrap();

    let record = std::fs::read_to_string(dir.path().join("addresses.json")).unwrap();
    assert!(record.contains("10.77.0.101"), "{record}");
    let agent = Agent::start(&a.ns, old_kernel());
    assert_eq!(adopt(&agent), BTreeSet::from([ip("10.77.0.101")]));
    drop(agent);

    // Without the record nothing is ours, so nothing is touched.
    std::fs::remove_file(dir.path().join("addresses.json")).unwrap();
    let agent = Agent::start(&a.ns, old_kernel());
    assert_eq!(adopt(&agent), BTreeSet::new());
    assert_eq!(remove(&agent, &vip), Applied::NotOurs);
    assert!(address_line(&a.ns, "eth0", "10.77.0.101").is_some());
}

/// The files in `dir` whose names start with `addresses.json.bad-`.
fn set_aside_records(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("addresses.json.bad-"))
        .collect()
}

#[test]
fn an_unusable_record_is_set_aside_and_the_kernel_evidence_still_finds_ours() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let life = Lifetime::new(Duration::from_secs(30));
    // With tags; and as on a kernel that drops them, where the lifetime and
    // flags of our addresses are the evidence.
    for ifa_proto in [true, false] {
        for bad in [
            "{\"version\": 1, \"addre",
            r#"{"version": 9, "addresses": []}"#,
        ] {
            let dir = tempfile::tempdir().unwrap();
            let config = || NetlinkConfig {
                ifa_proto,
                address_lifetime: life,
                ..NetlinkConfig::for_test(dir.path())
            };
            let previous = Agent::start(&a.ns, config());
            let vip = vip_on(&previous, Family::V4, "10.77.0.101", life);
            assert_eq!(add(&previous, &vip), Applied::Done);
            drop(previous);
            // Added by hand: permanent, and one with our lifetime but its
            // prefix route.
            a.ns.ip("addr add 10.77.0.102/24 dev eth0").unwrap();
            a.ns.ip("addr add 10.77.0.103/24 dev eth0 valid_lft 20 preferred_lft 20")
                .unwrap();
            std::fs::write(dir.path().join("addresses.json"), bad).unwrap();

            let agent = Agent::start(&a.ns, config());
            let aside = set_aside_records(dir.path());
            assert_eq!(aside.len(), 1, "{aside:?}");
            assert_eq!(
                std::fs::read_to_string(dir.path().join(&aside[0])).unwrap(),
                bad
            );
            assert_eq!(
                adopt(&agent),
                BTreeSet::from([ip("10.77.0.101")]),
                "ifa_proto = {ifa_proto}, record {bad:?}"
            );
            // A fresh record, and only ours leaves.
            let record = std::fs::read_to_string(dir.path().join("addresses.json")).unwrap();
            assert!(record.contains("10.77.0.101"), "{record}");
            assert_eq!(remove(&agent, &vip), Applied::Done);
            for theirs in ["10.77.0.102", "10.77.0.103"] {
                let vip = VipAddress {
                    ip: ip(theirs),
                    ..vip.clone()
                };
                assert_eq!(remove(&agent, &vip), Applied::NotOurs, "{theirs}");
                assert!(address_line(&a.ns, "eth0", theirs).is_some(), "{theirs}");
            }
            drop(agent);
            a.ns.ip("addr del 10.77.0.102/24 dev eth0").unwrap();
            a.ns.ip("addr del 10.77.0.103/24 dev eth0").unwrap();
        }
    }
}

#[test]
fn our_address_removed_by_hand_is_an_event_and_can_be_added_again() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::on_host(a, dir.path());
    let (tx, rx) = std::sync::mpsc::channel();
    agent.with(move |b| async move {
        let mut events = b.subscribe().await.unwrap();
        tokio::task::spawn_local(async move {
            while let Some(e) = events.recv().await {
                let _ = tx.send(e);
            }
        });
    });
    let v4 = vip_on(&agent, Family::V4, "10.77.0.100", Lifetime::FOREVER);
    let v6 = vip_on(&agent, Family::V6, "fd00:77::100", Lifetime::FOREVER);
    add(&agent, &v4);
    add(&agent, &v6);
    // Not ours: no event but a change of the links to read.
    a.ns.ip("addr add 10.77.0.50/24 dev eth0").unwrap();
    a.ns.ip("addr del 10.77.0.50/24 dev eth0").unwrap();

    a.ns.ip("addr del 10.77.0.100/24 dev eth0").unwrap();
    let event = address_event(&rx, 2 * SECOND).expect("an event");
    let KernelEvent::AddressRemoved(o) = event else {
        panic!("unexpected {event:?}")
    };
    assert_eq!(
        (o.ip, o.prefix_len, o.interface.as_str()),
        (v4.ip, 24, "eth0")
    );
    a.ns.ip("-6 addr del fd00:77::100/64 dev eth0").unwrap();
    assert!(matches!(
        address_event(&rx, 2 * SECOND).expect("an event"),
        KernelEvent::AddressRemoved(o) if o.ip == v6.ip
    ));

    // Put back, as the reconcile loop would.
    assert_eq!(add(&agent, &v4), Applied::Done);
    assert_eq!(add(&agent, &v6), Applied::Done);
    assert!(address_line(&a.ns, "eth0", "10.77.0.100").is_some());
    assert!(address_line(&a.ns, "eth0", "fd00:77::100").is_some());

    // The agent's own removals are not reported.
    assert_eq!(remove(&agent, &v4), Applied::Done);
    assert_eq!(remove(&agent, &v6), Applied::Done);
    std::thread::sleep(Duration::from_millis(300));

    // Carrier: pull the cable at the switch, plug it back.
    lan.set_port("a", false).unwrap();
    let event = address_event(&rx, 2 * SECOND).expect("carrier lost");
    assert!(
        matches!(&event, KernelEvent::CarrierLost { interface, .. } if interface == "eth0"),
        "{event:?}"
    );
    lan.set_port("a", true).unwrap();
    let event = address_event(&rx, 2 * SECOND).expect("carrier regained");
    assert!(
        matches!(&event, KernelEvent::CarrierRegained { interface, .. } if interface == "eth0"),
        "{event:?}"
    );
    let eth0 = agent.with(|b| async move { b.interface("eth0").await.unwrap() });
    assert!(eth0.carrier);
    assert_eq!(
        address_event(&rx, Duration::ZERO),
        None,
        "nothing else was reported"
    );
}

/// `v0` lost its carrier (its peer `v1` went down), in a [`SmallBuffer`].
fn v0_lost_carrier(e: &KernelEvent) -> bool {
    matches!(e, KernelEvent::CarrierLost { interface, .. } if interface == "v0")
}

/// A namespace with `br0` up (and, with `veth`, the pair `v0`/`v1` up)
/// and a backend whose event socket holds only 4 kB, so that a burst of
/// notifications nobody reads overflows it. The agent goes first, the
/// namespace last.
struct SmallBuffer {
    agent: Agent,
    dir: tempfile::TempDir,
    ns: Netns,
}

impl SmallBuffer {
    fn new(role: &str, veth: bool) -> SmallBuffer {
        let ns = Netns::new(role).unwrap();
        ns.ip("link add br0 type bridge").unwrap();
        ns.ip("link set br0 up").unwrap();
        if veth {
            ns.ip("link add v0 type veth peer name v1").unwrap();
            ns.ip("link set v0 up").unwrap();
            ns.ip("link set v1 up").unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let agent = Agent::start(
            &ns,
            NetlinkConfig {
                event_buffer_bytes: 4096,
                ..NetlinkConfig::for_test(dir.path())
            },
        );
        SmallBuffer { agent, dir, ns }
    }
}

#[test]
fn lost_kernel_events_ask_for_a_resync() {
    require_root();
    let bed = SmallBuffer::new("overrun", false);
    let batch = bed.dir.path().join("batch");
    std::fs::write(&batch, host_addresses_come_and_go("10.88", "br0", 1000)).unwrap();
    let events = events_through_a_burst(&bed.agent, batch);
    assert_eq!(
        events.last(),
        Some(&KernelEvent::Resync),
        "a Resync event after the event buffer overflowed: {events:?}"
    );
}

/// The kernel drops new-address notifications before they reach the event
/// socket (a socket filter): the agent acts on none, and a holder's
/// renewals (1,000 VIPs: 200 a second) would wake and fill it for
/// nothing. A burst of 1,000 additions that would overflow a 4 kB buffer
/// leaves it empty, and a carrier loss after them arrives as itself, not
/// as a resync.
#[test]
fn new_address_notifications_never_reach_the_agent() {
    require_root();
    let bed = SmallBuffer::new("newaddr-filter", true);
    let batch = bed.dir.path().join("batch");
    let mut lines = host_addresses("10.88", "br0", 1000);
    lines.push_str("link set v1 down\n");
    std::fs::write(&batch, lines).unwrap();
    let events = events_through_a_burst_until(&bed.agent, batch, v0_lost_carrier);
    assert!(
        !events.contains(&KernelEvent::Resync),
        "1,000 additions overflowed the event buffer: {events:?}"
    );
    assert!(
        events.iter().any(v0_lost_carrier),
        "v0's carrier loss: {events:?}"
    );
}

/// Route changes reach the agent as one `LinksChanged` (it reads the links
/// on it) when a read could show them: a route of the main table, a link's
/// new MAC. 1,000 addresses' `local` routes and 200 routes of another
/// table, nobody reading, cost no resync: routes come on a socket of their
/// own, whose filter drops those (`the_route_filter_keeps_what_a_read_of_the_links_shows`
/// checks it in the kernel) and whose overflow would only ask for a read.
#[test]
fn main_table_routes_reach_the_agent_and_local_and_other_tables_do_not() {
    require_root();
    let bed = SmallBuffer::new("route-filter", true);
    let batch = bed.dir.path().join("batch");
    let mut lines = host_addresses("10.88", "br0", 1000);
    for i in 0..200 {
        lines.push_str(&format!("route add 10.66.{i}.0/24 dev v0 table 100\n"));
    }
    lines.push_str("route add 10.67.0.0/24 dev v0\n");
    std::fs::write(&batch, lines).unwrap();
    let events = events_through_a_burst_until(&bed.agent, batch, |e| {
        matches!(e, KernelEvent::LinksChanged | KernelEvent::Resync)
    });
    assert_eq!(
        events,
        vec![KernelEvent::LinksChanged],
        "the main table's new route, and no resync"
    );

    let events = subscribe(&bed.agent);
    bed.ns.ip("link set v0 address 02:00:00:00:66:01").unwrap();
    assert_eq!(
        events.recv_timeout(Duration::from_secs(5)),
        Ok(KernelEvent::LinksChanged),
        "a new MAC"
    );
}

#[test]
fn virtual_interface_falls_back_to_an_existing_bridge_and_holds_host_addresses() {
    require_root();
    let ns = Netns::new("virtual").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&ns, NetlinkConfig::for_test(dir.path()));

    let first = agent.with(|b| async move { b.ensure_virtual_interface("kube-lb0").await });
    match first {
        // This kernel has the dummy driver: the link was created.
        Ok(lb) => {
            let details = ns.ip("-d link show dev kube-lb0").unwrap();
            assert!(details.contains("dummy"), "{details}");
            assert_eq!(lb.name, "kube-lb0");
            ns.ip("link del kube-lb0").unwrap();
        }
        Err(err) => {
            assert!(matches!(err, Error::VirtualInterface { .. }), "{err}");
            let msg = err.to_string();
            assert!(msg.contains("ip link add kube-lb0 type bridge"), "{msg}");
            assert!(msg.contains("virtual_interface = \"\""), "{msg}");
        }
    }

    // Pre-created and left down by the operator: used and brought up.
    ns.ip("link add kube-lb0 type bridge").unwrap();
    let lb = agent.with(|b| async move { b.ensure_virtual_interface("kube-lb0").await.unwrap() });
    assert_eq!(lb.name, "kube-lb0");
    let link = ns.ip("link show dev kube-lb0").unwrap();
    assert!(link.contains(",UP"), "{link}");

    let life = Lifetime::new(Duration::from_secs(30));
    let v4 = lb.host_vip(ip("10.99.0.5"), life);
    let v6 = lb.host_vip(ip("fd00:99::5"), life);
    assert_eq!((v4.prefix_len, v6.prefix_len), (32, 128));
    assert_eq!(add(&agent, &v4), Applied::Done);
    assert_eq!(add(&agent, &v6), Applied::Done);
    assert!(
        address_line(&ns, "kube-lb0", "10.99.0.5")
            .unwrap()
            .contains("10.99.0.5/32")
    );
    assert!(
        address_line(&ns, "kube-lb0", "fd00:99::5")
            .unwrap()
            .contains("fd00:99::5/128")
    );
    assert_eq!(adopt(&agent), BTreeSet::from([v4.ip, v6.ip]));
}

/// Kernel events of `agent`'s backend from now on, on a channel.
fn subscribe(agent: &Agent) -> std::sync::mpsc::Receiver<KernelEvent> {
    let (tx, rx) = std::sync::mpsc::channel();
    agent.with(move |b| async move {
        let mut events = b.subscribe().await.unwrap();
        tokio::task::spawn_local(async move {
            while let Some(e) = events.recv().await {
                let _ = tx.send(e);
            }
        });
    });
    rx
}

/// The next event within `within` that is not `LinksChanged` (which any
/// address of someone else's that goes, or route, brings); with no time
/// at all, one already waiting.
fn address_event(
    rx: &std::sync::mpsc::Receiver<KernelEvent>,
    within: Duration,
) -> Option<KernelEvent> {
    let until = std::time::Instant::now() + within;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(KernelEvent::LinksChanged) => continue,
            Ok(event) => return Some(event),
            Err(_) => return None,
        }
    }
}

/// The addresses in `ns` carrying our tag, as a fresh backend with no
/// record sees them (`ip` of this distribution does not print the tag).
fn tagged(ns: &Netns) -> BTreeSet<IpAddr> {
    let dir = tempfile::tempdir().unwrap();
    let fresh = Agent::start(ns, NetlinkConfig::for_test(dir.path()));
    fresh.with(|b| async move { b.owned().await.unwrap().into_iter().map(|o| o.ip).collect() })
}

fn sysctl(ns: &Netns, key: &str) -> String {
    ns.run(&["sysctl", "-n", key]).unwrap().trim().to_string()
}

#[test]
fn an_address_that_expired_and_was_re_added_by_hand_is_not_claimed_after_a_restart() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    // No IPv6, so the kernel tags none of its own addresses: that must not
    // make the agent doubt that this kernel keeps tags.
    for conf in ["all", "default", "lo", "eth0"] {
        a.ns.sysctl(&format!("net.ipv6.conf.{conf}.disable_ipv6"), "1")
            .unwrap();
    }
    let life = Lifetime::new(Duration::from_secs(2));
    // With tags, and as on a kernel that drops them.
    for ifa_proto in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let config = || NetlinkConfig {
            ifa_proto,
            address_lifetime: life,
            ..NetlinkConfig::for_test(dir.path())
        };
        let previous = Agent::start(&a.ns, config());
        let permanent = vip_on(&previous, Family::V4, "10.77.0.101", life);
        let longer = vip_on(&previous, Family::V4, "10.77.0.102", life);
        assert_eq!(add(&previous, &permanent), Applied::Done);
        assert_eq!(add(&previous, &longer), Applied::Done);
        // The agent dies; its record stays; its addresses expire.
        drop(previous);
        for ip in ["10.77.0.101", "10.77.0.102"] {
            wait_for(&format!("{ip} to expire"), 5 * SECOND, || {
                address_line(&a.ns, "eth0", ip).is_none().then_some(())
            })
            .unwrap();
        }
        // Someone puts the IPs back by hand: one permanent, one with a
        // lifetime longer than the agent's.
        a.ns.ip("addr add 10.77.0.101/24 dev eth0").unwrap();
        a.ns.ip("addr add 10.77.0.102/24 dev eth0 valid_lft 100 preferred_lft 100")
            .unwrap();
        let record = std::fs::read_to_string(dir.path().join("addresses.json")).unwrap();
        assert!(record.contains("10.77.0.101"), "{record}");

        let agent = Agent::start(&a.ns, config());
        assert_eq!(adopt(&agent), BTreeSet::new(), "ifa_proto = {ifa_proto}");
        for vip in [&permanent, &longer] {
            assert_eq!(remove(&agent, vip), Applied::NotOurs, "{}", vip.ip);
            assert_eq!(add(&agent, vip), Applied::NotOurs, "{}", vip.ip);
        }
        // Untouched: neither removed nor given the agent's lifetime.
        assert!(
            address_line(&a.ns, "eth0", "10.77.0.101")
                .unwrap()
                .contains("valid_lft forever")
        );
        assert!(matches!(
            valid_lft(&address_line(&a.ns, "eth0", "10.77.0.102").unwrap()),
            Some(90..=100)
        ));
        drop(agent);
        a.ns.ip("addr del 10.77.0.101/24 dev eth0").unwrap();
        a.ns.ip("addr del 10.77.0.102/24 dev eth0").unwrap();
    }
}

#[test]
fn after_our_address_is_removed_one_re_added_by_hand_is_not_ours() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    // With tags; and without, with lifetime forever, where the record is all
    // the agent has.
    for (ifa_proto, life) in [
        (true, Lifetime::new(Duration::from_secs(30))),
        (false, Lifetime::FOREVER),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let agent = Agent::start(
            &a.ns,
            NetlinkConfig {
                ifa_proto,
                address_lifetime: life,
                ..NetlinkConfig::for_test(dir.path())
            },
        );
        let rx = subscribe(&agent);
        let vip = vip_on(&agent, Family::V4, "10.77.0.100", life);
        assert_eq!(add(&agent, &vip), Applied::Done);
        assert_eq!(add(&agent, &vip), Applied::Done, "renewed");

        a.ns.ip("addr del 10.77.0.100/24 dev eth0").unwrap();
        let event = address_event(&rx, 2 * SECOND).expect("an event");
        assert!(
            matches!(&event, KernelEvent::AddressRemoved(o) if o.ip == vip.ip),
            "{event:?}"
        );
        // Put back by hand before the agent does: someone else's now.
        a.ns.ip("addr add 10.77.0.100/24 dev eth0").unwrap();
        let before = address_line(&a.ns, "eth0", "10.77.0.100").unwrap();
        assert_eq!(
            add(&agent, &vip),
            Applied::NotOurs,
            "ifa_proto = {ifa_proto}"
        );
        assert_eq!(remove(&agent, &vip), Applied::NotOurs);
        assert_eq!(adopt(&agent), BTreeSet::new());
        let after = address_line(&a.ns, "eth0", "10.77.0.100").expect("left in place");
        assert_eq!(after, before);
        assert!(after.contains("valid_lft forever"), "{after}");
        // Not ours, so its removal is no event but a change of the links
        // to read.
        a.ns.ip("addr del 10.77.0.100/24 dev eth0").unwrap();
        assert_eq!(address_event(&rx, Duration::from_millis(200)), None);
    }
}

#[test]
fn renewing_a_held_address_does_not_read_every_address() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    // A host with thousands of addresses (on another link), which every
    // full `add` has to read.
    a.ns.ip("link add many type bridge").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let batch = dir.path().join("batch");
    std::fs::write(&batch, host_addresses("10.90", "many", 2000)).unwrap();
    a.ns.run(&["ip", "-batch", batch.to_str().unwrap()])
        .unwrap();

    let agent = Agent::on_host(a, &dir.path().join("run"));
    let vip = vip_on(
        &agent,
        Family::V4,
        "10.77.0.100",
        Lifetime::new(Duration::from_secs(30)),
    );
    assert_eq!(add(&agent, &vip), Applied::Done);
    let renew_all = |agent: &Agent| {
        let vip = vip.clone();
        agent.with(move |b| async move {
            let started = Instant::now();
            for _ in 0..30 {
                assert_eq!(b.add(&vip).await.unwrap(), Applied::Done);
            }
            started.elapsed()
        })
    };
    // Nobody watches for deletions: every renewal reads the kernel.
    let checked = renew_all(&agent);
    let _rx = subscribe(&agent);
    // The first renewal after subscribing reads the kernel once more.
    assert_eq!(add(&agent, &vip), Applied::Done);
    let fast = renew_all(&agent);
    eprintln!("30 renewals: {checked:?} reading the kernel, {fast:?} without");
    assert!(
        fast * 5 < checked,
        "renewals with a subscription took {fast:?}, without {checked:?}"
    );
    let line = address_line(&a.ns, "eth0", "10.77.0.100").unwrap();
    assert!(matches!(valid_lft(&line), Some(28..=30)), "{line}");
}

#[test]
fn a_renewal_racing_a_deletion_event_never_takes_over_an_address_added_by_hand() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let life = Lifetime::new(Duration::from_secs(30));
    // With tags, and as on a kernel that drops them.
    for ifa_proto in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let agent = Agent::start(
            &a.ns,
            NetlinkConfig {
                ifa_proto,
                address_lifetime: life,
                ..NetlinkConfig::for_test(dir.path())
            },
        );
        let _rx = subscribe(&agent);
        let vip = vip_on(&agent, Family::V4, "10.77.0.100", life);
        assert_eq!(add(&agent, &vip), Applied::Done);
        assert_eq!(
            add(&agent, &vip),
            Applied::Done,
            "held: the fast path is next"
        );
        let v = vip.clone();
        let renewed = agent.with(move |b| async move {
            // Deleted and put back by hand while this namespace's only
            // runtime thread is busy, so the deletion event is still queued
            // when the renewal starts.
            for cmd in [
                "addr del 10.77.0.100/24 dev eth0",
                "addr add 10.77.0.100/24 dev eth0",
            ] {
                let status = std::process::Command::new("ip")
                    .args(cmd.split(' '))
                    .status()
                    .unwrap();
                assert!(status.success(), "{cmd}");
            }
            b.add(&v).await.unwrap()
        });
        assert_eq!(renewed, Applied::NotOurs, "ifa_proto = {ifa_proto}");
        let line = address_line(&a.ns, "eth0", "10.77.0.100").expect("left in place");
        assert!(line.contains("valid_lft forever"), "{line}");
        assert!(!tagged(&a.ns).contains(&vip.ip), "no tag of ours: {line}");
        assert!(!line.contains("noprefixroute"), "{line}");
        let owned = agent.with(|b| async move { b.owned().await.unwrap() });
        assert!(owned.is_empty(), "{owned:?}");
        assert_eq!(remove(&agent, &vip), Applied::NotOurs);
        assert!(address_line(&a.ns, "eth0", "10.77.0.100").is_some());
        drop(agent);
        a.ns.ip("addr del 10.77.0.100/24 dev eth0").unwrap();
    }
}

/// The node holds only a /32, the subnet on-link by a route: a VIP in the
/// subnet becomes its primary address. `promote_secondaries` is off, as the
/// kernel's default.
fn only_a_host_address(ns: &Netns) {
    ns.ip("-4 addr flush dev eth0").unwrap();
    ns.ip("addr add 10.77.0.11/32 dev eth0").unwrap();
    ns.ip("route add 10.77.0.0/24 dev eth0 scope link").unwrap();
    ns.ip("route replace default via 10.77.0.1 dev eth0 onlink")
        .unwrap();
    for conf in ["all", "default", "eth0"] {
        ns.sysctl(&format!("net.ipv4.conf.{conf}.promote_secondaries"), "0")
            .unwrap();
    }
}

#[test]
fn removing_a_vip_that_became_primary_keeps_a_secondary_added_by_hand() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    only_a_host_address(&a.ns);
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::on_host(a, dir.path());
    let vip = vip_on(&agent, Family::V4, "10.77.0.100", Lifetime::FOREVER);
    assert_eq!(vip.prefix_len, 24);
    assert_eq!(add(&agent, &vip), Applied::Done);
    let line = address_line(&a.ns, "eth0", "10.77.0.100").unwrap();
    assert!(!line.contains("secondary"), "the VIP is primary: {line}");
    // Later expiry of a primary would take secondaries with it: turned on
    // as soon as the VIP became primary.
    assert_eq!(sysctl(&a.ns, "net.ipv4.conf.eth0.promote_secondaries"), "1");

    // Someone adds an address to that subnet, and someone turns the sysctl
    // off again.
    a.ns.ip("addr add 10.77.0.50/24 dev eth0").unwrap();
    let theirs = address_line(&a.ns, "eth0", "10.77.0.50").unwrap();
    assert!(theirs.contains("secondary"), "{theirs}");
    a.ns.sysctl("net.ipv4.conf.eth0.promote_secondaries", "0")
        .unwrap();

    assert_eq!(remove(&agent, &vip), Applied::Done);
    assert_eq!(address_line(&a.ns, "eth0", "10.77.0.100"), None);
    let left = address_line(&a.ns, "eth0", "10.77.0.50").expect("the hand-added address survives");
    assert!(
        !left.contains("secondary"),
        "the subnet's primary now: {left}"
    );
    assert!(left.contains("valid_lft forever"), "as it was: {left}");
    assert!(!tagged(&a.ns).contains(&ip("10.77.0.50")), "not made ours");
    // Removal leaves the sysctl as it found it.
    assert_eq!(sysctl(&a.ns, "net.ipv4.conf.eth0.promote_secondaries"), "0");
    assert!(address_line(&a.ns, "eth0", "10.77.0.11").is_some());
}

/// Makes `/proc/sys` read-only for the calling thread, as systemd's
/// `ProtectKernelTunables=yes` does for a service: a mount namespace of its
/// own, where `/proc/sys` is bind-mounted read-only over itself.
fn protect_kernel_tunables() {
    let check = |rc: i32, what: &str| {
        assert_eq!(rc, 0, "{what}: {}", std::io::Error::last_os_error());
    };
    // SAFETY: plain syscalls with NUL-terminated constant strings; they
    // change only this thread's mount namespace.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS), "unshare");
        let none = std::ptr::null();
        check(
            libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ),
            "making mounts private",
        );
        check(
            libc::mount(
                c"/proc/sys".as_ptr(),
                c"/proc/sys".as_ptr(),
                none,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ),
            "bind-mounting /proc/sys",
        );
        check(
            libc::mount(
                none,
                c"/proc/sys".as_ptr(),
                none,
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                std::ptr::null(),
            ),
            "remounting /proc/sys read-only",
        );
    }
}

#[test]
fn removing_a_primary_vip_keeps_every_other_address_whether_or_not_sysctls_are_writable() {
    require_root();
    for writable in [true, false] {
        let lan = Lan::new(&["a"]).unwrap();
        let a = lan.host("a");
        only_a_host_address(&a.ns);
        let dir = tempfile::tempdir().unwrap();
        let agent = Agent::on_host(a, dir.path());
        if !writable {
            let refused = agent.with(|_| async move {
                protect_kernel_tunables();
                std::fs::write("/proc/sys/net/ipv4/conf/eth0/promote_secondaries", "1\n")
                    .unwrap_err()
            });
            assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
        }
        let rx = subscribe(&agent);
        let life = Lifetime::new(Duration::from_secs(60));
        let first = vip_on(&agent, Family::V4, "10.77.0.100", life);
        let second = vip_on(&agent, Family::V4, "10.77.0.101", life);
        assert_eq!(add(&agent, &first), Applied::Done);
        assert_eq!(add(&agent, &second), Applied::Done);
        a.ns.ip("addr add 10.77.0.50/24 dev eth0").unwrap();
        let line = address_line(&a.ns, "eth0", "10.77.0.100").unwrap();
        assert!(!line.contains("secondary"), "the VIP is primary: {line}");
        assert_eq!(
            sysctl(&a.ns, "net.ipv4.conf.eth0.promote_secondaries"),
            if writable { "1" } else { "0" }
        );

        assert_eq!(
            remove(&agent, &first),
            Applied::Done,
            "writable: {writable}"
        );
        assert_eq!(address_line(&a.ns, "eth0", "10.77.0.100"), None);
        let theirs = address_line(&a.ns, "eth0", "10.77.0.50").expect("the hand-added address");
        assert!(theirs.contains("valid_lft forever"), "{theirs}");
        let ours = address_line(&a.ns, "eth0", "10.77.0.101").expect("the other VIP");
        assert_eq!(
            tagged(&a.ns),
            BTreeSet::from([second.ip]),
            "tags as they were"
        );
        assert!(matches!(valid_lft(&ours), Some(50..=60)), "{ours}");
        assert!(address_line(&a.ns, "eth0", "10.77.0.11").is_some());
        // Still ours, and its passing absence is no event.
        let owned = agent.with(|b| async move { b.owned().await.unwrap() });
        assert_eq!(
            owned.iter().map(|o| o.ip).collect::<Vec<_>>(),
            vec![second.ip]
        );
        std::thread::sleep(Duration::from_millis(200));
        // The primary's prefix route went and came back with the promoted
        // address: a change of links to read, but no address of ours gone.
        let events: Vec<_> = rx.try_iter().collect();
        assert!(
            events.iter().all(|e| *e == KernelEvent::LinksChanged),
            "{events:?}"
        );
        assert_eq!(add(&agent, &second), Applied::Done);
        assert_eq!(remove(&agent, &second), Applied::Done);
        assert!(address_line(&a.ns, "eth0", "10.77.0.50").is_some());
    }
}

#[test]
fn a_cancelled_remove_never_leaves_an_address_the_agent_forgot() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    // The VIP becomes the primary of its subnet, so that removing it waits on
    // more than the deletion (turning on promote_secondaries).
    a.ns.ip("-4 addr flush dev eth0").unwrap();
    a.ns.ip("addr add 10.77.0.11/32 dev eth0").unwrap();
    a.ns.ip("route add 10.77.0.0/24 dev eth0 scope link")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Without tags, where an address in the kernel that the agent forgot is
    // lost to it for good.
    let agent = Agent::start(
        &a.ns,
        NetlinkConfig {
            ifa_proto: false,
            address_lifetime: Lifetime::FOREVER,
            ..NetlinkConfig::for_test(dir.path())
        },
    );
    let _rx = subscribe(&agent);
    let eth0 = agent.with(|b| async move { b.interface("eth0").await.unwrap() });
    let vip = eth0.vip(ip("10.77.0.100"), Lifetime::FOREVER).unwrap();
    let mut completed = false;
    // Cancelled after 1, 2, ... polls: at every await point of `remove`. Its
    // last, the record write on a blocking thread, takes as many polls as
    // that thread needs; the last round lets it finish.
    for polls in (1..60).chain([usize::MAX]) {
        let _ = a.ns.ip("addr del 10.77.0.50/24 dev eth0");
        a.ns.sysctl("net.ipv4.conf.eth0.promote_secondaries", "0")
            .unwrap();
        assert_eq!(add(&agent, &vip), Applied::Done);
        a.ns.ip("addr add 10.77.0.50/24 dev eth0").unwrap();
        let v = vip.clone();
        let done = agent.with(move |b| async move {
            let mut removing = std::pin::pin!(b.remove(&v));
            for _ in 0..polls {
                if futures::poll!(removing.as_mut()).is_ready() {
                    return true;
                }
                tokio::task::yield_now().await;
            }
            false
        });
        // Let a deletion already sent reach the kernel and its event the
        // subscription.
        std::thread::sleep(Duration::from_millis(20));
        let owned = agent.with(|b| async move { b.owned().await.unwrap() });
        let present = address_line(&a.ns, "eth0", "10.77.0.100").is_some();
        assert_eq!(
            owned.iter().any(|o| o.ip == vip.ip),
            present,
            "after {polls} polls (completed: {done}): owned exactly while in the kernel"
        );
        assert!(address_line(&a.ns, "eth0", "10.77.0.50").is_some());
        if done {
            completed = true;
            break;
        }
    }
    assert!(completed, "remove completes with enough polls");
    // Whatever happened, removing again leaves nothing behind.
    assert_eq!(remove(&agent, &vip), Applied::Done);
    assert_eq!(address_line(&a.ns, "eth0", "10.77.0.100"), None);
    let record = std::fs::read_to_string(dir.path().join("addresses.json")).unwrap();
    assert!(!record.contains("10.77.0.100"), "{record}");
}

#[test]
fn a_carrier_change_among_lost_events_is_reported_before_the_resync() {
    require_root();
    let bed = SmallBuffer::new("overrun-carrier", true);
    // A burst that overflows the event buffer, then v0 loses carrier (its
    // peer goes down): that notification is lost with the rest.
    let batch = bed.dir.path().join("batch");
    let mut lines = host_addresses_come_and_go("10.88", "br0", 1000);
    lines.push_str("link set v1 down\n");
    std::fs::write(&batch, lines).unwrap();
    let events = events_through_a_burst(&bed.agent, batch);
    assert_eq!(events.last(), Some(&KernelEvent::Resync), "{events:?}");
    assert!(
        events.iter().any(v0_lost_carrier),
        "v0's carrier loss before the resync: {events:?}"
    );
}

/// Reads of the backend that overlap, on a link with thousands of
/// addresses while others come and go, all succeed. A netlink socket runs
/// one dump at a time, and a drain of 1,000 VIPs on a loaded host once
/// saw reads answered "Device or resource busy" (EBUSY); the backend now
/// asks again (`retrying`). This bed has not made the kernel turn a read
/// away; it holds the reads to succeeding under overlap and churn.
#[test]
fn reads_that_overlap_on_a_link_with_many_addresses_all_succeed() {
    require_root();
    let lan = Lan::new(&["a"]).unwrap();
    let a = lan.host("a");
    let dir = tempfile::tempdir().unwrap();
    let batch = dir.path().join("batch");
    std::fs::write(&batch, host_addresses("10.88", "eth0", 2000)).unwrap();
    a.ns.run(&["ip", "-batch", batch.to_str().unwrap()])
        .unwrap();
    let agent = Agent::on_host(a, dir.path());
    // Addresses come and go meanwhile, as in a drain.
    let churn = dir.path().join("churn");
    let adds = host_addresses("10.89", "eth0", 500);
    std::fs::write(
        &churn,
        format!("{adds}{}", adds.replace("addr add", "addr del")),
    )
    .unwrap();
    let churn = churn.to_str().unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let failures = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                a.ns.run(&["ip", "-batch", churn]).unwrap();
            }
        });
        let failures = agent.with(|b| async move {
            let mut failures = Vec::new();
            for _ in 0..20 {
                let reads = (0..4).map(|_| {
                    let b = b.clone();
                    async move {
                        let links = b.interfaces().await.err();
                        let owned = b.owned().await.err();
                        links.into_iter().chain(owned).map(|e| e.to_string())
                    }
                });
                failures.extend(futures::future::join_all(reads).await.into_iter().flatten());
            }
            failures
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        failures
    });
    assert!(failures.is_empty(), "{failures:?}");
}
