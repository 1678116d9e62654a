//! What each `allocator` subcommand does, once `main` has parsed its
//! arguments: print or write the CRDs, print a plan, convert MetalLB
//! objects, or run the controller with its metrics server and signal
//! handling.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use hostlb_allocator::controller::{self, telemetry::Telemetry};
use hostlb_allocator::{convert, plan};

/// Print the CRDs, or write one file per CRD into `output_dir`.
pub fn crds(output_dir: Option<&Path>) -> anyhow::Result<()> {
    for (file, crd) in hostlb_api::crds::all() {
        let yaml = hostlb_api::crds::to_yaml(&crd);
        match output_dir {
            Some(dir) => {
                let path = dir.join(file);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            None => print!("---\n{yaml}"),
        }
    }
    Ok(())
}

/// Print the plan; warnings go to stderr when stdout is JSON for a program.
pub fn plan(opts: &plan::Options) -> anyhow::Result<()> {
    let p = plan::run(opts)?;
    if opts.output == plan::Output::Json {
        for w in &p.warnings {
            eprintln!("warning: {}: {}", w.object, w.message);
        }
    }
    print!("{}", p.text);
    Ok(())
}

/// Converted objects on stdout, what could not be carried over on stderr.
pub fn convert(files: &[PathBuf], namespace: &str) -> anyhow::Result<()> {
    for f in files {
        let c = convert::convert_file(f, namespace)?;
        print!("{}", c.yaml);
        for n in c.notes {
            eprintln!("not carried over: {n}");
        }
    }
    Ok(())
}

/// The controller's settings that need I/O before they are known.
pub struct Run {
    /// In-cluster configuration (or `~/.kube/config`) when unset.
    pub kubeconfig: Option<PathBuf>,
    /// The host name when unset.
    pub identity: Option<String>,
    pub listen: SocketAddr,
    /// Everything else; its identity is filled in here.
    pub controller: controller::Config,
}

/// Run the controller until SIGTERM or Ctrl-C.
pub fn run(args: Run) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    rt.block_on(async move {
        let identity = match args.identity {
            Some(i) => i,
            None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .context("no --identity/POD_NAME and no hostname")?,
        };
        let (client, _) =
            hostlb_api::runtime::client::client(args.kubeconfig.as_deref(), "allocator", &identity)
                .await?;
        let telemetry = Telemetry::new();
        hostlb_api::runtime::admin::serve(
            args.listen,
            controller::telemetry::router(telemetry.clone()),
        )
        .await?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let signals = hostlb_api::runtime::signals::Signals::new(false)
            .context("installing the signal handlers")?;
        tokio::spawn(async move {
            signals.stopped().await;
            let _ = stop.send(true);
        });
        let cfg = controller::Config {
            identity,
            ..args.controller
        };
        controller::run(client, cfg, telemetry, stopped).await?;
        Ok(())
    })
}
