//! Virtual mode end to end, through real routing daemons: three hosts on a
//! LAN, each running `lbnodeagent` and a routing daemon that exports the
//! host routes on `kube-lb0` over BGP, a router peering with every host,
//! and a client on another network behind the router. Run once with BIRD 2
//! on the hosts and FRR on the router, once the other way round, with the
//! configs `docs/routing.md` ships. Every assertion is on what the router's
//! kernel holds (its route to the VIP and the next hops) and what the
//! client reaches, and each event's time to the router's route change is
//! printed. Needs root, bird2 and frr; fails (never skips) without them.

mod cluster;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::process::Child;
use std::time::{Duration, Instant};

use cluster::Cluster;
use hostlb_tests::netns::{Netns, require_tools, wait_for};
use hostlb_tests::routing::{Daemon, Router, next_hops, render, shipped_config};

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
const POOL_V4: &str = "10.99.0.0/24";
const POOL_V6: &str = "fd00:99::/64";
const VIP4: &str = "10.99.0.5";
const VIP6: &str = "fd00:99::5";
/// The `externalTrafficPolicy: Local` Service's address.
const LOCAL4: &str = "10.99.0.6";
const HOST_AS: &str = "65001";
const ROUTER_AS: &str = "65000";
/// An event's route change is expected well within this (measured:
/// tens of milliseconds); a failure here is a lost withdrawal, not a slow
/// one.
const WITHDRAWN_WITHIN: Duration = Duration::from_secs(3);

struct Routed {
    // Drop order: listeners, daemons, then the cluster and its LAN.
    listeners: Vec<Child>,
    daemons: Vec<Router>,
    router: Netns,
    outside: Netns,
    c: Cluster,
    /// Each host's eth0 addresses (and IPv6 link-local), to name a next hop.
    hop_names: BTreeMap<IpAddr, String>,
    label: String,
}

impl Drop for Routed {
    fn drop(&mut self) {
        for l in &mut self.listeners {
            let _ = l.kill();
            let _ = l.wait();
        }
        if std::thread::panicking() {
            for d in &self.daemons {
                eprintln!("----- {} -----\n{}", d.daemon.name(), d.logs());
            }
        }
    }
}

fn vars(router_id: &str, hostname: &str) -> Vec<(&'static str, String)> {
    vec![
        ("ROUTER_ID", router_id.to_string()),
        ("HOSTNAME", hostname.to_string()),
        ("POOL_V4", POOL_V4.into()),
        ("POOL_V6", POOL_V6.into()),
        ("HOST_AS", HOST_AS.into()),
        ("ROUTER_AS", ROUTER_AS.into()),
        ("ROUTER_V4", hostlb_tests::netns::LAN_V4_GATEWAY.to_string()),
        ("ROUTER_V6", hostlb_tests::netns::LAN_V6_GATEWAY.to_string()),
        ("LAN_V4", hostlb_tests::netns::LAN_V4_PREFIX.into()),
        ("LAN_V6", hostlb_tests::netns::LAN_V6_PREFIX.into()),
    ]
}

