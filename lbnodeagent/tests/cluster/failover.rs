//! One failover measurement, for hostlb or keepalived on the same wire: three
//! hosts on a bridge, a client probing an IPv4 VIP by ARP and an IPv6 VIP by
//! neighbour solicitation every 10 ms, one fault applied to the VIP's
//! owner, and what the client saw in the following window: when another
//! host first answered (takeover), the longest silence (outage), probes
//! lost, and how long two MACs answered ("forever" when still at the end).

use std::fmt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use hostlb_tests::netns::wait_for;
use hostlb_tests::probe::{ArpProbe, Outcome, Reply};

use super::Cluster;

pub const V4: &str = "10.77.0.100";
pub const V6: &str = "fd00:77::100";
pub const EVERY: Duration = Duration::from_millis(10);
const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject {
    /// hostlb with `announce.address_lifetime` as given.
    Hostlb { lifetime_s: u64 },
    /// keepalived VRRP with this advertisement interval.
    Keepalived { advert_ms: u64 },
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Hostlb { lifetime_s } => write!(f, "hostlb (lifetime {lifetime_s} s)"),
            Subject::Keepalived { advert_ms } => {
                write!(
                    f,
                    "keepalived (advert_int {} s)",
                    *advert_ms as f64 / 1000.0
                )
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The daemon SIGKILLed, then `lbnodeagent cleanup` as systemd's
    /// `ExecStopPost` runs it (hostlb only).
    KillCleanup,
    /// The daemon SIGKILLed, nothing else.
    Kill,
    Term,
    /// `ip link set eth0 down` on the owner.
    LinkDown,
    /// The owner's switch port down (the host is cut off).
    PortDown,
    /// The daemon frozen (SIGSTOP).
    Stop,
    /// Nothing at all, for [`IDLE`]: any other MAC answering is a spurious
    /// takeover.
    Idle,
}

/// How long the benchmark's idle row watches.
pub const IDLE: Duration = Duration::from_secs(60);

pub const FAULTS: [Fault; 7] = [
    Fault::Idle,
    Fault::KillCleanup,
    Fault::Kill,
    Fault::Term,
    Fault::LinkDown,
    Fault::PortDown,
    Fault::Stop,
];

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::KillCleanup => "SIGKILL + cleanup",
            Fault::Kill => "SIGKILL",
            Fault::Term => "SIGTERM",
            Fault::LinkDown => "announce link down",
            Fault::PortDown => "switch port down",
            Fault::Stop => "SIGSTOP",
            Fault::Idle => "none (idle 60 s)",
        })
    }
}

/// What the client saw for one family after one fault.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Until another host first answered; `None`: none did.
    pub takeover: Option<Duration>,
    /// Longest time with no answer at all.
    pub outage: Duration,
    pub lost: u64,
    /// How long two MACs answered after the fault; `None`: still at the
    /// end of the window (forever, as far as can be told).
    pub two_owners: Option<Duration>,
    /// With no fault: the CPU each host's daemon used, as a share of one
    /// core over the window (all of its processes and threads).
    pub idle_cpu: Option<f64>,
}

/// Judges what `probe` saw after `t0` given the old owner's MAC.
pub fn sample(probe: &ArpProbe, old: &str, t0: Instant, end: Instant) -> Sample {
    let replies = probe.replies();
    let window: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.at >= t0 && r.at <= end)
        .collect();
    let takeover = window.iter().find(|r| r.mac != old).map(|r| r.at - t0);
    let Outcome { outage, lost, .. } = probe.judge(t0, end);
    // Two owners: probe periods answered by more than one MAC; "forever"
    // when the old MAC and another still both answer in the last second.
    let last_second: Vec<&Reply> = window
        .iter()
        .copied()
        .filter(|r| end.saturating_duration_since(r.at) < Duration::from_secs(1))
        .collect();
    let still_both =
        last_second.iter().any(|r| r.mac == old) && last_second.iter().any(|r| r.mac != old);
    let two_owners = if still_both {
        None
    } else {
        Some(hostlb_tests::probe::overlap(&window, t0, EVERY))
    };
    Sample {
        takeover,
        outage,
        lost,
        two_owners,
        idle_cpu: None,
    }
}

/// A cluster running `subject` with both VIPs up and settled.
pub struct Bed {
    pub c: Cluster,
    pub subject: Subject,
    keepalived: Vec<Option<Child>>,
}

impl Drop for Bed {
    fn drop(&mut self) {
        for k in self.keepalived.iter_mut().flatten() {
            let _ = nix_kill(k.id(), "CONT");
            let _ = k.kill();
            let _ = k.wait();
        }
    }
}

