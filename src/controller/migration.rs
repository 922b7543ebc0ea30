//! One running migration, as a short list of named steps (see [`Task::migrate`]): resolve the
//! resource, decide where to start and what to target, record the start, run the engine with
//! checkpoints beside it, verify the resource is still served in the same storage version,
//! settle the CRD's `storedVersions`, and record the end. The statuses come from the pure
//! functions in [`super::status`]; every write goes through [`StatusWriter`], so nothing is
//! written once the leader's term is over or someone else finished the migration.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource as _, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, instrument, warn};

use super::Context;
use super::status::{self, Start};
use super::status_writer::{self, StatusWriter};
use crate::api::conditions::{FAILED, STATUS_TRUE, SUCCEEDED, events, reasons};
use crate::api::{
    GroupResource, MigrationTarget, StorageVersionMigration, StorageVersionMigrationStatus,
};
use crate::engine::{self, Job, Progress, Resource};
use crate::fence::bounded;
use crate::in_tree;
use crate::metrics::{UNRESOLVED_RESOURCE, resource_label};
use crate::steps;

/// How often a running migration checks that its object still exists.
const DELETION_CHECK: Duration = Duration::from_millis(250);

/// How long the writes that start and end a migration are retried before the task gives up
/// (and the migration is taken up again later).
const RECORD_PATIENCE: Duration = Duration::from_secs(60);

/// How a migration task ended, for the scheduler.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// Nothing left to do now: finished, failed, deleted, or stopped with a checkpoint.
    Done,
    /// Discovery (or the CRD) could not be read; try again later.
    DiscoveryFailed,
    /// The migration's status could not be written; take it up again later.
    Unrecorded,
    /// The in-tree migrator is migrating the same resource; take it up again later.
    Deferred,
}

#[instrument(skip_all, fields(migration = %migration.name_any(), resource = %migration.spec.resource.resource))]
pub(super) async fn run(
    context: &Context,
    migration: Arc<StorageVersionMigration>,
    discovery_failures: u32,
) -> Ended {
    let metrics = context.engine.metrics().clone();
    metrics.migrations_running.inc();
    let _running = scopeguard(move || metrics.migrations_running.dec());
    let cancel = context.stopping.child_token();
    let marked_crd = Mutex::new(None);
    let task = Task { context, migration: &migration, cancel: &cancel, marked_crd: &marked_crd };
    let ended = tokio::select! {
        ended = task.migrate(discovery_failures) => ended,
        () = watch_deletion(context, &migration, cancel.clone()) => {
            info!("migration deleted; stopped");
            task.unmark_crd().await;
            Ended::Done
        }
    };
    info!(?ended, "migration task ended");
    ended
}

/// What the steps of one migration share.
struct Task<'a> {
    context: &'a Context,
    migration: &'a StorageVersionMigration,
    /// Fires when the migration is deleted or the controller stops.
    cancel: &'a CancellationToken,
    /// The resource whose CRD was marked `StorageMigrating` (and so must be unmarked).
    marked_crd: &'a Mutex<Option<Resource>>,
}

