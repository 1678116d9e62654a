//! `hostlb-campaign`: the fault campaign on the real binaries
//! (docs/agent.md, "The fault campaign"). Needs root.
//!
//! ```sh
//! hostlb-campaign --bin-dir target/x86_64-unknown-linux-gnu/release --seed 7 --secs 300
//! ```
//!
//! Exits 0 when nothing was violated, 1 when something was (the run's
//! folder is kept, its path printed), 2 when it could not run.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use hostlb_tests::campaign::{self, Config, bed::Bins};

#[derive(Parser)]
#[command(about = "Random faults against real hostlb agents, judged on the wire")]
struct Args {
    /// Where `lbnodeagent`, `allocator` and `kubectl-hostlb` are: the
    /// release build, as the packages ship it.
    #[arg(long, env = "HOSTLB_BIN_DIR")]
    bin_dir: PathBuf,
    /// The schedule's seed (and the switch's).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long the rounds run, at least.
    #[arg(long, default_value_t = 300)]
    secs: u64,
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Seeds one after another: `--runs 12` runs seeds seed..seed+12.
    #[arg(long, default_value_t = 1)]
    runs: u64,
    /// Under which the runs' folders go.
    #[arg(long, default_value = "/tmp/hostlb-campaign")]
    dir: PathBuf,
    /// Keep a run's folder even when nothing was violated.
    #[arg(long)]
    keep: bool,
    /// End a run after the first round that shows a violation, and run
    /// no further seeds.
    #[arg(long)]
    stop_early: bool,
    /// Print the schedule and stop.
    #[arg(long)]
    schedule: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !(3..=7).contains(&args.nodes) {
        eprintln!("--nodes: 3 to 7");
        return ExitCode::from(2);
    }
    let bins = match Bins::in_dir(&args.bin_dir) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // The agents' kubeconfigs name their token files by this path, and a
    // kubeconfig's relative paths are read from the kubeconfig's folder.
    let dir = match std::path::absolute(&args.dir) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("--dir {}: {e}", args.dir.display());
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    for seed in args.seed..args.seed + args.runs {
        let config = Config {
            seed,
            length: Duration::from_secs(args.secs),
            nodes: args.nodes,
            pool_size: 4,
            window: Duration::from_secs(60),
            quiet: Duration::from_secs(20),
            mean_gap: Duration::from_secs(3),
            bins: bins.clone(),
            dir: dir.join(format!("seed-{seed}")),
            keep: args.keep,
            stop_early: args.stop_early,
        };
        if args.schedule {
            // A reader that stops early (`| head`) ends the listing, not
            // the program with a panic.
            let schedule = campaign::schedule::Schedule::draw(seed, &config.shape(), config.length);
            if write!(std::io::stdout().lock(), "{schedule}").is_err() {
                break;
            }
            continue;
        }
        println!("campaign seed {seed}: replay with `{}`", config.replay());
        let report = campaign::run(&config);
        print!("{}", report.summary());
        failed |= !report.violations.is_empty();
        if failed && args.stop_early {
            break;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
