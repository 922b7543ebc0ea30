//! Computing a migration's status from engine progress, and where a migration starts. Pure: the
//! lifecycle records what these functions return.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::change::Change;
use crate::api::conditions::{FAILED, Phase, RUNNING, STATUS_TRUE, SUCCEEDED, events, reasons};
use crate::api::{
    CONDITION_MESSAGE_LIMIT, Checkpoint, MigrationCondition, MigrationProgress, MigrationTarget,
    RETRY_ANNOTATION, StorageVersionMigration, StorageVersionMigrationStatus, cut,
};
use crate::engine::{self, Progress};
use crate::rules::crd::{CrdChange, CrdState};
use crate::rules::managed_fields::Served;
use crate::rules::stored_versions::Run;

/// Failures named in a Failed condition's message.
const FAILURES_IN_MESSAGE: usize = 3;

/// Bytes of each failure's message quoted in a Failed condition's message: three fit in
/// [`CONDITION_MESSAGE_LIMIT`] with the counts and the objects' names.
const FAILURE_IN_MESSAGE_LIMIT: usize = 400;

/// Where a migration starts, and what kind of start it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    /// Counts and the continue token to go on from.
    pub progress: Progress,
    /// Whether the objects before `progress.continue_token` were listed by kube-svm under the
    /// same target.
    pub listed_from_start: bool,
    /// Whether the target recorded when the migration first started still holds.
    pub keeps_target: bool,
    /// Times the migration has started over because its target changed mid-run.
    pub restarts: u32,
    /// The Event reason saying what kind of start this is.
    pub event: &'static str,
    /// The Event's note: where the listing starts from and, when starting over, why.
    pub note: String,
}

impl Start {
    /// A start from the first object after the target changed mid-run (`why`), for the
    /// `restarts`-th time.
    pub fn over(why: &str, restarts: u32) -> Start {
        Start {
            progress: Progress::default(),
            listed_from_start: true,
            keeps_target: false,
            restarts,
            event: events::RESTARTED,
            note: format!(
                "migrating every object again from the first (restart {restarts} of at most {MAX_RESTARTS}): {why}"
            ),
        }
    }
}

/// Times a migration starts over from the first object because its resource's storage version
/// (or CRD) changed after it began writing, before it fails saying so: a storage version
/// switched back and forth a few times is followed; one that keeps changing is the operator's
/// to settle first.
pub const MAX_RESTARTS: u32 = 3;

/// Times a migration is done again from the first object because the cluster it wrote to was
/// restored or its apiservers restarted ([`super::witness`]), before it fails saying so: a
/// rolling restart of the apiservers, or a chaos test killing them, is waited out; a cluster that
/// never holds still is the operator's to settle first.
pub const MAX_REDOS: u32 = 20;

/// Where a migration goes after `change` (the cluster it wrote to was restored or restarted)
/// voided the run whose last status is `current`, for the `redos`-th time: the start of its
/// `restarts`-th run from the first object, or past [`MAX_REDOS`], Failed.
pub fn redo(
    current: &StorageVersionMigrationStatus,
    change: &Change,
    restarts: u32,
    redos: u32,
    now: Timestamp,
) -> Result<Start, Box<StorageVersionMigrationStatus>> {
    let processed = current.progress.as_ref().map_or(0, |p| p.processed);
    if redos > MAX_REDOS {
        let message = format!(
            "{}, after {processed} objects, and the cluster had already changed {MAX_REDOS} times under the migration: objects may be stored as they were before it; let the cluster settle, then migrate again",
            change
        );
        return Err(Box::new(failed(Some(current), change.reason(), message, now)));
    }
    let mut start = Start::over(&format!("{}, after {processed} objects", change), restarts);
    start.note = format!(
        "migrating every object again from the first (done again {redos} of at most {MAX_REDOS} times): {}, after {processed} objects",
        change
    );
    Ok(start)
}

/// Times the target of a migration is worked out again because it changed before the first
/// write, before the migration fails: a CRD edited a few times in a row settles; one edited
/// without end does not.
pub const MAX_RETARGETS: u32 = 10;

