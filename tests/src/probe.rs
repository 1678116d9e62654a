//! A client's view of a VIP on the wire: a broadcast ARP request (IPv4) or a
//! multicast neighbour solicitation (IPv6) every few milliseconds, so every
//! host that would answer does, and which MAC answered each, with the time
//! it arrived. Tests and benchmarks judge
//! failover by this, not by what an agent believes.
//!
//! The prober is a few lines of Python on a raw `AF_PACKET` socket: iputils
//! `arping` cannot probe faster than once a second, and Python's standard
//! library has packet sockets without any unsafe code here.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::netns::{Netns, NetnsError, Result};

/// One reply: when it was read and the MAC that sent it (lower-case).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub at: Instant,
    pub mac: String,
}

/// What the prober saw, stamped by the prober itself when it sent and
/// when it read, so a test process slow to read the lines does not move
/// them in time.
#[derive(Default)]
struct Seen {
    sent: Vec<Instant>,
    replies: Vec<Reply>,
}

/// A running probe; stops (kills the prober) on drop.
pub struct ArpProbe {
    child: Script,
    seen: Arc<Mutex<Seen>>,
    pub interval: Duration,
    pub started: Instant,
}

impl ArpProbe {
    /// Probes `ip` (IPv4 or IPv6) from `ns` out of `interface` (whose
    /// address of the same family is `source`) every `interval`.
    pub fn start(
        ns: &Netns,
        interface: &str,
        source: &str,
        ip: &str,
        interval: Duration,
    ) -> Result<ArpProbe> {
        Self::spawn(ns, interface, source, ip, interval, None)
    }

    /// [`ArpProbe::start`], stalling after every `stall_every`th request
    /// when given (see [`PROBER`]).
    fn spawn(
        ns: &Netns,
        interface: &str,
        source: &str,
        ip: &str,
        interval: Duration,
        stall_every: Option<u32>,
    ) -> Result<ArpProbe> {
        let secs = format!("{:.4}", interval.as_secs_f64());
        let stall = stall_every.map(|n| n.to_string());
        let mut args = vec![interface, source, ip, &secs];
        args.extend(stall.as_deref());
        let (child, stdout) = python(ns, "ARP prober", PROBER, &args)?;
        let clock = Clock::new();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let sink = seen.clone();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                let at = stamp(&line).map_or_else(Instant::now, |t| clock.at(t));
                let mut seen = sink.lock().unwrap_or_else(|e| e.into_inner());
                if line.starts_with("sent") {
                    seen.sent.push(at);
                } else if let Some(mac) = parse_reply(&line) {
                    seen.replies.push(Reply { at, mac });
                }
            }
        });
        let mut probe = ArpProbe {
            child,
            seen,
            interval,
            started: Instant::now(),
        };
        probe.wait_first_request(ip)?;
        Ok(probe)
    }

    /// Returns once the prober has sent its first request; an error when
    /// it died first (a source address of the wrong family, say), so a test
    /// never reads "nobody answered" off a prober that never asked.
    fn wait_first_request(&mut self, ip: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if !self
                .seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .sent
                .is_empty()
            {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.0.try_wait() {
                return Err(NetnsError::Failed {
                    command: format!("python3 (ARP prober for {ip})"),
                    status: status.to_string(),
                    stderr: "it exited before sending a request (see its traceback above)".into(),
                });
            }
            if Instant::now() >= deadline {
                return Err(NetnsError::Timeout {
                    what: format!("the prober for {ip} to send its first request"),
                    after: Duration::from_secs(10),
                });
            }
            thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn replies(&self) -> Vec<Reply> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replies
            .clone()
    }

    /// When each request went out.
    pub fn sent(&self) -> Vec<Instant> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sent
            .clone()
    }

    /// What the client saw from `t0` to `end`, counting as lost only
    /// requests it sent that went unanswered.
    pub fn judge(&self, t0: Instant, end: Instant) -> Outcome {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        judge(&seen.replies, Some(&seen.sent), t0, end, self.interval)
    }

    /// Replies received since `t`.
    pub fn since(&self, t: Instant) -> Vec<Reply> {
        self.replies().into_iter().filter(|r| r.at >= t).collect()
    }

    /// Waits until a reply from `mac` arrives after `t`; its arrival time.
    pub fn wait_for_mac(&self, mac: &str, t: Instant, timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.since(t).into_iter().find(|r| r.mac == mac) {
                return Some(r.at);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// The MACs that answered in `[from, to]`, in order of first reply.
    pub fn macs_between(&self, from: Instant, to: Instant) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in self.replies() {
            if r.at >= from && r.at <= to && !out.contains(&r.mac) {
                out.push(r.mac);
            }
        }
        out
    }
}

