//! Deciding when a migration starts: never twice, at most one per resource (the oldest first), at
//! most [`super::PREPARING`] gathering evidence at once in each lane, and when it writes: at most
//! `concurrency` at once, the catch-up after those made by hand or for a switch, the discovery
//! trigger's sweep in a lane of its own ([`super::lanes`]). Terminal migrations are never run again, save a Failed one asked
//! to by its retry annotation (`retry`), which then starts as a new one. A migration whose
//! discovery failed waits for its next try without holding a slot, and fails after a few.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;
use tracing::{debug, error, instrument};

use super::Context;
use super::lanes::{Lane, WAIT_FOR_TURN, lane, swept};
use super::migration::{self, Requeue};
use crate::api::{GroupResource, Phase, StorageVersionMigration};

/// Tries a migration gets by default when discovery (or its CRD) cannot be read, before it
/// fails: with [`defer_delay`], about two and a half minutes, long enough for an aggregated
/// API's backend or an apiserver to come back, short enough that an operator hears of it soon.
pub const DISCOVERY_ATTEMPTS: u32 = 6;

/// Wait before the try after `failures` failed ones: 5 s, doubling, at most a minute.
fn defer_delay(failures: u32) -> Duration {
    crate::rules::backoff::doubling(failures, Duration::from_secs(5), Duration::from_secs(60))
}

/// Wait before looking again whether the in-tree migrator's migration of the same resource has
/// ended: it migrates at most a few hundred objects a second, so seconds matter little.
const IN_TREE_WAIT: Duration = Duration::from_secs(10);

/// Wait before taking up again a migration whose status could not be written.
const UNRECORDED_WAIT: Duration = Duration::from_secs(30);

/// Times a migration whose status cannot be written is taken up again before kube-svm leaves
/// it alone until it changes (an admission policy refusing its status, say): about 2.5 minutes.
const UNRECORDED_ATTEMPTS: u32 = 5;

/// A migration that did not finish for a reason worth waiting out: how often, and when to try
/// again.
#[derive(Clone, Debug)]
pub(super) struct Deferred {
    /// Discovery failures.
    pub failures: u32,
    /// Runs whose status could not be written.
    pub unrecorded: u32,
    pub next: Instant,
    /// Set when kube-svm gave up on an unwritable status: the resourceVersion the migration
    /// had then. It is taken up again once it changes.
    pub given_up_at: Option<String>,
    /// Set when its task ended for good (finished, or left to another writer): the
    /// resourceVersion the cache showed then, which may still be a Running one. It is not
    /// started again until the cache shows it changed: by then it shows how it ended.
    pub ended_at: Option<String>,
}

