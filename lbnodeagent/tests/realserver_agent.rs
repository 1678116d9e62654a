//! `lbnodeagent run` against the real kube-apiserver (v1.28.0 with etcd and
//! RBAC), each agent running as the `hostlb-agent` ServiceAccount that
//! `deploy/agent/rbac.yaml` grants, never as admin. What the test server
//! cannot show: that the shipped RBAC allows every read and write the agent
//! makes (a 403 or a dropped Event fails the test), and how the agents live
//! through a real server going away and coming back.
//!
//! Needs root, arping, kubectl and the real server (`../shared/kube-apiserver`
//! with etcd-server). Without the server each test says it did not run;
//! under `CI=true` that is a failure.

mod cluster;

use std::time::{Duration, Instant};

use cluster::{Cluster, PROBE_EVERY, until_only};
use hostlb_tests::netns::wait_for;
use hostlb_tests::probe::ArpProbe;

const VIP: &str = "10.77.0.100";

/// Three agents on the real server; `node-a` is the preferred node.
fn three_nodes() -> Option<Cluster> {
    let mut c = Cluster::real(&["node-a", "node-b", "node-c"])?;
    c.kubectl(&["label", "node", "node-a", "tier=edge"]);
    c.pool_and_ad(
        &["10.77.0.100-10.77.0.120"],
        "preferredNodeSelectors: [{weight: 100, preference: {matchLabels: {tier: edge}}}]",
    );
    c.start_all();
    Some(c)
}

fn probe(c: &Cluster) -> ArpProbe {
    let client = c.host("client");
    ArpProbe::start(
        &client.ns,
        "eth0",
        &client.ipv4.to_string(),
        VIP,
        PROBE_EVERY,
    )
    .unwrap()
}

/// Service `web` on [`VIP`] (with `extra` in its spec), and a client's
/// probe of it once the preferred node holds it and alone answers.
fn served_by_node_a(c: &Cluster, extra: &str) -> ArpProbe {
    let probe = probe(c);
    c.service("web", &[VIP], &["node-a", "node-b", "node-c"], extra);
    assert_eq!(c.wait_single_holder(VIP, Duration::from_secs(30)), "node-a");
    until_only(
        &probe,
        c.host("node-a").mac(),
        Instant::now(),
        Duration::from_secs(5),
    );
    probe
}

/// Waits until the last move `node`'s record shows is `want` (`ADDRESS
/// FROM CAUSE`).
fn wait_last_move(c: &Cluster, node: &str, want: &str) {
    let last = || {
        c.record(
            node,
            "{range .status.recentMoves[*]}{.address} {.from} {.cause}{\"\\n\"}{end}",
        )
        .lines()
        .last()
        .map(str::to_string)
    };
    wait_for(
        &format!("{node}'s record to show the move {want}"),
        Duration::from_secs(15),
        || (last().as_deref() == Some(want)).then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}: its last move is {:?}", last()));
}

/// The Events of namespace `default` in events.k8s.io, as `jsonpath` prints
/// them.
fn events(c: &Cluster, jsonpath: &str) -> String {
    c.kubectl(&[
        "get",
        "events.events.k8s.io",
        "-n",
        "default",
        "-o",
        jsonpath,
    ])
}

fn ready(c: &Cluster, node: &str) -> bool {
    c.http_get(node, "/readyz").0 == "200"
}

fn assert_nothing_refused(c: &Cluster) {
    let refused = c.refusals();
    assert!(
        refused.is_empty(),
        "the API refused the agents, or they dropped what they meant to say:\n{}",
        refused.join("\n")
    );
}

