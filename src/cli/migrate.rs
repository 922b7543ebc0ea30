//! `kube-svm migrate`: migrations run in this process, without the controller or its CRDs (a
//! laptop, a CI job, a Helm hook). Each resource takes the controller's steps ([`crate::steps`])
//! with the same engine, the same status computations ([`crate::controller::status`]) and the
//! same pruning rules. What the controller keeps in a migration's status is kept in a checkpoint
//! file instead, so a run that was interrupted goes on from where it stopped.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::cancel_on_signal;
use super::engine::{Built, EngineArgs};
use super::kube::KubeArgs;
use super::progress::{self, Display, Show};
use super::status;
use crate::api::conditions::{STATUS_TRUE, STORED_VERSIONS_PRUNED, SUCCEEDED};
use crate::api::{
    GroupResource, GroupVersionResource, MigrationTarget, StorageVersionMigration,
    StorageVersionMigrationSpec, StorageVersionMigrationStatus,
};
use crate::controller::status::{self as computed, Start};
use crate::encoding::Observer;
use crate::engine::{Engine, Finished, Job, Progress, Resource};
use crate::fence::Fence;
use crate::metrics::Metrics;
use crate::steps::{self, Cluster};
use crate::storedversions::CrdState;

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
        show: progress,
        terminal: std::io::stderr().is_terminal(),
        stop,
    };
    let mut failed = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let display = name.name();
        match migrator.migrate(name).await {
            Outcome::Succeeded(summary) => println!("{display}: {summary}"),
            Outcome::Failed(why) => {
                println!("{display}: FAILED: {why}");
                failed.push(display);
            }
            Outcome::Interrupted(how) => {
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
        .filter(|crd| CrdState::of(crd).is_some_and(|s| crate::plan::crd_reason(&s).is_some()))
        .map(|crd| GroupResource {
            group: crd.spec.group.clone(),
            resource: crd.spec.names.plural.clone(),
        })
        .collect())
}

