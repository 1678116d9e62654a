//! `allocator`: assigns addresses from IPAddressPools to LoadBalancer Services.
#![forbid(unsafe_code)]

mod cli;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use hostlb_allocator::controller;
use hostlb_allocator::inputs::Scope;
use hostlb_allocator::plan;
use hostlb_api::annotations::{DEFAULT_LOAD_BALANCER_CLASS, SYSTEM_NAMESPACE};

#[derive(Parser)]
#[command(
    name = "allocator",
    version,
    about = "hostlb allocator: addresses for LoadBalancer Services"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller (the default).
    Run(RunArgs),
    /// Print the CustomResourceDefinitions (or write one file per CRD).
    Crds {
        /// Write `<group>_<plural>.yaml` files into this directory instead of printing.
        #[arg(long)]
        output_dir: Option<PathBuf>,
    },
    /// Show the addresses Services would get, from YAML dumps.
    Plan {
        /// Files with IPAddressPools, Namespaces and Services; repeatable.
        #[arg(short = 'f', long = "file", required = true)]
        files: Vec<PathBuf>,
        #[arg(short, long, value_enum, default_value_t = plan::Output::Table)]
        output: plan::Output,
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Rewrite MetalLB objects as hostlb objects (YAML on stdout, notes on stderr).
    Convert {
        #[arg(short = 'f', long = "file", required = true)]
        files: Vec<PathBuf>,
        /// Namespace of the converted pools and advertisements.
        #[arg(long, default_value = SYSTEM_NAMESPACE)]
        namespace: String,
    },
}

#[derive(Args, Clone)]
struct ScopeArgs {
    /// Namespace holding IPAddressPools, L2Advertisements and the Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = SYSTEM_NAMESPACE)]
    namespace: String,
    /// spec.loadBalancerClass handled besides no class.
    #[arg(long, env = "HOSTLB_LOAD_BALANCER_CLASS", default_value = DEFAULT_LOAD_BALANCER_CLASS)]
    load_balancer_class: String,
}

impl ScopeArgs {
    fn scope(&self) -> Scope {
        Scope {
            namespace: self.namespace.clone(),
            load_balancer_class: self.load_balancer_class.clone(),
        }
    }
}

#[derive(Args, Clone)]
struct RunArgs {
    /// Kubeconfig to use; in-cluster configuration when unset.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    scope: ScopeArgs,
    /// This replica's name in the Lease and in Events.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    #[arg(long, env = "HOSTLB_LEASE_NAME", default_value = "hostlb-allocator")]
    lease_name: String,
    /// Seconds after which a silent leader is replaced (1..=3600).
    #[arg(long, env = "HOSTLB_LEASE_DURATION", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    lease_duration: u64,
    /// Run without leader election (a single replica).
    #[arg(long, env = "HOSTLB_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// Seconds between full re-checks of every Service (30..=86400).
    #[arg(long, env = "HOSTLB_RESYNC", default_value_t = 600, value_parser = clap::value_parser!(u64).range(30..=86400))]
    resync: u64,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, env = "HOSTLB_METRICS_LISTEN", default_value = "0.0.0.0:7472")]
    listen: SocketAddr,
}

impl Default for RunArgs {
    fn default() -> Self {
        RunArgs::parse_from_env()
    }
}

impl RunArgs {
    fn parse_from_env() -> Self {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            run: RunArgs,
        }
        Only::parse_from(["allocator"]).run
    }

    fn into_run(self) -> cli::Run {
        cli::Run {
            kubeconfig: self.kubeconfig,
            identity: self.identity,
            listen: self.listen,
            controller: controller::Config {
                scope: self.scope.scope(),
                // Filled in by `cli::run`, from the host name when unset.
                identity: String::new(),
                lease_name: self.lease_name,
                lease_duration: self.lease_duration,
                leader_election: !self.no_leader_election,
                resync: Duration::from_secs(self.resync),
            },
        }
    }
}

fn main() -> ExitCode {
    hostlb_api::logging::init("info");
    let cli = Cli::parse();
    tracing::debug!(version = env!("CARGO_PKG_VERSION"), "allocator starting");
    let command = cli
        .command
        .unwrap_or_else(|| Command::Run(RunArgs::default()));
    if !matches!(command, Command::Run(_)) {
        hostlb_api::logging::quiet_on_closed_pipe();
    }
    let result = match command {
        Command::Run(args) => cli::run(args.into_run()),
        Command::Crds { output_dir } => cli::crds(output_dir.as_deref()),
        Command::Plan {
            files,
            output,
            scope,
        } => cli::plan(&plan::Options {
            files,
            output,
            scope: scope.scope(),
        }),
        Command::Convert { files, namespace } => cli::convert(&files, &namespace),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