/// A Service is announced by the preferred node, with its annotation and
/// its Events (in events.k8s.io, as the ServiceAccount may write them);
/// the owner killed (with `cleanup`) and stopped (SIGTERM) hand over.
#[test]
fn the_shipped_rbac_lets_the_agent_announce_and_hand_over() {
    let Some(mut c) = three_nodes() else { return };
    let probe = served_by_node_a(&c, "");
    wait_for("the announcing annotation", Duration::from_secs(15), || {
        (c.annotation("web", "hostlb.io/announcing-IPv4") == "node-a,eth0").then_some(())
    })
    .unwrap();
    wait_for("the AnnouncingLocal Event", Duration::from_secs(15), || {
        let events = events(&c, "jsonpath={range .items[*]}{.reason} {.regarding.name} {.reportingController}{\"\\n\"}{end}");
        events
            .lines()
            .any(|l| l.starts_with("AnnouncingLocal web "))
            .then_some(())
    })
    .unwrap();

    // Each agent's record, written as the ServiceAccount: ready, with the
    // MACs that let agents recognise each other without gossip.
    let records = |c: &Cluster| {
        c.kubectl(&[
            "get",
            "nodeagents",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.state} {.status.macs[0]}{\"\\n\"}{end}",
        ])
    };
    wait_for("every agent's record", Duration::from_secs(15), || {
        let out = records(&c);
        ["node-a", "node-b", "node-c"]
            .iter()
            .all(|n| {
                out.lines()
                    .any(|l| l == format!("{n} Ready {}", c.host(n).mac()))
            })
            .then_some(())
    })
    .unwrap();

    let t = Instant::now();
    c.kill("node-a");
    let config = c.config_path("node-a");
    let (ok, out, err) =
        c.agent_command("node-a", &["cleanup", "--config", config.to_str().unwrap()]);
    assert!(ok, "cleanup: {out} {err}");
    let next = c.wait_single_holder(VIP, Duration::from_secs(5));
    let o = until_only(&probe, c.host(&next).mac(), t, Duration::from_secs(5));
    assert!(o.lost <= 2, "kill + cleanup: {o:?}");
    wait_for("the annotation to follow", Duration::from_secs(15), || {
        (c.annotation("web", "hostlb.io/announcing-IPv4") == format!("{next},eth0")).then_some(())
    })
    .unwrap();
    // The new owner explains the move, in its record (the CRD's schema
    // keeps the field) and in a Moved Event its credential may write.
    wait_last_move(&c, &next, &format!("{VIP} node-a shutdown"));
    wait_for("the Moved Event", Duration::from_secs(15), || {
        events(
            &c,
            "jsonpath={range .items[*]}{.reason} {.regarding.name} {.note}{\"\\n\"}{end}",
        )
        .lines()
        .any(|l| {
            l.starts_with(&format!(
                "Moved web {VIP} moved to {next} from node-a (shutdown)"
            ))
        })
        .then_some(())
    })
    .unwrap();

    c.start("node-a");
    let back = Instant::now();
    let o = until_only(
        &probe,
        c.host("node-a").mac(),
        back,
        Duration::from_secs(20),
    );
    assert!(o.lost <= 2, "the preferred node's return: {o:?}");
    wait_last_move(&c, "node-a", &format!("{VIP} {next} preference"));
    std::thread::sleep(Duration::from_secs(2));

    let t = Instant::now();
    c.signal("node-a", "TERM");
    assert_eq!(c.wait_exit("node-a", Duration::from_secs(10)), Some(0));
    let next = c.wait_single_holder(VIP, Duration::from_secs(5));
    let o = until_only(&probe, c.host(&next).mac(), t, Duration::from_secs(5));
    assert!(o.lost <= 2, "SIGTERM hand-over: {o:?}");
    // A clean stop says so, not that something went wrong.
    let log = std::fs::read_to_string(c.log_path("node-a")).unwrap();
    let tail = &log[log.rfind("leaving: handing VIPs over").expect("a leave")..];
    assert!(
        !tail.contains(" WARN ") && !tail.contains("ERROR"),
        "a clean stop logged trouble:\n{tail}"
    );
    assert!(
        records(&c)
            .lines()
            .any(|l| l.starts_with("node-a Stopped ")),
        "a stopped agent's record says so: {}",
        records(&c)
    );
    wait_for("the Withdrawn Event", Duration::from_secs(15), || {
        events(&c, "jsonpath={.items[*].reason}")
            .contains("Withdrawn")
            .then_some(())
    })
    .unwrap();
    assert_nothing_refused(&c);
}