/// A client asking about many IPv4 addresses at once: one broadcast ARP
/// request for each every interval, and which MAC answered each, when.
/// For judging a failover of many VIPs by what the wire shows. Like
/// [`ArpProbe`], the sweeper stamps its rounds and replies itself, so a
/// request that went unanswered is told from a test process slow to read.
pub struct ArpSweep {
    /// Kept for its drop.
    _child: Script,
    seen: Arc<Mutex<Swept>>,
    pub interval: Duration,
}

/// When each round of requests went out, and each reply with the address
/// it is about.
#[derive(Default)]
struct Swept {
    rounds: Vec<Instant>,
    replies: Vec<(String, Reply)>,
}

impl ArpSweep {
    /// Asks about every one of `ips` (IPv4) from `ns` out of `interface`
    /// (whose IPv4 address is `source`) every `interval`.
    pub fn start(
        ns: &Netns,
        interface: &str,
        source: &str,
        ips: &[String],
        interval: Duration,
    ) -> Result<ArpSweep> {
        let secs = format!("{:.4}", interval.as_secs_f64());
        let targets = ips.join(",");
        let (child, stdout) = python(
            ns,
            "ARP sweeper",
            SWEEPER,
            &[interface, source, &targets, &secs],
        )?;
        let clock = Clock::new();
        let seen = Arc::new(Mutex::new(Swept::default()));
        let sink = seen.clone();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                let at = stamp(&line).map_or_else(Instant::now, |t| clock.at(t));
                let mut seen = sink.lock().unwrap_or_else(|e| e.into_inner());
                if line.starts_with("sent") {
                    seen.rounds.push(at);
                    continue;
                }
                let Some(mac) = parse_reply(&line) else {
                    continue;
                };
                let Some(ip) = line
                    .strip_prefix("reply from ")
                    .and_then(|r| r.split_whitespace().next())
                else {
                    continue;
                };
                seen.replies.push((ip.to_string(), Reply { at, mac }));
            }
        });
        Ok(ArpSweep {
            _child: child,
            seen,
            interval,
        })
    }

    /// The replies about `ip` so far.
    pub fn replies(&self, ip: &str) -> Vec<Reply> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replies
            .iter()
            .filter(|(i, _)| i == ip)
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// What a client asking about `ip` saw from `t0` to `end`, counting as
    /// lost only the requests the sweeper sent that went unanswered.
    pub fn judge(&self, ip: &str, t0: Instant, end: Instant) -> Outcome {
        let rounds = self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rounds
            .clone();
        judge(&self.replies(ip), Some(&rounds), t0, end, self.interval)
    }

    /// When each address was first answered by a MAC other than `old`
    /// after `t0`; `None` for one that was not (yet).
    pub fn moved(&self, ips: &[String], old: &str, t0: Instant) -> Vec<Option<Instant>> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        ips.iter()
            .map(|ip| {
                seen.replies
                    .iter()
                    .find(|(i, r)| i == ip && r.at >= t0 && r.mac != old)
                    .map(|(_, r)| r.at)
            })
            .collect()
    }
}

/// A host that answers ARP requests for addresses it holds only after a
/// delay, as a loaded host can (its network softirqs pushed to a kernel
/// thread that waits for the CPU like any other). The addresses are held
/// by the script, not the kernel. Stops on drop.
pub struct SlowOwner {
    /// Kept for its drop.
    _child: Script,
}

