//! A userspace Ethernet switch that can be broken: it stands where
//! [`Lan`](crate::netns::Lan)'s bridge would, forwards frames between the
//! hosts' veths, and applies faults per link and per direction, changeable
//! while it runs. This kernel has no `netem`; the fault campaign needs loss,
//! delay, jitter, duplication, reordering and partitions, and so does
//! anything that must be judged on a wire that misbehaves.
//!
//! It learns source MACs per port as a bridge does: a unicast frame to a
//! known MAC goes to its port, anything else to every other port. A frame
//! from host A to host B meets A's outbound faults, then B's inbound ones,
//! then the cuts (partitions) between A and B, each drawn from a seeded
//! generator. Delay is the two links' delays plus a uniform draw of their
//! jitter, so jitter reorders frames as a real path with queues of varying
//! depth does; `reorder` additionally holds a frame back by one more delay.
//!
//! What it adds to a frame's latency when no fault is set is measured by
//! the bench in `tests/tests/switch.rs` and written in docs/agent.md ("The
//! fault campaign").
//!
//! The decisions ([`Rules`]) are plain code, tested without a kernel; the
//! sockets are in [`port`].

mod port;

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::netns::{NetnsError, Result};
use crate::rng::Rng;

/// The gossip port (chitchat, the detector and the beats share it): what a
/// gossip-only cut drops.
pub const GOSSIP_PORT: u16 = 7934;

/// Faults on one direction of one link.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinkFaults {
    /// Probability that a frame is lost.
    pub loss: f64,
    /// Added to every frame.
    pub delay: Duration,
    /// A uniform draw in `0..jitter` added to every frame.
    pub jitter: Duration,
    /// Probability that a frame is sent twice (the copy 0-1 ms later).
    pub duplicate: f64,
    /// Probability that a frame is held back by `delay + jitter + 2 ms`
    /// more, so that the next ones overtake it.
    pub reorder: f64,
}

impl LinkFaults {
    pub fn is_clear(&self) -> bool {
        *self == LinkFaults::default()
    }
}

/// Which way along a host's link: out of the host, or into it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dir {
    FromHost,
    ToHost,
}

/// A partition: frames from any of `from` to any of `to` are dropped (all
/// of them, or only the gossip port's). Two cuts make it two-way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    pub from: BTreeSet<String>,
    pub to: BTreeSet<String>,
    pub gossip_only: bool,
}

/// Names a cut so it can be healed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CutId(u64);

/// What happens to one frame on its way from one port to another.
#[derive(Clone, Debug, PartialEq)]
pub enum Fate {
    /// Lost on a link.
    Lost,
    /// Dropped by a partition.
    Cut,
    /// Sent after each of these delays (two for a duplicate).
    Send(Vec<Duration>),
}

/// Every fault in force, and the seeded generator that draws them.
pub struct Rules {
    faults: HashMap<(String, Dir), LinkFaults>,
    cuts: BTreeMap<CutId, Cut>,
    next_cut: u64,
    rng: Rng,
}

impl Rules {
    pub fn new(seed: u64) -> Rules {
        Rules {
            faults: HashMap::new(),
            cuts: BTreeMap::new(),
            next_cut: 0,
            rng: Rng(seed),
        }
    }

    pub fn set(&mut self, port: &str, dir: Dir, faults: LinkFaults) {
        if faults.is_clear() {
            self.faults.remove(&(port.to_string(), dir));
        } else {
            self.faults.insert((port.to_string(), dir), faults);
        }
    }

    pub fn cut(&mut self, cut: Cut) -> CutId {
        let id = CutId(self.next_cut);
        self.next_cut += 1;
        self.cuts.insert(id, cut);
        id
    }

    pub fn heal(&mut self, id: CutId) {
        self.cuts.remove(&id);
    }

    /// Whether any fault or cut is in force.
    pub fn is_clear(&self) -> bool {
        self.faults.is_empty() && self.cuts.is_empty()
    }

