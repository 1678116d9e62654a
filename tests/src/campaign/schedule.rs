//! The nemesis's schedule: a seeded draw of overlapping faults, each with
//! its start and its length, in rounds. A round draws faults over its
//! active window; every fault ends; then the bed stays quiet until the
//! end-state check. The same seed always gives the same schedule: it is
//! drawn here, whole, before the bed starts, from nothing but the seed and
//! the bed's shape (nodes, Services).
//!
//! Plain data and arithmetic: tested without a kernel, printed with a run
//! and kept with a failing one.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use crate::rng::Rng;
use crate::switch::LinkFaults;

/// One fault: what, to whom, when (from its round's start) and how long.
#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    pub at: Duration,
    pub len: Duration,
    pub kind: Kind,
}

impl Fault {
    pub fn end(&self) -> Duration {
        self.at + self.len
    }
}

/// Which way a one-way partition drops: `from` is heard by nobody in `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sides {
    pub from: Vec<String>,
    pub to: Vec<String>,
}

/// A Service operation of the churn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Churn {
    /// A new dual-stack LoadBalancer Service; `local` makes it
    /// `externalTrafficPolicy: Local` with endpoints on `endpoints`.
    Create {
        name: String,
        local: bool,
        endpoints: Vec<String>,
    },
    Delete {
        name: String,
    },
    /// Its ports edited (the guard's rules follow).
    Ports {
        name: String,
        port: u16,
    },
    /// Its endpoints moved (for a `Local` one, its candidates too).
    Endpoints {
        name: String,
        endpoints: Vec<String>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// The host's switch port down for the fault's length (a host gone).
    HostGone {
        node: String,
    },
    /// The port down and up `flaps` times over the fault's length.
    LinkFlap {
        node: String,
        flaps: u32,
    },
    /// SIGSTOP, SIGCONT after the length (systemd's watchdog, 3 s, acts
    /// on a longer one, as it would).
    Stall {
        node: String,
    },
    /// SIGKILL; the supervisor runs `cleanup` (ExecStopPost) and restarts
    /// after RestartSec, as systemd does.
    KillCleanup {
        node: String,
    },
    /// SIGKILL without `cleanup` (a crash that takes the stop hooks with
    /// it); restarted after RestartSec when `restart`, else when the fault
    /// ends.
    KillNoCleanup {
        node: String,
        restart: bool,
    },
    /// SIGTERM and a start again (a rolling upgrade): `systemctl restart`.
    Upgrade {
        node: String,
    },
    /// `systemctl reload`: `check`, then SIGHUP.
    Reload {
        node: String,
    },
    /// Loss, delay, jitter, duplication, reordering on the host's link,
    /// both ways.
    Lossy {
        node: String,
        faults: LinkFaults,
    },
    /// Frames from one side dropped on their way to the other.
    OneWay {
        sides: Sides,
    },
    /// Both ways between `side` and the other nodes (each side still
    /// reaches the client and the API server).
    Partition {
        side: Vec<String>,
    },
    /// Gossip only (UDP 7934), both ways, between `side` and the others.
    GossipCut {
        side: Vec<String>,
    },
    /// The API server unreachable from every node.
    ApiOutage,
    /// An operator's `ip addr del` of a VIP on the host that holds it (the
    /// `index`th address of the pool, by family, whoever holds it then).
    AddrDel {
        index: usize,
        ipv6: bool,
    },
    Churn(Churn),
    /// `kubectl hostlb drain`, `undrain` when the fault ends.
    Drain {
        node: String,
    },
    /// The advertisement's preferences rewritten: `weights` per node (0 =
    /// no preference).
    Preference {
        weights: Vec<(String, u32)>,
    },
}

