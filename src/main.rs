//! `harness-engine`: the operator binary.

use std::{fs, path::PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use harness_engine::api::crds;

#[derive(Parser)]
#[command(name = "harness-engine", version, about = "Keeps AI-agent harness state outside disposable sandbox pods")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions as YAML, or write one file per CRD.
    Crds {
        /// Write `<group>_<plural>.yaml` files into this directory instead of printing.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Print the version.
    Version,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crds { out_dir } => {
            for crd in crds::all() {
                let yaml = crds::to_yaml(&crd)?;
                match &out_dir {
                    Some(dir) => {
                        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
                        let path = dir.join(crds::file_name(&crd));
                        fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
                    }
                    None => print!("---\n{yaml}"),
                }
            }
        }
        Command::Version => println!("harness-engine {}", env!("CARGO_PKG_VERSION")),
    }
    Ok(())
}
