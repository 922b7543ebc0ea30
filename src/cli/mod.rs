//! The `kube-svm` command line: one binary, one subcommand per job.

mod controller;
mod crds;
mod drop;
mod engine;
mod etcd;
mod figures;
mod fleet;
mod inspect;
pub mod kube;
mod migrate;
mod plan;
mod progress;
mod retry;
mod status;
mod table;
mod values;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::ops::telemetry::LogArgs;

/// Kubernetes storage version migrator.
#[derive(Parser, Debug)]
#[command(name = "kube-svm", version, about, long_about = None)]
pub struct Cli {
    /// How to log.
    #[command(flatten)]
    pub log: LogArgs,

    /// The subcommand to run.
    #[command(subcommand)]
    pub command: Command,
}

/// kube-svm's subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the controller: reconcile StorageVersionMigrations (what the container runs).
    Controller(Box<controller::ControllerArgs>),
    /// Print kube-svm's CustomResourceDefinitions as YAML.
    Crds(crds::CrdsArgs),
    /// Count how each resource's objects are stored in etcd (read-only): by stored apiVersion
    /// and by encryption key, never decrypting or printing a value.
    Inspect(inspect::InspectArgs),
    /// Migrate resources in this process, without the controller: the same engine and pruning
    /// rules, progress on standard error, a checkpoint to resume from when interrupted. Exits 0
    /// only when every resource succeeded (and a CRD's storedVersions was pruned).
    Migrate(Box<migrate::MigrateArgs>),
    /// Show what needs migrating and what kube-svm would do, writing nothing. Exits 0 when
    /// nothing needs migrating, 3 when something does, 1 on an error. --drop has exit codes of
    /// its own (see its help), and is the only form that asks several clusters at once.
    Plan(plan::PlanArgs),
    /// Run Failed migrations again in place, from their first object: the controller acts on
    /// the annotation kube-svm.io/retry this sets, once, and keeps the outcome it clears in an
    /// Event. Exits 1 when a migration does not exist or is not Failed.
    Retry(retry::RetryArgs),
    /// Show migrations and their progress (kube-svm's, and the in-tree migrator's where the
    /// cluster serves its API), once or with --watch. Exits 1 when the cluster cannot be read;
    /// with several clusters (--context more than once, --all-contexts), one row each, and 1
    /// when one of them did not answer.
    Status(status::StatusArgs),
}

impl Command {
    /// The log level when none is given: the controller logs what it does; a command a person
    /// runs prints its results and progress, and logs only what went wrong.
    pub fn default_log_level(&self) -> &'static str {
        match self {
            Command::Controller(_) => "info",
            _ => "warn",
        }
    }
}

/// The name kubectl gives a plugin it runs as `kubectl svm`: the binary linked under this name
/// anywhere on `PATH` makes kube-svm a kubectl plugin.
pub const PLUGIN_BINARY: &str = "kubectl-svm";

impl Cli {
    /// Parses the command line; invoked as [`PLUGIN_BINARY`], help and errors say `kubectl svm`.
    pub fn parse_invocation() -> Cli {
        let argv0 = std::env::args_os().next().unwrap_or_default();
        let invoked = std::path::Path::new(&argv0).file_name().unwrap_or_default().to_owned();
        let mut command = <Cli as clap::CommandFactory>::command();
        if invoked == PLUGIN_BINARY {
            command = command.name("kubectl svm").bin_name("kubectl svm");
        }
        let matches = command.get_matches();
        match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
            Ok(cli) => cli,
            Err(error) => error.exit(),
        }
    }

    /// Runs the chosen subcommand; what it returns is the process's exit code.
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        let done = |result: anyhow::Result<()>| result.map(|()| ExitCode::SUCCESS);
        match self.command {
            Command::Controller(args) => done(controller::run(*args).await),
            Command::Crds(args) => done(crds::run(args)),
            Command::Inspect(args) => done(inspect::run(args).await),
            Command::Migrate(args) => migrate::run(*args).await,
            Command::Plan(args) => plan::run(args).await,
            Command::Retry(args) => retry::run(args).await,
            Command::Status(args) => status::run(args).await,
        }
    }
}

/// Fires `shutdown` on SIGTERM or SIGINT.
async fn cancel_on_signal(shutdown: CancellationToken) {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                return;
            }
        };
    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
    }
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_command_line_is_well_formed() {
        <Cli as clap::CommandFactory>::command().debug_assert();
    }

    /// Each flag's parser yields the type of the field it fills (a mismatch is found only when
    /// the field is read, so read every one of the controller's).
    #[test]
    fn the_controller_reads_every_flag_it_defines() {
        let cli = Cli::try_parse_from(["kube-svm", "controller", "--discovery-keep-finished=3"])
            .expect("parsed");
        let Command::Controller(args) = cli.command else { panic!("{:?}", cli.command) };
        assert_eq!(args.discovery_keep_finished, 3);
        assert_eq!(args.discovery_interval, 600.0);
    }
}
