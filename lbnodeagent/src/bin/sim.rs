//! Runs the agent core's deterministic simulation over many seeds, or
//! replays one.
//!
//! ```sh
//! cargo run --release -p lbnodeagent --features sim --bin sim -- --seeds 0..100000
//! cargo run --release -p lbnodeagent --features sim --bin sim -- --seed 4242 --trace
//! cargo run --release -p lbnodeagent --features sim --bin sim -- --seeds 0..20000 --digests FILE
//! RUST_LOG=lbnodeagent=debug cargo run ... -- --seed 4242 --trace   # the cores' own logs too
//! cargo run --release -p lbnodeagent --features sim --bin sim -- --seed 2603 --apart   # each two-owner episode judged apart
//! cargo run --profile sim -p lbnodeagent --features sim --bin sim -- --seeds 0..500 --threads 1 --costs   # where the time goes
//! ```
//!
//! Seeds run on every core of the machine (`--threads` to choose); the
//! first failing seed is printed with the end of its trace, and the run
//! exits 1.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lbnodeagent::sim::{self, Options, Outcome};

/// The simulation allocates and frees small maps and strings at every
/// event; glibc's allocator took a fifth of its time.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    seeds: std::ops::Range<u64>,
    trace: bool,
    /// Write each seed's trace digest, one line per seed, to this file.
    digests: Option<std::path::PathBuf>,
    threads: usize,
    /// Judge each two-owner episode apart (see `Options::apart`).
    apart: bool,
    /// Print where the runs' time went (see `Options::costs`).
    costs: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seeds: 0..1000,
        trace: false,
        digests: None,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        apart: false,
        costs: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seed" => {
                let s: u64 = it.next().and_then(|v| v.parse().ok()).ok_or("--seed N")?;
                args.seeds = s..s + 1;
            }
            "--seeds" => {
                let v = it.next().ok_or("--seeds A..B")?;
                let (a, b) = v.split_once("..").ok_or("--seeds A..B")?;
                args.seeds = a.parse().map_err(|_| "--seeds A..B")?
                    ..b.parse().map_err(|_| "--seeds A..B")?;
            }
            "--trace" => args.trace = true,
            "--apart" => args.apart = true,
            "--costs" => args.costs = true,
            "--digests" => args.digests = Some(it.next().ok_or("--digests FILE")?.into()),
            "--threads" => {
                args.threads = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--threads N")?;
            }
            "--bench" => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sim: {e}");
            return ExitCode::from(2);
        }
    };
    if args.trace {
        let _ = tracing_subscriber_init();
    }
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(args.seeds.start));
    let stop = Arc::new(AtomicBool::new(false));
    let failure: Arc<Mutex<Option<Outcome>>> = Arc::default();
    let totals: Arc<Mutex<Totals>> = Arc::default();
    let options = Options {
        trace: args.trace,
        digest: args.digests.is_some(),
        apart: args.apart,
        costs: args.costs,
    };
    std::thread::scope(|scope| {
        for _ in 0..args.threads.max(1) {
            let (next, stop, failure, totals, options) =
                (&next, &stop, &failure, &totals, &options);
            let end = args.seeds.end;
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        return;
                    }
                    let o = sim::run(seed, options);
                    totals.lock().unwrap().add(&o);
                    if o.violation.is_some() {
                        stop.store(true, Ordering::Relaxed);
                        let mut f = failure.lock().unwrap();
                        if f.as_ref().is_none_or(|prev| prev.seed > o.seed) {
                            *f = Some(o);
                        }
                        return;
                    }
                }
            });
        }
    });
    let t = totals.lock().unwrap();
    if let Some(path) = &args.digests {
        let lines: String = t
            .digests
            .iter()
            .map(|(seed, d)| format!("{seed} {d:016x}\n"))
            .collect();
        if let Err(e) = std::fs::write(path, lines) {
            eprintln!("sim: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    println!(
        "{} seeds in {:.1} s ({:.2} ms per seed, {} threads); {} events",
        t.seeds,
        started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64() * 1e3 / t.seeds.max(1) as f64,
        args.threads,
        t.events
    );
    if args.costs {
        println!(
            "where the time went (part, times, mean, share of the runs):\n{}",
            t.costs.table()
        );
    }
    println!(
        "longest no owner while a candidate lived: {:?} (seed {})",
        t.no_owner.0, t.no_owner.1
    );
    for (cause, (d, seed)) in &t.two_owners {
        println!("longest two owners, {cause}: {d:?} (seed {seed})");
    }
    println!("planned moves watched (make before break): {}", t.planned);
    println!(
        "  VIPs dark a moment because their successor was named too late for a leaving owner to hear: {}",
        t.late_successors
    );
    println!(
        "owners stalled up to 200 ms with nothing else going on (no spurious takeover): {}",
        t.calm_stalls
    );
    println!(
        "  of which taken because every question of the pre-check or its answer was lost: {}",
        t.unheard_takeovers
    );
    println!(
        "owner pairs that became live, ready, connected and of one view: {}, settled at most {:?} after",
        t.agreed_pairs, t.agreed_longest
    );
    println!(
        "dead owners' lapses followed by a successor that knew when: {}, answering at most {:?} after",
        t.lapses_followed, t.lapse_longest
    );
    match failure.lock().unwrap().take() {
        None => ExitCode::SUCCESS,
        Some(o) => {
            if !args.trace {
                for line in &o.trace {
                    println!("{line}");
                }
            }
            println!("{}", sim::summary(&o));
            println!(
                "replay: cargo run --release -p lbnodeagent --features sim --bin sim -- --seed {} --trace",
                o.seed
            );
            ExitCode::FAILURE
        }
    }
}

#[derive(Default)]
struct Totals {
    seeds: u64,
    events: u64,
    /// Longest, and the seed it came from.
    no_owner: (Duration, u64),
    two_owners: std::collections::BTreeMap<&'static str, (Duration, u64)>,
    planned: u64,
    late_successors: u64,
    calm_stalls: u64,
    unheard_takeovers: u64,
    agreed_pairs: u64,
    agreed_longest: Duration,
    lapses_followed: u64,
    lapse_longest: Duration,
    digests: std::collections::BTreeMap<u64, u64>,
    costs: sim::Costs,
}

impl Totals {
    fn add(&mut self, o: &Outcome) {
        self.seeds += 1;
        self.events += o.events;
        if o.stats.no_owner > self.no_owner.0 {
            self.no_owner = (o.stats.no_owner, o.seed);
        }
        for (k, v) in &o.stats.two_owners {
            let e = self.two_owners.entry(k).or_default();
            if *v > e.0 {
                *e = (*v, o.seed);
            }
        }
        self.planned += o.stats.quiet_moves;
        self.late_successors += o.stats.late_successors;
        self.calm_stalls += o.stats.calm_stalls;
        self.unheard_takeovers += o.stats.unheard_takeovers;
        self.agreed_pairs += o.stats.agreed_pairs;
        self.agreed_longest = self.agreed_longest.max(o.stats.agreed_longest);
        self.lapses_followed += o.stats.lapses_followed;
        self.lapse_longest = self.lapse_longest.max(o.stats.lapse_longest);
        if o.digest != 0 {
            self.digests.insert(o.seed, o.digest);
        }
        if let Some(c) = &o.costs {
            self.costs.add(c);
        }
    }
}

fn tracing_subscriber_init() -> Option<()> {
    hostlb_api::logging::init("off");
    Some(())
}