/// Where a migration goes after `change` voided the run whose last status is `current`: the
/// start of its `restarts`-th run (start-overs of any cause, as `status.restarts` counts them),
/// or, when the storage version has now changed more than [`MAX_RESTARTS`] times under it
/// (`switched`), Failed.
pub fn restart(
    current: &StorageVersionMigrationStatus,
    change: &Change,
    restarts: u32,
    switched: u32,
    now: Timestamp,
) -> Result<Start, Box<StorageVersionMigrationStatus>> {
    let processed = current.progress.as_ref().map_or(0, |p| p.processed);
    if switched > MAX_RESTARTS {
        let message = format!(
            "{}, after {processed} objects, and it had already changed {MAX_RESTARTS} times while the migration ran: objects may be stored in any of those versions; settle the storage version, then migrate again",
            change
        );
        return Err(Box::new(failed(Some(current), change.reason(), message, now)));
    }
    Ok(Start::over(&format!("{}, after {processed} objects", change), restarts))
}

/// `done` with its encoding no longer taken as confirmed, saying why (the apiservers disagreed
/// at the end of the run): it proves nothing about how the objects are stored.
pub fn unproven(
    mut done: StorageVersionMigrationStatus,
    why: &str,
) -> StorageVersionMigrationStatus {
    let target = done.target.get_or_insert_with(MigrationTarget::default);
    let before = target.encoding_evidence.take().unwrap_or_default();
    target.encoding_confirmed = Some(false);
    target.encoding_evidence = Some(cut(&format!("{before}; but {why}"), CONDITION_MESSAGE_LIMIT));
    done
}

/// The status of a migration whose target kept changing before its first write.
pub fn kept_changing(
    previous: Option<&StorageVersionMigrationStatus>,
    change: &Change,
    now: Timestamp,
) -> StorageVersionMigrationStatus {
    let message = format!(
        "the target kept changing before the first write ({MAX_RETARGETS} times; the last: {}); settle the storage version, then migrate again",
        change
    );
    failed(previous, change.reason(), message, now)
}

/// Where `migration` starts, given the storage version hash discovery publishes now and, for a
/// CRD-backed resource, its CRD now. It resumes from its own checkpoint when that was taken
/// under the same storage version and the same CRD generation (any change of the CRD since,
/// even a storage switch there and back, may have left objects in another version); otherwise
/// it starts over, from upstream's `spec.continueToken` when there is one (then it did not list
/// from the start), or from the first object.
pub fn start_point(
    migration: &StorageVersionMigration,
    current_hash: Option<&str>,
    crd: Option<&CrdState>,
) -> Start {
    let status = migration.status.clone().unwrap_or_default();
    let recorded = status.target.clone().unwrap_or_default();
    let recorded_hash = recorded.storage_version_hash.as_deref();
    let checkpoint = status.checkpoint.map(|c| c.continue_token).filter(|t| !t.is_empty());
    let running = Phase::of(migration) == Phase::Running;
    let restarts = status.restarts.unwrap_or(0);
    // Any change of the CRD since voids the checkpoint, and so does a record without its uid.
    let crd_changed = match CrdState::recorded(&recorded) {
        // A CRD's generation recorded without its storage version: nothing to compare with.
        None if recorded.crd_generation.is_some() => {
            Some("the checkpoint did not record the storage version".into())
        }
        None => None,
        Some(then) if !then.identified() => Some("the checkpoint did not record its uid".into()),
        Some(then) => CrdChange::between(&then, crd).map(|change| change.to_string()),
    };
    let same_target = recorded_hash == current_hash && crd_changed.is_none();
    if let (true, Some(continue_token), true) = (running, &checkpoint, same_target) {
        let counts = status.progress.unwrap_or_default();
        return Start {
            progress: Progress {
                listed: counts.listed,
                rewritten: counts.rewritten,
                cleaned: counts.cleaned,
                already_current: counts.already_current,
                skipped: counts.skipped,
                failed: counts.failed,
                remaining: counts.remaining,
                continue_token: Some(continue_token.clone()),
                failures: status.failed_objects,
                ..Progress::default()
            },
            // A checkpoint written before kube-svm recorded this is not trusted for pruning.
            listed_from_start: status.listed_from_start.unwrap_or(false),
            keeps_target: true,
            restarts,
            event: events::RESUMED,
            note: "resuming from the checkpoint".to_owned(),
        };
    }
    let (event, why) = match (running, same_target, crd_changed) {
        (false, _, _) => (events::STARTED, String::new()),
        (true, false, Some(changed)) => {
            (events::RESTARTED, format!(" again: the CRD changed since the checkpoint ({changed})"))
        }
        (true, false, None) => (
            events::RESTARTED,
            format!(
                " again: the storage version hash changed from {} to {} since the migration started",
                recorded_hash.unwrap_or("none"),
                current_hash.unwrap_or("none")
            ),
        ),
        (true, true, _) => {
            (events::RESTARTED, " again: there was no checkpoint to resume from".into())
        }
    };
    from_the_beginning(migration, event, &why)
}

