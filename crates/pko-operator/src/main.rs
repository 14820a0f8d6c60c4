//! `pko-operator`: the operator binary.
//!
//! Subcommands:
//! - `crds [--out DIR]`: writes the CustomResourceDefinitions (`<group>_<plural>.yaml`) to `DIR`
//!   (default `deploy/crds`), or prints them as one multi-document YAML stream with `--out -`;
//! - `api-docs`: prints the API reference (`docs/api.md`) generated from the types.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// Command line of `pko-operator`.
#[derive(Parser, Debug)]
#[command(name = "pko-operator", version, about = "Kubernetes operator for Pulumi stacks (PKO v2-compatible)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Write the CustomResourceDefinitions of Stack, Program, Workspace and Update.
    Crds {
        /// Directory to write `<group>_<plural>.yaml` files to, or `-` for standard output.
        #[arg(long, default_value = "deploy/crds")]
        out: PathBuf,
    },
    /// Print the API reference (docs/api.md) generated from the types.
    ApiDocs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds { out } => {
            let crds = pko_api::crds();
            if out.as_os_str() == "-" {
                for crd in &crds {
                    print!("---\n{}", pko_api::crd_yaml(crd));
                }
            } else {
                std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
                for crd in &crds {
                    let path = out.join(pko_api::crd_file_name(crd));
                    std::fs::write(&path, pko_api::crd_yaml(crd)).with_context(|| format!("writing {}", path.display()))?;
                    eprintln!("wrote {}", path.display());
                }
            }
        }
        Command::ApiDocs => print!("{}", pko_api::reference::api_reference_markdown()),
    }
    Ok(())
}
