//! The agent's firewall end to end: real agents on a bridged LAN, the
//! real API server (the agents as the shipped RBAC makes them), listeners
//! on every port of the hosts, and a client that connects to the VIP.
//! What counts is what the client gets: the Service's port answers, a
//! daemon bound to every address does not, ICMP echo does; IPv4 and IPv6.
//! Needs root, nft, ping and python3, and fails (never skips) without
//! them; without the real server it says it did not run, and under
//! `CI=true` fails.

mod cluster;

use std::process::Child;
use std::time::{Duration, Instant};

use cluster::Cluster;
use hostlb_tests::netns::{require_tools, wait_for};

const VIP4: &str = "10.77.0.100";
const VIP6: &str = "fd00:77::100";
const NODES: [&str; 2] = ["node-a", "node-b"];

/// Listeners, stopped however the test ends (they hold its output open).
struct Listeners(Vec<Child>);

impl Drop for Listeners {
    fn drop(&mut self) {
        for l in &mut self.0 {
            let _ = l.kill();
            let _ = l.wait();
        }
    }
}

/// A TCP listener on every address of `node` (both families) that
/// answers each connection with the node's name.
fn listen(c: &Cluster, node: &str, port: u16) -> Child {
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET6)\n\
         s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
         s.bind(('::', {port}))\n\
         s.listen()\n\
         while True:\n    c, _ = s.accept()\n    c.sendall(b'{node}')\n    c.close()\n"
    );
    c.host(node)
        .ns
        .command("python3", &["-c", &script])
        .spawn()
        .unwrap()
}

/// What the client gets from `ip`:`port`: the name of the node that
/// answered, or why nothing did.
fn connect(c: &Cluster, ip: &str, port: u16) -> String {
    connect_from(c, "client", ip, port)
}

/// [`connect`] from the host `from`.
fn connect_from(c: &Cluster, from: &str, ip: &str, port: u16) -> String {
    let script = format!(
        "import socket\n\
         try:\n    s = socket.create_connection(('{ip}', {port}), timeout=1)\n    print(s.recv(64).decode())\n\
         except socket.timeout:\n    print('no answer')\n\
         except OSError as e:\n    print('refused' if e.errno == 111 else e)\n"
    );
    c.host(from)
        .ns
        .run(&["python3", "-c", &script])
        .unwrap()
        .trim()
        .to_string()
}

