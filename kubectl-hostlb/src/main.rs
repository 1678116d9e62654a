//! `kubectl hostlb` (the `kubectl-hostlb` binary on PATH): arguments and
//! the API client, with kubectl's kubeconfig conventions. The views are in
//! the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hostlb_api::Scope;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kubectl_hostlb::{Fleet, Output, check, drain, explain, rebalance, status};
use lbnodeagent::drain::Outcome;

/// hostlb's fleet from the Kubernetes API: what each Service's addresses
/// are and who announces them, why an address is where it is, and what is
/// wrong with the configuration.
#[derive(Parser)]
#[command(
    name = "kubectl-hostlb",
    bin_name = "kubectl hostlb",
    version = lbnodeagent::VERSION
)]
struct Args {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    /// The Services' namespace (status: all namespaces when not given;
    /// explain: the context's namespace).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    /// Where the IPAddressPools and L2Advertisements live.
    #[arg(long, default_value = hostlb_api::annotations::SYSTEM_NAMESPACE, global = true)]
    hostlb_namespace: String,
    /// spec.loadBalancerClass handled besides no class.
    #[arg(long, default_value = hostlb_api::annotations::DEFAULT_LOAD_BALANCER_CLASS, global = true)]
    load_balancer_class: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Services with their addresses, pool and announcing node per family;
    /// pools and their use; agents that are not ready (all with -o wide).
    Status,
    /// The election for each address of a Service (svc/NAME), and whether
    /// the node announcing it agrees.
    Explain { target: String },
    /// Lint the configuration and the fleet; exits 1 on any error.
    Check,
    /// Move every VIP off NODE, make-before-break, and keep them off (its
    /// NodeAgent's spec.drain): the agent keeps answering until each new
    /// owner holds. Shows each move and ends when only VIPs no other node
    /// can serve are left (exit 0, naming them and why) or at --timeout
    /// (exit 1). Not cordon: a drained node runs its agent and its pods.
    Drain {
        node: String,
        /// Give up waiting after this many seconds (the drain stays).
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Set the drain and return at once.
        #[arg(long)]
        no_wait: bool,
    },
    /// Let NODE win VIPs again.
    Undrain { node: String },
    /// Move the sticky addresses of a Service (svc/NAME), or of every
    /// Service (--all), to the nodes the election ranks first, make before
    /// break, as drain does: each move is shown, and the addresses are
    /// sticky again where they end (exit 0), or where they are at
    /// --timeout (exit 1).
    Rebalance {
        target: Option<String>,
        /// Every Service with a sticky address.
        #[arg(long, conflicts_with = "target")]
        all: bool,
        /// Give up waiting after this many seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },
    /// Print the man page (roff), generated from these definitions; with
    /// --dir, write it and one page per subcommand there (what the
    /// packages install).
    #[command(hide = true)]
    Man {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Command::Man { dir } = &args.command {
        return man(dir.as_deref());
    }
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The man pages, from the same definitions as `--help`: no cluster needed.
fn man(dir: Option<&std::path::Path>) -> ExitCode {
    use clap::CommandFactory;
    let written = match dir {
        Some(dir) => std::fs::create_dir_all(dir)
            .and_then(|()| clap_mangen::generate_to(Args::command(), dir)),
        None => clap_mangen::Man::new(Args::command()).render(&mut std::io::stdout()),
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("man: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether the Service policy is in force, tried as an agent would: a
/// dry-run patch of a Service's labels, impersonating an agent's identity
/// ([`check::PROBE_IDENTITY`]).
async fn policy_as_an_agent(
    config: &kube::Config,
    fleet: &Fleet,
) -> lbnodeagent::agent::admission::Policy {
    use lbnodeagent::agent::admission::{Policy, dry_run, judge};
    let Some(svc) = fleet.services.first() else {
        return Policy::Unknown("there is no Service to try it on".into());
    };
    let mut config = config.clone();
    config.auth_info.impersonate = Some(check::PROBE_IDENTITY.into());
    config.auth_info.impersonate_groups =
        Some(check::PROBE_GROUPS.iter().map(|g| g.to_string()).collect());
    let client = match kube::Client::try_from(config) {
        Ok(c) => c,
        Err(e) => return Policy::Unknown(e.to_string()),
    };
    let ns = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    match dry_run(&client, &ns, &name).await {
        // Refused the impersonation itself: no answer about the policy.
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("impersonate") => {
            Policy::Unknown(s.message)
        }
        answer => judge(&answer),
    }
}

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = if args.kubeconfig.is_none() && args.context.is_none() {
        kube::Config::infer().await?
    } else {
        let kubeconfig = match &args.kubeconfig {
            Some(path) => Kubeconfig::read_from(path)?,
            None => Kubeconfig::read()?,
        };
        let options = KubeConfigOptions {
            context: args.context.clone(),
            ..Default::default()
        };
        kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?
    };
    let default_namespace = config.default_namespace.clone();
    let probe_config = config.clone();
    let client = kube::Client::try_from(config)?;
    let scope = Scope {
        namespace: args.hostlb_namespace.clone(),
        load_balancer_class: args.load_balancer_class.clone(),
    };
    match &args.command {
        Command::Drain {
            node,
            timeout,
            no_wait,
        } => {
            lbnodeagent::drain::write(&client, node, true).await?;
            if *no_wait {
                println!("{node} drained (not waiting)");
                return Ok(ExitCode::SUCCESS);
            }
            let timeout = std::time::Duration::from_secs(*timeout);
            return Ok(match drain::follow(&client, &scope, node, timeout).await? {
                Outcome::Done => ExitCode::SUCCESS,
                Outcome::TimedOut => ExitCode::from(1),
            });
        }
        Command::Undrain { node } => {
            lbnodeagent::drain::write(&client, node, false).await?;
            println!("{node} undrained: it wins VIPs again");
            return Ok(ExitCode::SUCCESS);
        }
        Command::Rebalance {
            target,
            all,
            timeout,
        } => {
            let ns = args.namespace.clone().unwrap_or(default_namespace);
            let one = match (target, all) {
                (Some(t), false) => Some((ns.as_str(), explain::service_name(t)?)),
                (None, true) => None,
                _ => anyhow::bail!("rebalance: name a Service (svc/NAME) or give --all"),
            };
            let fleet = Fleet::load(&client, &scope).await?;
            let targets = rebalance::targets(&fleet, one)?;
            if targets.is_empty() {
                println!("no Service has a sticky address: nothing to rebalance");
                return Ok(ExitCode::SUCCESS);
            }
            let timeout = std::time::Duration::from_secs(*timeout);
            return Ok(
                match rebalance::run(&client, &scope, &targets, timeout).await? {
                    rebalance::Outcome::Done => ExitCode::SUCCESS,
                    rebalance::Outcome::TimedOut => ExitCode::from(1),
                },
            );
        }
        _ => {}
    }
    let fleet = Fleet::load(&client, &scope).await?;
    Ok(match args.command {
        Command::Status => {
            let doc = status::status(&fleet, args.namespace.as_deref());
            print!("{}", status::render(&doc, args.output));
            ExitCode::SUCCESS
        }
        Command::Explain { target } => {
            let name = explain::service_name(&target)?;
            let ns = args.namespace.unwrap_or(default_namespace);
            let doc = explain::explain(&fleet, &ns, name)?;
            print!("{}", explain::render(&doc, args.output));
            ExitCode::SUCCESS
        }
        Command::Check => {
            let mut findings = check::check(&fleet);
            findings.extend(check::policy(
                &policy_as_an_agent(&probe_config, &fleet).await,
            ));
            findings.sort();
            print!("{}", check::render(&findings, args.output));
            if check::failed(&findings) {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Man { dir } => man(dir.as_deref()),
        Command::Drain { .. } | Command::Undrain { .. } | Command::Rebalance { .. } => {
            unreachable!("handled above")
        }
    })
}