impl Deferred {
    /// A task that ended for good while the cache showed `resource_version`.
    fn ended(resource_version: String) -> Deferred {
        let (failures, unrecorded, next) = (0, 0, Instant::now());
        Deferred { failures, unrecorded, next, given_up_at: None, ended_at: Some(resource_version) }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a StorageVersionMigration has no name")]
    Unnamed,
    #[error(transparent)]
    Retry(#[from] super::retry::Error),
}

#[instrument(skip_all, fields(migration = %migration.name_any()))]
pub(super) async fn reconcile(
    migration: Arc<StorageVersionMigration>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    let name = migration.metadata.name.clone().ok_or(Error::Unnamed)?;
    // A term that ran out stops work before the lease task has noticed.
    let stopping = context.stopping.is_cancelled() || !context.requests.fence().holds();
    if stopping {
        return Ok(Action::await_change());
    }
    if let Some(token) = migration.retry_requested() {
        return Ok(super::retry::retry(&context, &migration, token).await?);
    }
    let uid = migration.uid().unwrap_or_default();
    if Phase::of(&migration).is_terminal() {
        context.deferred().remove(&uid);
        return Ok(Action::await_change());
    }
    let resource = migration.group_resource();
    let mut deferred = context.deferred().get(&uid).cloned();
    if let Some(left_at) =
        deferred.as_ref().and_then(|r| r.given_up_at.as_ref().or(r.ended_at.as_ref()))
    {
        if Some(left_at) == migration.metadata.resource_version.as_ref() {
            return Ok(Action::await_change());
        }
        // Changed since: someone may have fixed what stopped it, or asked for it again.
        context.deferred().remove(&uid);
        deferred = None;
    }
    if let Some(wait) = deferred.as_ref().map(|r| r.next.saturating_duration_since(Instant::now()))
        && !wait.is_zero()
    {
        debug!(?wait, "did not finish before; trying again later");
        return Ok(Action::requeue(wait));
    }
    let (failures, unrecorded) = deferred.as_ref().map_or((0, 0), |r| (r.failures, r.unrecorded));
    {
        let mut running = context.running();
        let lane = {
            let waiting = context.deferred();
            let parked = |other: &StorageVersionMigration| {
                let uid = other.metadata.uid.as_deref().unwrap_or_default();
                waiting.get(uid).is_some_and(|r| r.given_up_at.is_some())
            };
            let state = context.store.state();
            match admit(&migration, state.iter().map(|m| m.as_ref()), &running, parked) {
                Admission::Running => return Ok(Action::await_change()),
                Admission::WaitForResource => {
                    debug!("waiting for an earlier migration of the same resource");
                    return Ok(Action::requeue(WAIT_FOR_TURN));
                }
                Admission::Prepare(lane) => lane,
            }
        };
        let Ok(preparing) = context.preparing[lane as usize].clone().try_acquire_owned() else {
            debug!("waiting for room to prepare");
            return Ok(Action::requeue(WAIT_FOR_TURN));
        };
        running.insert(name.clone(), resource);
        let swept = swept(&migration);
        let task_context = context.clone();
        context.tasks.spawn(async move {
            let requeue = migration::run(&task_context, migration, failures, preparing).await;
            let context = task_context;
            let resource_version = || {
                let now = context.store.get(&ObjectRef::new(&name));
                now.and_then(|m| m.metadata.resource_version.clone()).unwrap_or_default()
            };
            match defer(requeue, failures, unrecorded, Instant::now(), resource_version) {
                Some(deferred) => {
                    if deferred.given_up_at.is_some() {
                        error!(
                            unrecorded = deferred.unrecorded,
                            "the migration's status cannot be written; leaving it alone until it changes"
                        );
                    }
                    context.deferred().insert(uid, deferred);
                }
                None => {
                    context.deferred().insert(uid, Deferred::ended(resource_version()));
                }
            }
            context.running().remove(&name);
            // The discovery trigger looks again soon: its StorageState may have converged.
            if swept {
                context.discovery_poke.notify_one();
            }
            // Look again: a migration that did not finish (a status write that kept failing, a
            // discovery that failed) is taken up again; a finished one is left alone.
            let _ = context.requeue.unbounded_send(());
        });
    }
    Ok(Action::await_change())
}

/// When a migration whose task ended with `requeue` is taken up again, after `failures`
/// discovery failures and `unrecorded` unwritable statuses so far; `None` when not before it
/// changes. `resource_version` is the migration's now, read only when kube-svm gives up on an
/// unwritable status. Pure.
fn defer(
    requeue: Requeue,
    failures: u32,
    unrecorded: u32,
    now: Instant,
    resource_version: impl FnOnce() -> String,
) -> Option<Deferred> {
    match requeue {
        Requeue::Never => None,
        Requeue::AfterDiscoveryFailure => {
            let failures = failures + 1;
            let next = now + defer_delay(failures);
            Some(Deferred { failures, unrecorded, next, given_up_at: None, ended_at: None })
        }
        Requeue::AfterUnrecorded => {
            let unrecorded = unrecorded + 1;
            let next = now + UNRECORDED_WAIT;
            let given_up_at = (unrecorded >= UNRECORDED_ATTEMPTS).then(resource_version);
            Some(Deferred { failures, unrecorded, next, given_up_at, ended_at: None })
        }
        Requeue::AfterInTree => Some(Deferred {
            failures,
            unrecorded,
            next: now + IN_TREE_WAIT,
            given_up_at: None,
            ended_at: None,
        }),
    }
}

pub(super) fn error_policy(
    _migration: Arc<StorageVersionMigration>,
    _error: &Error,
    _context: Arc<Context>,
) -> Action {
    Action::requeue(WAIT_FOR_TURN)
}

/// What admission says of a migration that has not ended.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    /// It runs in this process already.
    Running,
    /// Another migration of the same resource runs, or an older one has not ended: it goes
    /// first (at most one migration of a resource at a time, the oldest first).
    WaitForResource,
    /// It may gather its evidence, then write in this lane.
    Prepare(Lane),
}

/// Admission of `migration`, given the migrations the controller knows (`all`), those running
/// in this process by name, and the ones left alone until they change (`parked`, skipped:
/// they hold no one back). Pure.
fn admit<'a>(
    migration: &StorageVersionMigration,
    all: impl Iterator<Item = &'a StorageVersionMigration> + Clone,
    running: &HashMap<String, GroupResource>,
    parked: impl Fn(&StorageVersionMigration) -> bool,
) -> Admission {
    if running.contains_key(&migration.name_any()) {
        return Admission::Running;
    }
    let resource = migration.group_resource();
    let key = order_key(migration);
    let older_waiting = all.clone().any(|other| {
        other.is_of(&resource.group, &resource.resource)
            && other.is_unfinished_and_not_deleted()
            && !parked(other)
            && order_key(other) < key
    });
    if running.values().any(|other| *other == resource) || older_waiting {
        return Admission::WaitForResource;
    }
    Admission::Prepare(lane(migration, all))
}

