//! The CRD trigger: when a CustomResourceDefinition's `status.storedVersions` holds anything but
//! its storage version, create a migration for it, unless one is pending or running for that
//! resource (the discovery trigger's holds back only the catch-up, below) or the CRD opts out. Watch-driven: a storage version switch is seen within seconds.
//!
//! One migration stands for each state of a CRD that needs one: its uid and storage version
//! (and, for a cleaning, the versions it does not serve), not its generation ([`rounds`]). It is
//! named `<plural>.<group>-<storage version>-<generation>` after the generation it was created
//! at (shortened, with a hash of the full name, when that is longer than a name may be). The
//! newest few finished ones of each CRD are kept ([`history`]). When the trigger's own
//! migration fails, the trigger asks for it to be run again in place (the annotation `kube-svm.io/retry`, as `kube-svm retry` does), after a wait that
//! doubles with each retry ([`retry_wait`]), a bounded number of times ([`MAX_RETRIES`]). The
//! wait is counted from the failure's recorded time and the retries recorded in status, so a
//! restarted controller keeps the same schedule.
//!
//! A migration for a CRD as this process first saw it (switched before the controller started:
//! the catch-up after an install or an upgrade) is marked `kube-svm.io/backlog`, so that a switch
//! made since, and a migration created by hand, take their turn to write before it.
//!
//! Each look at a CRD reads what the decision needs (the CRD, what this process remembers of it,
//! and the migrations when the CRD needs one), [`plan()`] decides what to do without a request,
//! and `apply` sends the requests it names.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

mod names;
mod plan;
mod pokes;
mod rounds;

pub use super::TRIGGER_LABEL;
use super::history;
use super::is_conflict;
use crate::api::{GroupVersionResource, Phase, StorageVersionMigration, Trigger};
use crate::apiserver::requests::{RequestError, Requests};
use crate::evidence::encoding::{Check, EncodingPolicy, Expected, Observer};
use crate::rules::crd::CrdState;
pub use names::{CRD_UID_ANNOTATION, cleaning_name, created_for, migration_name, recreated_name};
use plan::{Observed, Plan, Step, plan};

/// Annotation on a CRD: `"false"` keeps kube-svm from migrating it on its own.
pub const OPT_OUT_ANNOTATION: &str = "kube-svm.io/auto-migrate";

/// Annotation on a CRD: the versions (comma-separated) the operator is removing. With
/// `--clean-managed-fields`, their `managedFields` entries are cleaned as soon as they are no
/// longer served, without the grace (`--clean-managed-fields-after`) that keeps an unserved
/// version's field ownership while serving it again is still an option.
pub const REMOVE_VERSIONS_ANNOTATION: &str = "kube-svm.io/remove-versions";

/// Longest wait between two retries of a migration the trigger created: an hour, as a cause
/// such as a webhook or an apiserver being upgraded is usually gone within one, and a longer
/// wait would leave `storedVersions` stale for long after.
pub const RETRY_CAP: Duration = Duration::from_secs(3600);

/// Retries the trigger asks for before it leaves a failing migration to the operator: with the
/// default first wait of a minute, the last comes about six hours after the first failure. A
/// cause that lasts longer needs a person, and each retry may rewrite the whole resource again.
pub const MAX_RETRIES: u32 = 10;

/// What the trigger does about the migration it created for a CRD's current state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Nothing: it did not fail, or it is not the trigger's own.
    No,
    /// A retry was asked for, and the controller has not acted on it yet.
    Pending,
    /// Ask for a retry now.
    Now,
    /// Ask for a retry after this long.
    After(Duration),
    /// It was retried [`MAX_RETRIES`] times: left to the operator.
    GaveUp,
}

/// The wait, after the trigger's migration failed with `retries` retries run so far, before the
/// next retry: `first`, doubling with each retry, at most [`RETRY_CAP`] (or `first`, when
/// longer).
pub fn retry_wait(retries: u32, first: Duration) -> Duration {
    crate::rules::backoff::doubling(retries.saturating_add(1), first, RETRY_CAP.max(first))
}

