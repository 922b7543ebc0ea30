//! One migration the controller runs: the [`lifecycle`](crate::lifecycle) with the controller as
//! its host. The record is the migration's status, written through [`StatusWriter`] (so nothing
//! is written once the leader's term is over or someone else finished the migration); the
//! operator hears of it through Events, logs and metrics. Around it, what only the controller
//! does: it waits for the in-tree migrator, and stops when the migration is deleted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource as _, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, instrument, warn};

use super::Context;
use super::status_writer::{self, StatusWriter};
use crate::api::conditions::{FAILED, STATUS_TRUE, SUCCEEDED, events};
use crate::api::{GroupResource, StorageVersionMigration, StorageVersionMigrationStatus};
use crate::apiserver::in_tree;
use crate::apiserver::requests::RequestError;
use crate::lifecycle::{
    self, End, LaterBecause, Lifecycle, Moment, Notice, Options, Tries, Unrecorded,
};
use crate::ops::metrics::{UNRESOLVED_RESOURCE, resource_label};

/// How often a running migration checks that its object still exists.
const DELETION_CHECK: Duration = Duration::from_millis(250);

/// How long the writes that start and end a migration are retried before the task gives up
/// (and the migration is taken up again later).
const RECORD_PATIENCE: Duration = Duration::from_secs(60);

/// When the scheduler takes a migration up again after its task ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Requeue {
    /// Not before it changes: finished, failed, deleted, or stopped with a checkpoint.
    Never,
    /// Discovery (or the CRD) could not be read; try again later.
    AfterDiscoveryFailure,
    /// The migration's status could not be written; take it up again later.
    AfterUnrecorded,
    /// Another migrator (the in-tree one, or `kube-svm migrate`) is migrating the same
    /// resource; take it up again later.
    AfterInTree,
}

#[instrument(skip_all, fields(migration = %migration.name_any(), resource = %migration.spec.resource.resource))]
pub(super) async fn run(
    context: &Context,
    migration: Arc<StorageVersionMigration>,
    discovery_failures: u32,
    preparing: tokio::sync::OwnedSemaphorePermit,
) -> Requeue {
    let metrics = context.engine.metrics().clone();
    metrics.migrations_running.inc();
    let _running = scopeguard(move || metrics.migrations_running.dec());
    if in_tree_migrating(context, &migration).await || migrating_by_hand(context, &migration).await
    {
        return Requeue::AfterInTree;
    }
    let cancel = context.stopping.child_token();
    let by = format!("StorageVersionMigration {}", migration.name_any());
    let api: Api<StorageVersionMigration> = Api::all(context.requests.client().clone());
    let writer = StatusWriter::new(api, &migration, context.requests.clone());
    let preparing = Mutex::new(Some(preparing));
    let host = Host { context, migration: &migration, writer, discovery_failures, preparing };
    let mut lifecycle = Lifecycle::new(context.cluster(), &context.engine, host, &cancel, by);
    let requeue =
        match lifecycle.run_until(watch_deletion(context, &migration, cancel.clone())).await {
            Some(end) => requeue(end),
            None => {
                info!("migration deleted; stopped");
                Requeue::Never
            }
        };
    info!(?requeue, "migration task ended");
    requeue
}

/// When the scheduler takes the migration up again after its lifecycle's end.
fn requeue(end: End) -> Requeue {
    match end {
        End::Finished(_) | End::Stopped { .. } => Requeue::Never,
        End::Later(LaterBecause::Discovery) => Requeue::AfterDiscoveryFailure,
        End::Later(LaterBecause::Unrecorded) => Requeue::AfterUnrecorded,
    }
}

/// At most one migration per resource at a time, whoever runs it: while the in-tree migrator is
/// migrating the same resource, this migration waits for it (an Event says so). An in-tree API
/// that cannot be read holds nothing back: two migrators writing the same objects waste work,
/// but prove nothing false.
async fn in_tree_migrating(context: &Context, migration: &StorageVersionMigration) -> bool {
    let spec = &migration.spec.resource;
    let resource = GroupResource { group: spec.group.clone(), resource: spec.resource.clone() };
    let running = in_tree::running_for(context.requests.client(), &resource);
    match context.requests.send(running).await {
        Ok(Some(other)) => {
            info!(in_tree = other, "the in-tree migrator is migrating this resource; waiting");
            let note = format!(
                "the in-tree migrator's StorageVersionMigration {other} (storagemigration.k8s.io) is migrating {} now; this migration starts once it has ended",
                resource.name()
            );
            publish(context, migration, EventType::Normal, events::WAITING_FOR_IN_TREE, note).await;
            true
        }
        Ok(None) => false,
        Err(error) => {
            debug!(error = %crate::error_chain(&error), "cannot read the in-tree migrator's migrations");
            false
        }
    }
}