impl SlowOwner {
    /// Answers for `ips` (IPv4) on `interface` of `ns`, each answer sent
    /// `delay` after its request arrived; returns once it listens.
    pub fn start(
        ns: &Netns,
        interface: &str,
        ips: &[String],
        delay: Duration,
    ) -> Result<SlowOwner> {
        let secs = format!("{:.4}", delay.as_secs_f64());
        let (child, stdout) = python(
            ns,
            "slow ARP owner",
            SLOW_OWNER,
            &[interface, &ips.join(","), &secs],
        )?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|source| NetnsError::Spawn {
                command: "python3 (slow ARP owner)".into(),
                source,
            })?;
        if line.trim() != "ready" {
            return Err(NetnsError::Spawn {
                command: "python3 (slow ARP owner)".into(),
                source: std::io::Error::other(format!("did not start: {line:?}")),
            });
        }
        Ok(SlowOwner { _child: child })
    }
}

/// A running script, killed when dropped: each of the tools above stops
/// with its owner.
struct Script(Child);

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the Python `script` with `args` inside `ns`; the child and its
/// output.
fn python(
    ns: &Netns,
    what: &str,
    script: &str,
    args: &[&str],
) -> Result<(Script, std::process::ChildStdout)> {
    let script = format!("{PRELUDE}{script}");
    let mut argv = vec!["-u", "-c", &script];
    argv.extend_from_slice(args);
    let mut cmd = ns.command("python3", &argv);
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().map_err(|source| NetnsError::Spawn {
        command: format!("python3 ({what})"),
        source,
    })?;
    let stdout = child.stdout.take().expect("piped");
    Ok((Script(child), stdout))
}

/// Maps the prober's `time.monotonic()` readings to `Instant`s: both are
/// CLOCK_MONOTONIC on Linux, so one pair read together fixes the offset.
#[derive(Clone, Copy)]
struct Clock {
    anchor: Instant,
    mono: Duration,
}

impl Clock {
    fn new() -> Clock {
        let anchor = Instant::now();
        let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .expect("CLOCK_MONOTONIC is always readable");
        Clock {
            anchor,
            mono: Duration::from(ts),
        }
    }

    fn at(&self, secs: f64) -> Instant {
        let t = Duration::from_secs_f64(secs.max(0.0));
        match t.checked_sub(self.mono) {
            Some(after) => self.anchor + after,
            None => self.anchor - (self.mono - t),
        }
    }
}

/// The prober's own time at the end of a line (`... @123.456789`).
fn stamp(line: &str) -> Option<f64> {
    line.rsplit_once(" @")?.1.trim().parse().ok()
}

/// What a client saw across one event (a fault at `t0`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Longest silence between two replies after `t0` (or from `t0` to the
    /// first reply), less one probe interval: the time no owner answered.
    /// With the send times known, only a silence in which a request went
    /// unanswered counts (a prober that did not ask saw no outage).
    pub outage: Duration,
    /// Requests that got no answer in that window. With the send times
    /// known, counted one by one; without (the many-address sweep),
    /// estimated as the longest silence divided by the interval, minus one.
    pub lost: u64,
    /// How long two or more MACs answered the same probes: the probe
    /// periods with answers from more than one MAC, times the period.
    pub two_owners: Duration,
    /// The MAC answering at the end.
    pub last_mac: Option<String>,
    /// When each request that got no answer went, after `t0` (with the
    /// send times known): to place a loss against the agents' logs.
    pub unanswered: Vec<Duration>,
}

