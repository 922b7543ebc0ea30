//! One running migration: resolve its resource, run the engine, checkpoint progress into status,
//! and record the outcome. Stops promptly when the migration is deleted or the controller stops.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource as _, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, instrument, warn};

use super::status::{self, Phase, reasons};
use super::{Context, crd};
use crate::api::conditions::{FAILED, STATUS_TRUE, SUCCEEDED};
use crate::api::{MigrationTarget, StorageVersionMigration, StorageVersionMigrationStatus};
use crate::engine::{Finished, Job, Resource};
use crate::metrics::resource_label;

/// How often a running migration checks that its object still exists.
const DELETION_CHECK: Duration = Duration::from_millis(250);

/// How long to wait before asking discovery again after it could not be read.
const DISCOVERY_RETRY: Duration = Duration::from_secs(5);

#[instrument(skip_all, fields(migration = %migration.name_any(), resource = %migration.spec.resource.resource))]
pub(super) async fn run(context: &Context, migration: Arc<StorageVersionMigration>) {
    let name = migration.name_any();
    let cancel = context.stopping.child_token();
    let metrics = context.engine.metrics().clone();
    metrics.migrations_running.inc();
    let _running = scopeguard(move || metrics.migrations_running.dec());
    let deleted = watch_deletion(context, &migration, cancel.clone());
    let outcome = tokio::select! {
        outcome = migrate(context, &migration, &cancel) => outcome,
        () = deleted => {
            info!("migration deleted; stopped");
            return;
        }
    };
    if let Err(error) = outcome {
        warn!(error = %crate::error_chain(&error), "failed to record the migration's status");
    }
    info!(migration = name, "migration task ended");
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
        match api.get_opt(&reference.name).await {
            Ok(current) if is_gone(current.as_ref()) => {
                cancel.cancel();
                return;
            }
            Ok(_) => {}
            Err(error) => warn!(%error, "failed to check whether the migration still exists"),
        }
    }
}