/// Whether, and when, to retry `migration` at `now`, from what its status records (when it
/// failed, how often it was retried), never from a timer: a restart keeps the schedule. Pure.
pub fn retry_of(migration: &StorageVersionMigration, now: Timestamp, first: Duration) -> Retry {
    if migration.made_by() != Some(Trigger::Crd) || Phase::of(migration) != Phase::Failed {
        return Retry::No;
    }
    if migration.retry_requested().is_some() {
        return Retry::Pending;
    }
    let retries = migration.retries();
    if retries >= MAX_RETRIES {
        return Retry::GaveUp;
    }
    let failed_at = migration.ended_at().unwrap_or(now);
    // A failure recorded in the future (clocks apart) counts as just now.
    let elapsed = Duration::try_from(now.duration_since(failed_at)).unwrap_or_default();
    match retry_wait(retries, first).checked_sub(elapsed) {
        Some(left) if !left.is_zero() => Retry::After(left),
        _ => Retry::Now,
    }
}

/// Why the CRD trigger could not act on a CRD this time; the CRD is looked at again in five
/// seconds.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Listing the migrations, to see whether one is pending or running already, failed.
    #[error("failed to list StorageVersionMigrations")]
    List(#[source] RequestError),
    /// Creating the named migration failed (one that exists already is not an error).
    #[error("failed to create StorageVersionMigration {0}")]
    Create(String, #[source] RequestError),
    /// Asking for a retry of the named migration failed.
    #[error("failed to ask for a retry of StorageVersionMigration {0}")]
    Retry(String, #[source] RequestError),
}

/// The versions `crd` defines and does not serve.
fn unserved(crd: &CustomResourceDefinition) -> Vec<&str> {
    crd.spec.versions.iter().filter(|v| !v.served).map(|v| v.name.as_str()).collect()
}

/// The versions the annotation [`REMOVE_VERSIONS_ANNOTATION`] of `crd` names.
fn to_remove(crd: &CustomResourceDefinition) -> Vec<&str> {
    let named = crd.annotations().get(REMOVE_VERSIONS_ANNOTATION);
    named
        .map(|v| v.split(',').map(str::trim).filter(|v| !v.is_empty()).collect())
        .unwrap_or_default()
}

/// How long before the unserved versions of `crd` may be cleaned: `None` when it may be now
/// (every one is named for removal, or unserved for `grace` already), `Some(left)` otherwise.
/// `unserved_for` says how long a version has been seen unserved. Pure.
pub fn cleaning_wait(
    crd: &CustomResourceDefinition,
    grace: Duration,
    unserved_for: impl Fn(&str) -> Duration,
) -> Option<Duration> {
    let named = to_remove(crd);
    unserved(crd)
        .into_iter()
        .filter(|version| !named.contains(version))
        .filter_map(|version| grace.checked_sub(unserved_for(version)).filter(|l| !l.is_zero()))
        .max()
}

/// Since when each CRD's (by uid) versions have been seen unserved, by this process: a version
/// served again is forgotten, and a restart starts every grace over (it keeps ownership
/// longer, never shorter).
#[derive(Default)]
struct UnservedSince(std::sync::Mutex<BTreeMap<(String, String), std::time::Instant>>);

impl UnservedSince {
    /// How long before `crd` may be cleaned ([`cleaning_wait`]), recording what it shows now;
    /// and whether it shows a version unserved that was not seen so before.
    fn wait(&self, crd: &CustomResourceDefinition, grace: Duration) -> (Option<Duration>, bool) {
        let uid = crd.metadata.uid.clone().unwrap_or_default();
        let unserved = unserved(crd);
        let now = std::time::Instant::now();
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|(of, version), _| *of != uid || unserved.contains(&version.as_str()));
        let mut new = false;
        for version in &unserved {
            seen.entry((uid.clone(), (*version).to_owned())).or_insert_with(|| {
                new = true;
                now
            });
        }
        let wait = cleaning_wait(crd, grace, |version| {
            let since = seen.get(&(uid.clone(), version.to_owned())).copied().unwrap_or(now);
            now.duration_since(since)
        });
        (wait, new)
    }
}

/// A migration a CRD needs.
#[derive(Debug, PartialEq, Eq)]
pub struct Needed {
    /// The migration's name, after the CRD's state.
    pub name: String,
    /// What it migrates.
    pub target: GroupVersionResource,
    /// Whether it removes `managedFields` entries naming versions no longer served.
    pub clean_managed_fields: bool,
}

/// The migration a CRD needs, if any: when its `storedVersions` is stale, or, with
/// `clean_unserved`, when it defines a version it does not serve (whose `managedFields` entries
/// would break server-side apply once the version is removed).
pub fn needed_migration(crd: &CustomResourceDefinition, clean_unserved: bool) -> Option<Needed> {
    if crd.annotations().get(OPT_OUT_ANNOTATION).is_some_and(|v| v == "false") {
        return None;
    }
    let storage = &crd.spec.versions.iter().find(|v| v.storage)?.name;
    let clean_managed_fields = clean_unserved && crd.spec.versions.iter().any(|v| !v.served);
    if !CrdState::of(crd)?.is_stale() && !clean_managed_fields {
        return None;
    }
    let plural = &crd.spec.names.plural;
    let group = &crd.spec.group;
    let generation = crd.metadata.generation.unwrap_or_default();
    // A cleaning migration of a state already migrated (its grace ended) is another migration.
    let name = match clean_managed_fields {
        true => cleaning_name(plural, group, storage, generation),
        false => migration_name(plural, group, storage, generation),
    };
    let target = GroupVersionResource {
        group: group.clone(),
        version: storage.clone(),
        resource: plural.clone(),
    };
    Some(Needed { name, target, clean_managed_fields })
}

/// What the CRD watch does besides creating migrations.
#[derive(Clone)]
pub struct Settings {
    /// Create migrations (`--crd-trigger`); when false the watch only starts encoding checks.
    pub create: bool,
    /// Where encoding checks start as soon as a storage switch is seen.
    pub observer: Observer,
    /// How long those checks take.
    pub encoding: EncodingPolicy,
    /// Told of CRD changes (the discovery trigger polls then), with the discovery interval: a
    /// CRD that keeps changing is told of ever less often, in the end once per interval.
    pub poke: Option<(Arc<tokio::sync::Notify>, Duration)>,
    /// Also migrate a CRD that stopped serving a version, removing the `managedFields` entries
    /// that name it (`--clean-managed-fields`).
    pub clean_managed_fields: bool,
    /// How long a version must be seen unserved before it is cleaned, unless the CRD names it
    /// for removal (`--clean-managed-fields-after`).
    pub clean_after: Duration,
    /// Wait after the trigger's migration failed before its first retry
    /// (`--crd-trigger-retry-delay`); it doubles with each retry.
    pub retry_delay: Duration,
}

/// The encoding check a CRD with stale `storedVersions` needs before it can be pruned.
fn encoding_check(crd: &CustomResourceDefinition, settings: &Settings) -> Option<Check> {
    let storage = &crd.spec.versions.iter().find(|v| v.storage)?.name;
    if !CrdState::of(crd)?.is_stale() {
        return None;
    }
    Some(Check::new(
        &crd.spec.group,
        &crd.spec.names.plural,
        &crd.spec.names.kind,
        Expected::StorageVersion(storage.clone()),
        crd.metadata.generation.unwrap_or_default(),
        settings.encoding,
    ))
}

struct Context {
    requests: Requests,
    settings: Settings,
    /// What the discovery trigger was told of each CRD.
    told: std::sync::Mutex<pokes::Pokes>,
    /// Since when versions have been seen unserved.
    unserved_since: UnservedSince,
    /// The generation each CRD (by uid) had when this process first saw it: a migration for
    /// that generation is the catch-up ([`crate::api::BACKLOG_ANNOTATION`]).
    first_seen: std::sync::Mutex<std::collections::HashMap<String, i64>>,
}

/// Runs until `stop` fires; creates nothing once the leader's term of `requests` ends.
pub async fn run(requests: Requests, settings: Settings, stop: CancellationToken) {
    let crds: Api<CustomResourceDefinition> = Api::all(requests.watches().clone());
    let migrations: Api<StorageVersionMigration> = Api::all(requests.watches().clone());
    let controller = Controller::new(crds, watcher::Config::default());
    // A finished migration may leave its CRD needing another: look at the CRD again. Built-in
    // resources have no CRD to look at.
    let store = controller.store();
    let crd_of = move |migration: StorageVersionMigration| {
        let target = &migration.spec.resource;
        let crd = ObjectRef::new(&format!("{}.{}", target.resource, target.group));
        store.get(&crd).map(|_| crd)
    };
    controller
        .watches(migrations, watcher::Config::default(), crd_of)
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(
            reconcile,
            error_policy,
            Arc::new(Context {
                requests,
                settings,
                told: Default::default(),
                unserved_since: UnservedSince::default(),
                first_seen: Default::default(),
            }),
        )
        .for_each(|result| async move {
            match result {
                Ok(_) => {}
                Err(error)
                    if crate::apiserver::reachability::unreachable(&error, "CRD trigger") => {}
                Err(error)
                    if crate::apiserver::reachability::expired_watch(&error, "CRD trigger") => {}
                Err(error) => warn!(error = %crate::error_chain(&error), "CRD trigger failed"),
            }
        })
        .await;
}

async fn reconcile(
    crd: Arc<CustomResourceDefinition>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    let caught_up = {
        let uid = crd.metadata.uid.clone().unwrap_or_default();
        let generation = crd.metadata.generation.unwrap_or_default();
        let mut first_seen = context.first_seen.lock().unwrap_or_else(|p| p.into_inner());
        *first_seen.entry(uid).or_insert(generation) == generation
    };
    // The discovery trigger polls when a CRD is new or its spec changed (a storage switch, a
    // version served or not): not for every status write or migration checkpoint, and ever
    // less often for a CRD that keeps changing ([`pokes`]).
    if let Some((poke, every)) = &context.settings.poke {
        let uid = crd.metadata.uid.as_deref().unwrap_or_default();
        let generation = crd.metadata.generation.unwrap_or_default();
        let mut told = context.told.lock().unwrap_or_else(|p| p.into_inner());
        match told.poke(uid, generation, std::time::Instant::now(), *every) {
            Some(wait) if wait.is_zero() => poke.notify_one(),
            // At most one waits per CRD: a change made meanwhile is read by its poll.
            Some(wait) => {
                let poke = poke.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    poke.notify_one();
                });
            }
            None => {}
        }
    }
    // Whoever creates the migration, the encoding check starts now, at the storage switch.
    if let Some(check) = encoding_check(&crd, &context.settings) {
        context.settings.observer.observe(&context.requests, &check);
    }
    let settings = &context.settings;
    // Unserving is the step that can be undone: the field ownership recorded at an unserved
    // version is removed only once it is named for removal, or after the grace.
    let (clean_wait, newly_unserved) = match settings.clean_managed_fields {
        true => context.unserved_since.wait(&crd, settings.clean_after),
        false => (None, false),
    };
    let needed = needed_migration(&crd, settings.clean_managed_fields && clean_wait.is_none());
    if let Some(left) = clean_wait.filter(|_| newly_unserved) {
        info!(
            crd = crd.name_any(),
            unserved = ?unserved(&crd),
            left_seconds = left.as_secs(),
            "versions no longer served: their managedFields entries are cleaned once the grace ends or the CRD names them in {REMOVE_VERSIONS_ANNOTATION}"
        );
    }
    let requests = &context.requests;
    // Listed only when the CRD needs a migration the trigger would create.
    let migrations = match needed.is_some() && settings.create {
        true => {
            let api: Api<StorageVersionMigration> = Api::all(requests.client().clone());
            requests.send(api.list(&Default::default())).await.map_err(Error::List)?.items
        }
        false => Vec::new(),
    };
    let observed = Observed { crd: &crd, needed, caught_up, clean_wait, migrations: &migrations };
    apply(requests, &crd, plan(&observed, settings, Timestamp::now())).await
}