/// Where `migration` starts when its checkpoint, though taken under the same target, no longer
/// describes the cluster ([`super::resume::refusal`] says `why`): from the first object.
pub fn not_resumed(migration: &StorageVersionMigration, why: &str) -> Start {
    let why = format!(" again: the checkpoint no longer describes this cluster: {why}");
    from_the_beginning(migration, events::RESTARTED, &why)
}

/// A start that does not resume a checkpoint: from upstream's `spec.continueToken` when there
/// is one, or from the first object; `why` ends the note.
fn from_the_beginning(
    migration: &StorageVersionMigration,
    event: &'static str,
    why: &str,
) -> Start {
    let status = migration.status.clone().unwrap_or_default();
    let restarts = status.restarts.unwrap_or(0);
    // A retry lists from the first object: the objects before upstream's token were never
    // written by kube-svm, and a run that lists them all can prove what a prune needs.
    let retry = status.retries.filter(|n| *n > 0);
    let again = retry.map(|n| format!(" (retry {n})")).unwrap_or_default();
    // Counts restart with the listing, so they stay exact.
    let upstream =
        migration.spec.continue_token.clone().filter(|t| !t.is_empty() && retry.is_none());
    let (listed_from_start, from) = match &upstream {
        Some(_) => (false, "from the continue token in spec.continueToken"),
        None => (true, "from the first object"),
    };
    Start {
        progress: Progress { continue_token: upstream, ..Progress::default() },
        listed_from_start,
        keeps_target: false,
        restarts,
        event,
        note: format!("migrating every object {from}{why}{again}"),
    }
}

/// The status that runs a Failed migration again in place, for the retry `token`: its outcome
/// and progress cleared, so that it starts as a new migration does, from the first object; the
/// retry counted, and its token recorded so that it is acted on once.
pub fn retried(
    previous: Option<&StorageVersionMigrationStatus>,
    token: &str,
) -> StorageVersionMigrationStatus {
    let retries = previous.and_then(|s| s.retries).unwrap_or(0) + 1;
    StorageVersionMigrationStatus {
        retries: Some(retries),
        retry_token: Some(token.to_owned()),
        ..StorageVersionMigrationStatus::default()
    }
}

/// What the Event of a retry says: which retry, and the outcome it clears (state, reason,
/// counts, message), which the status no longer shows afterwards.
pub fn retry_note(previous: Option<&StorageVersionMigrationStatus>, token: &str) -> String {
    let previous = previous.cloned().unwrap_or_default();
    let retry = previous.retries.unwrap_or(0) + 1;
    let first = previous.conditions.first().cloned().unwrap_or_default();
    let counts = previous.progress.unwrap_or_default();
    // The message last: the apiserver's limit on a note cuts it, not the counts.
    format!(
        "retry {retry} ({RETRY_ANNOTATION}={token}) runs the migration again from the first object; the previous run ended {} ({}) after {} objects: {} rewritten, {} already current, {} skipped, {} failed: {}",
        first.type_,
        first.reason.unwrap_or_default(),
        counts.processed,
        counts.rewritten,
        counts.already_current,
        counts.skipped,
        counts.failed,
        first.message.unwrap_or_default()
    )
}

/// Whether, and how, a run cleans `managedFields`: the operator asked for it on a resource with
/// a CRD (`Crd`, the versions kept and whether the run writes through `/status`), or on one
/// without (`NoCrd`: nothing to clean).
pub enum Cleaning {
    /// The entries naming a version not in `served` are removed.
    Crd {
        /// The versions served, whose entries are kept.
        served: Served,
        /// Whether the run writes through `/status`, which keeps `managedFields` as they are.
        writes_to_status: bool,
    },
    /// The resource has no CRD, so its `managedFields` are left as they are.
    NoCrd,
}

