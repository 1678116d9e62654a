//! The userspace switch on the real kernel: it carries what the bridge
//! carries (ARP, neighbour discovery, TCP with its checksums, UDP), applies
//! each fault where it is set and nowhere else, and adds little latency.
//! Needs root (network namespaces) and `ethtool`; fails without them.

use std::time::Duration;

use hostlb_tests::netns::{Lan, require_root, require_tools};
use hostlb_tests::switch::{Dir, LinkFaults};

fn pings(lan: &Lan, from: &str, to: &str, count: u32) -> Vec<Option<f64>> {
    lan.round_trips(from, to, count)
        .into_iter()
        .map(|d| d.map(|d| d.as_secs_f64() * 1e6))
        .collect()
}

#[test]
fn a_switched_lan_carries_neighbour_discovery_tcp_and_udp() {
    require_root();
    require_tools(&["ethtool", "ping", "ndisc6", "python3"]);
    let lan = Lan::switched(&["a", "b"], 1).unwrap();
    let (a, b) = (lan.host("a"), lan.host("b"));
    // ARP and ICMP.
    assert!(pings(&lan, "a", "b", 5).iter().all(Option::is_some));
    // Neighbour discovery.
    let nd =
        a.ns.run(&["ndisc6", "-1", "-r", "3", &b.ipv6.to_string(), "eth0"])
            .unwrap();
    assert!(nd.to_lowercase().contains(&b.mac), "{nd}");
    // A megabyte over TCP, whose checksums the hosts computed themselves
    // (no offload left half done), and a datagram to the gossip port.
    let script = format!(
        r#"
import socket, threading
srv = socket.socket(); srv.bind(("{b4}", 9000)); srv.listen(1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("{b4}", 7934)); u.settimeout(5)
def serve():
    c, _ = srv.accept(); n = 0
    while True:
        d = c.recv(65536)
        if not d: break
        n += len(d)
    print("tcp", n); c.close()
t = threading.Thread(target=serve); t.start()
print("udp", len(u.recv(2000)))
t.join()
"#,
        b4 = b.ipv4
    );
    let server =
        b.ns.command("python3", &["-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let client = format!(
        r#"
import socket
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.sendto(b"x" * 1400, ("{b4}", 7934))
c = socket.create_connection(("{b4}", 9000)); c.sendall(b"y" * 1048576); c.close()
"#,
        b4 = b.ipv4
    );
    a.ns.run(&["python3", "-c", &client]).unwrap();
    let out = server.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("udp 1400"), "{text}");
    assert!(text.contains("tcp 1048576"), "{text}");
}

#[test]
fn faults_apply_per_link_and_direction_and_clear() {
    require_root();
    require_tools(&["ethtool", "ping"]);
    let lan = Lan::switched(&["a", "b", "c"], 2).unwrap();
    let wire = lan.wire.as_ref().unwrap();
    // Everything out of a lost: a reaches nobody, b and c each other.
    wire.set(
        "a",
        Dir::FromHost,
        LinkFaults {
            loss: 1.0,
            ..Default::default()
        },
    );
    assert!(pings(&lan, "a", "b", 3).iter().all(Option::is_none));
    assert!(pings(&lan, "b", "c", 3).iter().all(Option::is_some));
    wire.set("a", Dir::FromHost, LinkFaults::default());
    assert!(pings(&lan, "a", "b", 3).iter().all(Option::is_some));
    // Delay into b: every round trip with b takes it once.
    wire.set(
        "b",
        Dir::ToHost,
        LinkFaults {
            delay: Duration::from_millis(40),
            ..Default::default()
        },
    );
    let rtt: Vec<f64> = pings(&lan, "a", "b", 5).into_iter().flatten().collect();
    assert_eq!(rtt.len(), 5);
    assert!(
        rtt.iter().all(|us| (40_000.0..60_000.0).contains(us)),
        "{rtt:?}"
    );
    let rtt: Vec<f64> = pings(&lan, "a", "c", 5).into_iter().flatten().collect();
    assert!(
        rtt.iter().all(|us| *us < 20_000.0),
        "c is not delayed: {rtt:?}"
    );
    wire.set("b", Dir::ToHost, LinkFaults::default());
    // A one-way cut: a's frames do not reach c, c's reach a (the ping's
    // echo needs both ways, so it fails; the counts tell the way).
    let id = wire.cut(&["a"], &["c"], false);
    let cut_before = wire.stats.cut.load(std::sync::atomic::Ordering::Relaxed);
    assert!(pings(&lan, "a", "c", 3).iter().all(Option::is_none));
    assert!(wire.stats.cut.load(std::sync::atomic::Ordering::Relaxed) > cut_before);
    assert!(pings(&lan, "a", "b", 3).iter().all(Option::is_some));
    wire.heal(id);
    assert!(pings(&lan, "a", "c", 3).iter().all(Option::is_some));
    // A gossip-only cut leaves ICMP alone.
    let id = wire.cut(&["a"], &["b"], true);
    assert!(pings(&lan, "a", "b", 3).iter().all(Option::is_some));
    wire.heal(id);
    assert!(wire.is_clear());
}
