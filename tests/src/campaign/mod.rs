//! The fault campaign: the real agents, as the packages build them, on a
//! bed of network namespaces, under a seeded nemesis of overlapping faults,
//! judged on the wire by what a client sees. docs/agent.md, "The fault
//! campaign", says what it runs, what it holds the agents to, and how to
//! replay a failure.
//!
//! - [`schedule`]: the seeded draw of faults (plain data);
//! - [`bed`]: the hosts, the switch, the API server, the allocator, the
//!   probers;
//! - [`unit`]: each agent under a stand-in for systemd;
//! - [`nemesis`]: carries a round of faults out;
//! - [`checker`]: judges the wire (plain functions);
//! - [`endstate`]: what must hold after each round's quiet.

pub mod bed;
pub mod checker;
pub mod cpu;
pub mod endstate;
pub mod nemesis;
pub mod schedule;
pub mod unit;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bed::{Bed, Bins};
use checker::{Bounds, Heard, Inputs, Violation, Worst};
use schedule::{Schedule, Shape};

/// The agents' `address_lifetime` (their config leaves the default).
pub const LIFETIME: Duration = Duration::from_secs(15);
/// The wire must show one answer per address, from its winner, for the
/// last this long of each quiet: the simulation's steady window.
pub const STEADY: Duration = lbnodeagent::bounds::STEADY_WINDOW;

#[derive(Clone, Debug)]
pub struct Config {
    pub seed: u64,
    /// How long the rounds run, at least (each round's faults end and its
    /// quiet passes before the next).
    pub length: Duration,
    pub nodes: usize,
    /// Addresses of each family in the pool.
    pub pool_size: usize,
    /// Over which a round's faults start.
    pub window: Duration,
    /// After a round's faults end, before its end-state check: the
    /// longest tail of any bound ([`checker::CALM_AFTER`]), a restart
    /// (RestartSec and start-up), and the steady window.
    pub quiet: Duration,
    pub mean_gap: Duration,
    pub bins: Bins,
    /// The run's folder: logs, schedule, the probers' history. Removed
    /// after a run without violations unless `keep`.
    pub dir: PathBuf,
    pub keep: bool,
    /// End the run after the first round that shows a violation (on the
    /// wire so far or in its end state): what the planted defects' runner
    /// wants to know, sooner.
    pub stop_early: bool,
}

impl Config {
    pub fn shape(&self) -> Shape {
        Shape {
            nodes: (1..=self.nodes).map(|i| format!("n{i}")).collect(),
            services: INITIAL.iter().map(|s| s.to_string()).collect(),
            pool_size: self.pool_size,
            window: self.window,
            quiet: self.quiet,
            mean_gap: self.mean_gap,
        }
    }

    /// The command that runs this seed again.
    pub fn replay(&self) -> String {
        format!(
            "hostlb-campaign --seed {} --secs {} --nodes {} --bin-dir {}",
            self.seed,
            self.length.as_secs(),
            self.nodes,
            self.bins
                .agent
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        )
    }
}

/// The Services the bed starts with.
const INITIAL: [&str; 2] = ["svc0", "svc1"];

pub struct Report {
    pub seed: u64,
    pub schedule: Schedule,
    pub violations: Vec<String>,
    pub worst: Worst,
    /// The highest share of a core an agent used over a window, and whose.
    pub busiest: Option<(String, f64)>,
    pub took: Duration,
    /// The run's folder, when kept.
    pub kept: Option<PathBuf>,
}

impl Report {
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "campaign seed {}: {} rounds, {} faults in {:.0} s; {} violations",
            self.seed,
            self.schedule.rounds.len(),
            self.schedule
                .rounds
                .iter()
                .map(|r| r.faults.len())
                .sum::<usize>(),
            self.took.as_secs_f64(),
            self.violations.len()
        );
        let _ = writeln!(s, "worst: {}", self.worst);
        if let Some((n, share)) = &self.busiest {
            let _ = writeln!(
                s,
                "busiest agent: {n}, {:.1}% of a core over {} s",
                share * 100.0,
                cpu::WINDOW.as_secs()
            );
        }
        let counts: Vec<String> = self
            .schedule
            .counts()
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(s, "faults: {}", counts.join(", "));
        for v in &self.violations {
            let _ = writeln!(s, "VIOLATION {v}");
        }
        if let Some(k) = &self.kept {
            let _ = writeln!(s, "kept: {}", k.display());
        }
        s
    }
}