/// Judges the replies after `t0` up to `end`; `sent`, when known, are the
/// times the requests went out.
pub fn judge(
    replies: &[Reply],
    sent: Option<&[Instant]>,
    t0: Instant,
    end: Instant,
    interval: Duration,
) -> Outcome {
    let window: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.at >= t0 && r.at <= end)
        .collect();
    let unanswered = sent.map(|sent| unanswered(sent, &window, t0, end, interval));
    let mut longest = Duration::ZERO;
    let mut prev = t0;
    let bounds = window.iter().map(|r| r.at).chain([end]);
    for at in bounds {
        // `unanswered` is in time order: is one of them in [prev, at)?
        let counts = unanswered.as_ref().is_none_or(|u| {
            u.get(u.partition_point(|&s| s < prev))
                .is_some_and(|&s| s < at)
        });
        if counts {
            longest = longest.max(at.saturating_duration_since(prev));
        }
        prev = at;
    }
    let last_mac = window.last().map(|r| r.mac.clone());
    let two_owners = overlap(&window, t0, interval);
    let step = interval.as_nanos().max(1);
    let lost = match &unanswered {
        Some(u) => u.len() as u64,
        None => (longest.as_nanos() / step).saturating_sub(1) as u64,
    };
    Outcome {
        outage: longest.saturating_sub(interval),
        lost,
        two_owners,
        last_mac,
        unanswered: unanswered
            .unwrap_or_default()
            .iter()
            .map(|s| s.saturating_duration_since(t0))
            .collect(),
    }
}

/// The requests sent in `[t0, end - interval]` that no reply answered. A
/// reply answers a request when it arrives after it and before the next
/// one (or within an interval, when the prober sent the next one early).
/// Both lists are in the prober's time order, so each request looks up
/// its first reply by bisection.
fn unanswered(
    sent: &[Instant],
    window: &[&Reply],
    t0: Instant,
    end: Instant,
    interval: Duration,
) -> Vec<Instant> {
    let mut out = Vec::new();
    for (i, &s) in sent.iter().enumerate() {
        if s < t0 || s + interval > end {
            continue;
        }
        let until = sent
            .get(i + 1)
            .map_or(s + interval, |&n| n.max(s + interval));
        let first = window.partition_point(|r| r.at < s);
        if window.get(first).is_none_or(|r| r.at >= until) {
            out.push(s);
        }
    }
    out
}

/// The probe periods (from `t0`, `interval` long) in which more than one
/// MAC answered, as a duration: every owner answers the same broadcast
/// within a millisecond or so, so two owners share a period.
pub fn overlap(replies: &[&Reply], t0: Instant, interval: Duration) -> Duration {
    let step = interval.as_nanos().max(1);
    let mut periods: std::collections::BTreeMap<u128, Vec<&str>> = Default::default();
    for r in replies {
        let k = r.at.saturating_duration_since(t0).as_nanos() / step;
        let macs = periods.entry(k).or_default();
        if !macs.contains(&r.mac.as_str()) {
            macs.push(&r.mac);
        }
    }
    let shared = periods.values().filter(|m| m.len() > 1).count() as u32;
    interval * shared
}

/// What both scripts share: `listen(s)` has the kernel stamp each packet
/// `s` receives, and `receive(s)` returns one with the monotonic time it
/// reached the host. An answer is stamped when it arrived, not when the
/// script read it: a script the scheduler left off the CPU right after a
/// request read its answer as late as the stall, and the silence before
/// it looked longer than the wire's.
const PRELUDE: &str = r#"
import select, socket, struct, sys, time
SO_TIMESTAMPNS = 35
def listen(s):
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
def receive(s):
    p, anc, _, _ = s.recvmsg(512, socket.CMSG_SPACE(16))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = struct.unpack("qq", data[:16])
            return p, sec + nsec / 1e9 - (time.time() - time.monotonic())
    return p, time.monotonic()
"#;

/// Sends a request for the target every interval and prints one line per
/// request, `sent @T`, and per answer, `reply from IP [MAC] @T`, T being
/// its monotonic clock when it sent, or when the answer reached the host
/// (see [`PRELUDE`]). IPv4: a broadcast ARP request. IPv6: a neighbour
/// solicitation to the target's solicited-node group (hop limit 255, with
/// our link-layer address), answered by a neighbour advertisement whose
/// target link-layer option names the MAC. An optional fifth argument N
/// stalls the prober 60 ms after every Nth request, as a busy machine's
/// scheduler may.
const PROBER: &str = r#"
iface, src, dst, interval = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
stall_every = int(sys.argv[5]) if len(sys.argv) > 5 else 0
sends = 0
if ":" not in dst:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
    s.bind((iface, 0x0806))
    mac = s.getsockname()[4]
    src_b, dst_b = socket.inet_aton(src), socket.inet_aton(dst)
    frame = (b"\xff" * 6 + mac + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1)
             + mac + src_b + b"\x00" * 6 + dst_b)
    frame += b"\x00" * (60 - len(frame))
    def send():
        s.send(frame)
    def answer(p):
        if len(p) >= 42 and p[20:22] == b"\x00\x02" and p[28:32] == dst_b:
            return p[22:28]