fn config(daemon: Daemon, side: &str, router_id: &str, hostname: &str) -> String {
    let path = shipped_config(&format!("{}-{side}.conf", daemon.name()));
    let template =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    render(&template, &vars(router_id, hostname))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

impl Routed {
    fn new(hosts: Daemon, router: Daemon) -> Routed {
        require_tools(hosts.programs());
        require_tools(router.programs());
        let c = Cluster::new(&NODES);
        c.pool_and_ad(&[POOL_V4, POOL_V6], "");
        let (router_ns, outside) = c.lan.add_gateway(90).unwrap();
        let mut daemons = Vec::new();
        let mut hop_names = BTreeMap::new();
        for n in NODES {
            let host = c.host(n);
            // No dummy driver on every kernel: an empty bridge serves.
            host.ns.ip("link add kube-lb0 type bridge").unwrap();
            host.ns.ip("link set kube-lb0 up").unwrap();
            hop_names.insert(IpAddr::from(host.ipv4), n.to_string());
            hop_names.insert(IpAddr::from(host.ipv6), n.to_string());
            let ll = host.ns.ip("-6 -o addr show dev eth0 scope link").unwrap();
            let ll: IpAddr = ll
                .split_whitespace()
                .skip_while(|w| *w != "inet6")
                .nth(1)
                .and_then(|a| a.split('/').next())
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("{n}: no link-local address: {ll}"));
            hop_names.insert(ll, n.to_string());
            let dir = c.dir.path().join(format!("{}-{n}", hosts.name()));
            let conf = config(hosts, "host", &host.ipv4.to_string(), n);
            daemons.push(Router::start(hosts, &host.ns, &dir, &conf).unwrap());
        }
        let dir = c.dir.path().join(format!("{}-router", router.name()));
        let conf = config(
            router,
            "router",
            &hostlb_tests::netns::LAN_V4_GATEWAY.to_string(),
            "router",
        );
        daemons.push(Router::start(router, &router_ns, &dir, &conf).unwrap());
        let r = Routed {
            listeners: Vec::new(),
            daemons,
            router: router_ns,
            outside,
            c,
            hop_names,
            label: format!(
                "{} on the hosts, {} on the router",
                hosts.name(),
                router.name()
            ),
        };
        // Three hosts, two families.
        r.daemons
            .last()
            .unwrap()
            .wait_established(6, Duration::from_secs(60))
            .unwrap();
        // Each peer in its own family only: an IPv6 peer activated for
        // IPv4 too would sit in NoNeg (FRR, hosts' side and router's).
        for d in &r.daemons {
            let summary = d.frr_summary();
            assert!(!summary.contains("NoNeg"), "{summary}");
        }
        r
    }

    /// The nodes the router's route to `vip` goes to.
    fn hops(&self, vip: &str) -> BTreeSet<String> {
        next_hops(&self.router, vip.parse().unwrap())
            .into_iter()
            .map(|h| {
                self.hop_names
                    .get(&h)
                    .cloned()
                    .unwrap_or_else(|| format!("unknown {h}"))
            })
            .collect()
    }

    /// Waits until the router sends `vip` to exactly `nodes`; the time
    /// from `since`.
    fn until_hops(&self, vip: &str, nodes: &[&str], since: Instant, within: Duration) -> Duration {
        let want: BTreeSet<String> = nodes.iter().map(|n| n.to_string()).collect();
        let left = within.saturating_sub(since.elapsed());
        wait_for(&format!("the router's next hops for {vip}"), left, || {
            (self.hops(vip) == want).then(Instant::now)
        })
        .map(|at| at - since)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: want {want:?}, the router has {:?}; holders {:?}",
                self.label,
                self.hops(vip),
                self.c.holders(vip)
            )
        })
    }

    /// A TCP listener on `node` bound to `vip`, answering with the node's
    /// name.
    fn listen(&mut self, node: &str, vip: &str) {
        let script = format!(
            "import socket\n\
             s = socket.socket(socket.AF_INET6 if ':' in '{vip}' else socket.AF_INET)\n\
             s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             s.bind(('{vip}', 80))\n\
             s.listen()\n\
             while True:\n    c, _ = s.accept()\n    c.sendall(b'{node}')\n    c.close()\n"
        );
        let child = self
            .c
            .host(node)
            .ns
            .command("python3", &["-c", &script])
            .spawn()
            .unwrap();
        self.listeners.push(child);
    }

    /// What the client behind the router gets from `vip`:80 (the Service's port: the firewall drops the rest).
    fn reach(&self, vip: &str) -> String {
        let script = format!(
            "import socket\n\
             s = socket.create_connection(('{vip}', 80), timeout=2)\n\
             print(s.recv(64).decode())\n"
        );
        wait_for(
            &format!("the client to reach {vip}"),
            Duration::from_secs(10),
            || {
                self.outside
                    .run(&["python3", "-c", &script])
                    .ok()
                    .map(|o| o.trim().to_string())
            },
        )
        .unwrap_or_else(|e| panic!("{}: {e}", self.label))
    }

    /// `kube-lb0` of `node` holds `vip` as a host route, never with the
    /// pool's prefix, and `eth0` does not hold it.
    fn held_as_host_route(&self, node: &str, vip: &str) {
        let ns = &self.c.host(node).ns;
        let out = ns.ip("-o addr show dev kube-lb0").unwrap();
        let len = if vip.contains(':') { 128 } else { 32 };
        assert!(out.contains(&format!(" {vip}/{len} ")), "{node}: {out}");
        let eth0 = ns.ip("-o addr show dev eth0").unwrap();
        assert!(!eth0.contains(&format!(" {vip}/")), "{node}: {eth0}");
    }
}