impl Task<'_> {
    /// The steps of a migration, in order. A change of the resource's storage version (or of
    /// its CRD) after the first write voids the writes so far: the run starts over from the
    /// first object with the new target, a bounded number of times; a change seen before the
    /// first write only retargets.
    async fn migrate(&self, discovery_failures: u32) -> Ended {
        if self.in_tree_migrating().await {
            return Ended::Deferred;
        }
        let api: Api<StorageVersionMigration> = Api::all(self.context.client.clone());
        let mut writer = StatusWriter::new(
            api,
            self.migration,
            self.context.fence.clone(),
            self.context.settings.request_timeout,
        );
        let (mut resource, mut crd) = match self.resolve(&mut writer, discovery_failures).await {
            Ok(resolved) => resolved,
            Err(ended) => return ended,
        };
        let hash = resource.storage_version_hash.as_deref();
        let crd_now = crd.as_ref().map(status::CrdNow::of);
        let mut start = status::start_point(self.migration, hash, crd_now.as_ref());
        let mut last = self.previous().cloned();
        let mut retargets = 0;
        loop {
            let attempt = self.attempt(&mut writer, &resource, crd.as_ref(), &start, last.as_ref());
            match attempt.await {
                Attempt::Ended(ended) => return ended,
                Attempt::Finished(finished) => {
                    let Finished { target, progress, mut done } = *finished;
                    if crd.is_some() {
                        self.settle_stored_versions(&resource, &target, &mut done).await;
                    }
                    return self.record_end(&mut writer, &resource, &progress, done).await;
                }
                Attempt::Retarget(change) => {
                    retargets += 1;
                    info!(change = change.message, "the target changed before the first write");
                    if retargets > status::MAX_RETARGETS {
                        let done = status::kept_changing(last.as_ref(), &change, Timestamp::now());
                        let progress = start.progress.clone();
                        return self.record_end(&mut writer, &resource, &progress, done).await;
                    }
                }
                Attempt::StartOver { change, current } => {
                    let restarts = start.restarts + 1;
                    warn!(
                        change = change.message,
                        restarts, "the target changed mid-run; starting over"
                    );
                    match status::restart(&current, &change, restarts, Timestamp::now()) {
                        Ok(next) => (start, last) = (next, Some(*current)),
                        Err(failed) => {
                            let progress = Progress::default();
                            return self
                                .record_end(&mut writer, &resource, &progress, *failed)
                                .await;
                        }
                    }
                }
            }
            (resource, crd) = match self.resolve(&mut writer, 0).await {
                Ok(resolved) => resolved,
                Err(ended) => return ended,
            };
        }
    }

    /// One run from `start`, after `last` (the status last written): target, start, engine and
    /// the check at the end.
    async fn attempt(
        &self,
        writer: &mut StatusWriter,
        resource: &Resource,
        crd: Option<&CustomResourceDefinition>,
        start: &Start,
        last: Option<&StorageVersionMigrationStatus>,
    ) -> Attempt {
        // The encoding check may wait minutes: a stopping controller does not wait for it.
        let target = tokio::select! {
            target = self.target(resource, crd, start, last) => target,
            () = self.cancel.cancelled() => return Attempt::Ended(Ended::Done),
        };
        let cluster = self.context.cluster();
        if let Some(change) = steps::target_changed(&cluster, resource, &target).await {
            return Attempt::Retarget(change);
        }
        let current = match self.record_start(writer, resource, &target, start, last).await {
            Ok(current) => current,
            Err(ended) => return Attempt::Ended(ended),
        };
        let (progress, mut done) =
            match self.run_engine(writer, resource, &target, start.clone(), current).await {
                Ran::Stopped => return Attempt::Ended(Ended::Done),
                Ran::Changed { change, current } => {
                    return Attempt::StartOver { change, current: Box::new(current) };
                }
                Ran::Finished { progress, done } => (progress, done),
            };
        let change = tokio::select! {
            change = self.verify(resource, &target, &done) => change,
            // Stopping: the next leader runs the migration again from its last checkpoint.
            () = self.cancel.cancelled() => return Attempt::Ended(Ended::Done),
        };
        match change {
            Some(change) if change.starts_over() => {
                return Attempt::StartOver { change, current: Box::new(done) };
            }
            Some(change) if change.then == steps::Then::Unproven => {
                warn!(change = change.message, "the run proves nothing about the encoding");
                let note = format!("the objects were rewritten, but {}", change.message);
                self.publish(EventType::Warning, events::ENCODING_UNCONFIRMED, note).await;
                done = status::unproven(done, &change.message);
            }
            Some(change) => {
                let message = format!(
                    "{}; {} objects were processed, but those written before the change may be stored in the old version: migrate again",
                    change.message,
                    progress.processed()
                );
                done = status::failed(Some(&done), change.reason, message, Timestamp::now());
            }
            None => {}
        }
        Attempt::Finished(Box::new(Finished { target, progress, done }))
    }

    /// Step 0: at most one migration per resource at a time, whoever runs it: while the in-tree
    /// migrator is migrating the same resource, this migration waits for it (an Event says so).
    /// An in-tree API that cannot be read holds nothing back: two migrators writing the same
    /// objects waste work, but prove nothing false.
    async fn in_tree_migrating(&self) -> bool {
        let spec = &self.migration.spec.resource;
        let resource = GroupResource { group: spec.group.clone(), resource: spec.resource.clone() };
        let timeout = self.context.settings.request_timeout;
        let running = in_tree::running_for(&self.context.client, &resource);
        match bounded(&self.context.fence, timeout, running).await {
            Ok(Some(other)) => {
                info!(in_tree = other, "the in-tree migrator is migrating this resource; waiting");
                let note = format!(
                    "the in-tree migrator's StorageVersionMigration {other} (storagemigration.k8s.io) is migrating {} now; this migration starts once it has ended",
                    resource.name()
                );
                self.publish(EventType::Normal, events::WAITING_FOR_IN_TREE, note).await;
                true
            }
            Ok(None) => false,
            Err(error) => {
                debug!(error = %crate::error_chain(&error), "cannot read the in-tree migrator's migrations");
                false
            }
        }
    }

    /// Step 1: the resource, through discovery, and the CRD behind it. A resource that cannot
    /// be migrated fails the migration at once; discovery that cannot be read is tried again
    /// later, and fails the migration after a few tries.
    async fn resolve(
        &self,
        writer: &mut StatusWriter,
        discovery_failures: u32,
    ) -> Result<(Resource, Option<CustomResourceDefinition>), Ended> {
        let target = &self.migration.spec.resource;
        let requires_status = self.migration.requests_status_writes();
        let resolved = Resource::resolve(&self.context.client, target, requires_status).await;
        let failure = match resolved {
            Err(error) if !error.is_transient() => {
                let message = crate::error_chain(&error);
                let failed = status::failed(
                    self.previous(),
                    reasons::INVALID_RESOURCE,
                    message.clone(),
                    Timestamp::now(),
                );
                return Err(self
                    .record_terminal(writer, UNRESOLVED_RESOURCE, failed, message)
                    .await);
            }
            Err(error) => crate::error_chain(&error),
            Ok(resource) => match steps::crd_of(&self.context.cluster(), &resource).await {
                Ok(crd) => return Ok((resource, crd)),
                Err(error) => {
                    format!("failed to read the CRD of {resource}: {}", crate::error_chain(&error))
                }
            },
        };
        let failures = discovery_failures + 1;
        let attempts = self.context.settings.discovery_attempts;
        if failures < attempts {
            warn!(error = failure, failures, "discovery failed; trying again later");
            let note = format!("{failure} (try {failures} of {attempts}); trying again later");
            self.publish(EventType::Warning, events::DISCOVERY_RETRY, note).await;
            return Err(Ended::DiscoveryFailed);
        }
        let message = format!("{failure} ({attempts} tries)");
        let failed = status::failed(
            self.previous(),
            reasons::DISCOVERY_FAILED,
            message.clone(),
            Timestamp::now(),
        );
        Err(self.record_terminal(writer, UNRESOLVED_RESOURCE, failed, message).await)
    }

    /// Step 2: what the migration targets. A resumed migration keeps what it recorded when it
    /// first started; otherwise the storage version hash is recorded, and for a CRD-backed
    /// resource its generation, storage version and whether the apiservers already encode in
    /// it (confirmed before the first write, or vouched for by the operator).
    async fn target(
        &self,
        resource: &Resource,
        crd: Option<&CustomResourceDefinition>,
        start: &Start,
        last: Option<&StorageVersionMigrationStatus>,
    ) -> MigrationTarget {
        if let Some(known) = status::known_target(last, start) {
            return known;
        }
        let vouched = self.migration.encoding_vouched_for();
        let target = steps::target_of(&self.context.cluster(), resource, crd, vouched).await;
        let evidence = target.encoding_evidence.clone().unwrap_or_default();
        match (vouched, target.encoding_confirmed) {
            (true, _) => {
                warn!(evidence, "encoding check skipped: the operator vouched for it");
                self.publish(EventType::Warning, events::ENCODING_OVERRIDDEN, evidence).await;
            }
            (false, Some(false)) => {
                let note = format!("migrating anyway; storedVersions will be kept: {evidence}");
                self.publish(EventType::Warning, events::ENCODING_UNCONFIRMED, note).await;
            }
            _ => {}
        }
        target
    }

    /// Step 3: the Running status, the CRD's `StorageMigrating` condition, the start Event.
    async fn record_start(
        &self,
        writer: &mut StatusWriter,
        resource: &Resource,
        target: &MigrationTarget,
        start: &Start,
        last: Option<&StorageVersionMigrationStatus>,
    ) -> Result<StorageVersionMigrationStatus, Ended> {
        let current = status::started(last, target, start, Timestamp::now());
        if let Err(error) = writer.write_within(&current, RECORD_PATIENCE).await {
            return Err(give_up(&error));
        }
        if target.crd_generation.is_some() {
            steps::mark_migrating(&self.context.cluster(), resource, true, &self.by()).await;
            *self.marked_crd.lock().unwrap_or_else(|p| p.into_inner()) = Some(resource.clone());
        }
        let note = format!("{resource}: {}", start.note);
        self.publish(EventType::Normal, start.event, note).await;
        Ok(current)
    }

    /// Step 4: the engine, with progress checkpointed into status beside it (never pausing
    /// it), and the resource's CRD watched for a change of the target. Returns the final
    /// progress and the status it leads to; or the change that voided the run; or that the task
    /// stopped: deleted, the controller stopping (after a checkpoint), the leader deposed, or
    /// the migration finished by someone else.
    async fn run_engine(
        &self,
        writer: &mut StatusWriter,
        resource: &Resource,
        target: &MigrationTarget,
        start: Start,
        mut current: StorageVersionMigrationStatus,
    ) -> Ran {
        let context = self.context;
        // This run only: a change of the target stops it, and the migration goes on.
        let cancel = self.cancel.child_token();
        let (report, updates) = watch::channel(start.progress.clone());
        let write_to_status = self.migration.requests_status_writes()
            || (context.settings.write_to_status && resource.patchable_status);
        let job = Job {
            resource: resource.clone(),
            write_to_status,
            resume: start.progress,
            fence: context.fence.clone(),
        };
        let latest = updates.clone();
        let run = context.engine.run(job, &report, &cancel);
        tokio::pin!(run);
        let cluster = context.cluster();
        let stopped = {
            let checkpoints = Box::pin(checkpoint(context, writer, &mut current, target, updates));
            tokio::select! {
                finished = &mut run => Ok(finished),
                stop = checkpoints => Err(stop),
                change = steps::guard(&cluster, resource, target) => {
                    cancel.cancel();
                    let _ = (&mut run).await;
                    let progress = latest.borrow().clone();
                    let now = Timestamp::now();
                    let current = status::running(Some(&current), target, &progress, now);
                    return Ran::Changed { change, current };
                }
            }
        };
        let finished = match stopped {
            Ok(finished) => finished,
            Err(stop) => {
                info!(reason = %stop, "stopping the migration");
                self.cancel.cancel();
                let _ = (&mut run).await;
                // Deleted or finished by someone else: the CRD is no longer being migrated by
                // this task. A deposed leader leaves it to the next one.
                if !matches!(stop, status_writer::Error::Fenced) {
                    self.unmark_crd().await;
                }
                return Ran::Stopped;
            }
        };
        let now = Timestamp::now();
        match finished {
            Ok(engine::Finished::Completed(progress)) => {
                let done = status::completed(Some(&current), target, &progress, now);
                Ran::Finished { progress, done }
            }
            Ok(engine::Finished::Cancelled(progress)) => {
                // The controller is stopping while still leading: leave the migration Running
                // with its checkpoint for the next leader. A deposed leader's fence refuses.
                if context.stopping.is_cancelled() && context.fence.holds() {
                    let checkpoint = status::running(Some(&current), target, &progress, now);
                    match writer.write_within(&checkpoint, Duration::ZERO).await {
                        Ok(()) => info!(processed = progress.processed(), "checkpointed"),
                        Err(error) => warn!(error = %crate::error_chain(&error), "no checkpoint"),
                    }
                }
                Ran::Stopped
            }
            Err(error) => {
                let progress = latest.borrow().clone();
                let done = status::engine_failed(Some(&current), target, &progress, &error, now);
                Ran::Finished { progress, done }
            }
        }
    }

    /// Step 5: a run that completed proves nothing if the resource stopped being served, or
    /// its storage version (or its CRD) changed, while it ran: then objects written earlier may
    /// be stored in the old version. Returns the change, if any, for a Succeeded run.
    async fn verify(
        &self,
        resource: &Resource,
        target: &MigrationTarget,
        done: &StorageVersionMigrationStatus,
    ) -> Option<steps::Change> {
        if done.conditions.first().map(|c| c.type_.as_str()) != Some(SUCCEEDED) {
            return None;
        }
        let spec = &self.migration.spec.resource;
        let requires_status = self.migration.requests_status_writes();
        let cluster = self.context.cluster();
        steps::changed_since_start(&cluster, spec, requires_status, resource, target).await
    }

    /// Step 6: prune the CRD's `storedVersions` when that is proven safe; say what was done,
    /// and why, in a condition, an Event and a metric.
    async fn settle_stored_versions(
        &self,
        resource: &Resource,
        target: &MigrationTarget,
        done: &mut StorageVersionMigrationStatus,
    ) {
        let run = status::run_of(done);
        let Some(pruned) =
            steps::settle_stored_versions(&self.context.cluster(), resource, target, &run).await
        else {
            return;
        };
        let (type_, reason, result) = match pruned.status.as_str() {
            STATUS_TRUE => (EventType::Normal, events::STORED_VERSIONS_PRUNED, "pruned"),
            _ => (EventType::Warning, events::STORED_VERSIONS_KEPT, "kept"),
        };
        let why = pruned.reason.clone().unwrap_or_default();
        let metrics = self.context.engine.metrics();
        metrics.stored_versions.with_label_values(&[result, &why]).inc();
        self.publish(type_, reason, pruned.message.clone().unwrap_or_default()).await;
        done.conditions.retain(|c| c.type_ != pruned.type_);
        done.conditions.push(pruned);
    }

    /// Step 7: the final status, the CRD unmarked, the metrics and the Event.
    async fn record_end(
        &self,
        writer: &mut StatusWriter,
        resource: &Resource,
        progress: &Progress,
        done: StorageVersionMigrationStatus,
    ) -> Ended {
        let label = resource_label(&resource.group, &resource.version, &resource.plural);
        let message = done.conditions[0].message.clone().unwrap_or_default();
        // The CRD first: whoever sees the migration finished finds its CRD settled too.
        self.unmark_crd().await;
        let ended = self.record_terminal(writer, &label, done, message).await;
        info!(rewritten = progress.rewritten, failed = progress.failed, "migration finished");
        ended
    }

    /// Unmarks the CRD this task marked `StorageMigrating`, if any.
    /// The mark is forgotten only once unmarked: an unmarking cut short (the task dropped when
    /// its migration was deleted) is done again by whoever unmarks next.
    async fn unmark_crd(&self) {
        let marked = self.marked_crd.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(resource) = marked {
            steps::mark_migrating(&self.context.cluster(), &resource, false, &self.by()).await;
            *self.marked_crd.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    /// Writes a terminal status, then counts it and publishes its Event.
    async fn record_terminal(
        &self,
        writer: &mut StatusWriter,
        label: &str,
        done: StorageVersionMigrationStatus,
        message: String,
    ) -> Ended {
        if let Err(error) = writer.write_within(&done, RECORD_PATIENCE).await {
            return give_up(&error);
        }
        observe_finished(self.context, label, &done);
        let (type_, reason) = match done.conditions.first().map(|c| c.type_.as_str()) {
            Some(SUCCEEDED) => (EventType::Normal, events::SUCCEEDED),
            _ => (EventType::Warning, events::FAILED),
        };
        self.publish(type_, reason, message).await;
        Ended::Done
    }

    /// Who migrates, as the CRD's `StorageMigrating` condition names it.
    fn by(&self) -> String {
        format!("StorageVersionMigration {}", self.migration.name_any())
    }

    fn previous(&self) -> Option<&StorageVersionMigrationStatus> {
        self.migration.status.as_ref()
    }

    /// Publishes an Event on the migration, inside the leader's term.
    async fn publish(&self, type_: EventType, reason: &str, note: String) {
        // The apiserver refuses Event notes longer than 1 kB.
        let note = crate::api::cut(&note, 1024);
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Migrate".into(),
            secondary: None,
        };
        let reference = self.migration.object_ref(&());
        let published = self.context.recorder.publish(&event, &reference);
        let limit = self.context.settings.request_timeout;
        let published = match self.context.fence.deadline(limit) {
            Some(limit) => tokio::time::timeout(limit, published).await.ok(),
            None => return,
        };
        if let Some(Err(error)) = published {
            warn!(%error, "failed to publish an event");
        }
    }
}