/// How long a CRD marked as being migrated by `kube-svm migrate` holds the controller's
/// migrations of it back: the mark of a process killed before it could unmark is not honoured
/// for ever. Past this, two migrators may write the same objects: work wasted, nothing proved
/// false.
const BY_HAND_HONOURED_FOR: Duration = Duration::from_secs(3600);

/// At most one migration per resource at a time, whoever runs it: while `kube-svm migrate`
/// (a person, or a Helm hook) is migrating the same CRD-backed resource, as its CRD's
/// `StorageMigrating` condition says, this migration waits for it (an Event says so).
async fn migrating_by_hand(context: &Context, migration: &StorageVersionMigration) -> bool {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let spec = &migration.spec.resource;
    if spec.group.is_empty() {
        return false;
    }
    let name = GroupResource::name_of(&spec.group, &spec.resource);
    let crds: Api<CustomResourceDefinition> = Api::all(context.requests.client().clone());
    let Ok(Some(crd)) = context.requests.send(crds.get_opt(&name)).await else {
        return false;
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let Some(by) = held_by_hand(&crd, now, BY_HAND_HONOURED_FOR) else { return false };
    info!(by, "kube-svm migrate is migrating this resource; waiting");
    let note = format!("{by} ({name}); this migration starts once it has ended");
    publish(context, migration, EventType::Normal, events::WAITING_FOR_MIGRATE, note).await;
    true
}

/// What the `StorageMigrating` condition of `crd` says is migrating it by hand (`kube-svm
/// migrate`), when it was set within `honoured_for` of `now`. Pure.
fn held_by_hand(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    now: k8s_openapi::jiff::Timestamp,
    honoured_for: Duration,
) -> Option<String> {
    use crate::api::conditions::{STORAGE_MIGRATING, storage_migrating};
    let conditions = crd.status.as_ref()?.conditions.as_ref()?;
    let mark = conditions.iter().find(|c| c.type_ == STORAGE_MIGRATING)?;
    let by_hand = mark.status == STATUS_TRUE
        && mark.reason.as_deref() == Some(storage_migrating::MIGRATING_BY_HAND);
    let set_at = mark.last_transition_time.as_ref()?.0;
    let age = now.duration_since(set_at);
    let recent = age.is_negative() || age.unsigned_abs() < honoured_for;
    (by_hand && recent).then(|| mark.message.clone().unwrap_or_default())
}

/// The controller as the lifecycle's host.
struct Host<'a> {
    context: &'a Context,
    migration: &'a StorageVersionMigration,
    writer: StatusWriter,
    /// Times discovery of the resource failed before this task.
    discovery_failures: u32,
    /// Room to gather evidence, given back once the migration's turn to write comes.
    preparing: Mutex<Option<tokio::sync::OwnedSemaphorePermit>>,
}