/// Waits until `ip`:`port` gets no answer from the client.
fn wait_closed(c: &Cluster, ip: &str, port: u16, what: &str) {
    wait_for(
        &format!("{ip}:{port} to {what}"),
        Duration::from_secs(5),
        || (connect(c, ip, port) == "no answer").then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Waits until a node answers the client on `ip`:`port`.
fn wait_open(c: &Cluster, ip: &str, port: u16, what: &str) {
    wait_for(
        &format!("{ip}:{port} to {what}"),
        Duration::from_secs(5),
        || NODES.contains(&connect(c, ip, port).as_str()).then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

fn pings(c: &Cluster, ip: &str) -> bool {
    c.host("client")
        .ns
        .run(&["ping", "-c", "1", "-W", "2", ip])
        .is_ok()
}

#[test]
fn a_vip_answers_only_on_its_services_ports_and_to_icmp() {
    require_tools(&["nft", "ping", "python3"]);
    let Some(mut c) = Cluster::real(&NODES) else {
        return;
    };
    c.pool_and_ad(
        &["10.77.0.100-10.77.0.120", "fd00:77::100-fd00:77::120"],
        "",
    );
    c.start_all();
    c.service("web", &[VIP4, VIP6], &NODES, "");
    let owner = c.wait_single_holder(VIP4, Duration::from_secs(20));
    c.wait_single_holder(VIP6, Duration::from_secs(20));
    let mut listeners = Listeners(Vec::new());
    for n in NODES {
        listeners.0.push(listen(&c, n, 80));
        listeners.0.push(listen(&c, n, 22));
    }
    let owner_ip = c.host(&owner).ipv4.to_string();
    let owner_ip6 = c.host(&owner).ipv6.to_string();
    for vip in [VIP4, VIP6] {
        let got = wait_for(
            &format!("{vip}:80 to answer"),
            Duration::from_secs(5),
            || {
                let got = connect(&c, vip, 80);
                NODES.contains(&got.as_str()).then_some(got)
            },
        )
        .unwrap();
        eprintln!("{vip}:80 answered by {got}");
        assert_eq!(
            connect(&c, vip, 22),
            "no answer",
            "{vip}:22 is no Service's port: dropped"
        );
        assert!(pings(&c, vip), "ICMP echo to {vip} is answered");
    }
    // What the owner sends itself passes.
    assert_eq!(
        connect_from(&c, &owner, VIP4, 22),
        owner,
        "from the host itself"
    );
    // The hosts' own addresses are not the firewall's business.
    for ip in [&owner_ip, &owner_ip6] {
        assert_eq!(
            connect(&c, ip, 22),
            owner,
            "{ip}:22, the host's own address"
        );
    }
    let (_, metrics) = c.http_get(&owner, "/metrics");
    assert!(
        metrics.contains("hostlb_agent_firewall_vips 2"),
        "{metrics}"
    );
    let (_, status) = c.http_get(&owner, "/status");
    assert!(
        status.contains(r#""firewall":"on: 2 VIPs answer only on their Services' ports (2 address and port pairs)"#),
        "{status}"
    );

    // A port the Service adds opens within a second of the edit, in the
    // owner's table (read as often as `nft` runs, every few tens of ms),
    // and then to the client.
    let edited = Instant::now();
    c.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  type: LoadBalancer\n  ports: [{port: 80, protocol: TCP, name: http}, {port: 22, protocol: TCP, name: ssh}]\n",
    );
    let in_table = wait_for(
        "the owner's table to open port 22",
        Duration::from_secs(5),
        || {
            let set = c
                .host(&owner)
                .ns
                .run(&["nft", "list", "set", "inet", "hostlb", "open4"])
                .unwrap_or_default();
            set.contains(&format!("{VIP4} . tcp . 22"))
                .then(|| edited.elapsed())
        },
    )
    .unwrap();
    eprintln!("the Service's new port was in the owner's table {in_table:?} after the edit");
    assert!(in_table < Duration::from_secs(1), "{in_table:?}");
    for vip in [VIP4, VIP6] {
        wait_open(&c, vip, 22, "open");
    }

    // Turned off by a reload: every port of the host answers on the VIP.
    c.kubectl(&[
        "patch",
        "service",
        "web",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"ports":[{"port":80,"protocol":"TCP"}]}}"#,
    ]);
    let ports = c.kubectl(&["get", "service", "web", "-o", "jsonpath={.spec.ports}"]);
    wait_closed(
        &c,
        VIP4,
        22,
        &format!("close again (the Service's ports: {ports})"),
    );
    for n in NODES {
        c.write_config(n, "[firewall]\nenabled = false");
        c.signal(n, "HUP");
    }
    wait_open(&c, VIP4, 22, "answer once off");
    let tables = c.host(&owner).ns.run(&["nft", "list", "tables"]).unwrap();
    assert!(!tables.contains("hostlb"), "{tables}");

    // Back on, then `cleanup` takes the table away with the addresses.
    for n in NODES {
        c.write_config(n, "");
        c.signal(n, "HUP");
    }
    wait_closed(&c, VIP4, 22, "close once on");
    // A restart adopts the table: killed without `cleanup`, the agent
    // leaves it in place, and started again it replaces it in one
    // transaction once the cluster is known, never removing it meanwhile.
    let has_table = |c: &Cluster| {
        c.host(&owner)
            .ns
            .run(&["nft", "list", "tables"])
            .unwrap()
            .contains("inet hostlb")
    };
    c.kill(&owner);
    assert!(has_table(&c), "a killed agent's table stays");
    c.start(&owner);
    let restarted = Instant::now();
    while restarted.elapsed() < Duration::from_secs(3) {
        assert!(has_table(&c), "the table went away during a restart");
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_for("the restarted owner ready", Duration::from_secs(10), || {
        (c.http_get(&owner, "/readyz").0 == "200").then_some(())
    })
    .unwrap();
    assert!(has_table(&c));
    c.kill(&owner);
    let config = c.config_path(&owner);
    let (ok, _, err) = c.agent_command(&owner, &["cleanup", "--config", config.to_str().unwrap()]);
    assert!(ok, "{err}");
    let tables = c.host(&owner).ns.run(&["nft", "list", "tables"]).unwrap();
    assert!(
        !tables.contains("hostlb"),
        "cleanup removes the table: {tables}"
    );
    drop(listeners);
    let refused = c.refusals();
    assert!(refused.is_empty(), "{refused:#?}");
}
