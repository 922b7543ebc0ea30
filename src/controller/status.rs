//! Computing a migration's status from engine progress. Pure: the controller sends what these
//! functions return.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::{FAILED, RUNNING, STATUS_TRUE, SUCCEEDED};
use crate::api::{
    Checkpoint, FailedObject, MigrationCondition, MigrationProgress, MigrationTarget,
    StorageVersionMigration, StorageVersionMigrationStatus,
};
use crate::engine::{ObjectFailure, Progress};

/// Reasons on the conditions kube-svm writes.
pub mod reasons {
    /// The migration started (or resumed) migrating objects.
    pub const MIGRATING: &str = "Migrating";
    /// Every object was migrated.
    pub const COMPLETED: &str = "Completed";
    /// Some objects could not be migrated.
    pub const OBJECTS_FAILED: &str = "ObjectsFailed";
    /// The resource cannot be migrated (unknown, subresource, missing verbs).
    pub const INVALID_RESOURCE: &str = "InvalidResource";
    /// Listing the resource failed for good.
    pub const LIST_FAILED: &str = "ListFailed";
}

/// Failures named in a Failed condition's message.
const FAILURES_IN_MESSAGE: usize = 3;

/// Which of the three states a migration is in, from its first condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not picked up yet.
    New,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    pub fn of(migration: &StorageVersionMigration) -> Phase {
        let first = migration.status.as_ref().and_then(|status| status.conditions.first());
        match first.filter(|c| c.status == STATUS_TRUE).map(|c| c.type_.as_str()) {
            Some(RUNNING) => Phase::Running,
            Some(SUCCEEDED) => Phase::Succeeded,
            Some(FAILED) => Phase::Failed,
            _ => Phase::New,
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// Where a migration resumes: its own checkpoint, else upstream's `spec.continueToken`.
pub fn resume_point(migration: &StorageVersionMigration) -> Progress {
    let status = migration.status.clone().unwrap_or_default();
    let checkpoint_token = status.checkpoint.map(|c| c.continue_token).filter(|t| !t.is_empty());
    let Some(continue_token) = checkpoint_token else {
        // Without a checkpoint of its own the migration lists from where upstream's token says,
        // or from the start; counts restart with it, so they stay exact.
        let upstream = migration.spec.continue_token.clone().filter(|t| !t.is_empty());
        return Progress { continue_token: upstream, ..Progress::default() };
    };
    let counts = status.progress.unwrap_or_default();
    Progress {
        listed: counts.listed,
        rewritten: counts.rewritten,
        already_current: counts.already_current,
        skipped: counts.skipped,
        failed: counts.failed,
        remaining: counts.remaining,
        continue_token: Some(continue_token),
        failures: status.failed_objects.into_iter().map(object_failure).collect(),
        ..Progress::default()
    }
}

/// The status of a running migration after `progress`.
pub fn running(
    previous: Option<&StorageVersionMigrationStatus>,
    target: &MigrationTarget,
    progress: &Progress,
    now: Timestamp,
) -> StorageVersionMigrationStatus {
    let previous = previous.cloned().unwrap_or_default();
    let message = format!("{} objects processed", progress.processed());
    StorageVersionMigrationStatus {
        conditions: conditions(&previous, RUNNING, reasons::MIGRATING, message, now),
        progress: Some(counts(progress)),
        checkpoint: Some(Checkpoint {
            continue_token: progress.continue_token.clone().unwrap_or_default(),
            time: Some(Time(now)),
        }),
        failed_objects: progress.failures.iter().map(failed_object).collect(),
        target: Some(target.clone()),
        start_time: previous.start_time.or(Some(Time(now))),
        completion_time: None,
    }
}

/// The status of a migration whose engine run completed: Succeeded when nothing failed.
pub fn completed(
    previous: Option<&StorageVersionMigrationStatus>,
    target: &MigrationTarget,
    progress: &Progress,
    now: Timestamp,
) -> StorageVersionMigrationStatus {
    let mut status = running(previous, target, progress, now);
    let (type_, reason, message) = if progress.failed == 0 {
        let message = format!(
            "{} objects migrated: {} rewritten, {} already current, {} skipped",
            progress.processed(),
            progress.rewritten,
            progress.already_current,
            progress.skipped
        );
        (SUCCEEDED, reasons::COMPLETED, message)
    } else {
        (FAILED, reasons::OBJECTS_FAILED, failed_message(progress))
    };
    let previous = previous.cloned().unwrap_or_default();
    status.conditions = conditions(&previous, type_, reason, message, now);
    status.completion_time = Some(Time(now));
    status.checkpoint = None;
    status
}

/// The status of a migration that could not run: Failed with `reason` and `message`.
pub fn failed(
    previous: Option<&StorageVersionMigrationStatus>,
    reason: &str,
    message: String,
    now: Timestamp,
) -> StorageVersionMigrationStatus {
    let previous = previous.cloned().unwrap_or_default();
    StorageVersionMigrationStatus {
        conditions: conditions(&previous, FAILED, reason, message, now),
        completion_time: Some(Time(now)),
        start_time: previous.start_time.clone().or(Some(Time(now))),
        ..previous
    }
}

/// `type_` first and true; the other two states dropped, as upstream keeps exactly one of them;
/// conditions of other types kept after it.
fn conditions(
    previous: &StorageVersionMigrationStatus,
    type_: &str,
    reason: &str,
    message: String,
    now: Timestamp,
) -> Vec<MigrationCondition> {
    let current = MigrationCondition {
        type_: type_.to_owned(),
        status: STATUS_TRUE.to_owned(),
        last_update_time: Some(Time(now)),
        reason: Some(reason.to_owned()),
        message: Some(message),
    };
    let others = previous
        .conditions
        .iter()
        .filter(|c| ![RUNNING, SUCCEEDED, FAILED].contains(&c.type_.as_str()))
        .cloned();
    std::iter::once(current).chain(others).collect()
}

fn failed_message(progress: &Progress) -> String {
    let first: Vec<String> = progress
        .failures
        .iter()
        .take(FAILURES_IN_MESSAGE)
        .map(|f| {
            let name = match f.namespace.as_str() {
                "" => f.name.clone(),
                namespace => format!("{namespace}/{}", f.name),
            };
            format!("{name}: {} {}: {}", f.code, f.reason, f.message)
        })
        .collect();
    format!(
        "{} of {} objects could not be migrated ({} rewritten, {} already current, {} skipped); first failures: {}",
        progress.failed,
        progress.processed(),
        progress.rewritten,
        progress.already_current,
        progress.skipped,
        first.join("; ")
    )
}

fn counts(progress: &Progress) -> MigrationProgress {
    MigrationProgress {
        listed: progress.listed,
        processed: progress.processed(),
        rewritten: progress.rewritten,
        already_current: progress.already_current,
        skipped: progress.skipped,
        failed: progress.failed,
        remaining: progress.remaining,
    }
}

fn failed_object(failure: &ObjectFailure) -> FailedObject {
    let ObjectFailure { namespace, name, code, reason, message } = failure.clone();
    FailedObject { namespace, name, code, reason, message }
}

fn object_failure(failed: FailedObject) -> ObjectFailure {
    let FailedObject { namespace, name, code, reason, message } = failed;
    ObjectFailure { namespace, name, code, reason, message }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::StorageVersionMigrationSpec;

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn progress(failed: u64) -> Progress {
        let failures = (0..failed)
            .map(|i| ObjectFailure {
                namespace: "ns".into(),
                name: format!("o-{i}"),
                code: 422,
                reason: "Invalid".into(),
                message: "denied".into(),
            })
            .collect();
        Progress {
            listed: 10,
            rewritten: 8 - failed,
            already_current: 1,
            skipped: 1,
            failed,
            failures,
            ..Progress::default()
        }
    }

    fn migration(status: Option<StorageVersionMigrationStatus>) -> StorageVersionMigration {
        let mut migration =
            StorageVersionMigration::new("m", StorageVersionMigrationSpec::default());
        migration.status = status;
        migration
    }

    #[test]
    fn exactly_one_state_condition_and_it_comes_first() {
        let target = MigrationTarget::default();
        let running = running(None, &target, &progress(0), now());
        assert_eq!(running.conditions.len(), 1);
        assert_eq!(running.conditions[0].type_, RUNNING);
        let mut with_other = running.clone();
        with_other.conditions.push(MigrationCondition {
            type_: "Custom".into(),
            status: "True".into(),
            ..Default::default()
        });
        let done = completed(Some(&with_other), &target, &progress(0), now());
        let types: Vec<_> = done.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, [SUCCEEDED, "Custom"]);
        assert_eq!(Phase::of(&migration(Some(done))), Phase::Succeeded);
    }

    #[test]
    fn any_failed_object_fails_the_migration_with_counts_and_first_failures() {
        let done = completed(None, &MigrationTarget::default(), &progress(4), now());
        assert_eq!(done.conditions[0].type_, FAILED);
        assert_eq!(done.conditions[0].reason.as_deref(), Some(reasons::OBJECTS_FAILED));
        let message = done.conditions[0].message.clone().unwrap();
        assert!(
            message.starts_with(
                "4 of 10 objects could not be migrated (4 rewritten, 1 already current, 1 skipped)"
            ),
            "{message}"
        );
        assert!(message.contains("ns/o-0: 422 Invalid: denied; ns/o-1"), "{message}");
        assert!(!message.contains("o-3"), "only the first few are named");
        assert_eq!(done.failed_objects.len(), 4);
        assert_eq!(done.progress.unwrap().processed, 10);
        assert!(done.completion_time.is_some());
    }

    #[test]
    fn start_time_is_kept_across_updates() {
        let target = MigrationTarget::default();
        let first = running(None, &target, &progress(0), now());
        let later = Timestamp::from_second(1_800_000_100).unwrap();
        let second = running(Some(&first), &target, &progress(0), later);
        assert_eq!(second.start_time, first.start_time);
        assert_eq!(second.checkpoint.unwrap().time, Some(Time(later)));
    }

    #[test]
    fn resumes_from_the_checkpoint_else_from_the_upstream_token() {
        let mut upstream = migration(None);
        upstream.spec.continue_token = Some("upstream-token".into());
        assert_eq!(resume_point(&upstream).continue_token.as_deref(), Some("upstream-token"));

        let mut with_progress = progress(1);
        with_progress.continue_token = Some("own-token".into());
        let status = running(None, &MigrationTarget::default(), &with_progress, now());
        upstream.status = Some(status);
        let resumed = resume_point(&upstream);
        assert_eq!(resumed.continue_token.as_deref(), Some("own-token"));
        assert_eq!((resumed.rewritten, resumed.failed, resumed.failures.len()), (7, 1, 1));

        // Killed after the last page but before completing: start over, counts from zero.
        let mut without_token = with_progress.clone();
        without_token.continue_token = None;
        let mut restarted =
            migration(Some(running(None, &MigrationTarget::default(), &without_token, now())));
        restarted.spec.continue_token = None;
        assert_eq!(resume_point(&restarted), Progress::default());
    }

    #[test]
    fn phases_read_from_the_first_condition() {
        assert_eq!(Phase::of(&migration(None)), Phase::New);
        let failed = failed(None, reasons::INVALID_RESOURCE, "bad".into(), now());
        assert_eq!(Phase::of(&migration(Some(failed))), Phase::Failed);
        assert!(Phase::Failed.is_terminal() && !Phase::Running.is_terminal());
    }
}