/// How one run of a migration ended.
enum Attempt {
    /// Nothing more to do now (see [`Ended`]).
    Ended(Ended),
    /// The target changed before the first write: work it out again.
    Retarget(steps::Change),
    /// The target changed after writes began (`current` is the status then): start over.
    StartOver { change: steps::Change, current: Box<StorageVersionMigrationStatus> },
    /// The run finished, Succeeded or Failed as its status says.
    Finished(Box<Finished>),
}

/// A run that finished: its target, its progress, and the status it ends with.
struct Finished {
    target: MigrationTarget,
    progress: Progress,
    done: StorageVersionMigrationStatus,
}

/// How the engine's part of a run ended.
enum Ran {
    /// The task stopped (deleted, stopping, deposed, finished by someone else).
    Stopped,
    /// The resource's CRD changed under the run; `current` is the status with its progress.
    Changed { change: steps::Change, current: StorageVersionMigrationStatus },
    /// Completed or failed, with the status it leads to.
    Finished { progress: Progress, done: StorageVersionMigrationStatus },
}

/// What a status write that failed for good means for the task.
fn give_up(error: &status_writer::Error) -> Ended {
    warn!(error = %crate::error_chain(error), "could not record the migration's status");
    match error.ends_the_task() {
        true => Ended::Done,
        false => Ended::Unrecorded,
    }
}

