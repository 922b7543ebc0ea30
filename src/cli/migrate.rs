//! `kube-svm migrate`: migrations run in this process, without the controller or its CRDs (a
//! laptop, a CI job, a Helm hook). Each resource goes through the controller's
//! [`lifecycle`](crate::lifecycle), with this command as its host: what the controller keeps in
//! a migration's status is kept in a checkpoint file ([`super::checkpoints`]), so a run that was
//! interrupted goes on from where it stopped, and the operator reads lines on standard error and
//! a progress bar.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ListParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use super::cancel_on_signal;
use super::checkpoints::{Checkpoints, cluster_identity};
use super::engine::{Built, EngineArgs};
use super::kube::KubeArgs;
use super::progress::{Display, Show};
use super::status;
use crate::api::conditions::{STATUS_TRUE, STORED_VERSIONS_PRUNED, SUCCEEDED, events};
use crate::api::{
    GroupResource, GroupVersionResource, Phase, StorageVersionMigration,
    StorageVersionMigrationSpec, StorageVersionMigrationStatus,
};
use crate::apiserver::fence::Fence;
use crate::evidence::encoding::Observer;
use crate::lifecycle::cluster::Cluster;
use crate::lifecycle::{self, End, Lifecycle, Moment, Notice, Options, Tries, Unrecorded};
use crate::ops::metrics::Metrics;
use crate::rules::crd::CrdState;

/// How often `--wait-for-others` looks whether the other migration ended.
const OTHERS_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// Tries to list the migrations of other migrators, [`OTHERS_POLL`] apart.
const LIST_ATTEMPTS: u32 = 10;

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
    let built = engine.build(config, metrics)?;
    let client = Client::try_from(built.requests.clone()).context("failed to create a client")?;

    let mut names: Vec<GroupResource> = resources.iter().map(|r| GroupResource::parse(r)).collect();
    if all_stale {
        names.extend(stale_crds(&client).await?);
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
    let migrator = Migrator {
        client,
        built,
        observer: Observer::default(),
        fence: Fence::open(),
        checkpoints,
        restart,
        wait_for_others,
        clean_managed_fields,
        show: progress,
        terminal: std::io::stderr().is_terminal(),
        stop,
    };
    let mut failed = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let display = name.name();
        match migrator.migrate(name).await {
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

/// Every CRD whose `storedVersions` lists more than its storage version.
async fn stale_crds(client: &Client) -> anyhow::Result<Vec<GroupResource>> {
    let crds = Api::<CustomResourceDefinition>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("failed to list CustomResourceDefinitions")?;
    Ok(crds
        .items
        .iter()
        .filter(|crd| CrdState::of(crd).is_some_and(|s| s.is_stale()))
        .map(|crd| GroupResource {
            group: crd.spec.group.clone(),
            resource: crd.spec.names.plural.clone(),
        })
        .collect())
}

/// How one resource's migration ended, in words for the operator.
enum Ending {
    Succeeded(String),
    Failed(String),
    Interrupted(String),
}

/// What the migrations of one `kube-svm migrate` share.
struct Migrator {
    client: Client,
    built: Built,
    observer: Observer,
    /// Always open: this process is the only writer it knows of.
    fence: Fence,
    checkpoints: Checkpoints,
    restart: bool,
    wait_for_others: bool,
    /// `--clean-managed-fields`.
    clean_managed_fields: bool,
    show: Show,
    terminal: bool,
    /// Fires on SIGINT or SIGTERM.
    stop: CancellationToken,
}

impl Migrator {
    fn cluster(&self) -> Cluster<'_> {
        Cluster {
            client: &self.client,
            config: &self.built.requests,
            fence: &self.fence,
            request_timeout: self.built.request_timeout,
            encoding: self.built.encoding,
            observer: &self.observer,
        }
    }

    /// One resource's migration, through the controller's lifecycle.
    async fn migrate(&self, name: &GroupResource) -> Ending {
        if let Err(ending) = self.wait_for_others(name).await {
            return ending;
        }
        let spec = GroupVersionResource {
            group: name.group.clone(),
            version: String::new(),
            resource: name.resource.clone(),
        };
        let host = Host {
            migrator: self,
            name,
            migration: self.previous(name, spec),
            display: Mutex::new(None),
            processed_at_start: 0,
            saved: None,
        };
        let by = format!("kube-svm migrate (pid {})", std::process::id());
        let mut lifecycle =
            Lifecycle::new(self.cluster(), &self.built.engine, host, &self.stop, by);
        let end = lifecycle.run().await;
        match end {
            End::Finished(done) => describe(&done),
            End::Stopped { progress, .. } => {
                let processed = progress.processed();
                Ending::Interrupted(match &lifecycle.host.saved {
                    Some(path) => format!(
                        "{processed} objects handled; the checkpoint is in {}",
                        path.display()
                    ),
                    None => format!(
                        "{processed} objects handled; no checkpoint could be saved, so the next run starts over"
                    ),
                })
            }
            End::Later(why) => Ending::Failed(format!("could not go on ({why:?}); run it again")),
        }
    }

    /// The migration a checkpoint file left for `name`, or a new one.
    fn previous(
        &self,
        name: &GroupResource,
        spec: GroupVersionResource,
    ) -> StorageVersionMigration {
        let saved = if self.restart { None } else { self.checkpoints.load(name) };
        saved.unwrap_or_else(|| {
            let spec = StorageVersionMigrationSpec { resource: spec, continue_token: None };
            StorageVersionMigration::new(&name.name(), spec)
        })
    }

    /// Returns once no other migrator is migrating `name` (at most one migration per resource at
    /// a time, whoever runs it): at once, or after waiting with `--wait-for-others`. Otherwise
    /// the outcome that refuses it.
    async fn wait_for_others(&self, name: &GroupResource) -> Result<(), Ending> {
        let mut said = false;
        loop {
            let rows = self.migrations().await.map_err(|error| {
                Ending::Failed(format!(
                    "cannot tell whether another migrator is migrating it, so it was not started: {error:#}"
                ))
            })?;
            let running =
                rows.iter().find(|r| r.resource == name.name() && r.phase == Phase::Running);
            let Some(running) = running else { return Ok(()) };
            let other = format!("the {} migration {}", running.migrator.name(), running.name);
            if !self.wait_for_others {
                return Err(Ending::Failed(format!(
                    "refused: {other} is migrating it now; wait for it to end (kube-svm status -w), or pass --wait-for-others"
                )));
            }
            if !said {
                eprintln!("{}: waiting for {other} to end", name.name());
                said = true;
            }
            tokio::select! {
                () = tokio::time::sleep(OTHERS_POLL) => {}
                () = self.stop.cancelled() => {
                    return Err(Ending::Interrupted(format!("stopped while waiting for {other}")));
                }
            }
        }
    }

    /// Every migration, kube-svm's and the in-tree migrator's. An apiserver that asks to be
    /// asked again (429: a new CRD's storage still initializing; 5xx; no answer) is, a few times.
    async fn migrations(&self) -> anyhow::Result<Vec<status::Row>> {
        let mut attempt = 1;
        loop {
            let error = match status::gather(&self.client).await {
                Ok(rows) => return Ok(rows),
                Err(error) => error,
            };
            let transient = match error.downcast_ref::<kube::Error>() {
                Some(error) => crate::apiserver::answers::is_transient(error),
                None => false,
            };
            if !transient || attempt == LIST_ATTEMPTS {
                return Err(error);
            }
            attempt += 1;
            tokio::time::sleep(OTHERS_POLL).await;
        }
    }
}

/// This command as the lifecycle's host.
struct Host<'a> {
    migrator: &'a Migrator,
    name: &'a GroupResource,
    /// The migration as the checkpoint left it (or a new one).
    migration: StorageVersionMigration,
    /// Progress on standard error while the engine runs.
    display: Mutex<Option<Display>>,
    /// Objects handled when the run last started (the checkpoint resumed, or none).
    processed_at_start: u64,
    /// Where the last checkpoint was saved.
    saved: Option<PathBuf>,
}