/// Kubernetes' out-of-service taint on the holder's Node drains it as
/// `spec.drain` would: its VIP moves make before break while its agent
/// runs on (not one probe lost), its record says it is drained, and the
/// taint's removal lets it win the VIP back, again without a loss.
#[test]
fn the_out_of_service_taint_drains_a_node_make_before_break() {
    let Some(c) = three_nodes() else { return };
    let probe = served_by_node_a(&c, "");

    let t = Instant::now();
    c.kubectl(&[
        "taint",
        "node",
        "node-a",
        "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
    ]);
    let next = wait_for("the VIP to leave node-a", Duration::from_secs(15), || {
        let h = c.holders(VIP);
        (h.len() == 1 && h[0] != "node-a").then(|| h[0].clone())
    })
    .unwrap();
    let o = until_only(&probe, c.host(&next).mac(), t, Duration::from_secs(10));
    eprintln!(
        "out of service: moved to {next} after {:?}: {o:?}",
        t.elapsed()
    );
    assert_eq!(o.lost, 0, "the taint's move: {o:?}");
    assert!(ready(&c, "node-a"), "a tainted node's agent runs on");
    wait_for(
        "node-a's record to say drained",
        Duration::from_secs(15),
        || {
            (c.kubectl(&[
                "get",
                "nodeagents",
                "node-a",
                "-o",
                "jsonpath={.status.drained}",
            ]) == "true")
                .then_some(())
        },
    )
    .unwrap();
    let log = std::fs::read_to_string(c.log_path("node-a")).unwrap();
    assert!(
        log.contains("this node's Node is out of service"),
        "the log says why it drained"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(c.holders(VIP), vec![next.clone()], "it stays off node-a");

    let t = Instant::now();
    c.kubectl(&[
        "taint",
        "node",
        "node-a",
        "node.kubernetes.io/out-of-service-",
    ]);
    let o = until_only(&probe, c.host("node-a").mac(), t, Duration::from_secs(20));
    eprintln!(
        "taint removed: back on node-a after {:?}: {o:?}",
        t.elapsed()
    );
    assert_eq!(o.lost, 0, "the return: {o:?}");
    assert_nothing_refused(&c);
}

/// The API server goes away; the preferred node's agent is killed and
/// restarted as systemd does, and cannot reach the API. It must not be
/// elected for what it cannot serve: its peers keep the VIP answering the
/// whole time. When the server returns, every agent is caught up within
/// 5 s, and the preferred node takes its VIP back without a lost probe.
#[test]
fn an_agent_restarted_during_an_api_outage_takes_nothing_it_cannot_serve() {
    let Some(mut c) = three_nodes() else { return };
    let probe = served_by_node_a(&c, "");

    c.real.as_ref().unwrap().kill_apiserver();
    let down = Instant::now();
    let t = Instant::now();
    c.kill("node-a");
    let config = c.config_path("node-a");
    let (ok, out, err) =
        c.agent_command("node-a", &["cleanup", "--config", config.to_str().unwrap()]);
    assert!(ok, "cleanup: {out} {err}");
    c.start("node-a");
    let next = c.wait_single_holder(VIP, Duration::from_secs(5));
    assert_ne!(next, "node-a");
    let next_mac = c.host(&next).mac().to_string();
    until_only(&probe, &next_mac, t, Duration::from_secs(5));
    // Long past gossip settling: the restarted node is live in gossip, yet
    // no candidate while it has no view of the cluster.
    // HOSTLB_API_OUTAGE (seconds, default 10) makes the outage longer, to
    // measure catch-up after it (docs/agent.md).
    let outage: u64 = std::env::var("HOSTLB_API_OUTAGE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let watch_from = Instant::now();
    std::thread::sleep(Duration::from_secs(outage));
    let o = probe.judge(watch_from, Instant::now());
    assert_eq!(
        o.lost, 0,
        "the VIP went unanswered during the outage: {o:?}"
    );
    assert_eq!(c.holders(VIP), vec![next.clone()]);
    assert!(
        !ready(&c, "node-a"),
        "an agent with no view of the cluster says it is ready"
    );

    let outage_len = down.elapsed();
    c.real.as_ref().unwrap().start_apiserver();
    let back = Instant::now();
    let caught_up = wait_for("every agent ready again", Duration::from_secs(60), || {
        c.nodes.iter().all(|n| ready(&c, n)).then(|| back.elapsed())
    })
    .unwrap();
    eprintln!(
        "catch-up after the API server's return (outage {} s): {} ms",
        outage_len.as_secs(),
        caught_up.as_millis()
    );
    let o = until_only(
        &probe,
        c.host("node-a").mac(),
        back,
        Duration::from_secs(20),
    );
    assert!(o.lost <= 2, "the preferred node's return: {o:?}");
    assert!(
        caught_up <= Duration::from_secs(5),
        "caught up {} ms after the server returned",
        caught_up.as_millis()
    );
    assert_nothing_refused(&c);
}

/// The network between the nodes and the API server cut, packets dropped
/// rather than refused (a partition, a firewall, a load balancer in front
/// of the server gone). The agents' watches share one HTTP/2 connection,
/// which sees no error: what changed during the cut reaches it only when
/// TCP retransmits, which after a cut of 40 s is tens of seconds after the
/// heal. The agents notice the server's return (the writer's probe) and
/// list everything again: a Service's endpoints moved off its holder
/// during the cut move the VIP within seconds of the heal.
#[test]
fn what_changed_while_the_api_was_cut_off_arrives_at_its_return() {
    let Some(c) = three_nodes() else { return };
    let _probe = served_by_node_a(&c, "externalTrafficPolicy: Local");
    c.wait_ready(Duration::from_secs(30));
    // Dropped on the API host's wire, both ways; the test's own kubectl
    // stays on its loopback.
    let api = &c.host("api").ns;
    api.run(&[
        "nft",
        "add table inet cut; add chain inet cut in { type filter hook input priority -300; }; add chain inet cut out { type filter hook output priority -300; }; add rule inet cut in iifname eth0 tcp dport 6443 drop; add rule inet cut out oifname eth0 tcp sport 6443 drop",
    ])
    .unwrap();
    let cut = Instant::now();
    // Early in the cut, so that the server's retransmissions have backed
    // off far by its end.
    std::thread::sleep(Duration::from_secs(2));
    c.endpoints("web", &["node-b", "node-c"]);
    std::thread::sleep(Duration::from_secs(40).saturating_sub(cut.elapsed()));
    assert_eq!(
        c.holders(VIP),
        vec!["node-a".to_string()],
        "nothing moved during the cut"
    );
    api.run(&["nft", "delete table inet cut"]).unwrap();
    let healed = Instant::now();
    let moved = wait_for("the VIP to leave node-a", Duration::from_secs(90), || {
        let h = c.holders(VIP);
        (h.len() == 1 && h[0] != "node-a").then(|| healed.elapsed())
    })
    .unwrap();
    eprintln!(
        "endpoints moved during a 40 s cut: the VIP moved {} ms after the heal",
        moved.as_millis()
    );
    // The writer asks every second while the server does not answer, and
    // a list of a handful of objects takes milliseconds: a few seconds,
    // where waiting for TCP took tens.
    assert!(
        moved <= Duration::from_secs(5),
        "the VIP moved {} ms after the heal",
        moved.as_millis()
    );
    assert_nothing_refused(&c);
}

/// A record written while the API server is cut off: the write waits on
/// a connection that sees no error, and without a bound on it the record
/// went on saying what was true before the cut until TCP retransmitted,
/// which after a cut of 40 s is tens of seconds past the heal (peers and
/// `kubectl hostlb status` read it meanwhile). The owner is killed during
/// the cut (its address removed as `cleanup` would, which needs the API
/// for nothing else), its successor takes the VIP over gossip, and its
/// record lists the VIP within seconds of the heal.
#[test]
fn a_record_changed_while_the_api_was_cut_off_is_written_at_its_return() {
    let Some(mut c) = three_nodes() else { return };
    c.service("web", &[VIP], &["node-a", "node-b", "node-c"], "");
    assert_eq!(c.wait_single_holder(VIP, Duration::from_secs(30)), "node-a");
    c.wait_ready(Duration::from_secs(30));
    let vips_of = |c: &Cluster, node: &str| c.record(node, "{.status.vips}");
    let api = &c.host("api").ns;
    api.run(&[
        "nft",
        "add table inet cut; add chain inet cut in { type filter hook input priority -300; }; add chain inet cut out { type filter hook output priority -300; }; add rule inet cut in iifname eth0 drop; add rule inet cut out oifname eth0 drop; add table arp cut; add chain arp cut in { type filter hook input priority 0; }; add chain arp cut out { type filter hook output priority 0; }; add rule arp cut in drop; add rule arp cut out drop",
    ])
    .unwrap();
    let cut = Instant::now();
    // At once: the successor's write then goes out on a connection the
    // client keeps open, as most writes do, rather than a new one whose
    // connect times out and is tried again.
    c.kill("node-a");
    c.host("node-a")
        .ns
        .run(&["ip", "addr", "del", &format!("{VIP}/24"), "dev", "eth0"])
        .unwrap();
    let next = c.wait_single_holder(VIP, Duration::from_secs(5));
    assert_ne!(next, "node-a");
    std::thread::sleep(Duration::from_secs(40).saturating_sub(cut.elapsed()));
    assert!(
        !vips_of(&c, &next).contains(VIP),
        "the record could not have been written during the cut"
    );
    let api = &c.host("api").ns;
    api.run(&["nft", "delete table inet cut; delete table arp cut"])
        .unwrap();
    let healed = Instant::now();
    let written = wait_for(
        "the new holder's record to list the VIP",
        Duration::from_secs(90),
        || vips_of(&c, &next).contains(VIP).then(|| healed.elapsed()),
    )
    .unwrap();
    eprintln!(
        "a record changed during a 40 s cut: written {} ms after the heal",
        written.as_millis()
    );
    // The API's return is noticed within a second (the writer's probe) and
    // the write is made again at once: a few seconds, where waiting for
    // TCP took tens.
    assert!(
        written <= Duration::from_secs(5),
        "the record was written {} ms after the heal",
        written.as_millis()
    );
}