fn nix_kill(pid: u32, signal: &str) -> bool {
    hostlb_tests::netns::run("kill", &["-s", signal, &pid.to_string()]).is_ok()
}

impl Bed {
    pub fn new(subject: Subject) -> Bed {
        let mut c = Cluster::new(&NODES);
        let mut keepalived = Vec::new();
        match subject {
            Subject::Hostlb { lifetime_s } => {
                c.lifetime = format!("{lifetime_s}s");
                // node-a preferred, as keepalived's highest priority.
                c.pool_and_ad(
                    &["10.77.0.100-10.77.0.120", "fd00:77::100-fd00:77::120"],
                    "preferredNodeSelectors: [{weight: 50, preference: {matchLabels: {kubernetes.io/hostname: node-a}}}]",
                );
                c.start_all();
                c.service("web", &[V4, V6], &["node-a"], "");
            }
            Subject::Keepalived { advert_ms } => {
                for (i, n) in NODES.iter().enumerate() {
                    keepalived.push(Some(start_keepalived(
                        &c,
                        n,
                        150 - 50 * i as u32,
                        advert_ms,
                    )));
                }
            }
        }
        let bed = Bed {
            c,
            subject,
            keepalived,
        };
        for ip in [V4, V6] {
            bed.c.wait_single_holder(ip, Duration::from_secs(30));
        }
        bed
    }

    fn pid(&self, node: &str) -> u32 {
        match self.subject {
            Subject::Hostlb { .. } => self.c.pid(node),
            Subject::Keepalived { .. } => {
                let i = NODES.iter().position(|n| *n == node).unwrap();
                self.keepalived[i].as_ref().unwrap().id()
            }
        }
    }

    /// Every process of the daemon on `node`, children first: keepalived's
    /// VRRP child holds the addresses, and killed after its parent it would
    /// get the parent-death SIGTERM first and shut down gracefully, which is
    /// not the crash being measured.
    fn pids(&self, node: &str) -> Vec<u32> {
        match self.subject {
            Subject::Hostlb { .. } => vec![self.pid(node)],
            Subject::Keepalived { .. } => {
                let parent = self.pid(node);
                let ns = self.c.host(node).ns.name().to_string();
                let mut all: Vec<u32> = hostlb_tests::netns::run("ip", &["netns", "pids", &ns])
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect();
                all.sort_by_key(|p| *p == parent);
                all
            }
        }
    }

    /// CPU time used so far by the daemons of every host, all processes.
    fn cpu(&self) -> Duration {
        NODES
            .iter()
            .flat_map(|n| self.pids(n))
            .map(hostlb_tests::netns::cpu_time)
            .sum()
    }