/// Writes progress into status after pages, at most every checkpoint interval, until the task
/// must stop; returns why.
async fn checkpoint(
    context: &Context,
    writer: &mut StatusWriter,
    current: &mut StorageVersionMigrationStatus,
    target: &MigrationTarget,
    mut updates: watch::Receiver<Progress>,
) -> status_writer::Error {
    let interval = context.settings.checkpoint_interval;
    let mut last_write = Instant::now();
    loop {
        if updates.changed().await.is_err() {
            // The engine is gone; the select around this ends first.
            std::future::pending::<()>().await;
        }
        tokio::time::sleep_until(last_write + interval).await;
        let progress = updates.borrow_and_update().clone();
        let next = status::running(Some(current), target, &progress, Timestamp::now());
        match writer.write(&next).await {
            Ok(()) => *current = next,
            Err(error) if error.ends_the_task() => return error,
            Err(error) => warn!(error = %crate::error_chain(&error), "failed to checkpoint"),
        }
        last_write = Instant::now();
    }
}

/// Resolves when the migration object is deleted (or replaced by another of the same name).
/// The watch cache says so first; the apiserver confirms, as an empty cache may only mean the
/// watch is restarting.
async fn watch_deletion(
    context: &Context,
    migration: &StorageVersionMigration,
    cancel: CancellationToken,
) {
    let reference = ObjectRef::from_obj(migration);
    let uid = migration.uid();
    let api: Api<StorageVersionMigration> = Api::all(context.client.clone());
    let is_gone = |current: Option<&StorageVersionMigration>| match current {
        None => true,
        Some(current) => current.uid() != uid || current.metadata.deletion_timestamp.is_some(),
    };
    loop {
        tokio::time::sleep(DELETION_CHECK).await;
        if !is_gone(context.store.get(&reference).as_deref()) {
            continue;
        }
        let timeout = context.settings.request_timeout;
        match bounded(&context.fence, timeout, api.get_opt(&reference.name)).await {
            Ok(current) if is_gone(current.as_ref()) => {
                cancel.cancel();
                return;
            }
            Ok(_) => {}
            Err(error) => warn!(%error, "failed to check whether the migration still exists"),
        }
    }
}

/// Counts a finished migration in the upstream and kube-svm metrics.
fn observe_finished(context: &Context, label: &str, status: &StorageVersionMigrationStatus) {
    let metrics = context.engine.metrics();
    let outcome = match status.conditions.first().map(|c| c.type_.as_str()) {
        Some(SUCCEEDED) => SUCCEEDED,
        _ => FAILED,
    };
    metrics.migrations.with_label_values(&[label, outcome]).inc();
    metrics.remaining_objects.with_label_values(&[label]).set(0);
    if let (Some(start), Some(end)) = (&status.start_time, &status.completion_time) {
        let seconds = end.0.duration_since(start.0).as_secs_f64().max(0.0);
        metrics.migration_duration.with_label_values(&[outcome]).observe(seconds);
    }
}

/// Runs `f` when dropped, however the task ends.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}