else:
    ifindex = socket.if_nametoindex(iface)
    with open("/sys/class/net/%s/address" % iface) as f:
        mac = bytes.fromhex(f.read().strip().replace(":", ""))
    s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 255)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, ifindex)
    s.bind((src, 0, 0, ifindex))
    dst_b = socket.inet_pton(socket.AF_INET6, dst)
    group = socket.inet_ntop(socket.AF_INET6, bytes.fromhex("ff02" + "00" * 9 + "01ff") + dst_b[13:])
    ns = struct.pack("!BBHI", 135, 0, 0, 0) + dst_b + bytes([1, 1]) + mac
    def send():
        s.sendto(ns, (group, 0, 0, ifindex))
    def answer(p):
        if len(p) >= 24 and p[0] == 136 and p[8:24] == dst_b:
            o = 24
            while o + 8 <= len(p):
                if p[o] == 2:
                    return p[o + 2:o + 8]
                if p[o + 1] == 0:
                    break
                o += 8 * p[o + 1]
listen(s)
due = time.monotonic()
while True:
    now = time.monotonic()
    if now >= due:
        try:
            # Stamped before it goes: an answer may arrive before send()
            # returns, and it must not look older than its request.
            at = time.monotonic()
            send()
            sys.stdout.write("sent @%.6f\n" % at)
            sys.stdout.flush()
            sends += 1
            if stall_every and sends % stall_every == 0:
                time.sleep(0.06)
        except OSError:
            pass
        due = max(due + interval, now)
    ready, _, _ = select.select([s], [], [], max(0.0, due - time.monotonic()))
    if ready:
        p, at = receive(s)
        m = answer(p)
        if m:
            sys.stdout.write("reply from %s [%s] @%.6f\n" % (dst, m.hex(":"), at))
            sys.stdout.flush()
"#;

/// [`PROBER`] for many IPv4 targets: every interval one broadcast request
/// for each (a `sent` line per round), and one line per answer naming the
/// address it is about, each stamped when it was sent or arrived.
const SWEEPER: &str = r#"
iface, src, dsts, interval = sys.argv[1], sys.argv[2], sys.argv[3].split(","), float(sys.argv[4])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
s.bind((iface, 0x0806))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
listen(s)
mac = s.getsockname()[4]
src_b = socket.inet_aton(src)
head = b"\xff" * 6 + mac + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + src_b + b"\x00" * 6
frames = []
for d in dsts:
    f = head + socket.inet_aton(d)
    frames.append(f + b"\x00" * (60 - len(f)))
wanted = {socket.inet_aton(d): d for d in dsts}
due = time.monotonic()
while True:
    now = time.monotonic()
    if now >= due:
        sent = time.monotonic()
        ok = True
        for f in frames:
            try:
                s.send(f)
            except OSError:
                ok = False
        if ok:
            sys.stdout.write("sent @%.6f\n" % sent)
        due = max(due + interval, now)
    ready, _, _ = select.select([s], [], [], max(0.0, due - time.monotonic()))
    while ready:
        p, at = receive(s)
        if len(p) >= 42 and p[20:22] == b"\x00\x02" and p[28:32] in wanted:
            sys.stdout.write("reply from %s [%s] @%.6f\n" % (wanted[p[28:32]], p[22:28].hex(":"), at))
        ready, _, _ = select.select([s], [], [], 0)
    sys.stdout.flush()
"#;

