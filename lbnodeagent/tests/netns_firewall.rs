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

/// What kube-proxy (iptables mode, NodePorts on every local address) and
/// CNI portmap (hostPorts) do: DNAT in `prerouting` at `dstnat` priority,
/// for any local destination. Here it sends NodePort 30080 and hostPort
/// 30443 to a listener of the host's on port 8080.
fn nodeport_dnat(c: &Cluster, node: &str) {
    let rules = "table inet kubeproxy {\n\
                 \tchain prerouting {\n\
                 \t\ttype nat hook prerouting priority dstnat; policy accept;\n\
                 \t\tfib daddr type local tcp dport { 30080, 30443 } redirect to :8080\n\
                 \t}\n\
                 }\n";
    let ns = &c.host(node).ns;
    let mut child = ns
        .command("nft", &["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(rules.as_bytes())
        .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "nft refused the DNAT rules"
    );
}

/// A VIP is closed to what reaches it through DNAT as well: a NodePort
/// and a hostPort on the holder do not answer on the VIP (they do on the
/// host's own address, which is theirs), the Service's port does. And a
/// VIP written into another Node's `status.addresses` (what a host's
/// kubelet credentials can do to its own Node) stays closed on the
/// holder: only a host's own addresses, as its kernel has them, are left
/// open. On the real API server, IPv4 and IPv6.
#[test]
fn dnat_to_a_vip_and_another_nodes_addresses_stay_guarded() {
    require_tools(&["nft", "python3"]);
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
    let owner6 = c.wait_single_holder(VIP6, Duration::from_secs(20));
    let mut listeners = Listeners(Vec::new());
    for n in NODES {
        listeners.0.push(listen(&c, n, 80));
        listeners.0.push(listen(&c, n, 8080));
        listeners.0.push(listen(&c, n, 22));
        nodeport_dnat(&c, n);
    }
    for (vip, holder) in [(VIP4, &owner), (VIP6, &owner6)] {
        wait_open(&c, vip, 80, "answer on the Service's port");
        for port in [30080, 30443] {
            assert_eq!(
                connect(&c, vip, port),
                "no answer",
                "{vip}:{port} is DNATed to a listener of {holder}'s: dropped"
            );
        }
        let own = if vip == VIP4 {
            c.host(holder).ipv4.to_string()
        } else {
            c.host(holder).ipv6.to_string()
        };
        assert_eq!(
            connect(&c, &own, 30080),
            *holder,
            "the NodePort answers on the host's own address"
        );
    }

    // The other node writes the VIP into its Node object's addresses.
    let other = NODES.iter().find(|n| **n != owner).unwrap();
    c.kubectl(&[
        "patch",
        "node",
        other,
        "--subresource=status",
        "--type=json",
        "-p",
        &format!(r#"[{{"op":"add","path":"/status/addresses/-","value":{{"type":"ExternalIP","address":"{VIP4}"}}}}]"#),
    ]);
    let addresses = c.kubectl(&["get", "node", other, "-o", "jsonpath={.status.addresses}"]);
    assert!(addresses.contains(VIP4), "{addresses}");
    // Seen by the agents (a watch, a few ms) and given to nft (tens of
    // ms): a second is plenty for the port to open if it were to.
    std::thread::sleep(Duration::from_secs(2));
    let set = c
        .host(&owner)
        .ns
        .run(&["nft", "list", "set", "inet", "hostlb", "vips4"])
        .unwrap();
    assert!(set.contains(VIP4), "{set}");
    assert_eq!(
        connect(&c, VIP4, 22),
        "no answer",
        "{VIP4}:22 stays closed on {owner}"
    );
    drop(listeners);
    let refused = c.refusals();
    assert!(refused.is_empty(), "{refused:#?}");
}

/// No VIP is added before a firewall that closes it is in force: with
/// `nft` taking a second to write each table (a wrapper first on the
/// agents' `PATH`), the address appears only after the table holding it.
/// With no `nft` at all, the agent does not start, saying why.
#[test]
fn no_vip_is_added_before_the_firewall_closes_it() {
    require_tools(&["nft"]);
    let mut c = Cluster::new(&NODES);
    c.pool_and_ad(&["10.77.0.100-10.77.0.120"], "");
    let slow = c.dir.path().join("slow-nft");
    std::fs::create_dir_all(&slow).unwrap();
    let real_nft = hostlb_tests::netns::run("sh", &["-c", "command -v nft"]).unwrap();
    std::fs::write(
        slow.join("nft"),
        format!("#!/bin/sh\nsleep 1\nexec {} \"$@\"\n", real_nft.trim()),
    )
    .unwrap();
    std::fs::set_permissions(
        slow.join("nft"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        slow.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for n in NODES {
        c.start_with_env(n, &[("PATH", &path)]);
    }
    c.wait_ready(Duration::from_secs(30));
    let in_table = |n: &str| {
        c.host(n)
            .ns
            .run(&["nft", "list", "set", "inet", "hostlb", "vips4"])
            .is_ok_and(|s| s.contains(VIP4))
    };
    c.service("web", &[VIP4], &NODES, "");
    let deadline = Instant::now() + Duration::from_secs(20);
    let holder = loop {
        let holders = c.holders(VIP4);
        if let Some(h) = holders.first() {
            break h.clone();
        }
        assert!(Instant::now() < deadline, "nobody took {VIP4}");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        in_table(&holder),
        "{VIP4} was added on {holder} before its table was in force"
    );

    // Without nft: refused at the start, by `check` and by `run`.
    c.kill(&holder);
    let empty = c.dir.path().join("no-nft");
    std::fs::create_dir_all(&empty).unwrap();
    let config = c.config_path(&holder);
    let path = format!("PATH={}", empty.display());
    let out = c
        .host(&holder)
        .ns
        .command(
            "env",
            &[
                &path,
                c.binary(&holder).to_str().unwrap(),
                "run",
                "--config",
                config.to_str().unwrap(),
            ],
        )
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("no nft is on the PATH"), "{err}");
}