impl Kind {
    /// The short name the report counts faults by.
    pub fn name(&self) -> &'static str {
        match self {
            Kind::HostGone { .. } => "host gone",
            Kind::LinkFlap { .. } => "link flap",
            Kind::Stall { .. } => "agent stalled",
            Kind::KillCleanup { .. } => "killed, cleanup, restart",
            Kind::KillNoCleanup { restart: true, .. } => "killed, no cleanup, restart",
            Kind::KillNoCleanup { restart: false, .. } => "killed, no cleanup, no restart",
            Kind::Upgrade { .. } => "SIGTERM and restart",
            Kind::Reload { .. } => "SIGHUP reload",
            Kind::Lossy { .. } => "loss, delay, duplication",
            Kind::OneWay { .. } => "one-way partition",
            Kind::Partition { .. } => "partition",
            Kind::GossipCut { .. } => "gossip-only partition",
            Kind::ApiOutage => "API server outage",
            Kind::AddrDel { .. } => "ip addr del of a VIP",
            Kind::Churn(Churn::Create { .. }) => "Service created",
            Kind::Churn(Churn::Delete { .. }) => "Service deleted",
            Kind::Churn(Churn::Ports { .. }) => "Service ports edited",
            Kind::Churn(Churn::Endpoints { .. }) => "endpoints moved",
            Kind::Drain { .. } => "drain and undrain",
            Kind::Preference { .. } => "preference edit",
        }
    }

    /// The nodes whose agent or host the fault touches.
    pub fn nodes(&self) -> Vec<&str> {
        match self {
            Kind::HostGone { node }
            | Kind::LinkFlap { node, .. }
            | Kind::Stall { node }
            | Kind::KillCleanup { node }
            | Kind::KillNoCleanup { node, .. }
            | Kind::Upgrade { node }
            | Kind::Reload { node }
            | Kind::Lossy { node, .. }
            | Kind::Drain { node } => vec![node],
            Kind::OneWay { sides } => sides
                .from
                .iter()
                .chain(&sides.to)
                .map(|s| s.as_str())
                .collect(),
            Kind::Partition { side } | Kind::GossipCut { side } => {
                side.iter().map(|s| s.as_str()).collect()
            }
            _ => Vec::new(),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "+{:>7.3}s {:>7.3}s  {}",
            self.at.as_secs_f64(),
            self.len.as_secs_f64(),
            self.kind.name()
        )?;
        match &self.kind {
            Kind::HostGone { node }
            | Kind::Stall { node }
            | Kind::KillCleanup { node }
            | Kind::KillNoCleanup { node, .. }
            | Kind::Upgrade { node }
            | Kind::Reload { node }
            | Kind::Drain { node } => write!(f, " {node}"),
            Kind::LinkFlap { node, flaps } => write!(f, " {node} ×{flaps}"),
            Kind::Lossy { node, faults } => write!(
                f,
                " {node} loss {:.0}% delay {:?}±{:?} dup {:.0}% reorder {:.0}%",
                faults.loss * 100.0,
                faults.delay,
                faults.jitter,
                faults.duplicate * 100.0,
                faults.reorder * 100.0
            ),
            Kind::OneWay { sides } => {
                write!(f, " {} -/-> {}", sides.from.join(","), sides.to.join(","))
            }
            Kind::Partition { side } | Kind::GossipCut { side } => {
                write!(f, " {} | rest", side.join(","))
            }
            Kind::ApiOutage => Ok(()),
            Kind::AddrDel { index, ipv6 } => {
                write!(
                    f,
                    " pool address {index} ({})",
                    if *ipv6 { "IPv6" } else { "IPv4" }
                )
            }
            Kind::Churn(c) => match c {
                Churn::Create {
                    name,
                    local,
                    endpoints,
                } => write!(
                    f,
                    " {name}{} endpoints {}",
                    if *local { " (Local)" } else { "" },
                    endpoints.join(",")
                ),
                Churn::Delete { name } => write!(f, " {name}"),
                Churn::Ports { name, port } => write!(f, " {name} port {port}"),
                Churn::Endpoints { name, endpoints } => {
                    write!(f, " {name} to {}", endpoints.join(","))
                }
            },
            Kind::Preference { weights } => {
                let w: Vec<String> = weights.iter().map(|(n, w)| format!("{n}={w}")).collect();
                write!(f, " {}", w.join(" "))
            }
        }
    }
}