/// [`SlowOwner`]: a reply to every ARP request (a probe's, from 0.0.0.0,
/// too) for one of its addresses, sent `delay` after the request arrived.
const SLOW_OWNER: &str = r#"
import heapq
iface, ips, delay = sys.argv[1], sys.argv[2].split(","), float(sys.argv[3])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
s.bind((iface, 0x0806))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
listen(s)
mac = s.getsockname()[4]
owned = {socket.inet_aton(i) for i in ips}
due = []
sys.stdout.write("ready\n")
sys.stdout.flush()
while True:
    wait = max(0.0, due[0][0] - time.monotonic()) if due else None
    ready, _, _ = select.select([s], [], [], wait)
    while ready:
        p, at = receive(s)
        if len(p) >= 42 and p[6:12] != mac and p[20:22] == b"\x00\x01" and p[38:42] in owned:
            asker, asker_ip, ip = p[22:28], p[28:32], p[38:42]
            f = asker + mac + b"\x08\x06" + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 2) + mac + ip + asker + asker_ip
            heapq.heappush(due, (at + delay, f + b"\x00" * (60 - len(f))))
        ready, _, _ = select.select([s], [], [], 0)
    now = time.monotonic()
    while due and due[0][0] <= now:
        s.send(heapq.heappop(due)[1])
"#;