/// Runs the campaign; panics only when the bed cannot be built.
pub fn run(config: &Config) -> Report {
    let took = Instant::now();
    let schedule = Schedule::draw(config.seed, &config.shape(), config.length);
    // Made anew: a kept folder of an earlier run holds its etcd, whose
    // objects would join this run's.
    match std::fs::remove_dir_all(&config.dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            panic!("the run's folder {}: {e}", config.dir.display())
        }
        _ => {}
    }
    std::fs::create_dir_all(&config.dir).expect("the run's folder");
    std::fs::write(config.dir.join("schedule.txt"), schedule.to_string()).expect("the schedule");
    std::fs::write(
        config.dir.join("replay.txt"),
        format!("{}\n", config.replay()),
    )
    .expect("the replay command");
    let log = Arc::new(Mutex::new(
        std::fs::File::create(config.dir.join("nemesis.log")).expect("the nemesis's log"),
    ));
    let say = |line: String| {
        let mut f = log.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(f, "{line}");
    };
    let bed = Bed::start(
        &config.dir,
        config.bins.clone(),
        config.nodes,
        config.pool_size,
        config.seed,
    );
    let macs: BTreeMap<String, String> = bed
        .nodes
        .iter()
        .map(|n| (bed.lan.host(n).mac().to_string(), n.clone()))
        .collect();
    let mut violations: Vec<Violation> = Vec::new();

    // Every agent up, then the first Services, each answered.
    let ready = wait(Duration::from_secs(60), || {
        bed.units
            .values()
            .all(|u| u.events().iter().any(|(_, e)| *e == unit::Event::Ready))
    });
    if !ready {
        violations.push(Violation {
            at: Instant::now(),
            what: "the agents did not all start within 60 s".into(),
        });
    }
    let initial: Vec<(String, bool, Vec<String>)> = INITIAL
        .iter()
        .map(|s| (s.to_string(), false, bed.nodes.clone()))
        .collect();
    for (name, local, eps) in &initial {
        bed.create_service(name, *local, eps)
            .expect("the first Services");
    }
    let t0 = Instant::now();
    let answered = wait(Duration::from_secs(60), || {
        let assigned = bed
            .timeline()
            .last()
            .map(|(_, a)| a.clone())
            .unwrap_or_default();
        assigned.len() == 2 * INITIAL.len()
            && assigned.keys().all(|ip| {
                bed.probes.iter().any(|(p, probe)| {
                    p == ip
                        && !probe
                            .since(Instant::now() - Duration::from_millis(200))
                            .is_empty()
                })
            })
    });
    if !answered {
        violations.push(Violation {
            at: Instant::now(),
            what: "the first Services were not answered within 60 s".into(),
        });
    }

    // Memory, every second.
    let rss: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let pids: Vec<(String, Arc<Mutex<u32>>)> = bed
        .units
        .iter()
        .map(|(n, u)| (n.clone(), u.pid.clone()))
        .collect();
    let cpu: Arc<Mutex<cpu::Cpu>> = Arc::default();
    let sampler = {
        let (rss, cpu, stop) = (rss.clone(), cpu.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for (n, pid) in &pids {
                    let pid = *pid.lock().unwrap_or_else(|e| e.into_inner());
                    if pid == 0 {
                        continue;
                    }
                    let used = crate::netns::cpu_time(pid);
                    cpu.lock().unwrap_or_else(|e| e.into_inner()).sample(
                        n,
                        pid,
                        used,
                        Instant::now(),
                    );
                    if let Some(kib) = vm_rss_kib(pid) {
                        let mut m = rss.lock().unwrap_or_else(|e| e.into_inner());
                        let e = m.entry(n.clone()).or_insert(0);
                        *e = (*e).max(kib);
                    }
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };

    let judged_from = Instant::now();
    let mut applied = Vec::new();
    // A bed that never came up says so at once: faults on agents that do
    // not run would only bury the cause under their consequences.
    let rounds = if violations.is_empty() {
        &schedule.rounds[..]
    } else {
        say("the bed did not come up; no round runs".into());
        &[]
    };
    for (i, round) in rounds.iter().enumerate() {
        say(format!("round {i}: {} faults", round.faults.len()));
        applied.extend(nemesis::run_round(&bed, i, round, &mut |l| say(l)));
        std::thread::sleep(config.quiet);
        let until = Instant::now();
        let rss_now = rss.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (n, at, share) in cpu.lock().unwrap_or_else(|e| e.into_inner()).take_spins() {
            violations.push(Violation {
                at,
                what: format!(
                    "{n}: the agent used {:.0}% of a core over {} s (bound {:.0}%): a loop that spins",
                    share * 100.0,
                    cpu::WINDOW.as_secs(),
                    cpu::SPIN_BOUND * 100.0
                ),
            });
        }
        match endstate::expected(&bed) {
            Ok(e) => {
                for mut v in endstate::check(&bed, &e, until - STEADY, until, &rss_now) {
                    v.what = format!("after round {i}'s quiet: {}", v.what);
                    violations.push(v);
                }
            }
            Err(err) => violations.push(Violation {
                at: until,
                what: format!("after round {i}'s quiet: the API could not be read: {err}"),
            }),
        }
        if config.stop_early
            && (!violations.is_empty()
                || !judge_wire(&bed, &macs, &initial, t0, &applied, judged_from)
                    .violations
                    .is_empty())
        {
            say(format!("round {i}: a violation; the run stops here"));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();

    // The whole run, judged on the wire.
    let Judged {
        violations: wire,
        worst,
        probes,
        units,
    } = judge_wire(&bed, &macs, &initial, t0, &applied, judged_from);
    violations.extend(wire);
    violations.sort_by_key(|v| v.at);
    let since = |t: Instant| {
        t.checked_duration_since(judged_from).map_or_else(
            || "before".to_string(),
            |d| format!("+{:.3}s", d.as_secs_f64()),
        )
    };
    let lines: Vec<String> = violations
        .iter()
        .map(|v| format!("{} {}", since(v.at), v.what))
        .collect();
    let failed = !lines.is_empty();
    if failed || config.keep {
        keep(&config.dir, judged_from, &probes, &units, &applied, &lines);
    }
    drop(bed);
    let kept = if failed || config.keep {
        Some(config.dir.clone())
    } else {
        let _ = std::fs::remove_dir_all(&config.dir);
        None
    };
    let busiest = cpu
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .worst
        .iter()
        .map(|(n, (share, _))| (n.clone(), *share))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    Report {
        seed: config.seed,
        schedule,
        violations: lines,
        worst,
        busiest,
        took: took.elapsed(),
        kept,
    }
}

/// The wire judged from `from` to now, and what it was judged on.
struct Judged {
    violations: Vec<Violation>,
    worst: Worst,
    probes: Vec<Heard>,
    units: BTreeMap<String, Vec<(Instant, unit::Event)>>,
}

fn judge_wire(
    bed: &Bed,
    macs: &BTreeMap<String, String>,
    initial: &[(String, bool, Vec<String>)],
    t0: Instant,
    applied: &[nemesis::Applied],
    from: Instant,
) -> Judged {
    let to = Instant::now();
    let probes: Vec<Heard> = bed
        .probes
        .iter()
        .map(|(ip, p)| Heard {
            ip: *ip,
            sent: p.sent(),
            replies: p.replies().into_iter().map(|r| (r.at, r.mac)).collect(),
        })
        .collect();
    let units: BTreeMap<String, Vec<(Instant, unit::Event)>> = bed
        .units
        .iter()
        .map(|(n, u)| (n.clone(), u.events()))
        .collect();
    let timeline = bed.timeline();
    let services = checker::service_lives(initial, t0, applied);
    let inputs = Inputs {
        start: from,
        end: to,
        nodes: &bed.nodes,
        macs,
        probes: &probes,
        faults: applied,
        units: &units,
        timeline: &timeline,
        services: &services,
    };
    let (violations, worst) = checker::judge(&inputs, &Bounds::new(LIFETIME));
    Judged {
        violations,
        worst,
        probes,
        units,
    }
}

/// Writes what a failing run leaves for its reader: the probers' history,
/// the units' events, the faults as they happened, the violations.
fn keep(
    dir: &std::path::Path,
    t0: Instant,
    probes: &[Heard],
    units: &BTreeMap<String, Vec<(Instant, unit::Event)>>,
    applied: &[nemesis::Applied],
    violations: &[String],
) {
    let at = |t: Instant| {
        if t >= t0 {
            format!("{:.6}", (t - t0).as_secs_f64())
        } else {
            format!("-{:.6}", (t0 - t).as_secs_f64())
        }
    };
    let mut s = String::from("address,kind,seconds,mac\n");
    for Heard { ip, sent, replies } in probes {
        for t in sent {
            let _ = writeln!(s, "{ip},sent,{},", at(*t));
        }
        for (t, mac) in replies {
            let _ = writeln!(s, "{ip},reply,{},{mac}", at(*t));
        }
    }
    let _ = std::fs::write(dir.join("probes.csv"), s);
    let mut s = String::new();
    for (n, events) in units {
        for (t, e) in events {
            let _ = writeln!(s, "{} {n} {e:?}", at(*t));
        }
    }
    let _ = std::fs::write(dir.join("units.log"), s);
    let mut s = String::new();
    for a in applied {
        let _ = writeln!(
            s,
            "{} .. {} round {} {}{}",
            at(a.start),
            at(a.end),
            a.round,
            a.fault,
            a.note
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        );
    }
    let _ = std::fs::write(dir.join("faults.log"), s);
    let _ = std::fs::write(dir.join("violations.txt"), violations.join("\n") + "\n");
}

fn vm_rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn wait(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + timeout;
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}