    /// Drops `percent` of the datagrams each node sends and receives:
    /// UDP (hostlb's gossip and beats) and VRRP (IP protocol 112), not the
    /// client's ARP and neighbour solicitations, nor the API's TCP.
    pub fn lossy(&self, percent: u32) {
        if percent == 0 {
            return;
        }
        for n in NODES {
            let rules = format!(
                "table inet loss {{
  chain input {{ type filter hook input priority 0; meta l4proto {{ udp, 112 }} numgen random mod 100 < {percent} drop; }}
  chain output {{ type filter hook output priority 0; meta l4proto {{ udp, 112 }} numgen random mod 100 < {percent} drop; }}
}}"
            );
            let path = self.c.dir.path().join(format!("{n}-loss.nft"));
            std::fs::write(&path, rules).unwrap();
            self.c
                .host(n)
                .ns
                .run(&["nft", "-f", path.to_str().unwrap()])
                .unwrap();
        }
    }

    /// Applies `fault` to the owner of the IPv4 VIP and measures both
    /// families for `window`. `None` when the fault does not apply.
    pub fn measure(mut self, fault: Fault, window: Duration) -> Option<[Sample; 2]> {
        if fault == Fault::KillCleanup && !matches!(self.subject, Subject::Hostlb { .. }) {
            return None;
        }
        let client = self.c.host("client");
        let p4 = ArpProbe::start(&client.ns, "eth0", &client.ipv4.to_string(), V4, EVERY).unwrap();
        let p6 = ArpProbe::start(&client.ns, "eth0", &client.ipv6.to_string(), V6, EVERY).unwrap();
        let owner4 = self.c.wait_single_holder(V4, Duration::from_secs(10));
        let owner6 = self.c.wait_single_holder(V6, Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(500));
        let old4 = self.c.host(&owner4).mac().to_string();
        let old6 = self.c.host(&owner6).mac().to_string();
        wait_for("both probes answered", Duration::from_secs(5), || {
            let now = Instant::now();
            (!p4.since(now - Duration::from_millis(200)).is_empty()
                && !p6.since(now - Duration::from_millis(200)).is_empty())
            .then_some(())
        })
        .unwrap();
        // The fault hits the IPv4 owner; with hostlb the IPv6 VIP may live
        // elsewhere, so it is judged against its own owner only when it is
        // the same host.
        let t0 = Instant::now();
        let cpu0 = self.cpu();
        match fault {
            Fault::KillCleanup => {
                self.c.kill(&owner4);
                let config = self.c.config_path(&owner4);
                self.c
                    .agent_command(&owner4, &["cleanup", "--config", config.to_str().unwrap()]);
            }
            Fault::Kill => {
                for pid in self.pids(&owner4) {
                    nix_kill(pid, "KILL");
                }
            }
            Fault::Term => {
                nix_kill(self.pid(&owner4), "TERM");
            }
            Fault::LinkDown => {
                self.c.host(&owner4).ns.ip("link set eth0 down").unwrap();
            }
            Fault::PortDown => self.c.lan.set_port(&owner4, false).unwrap(),
            Fault::Stop => {
                for pid in self.pids(&owner4) {
                    nix_kill(pid, "STOP");
                }
            }
            Fault::Idle => {}
        }
        std::thread::sleep(window);
        let end = Instant::now();
        let idle_cpu = (fault == Fault::Idle).then(|| {
            (self.cpu() - cpu0).as_secs_f64() / (end - t0).as_secs_f64() / NODES.len() as f64
        });
        let mut s4 = sample(&p4, &old4, t0, end);
        s4.idle_cpu = idle_cpu;
        let s6 = if owner6 == owner4 {
            sample(&p6, &old6, t0, end)
        } else {
            // Not the failed host's VIP: it must just keep answering.
            let mut s = sample(&p6, &old6, t0, end);
            s.takeover = Some(Duration::ZERO);
            s
        };
        if fault == Fault::Stop {
            for pid in self.pids(&owner4) {
                nix_kill(pid, "CONT");
            }
        }
        Some([s4, s6])
    }
}

fn start_keepalived(c: &Cluster, node: &str, priority: u32, advert_ms: u64) -> Child {
    let dir = c.dir.path().join(format!("{node}-keepalived"));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("keepalived.conf");
    let advert = advert_ms as f64 / 1000.0;
    // VRRPv2 (keepalived's default for IPv4) counts advert_int in whole
    // seconds; sub-second intervals need VRRPv3.
    let version = if advert_ms < 1000 { 3 } else { 2 };
    std::fs::write(
        &conf,
        format!(
            r#"global_defs {{
    router_id {node}
    vrrp_version {version}
    vrrp_garp_master_delay 0
    vrrp_garp_master_repeat 3
}}
vrrp_instance v4 {{
    state BACKUP
    interface eth0
    virtual_router_id 51
    priority {priority}
    advert_int {advert}
    virtual_ipaddress {{
        {V4}/24 dev eth0
    }}
}}
vrrp_instance v6 {{
    state BACKUP
    interface eth0
    virtual_router_id 52
    priority {priority}
    advert_int {advert}
    native_ipv6
    virtual_ipaddress {{
        {V6}/64 dev eth0
    }}
}}
"#
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("log")).unwrap();
    let pid = |name: &str| dir.join(name).to_str().unwrap().to_string();
    c.host(node)
        .ns
        .command(
            "keepalived",
            &[
                "-n",
                "-l",
                "-G",
                "-f",
                conf.to_str().unwrap(),
                "-p",
                &pid("keepalived.pid"),
                "-r",
                &pid("vrrp.pid"),
                "-c",
                &pid("checkers.pid"),
            ],
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("keepalived (apt-get install keepalived)")
}

/// `12 / 34 / 56` (min / median / max) in ms, or "forever" when any run
/// never ended.
pub fn stats(values: &[Option<Duration>]) -> String {
    if values.iter().any(Option::is_none) {
        let ended: Vec<Duration> = values.iter().flatten().copied().collect();
        return if ended.is_empty() {
            "forever".into()
        } else {
            format!(
                "forever in {} of {}",
                values.len() - ended.len(),
                values.len()
            )
        };
    }
    let mut v: Vec<Duration> = values.iter().flatten().copied().collect();
    v.sort();
    if v.is_empty() {
        return "-".into();
    }
    let ms = |d: Duration| d.as_millis();
    format!(
        "{} / {} / {}",
        ms(v[0]),
        ms(v[v.len() / 2]),
        ms(v[v.len() - 1])
    )
}