    /// The fate of `frame` from the host on port `from` to the one on
    /// `to`.
    pub fn fate(&mut self, from: &str, to: &str, frame: &[u8]) -> Fate {
        if !self.cuts.is_empty() {
            let gossip = is_gossip(frame);
            let cut = self
                .cuts
                .values()
                .any(|c| c.from.contains(from) && c.to.contains(to) && (gossip || !c.gossip_only));
            if cut {
                return Fate::Cut;
            }
        }
        let none = LinkFaults::default();
        let out = self
            .faults
            .get(&(from.to_string(), Dir::FromHost))
            .unwrap_or(&none)
            .clone();
        let into = self
            .faults
            .get(&(to.to_string(), Dir::ToHost))
            .unwrap_or(&none)
            .clone();
        let mut delays = vec![Duration::ZERO];
        for f in [&out, &into] {
            if f.is_clear() {
                continue;
            }
            if f.loss > 0.0 && self.rng.chance(f.loss) {
                return Fate::Lost;
            }
            let mut d = f.delay;
            if !f.jitter.is_zero() {
                d += self.uniform(f.jitter);
            }
            if f.reorder > 0.0 && self.rng.chance(f.reorder) {
                d += f.delay + f.jitter + Duration::from_millis(2);
            }
            for total in &mut delays {
                *total += d;
            }
            if f.duplicate > 0.0 && self.rng.chance(f.duplicate) {
                let copy = delays[0] + self.uniform(Duration::from_millis(1));
                delays.push(copy);
            }
        }
        Fate::Send(delays)
    }

    fn uniform(&mut self, below: Duration) -> Duration {
        let n = below.as_nanos().max(1) as u64;
        Duration::from_nanos(self.rng.below(n))
    }
}

