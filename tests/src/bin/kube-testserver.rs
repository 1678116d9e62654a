//! `kube-testserver`: the test API server as a process, for `kubectl` and for
//! the local demo cluster.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use hostlb_tests::apiserver::TestServer;

#[derive(Parser)]
#[command(
    name = "kube-testserver",
    version,
    about = "An in-memory Kubernetes API server for tests"
)]
struct Args {
    /// Address to serve plain HTTP on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where to write a kubeconfig pointing at the server.
    #[arg(long)]
    kubeconfig: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let server = TestServer::start_on(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    server
        .write_kubeconfig(&args.kubeconfig)
        .with_context(|| format!("writing {}", args.kubeconfig.display()))?;
    eprintln!(
        "kube-testserver serving {} (kubeconfig {})",
        server.url(),
        args.kubeconfig.display()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