/// A round: its faults, from its start; then quiet.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    pub faults: Vec<Fault>,
}

impl Round {
    /// When its last fault ends.
    pub fn active(&self) -> Duration {
        self.faults.iter().map(Fault::end).max().unwrap_or_default()
    }
}

/// The shape of the bed the schedule is drawn for.
#[derive(Clone, Debug)]
pub struct Shape {
    pub nodes: Vec<String>,
    /// Services that exist when the bed starts.
    pub services: Vec<String>,
    /// Addresses per family in the pool.
    pub pool_size: usize,
    /// The window over which a round's faults start.
    pub window: Duration,
    /// The quiet time after a round's faults end, before the end-state
    /// check.
    pub quiet: Duration,
    /// Mean time between fault starts within a round.
    pub mean_gap: Duration,
}

/// The whole run's schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub seed: u64,
    pub rounds: Vec<Round>,
}

impl Schedule {
    /// Draws rounds until their total (active time and quiet) reaches
    /// `length`; at least one round.
    pub fn draw(seed: u64, shape: &Shape, length: Duration) -> Schedule {
        let mut rng = Rng(seed ^ 0x6e65_6d65_7369_7300);
        let mut services: BTreeSet<String> = shape.services.iter().cloned().collect();
        let mut next_service = services.len();
        let mut rounds = Vec::new();
        let mut total = Duration::ZERO;
        while rounds.is_empty() || total < length {
            let round = draw_round(&mut rng, shape, &mut services, &mut next_service);
            total += round.active() + shape.quiet;
            rounds.push(round);
        }
        Schedule { seed, rounds }
    }

    /// How many faults of each kind.
    pub fn counts(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for f in self.rounds.iter().flat_map(|r| &r.faults) {
            *counts.entry(f.kind.name()).or_insert(0) += 1;
        }
        counts
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "schedule of seed {}", self.seed)?;
        for (i, r) in self.rounds.iter().enumerate() {
            writeln!(
                f,
                "round {i} (faults end at +{:.3}s)",
                r.active().as_secs_f64()
            )?;
            for fault in &r.faults {
                writeln!(f, "  {fault}")?;
            }
        }
        Ok(())
    }
}

fn ms(rng: &mut Rng, from: u64, to: u64) -> Duration {
    Duration::from_millis(from + rng.below(to - from + 1))
}

/// Log-uniform in `[from, to]` ms: short and long lengths alike.
fn log_ms(rng: &mut Rng, from: u64, to: u64) -> Duration {
    let (a, b) = ((from as f64).ln(), (to as f64).ln());
    let x = a + (b - a) * (rng.below(1_000_000) as f64 / 1_000_000.0);
    Duration::from_millis(x.exp().round() as u64)
}

/// A non-empty proper subset of the nodes, at most half of them.
fn side(rng: &mut Rng, nodes: &[String]) -> Vec<String> {
    let n = 1 + rng.below((nodes.len() / 2).max(1) as u64) as usize;
    let mut pool: Vec<String> = nodes.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let i = rng.below(pool.len() as u64) as usize;
        out.push(pool.remove(i));
    }
    out.sort();
    out
}

fn some_nodes(rng: &mut Rng, nodes: &[String]) -> Vec<String> {
    let mut out: Vec<String> = nodes.iter().filter(|_| rng.chance(0.5)).cloned().collect();
    if out.is_empty() {
        out.push(rng.pick(nodes).clone());
    }
    out
}