/// What the operator is told as a run of `migration`'s resource starts from `start`: what
/// kind of start it is, the annotations that name no pace or budget, and the `managedFields`
/// cleaning the run does, if asked.
pub fn start_note(
    migration: &StorageVersionMigration,
    start: &Start,
    cleaning: Option<Cleaning>,
) -> String {
    let resource = migration.group_resource().name();
    let mut note = format!("{resource}: {}", start.note);
    if let Some(unknown) = migration.unknown_pace() {
        note.push_str(&format!(
            "; the annotation {}: {unknown:?} names no pace ({}), so the default pace applies",
            crate::api::PACE_ANNOTATION,
            crate::api::Pace::NAMES.join(" or ")
        ));
    }
    if let Some(Err(unknown)) = migration.requested_budget() {
        note.push_str(&format!(
            "; the annotation {}: {unknown}, so the controller's budget applies",
            crate::api::FOREGROUND_BUDGET_ANNOTATION
        ));
    }
    note.push_str(&match cleaning {
        None => String::new(),
        Some(Cleaning::Crd { served, writes_to_status }) => format!(
            "; managedFields entries naming a version not served (served: {}) are removed{}",
            served.names(),
            match writes_to_status {
                // The apiserver keeps the live managedFields for a subresource.
                true => ", through the resource itself for the objects that have any, as /status keeps managedFields as they are",
                false => "",
            }
        ),
        Some(Cleaning::NoCrd) => format!(
            "; {resource} has no CRD, so its managedFields are left as they are (only a CRD's versions stop being served)"
        ),
    });
    note
}

/// The status of a run that completed as `done` after `processed` objects, failed by `change`
/// found at its end (the resource or its CRD gone, or unreadable): its writes prove nothing.
pub fn changed_at_end(
    done: &StorageVersionMigrationStatus,
    change: &Change,
    processed: u64,
    now: Timestamp,
) -> StorageVersionMigrationStatus {
    let message = format!(
        "{change}; {processed} objects were processed, but those written before the change may be stored in the old version: migrate again"
    );
    failed(Some(done), change.reason(), message, now)
}

/// The status of a migration starting from `start`, targeting `target`.
pub fn started(
    previous: Option<&StorageVersionMigrationStatus>,
    target: &MigrationTarget,
    start: &Start,
    now: Timestamp,
) -> StorageVersionMigrationStatus {
    let mut status = running(previous, target, &start.progress, now);
    status.listed_from_start = Some(start.listed_from_start);
    status.restarts = Some(start.restarts).filter(|n| *n > 0);
    status
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
        listed_from_start: previous.listed_from_start,
        restarts: previous.restarts,
        retries: previous.retries,
        retry_token: previous.retry_token.clone(),
        conditions: conditions(&previous, RUNNING, reasons::MIGRATING, message, now),
        progress: Some(counts(progress)),
        checkpoint: Some(Checkpoint {
            continue_token: progress.continue_token.clone().unwrap_or_default(),
            time: Some(Time(now)),
        }),
        failed_objects: progress.failures.clone(),
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
        let message = format!("{} objects migrated: {}", progress.processed(), outcomes(progress));
        (SUCCEEDED, reasons::COMPLETED, message)
    } else {
        (FAILED, reasons::OBJECTS_FAILED, failed_message(progress))
    };
    let previous = previous.cloned().unwrap_or_default();
    status.conditions = conditions(&previous, type_, reason, message, now);
    status.completion_time = Some(Time(now));
    status.checkpoint = None;
    at_rest(status)
}

/// The target a migration takes without looking further: the one it recorded when it first
/// started, when it resumes under it. `None` when it must be worked out: the storage version
/// (hash) and whether the apiservers encode in it yet.
pub fn known_target(
    previous: Option<&StorageVersionMigrationStatus>,
    start: &Start,
) -> Option<MigrationTarget> {
    let recorded = previous.and_then(|s| s.target.clone());
    recorded.filter(|_| start.keeps_target)
}

/// The status of a run the engine could not finish: Failed, with the counts it reached and why
/// it stopped.
pub fn engine_failed(
    previous: Option<&StorageVersionMigrationStatus>,
    target: &MigrationTarget,
    progress: &Progress,
    error: &engine::Error,
    now: Timestamp,
) -> StorageVersionMigrationStatus {
    let reason = match error {
        engine::Error::NotServed { .. } => reasons::RESOURCE_NOT_SERVED,
        engine::Error::ApiserverUnavailable { .. } => reasons::APISERVER_UNAVAILABLE,
        engine::Error::WritesFailing { .. } => reasons::WRITES_FAILING,
        _ => reasons::LIST_FAILED,
    };
    let with_progress = running(previous, target, progress, now);
    failed(Some(&with_progress), reason, crate::error_chain(error), now)
}