impl Host<'_> {
    /// Ends the display, once the engine has stopped.
    fn finish_display(&mut self) {
        let display = self.display.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(display) = display {
            display.finish();
        }
    }
}

impl lifecycle::Host for Host<'_> {
    fn migration(&self) -> &StorageVersionMigration {
        &self.migration
    }

    fn options(&self) -> Options {
        Options {
            write_to_status: self.migrator.built.write_to_status,
            clean_managed_fields: self.migrator.clean_managed_fields,
            // A checkpoint file is cheap to save: after every page.
            checkpoint_interval: Duration::ZERO,
            // Interrupted, the run goes on only when the command is run again.
            discovery: Tries::ONCE,
            stopped_runs_stay_marked: false,
        }
    }

    async fn record(
        &mut self,
        status: &StorageVersionMigrationStatus,
        moment: Moment,
    ) -> Result<(), Unrecorded> {
        let checkpoints = &self.migrator.checkpoints;
        if moment != Moment::Running {
            self.finish_display();
        }
        match moment {
            Moment::Start => {
                self.processed_at_start = status.progress.as_ref().map_or(0, |p| p.processed);
                self.saved = checkpoints.save(self.name, &self.migration, status);
            }
            Moment::Running | Moment::Interrupted => {
                self.saved = checkpoints.save(self.name, &self.migration, status);
            }
            Moment::End => checkpoints.remove(self.name),
            // Nothing ran: a checkpoint from before stays for a later run.
            Moment::Unresolved => {}
        }
        Ok(())
    }

    async fn tell(&self, notice: Notice<'_>) {
        let name = self.name.name();
        match notice {
            Notice::Start { event, .. } if event == events::RESUMED => {
                let status = self.migration.status.as_ref();
                let done = status.and_then(|s| s.progress.as_ref()).map_or(0, |p| p.processed);
                eprintln!("{name}: resuming from the checkpoint after {done} objects");
            }
            Notice::Start { event, note } if event == events::RESTARTED => eprintln!("{note}"),
            Notice::Progress(progress) => {
                let mut display = self.display.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(display) = display.as_mut() {
                    display.update(progress);
                }
            }
            Notice::Confirming { storage, .. } => eprintln!(
                "{name}: confirming that the apiservers encode in {storage} before the first write"
            ),
            Notice::Encoding { confirmed: Some(true), evidence, .. } => {
                eprintln!("{name}: {evidence}");
            }
            Notice::Encoding { evidence, .. } => eprintln!(
                "{name}: not confirmed, so storedVersions will be kept; migrating anyway: {evidence}"
            ),
            Notice::Retarget(change) => eprintln!(
                "{name}: {}; before the first write, so only the target changes",
                change.message
            ),
            Notice::Unproven(change) => {
                eprintln!("{name}: the objects were rewritten, but {}", change.message);
            }
            // The result line says how it ended.
            Notice::Start { .. }
            | Notice::StoredVersions(_)
            | Notice::Ended { .. }
            | Notice::Unresolved { .. }
            | Notice::Unresolvable(_) => {}
        }
        // The run writes next: its progress is shown from here.
        if let Notice::Start { .. } = notice {
            let migrator = self.migrator;
            let (show, terminal, name) = (migrator.show, migrator.terminal, self.name.name());
            let display = Display::new(show, terminal, &name, self.processed_at_start);
            *self.display.lock().unwrap_or_else(|p| p.into_inner()) = Some(display);
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