fn draw_round(
    rng: &mut Rng,
    shape: &Shape,
    services: &mut BTreeSet<String>,
    next_service: &mut usize,
) -> Round {
    let mut faults = Vec::new();
    let mut t = Duration::ZERO;
    let mean = shape.mean_gap.as_millis() as u64;
    loop {
        // Exponential gaps: starts that bunch up as well as spread out.
        let u = (rng.below(1_000_000) as f64 + 1.0) / 1_000_001.0;
        t += Duration::from_millis((-(u.ln()) * mean as f64) as u64);
        if t >= shape.window {
            break;
        }
        faults.push(draw_fault(rng, shape, t, services, next_service));
    }
    Round { faults }
}

fn draw_fault(
    rng: &mut Rng,
    shape: &Shape,
    at: Duration,
    services: &mut BTreeSet<String>,
    next_service: &mut usize,
) -> Fault {
    let nodes = &shape.nodes;
    let node = rng.pick(nodes).clone();
    let instant = Duration::from_millis(1);
    let (len, kind) = match rng.below(20) {
        0 | 1 => (log_ms(rng, 200, 8_000), Kind::HostGone { node }),
        2 => {
            let flaps = 1 + rng.below(4) as u32;
            (ms(rng, 300, 4_000), Kind::LinkFlap { node, flaps })
        }
        3 | 4 => (log_ms(rng, 20, 5_000), Kind::Stall { node }),
        5 => (instant, Kind::KillCleanup { node }),
        6 => {
            let restart = rng.chance(0.5);
            let len = if restart {
                instant
            } else {
                log_ms(rng, 1_000, 20_000)
            };
            (len, Kind::KillNoCleanup { node, restart })
        }
        7 => (instant, Kind::Upgrade { node }),
        8 => (instant, Kind::Reload { node }),
        9 | 10 => {
            let faults = LinkFaults {
                loss: [0.0, 0.01, 0.05, 0.1, 0.2][rng.below(5) as usize],
                delay: ms(rng, 0, 30),
                jitter: ms(rng, 0, 20),
                duplicate: [0.0, 0.01, 0.05][rng.below(3) as usize],
                reorder: [0.0, 0.01, 0.05][rng.below(3) as usize],
            };
            (log_ms(rng, 500, 20_000), Kind::Lossy { node, faults })
        }
        11 => {
            let from = side(rng, nodes);
            let to: Vec<String> = if rng.chance(0.5) {
                nodes
                    .iter()
                    .filter(|n| !from.contains(n))
                    .cloned()
                    .collect()
            } else {
                let rest: Vec<String> = nodes
                    .iter()
                    .filter(|n| !from.contains(n))
                    .cloned()
                    .collect();
                some_nodes(rng, &rest)
            };
            (
                log_ms(rng, 500, 15_000),
                Kind::OneWay {
                    sides: Sides { from, to },
                },
            )
        }
        12 => (
            log_ms(rng, 500, 15_000),
            Kind::Partition {
                side: side(rng, nodes),
            },
        ),
        13 => (
            log_ms(rng, 500, 15_000),
            Kind::GossipCut {
                side: side(rng, nodes),
            },
        ),
        14 => (log_ms(rng, 1_000, 120_000), Kind::ApiOutage),
        15 => {
            let index = rng.below(shape.pool_size as u64) as usize;
            (
                instant,
                Kind::AddrDel {
                    index,
                    ipv6: rng.chance(0.5),
                },
            )
        }
        16 | 17 => (
            instant,
            Kind::Churn(churn(rng, nodes, services, next_service)),
        ),
        18 => (log_ms(rng, 1_000, 15_000), Kind::Drain { node }),
        _ => {
            let weights = nodes
                .iter()
                .map(|n| (n.clone(), [0, 0, 10, 50, 100][rng.below(5) as usize]))
                .collect();
            (instant, Kind::Preference { weights })
        }
    };
    Fault { at, len, kind }
}