/// What a finished migration's status establishes, as far as pruning `storedVersions` goes.
pub fn run_of(status: &StorageVersionMigrationStatus) -> Run {
    Run {
        succeeded: status.conditions.first().map(|c| c.type_.as_str()) == Some(SUCCEEDED),
        failed: status.progress.as_ref().map_or(0, |p| p.failed),
        listed_from_start: status.listed_from_start.unwrap_or(false),
    }
}

/// The status of a migration that could not run: Failed with `reason` and `message`.
pub fn failed(
    previous: Option<&StorageVersionMigrationStatus>,
    reason: &str,
    message: String,
    now: Timestamp,
) -> StorageVersionMigrationStatus {
    let previous = previous.cloned().unwrap_or_default();
    at_rest(StorageVersionMigrationStatus {
        conditions: conditions(&previous, FAILED, reason, message, now),
        completion_time: Some(Time(now)),
        start_time: previous.start_time.clone().or(Some(Time(now))),
        ..previous
    })
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
        message: Some(cut(&message, CONDITION_MESSAGE_LIMIT)),
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
            let message = cut(&f.message, FAILURE_IN_MESSAGE_LIMIT);
            engine::describe(&crate::api::FailedObject { message, ..f.clone() })
        })
        .collect();
    format!(
        "{} of {} objects could not be migrated ({}); first failures: {}",
        progress.failed,
        progress.processed(),
        outcomes(progress),
        first.join("; ")
    )
}

/// `12 rewritten, 3 already current, 0 skipped` ([`MigrationProgress::outcomes`]).
fn outcomes(progress: &Progress) -> String {
    counts(progress).outcomes()
}

fn counts(progress: &Progress) -> MigrationProgress {
    MigrationProgress {
        listed: progress.listed,
        processed: progress.processed(),
        rewritten: progress.rewritten,
        cleaned: progress.cleaned,
        already_current: progress.already_current,
        skipped: progress.skipped,
        failed: progress.failed,
        remaining: progress.remaining,
        pace: progress.pacing.map(|p| p.pace.name().to_owned()),
        window: progress.pacing.map(|p| u32::try_from(p.window.size).unwrap_or(u32::MAX)),
        holding_back: progress.pacing.and_then(|p| p.window.restraint).map(|r| r.name().to_owned()),
        foreground: progress.pacing.and_then(|p| p.steered).map(|seen| seen.to_string()),
    }
}