fn scenario(hosts: Daemon, router: Daemon) {
    let mut r = Routed::new(hosts, router);
    r.c.start_all();
    let mut figures = Vec::new();
    let label = r.label.clone();
    let mut note = |what: &str, d: Duration| {
        eprintln!("{label}: {what}: {} ms", d.as_millis());
        figures.push(format!("{what} {} ms", d.as_millis()));
    };

    // externalTrafficPolicy: Cluster: every eligible node adds it, the
    // router has one ECMP route over the three.
    let created = r.c.service("web", &[VIP4, VIP6], &["node-a"], "");
    note(
        "Service created -> IPv4 route, 3 next hops",
        r.until_hops(VIP4, &NODES, created, Duration::from_secs(30)),
    );
    note(
        "Service created -> IPv6 route, 3 next hops",
        r.until_hops(VIP6, &NODES, created, Duration::from_secs(30)),
    );
    for n in NODES {
        r.held_as_host_route(n, VIP4);
        r.held_as_host_route(n, VIP6);
    }
    // Nothing else leaves the hosts: no pool prefix, no LAN prefix.
    for prefix in [POOL_V4, "10.77.0.0/24"] {
        let routes = r
            .router
            .ip(&format!("route show {prefix} proto bgp"))
            .unwrap();
        let bird = r
            .router
            .ip(&format!("route show {prefix} proto bird"))
            .unwrap();
        assert!(
            routes.is_empty() && bird.is_empty(),
            "{prefix}: {routes}{bird}"
        );
    }
    wait_for("the virtual annotation", Duration::from_secs(10), || {
        (r.c.annotation("web", "hostlb.io/announcing-virtual-IPv4") == "node-a,node-b,node-c")
            .then_some(())
    })
    .unwrap();
    assert_eq!(r.c.annotation("web", "hostlb.io/announcing-IPv4"), "");

    // The agents say so: status, metrics.
    let config = r.c.config_path("node-a");
    let (ok, status, err) =
        r.c.agent_command("node-a", &["status", "--config", config.to_str().unwrap()]);
    assert!(ok, "{status} {err}");
    assert!(
        status.contains(&format!("{VIP4}/32 on kube-lb0 (virtual)")),
        "{status}"
    );
    assert!(
        status.contains("holds it on its virtual interface): node-a, node-b, node-c"),
        "{status}"
    );
    // Every member holds both routed VIPs, though gossip carries none.
    for n in NODES {
        let line = status
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{n} ")))
            .unwrap_or_else(|| panic!("no member line for {n}: {status}"));
        assert!(line.contains("vips 0    routed 2"), "{line}");
    }
    let (_, metrics) = r.c.http_get("node-a", "/metrics");
    assert!(metrics.contains("hostlb_agent_virtual_vips 2"), "{metrics}");
    assert!(metrics.contains("hostlb_agent_owned_vips 2"), "{metrics}");

    // The client behind the router reaches a listener on the VIP, on
    // whichever host the router's hash picks.
    for n in NODES {
        r.listen(n, VIP4);
        r.listen(n, VIP6);
    }
    for vip in [VIP4, VIP6] {
        let answered = r.reach(vip);
        assert!(NODES.contains(&answered.as_str()), "{vip}: {answered:?}");
    }

    // A planned stop withdraws the node's route; its return restores it.
    let t = Instant::now();
    r.c.signal("node-a", "TERM");
    note(
        "SIGTERM -> next hop withdrawn",
        r.until_hops(VIP4, &["node-b", "node-c"], t, WITHDRAWN_WITHIN),
    );
    r.until_hops(VIP6, &["node-b", "node-c"], t, WITHDRAWN_WITHIN);
    assert_eq!(r.c.wait_exit("node-a", Duration::from_secs(10)), Some(0));
    let t = Instant::now();
    r.c.start("node-a");
    note(
        "agent start -> next hop back",
        r.until_hops(VIP4, &NODES, t, Duration::from_secs(20)),
    );

    // SIGKILL, then `cleanup` as systemd's ExecStopPost runs it.
    let t = Instant::now();
    r.c.kill("node-b");
    let config = r.c.config_path("node-b");
    let (ok, out, err) =
        r.c.agent_command("node-b", &["cleanup", "--config", config.to_str().unwrap()]);
    assert!(ok, "cleanup: {out} {err}");
    note(
        "SIGKILL + cleanup -> next hop withdrawn",
        r.until_hops(VIP4, &["node-a", "node-c"], t, WITHDRAWN_WITHIN),
    );
    r.until_hops(VIP6, &["node-a", "node-c"], t, WITHDRAWN_WITHIN);

    // SIGKILL with no service manager: the address stays until its
    // lifetime runs out, then the kernel drops it and the route goes.
    let lifetime = Duration::from_secs(6);
    assert_eq!(r.c.lifetime, "6s");
    let t = Instant::now();
    r.c.kill("node-c");
    let gone = r.until_hops(VIP4, &["node-a"], t, lifetime + WITHDRAWN_WITHIN);
    note("SIGKILL, unsupervised -> next hop withdrawn", gone);
    assert!(gone <= lifetime + Duration::from_secs(1), "{gone:?}");
    r.until_hops(VIP6, &["node-a"], t, lifetime + WITHDRAWN_WITHIN);
    r.c.start("node-b");
    r.c.start("node-c");
    r.until_hops(VIP4, &NODES, Instant::now(), Duration::from_secs(20));

    // externalTrafficPolicy: Local: only nodes with an endpoint, and the
    // route follows the endpoint.
    let t = r.c.service(
        "local",
        &[LOCAL4],
        &["node-b"],
        "externalTrafficPolicy: Local",
    );
    note(
        "Local Service created -> route to its endpoint's node",
        r.until_hops(LOCAL4, &["node-b"], t, Duration::from_secs(30)),
    );
    wait_for(
        "the Local Service's virtual annotation",
        Duration::from_secs(10),
        || (r.c.annotation("local", "hostlb.io/announcing-virtual-IPv4") == "node-b").then_some(()),
    )
    .unwrap();
    let t = Instant::now();
    r.c.endpoints("local", &["node-c"]);
    note(
        "endpoint moved -> route follows",
        r.until_hops(LOCAL4, &["node-c"], t, WITHDRAWN_WITHIN),
    );
    assert_eq!(r.c.holders(LOCAL4), vec!["node-c".to_string()]);
    let t = Instant::now();
    r.c.endpoints("local", &[]);
    note(
        "last endpoint gone -> route withdrawn",
        r.until_hops(LOCAL4, &[], t, WITHDRAWN_WITHIN),
    );

    // Deleting the Services withdraws everything.
    let t = Instant::now();
    r.c.kubectl(&["delete", "service", "web", "local"]);
    note(
        "Service deleted -> routes withdrawn",
        r.until_hops(VIP4, &[], t, WITHDRAWN_WITHIN),
    );
    r.until_hops(VIP6, &[], t, WITHDRAWN_WITHIN);
    for n in NODES {
        let out = r.c.host(n).ns.ip("-o addr show dev kube-lb0").unwrap();
        assert!(!out.contains("10.99.0."), "{n}: {out}");
    }
    eprintln!("{}: {}", r.label, figures.join("; "));
}

#[test]
fn bird_on_the_hosts_frr_on_the_router() {
    scenario(Daemon::Bird, Daemon::Frr);
}

#[test]
fn frr_on_the_hosts_bird_on_the_router() {
    scenario(Daemon::Frr, Daemon::Bird);
}
