//! `kube-svm migrate`: its arguments, and what it prints. The migrations themselves run in
//! [`crate::migrate`]; the operator reads a line per resource on standard output, and lines
//! and a progress bar on standard error as it goes.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;

use super::cancel_on_signal;
use super::engine::EngineArgs;
use super::kube::KubeArgs;
use super::progress::{Display, Show};
use crate::api::conditions::{STATUS_TRUE, STORED_VERSIONS_PRUNED, SUCCEEDED};
use crate::api::{GroupResource, StorageVersionMigrationStatus};
use crate::engine::Progress;
use crate::evidence::encoding::Observer;
use crate::migrate::checkpoints::{Checkpoints, cluster_identity};
use crate::migrate::{self, Choices, Console, Migrator, Outcome};
use crate::ops::metrics::Metrics;

/// The exit code of a run stopped by SIGINT or SIGTERM (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: u8 = 130;

#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// Resources to migrate, as `resource[.group]` (`secrets` after an encryption key rotation,
    /// `widgets.example.com` after a CRD's storage version changed).
    pub resources: Vec<String>,

    /// Also migrate every CRD whose `status.storedVersions` lists more than its storage version.
    #[arg(long)]
    pub all_stale: bool,

    #[command(flatten)]
    pub kube: KubeArgs,

    #[command(flatten)]
    pub engine: EngineArgs,

    /// Directory of the checkpoints an interrupted run resumes from; defaults to
    /// `$XDG_STATE_HOME/kube-svm/migrate` (`~/.local/state/kube-svm/migrate`).
    #[arg(long, env = "KUBE_SVM_CHECKPOINT_DIR")]
    pub checkpoint_dir: Option<PathBuf>,

    /// Start every resource from its first object, even where a checkpoint says where an
    /// interrupted run stopped.
    #[arg(long)]
    pub restart: bool,

    /// When a kube-svm controller or the in-tree migrator is migrating a resource, wait for it to
    /// end and then migrate the resource, instead of refusing it (for a Helm hook running beside
    /// the controller's CRD trigger).
    #[arg(long)]
    pub wait_for_others: bool,

    /// Also remove, from every object written, the `managedFields` entries naming a version
    /// the CRD no longer serves, so the version can be removed from the CRD without breaking
    /// server-side apply (an object left with none keeps one entry for its latest manager).
    #[arg(long)]
    pub clean_managed_fields: bool,

    /// How progress is shown (on standard error).
    #[arg(long, value_enum, default_value_t = Show::Auto)]
    pub progress: Show,
}

pub async fn run(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let MigrateArgs {
        resources,
        all_stale,
        kube,
        engine,
        checkpoint_dir,
        restart,
        wait_for_others,
        clean_managed_fields,
        progress,
    } = args;
    let config = kube.config().await?;
    let metrics = Arc::new(Metrics::new().context("failed to register the metrics")?);
    let built = engine.build(config, metrics, None)?;
    let client = built.requests.client().clone();

    let mut names: Vec<GroupResource> = resources.iter().map(|r| GroupResource::parse(r)).collect();
    if all_stale {
        let stale = migrate::stale_crds(&client).await;
        names.extend(stale.context("failed to list CustomResourceDefinitions")?);
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
    if names.is_empty() {
        if all_stale {
            println!(
                "Nothing to migrate: every CRD's storedVersions lists only its storage version."
            );
            return Ok(ExitCode::SUCCESS);
        }
        anyhow::bail!("name the resources to migrate (resource[.group]), or pass --all-stale");
    }

    let checkpoints = Checkpoints::new(checkpoint_dir, cluster_identity(&client).await);
    let stop = CancellationToken::new();
    tokio::spawn(cancel_on_signal(stop.clone()));
    let choices = Choices {
        restart,
        wait_for_others,
        clean_managed_fields,
        write_to_status: built.write_to_status,
    };
    let terminal = std::io::stderr().is_terminal();
    let migrator = Migrator {
        requests: built.requests,
        encoding: built.encoding,
        engine: built.engine,
        checkpoints,
        choices,
        console: Terminal { show: progress, terminal, display: Mutex::new(None) },
        stop,
        observer: Observer::default(),
    };
    let mut failed = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let display = name.name();
        match ending(migrator.migrate(name).await) {
            Ending::Succeeded(summary) => println!("{display}: {summary}"),
            Ending::Failed(why) => {
                println!("{display}: FAILED: {why}");
                failed.push(display);
            }
            Ending::Interrupted(how) => {
                println!("{display}: interrupted: {how}");
                let rest: Vec<String> = names[i + 1..].iter().map(GroupResource::name).collect();
                if !rest.is_empty() {
                    println!("Not started: {}.", rest.join(", "));
                }
                println!(
                    "To resume, run the same command again: each resource goes on from its checkpoint (--restart starts over)."
                );
                return Ok(ExitCode::from(EXIT_INTERRUPTED));
            }
        }
    }
    match failed.len() {
        0 => Ok(ExitCode::SUCCESS),
        n => {
            eprintln!("{n} of {} resources did not succeed: {}", names.len(), failed.join(", "));
            Ok(ExitCode::FAILURE)
        }
    }
}