/// Carries out `plan` for `crd`: its steps in order, stopping at the first that fails; then
/// looks again when it says.
async fn apply(
    requests: &Requests,
    crd: &CustomResourceDefinition,
    plan: Plan<'_>,
) -> Result<Action, Error> {
    let api: Api<StorageVersionMigration> = Api::all(requests.client().clone());
    let Plan { steps, look_again } = plan;
    for step in steps {
        match step {
            Step::Forget(old) => {
                history::delete(requests, &api, &old, Trigger::Crd, history::KEPT_PER_RESOURCE)
                    .await;
            }
            Step::RetryLater { migration, wait } => {
                debug!(migration, ?wait, "the migration failed; retrying it later");
            }
            Step::GiveUp { migration } => info!(
                migration,
                retries = MAX_RETRIES,
                "the migration failed after every retry; left for an operator (kube-svm retry)"
            ),
            Step::Retry(own) => retry(requests, &api, own).await?,
            Step::Create { migration, clean_managed_fields, backlog } => {
                let name = migration.name_any();
                match requests.send(api.create(&PostParams::default(), &migration)).await {
                    Ok(_) => info!(
                        crd = crd.name_any(),
                        migration = name,
                        clean_managed_fields,
                        backlog,
                        "created a migration for the CRD"
                    ),
                    Err(error) if is_conflict(&error) => {
                        debug!(migration = name, "a migration for this CRD state exists already");
                    }
                    Err(error) => return Err(Error::Create(name, error)),
                }
            }
        }
    }
    Ok(look_again.map_or_else(Action::await_change, Action::requeue))
}

