//! The `kube-svm` command line: one binary, one subcommand per job.

mod controller;
mod crds;
mod etcd;
mod inspect;
pub mod kube;
mod plan;
mod table;

use std::process::ExitCode;

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
    /// Show what needs migrating and what kube-svm would do, writing nothing. Exits 0 when
    /// nothing needs migrating, 3 when something does.
    Plan(plan::PlanArgs),
}

impl Cli {
    /// Runs the chosen subcommand; what it returns is the process's exit code.
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        let done = |result: anyhow::Result<()>| result.map(|()| ExitCode::SUCCESS);
        match self.command {
            Command::Controller(args) => done(controller::run(*args).await),
            Command::Crds(args) => done(crds::run(args)),
            Command::Inspect(args) => done(inspect::run(args).await),
            Command::Plan(args) => plan::run(args).await,
        }
    }
}