impl lifecycle::Host for Host<'_> {
    fn migration(&self) -> &StorageVersionMigration {
        self.migration
    }

    fn options(&self) -> Options {
        let settings = &self.context.settings;
        Options {
            write_to_status: settings.write_to_status,
            clean_managed_fields: self.migration.cleans_managed_fields(),
            checkpoint_interval: settings.checkpoint_interval,
            discovery: Tries { this: self.discovery_failures + 1, of: settings.discovery_attempts },
            stopped_runs_stay_marked: true,
            mark_reason: crate::api::conditions::storage_migrating::MIGRATING,
        }
    }

    async fn record(
        &mut self,
        status: &StorageVersionMigrationStatus,
        moment: Moment,
    ) -> Result<(), Unrecorded> {
        let written = match moment {
            // The controller is stopping while still leading: the migration stays Running with
            // its checkpoint for the next leader. Deleted, or deposed: nothing to write.
            Moment::Interrupted => {
                let context = self.context;
                if !(context.stopping.is_cancelled() && context.requests.fence().holds()) {
                    return Ok(());
                }
                self.writer.write_within(status, Duration::ZERO).await
            }
            Moment::Start | Moment::End | Moment::Unresolved => {
                self.writer.write_within(status, RECORD_PATIENCE).await
            }
            Moment::Running => self.writer.write(status).await,
        };
        written.map_err(|error| unrecorded(&error))
    }

    async fn turn(&self) -> Option<crate::lifecycle::turns::Turn> {
        let permit = super::lanes::turn(self.context, self.migration).await;
        self.preparing.lock().unwrap_or_else(|p| p.into_inner()).take();
        Some(permit)
    }

    async fn tell(&self, notice: Notice<'_>) {
        let (type_, reason, note) = match notice {
            Notice::Start { event, note, .. } => (EventType::Normal, event, note.to_owned()),
            Notice::Confirming { .. } | Notice::Retarget(_) | Notice::Progress(_) => return,
            Notice::Unresolved { message, tries } => {
                let Tries { this, of } = tries;
                let note = format!("{message} (try {this} of {of}); trying again later");
                (EventType::Warning, events::DISCOVERY_RETRY, note)
            }
            Notice::Unresolvable(failed) => {
                observe_finished(self.context, UNRESOLVED_RESOURCE, failed);
                let note = failed.conditions.first().and_then(|c| c.message.clone());
                (EventType::Warning, events::FAILED, note.unwrap_or_default())
            }
            Notice::Encoding { vouched: true, evidence, .. } => {
                warn!(evidence, "encoding check skipped: the operator vouched for it");
                (EventType::Warning, events::ENCODING_OVERRIDDEN, evidence.to_owned())
            }
            Notice::Encoding { confirmed: Some(false), evidence, .. } => {
                let note = format!("migrating anyway; storedVersions will be kept: {evidence}");
                (EventType::Warning, events::ENCODING_UNCONFIRMED, note)
            }
            Notice::Encoding { .. } => return,
            Notice::Unproven(change) => {
                warn!(%change, "the run proves nothing about the encoding");
                let note = format!("the objects were rewritten, but {change}");
                (EventType::Warning, events::ENCODING_UNCONFIRMED, note)
            }
            Notice::StoredVersions(condition) => {
                let (type_, reason, result) = match condition.status.as_str() {
                    STATUS_TRUE => (EventType::Normal, events::STORED_VERSIONS_PRUNED, "pruned"),
                    _ => (EventType::Warning, events::STORED_VERSIONS_KEPT, "kept"),
                };
                let why = condition.reason.clone().unwrap_or_default();
                let metrics = self.context.engine.metrics();
                metrics.stored_versions.with_label_values(&[result, &why]).inc();
                (type_, reason, condition.message.clone().unwrap_or_default())
            }
            Notice::Ended { resource, status: done } => {
                let label = resource_label(&resource.group, &resource.version, &resource.plural);
                observe_finished(self.context, &label, done);
                let progress = done.progress.clone().unwrap_or_default();
                info!(
                    rewritten = progress.rewritten,
                    failed = progress.failed,
                    "migration finished"
                );
                let message =
                    done.conditions.first().and_then(|c| c.message.clone()).unwrap_or_default();
                match done.conditions.first().map(|c| c.type_.as_str()) {
                    Some(SUCCEEDED) => (EventType::Normal, events::SUCCEEDED, message),
                    _ => (EventType::Warning, events::FAILED, message),
                }
            }
        };
        publish(self.context, self.migration, type_, reason, note).await;
    }
}

/// What a status write that failed for good means for the lifecycle.
fn unrecorded(error: &status_writer::Error) -> Unrecorded {
    let why = crate::error_chain(error);
    match error.ends_the_task() {
        true => Unrecorded::Stop(why),
        false => Unrecorded::Later(why),
    }
}