/// Asks for a retry, in place, of the migration the trigger created for a CRD's current state.
async fn retry(
    requests: &Requests,
    api: &Api<StorageVersionMigration>,
    own: &StorageVersionMigration,
) -> Result<(), Error> {
    let name = own.name_any();
    let token = crate::api::retry_token();
    let (params, patch) = (PatchParams::default(), Patch::Merge(own.retry_patch(&token)));
    match requests.send(api.patch(&name, &params, &patch)).await {
        Ok(_) => {
            let retry = own.retries() + 1;
            info!(migration = name, retry, token, "asked for a retry of the failed migration");
            Ok(())
        }
        // Changed since it was listed: the watch brings it back, and it is judged again.
        Err(error) if is_conflict(&error) => Ok(()),
        Err(error) => Err(Error::Retry(name, error)),
    }
}

fn error_policy(
    _crd: Arc<CustomResourceDefinition>,
    _error: &Error,
    _context: Arc<Context>,
) -> Action {
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::names::MAX_NAME;
    use super::*;

    /// The trigger's settings in tests: no pokes, no cleaning, a first retry after a minute.
    pub(super) fn settings(create: bool) -> Settings {
        Settings {
            create,
            observer: Observer::default(),
            encoding: EncodingPolicy {
                settle: Duration::from_secs(3600),
                wait: Duration::from_secs(3600),
            },
            poke: None,
            clean_managed_fields: false,
            clean_after: Duration::from_secs(86_400),
            retry_delay: Duration::from_secs(60),
        }
    }

    pub(super) fn crd(
        storage: &str,
        stored: &[&str],
        annotation: Option<&str>,
    ) -> CustomResourceDefinition {
        let mut crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "widgets.example.com", "generation": 4 },
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": { "plural": "widgets", "kind": "Widget" },
                "versions": [
                    { "name": "v1", "served": true, "storage": storage == "v1" },
                    { "name": "v2", "served": true, "storage": storage == "v2" },
                ],
            },
            "status": { "storedVersions": stored, "acceptedNames": { "plural": "widgets", "kind": "Widget" } },
        }))
        .unwrap();
        if let Some(value) = annotation {
            crd.annotations_mut().insert(OPT_OUT_ANNOTATION.into(), value.into());
        }
        crd
    }

    #[test]
    fn stale_stored_versions_need_a_migration_named_after_the_crd_state() {
        let Needed { name, target, clean_managed_fields } =
            needed_migration(&crd("v2", &["v1", "v2"], None), true).unwrap();
        assert!(!clean_managed_fields, "every version is served");
        assert_eq!(name, "widgets.example.com-v2-4");
        assert_eq!(
            (target.group.as_str(), target.version.as_str(), target.resource.as_str()),
            ("example.com", "v2", "widgets")
        );
    }

    #[test]
    fn an_unserved_version_is_cleaned_after_the_grace_or_once_named_for_removal() {
        let grace = Duration::from_secs(3600);
        let mut unserved = crd("v2", &["v2"], None);
        unserved.spec.versions[0].served = false;
        let after = |seconds| move |_: &str| Duration::from_secs(seconds);
        assert_eq!(cleaning_wait(&unserved, grace, after(600)), Some(Duration::from_secs(3000)));
        assert_eq!(cleaning_wait(&unserved, grace, after(3600)), None);
        // Every version served: nothing to wait for.
        assert_eq!(cleaning_wait(&crd("v2", &["v2"], None), grace, after(0)), None);
        // Named for removal: at once.
        unserved.annotations_mut().insert(REMOVE_VERSIONS_ANNOTATION.into(), "v0, v1".into());
        assert_eq!(cleaning_wait(&unserved, grace, after(0)), None);
        let Needed { name, clean_managed_fields, .. } =
            needed_migration(&unserved, true).expect("a cleaning migration");
        assert!(clean_managed_fields);
        assert_eq!(name, "widgets.example.com-v2-4-clean", "not the name of the state's migration");
    }

    #[test]
    fn current_stored_versions_need_nothing() {
        assert_eq!(needed_migration(&crd("v2", &["v2"], None), true), None);
    }

    #[test]
    fn a_migration_of_a_crd_deleted_since_is_not_the_new_ones() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |s: &str| Some(Time(s.parse().expect("a time")));
        let mut crd: CustomResourceDefinition = Default::default();
        crd.metadata.uid = Some("2f1c9a7e-0000-4000-8000-000000000001".into());
        crd.metadata.creation_timestamp = at("2026-01-01T00:10:00Z");
        let mut migration =
            StorageVersionMigration::new("widgets.example.com-v2-2", Default::default());
        migration.metadata.creation_timestamp = at("2026-01-01T00:05:00Z");
        assert!(!created_for(&migration, &crd), "created before the CRD: another CRD's");
        migration.metadata.creation_timestamp = at("2026-01-01T00:10:30Z");
        assert!(created_for(&migration, &crd));
        let other = [(CRD_UID_ANNOTATION.to_owned(), "another-uid".to_owned())].into();
        migration.metadata.annotations = Some(other);
        assert!(!created_for(&migration, &crd), "the uid it records decides");
        let name = recreated_name("widgets", "example.com", "v2", 2, "2f1c9a7e-0");
        assert_eq!(name, "widgets.example.com-v2-2-2f1c9a7e");
    }

    #[test]
    fn names_too_long_for_an_object_are_shortened_but_stay_distinct_and_valid() {
        let group = format!("{}.example.com", "g".repeat(230));
        let name = migration_name("widgets", &group, "v2", 12);
        assert_eq!(name.len(), MAX_NAME, "{name}");
        assert!(name.ends_with("-v2-12") && name.starts_with("widgets.ggg"), "{name}");
        let other =
            migration_name("widgets", &format!("{}.example.org", "g".repeat(230)), "v2", 12);
        assert_ne!(name, other, "the hash tells them apart");
        assert_eq!(
            migration_name("widgets", &group, "v2", 12),
            name,
            "the same CRD state, the same name"
        );
        let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
        assert!(name.chars().all(valid), "{name}");
        // Short names are left as they are.
        assert_eq!(migration_name("widgets", "example.com", "v2", 4), "widgets.example.com-v2-4");
    }

    #[test]
    fn retries_wait_a_doubling_time_up_to_an_hour() {
        let minute = Duration::from_secs(60);
        let waits: Vec<u64> =
            (0..MAX_RETRIES).map(|retries| retry_wait(retries, minute).as_secs() / 60).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]);
        assert_eq!(retry_wait(u32::MAX, minute), RETRY_CAP);
        let day = Duration::from_secs(86_400);
        assert_eq!(retry_wait(3, day), day, "a first wait longer than the cap is kept");
    }

    /// A migration the trigger created, Failed at second 1,000 after `retries` retries.
    pub(super) fn failed(retries: u32, label: Option<&str>) -> StorageVersionMigration {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let mut migration = crate::api::in_state(crate::api::conditions::FAILED);
        migration.metadata.labels =
            label.map(|l| [(TRIGGER_LABEL.to_owned(), l.to_owned())].into());
        if let Some(status) = migration.status.as_mut() {
            status.completion_time = Some(Time(Timestamp::from_second(1_000).unwrap()));
            status.retries = Some(retries).filter(|n| *n > 0);
            status.retry_token = Some("t0").filter(|_| retries > 0).map(str::to_owned);
        }
        migration
    }

    #[test]
    fn the_triggers_own_failed_migration_is_retried_when_its_wait_is_over() {
        let at = |second: i64| Timestamp::from_second(second).unwrap();
        let first = Duration::from_secs(10);
        let once = failed(0, Some("crd"));
        assert_eq!(retry_of(&once, at(1_004), first), Retry::After(Duration::from_secs(6)));
        assert_eq!(retry_of(&once, at(1_010), first), Retry::Now);
        // The wait doubles with the retries recorded in status, whoever asked for them.
        let thrice = failed(3, Some("crd"));
        assert_eq!(retry_of(&thrice, at(1_010), first), Retry::After(Duration::from_secs(70)));
        assert_eq!(retry_of(&thrice, at(1_080), first), Retry::Now);
        // Clocks apart: a failure in the future waits the whole wait.
        assert_eq!(retry_of(&once, at(900), first), Retry::After(first));
        assert_eq!(retry_of(&failed(MAX_RETRIES, Some("crd")), at(9_999), first), Retry::GaveUp);
        // Asked for and not acted on yet: not asked again.
        let mut pending = failed(1, Some("crd"));
        pending.metadata.annotations =
            Some([(crate::api::RETRY_ANNOTATION.to_owned(), "t1".to_owned())].into());
        assert_eq!(retry_of(&pending, at(9_999), first), Retry::Pending);
        // Not the trigger's, or not failed: left alone.
        assert_eq!(retry_of(&failed(0, None), at(9_999), first), Retry::No);
        assert_eq!(retry_of(&failed(0, Some("discovery")), at(9_999), first), Retry::No);
        let mut running = failed(0, Some("crd"));
        running.status.as_mut().unwrap().conditions[0].type_ = "Running".into();
        assert_eq!(retry_of(&running, at(9_999), first), Retry::No);
    }

    #[test]
    fn the_opt_out_annotation_is_respected() {
        assert_eq!(needed_migration(&crd("v2", &["v1", "v2"], Some("false")), true), None);
        assert!(needed_migration(&crd("v2", &["v1", "v2"], Some("true")), true).is_some());
    }

    /// The trigger's reconcile against a fake apiserver that lists `migrations` and accepts
    /// every write.
    mod reconciled {
        use serde_json::{Value, json};

        use super::*;
        use crate::api::BACKLOG_ANNOTATION;
        use crate::apiserver::fake::{self, Recorded};

        const MIGRATIONS: &str = "/apis/migration.k8s.io/v1alpha1/storageversionmigrations";

        fn trigger(
            migrations: Vec<StorageVersionMigration>,
            create: bool,
        ) -> (Arc<Context>, Recorded) {
            let items: Vec<Value> =
                migrations.iter().map(|m| serde_json::to_value(m).unwrap()).collect();
            let (client, requests) = fake::client(move |sent| {
                match (sent.method.as_str(), sent.path.as_str()) {
                    ("GET", MIGRATIONS) => fake::list(
                        "migration.k8s.io/v1alpha1",
                        "StorageVersionMigration",
                        items.clone(),
                    ),
                    ("POST", MIGRATIONS) => (201, sent.body.clone()),
                    ("PATCH", path) if path.starts_with(MIGRATIONS) => {
                        let name = path.rsplit('/').next().unwrap_or_default();
                        (
                            200,
                            json!({ "metadata": { "name": name }, "spec": {
                            "resource": { "group": "example.com", "version": "v2", "resource": "widgets" } } }),
                        )
                    }
                    _ => fake::not_found(sent),
                }
            });
            let context = Context {
                requests: fake::requests(client),
                settings: settings(create),
                told: Default::default(),
                unserved_since: UnservedSince::default(),
                first_seen: Default::default(),
            };
            (Arc::new(context), requests)
        }

        /// The CRD `u1` at `generation`, stored as `stored`.
        fn at(generation: i64, storage: &str, stored: &[&str]) -> Arc<CustomResourceDefinition> {
            let mut crd = crd(storage, stored, None);
            crd.metadata.uid = Some("u1".into());
            crd.metadata.generation = Some(generation);
            Arc::new(crd)
        }

        /// The migrations created so far.
        fn created_by(requests: &Recorded) -> Vec<StorageVersionMigration> {
            let writes = requests.writes().into_iter();
            let posts = writes.filter(|w| w.method == "POST" && w.path == MIGRATIONS);
            posts.map(|w| serde_json::from_value(w.body).unwrap()).collect()
        }

        fn backlog(migration: &StorageVersionMigration) -> Option<&str> {
            migration.annotations().get(BACKLOG_ANNOTATION).map(String::as_str)
        }

        #[tokio::test]
        async fn what_it_found_switched_is_the_catch_up_and_a_switch_seen_since_is_not() {
            let (context, requests) = trigger(Vec::new(), true);
            reconcile(at(4, "v2", &["v1", "v2"]), context.clone()).await.unwrap();
            let created = created_by(&requests);
            let [first] = created.as_slice() else { panic!("one migration: {created:?}") };
            assert_eq!(first.name_any(), "widgets.example.com-v2-4");
            assert_eq!(backlog(first), Some("true"), "found so at the start");
            assert_eq!(first.labels().get(TRIGGER_LABEL).map(String::as_str), Some("crd"));
            assert_eq!(first.annotations().get(CRD_UID_ANNOTATION).map(String::as_str), Some("u1"));

            // Pruned since; then switched back while the trigger watched.
            let (context, requests) = trigger(Vec::new(), true);
            reconcile(at(4, "v2", &["v2"]), context.clone()).await.unwrap();
            assert!(requests.writes().is_empty(), "nothing stale, nothing written");
            reconcile(at(5, "v1", &["v2", "v1"]), context).await.unwrap();
            let created = created_by(&requests);
            let [switched] = created.as_slice() else { panic!("one migration: {created:?}") };
            assert_eq!(switched.name_any(), "widgets.example.com-v1-5");
            assert_eq!(backlog(switched), None, "a switch seen since writes first");
        }

        #[tokio::test]
        async fn an_unfinished_migration_of_the_resource_holds_it_back() {
            let mut pending = failed(0, None);
            pending.status = None;
            pending.metadata.name = Some("by-hand".into());
            pending.spec.resource = GroupVersionResource {
                group: "example.com".into(),
                version: "v1".into(),
                resource: "widgets".into(),
            };
            let (context, requests) = trigger(vec![pending], true);
            reconcile(at(4, "v2", &["v1", "v2"]), context).await.unwrap();
            assert!(requests.writes().is_empty(), "{:?}", requests.writes());
        }

        #[tokio::test]
        async fn the_discovery_triggers_sweep_holds_back_only_the_catch_up() {
            let mut swept = failed(0, Some("discovery"));
            swept.status = crate::api::in_state(crate::api::conditions::RUNNING).status;
            swept.metadata.name = Some("widgets.example.com-abc".into());
            swept.spec.resource = GroupVersionResource {
                group: "example.com".into(),
                version: "v1".into(),
                resource: "widgets".into(),
            };
            let (context, requests) = trigger(vec![swept], true);
            // Found so at the start: the sweep's migration proves the same.
            reconcile(at(4, "v2", &["v1", "v2"]), context.clone()).await.unwrap();
            assert!(requests.writes().is_empty(), "{:?}", requests.writes());
            // Switched since: it does not wait for the sweep.
            reconcile(at(5, "v1", &["v1", "v2"]), context).await.unwrap();
            let created = created_by(&requests);
            assert_eq!(created.len(), 1, "{created:?}");
            assert_eq!(backlog(&created[0]), None);
        }

        #[tokio::test]
        async fn its_own_failed_migration_is_retried_in_place_not_created_again() {
            let mut own = failed(0, Some("crd"));
            own.metadata.name = Some("widgets.example.com-v2-4".into());
            own.metadata.annotations =
                Some([(CRD_UID_ANNOTATION.to_owned(), "u1".to_owned())].into());
            own.spec.resource = GroupVersionResource {
                group: "example.com".into(),
                version: "v2".into(),
                resource: "widgets".into(),
            };
            let (context, requests) = trigger(vec![own], true);
            // Made at generation 4, it stands for the state whatever the generation now.
            reconcile(at(9, "v2", &["v1", "v2"]), context).await.unwrap();
            let writes = requests.writes();
            let [retry] = writes.as_slice() else { panic!("one write: {writes:?}") };
            assert_eq!(retry.method, "PATCH");
            assert!(retry.path.ends_with("/widgets.example.com-v2-4"), "{retry:?}");
            let token = &retry.body["metadata"]["annotations"][crate::api::RETRY_ANNOTATION];
            assert!(token.is_string(), "the retry annotation is set: {retry:?}");
        }

        #[tokio::test]
        async fn without_create_it_writes_nothing() {
            let (context, requests) = trigger(Vec::new(), false);
            reconcile(at(4, "v2", &["v1", "v2"]), context).await.unwrap();
            assert!(requests.writes().is_empty(), "{:?}", requests.writes());
        }
    }
}
