//! `lbnodeagent`: the hostlb node agent and its offline tools.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lbnodeagent::inputs::Scope;
use lbnodeagent::simulate::{self, Output};

#[derive(Parser)]
#[command(name = "lbnodeagent", version, about = "hostlb node agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compute the election offline from YAML files (`kubectl get -o yaml`).
    Simulate {
        /// File with Nodes, Services, EndpointSlices, IPAddressPools and
        /// L2Advertisements; repeat for several files.
        #[arg(short = 'f', long = "file", required = true)]
        files: Vec<PathBuf>,
        /// Treat this node as down (no agent running); repeatable.
        #[arg(long)]
        down: Vec<String>,
        /// NODE=CIDR[@IFACE] or NODE=none: the node's on-link prefixes
        /// (default: every node on-link for every address); repeatable.
        #[arg(long = "on-link")]
        on_link: Vec<String>,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Namespace holding the IPAddressPools and L2Advertisements.
        #[arg(long, default_value = hostlb_api::annotations::SYSTEM_NAMESPACE)]
        namespace: String,
        /// spec.loadBalancerClass handled besides no class.
        #[arg(long, default_value = hostlb_api::annotations::DEFAULT_LOAD_BALANCER_CLASS)]
        load_balancer_class: String,
    },
}

fn main() -> ExitCode {
    hostlb_api::logging::init("info");
    let cli = Cli::parse();
    tracing::debug!(version = env!("CARGO_PKG_VERSION"), "lbnodeagent starting");
    match cli.command {
        Command::Simulate {
            files,
            down,
            on_link,
            output,
            namespace,
            load_balancer_class,
        } => {
            let opts = simulate::Options {
                files,
                down,
                on_link,
                output,
                scope: Scope {
                    namespace,
                    load_balancer_class,
                },
            };
            match simulate::run(&opts) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