/// `reply from 10.77.0.100 [02:aa:bb:cc:dd:ee]` (also arping's form,
/// `Unicast reply from 10.77.0.100 [02:AA:BB:CC:DD:EE]  0.712ms`).
fn parse_reply(line: &str) -> Option<String> {
    if !line.contains("reply from") {
        return None;
    }
    let start = line.find('[')? + 1;
    let end = start + line[start..].find(']')?;
    Some(line[start..end].to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_arping_replies() {
        assert_eq!(
            parse_reply("Unicast reply from 10.77.0.100 [02:AA:BB:CC:DD:EE]  0.712ms"),
            Some("02:aa:bb:cc:dd:ee".into())
        );
        assert_eq!(
            parse_reply("Broadcast reply from 10.77.0.100 [02:aa:bb:cc:dd:ee]  1.0ms"),
            Some("02:aa:bb:cc:dd:ee".into())
        );
        assert_eq!(parse_reply("ARPING 10.77.0.100 from 10.77.0.15 eth0"), None);
    }

    /// A prober the scheduler leaves off the CPU right after a request
    /// reads the answer late; stamped when read, the answer looked as late
    /// as the stall, and a silence the wire never had counted toward an
    /// outage. Stamped when it reached the host, each answer follows its
    /// request by the wire's round trip. IPv4 and IPv6.
    #[test]
    fn a_stalled_prober_stamps_answers_when_they_arrived() {
        crate::netns::require_root();
        let lan = crate::netns::Lan::new(&["a", "client"]).unwrap();
        let (a, client) = (lan.host("a"), lan.host("client"));
        let every = Duration::from_millis(10);
        for (target, source) in [
            (a.ipv4.to_string(), client.ipv4.to_string()),
            (a.ipv6.to_string(), client.ipv6.to_string()),
        ] {
            let p = ArpProbe::spawn(&client.ns, "eth0", &source, &target, every, Some(5)).unwrap();
            let t0 = Instant::now();
            thread::sleep(Duration::from_millis(700));
            let end = Instant::now();
            // What the prober read after `end` was stamped before it.
            thread::sleep(Duration::from_millis(200));
            let seen = p.seen.lock().unwrap();
            let sent: Vec<Instant> = seen.sent.iter().copied().filter(|s| *s >= t0).collect();
            assert!(sent.len() >= 20, "{target}: {} requests", sent.len());
            let late = seen
                .replies
                .iter()
                .filter(|r| r.at >= t0 && r.at <= end)
                .filter_map(|r| {
                    let asked = sent.iter().rev().find(|s| **s <= r.at)?;
                    Some(r.at.duration_since(*asked))
                })
                .max()
                .unwrap();
            assert!(
                late < Duration::from_millis(5),
                "{target}: an answer stamped {late:?} after its request, 60 ms stalls and all"
            );
            drop(seen);
            let o = p.judge(t0, end);
            assert_eq!((o.lost, o.outage), (0, Duration::ZERO), "{target}: {o:?}");
        }
    }

    #[test]
    fn judges_outage_and_overlap() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let r = |n: u64, mac: &str| Reply {
            at: ms(n),
            mac: mac.into(),
        };
        let iv = Duration::from_millis(10);
        // Old answers until 20 ms, silence, new from 320 ms on.
        let replies = vec![r(10, "a"), r(20, "a"), r(320, "b"), r(330, "b")];
        let o = judge(&replies, None, t0, ms(335), iv);
        assert_eq!(o.outage, Duration::from_millis(290));
        assert_eq!(o.lost, 29);
        assert_eq!(o.two_owners, Duration::ZERO);
        assert_eq!(o.last_mac.as_deref(), Some("b"));
        // Make before break: both answer the probes of 100 to 130 ms.
        let mut replies = vec![r(90, "a")];
        for n in [100, 110, 120] {
            replies.extend([r(n + 1, "a"), r(n + 2, "b")]);
        }
        replies.push(r(135, "b"));
        let o = judge(&replies, None, t0, ms(140), iv);
        assert_eq!(o.two_owners, Duration::from_millis(30));
        assert_eq!(o.last_mac.as_deref(), Some("b"));
        // Alternating, each answering other probes, is not overlap.
        let replies = vec![r(5, "a"), r(15, "b"), r(25, "a")];
        assert_eq!(
            judge(&replies, None, t0, ms(30), iv).two_owners,
            Duration::ZERO
        );
    }

    #[test]
    fn with_send_times_a_prober_that_did_not_ask_lost_nothing() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let r = |n: u64| Reply {
            at: ms(n),
            mac: "a".into(),
        };
        let iv = Duration::from_millis(10);
        // The prober stalled from 30 to 80 ms: no request, so no loss,
        // although no reply came for 50 ms.
        let sent: Vec<Instant> = [0, 10, 20, 80, 90].map(ms).to_vec();
        let replies = vec![r(1), r(11), r(21), r(81), r(91)];
        let o = judge(&replies, Some(&sent), t0, ms(101), iv);
        assert_eq!(o.lost, 0, "{o:?}");
        assert_eq!(o.outage, Duration::ZERO, "{o:?}");
        // Without the send times the same silence reads as five lost.
        assert_eq!(judge(&replies, None, t0, ms(101), iv).lost, 5);
        // Requests at 30..=60 unanswered: four lost, silence 21 to 71.
        let sent: Vec<Instant> = (0..10).map(|i| ms(i * 10)).collect();
        let replies: Vec<Reply> = [0, 1, 2, 7, 8, 9].map(|i| r(i * 10 + 1)).to_vec();
        let o = judge(&replies, Some(&sent), t0, ms(101), iv);
        assert_eq!(o.lost, 4, "{o:?}");
        assert_eq!(o.unanswered, [30, 40, 50, 60].map(Duration::from_millis));
        assert_eq!(o.outage, Duration::from_millis(40), "{o:?}");
        // A reply read late (the prober stalled after sending) still
        // answers its request.
        let sent: Vec<Instant> = [0, 40].map(ms).to_vec();
        let o = judge(&[r(35), r(41)], Some(&sent), t0, ms(51), iv);
        assert_eq!(o.lost, 0, "{o:?}");
        // The last request, not yet due an answer at the end, is not lost.
        let o = judge(&[r(1)], Some(&[ms(0), ms(10)]), t0, ms(15), iv);
        assert_eq!(o.lost, 0, "{o:?}");
    }

    #[test]
    fn reads_the_probers_stamps() {
        assert_eq!(stamp("sent @12.500000"), Some(12.5));
        assert_eq!(
            stamp("reply from 10.77.0.100 [02:aa:bb:cc:dd:ee] @3.25"),
            Some(3.25)
        );
        assert_eq!(
            parse_reply("reply from 10.77.0.100 [02:aa:bb:cc:dd:ee] @3.25").as_deref(),
            Some("02:aa:bb:cc:dd:ee")
        );
        let c = Clock::new();
        let later = c.at(c.mono.as_secs_f64() + 0.25);
        assert!(later.duration_since(c.anchor) >= Duration::from_millis(249));
        assert!(c.at(c.mono.as_secs_f64() - 0.25) < c.anchor);
    }
}
