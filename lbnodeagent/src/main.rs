//! `lbnodeagent`: the hostlb node agent and its offline tools.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lbnodeagent::agent::{self, AgentConfig, config::DEFAULT_CONFIG_PATH};
use lbnodeagent::inputs::Scope;
use lbnodeagent::simulate::{self, Output};

#[derive(Parser)]
#[command(name = "lbnodeagent", version = lbnodeagent::VERSION, about = "hostlb node agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: elect, hold VIPs, gossip, report (systemd service).
    Run {
        #[arg(long, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
    },
    /// Check a config file, and offline the kubeconfig and gossip key file it
    /// names; exit non-zero naming the bad key, line or file.
    Check {
        #[arg(long, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
    },
    /// Remove every address the agent owns and tell peers this node left
    /// (systemd `ExecStopPost=`, runs even after the agent was killed).
    Cleanup {
        #[arg(long, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
    },
    /// Show a running agent's members, held VIPs and per-VIP election.
    Status {
        #[arg(long, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
        /// Print the raw JSON of /status.
        #[arg(long)]
        json: bool,
    },
    /// Move every VIP off this node, make-before-break, and keep them off
    /// (its NodeAgent's spec.drain, written with the agent's credential);
    /// show each move, and end when only VIPs no other node can serve are
    /// left (exit 0) or at --timeout (exit 1).
    Drain {
        #[arg(long, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
        /// Give up waiting after this many seconds (the drain stays).
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Set the drain and return at once.
        #[arg(long)]
        no_wait: bool,
    },
    /// Let this node win VIPs again.
    Undrain {
        #[arg(long, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
    },
    /// Print a new gossip key, or write it to a new file with mode 0600.
    Keygen {
        /// Create this file (mode 0600, never overwritten) instead of
        /// printing: the agent refuses a key file others can read.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Print the man page (roff), generated from these definitions; with
    /// --dir, write it and one page per subcommand there (what the
    /// packages install, so every page the main one names exists).
    #[command(hide = true)]
    Man {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
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
        /// IFACE or NODE=IFACE: the default-route interface, which
        /// advertisements without `interfaces` announce on (default: the
        /// interface of the node's first --on-link entry); repeatable.
        #[arg(long = "default-interface")]
        default_interface: Vec<String>,
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
    // kube logs every failed request at error level; the watches report
    // failures once per outage instead.
    hostlb_api::logging::init("info,kube_client::client::builder=off");
    let cli = Cli::parse();
    tracing::debug!(version = lbnodeagent::VERSION, "lbnodeagent starting");
    if !matches!(cli.command, Command::Run { .. }) {
        hostlb_api::logging::quiet_on_closed_pipe();
    }
    match cli.command {
        Command::Run { config } => {
            lbnodeagent::heap::keep_freed();
            runtime().block_on(async {
                match agent::run(&config).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        tracing::error!(error = %e, "lbnodeagent stopped");
                        ExitCode::FAILURE
                    }
                }
            })
        }
        Command::Check { config } => match AgentConfig::load(&config) {
            Ok(c) => match runtime().block_on(agent::check_offline(&c)) {
                Ok(warnings) => {
                    for w in warnings {
                        eprintln!("{}: warning: {w}", config.display());
                    }
                    println!(
                        "{}: ok (node {}; kubeconfig and gossip key read; not checked: reaching the API server and the peers)",
                        config.display(),
                        c.node_name
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{}: {e}", config.display());
                    ExitCode::from(2)
                }
            },
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        },
        Command::Cleanup { config } => runtime().block_on(async {
            match agent::cleanup::cleanup(&config).await {
                Ok(c) => {
                    println!(
                        "removed {} addresses ({} failed), told {} peers",
                        c.removed, c.failed, c.told
                    );
                    if c.failed == 0 {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("cleanup: {e}");
                    ExitCode::FAILURE
                }
            }
        }),
        Command::Status { config, json } => {
            let listen = AgentConfig::load(&config)
                .map(|c| c.http_listen)
                .unwrap_or_else(|_| {
                    agent::config::DEFAULT_HTTP_LISTEN
                        .parse()
                        .expect("constant")
                });
            match agent::status::fetch(listen) {
                Ok(doc) if json => {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&doc).expect("serializes")
                    );
                    ExitCode::SUCCESS
                }
                Ok(doc) => {
                    print!("{}", agent::status::render(&doc));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("status: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Drain {
            config,
            timeout,
            no_wait,
        } => drain(
            &config,
            true,
            (!no_wait).then(|| std::time::Duration::from_secs(timeout)),
        ),
        Command::Undrain { config } => drain(&config, false, None),
        Command::Keygen { output: None } => match agent::keygen() {
            Ok(key) => {
                println!("{key}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("keygen: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Keygen { output: Some(path) } => match agent::keygen_to(&path) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("keygen: {}: {e}", path.display());
                ExitCode::FAILURE
            }
        },
        Command::Man { dir } => {
            use clap::CommandFactory;
            let written = match dir {
                Some(dir) => std::fs::create_dir_all(&dir)
                    .and_then(|()| clap_mangen::generate_to(Cli::command(), dir)),
                None => clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()),
            };
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("man: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Simulate {
            files,
            down,
            on_link,
            default_interface,
            output,
            namespace,
            load_balancer_class,
        } => {
            let opts = simulate::Options {
                files,
                down,
                on_link,
                default_interface,
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

/// One thread for the loop: the agent's work is a few netlink and HTTP
/// requests a second, and every extra thread costs memory (its own malloc
/// arena) on every node. The kernel work has one more of its own
/// (`agent::kernel::KernelThread`), so that it never waits on the loop.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

/// `drain` and `undrain`: the record written, then, when asked, the drain
/// followed to its end.
fn drain(config: &std::path::Path, on: bool, wait: Option<std::time::Duration>) -> ExitCode {
    let cfg = match AgentConfig::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    runtime().block_on(async {
        if let Err(e) = agent::drain::set(&cfg, on).await {
            eprintln!("{}: {e}", if on { "drain" } else { "undrain" });
            return ExitCode::FAILURE;
        }
        match (on, wait) {
            (false, _) => {
                println!("{} undrained: it wins VIPs again", cfg.node_name);
                ExitCode::SUCCESS
            }
            (true, None) => {
                println!("{} drained (not waiting)", cfg.node_name);
                ExitCode::SUCCESS
            }
            (true, Some(timeout)) => match agent::drain::follow(&cfg, timeout).await {
                Ok(lbnodeagent::drain::Outcome::Done) => ExitCode::SUCCESS,
                Ok(lbnodeagent::drain::Outcome::TimedOut) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("drain: {e}");
                    ExitCode::FAILURE
                }
            },
        }
    })
}