/// Publishes an Event on `migration`, inside the leader's term.
pub(super) async fn publish(
    context: &Context,
    migration: &StorageVersionMigration,
    type_: EventType,
    reason: &str,
    note: String,
) {
    // The apiserver refuses Event notes longer than 1 kB.
    let note = crate::api::cut(&note, 1024);
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Migrate".into(),
        secondary: None,
    };
    // With the version of the migration, as client-go's references carry it: kube's Recorder
    // folds an Event into an earlier one of the same reason on the same reference for minutes,
    // keeping the earlier note. Each run and each retry starts from a version of its own, so
    // its Events keep their own notes (a second Failed, a second Retried).
    let mut reference = migration.object_ref(&());
    reference.resource_version = migration.metadata.resource_version.clone();
    let published = context.recorder.publish(&event, &reference);
    if let Err(RequestError::Api(error)) = context.requests.send(published).await
        && !crate::apiserver::reachability::unreachable(&error, "publishing an event")
    {
        warn!(error = %crate::error_chain(&error), "failed to publish an event");
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
    let api: Api<StorageVersionMigration> = Api::all(context.requests.client().clone());
    let is_gone = |current: Option<&StorageVersionMigration>| match current {
        None => true,
        Some(current) => current.uid() != uid || current.metadata.deletion_timestamp.is_some(),
    };
    loop {
        tokio::time::sleep(DELETION_CHECK).await;
        if !is_gone(context.store.get(&reference).as_deref()) {
            continue;
        }
        match context.requests.send(api.get_opt(&reference.name)).await {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::{STORAGE_MIGRATING, storage_migrating};
    use k8s_openapi::jiff::Timestamp;

    fn marked(
        reason: &str,
        status: &str,
        at: i64,
    ) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition
    {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "widgets.example.com" },
            "spec": { "group": "example.com", "names": { "plural": "widgets", "kind": "Widget" },
                      "scope": "Cluster", "versions": [] },
            "status": { "conditions": [{
                "type": STORAGE_MIGRATING, "status": status, "reason": reason,
                "message": "kube-svm migrate (pid 7) is rewriting every object",
                "lastTransitionTime": Timestamp::from_second(at).expect("a time").to_string(),
            }] },
        }))
        .expect("a CRD")
    }

    #[test]
    fn only_a_recent_mark_of_kube_svm_migrate_holds_the_controller_back() {
        let now = Timestamp::from_second(10_000).expect("a time");
        let hour = Duration::from_secs(3600);
        let by_hand = marked(storage_migrating::MIGRATING_BY_HAND, STATUS_TRUE, 9_000);
        assert!(held_by_hand(&by_hand, now, hour).is_some_and(|by| by.contains("pid 7")));
        let stale = marked(storage_migrating::MIGRATING_BY_HAND, STATUS_TRUE, 1_000);
        assert_eq!(held_by_hand(&stale, now, hour), None, "a killed process's mark lapses");
        let ended = marked(storage_migrating::MIGRATION_DONE, "False", 9_000);
        assert_eq!(held_by_hand(&ended, now, hour), None);
        let controller = marked(storage_migrating::MIGRATING, STATUS_TRUE, 9_000);
        assert_eq!(held_by_hand(&controller, now, hour), None, "the controller's own mark");
    }

    /// The controller as a host against a fake apiserver that takes every Event: what it
    /// publishes and counts for each notice.
    mod host {
        use kube::api::Api;
        use serde_json::{Value, json};

        use super::super::{Context, Host, StatusWriter};
        use crate::api::conditions::{STATUS_FALSE, STORED_VERSIONS_PRUNED, events, reasons};
        use crate::api::{
            MigrationCondition, StorageVersionMigration, StorageVersionMigrationStatus,
        };
        use crate::apiserver::fake::{self, Recorded, Sent};
        use crate::engine::{Progress, Resource};
        use crate::lifecycle::change::Change;
        use crate::lifecycle::{Host as _, Notice};
        use crate::ops::metrics::UNRESOLVED_RESOURCE;

        const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

        fn migration() -> StorageVersionMigration {
            serde_json::from_value(json!({
                "apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
                "metadata": { "name": "widgets-1", "uid": "m1", "resourceVersion": "7" },
                "spec": { "resource": { "group": "example.com", "version": "v1", "resource": "widgets" } },
            }))
            .expect("a migration")
        }

        /// A fake apiserver that creates every Event it is sent, and knows nothing else.
        fn context() -> (Context, Recorded) {
            let (client, recorded) = fake::client(|sent| match sent.method.as_str() {
                "POST" | "PATCH" if sent.path.starts_with(EVENTS) => (201, sent.body.clone()),
                _ => fake::not_found(sent),
            });
            (super::super::super::context_for_tests(client), recorded)
        }

        fn host<'a>(context: &'a Context, migration: &'a StorageVersionMigration) -> Host<'a> {
            let api: Api<StorageVersionMigration> = Api::all(context.requests.client().clone());
            let writer = StatusWriter::new(api, migration, context.requests.clone());
            let preparing = std::sync::Mutex::new(None);
            Host { context, migration, writer, discovery_failures: 0, preparing }
        }

        /// The Events published so far: their reason and note.
        fn published(recorded: &Recorded) -> Vec<(String, String)> {
            let events =
                recorded.writes().into_iter().filter(|s: &Sent| s.path.starts_with(EVENTS));
            let field =
                |event: &Value, name: &str| event[name].as_str().unwrap_or_default().to_owned();
            events.map(|sent| (field(&sent.body, "reason"), field(&sent.body, "note"))).collect()
        }

        fn ended(condition: &str, message: &str) -> StorageVersionMigrationStatus {
            serde_json::from_value(json!({
                "conditions": [{ "type": condition, "status": "True", "message": message }],
                "startTime": "2026-11-28T10:00:00Z", "completionTime": "2026-11-28T10:00:30Z",
            }))
            .expect("a status")
        }

        fn migrations_counted(context: &Context, label: &str, outcome: &str) -> u64 {
            context.engine.metrics().migrations.with_label_values(&[label, outcome]).get()
        }

        #[tokio::test]
        async fn a_migration_that_ends_publishes_one_event_and_is_counted_once() {
            let (context, recorded) = context();
            let migration = migration();
            let host = host(&context, &migration);
            let done = ended("Succeeded", "3 objects migrated");
            let resource = Resource::widgets();
            host.tell(Notice::Ended { resource: &resource, status: &done }).await;
            assert_eq!(
                published(&recorded),
                [(events::SUCCEEDED.to_owned(), "3 objects migrated".to_owned())]
            );
            let label = crate::ops::metrics::resource_label("example.com", "v1", "widgets");
            assert_eq!(migrations_counted(&context, &label, "Succeeded"), 1);
            assert_eq!(migrations_counted(&context, &label, "Failed"), 0);
            let durations =
                context.engine.metrics().migration_duration.with_label_values(&["Succeeded"]);
            assert_eq!(durations.get_sample_count(), 1);
        }

        #[tokio::test]
        async fn a_resource_that_cannot_be_resolved_publishes_one_warning_and_counts_a_failure() {
            let (context, recorded) = context();
            let migration = migration();
            let host = host(&context, &migration);
            let failed = ended("Failed", "the apiserver serves no resource \"widgets\"");
            host.tell(Notice::Unresolvable(&failed)).await;
            let published = published(&recorded);
            assert_eq!(published.len(), 1, "{published:?}");
            assert_eq!(published[0].0, events::FAILED);
            assert!(published[0].1.contains("serves no resource"), "{published:?}");
            assert_eq!(migrations_counted(&context, UNRESOLVED_RESOURCE, "Failed"), 1);
        }

        #[tokio::test]
        async fn stored_versions_kept_publish_one_warning_and_are_counted_once() {
            let (context, recorded) = context();
            let migration = migration();
            let host = host(&context, &migration);
            let kept = MigrationCondition {
                type_: STORED_VERSIONS_PRUNED.to_owned(),
                status: STATUS_FALSE.to_owned(),
                reason: Some("CRDChanged".to_owned()),
                message: Some("the CRD changed".to_owned()),
                last_update_time: None,
            };
            host.tell(Notice::StoredVersions(&kept)).await;
            assert_eq!(
                published(&recorded),
                [(events::STORED_VERSIONS_KEPT.to_owned(), "the CRD changed".to_owned())]
            );
            let counted =
                context.engine.metrics().stored_versions.with_label_values(&["kept", "CRDChanged"]);
            assert_eq!(counted.get(), 1);
            let pruned = context
                .engine
                .metrics()
                .stored_versions
                .with_label_values(&["pruned", "CRDChanged"]);
            assert_eq!(pruned.get(), 0);
        }

        #[tokio::test]
        async fn a_run_that_proves_nothing_says_why_in_one_warning() {
            let (context, recorded) = context();
            let migration = migration();
            let host = host(&context, &migration);
            let change = Change::WritesUnread { why: "connection refused".into() };
            assert_eq!(change.reason(), reasons::STORAGE_VERSION_CHANGED);
            host.tell(Notice::Unproven(&change)).await;
            let published = published(&recorded);
            assert_eq!(published.len(), 1, "{published:?}");
            assert_eq!(published[0].0, events::ENCODING_UNCONFIRMED);
            assert_eq!(
                published[0].1,
                "the objects were rewritten, but whether etcd still holds this run's writes could not be read at its end: connection refused"
            );
        }

        #[tokio::test]
        async fn progress_confirming_and_retargets_publish_nothing() {
            let (context, recorded) = context();
            let migration = migration();
            let host = host(&context, &migration);
            let resource = Resource::widgets();
            host.tell(Notice::Progress(&Progress::default())).await;
            host.tell(Notice::Confirming { resource: &resource, storage: "v2" }).await;
            let change = Change::Deleted { resource: resource.to_string() };
            host.tell(Notice::Retarget(&change)).await;
            assert_eq!(published(&recorded), []);
        }

        #[tokio::test]
        async fn an_interrupted_run_of_a_controller_not_stopping_writes_nothing() {
            let (context, recorded) = context();
            let migration = migration();
            let mut host = host(&context, &migration);
            let status = StorageVersionMigrationStatus::default();
            let moment = crate::lifecycle::Moment::Interrupted;
            assert!(host.record(&status, moment).await.is_ok());
            assert_eq!(recorded.writes().len(), 0);
        }
    }
}