/// `status` at rest: the write window describes a running migration only, so an ended one keeps
/// its pace and drops the window and what held it back.
fn at_rest(mut status: StorageVersionMigrationStatus) -> StorageVersionMigrationStatus {
    if let Some(progress) = status.progress.as_mut() {
        progress.window = None;
        progress.holding_back = None;
        progress.foreground = None;
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::FailedObject;
    use crate::api::StorageVersionMigrationSpec;

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    fn progress(failed: u64) -> Progress {
        let failures = (0..failed)
            .map(|i| FailedObject {
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
    fn a_target_is_known_only_when_resumed() {
        let fresh = start_point(&migration(None), Some("new"), None);
        assert_eq!(known_target(None, &fresh), None);
        let recorded = MigrationTarget {
            storage_version_hash: Some("new".into()),
            storage_version: Some("v2".into()),
            crd_generation: Some(3),
            crd_uid: Some("u1".into()),
            ..MigrationTarget::default()
        };
        let mut checkpointed = running(None, &recorded, &progress(0), now());
        let checkpoint = Checkpoint { continue_token: "t".into(), time: None };
        checkpointed.checkpoint = Some(checkpoint);
        let crd = crd_now("u1", 3);
        let resumed = start_point(&migration(Some(checkpointed.clone())), Some("new"), Some(&crd));
        assert!(resumed.keeps_target);
        let kept = known_target(Some(&checkpointed), &resumed);
        assert_eq!(kept, Some(recorded));
    }

    #[test]
    fn an_engine_failure_keeps_the_counts_and_names_why() {
        let target = MigrationTarget::default();
        let started = running(None, &target, &Progress::default(), now());
        let error = engine::Error::NotServed {
            resource: "widgets.example.com".into(),
            api_version: "example.com/v1".into(),
            message: "the server could not find the requested resource".into(),
        };
        let failed = engine_failed(Some(&started), &target, &progress(0), &error, now());
        let condition = &failed.conditions[0];
        assert_eq!(
            (condition.type_.as_str(), condition.reason.as_deref()),
            (FAILED, Some(reasons::RESOURCE_NOT_SERVED))
        );
        assert!(condition.message.as_deref().unwrap_or_default().contains("no longer served"));
        assert_eq!(failed.progress.as_ref().map(|p| p.processed), Some(10));
        let run = run_of(&failed);
        assert_eq!(run, Run { succeeded: false, failed: 0, listed_from_start: false });
    }

    #[test]
    fn a_completed_run_from_the_start_establishes_what_pruning_needs() {
        let target = MigrationTarget::default();
        let start = start_point(&migration(None), None, None);
        let started = started(None, &target, &start, now());
        let done = completed(Some(&started), &target, &progress(0), now());
        assert_eq!(run_of(&done), Run { succeeded: true, failed: 0, listed_from_start: true });
        let with_failures = completed(Some(&started), &target, &progress(2), now());
        assert_eq!(
            run_of(&with_failures),
            Run { succeeded: false, failed: 2, listed_from_start: true }
        );
    }

    #[test]
    fn a_running_migration_shows_its_pace_and_window_and_an_ended_one_its_pace() {
        use crate::api::Pace;
        use crate::engine::{Holding, Pacing, Restraint};
        let target = MigrationTarget::default();
        let unreported = running(None, &target, &progress(0), now()).progress.unwrap_or_default();
        assert_eq!((unreported.pace, unreported.window), (None, None), "not known yet");
        let window = Holding { size: 6, restraint: Some(Restraint::Latency) };
        let held = Progress {
            pacing: Some(Pacing { pace: Pace::Gentle, window, steered: None }),
            ..progress(0)
        };
        let status = running(None, &target, &held, now());
        let counts = status.progress.clone().unwrap_or_default();
        assert_eq!(
            (counts.pace.as_deref(), counts.window, counts.holding_back.as_deref()),
            (Some("gentle"), Some(6), Some("latency"))
        );
        for ended in [
            completed(Some(&status), &target, &held, now()),
            failed(Some(&status), reasons::WRITES_FAILING, "failing".into(), now()),
        ] {
            let counts = ended.progress.unwrap_or_default();
            assert_eq!(
                (counts.pace.as_deref(), counts.window, counts.holding_back),
                (Some("gentle"), None, None)
            );
        }
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

    /// The CRD `uid` at `generation`, storing in v2.
    fn crd_now(uid: &str, generation: i64) -> CrdState {
        CrdState {
            uid: Some(uid.into()),
            generation,
            storage_version: "v2".into(),
            stored_versions: Vec::new(),
        }
    }

    fn target(hash: &str) -> MigrationTarget {
        MigrationTarget { storage_version_hash: Some(hash.into()), ..MigrationTarget::default() }
    }

    /// A Running migration with a checkpoint at `token` (none when empty), taken under `hash`.
    fn checkpointed(
        token: &str,
        hash: &str,
        listed_from_start: Option<bool>,
    ) -> StorageVersionMigration {
        let mut with_progress = progress(1);
        with_progress.continue_token = Some(token.to_owned()).filter(|t| !t.is_empty());
        let mut status = running(None, &target(hash), &with_progress, now());
        status.listed_from_start = listed_from_start;
        migration(Some(status))
    }

    #[test]
    fn a_new_migration_lists_from_the_start_unless_upstream_left_a_token() {
        let fresh = start_point(&migration(None), Some("h2"), None);
        assert_eq!((fresh.progress, fresh.listed_from_start), (Progress::default(), true));
        assert_eq!((fresh.keeps_target, fresh.event), (false, events::STARTED));

        let mut upstream = migration(None);
        upstream.spec.continue_token = Some("upstream-token".into());
        let start = start_point(&upstream, Some("h2"), None);
        assert_eq!(start.progress.continue_token.as_deref(), Some("upstream-token"));
        assert!(
            !start.listed_from_start,
            "objects before the token were never written by kube-svm"
        );
        assert!(start.note.contains("spec.continueToken"), "{}", start.note);
    }

    #[test]
    fn resumes_from_its_own_checkpoint_of_the_same_target() {
        let start = start_point(&checkpointed("own-token", "h2", Some(true)), Some("h2"), None);
        assert_eq!(start.progress.continue_token.as_deref(), Some("own-token"));
        let counts = &start.progress;
        assert_eq!((counts.rewritten, counts.failed, counts.failures.len()), (7, 1, 1));
        assert_eq!((start.listed_from_start, start.keeps_target), (true, true));
        assert_eq!(start.event, events::RESUMED);
        // A run that began at a foreign token stays partial when resumed.
        let partial = start_point(&checkpointed("own-token", "h2", Some(false)), Some("h2"), None);
        assert!(!partial.listed_from_start);
        // A checkpoint that never said is not trusted.
        assert!(
            !start_point(&checkpointed("own-token", "h2", None), Some("h2"), None)
                .listed_from_start
        );
    }

    #[test]
    fn starts_over_when_the_storage_version_changed_since_the_checkpoint() {
        let start = start_point(&checkpointed("own-token", "h1", Some(true)), Some("h2"), None);
        assert_eq!((start.progress, start.listed_from_start), (Progress::default(), true));
        assert_eq!((start.keeps_target, start.event), (false, events::RESTARTED));
        assert!(start.note.contains("changed from h1 to h2"), "{}", start.note);
    }

    #[test]
    fn starts_over_when_the_crd_changed_since_the_checkpoint() {
        let mut migration = checkpointed("own-token", "h2", Some(true));
        if let Some(target) = migration.status.as_mut().and_then(|s| s.target.as_mut()) {
            target.crd_generation = Some(4);
            target.crd_uid = Some("u1".into());
            target.storage_version = Some("v2".into());
        }
        let same = crd_now("u1", 4);
        assert!(start_point(&migration, Some("h2"), Some(&same)).keeps_target);
        // v2 -> v1 -> v2 while no controller ran: the same hash, a newer generation.
        let flipped = crd_now("u1", 6);
        let start = start_point(&migration, Some("h2"), Some(&flipped));
        assert_eq!((start.progress, start.listed_from_start), (Progress::default(), true));
        assert_eq!((start.keeps_target, start.event), (false, events::RESTARTED));
        assert!(start.note.contains("generation 4 then 6"), "{}", start.note);
        let replaced = crd_now("u2", 4);
        assert!(!start_point(&migration, Some("h2"), Some(&replaced)).keeps_target);
        assert!(!start_point(&migration, Some("h2"), None).keeps_target, "the CRD is gone");
        // A checkpoint that did not record the CRD's uid cannot tell a CRD created again.
        if let Some(target) = migration.status.as_mut().and_then(|s| s.target.as_mut()) {
            target.crd_uid = None;
        }
        let start = start_point(&migration, Some("h2"), Some(&same));
        assert!(!start.keeps_target);
        assert!(start.note.contains("did not record its uid"), "{}", start.note);
        // Nor one that recorded the CRD's generation but not its storage version.
        if let Some(target) = migration.status.as_mut().and_then(|s| s.target.as_mut()) {
            target.crd_uid = Some("u1".into());
            target.storage_version = None;
        }
        let start = start_point(&migration, Some("h2"), Some(&same));
        assert!(!start.keeps_target, "{}", start.note);
    }

    #[test]
    fn a_change_after_the_first_write_starts_over_a_few_times_then_fails() {
        let change = Change::StorageSwitched {
            resource: "widgets.example.com".into(),
            from: "v2".into(),
            to: "v1".into(),
            generation: None,
        };
        let current = running(None, &target("h2"), &progress(0), now());
        let next = restart(&current, &change, 1, 1, now()).expect("starts over");
        assert_eq!((next.restarts, next.listed_from_start), (1, true));
        assert!(next.note.contains("after 10 objects"), "{}", next.note);
        assert!(restart(&current, &change, MAX_RESTARTS, MAX_RESTARTS, now()).is_ok());
        let failed = restart(&current, &change, MAX_RESTARTS + 1, MAX_RESTARTS + 1, now())
            .expect_err("fails");
        let condition = &failed.conditions[0];
        assert_eq!(
            (condition.type_.as_str(), condition.reason.as_deref()),
            (FAILED, Some(reasons::STORAGE_VERSION_CHANGED))
        );
        assert!(condition.message.as_deref().unwrap_or_default().contains("changed 3 times"));
        assert_eq!(Phase::of(&migration(Some(*failed))), Phase::Failed);
    }

    #[test]
    fn a_run_that_ends_among_disagreeing_apiservers_proves_nothing() {
        let mut confirmed = target("h2");
        confirmed.encoding_confirmed = Some(true);
        confirmed.encoding_evidence = Some("confirmed by discovery".into());
        let done = completed(None, &confirmed, &progress(0), now());
        let done = unproven(done, "at the end the apiservers published h1 (4 samples), h2 (8)");
        let target = done.target.clone().expect("a target");
        assert_eq!(target.encoding_confirmed, Some(false));
        let evidence = target.encoding_evidence.unwrap_or_default();
        assert!(evidence.starts_with("confirmed by discovery; but at the end"), "{evidence}");
        assert_eq!(Phase::of(&migration(Some(done))), Phase::Succeeded, "it did rewrite them");
    }

    #[test]
    fn a_restart_lists_from_the_first_object_and_is_counted() {
        let start = Start::over("the storage version changed from v2 to v1", 2);
        assert_eq!((&start.progress, start.listed_from_start), (&Progress::default(), true));
        assert_eq!((start.restarts, start.event), (2, events::RESTARTED));
        let status = started(None, &target("h2"), &start, now());
        assert_eq!(status.restarts, Some(2));
        let later = running(Some(&status), &target("h2"), &progress(0), now());
        assert_eq!(later.restarts, Some(2), "kept while it runs");
        assert!(start.note.contains("restart 2 of at most 3"), "{}", start.note);
    }

    #[test]
    fn starts_over_without_a_checkpoint_token() {
        // Killed after the last page but before completing: start over, counts from zero.
        let start = start_point(&checkpointed("", "h2", Some(true)), Some("h2"), None);
        assert_eq!((start.progress, start.listed_from_start), (Progress::default(), true));
        assert_eq!(start.event, events::RESTARTED);
    }

    #[test]
    fn the_start_records_whether_the_listing_is_whole_and_later_statuses_keep_it() {
        let start = start_point(&migration(None), Some("h2"), None);
        let first = started(None, &target("h2"), &start, now());
        assert_eq!(first.listed_from_start, Some(true));
        let later = running(Some(&first), &target("h2"), &progress(0), now());
        assert_eq!(later.listed_from_start, Some(true));
        let done = completed(Some(&later), &target("h2"), &progress(0), now());
        assert_eq!(done.listed_from_start, Some(true));
    }

    #[test]
    fn a_retry_clears_the_outcome_counts_it_and_starts_from_the_first_object() {
        let target = target("h2");
        let mut upstream = migration(None);
        upstream.spec.continue_token = Some("upstream-token".into());
        let first = started(None, &target, &start_point(&upstream, Some("h2"), None), now());
        assert_eq!(first.listed_from_start, Some(false), "began at upstream's token");
        let done = completed(Some(&first), &target, &progress(4), now());
        let note = retry_note(Some(&done), "t1");
        assert!(
            note.starts_with("retry 1 (kube-svm.io/retry=t1) runs the migration again from the first object; the previous run ended Failed (ObjectsFailed) after 10 objects: 4 rewritten, 1 already current, 1 skipped, 4 failed: 4 of 10 objects could not be migrated"),
            "{note}"
        );

        let cleared = retried(Some(&done), "t1");
        assert_eq!((cleared.retries, cleared.retry_token.as_deref()), (Some(1), Some("t1")));
        assert!(cleared.conditions.is_empty() && cleared.progress.is_none());
        assert!(cleared.failed_objects.is_empty() && cleared.target.is_none());
        assert!(cleared.checkpoint.is_none() && cleared.completion_time.is_none());
        upstream.status = Some(cleared.clone());
        assert_eq!(Phase::of(&upstream), Phase::New, "taken up as a new migration is");
        let start = start_point(&upstream, Some("h2"), None);
        assert_eq!((&start.progress, start.listed_from_start), (&Progress::default(), true));
        assert_eq!(start.event, events::STARTED);
        assert_eq!(start.note, "migrating every object from the first object (retry 1)");

        // Every later status keeps the count and the token, whatever the run's end.
        let again = started(Some(&cleared), &target, &start, now());
        let ended = [
            completed(Some(&again), &target, &progress(0), now()),
            failed(Some(&again), reasons::WRITES_FAILING, "failing".into(), now()),
        ];
        for ended in ended {
            assert_eq!((ended.retries, ended.retry_token.as_deref()), (Some(1), Some("t1")));
        }
        let second = retried(Some(&again), "t2");
        assert_eq!((second.retries, second.retry_token.as_deref()), (Some(2), Some("t2")));
    }

    #[test]
    fn phases_read_from_the_first_condition() {
        assert_eq!(Phase::of(&migration(None)), Phase::New);
        let failed = failed(None, reasons::INVALID_RESOURCE, "bad".into(), now());
        assert_eq!(Phase::of(&migration(Some(failed))), Phase::Failed);
        assert!(Phase::Failed.is_terminal() && !Phase::Running.is_terminal());
    }
}