/// How one resource's migration ended, in words for the operator.
enum Outcome {
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
            storage_version_settle: self.built.storage_version_settle,
            storage_version_wait: self.built.storage_version_wait,
            observer: &self.observer,
        }
    }

    /// The steps of one resource's migration, as the controller takes them: a change of the
    /// storage version (or of the CRD) after the first write starts the run over from the first
    /// object, a bounded number of times.
    async fn migrate(&self, name: &GroupResource) -> Outcome {
        let spec = GroupVersionResource {
            group: name.group.clone(),
            version: String::new(),
            resource: name.resource.clone(),
        };
        let cluster = self.cluster();
        let (mut resource, mut crd) = match self.resolve(&spec).await {
            Ok(resolved) => resolved,
            Err(outcome) => return outcome,
        };
        if let Err(outcome) = self.wait_for_others(name).await {
            return outcome;
        }
        let migration = self.previous(name, spec);
        let hash = resource.storage_version_hash.as_deref();
        let crd_now = crd.as_ref().map(computed::CrdNow::of);
        let mut start = computed::start_point(&migration, hash, crd_now.as_ref());
        if start.keeps_target {
            let done = start.progress.processed();
            eprintln!("{}: resuming from the checkpoint after {done} objects", name.name());
        } else if start.event == crate::api::conditions::events::RESTARTED {
            eprintln!("{}: {}", name.name(), start.note);
        }
        let mut last = migration.status.clone();
        let by = format!("kube-svm migrate (pid {})", std::process::id());
        let mut marked = None;
        let mut retargets = 0;
        let outcome = loop {
            let target = tokio::select! {
                target = self.target(&cluster, last.as_ref(), &resource, crd.as_ref(), &start) => target,
                () = self.stop.cancelled() => {
                    break Outcome::Interrupted("stopped before the first write".into());
                }
            };
            if let Some(change) = steps::target_changed(&cluster, &resource, &target).await {
                retargets += 1;
                eprintln!(
                    "{}: {}; before the first write, so only the target changes",
                    name.name(),
                    change.message
                );
                if retargets > computed::MAX_RETARGETS {
                    let done = computed::kept_changing(last.as_ref(), &change, Timestamp::now());
                    break describe(&Progress::default(), &done);
                }
            } else {
                let current = computed::started(last.as_ref(), &target, &start, Timestamp::now());
                self.checkpoints.save(name, &migration, &current);
                if target.crd_generation.is_some() && marked.is_none() {
                    steps::mark_migrating(&cluster, &resource, true, &by).await;
                    marked = Some(resource.clone());
                }
                let ran =
                    self.run_engine(name, &migration, &resource, &target, start.clone(), current);
                let (change, current) = match ran.await {
                    Ended::Interrupted(how) => break Outcome::Interrupted(how),
                    Ended::Changed(change, current) => (change, *current),
                    Ended::Done(progress, done) => {
                        let spec = &migration.spec.resource;
                        match self.verify(&cluster, spec, &resource, &target, *done).await {
                            Verified::StartOver(change, current) => (change, current),
                            Verified::Done(done) => {
                                let done = self.settle(&cluster, &resource, &target, done).await;
                                self.checkpoints.remove(name);
                                break describe(&progress, &done);
                            }
                        }
                    }
                };
                let restarts = start.restarts + 1;
                match computed::restart(&current, &change, restarts, Timestamp::now()) {
                    Ok(next) => {
                        eprintln!("{}: {}", name.name(), next.note);
                        (start, last) = (next, Some(current));
                    }
                    Err(failed) => {
                        self.checkpoints.remove(name);
                        break describe(&Progress::default(), &failed);
                    }
                }
            }
            (resource, crd) = match self.resolve(&migration.spec.resource).await {
                Ok(resolved) => resolved,
                Err(outcome) => break outcome,
            };
        };
        if let Some(resource) = marked {
            steps::mark_migrating(&cluster, &resource, false, &by).await;
        }
        outcome
    }

    /// The resource through discovery, and the CRD behind it.
    async fn resolve(
        &self,
        spec: &GroupVersionResource,
    ) -> Result<(Resource, Option<CustomResourceDefinition>), Outcome> {
        let resource = match Resource::resolve(&self.client, spec, false).await {
            Ok(resource) => resource,
            Err(error) => return Err(Outcome::Failed(crate::error_chain(&error))),
        };
        match steps::crd_of(&self.cluster(), &resource).await {
            Ok(crd) => Ok((resource, crd)),
            Err(error) => {
                let error = crate::error_chain(&error);
                Err(Outcome::Failed(format!("failed to read the CRD of {resource}: {error}")))
            }
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
    async fn wait_for_others(&self, name: &GroupResource) -> Result<(), Outcome> {
        let mut said = false;
        loop {
            let rows = self.migrations().await.map_err(|error| {
                Outcome::Failed(format!(
                    "cannot tell whether another migrator is migrating it, so it was not started: {error:#}"
                ))
            })?;
            let running = rows.iter().find(|r| r.resource == name.name() && r.phase == "Running");
            let Some(running) = running else { return Ok(()) };
            let other = format!("the {} migration {}", running.migrator, running.name);
            if !self.wait_for_others {
                return Err(Outcome::Failed(format!(
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
                    return Err(Outcome::Interrupted(format!("stopped while waiting for {other}")));
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
                Some(kube::Error::Api(status)) => status.code == 429 || status.code >= 500,
                Some(_) => true,
                None => false,
            };
            if !transient || attempt == LIST_ATTEMPTS {
                return Err(error);
            }
            attempt += 1;
            tokio::time::sleep(OTHERS_POLL).await;
        }
    }

    /// What the migration targets: as recorded at its first start when it resumes; for a CRD,
    /// its generation, storage version and whether the apiservers already encode in it.
    async fn target(
        &self,
        cluster: &Cluster<'_>,
        previous: Option<&StorageVersionMigrationStatus>,
        resource: &Resource,
        crd: Option<&CustomResourceDefinition>,
        start: &Start,
    ) -> MigrationTarget {
        if let Some(known) = computed::known_target(previous, start) {
            return known;
        }
        let name =
            GroupResource { group: resource.group.clone(), resource: resource.plural.clone() };
        let storage = match crd.and_then(CrdState::of) {
            Some(state) => state.storage_version,
            None => format!(
                "storage version hash {}",
                resource.storage_version_hash.as_deref().unwrap_or("none")
            ),
        };
        eprintln!(
            "{}: confirming that the apiservers encode in {storage} before the first write",
            name.name()
        );
        let target = steps::target_of(cluster, resource, crd, false).await;
        let evidence = target.encoding_evidence.as_deref().unwrap_or_default();
        match target.encoding_confirmed {
            Some(true) => eprintln!("{}: {evidence}", name.name()),
            _ => eprintln!(
                "{}: not confirmed, so storedVersions will be kept; migrating anyway: {evidence}",
                name.name()
            ),
        }
        target
    }

    /// The engine, showing progress and saving checkpoints as it goes.
    async fn run_engine(
        &self,
        name: &GroupResource,
        migration: &StorageVersionMigration,
        resource: &Resource,
        target: &MigrationTarget,
        start: Start,
        current: StorageVersionMigrationStatus,
    ) -> Ended {
        let mut display = Display::new(self.show, self.terminal, &name.name(), &start.progress);
        let (report, mut updates) = watch::channel(start.progress.clone());
        let job = Job {
            resource: resource.clone(),
            write_to_status: self.built.write_to_status && resource.patchable_status,
            resume: start.progress,
            fence: self.fence.clone(),
        };
        let engine: &Engine = &self.built.engine;
        // This run only: a change of the target stops it, and the migration goes on.
        let cancel = self.stop.child_token();
        let run = engine.run(job, &report, &cancel);
        tokio::pin!(run);
        let cluster = self.cluster();
        let guard = steps::guard(&cluster, resource, target);
        tokio::pin!(guard);
        let finished = loop {
            tokio::select! {
                finished = &mut run => break finished,
                Ok(()) = updates.changed() => {
                    let progress = updates.borrow_and_update().clone();
                    display.update(&progress);
                    let checkpoint = computed::running(Some(&current), target, &progress, Timestamp::now());
                    self.checkpoints.save(name, migration, &checkpoint);
                }
                change = &mut guard => {
                    cancel.cancel();
                    let _ = (&mut run).await;
                    display.finish();
                    let progress = updates.borrow().clone();
                    let current = computed::running(Some(&current), target, &progress, Timestamp::now());
                    return Ended::Changed(change, Box::new(current));
                }
            }
        };
        display.update(&updates.borrow().clone());
        display.finish();
        let now = Timestamp::now();
        match finished {
            Ok(Finished::Completed(progress)) => {
                let done = computed::completed(Some(&current), target, &progress, now);
                Ended::Done(progress, Box::new(done))
            }
            Ok(Finished::Cancelled(progress)) => {
                let checkpoint = computed::running(Some(&current), target, &progress, now);
                let saved = self.checkpoints.save(name, migration, &checkpoint);
                let processed = progress.processed();
                Ended::Interrupted(match saved {
                    Some(path) => format!(
                        "{processed} objects handled; the checkpoint is in {}",
                        path.display()
                    ),
                    None => format!(
                        "{processed} objects handled; no checkpoint could be saved, so the next run starts over"
                    ),
                })
            }
            Err(error) => {
                let progress = updates.borrow().clone();
                let failed =
                    computed::engine_failed(Some(&current), target, &progress, &error, now);
                Ended::Done(progress, Box::new(failed))
            }
        }
    }

    /// The check at the end of a completed run, as the controller makes it: a change of the
    /// resource's storage version (or of its CRD) starts the run over; the resource no longer
    /// served fails it.
    async fn verify(
        &self,
        cluster: &Cluster<'_>,
        spec: &GroupVersionResource,
        resource: &Resource,
        target: &MigrationTarget,
        done: StorageVersionMigrationStatus,
    ) -> Verified {
        if done.conditions.first().map(|c| c.type_.as_str()) != Some(SUCCEEDED) {
            return Verified::Done(done);
        }
        match steps::changed_since_start(cluster, spec, false, resource, target).await {
            None => Verified::Done(done),
            Some(change) if change.starts_over() => Verified::StartOver(change, done),
            Some(change) if change.then == steps::Then::Unproven => {
                eprintln!("{resource}: the objects were rewritten, but {}", change.message);
                Verified::Done(computed::unproven(done, &change.message))
            }
            Some(change) => {
                let message = format!(
                    "{}; objects written before the change may be stored in the old version: migrate again",
                    change.message
                );
                Verified::Done(computed::failed(
                    Some(&done),
                    change.reason,
                    message,
                    Timestamp::now(),
                ))
            }
        }
    }

    /// `storedVersions` after a run, as the controller decides it.
    async fn settle(
        &self,
        cluster: &Cluster<'_>,
        resource: &Resource,
        target: &MigrationTarget,
        mut done: StorageVersionMigrationStatus,
    ) -> StorageVersionMigrationStatus {
        let run = computed::run_of(&done);
        if let Some(pruned) = steps::settle_stored_versions(cluster, resource, target, &run).await {
            done.conditions.retain(|c| c.type_ != pruned.type_);
            done.conditions.push(pruned);
        }
        done
    }
}

/// How the engine's part ended.
enum Ended {
    /// Completed or failed, with the status it leads to.
    Done(Progress, Box<StorageVersionMigrationStatus>),
    /// The target changed under the run; the status with its progress then.
    Changed(steps::Change, Box<StorageVersionMigrationStatus>),
    Interrupted(String),
}

/// What the check at the end of a completed run found.
enum Verified {
    /// Nothing changed (or the run failed): this is the status.
    Done(StorageVersionMigrationStatus),
    /// The target changed while the run went on: start over.
    StartOver(steps::Change, StorageVersionMigrationStatus),
}

/// The operator's summary of a finished migration. A CRD whose `storedVersions` was kept has not
/// reached what the migration was for, so that is a failure too, with the reason.
fn describe(progress: &Progress, done: &StorageVersionMigrationStatus) -> Outcome {
    let first = done.conditions.first();
    let message = |c: Option<&crate::api::MigrationCondition>| {
        c.and_then(|c| c.message.clone()).unwrap_or_default()
    };
    if first.map(|c| c.type_.as_str()) != Some(SUCCEEDED) {
        return Outcome::Failed(message(first));
    }
    let counts = format!(
        "Succeeded: {} objects ({} rewritten, {} already current, {} skipped)",
        progress.processed(),
        progress.rewritten,
        progress.already_current,
        progress.skipped
    );
    let elapsed = match (&done.start_time, &done.completion_time) {
        (Some(start), Some(end)) => {
            let seconds = end.0.duration_since(start.0).as_secs_f64().max(0.0);
            format!(" in {}", progress::clock(std::time::Duration::from_secs_f64(seconds)))
        }
        _ => String::new(),
    };
    let pruned = done.conditions.iter().find(|c| c.type_ == STORED_VERSIONS_PRUNED);
    match pruned {
        None => Outcome::Succeeded(format!("{counts}{elapsed}")),
        Some(c) if c.status == STATUS_TRUE => {
            Outcome::Succeeded(format!("{counts}{elapsed}; {}", message(Some(c))))
        }
        Some(c) => Outcome::Failed(format!(
            "the objects were migrated ({counts}{elapsed}), but storedVersions was kept: {}",
            message(Some(c))
        )),
    }
}

/// What tells this cluster from any other, for checkpoints: the uid of its `kube-system`
/// namespace (a cluster created again at the same address has another). `None`, said once,
/// when it cannot be read: then nothing is checkpointed, as nothing could be resumed safely.
async fn cluster_identity(client: &Client) -> Option<String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.get_metadata("kube-system").await {
        Ok(namespace) => namespace.metadata.uid,
        Err(error) => {
            warn!(%error, "cannot read the kube-system namespace to tell this cluster apart; an interrupted run will start over");
            None
        }
    }
}

/// Checkpoint files, one per resource and cluster: the migration's status as the controller
/// would have recorded it.
struct Checkpoints {
    dir: Option<PathBuf>,
    /// Tells the clusters apart (see [`cluster_identity`]).
    cluster: String,
    /// Whether saving failed already (said once, not on every page).
    failed: std::sync::atomic::AtomicBool,
}

impl Checkpoints {
    fn new(dir: Option<PathBuf>, cluster: Option<String>) -> Checkpoints {
        let Some(cluster) = cluster else {
            return Checkpoints { dir: None, cluster: String::new(), failed: Default::default() };
        };
        let dir = dir.or_else(|| {
            let state = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from).or_else(|| {
                std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state"))
            })?;
            Some(state.join("kube-svm/migrate"))
        });
        Checkpoints { dir, cluster, failed: Default::default() }
    }

    fn path(&self, name: &GroupResource) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        Some(dir.join(format!("{}@{}.json", name.name(), self.cluster)))
    }

    /// The migration saved for `name`; an unreadable checkpoint is said and ignored.
    fn load(&self, name: &GroupResource) -> Option<StorageVersionMigration> {
        let path = self.path(name)?;
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
            Err(error) => {
                warn!(path = %path.display(), %error, "cannot read the checkpoint; starting over");
                return None;
            }
        };
        match serde_json::from_slice(&text) {
            Ok(migration) => Some(migration),
            Err(error) => {
                warn!(path = %path.display(), %error, "the checkpoint is damaged; starting over");
                None
            }
        }
    }

    /// Saves `status` as the checkpoint of `name`; returns where, or `None` when it could not be.
    fn save(
        &self,
        name: &GroupResource,
        migration: &StorageVersionMigration,
        status: &StorageVersionMigrationStatus,
    ) -> Option<PathBuf> {
        let path = self.path(name)?;
        let mut migration = migration.clone();
        migration.status = Some(status.clone());
        let written = (|| -> std::io::Result<()> {
            let dir = path.parent().unwrap_or(&path);
            std::fs::create_dir_all(dir)?;
            let temporary = path.with_extension("json.tmp");
            std::fs::write(&temporary, serde_json::to_vec_pretty(&migration)?)?;
            std::fs::rename(&temporary, &path)
        })();
        match written {
            Ok(()) => Some(path),
            Err(error) => {
                if !self.failed.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    warn!(path = %path.display(), %error, "cannot save checkpoints; an interrupted run will start over");
                }
                None
            }
        }
    }

    fn remove(&self, name: &GroupResource) {
        if let Some(path) = self.path(name) {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_are_kept_apart_by_cluster() {
        let dir = PathBuf::from("/state");
        let a = Checkpoints::new(Some(dir.clone()), Some("uid-a".into()));
        let b = Checkpoints::new(Some(dir.clone()), Some("uid-b".into()));
        let unknown = Checkpoints::new(Some(dir), None);
        let widgets = GroupResource::parse("widgets.example.com");
        assert_ne!(a.path(&widgets), b.path(&widgets));
        let file = a.path(&widgets).map(|p| p.display().to_string()).unwrap_or_default();
        assert_eq!(file, "/state/widgets.example.com@uid-a.json");
        assert_eq!(unknown.path(&widgets), None, "a cluster not told apart is not checkpointed");
    }
}