/// How one resource's migration ended, in words for the operator.
enum Ending {
    Succeeded(String),
    Failed(String),
    Interrupted(String),
}

fn ending(outcome: Outcome) -> Ending {
    match outcome {
        Outcome::Finished(done) => describe(&done),
        Outcome::Interrupted { processed, checkpoint: Some(path) } => Ending::Interrupted(format!(
            "{processed} objects handled; the checkpoint is in {}",
            path.display()
        )),
        Outcome::Interrupted { processed, checkpoint: None } => Ending::Interrupted(format!(
            "{processed} objects handled; no checkpoint could be saved, so the next run starts over"
        )),
        Outcome::InterruptedWaiting { other } => {
            Ending::Interrupted(format!("stopped while waiting for {other}"))
        }
        Outcome::Refused(why) => Ending::Failed(why),
        Outcome::Done(why) => Ending::Succeeded(why),
        Outcome::Later(why) => Ending::Failed(format!("could not go on ({why:?}); run it again")),
    }
}

/// Standard error as the migrations' console: lines, and the progress of the run that writes.
struct Terminal {
    show: Show,
    /// Whether standard error is a terminal (a bar), or not (lines).
    terminal: bool,
    display: Mutex<Option<Display>>,
}

impl Console for Terminal {
    fn say(&self, line: &str) {
        eprintln!("{line}");
    }

    fn writing(&self, resource: &str, processed_at_start: u64) {
        let display = Display::new(self.show, self.terminal, resource, processed_at_start);
        *self.display.lock().unwrap_or_else(|p| p.into_inner()) = Some(display);
    }

    fn progress(&self, progress: &Progress) {
        let mut display = self.display.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(display) = display.as_mut() {
            display.update(progress);
        }
    }

    fn written(&self) {
        let display = self.display.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(display) = display {
            display.finish();
        }
    }
}

/// The operator's summary of a finished migration. A CRD whose `storedVersions` was kept has not
/// reached what the migration was for, so that is a failure too, with the reason.
fn describe(done: &StorageVersionMigrationStatus) -> Ending {
    let first = done.conditions.first();
    let message = |c: Option<&crate::api::MigrationCondition>| {
        c.and_then(|c| c.message.clone()).unwrap_or_default()
    };
    if first.map(|c| c.type_.as_str()) != Some(SUCCEEDED) {
        return Ending::Failed(message(first));
    }
    let progress = done.progress.clone().unwrap_or_default();
    let counts = format!("Succeeded: {} objects ({})", progress.processed, progress.outcomes());
    let elapsed = match (&done.start_time, &done.completion_time) {
        (Some(start), Some(end)) => {
            let seconds = end.0.duration_since(start.0).as_secs_f64().max(0.0);
            format!(" in {}", super::figures::clock(std::time::Duration::from_secs_f64(seconds)))
        }
        _ => String::new(),
    };
    let pruned = done.conditions.iter().find(|c| c.type_ == STORED_VERSIONS_PRUNED);
    match pruned {
        None => Ending::Succeeded(format!("{counts}{elapsed}")),
        Some(c) if c.status == STATUS_TRUE => {
            Ending::Succeeded(format!("{counts}{elapsed}; {}", message(Some(c))))
        }
        Some(c) => Ending::Failed(format!(
            "the objects were migrated ({counts}{elapsed}), but storedVersions was kept: {}",
            message(Some(c))
        )),
    }
}