/// A UDP datagram to or from the gossip port, or a fragment that is not a
/// datagram's first (only gossip sends datagrams larger than a frame on
/// these LANs, so its later fragments go with it).
pub fn is_gossip(frame: &[u8]) -> bool {
    let Some(ethertype) = frame.get(12..14) else {
        return false;
    };
    let ports = |udp: &[u8]| {
        udp.len() >= 4
            && (u16::from_be_bytes([udp[0], udp[1]]) == GOSSIP_PORT
                || u16::from_be_bytes([udp[2], udp[3]]) == GOSSIP_PORT)
    };
    match ethertype {
        [0x08, 0x00] => {
            let Some(ip) = frame.get(14..) else {
                return false;
            };
            if ip.len() < 20 {
                return false;
            }
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            let offset = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
            if offset != 0 {
                return true;
            }
            ip[9] == 17 && ip.get(ihl..).is_some_and(ports)
        }
        [0x86, 0xdd] => {
            let Some(ip) = frame.get(14..) else {
                return false;
            };
            if ip.len() < 40 {
                return false;
            }
            match ip[6] {
                17 => ports(&ip[40..]),
                // A fragment header: the datagram's first fragment carries
                // the UDP header after it.
                44 => {
                    let offset = ip
                        .get(42..44)
                        .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]) >> 3);
                    offset != 0 || (ip[40] == 17 && ip.get(48..).is_some_and(ports))
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// Counts of what the switch did with frames.
#[derive(Debug, Default)]
pub struct Stats {
    pub received: AtomicU64,
    pub sent: AtomicU64,
    pub lost: AtomicU64,
    pub cut: AtomicU64,
    pub duplicated: AtomicU64,
    /// Sends the kernel refused (a port that is down, a full queue).
    pub send_errors: AtomicU64,
}

/// A running switch over some ports of one namespace. Stops on drop.
pub struct Switch {
    rules: Arc<Mutex<Rules>>,
    pub stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Host role to port name.
    ports: BTreeMap<String, String>,
}

impl Switch {
    /// Switches frames between `ports` (host role, port interface) of the
    /// namespace `ns`, drawing faults from `seed`. Returns once every port
    /// listens.
    pub fn start(ns: &str, ports: &[(String, String)], seed: u64) -> Result<Switch> {
        let rules = Arc::new(Mutex::new(Rules::new(seed)));
        let stats = Arc::new(Stats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let (name, ports) = (ns.to_string(), ports.to_vec());
            let (rules, stats, stop) = (rules.clone(), stats.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("switch-{name}"))
                .spawn(move || {
                    let ns = name;
                    let opened = crate::netns::enter(&ns).and_then(|()| {
                        ports
                            .iter()
                            .map(|(role, port)| {
                                port::Port::open(port)
                                    .map(|p| (role.clone(), p))
                                    .map_err(|e| NetnsError::Enter {
                                        name: ns.clone(),
                                        reason: format!("opening switch port {port}: {e}"),
                                    })
                            })
                            .collect::<Result<Vec<_>>>()
                    });
                    match opened {
                        Ok(open) => {
                            let _ = ready_tx.send(Ok(()));
                            port::realtime();
                            run(open, &rules, &stats, &stop);
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                })
                .map_err(|e| NetnsError::Enter {
                    name: ns.to_string(),
                    reason: format!("spawning the switch thread: {e}"),
                })?
        };
        ready_rx.recv().map_err(|_| NetnsError::Enter {
            name: ns.to_string(),
            reason: "the switch thread died".into(),
        })??;
        Ok(Switch {
            rules,
            stats,
            stop,
            thread: Some(thread),
            ports: ports.iter().cloned().collect(),
        })
    }

    fn rules(&self) -> std::sync::MutexGuard<'_, Rules> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the faults of `host`'s link in one direction (clear ones
    /// remove them).
    pub fn set(&self, host: &str, dir: Dir, faults: LinkFaults) {
        self.known(host);
        self.rules().set(host, dir, faults);
    }

    /// Drops frames from any host of `from` to any of `to` (only the
    /// gossip port's when `gossip_only`) until healed.
    pub fn cut(&self, from: &[&str], to: &[&str], gossip_only: bool) -> CutId {
        for h in from.iter().chain(to) {
            self.known(h);
        }
        self.rules().cut(Cut {
            from: from.iter().map(|s| s.to_string()).collect(),
            to: to.iter().map(|s| s.to_string()).collect(),
            gossip_only,
        })
    }

    pub fn heal(&self, id: CutId) {
        self.rules().heal(id);
    }

    /// Clears every fault and cut.
    pub fn clear(&self) {
        let mut rules = self.rules();
        rules.faults.clear();
        rules.cuts.clear();
    }

    pub fn is_clear(&self) -> bool {
        self.rules().is_clear()
    }

    fn known(&self, host: &str) {
        assert!(
            self.ports.contains_key(host),
            "no host {host:?} on this switch"
        );
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A frame waiting for its time, in order of that time and then of
/// arrival.
struct Due {
    at: Instant,
    seq: u64,
    to: usize,
    frame: Arc<[u8]>,
}

impl PartialEq for Due {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // A max-heap: the earliest first.
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// The switch's loop: waits for frames on every port or for the next
/// delayed frame's time, whichever comes first.
fn run(ports: Vec<(String, port::Port)>, rules: &Mutex<Rules>, stats: &Stats, stop: &AtomicBool) {
    let mut learned: HashMap<[u8; 6], usize> = HashMap::new();
    let mut due: BinaryHeap<Due> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut buf = vec![0u8; 65_536];
    let fds: Vec<_> = ports.iter().map(|(_, p)| p.fd()).collect();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while due.peek().is_some_and(|d| d.at <= now) {
            let d = due.pop().expect("peeked");
            send(&ports[d.to].1, &d.frame, stats);
        }
        // Wake at least every 100 ms to see `stop`.
        let wait = due
            .peek()
            .map_or(Duration::from_millis(100), |d| {
                d.at.saturating_duration_since(now)
            })
            .min(Duration::from_millis(100));
        let ready = match port::wait(&fds, wait) {
            Ok(r) => r,
            Err(_) => continue,
        };
        for i in ready {
            // Drain the port: every frame queued now.
            while let Some(n) = ports[i].1.recv(&mut buf) {
                stats.received.fetch_add(1, Ordering::Relaxed);
                let frame = &buf[..n];
                if n < 14 {
                    continue;
                }
                let src: [u8; 6] = frame[6..12].try_into().expect("six bytes");
                if src[0] & 1 == 0 {
                    learned.insert(src, i);
                }
                let dst: [u8; 6] = frame[..6].try_into().expect("six bytes");
                let outs: Vec<usize> = match learned.get(&dst) {
                    Some(&j) if dst[0] & 1 == 0 => {
                        if j == i {
                            continue;
                        }
                        vec![j]
                    }
                    _ => (0..ports.len()).filter(|&j| j != i).collect(),
                };
                let mut shared: Option<Arc<[u8]>> = None;
                let mut rules = rules.lock().unwrap_or_else(|e| e.into_inner());
                for j in outs {
                    let fate = if rules.is_clear() {
                        Fate::Send(vec![Duration::ZERO])
                    } else {
                        rules.fate(&ports[i].0, &ports[j].0, frame)
                    };
                    match fate {
                        Fate::Lost => {
                            stats.lost.fetch_add(1, Ordering::Relaxed);
                        }
                        Fate::Cut => {
                            stats.cut.fetch_add(1, Ordering::Relaxed);
                        }
                        Fate::Send(delays) => {
                            if delays.len() > 1 {
                                stats.duplicated.fetch_add(1, Ordering::Relaxed);
                            }
                            for d in delays {
                                // Undelayed frames go now: another link's
                                // delay is no queue of this one. (On one
                                // path the delay is constant but for its
                                // jitter and `reorder`.)
                                if d.is_zero() {
                                    send(&ports[j].1, frame, stats);
                                    continue;
                                }
                                let frame = shared.get_or_insert_with(|| Arc::from(frame)).clone();
                                seq += 1;
                                due.push(Due {
                                    at: Instant::now() + d,
                                    seq,
                                    to: j,
                                    frame,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
}

fn send(port: &port::Port, frame: &[u8], stats: &Stats) {
    if port.send(frame) {
        stats.sent.fetch_add(1, Ordering::Relaxed);
    } else {
        stats.send_errors.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp4(src_port: u16, dst_port: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[14 + 9] = 17;
        f[34..36].copy_from_slice(&src_port.to_be_bytes());
        f[36..38].copy_from_slice(&dst_port.to_be_bytes());
        f
    }

    fn udp6(dst_port: u16, fragment_offset: Option<u16>) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40 + 8 + 8];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        match fragment_offset {
            None => {
                f[14 + 6] = 17;
                f[14 + 42..14 + 44].copy_from_slice(&dst_port.to_be_bytes());
            }
            Some(off) => {
                f[14 + 6] = 44;
                f[14 + 40] = 17;
                f[14 + 42..14 + 44].copy_from_slice(&(off << 3).to_be_bytes());
                f[14 + 50..14 + 52].copy_from_slice(&dst_port.to_be_bytes());
            }
        }
        f
    }

    #[test]
    fn tells_gossip_from_the_rest() {
        assert!(is_gossip(&udp4(40000, GOSSIP_PORT)));
        assert!(is_gossip(&udp4(GOSSIP_PORT, 40000)));
        assert!(!is_gossip(&udp4(40000, 6443)));
        let mut later_fragment = udp4(1, 2);
        later_fragment[14 + 7] = 0x10;
        assert!(is_gossip(&later_fragment));
        assert!(is_gossip(&udp6(GOSSIP_PORT, None)));
        assert!(!is_gossip(&udp6(53, None)));
        assert!(is_gossip(&udp6(GOSSIP_PORT, Some(0))));
        assert!(!is_gossip(&udp6(53, Some(0))));
        assert!(is_gossip(&udp6(53, Some(100))));
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(!is_gossip(&arp));
        assert!(!is_gossip(&[0u8; 5]));
    }

    #[test]
    fn cuts_drop_one_way_and_gossip_only_cuts_spare_the_rest() {
        let mut r = Rules::new(1);
        let gossip = udp4(1, GOSSIP_PORT);
        let api = udp4(1, 6443);
        let id = r.cut(Cut {
            from: ["a".to_string()].into(),
            to: ["b".to_string()].into(),
            gossip_only: true,
        });
        assert_eq!(r.fate("a", "b", &gossip), Fate::Cut);
        assert_eq!(r.fate("a", "b", &api), Fate::Send(vec![Duration::ZERO]));
        assert_eq!(r.fate("b", "a", &gossip), Fate::Send(vec![Duration::ZERO]));
        r.heal(id);
        assert!(r.is_clear());
        r.cut(Cut {
            from: ["a".to_string()].into(),
            to: ["b".to_string(), "c".to_string()].into(),
            gossip_only: false,
        });
        assert_eq!(r.fate("a", "c", &api), Fate::Cut);
        assert_eq!(r.fate("c", "a", &api), Fate::Send(vec![Duration::ZERO]));
    }

    #[test]
    fn faults_are_drawn_from_the_seed_at_their_rates() {
        let faults = LinkFaults {
            loss: 0.2,
            delay: Duration::from_millis(5),
            jitter: Duration::from_millis(2),
            duplicate: 0.1,
            reorder: 0.0,
        };
        let draw = |seed| {
            let mut r = Rules::new(seed);
            r.set("a", Dir::FromHost, faults.clone());
            (0..10_000)
                .map(|_| r.fate("a", "b", &[0u8; 60]))
                .collect::<Vec<_>>()
        };
        let fates = draw(7);
        assert_eq!(fates, draw(7), "the same seed, the same fates");
        assert_ne!(fates, draw(8));
        let lost = fates.iter().filter(|f| **f == Fate::Lost).count();
        assert!((1_800..2_200).contains(&lost), "{lost} lost of 10,000");
        let sent: Vec<&Vec<Duration>> = fates
            .iter()
            .filter_map(|f| match f {
                Fate::Send(d) => Some(d),
                _ => None,
            })
            .collect();
        let dups = sent.iter().filter(|d| d.len() == 2).count();
        assert!((650..950).contains(&dups), "{dups} duplicated of 8,000");
        assert!(
            sent.iter()
                .flat_map(|d| d.iter())
                .all(|d| { *d >= Duration::from_millis(5) && *d < Duration::from_millis(8) })
        );
        // Into the other end: b's inbound faults add to a's outbound ones.
        let mut r = Rules::new(1);
        r.set(
            "b",
            Dir::ToHost,
            LinkFaults {
                delay: Duration::from_millis(3),
                ..Default::default()
            },
        );
        r.set(
            "a",
            Dir::FromHost,
            LinkFaults {
                delay: Duration::from_millis(5),
                ..Default::default()
            },
        );
        assert_eq!(
            r.fate("a", "b", &[0u8; 60]),
            Fate::Send(vec![Duration::from_millis(8)])
        );
        assert_eq!(
            r.fate("b", "a", &[0u8; 60]),
            Fate::Send(vec![Duration::ZERO])
        );
        // Clearing a link's faults removes them.
        r.set("a", Dir::FromHost, LinkFaults::default());
        r.set("b", Dir::ToHost, LinkFaults::default());
        assert!(r.is_clear());
    }

    #[test]
    fn reordering_holds_a_frame_past_the_next() {
        let mut r = Rules::new(3);
        r.set(
            "a",
            Dir::FromHost,
            LinkFaults {
                delay: Duration::from_millis(1),
                reorder: 1.0,
                ..Default::default()
            },
        );
        assert_eq!(
            r.fate("a", "b", &[0u8; 60]),
            Fate::Send(vec![Duration::from_millis(4)])
        );
    }
}