/// Keeps between one Service and as many as the pool has addresses (each
/// takes one of either family).
fn churn(
    rng: &mut Rng,
    nodes: &[String],
    services: &mut BTreeSet<String>,
    next: &mut usize,
) -> Churn {
    let pick = |rng: &mut Rng, services: &BTreeSet<String>| {
        let v: Vec<&String> = services.iter().collect();
        (*rng.pick(&v)).clone()
    };
    let choice = rng.below(4);
    if services.len() <= 1 || (choice == 0 && services.len() < 3) {
        let name = format!("svc{next}");
        *next += 1;
        services.insert(name.clone());
        return Churn::Create {
            name,
            local: rng.chance(0.4),
            endpoints: some_nodes(rng, nodes),
        };
    }
    match choice {
        0 | 1 => {
            let name = pick(rng, services);
            services.remove(&name);
            Churn::Delete { name }
        }
        2 => Churn::Ports {
            name: pick(rng, services),
            port: 80 + rng.below(100) as u16,
        },
        _ => Churn::Endpoints {
            name: pick(rng, services),
            endpoints: some_nodes(rng, nodes),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            nodes: ["n1", "n2", "n3", "n4"].map(String::from).to_vec(),
            services: vec!["svc0".into(), "svc1".into()],
            pool_size: 4,
            window: Duration::from_secs(60),
            quiet: Duration::from_secs(15),
            mean_gap: Duration::from_secs(3),
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule() {
        let a = Schedule::draw(42, &shape(), Duration::from_secs(300));
        assert_eq!(a, Schedule::draw(42, &shape(), Duration::from_secs(300)));
        assert_ne!(a, Schedule::draw(43, &shape(), Duration::from_secs(300)));
        assert_eq!(
            a.to_string(),
            Schedule::draw(42, &shape(), Duration::from_secs(300)).to_string()
        );
    }

    #[test]
    fn rounds_fill_the_length_and_every_fault_ends() {
        let s = Schedule::draw(7, &shape(), Duration::from_secs(300));
        let total: Duration = s.rounds.iter().map(|r| r.active() + shape().quiet).sum();
        assert!(total >= Duration::from_secs(300), "{total:?}");
        for r in &s.rounds {
            assert!(
                r.faults
                    .iter()
                    .all(|f| f.at < shape().window && f.len > Duration::ZERO)
            );
            assert!(
                r.faults.windows(2).all(|w| w[0].at <= w[1].at),
                "in order of start"
            );
        }
    }

    /// Over many seeds every kind the campaign promises comes up, and
    /// faults overlap.
    #[test]
    fn every_kind_is_drawn_and_faults_overlap() {
        let mut kinds = BTreeSet::new();
        let mut overlapping = 0;
        for seed in 0..50 {
            let s = Schedule::draw(seed, &shape(), Duration::from_secs(300));
            for r in &s.rounds {
                for (i, f) in r.faults.iter().enumerate() {
                    kinds.insert(f.kind.name());
                    if r.faults[i + 1..].iter().any(|g| g.at < f.end()) {
                        overlapping += 1;
                    }
                }
            }
        }
        assert_eq!(kinds.len(), 20, "{kinds:?}");
        assert!(overlapping > 100, "{overlapping}");
    }

    #[test]
    fn churn_keeps_one_service_at_least_and_never_more_than_the_pool_holds() {
        let mut rng = Rng(1);
        let nodes = shape().nodes;
        let mut services: BTreeSet<String> = ["svc0".to_string()].into();
        let mut next = 1;
        for _ in 0..2_000 {
            match churn(&mut rng, &nodes, &mut services, &mut next) {
                Churn::Delete { name } => assert!(!services.contains(&name)),
                Churn::Create { name, .. } => assert!(services.contains(&name)),
                Churn::Ports { name, .. } | Churn::Endpoints { name, .. } => {
                    assert!(services.contains(&name))
                }
            }
            assert!((1..=3).contains(&services.len()), "{services:?}");
        }
    }
}
