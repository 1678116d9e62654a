//! Forged claims on the wire, as an attacker sends them: gratuitous ARP
//! replies for IPv4 addresses and unsolicited Neighbor Advertisements for
//! IPv6 ones, each from a new random MAC, at a set rate out of one
//! interface. What a host of the LAN (or a pod with `CAP_NET_RAW` on a
//! node, through its veth) can send; with a hop limit below 255 an
//! advertisement is what a packet routed from anywhere would look like.
//!
//! Like the prober (`probe`), a few lines of Python on a raw `AF_PACKET`
//! socket.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::netns::{Netns, NetnsError, Result};

/// A flood under way; killed if dropped before [`Flood::wait`].
pub struct Flood {
    child: Option<Child>,
    what: String,
}

impl Flood {
    /// Sends `count` frames out of `interface` of `ns` over `over`,
    /// claiming `targets` in turn (IPv4: an ARP reply; IPv6: an
    /// advertisement to all nodes with hop limit `hop_limit`), each from a
    /// fresh locally administered MAC. Returns once it sends.
    pub fn start(
        ns: &Netns,
        interface: &str,
        targets: &[&str],
        hop_limit: u8,
        count: u64,
        over: Duration,
    ) -> Result<Flood> {
        let what = format!("python3 (flood of {count} claims on {})", targets.join(","));
        let secs = format!("{:.3}", over.as_secs_f64());
        let argv = [
            "-u",
            "-c",
            FLOOD,
            interface,
            &targets.join(","),
            &hop_limit.to_string(),
            &count.to_string(),
            &secs,
        ];
        let mut child = ns
            .command("python3", &argv)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| NetnsError::Spawn {
                command: what.clone(),
                source,
            })?;
        let mut line = String::new();
        let stdout = child.stdout.as_mut().expect("piped");
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|source| NetnsError::Spawn {
                command: what.clone(),
                source,
            })?;
        if line.trim() != "sending" {
            let _ = child.kill();
            return Err(NetnsError::Spawn {
                command: what,
                source: std::io::Error::other(format!("did not start: {line:?}")),
            });
        }
        Ok(Flood {
            child: Some(child),
            what,
        })
    }

    /// Waits for the flood to end; the frames it sent.
    pub fn wait(mut self) -> Result<u64> {
        let mut child = self.child.take().expect("once");
        let mut rest = String::new();
        if let Some(out) = child.stdout.as_mut() {
            let _ = std::io::Read::read_to_string(out, &mut rest);
        }
        let status = child.wait().map_err(|source| NetnsError::Spawn {
            command: self.what.clone(),
            source,
        })?;
        rest.lines()
            .find_map(|l| l.strip_prefix("sent "))
            .and_then(|n| n.trim().parse().ok())
            .filter(|_| status.success())
            .ok_or_else(|| NetnsError::Spawn {
                command: self.what.clone(),
                source: std::io::Error::other(format!("{status}: {rest:?}")),
            })
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

const FLOOD: &str = r#"
import os, socket, struct, sys, time
iface, targets, hop, count, secs = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
def csum(b):
    if len(b) % 2:
        b += b"\0"
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while t >> 16:
        t = (t & 0xffff) + (t >> 16)
    return (~t) & 0xffff
ALL = socket.inet_pton(socket.AF_INET6, "ff02::1")
def frame(target, mac):
    if ":" in target:
        src = b"\xfe\x80" + b"\0" * 6 + mac[:3] + b"\xff\xfe" + mac[3:]
        tgt = socket.inet_pton(socket.AF_INET6, target)
        icmp = struct.pack("!BBHI", 136, 0, 0, 0x20000000) + tgt + b"\x02\x01" + mac
        pseudo = src + ALL + struct.pack("!IxxxB", len(icmp), 58)
        icmp = icmp[:2] + struct.pack("!H", csum(pseudo + icmp)) + icmp[4:]
        ip6 = struct.pack("!IHBB", 6 << 28, len(icmp), 58, hop) + src + ALL
        return b"\x33\x33\x00\x00\x00\x01" + mac + b"\x86\xdd" + ip6 + icmp
    ip = socket.inet_aton(target)
    f = (b"\xff" * 6 + mac + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 2)
         + mac + ip + mac + ip)
    return f + b"\0" * (60 - len(f))
print("sending", flush=True)
start, sent = time.monotonic(), 0
for i in range(count):
    mac = b"\x02" + os.urandom(5)
    try:
        s.send(frame(targets[i % len(targets)], mac))
        sent += 1
    except OSError:
        pass
    if i % 50 == 0:
        ahead = start + secs * (i + 1) / count - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
print("sent %d" % sent, flush=True)
"#;

/// Datagrams of `size` bytes to `to` from `ns`, `count` of them over
/// `over`: what anyone who reaches a UDP port can send. Each starts with
/// `prefix` (a protocol's magic, so a receiver must look further) and is
/// random after it. Returns once it sends; [`Flood::wait`] gives the count.
pub fn udp(
    ns: &Netns,
    to: std::net::SocketAddr,
    prefix: &[u8],
    size: usize,
    count: u64,
    over: Duration,
) -> Result<Flood> {
    let what = format!("python3 (flood of {count} datagrams to {to})");
    let argv = [
        "-u",
        "-c",
        UDP_FLOOD,
        &to.ip().to_string(),
        &to.port().to_string(),
        &prefix
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>(),
        &size.to_string(),
        &count.to_string(),
        &format!("{:.3}", over.as_secs_f64()),
    ];
    let mut child = ns
        .command("python3", &argv)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|source| NetnsError::Spawn {
            command: what.clone(),
            source,
        })?;
    let mut line = String::new();
    let stdout = child.stdout.as_mut().expect("piped");
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|source| NetnsError::Spawn {
            command: what.clone(),
            source,
        })?;
    if line.trim() != "sending" {
        let _ = child.kill();
        return Err(NetnsError::Spawn {
            command: what,
            source: std::io::Error::other(format!("did not start: {line:?}")),
        });
    }
    Ok(Flood {
        child: Some(child),
        what,
    })
}

const UDP_FLOOD: &str = r#"
import os, socket, sys, time
host, port, prefix, size, count, secs = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
s = socket.socket(family, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
payloads = [prefix + os.urandom(size - len(prefix)) for _ in range(16)]
print("sending", flush=True)
start, sent = time.monotonic(), 0
for i in range(count):
    try:
        s.sendto(payloads[i % len(payloads)], (host, port))
        sent += 1
    except OSError:
        pass
    if i % 20 == 0:
        ahead = start + secs * (i + 1) / count - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
print("sent %d" % sent, flush=True)
"#;
