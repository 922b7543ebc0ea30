//! The `kube-svm` command line: one binary, one subcommand per job.

mod controller;
mod crds;
mod inspect;
pub mod kube;

use clap::{Parser, Subcommand};

use crate::telemetry::LogArgs;

/// Kubernetes storage version migrator.
#[derive(Parser, Debug)]
#[command(name = "kube-svm", version, about, long_about = None)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the controller: reconcile StorageVersionMigrations (what the container runs).
    Controller(Box<controller::ControllerArgs>),
    /// Print kube-svm's CustomResourceDefinitions as YAML.
    Crds(crds::CrdsArgs),
    /// Count how each resource's objects are stored in etcd (read-only): by stored apiVersion
    /// and by encryption key, never decrypting or printing a value.
    Inspect(inspect::InspectArgs),
}

impl Cli {
    /// Runs the chosen subcommand.
    pub async fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Controller(args) => controller::run(*args).await,
            Command::Crds(args) => crds::run(args),
            Command::Inspect(args) => inspect::run(args).await,
        }
    }
}