async fn migrate(
    context: &Context,
    migration: &StorageVersionMigration,
    cancel: &CancellationToken,
) -> Result<(), kube::Error> {
    let api: Api<StorageVersionMigration> = Api::all(context.client.clone());
    let name = migration.name_any();
    let previous = migration.status.clone();
    let status_required = migration.requests_status_writes();
    let resource = loop {
        match Resource::resolve(&context.client, &migration.spec.resource, status_required).await {
            Ok(resource) => break resource,
            Err(error) if error.is_transient() => {
                warn!(error = %crate::error_chain(&error), "discovery failed; trying again");
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(DISCOVERY_RETRY) => continue,
                }
            }
            Err(error) => {
                let message = crate::error_chain(&error);
                let status = status::failed(
                    previous.as_ref(),
                    reasons::INVALID_RESOURCE,
                    message.clone(),
                    Timestamp::now(),
                );
                write_status(&api, &name, &status).await?;
                let target = &migration.spec.resource;
                let label = resource_label(&target.group, &target.version, &target.resource);
                observe_finished(context, &label, &status);
                publish(context, migration, EventType::Warning, "Failed", message).await;
                return Ok(());
            }
        }
    };
    let label = resource_label(&resource.group, &resource.version, &resource.plural);
    let resumed = Phase::of(migration) == Phase::Running;
    let mut target = previous.as_ref().and_then(|s| s.target.clone()).unwrap_or_default();
    // What the migration targets is recorded once, when it first starts; a resumed migration
    // keeps the record, so the pruning decision compares with the CRD as it was then.
    let crd = crd::crd_of(&context.client, &resource).await.ok().flatten();
    if !resumed || target.storage_version_hash.is_none() {
        target = MigrationTarget {
            storage_version_hash: resource.storage_version_hash.clone(),
            ..MigrationTarget::default()
        };
        if let Some(crd) = &crd {
            crd::record_target(
                &context.client,
                &resource,
                crd,
                context.settings.storage_version_settle,
                &mut target,
            )
            .await;
        }
    }
    if crd.is_some() {
        crd::mark_migrating(&context.client, &resource, true, &name).await;
    }
    let start = status::resume_point(migration);
    let mut current = status::running(previous.as_ref(), &target, &start, Timestamp::now());
    write_status(&api, &name, &current).await?;
    let (reason, note) = match (&start.continue_token, resumed) {
        (Some(_), _) => {
            ("Resumed", format!("resuming the migration of {resource} from a checkpoint"))
        }
        (None, true) => {
            ("Restarted", format!("migrating every object of {resource} again from the start"))
        }
        (None, false) => ("Started", format!("migrating every object of {resource}")),
    };
    publish(context, migration, EventType::Normal, reason, note).await;

    let (report, mut updates) = watch::channel(start.clone());
    let write_to_status =
        status_required || (context.settings.write_to_status && resource.patchable_status);
    let job = Job { resource: resource.clone(), write_to_status, resume: start };
    let run = context.engine.run(job, &report, cancel);
    tokio::pin!(run);
    let mut last_write = Instant::now();
    let finished = loop {
        tokio::select! {
            finished = &mut run => break finished,
            Ok(()) = updates.changed() => {
                if last_write.elapsed() >= context.settings.checkpoint_interval {
                    let progress = updates.borrow_and_update().clone();
                    current = status::running(Some(&current), &target, &progress, Timestamp::now());
                    if let Err(error) = write_status(&api, &name, &current).await {
                        warn!(%error, "failed to checkpoint");
                    }
                    last_write = Instant::now();
                }
            }
        }
    };
    let now = Timestamp::now();
    match finished {
        Ok(Finished::Completed(progress)) => {
            let mut done = status::completed(Some(&current), &target, &progress, now);
            if crd.is_some() {
                if let Some(pruned) = crd::settle_stored_versions(
                    &context.client,
                    &resource,
                    &target,
                    progress.failed,
                )
                .await
                {
                    let (type_, reason, result) = match pruned.status.as_str() {
                        STATUS_TRUE => (EventType::Normal, "StoredVersionsPruned", "pruned"),
                        _ => (EventType::Warning, "StoredVersionsKept", "kept"),
                    };
                    let why = pruned.reason.as_deref().unwrap_or_default();
                    context
                        .engine
                        .metrics()
                        .stored_versions
                        .with_label_values(&[result, why])
                        .inc();
                    publish(
                        context,
                        migration,
                        type_,
                        reason,
                        pruned.message.clone().unwrap_or_default(),
                    )
                    .await;
                    done.conditions.retain(|c| c.type_ != pruned.type_);
                    done.conditions.push(pruned);
                }
                crd::mark_migrating(&context.client, &resource, false, &name).await;
            }
            write_status(&api, &name, &done).await?;
            observe_finished(context, &label, &done);
            let (type_, reason) = match progress.failed {
                0 => (EventType::Normal, "Succeeded"),
                _ => (EventType::Warning, "Failed"),
            };
            let message = done.conditions[0].message.clone().unwrap_or_default();
            info!(rewritten = progress.rewritten, failed = progress.failed, "migration finished");
            publish(context, migration, type_, reason, message).await;
        }
        Ok(Finished::Cancelled(progress)) => {
            // The controller is stopping: leave the migration Running with its checkpoint.
            let checkpoint = status::running(Some(&current), &target, &progress, now);
            write_status(&api, &name, &checkpoint).await?;
            info!(processed = progress.processed(), "checkpointed for the next leader");
        }
        Err(error) => {
            let message = crate::error_chain(&error);
            let progress = updates.borrow().clone();
            let with_progress = status::running(Some(&current), &target, &progress, now);
            let failed =
                status::failed(Some(&with_progress), reasons::LIST_FAILED, message.clone(), now);
            write_status(&api, &name, &failed).await?;
            observe_finished(context, &label, &failed);
            publish(context, migration, EventType::Warning, "Failed", message).await;
        }
    }
    Ok(())
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

/// Writes the whole status with a merge patch; fields the status leaves out are cleared.
async fn write_status(
    api: &Api<StorageVersionMigration>,
    name: &str,
    status: &StorageVersionMigrationStatus,
) -> Result<(), kube::Error> {
    let mut value = serde_json::to_value(status).map_err(kube::Error::SerdeError)?;
    if let Value::Object(fields) = &mut value {
        for field in
            ["progress", "checkpoint", "failedObjects", "target", "startTime", "completionTime"]
        {
            fields.entry(field).or_insert(Value::Null);
        }
    }
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(json!({ "status": value })))
        .await?;
    Ok(())
}

async fn publish(
    context: &Context,
    migration: &StorageVersionMigration,
    type_: EventType,
    reason: &str,
    note: String,
) {
    // Event notes are limited to 1 kB.
    let note: String = note.chars().take(1000).collect();
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Migrate".into(),
        secondary: None,
    };
    if let Err(error) = context.recorder.publish(&event, &migration.object_ref(&())).await {
        warn!(%error, "failed to publish an event");
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