/// Creation time, then name: a total order, oldest first.
fn order_key(migration: &StorageVersionMigration) -> (Option<i64>, String) {
    let created = migration.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second());
    (created, migration.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_task_is_forgotten_and_the_others_come_back_later() {
        let now = Instant::now();
        let version = || "42".to_owned();
        assert!(defer(Requeue::Never, 3, 1, now, version).is_none());
        let discovery = defer(Requeue::AfterDiscoveryFailure, 2, 0, now, version).expect("later");
        assert_eq!((discovery.failures, discovery.next), (3, now + defer_delay(3)));
        let in_tree = defer(Requeue::AfterInTree, 2, 1, now, version).expect("later");
        assert_eq!(
            (in_tree.failures, in_tree.unrecorded, in_tree.next),
            (2, 1, now + IN_TREE_WAIT)
        );
    }

    #[test]
    fn an_unwritable_status_is_tried_a_few_times_then_left_until_the_migration_changes() {
        let now = Instant::now();
        let version = || "42".to_owned();
        let first = defer(Requeue::AfterUnrecorded, 0, 0, now, version).expect("later");
        assert_eq!((first.unrecorded, first.given_up_at.as_deref()), (1, None));
        let last = defer(Requeue::AfterUnrecorded, 0, UNRECORDED_ATTEMPTS - 1, now, version);
        let last = last.expect("parked");
        assert_eq!(last.given_up_at.as_deref(), Some("42"), "left alone at this version");
    }

    fn migration(name: &str, resource: &str, created: i64) -> StorageVersionMigration {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let spec = crate::api::StorageVersionMigrationSpec {
            resource: crate::api::GroupVersionResource {
                group: "example.com".into(),
                version: "v1".into(),
                resource: resource.into(),
            },
            continue_token: None,
        };
        let mut migration = StorageVersionMigration::new(name, spec);
        let at = k8s_openapi::jiff::Timestamp::from_second(created).unwrap();
        migration.metadata.creation_timestamp = Some(Time(at));
        migration.metadata.uid = Some(format!("uid-{name}"));
        migration
    }

    #[test]
    fn one_migration_of_a_resource_at_a_time_the_oldest_first() {
        let (older, newer) = (migration("a", "widgets", 10), migration("b", "widgets", 20));
        let other = migration("c", "gadgets", 5);
        let all = [&older, &newer, &other];
        let none = HashMap::new();
        let admit = |m, running: &HashMap<String, GroupResource>, parked: &[&str]| {
            let parked = |o: &StorageVersionMigration| parked.contains(&o.name_any().as_str());
            admit(m, all.iter().copied(), running, parked)
        };
        assert_eq!(admit(&older, &none, &[]), Admission::Prepare(Lane::Main));
        assert_eq!(admit(&newer, &none, &[]), Admission::WaitForResource, "the older goes first");
        assert_eq!(admit(&other, &none, &[]), Admission::Prepare(Lane::Main), "another resource");
        // Same creation second: the name orders them.
        let twin = migration("a2", "widgets", 10);
        let with_twin = [&older, &twin];
        let admitted = super::admit(&twin, with_twin.iter().copied(), &none, |_| false);
        assert_eq!(admitted, Admission::WaitForResource);
        // One left alone until it changes holds no one back; nor does one being deleted.
        assert_eq!(admit(&newer, &none, &["a"]), Admission::Prepare(Lane::Main));
        let mut deleting = older.clone();
        deleting.metadata.deletion_timestamp = older.metadata.creation_timestamp.clone();
        let after_delete = [&deleting, &newer];
        let admitted = super::admit(&newer, after_delete.iter().copied(), &none, |_| false);
        assert_eq!(admitted, Admission::Prepare(Lane::Main));
        let mut ended = older.clone();
        ended.status = crate::api::in_state(crate::api::conditions::SUCCEEDED).status;
        let after_end = [&ended, &newer];
        let admitted = super::admit(&newer, after_end.iter().copied(), &none, |_| false);
        assert_eq!(admitted, Admission::Prepare(Lane::Main), "one that ended holds no one back");
        // Running here: not started twice; and its resource waits for it, whatever the age.
        let running = HashMap::from([("b".to_owned(), newer.group_resource())]);
        assert_eq!(admit(&newer, &running, &[]), Admission::Running);
        assert_eq!(admit(&older, &running, &[]), Admission::WaitForResource);
        assert_eq!(admit(&other, &running, &[]), Admission::Prepare(Lane::Main));
    }

    #[test]
    fn discovery_retries_back_off_to_a_minute_and_end_within_minutes() {
        let delays: Vec<u64> = (1..DISCOVERY_ATTEMPTS).map(|n| defer_delay(n).as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 60]);
        assert_eq!(defer_delay(u32::MAX), Duration::from_secs(60));
    }
}
