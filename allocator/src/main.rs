//! `allocator`: assigns addresses from IPAddressPools to LoadBalancer Services.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use hostlb_allocator::controller::{self, telemetry::Telemetry};
use hostlb_allocator::inputs::Scope;
use hostlb_allocator::{convert, plan};
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli
        .command
        .unwrap_or_else(|| Command::Run(RunArgs::default()))
    {
        Command::Run(args) => run(args),
        Command::Crds { output_dir } => crds(output_dir),
        Command::Plan {
            files,
            output,
            scope,
        } => plan_cmd(files, output, scope.scope()),
        Command::Convert { files, namespace } => convert_cmd(files, &namespace),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn crds(output_dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    for (file, crd) in hostlb_api::crds::all() {
        let yaml = hostlb_api::crds::to_yaml(&crd);
        match &output_dir {
            Some(dir) => {
                let path = dir.join(file);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            None => print!("---\n{yaml}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn plan_cmd(files: Vec<PathBuf>, output: plan::Output, scope: Scope) -> anyhow::Result<ExitCode> {
    let p = plan::run(&plan::Options {
        files,
        output,
        scope,
    })?;
    if output == plan::Output::Json {
        for w in &p.warnings {
            eprintln!("warning: {}: {}", w.object, w.message);
        }
    }
    print!("{}", p.text);
    Ok(ExitCode::SUCCESS)
}

fn convert_cmd(files: Vec<PathBuf>, namespace: &str) -> anyhow::Result<ExitCode> {
    for f in files {
        let c = convert::convert_file(&f, namespace)?;
        print!("{}", c.yaml);
        for n in c.notes {
            eprintln!("not carried over: {n}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async move {
        let identity = match &args.identity {
            Some(i) => i.clone(),
            None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .context("no --identity/POD_NAME and no hostname")?,
        };
        let mut config = match &args.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .context("using the kubeconfig")?
            }
            None => kube::Config::infer()
                .await
                .context("finding the cluster (in-cluster or ~/.kube/config)")?,
        };
        controller::prepare_client(&mut config, &identity);
        let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
        let telemetry = Telemetry::new();
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let server = axum::serve(listener, controller::telemetry::router(telemetry.clone()));
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "metrics server stopped");
            }
        });
        let (stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("installing a SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            let _ = stop.send(true);
        });
        let cfg = controller::Config {
            scope: args.scope.scope(),
            identity,
            lease_name: args.lease_name.clone(),
            lease_duration: args.lease_duration,
            leader_election: !args.no_leader_election,
            resync: Duration::from_secs(args.resync),
        };
        controller::run(client, cfg, telemetry, stopped).await?;
        Ok(ExitCode::SUCCESS)
    })
}
