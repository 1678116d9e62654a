//! `allocator`: assigns addresses from IPAddressPools to LoadBalancer Services.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "allocator",
    version,
    about = "hostlb allocator: addresses for LoadBalancer Services"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions (or write one file per CRD).
    Crds {
        /// Write `<group>_<plural>.yaml` files into this directory instead of printing.
        #[arg(long)]
        output_dir: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crds { output_dir } => crds(output_dir),
    }
}

fn crds(output_dir: Option<PathBuf>) -> anyhow::Result<()> {
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
    Ok(())
}
