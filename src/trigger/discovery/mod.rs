//! The discovery trigger (`--discovery-trigger`), as kube-storage-version-migrator's: every
//! `--discovery-interval`, whenever a CRD changes (ever less often while it keeps changing) or
//! one of its migrations ends (at most every 2 s), read discovery through a fresh connection;
//! keep one StorageState per migratable resource; and create a migration for every resource
//! whose objects may be stored under a hash other than the one the apiserver writes now, unless
//! one is pending or running for it already (whoever created it). While a new hash waits to be
//! trusted, fast polls in between read only the discovery of the group versions serving it
//! ([`cadence`]). The decisions are in [`super::storage_state`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::storage_state::{self, Guard, Trust};
use super::{TRIGGER_LABEL, is_conflict};
use crate::api::{
    GroupResource, GroupVersionResource, PERSISTED_SINCE_ANNOTATION, StorageState,
    StorageStateSpec, StorageVersionMigration, StorageVersionMigrationSpec, Trigger,
};
use crate::apiserver::requests::{RequestError, Requests};
use crate::evidence::encoding::{self, EncodingPolicy, Observer};
use crate::rules::backoff::doubling;
use cadence::{Cadence, fast_reads};
use found::{Discovered, crd_names, discover, fast_poll};
use plan::Plan;

mod cadence;
mod found;
mod plan;

/// Annotation on the migrations this trigger creates: the storage version hash it saw when it
/// created them (the hash a migration really targeted is in `status.target`).
pub const TARGET_HASH_ANNOTATION: &str = "kube-svm.io/storage-version-hash";

/// Annotation on a StorageState: why the discovery trigger creates no more migrations of its
/// resource for its current hash (runs that could prove nothing, or a resource kube-svm may not
/// patch). Removed once it creates one again.
pub const HELD_ANNOTATION: &str = "kube-svm.io/not-migrating";

/// Migrations of a hash that succeeded in a row without proving anything, against the same
/// apiservers, after which the trigger creates no more for it while those apiservers answer:
/// every run rewrites the whole resource, and one that cannot prove the encoding (client-IP
/// affinity, an aggregated API, a status schema that drops kube-svm's fields) never will until
/// the cluster changes.
const MAX_UNPROVEN: u32 = 3;

/// Least time between the polls that follow a running migration, a CRD change or a failure.
const MIN_FOLLOW_UP: Duration = Duration::from_secs(2);

/// Least time between two polls while a hash waits to be trusted: behind three apiservers the
/// trust asks for 12 polls within the settle period, which polls 2 s apart took twice as long
/// as the period itself.
const MIN_TRUST_POLL: Duration = Duration::from_millis(500);

/// Why a poll, or its work on one resource, failed. A failed resource is skipped and the poll
/// goes on, unless the leadership ended or the apiserver cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No connection for discovery could be made, or the core API or the list of API groups
    /// could not be read: nothing was examined.
    #[error("failed to read discovery")]
    Discovery(#[source] kube::Error),
    /// The discovery of the named group version did not answer in time.
    #[error("no timely answer from the discovery of {0}")]
    Unanswered(String),
    /// Listing the kind named (StorageStates or StorageVersionMigrations) failed.
    #[error("failed to list {0}")]
    List(&'static str, #[source] RequestError),
    /// Writing the named StorageState failed.
    #[error("failed to write StorageState {0}")]
    Write(String, #[source] RequestError),
    /// The named StorageState was written by someone else after this poll read it (409), so
    /// this poll's write changed nothing.
    #[error("StorageState {0} changed since this poll read it; it is looked at again next poll")]
    Changed(String),
    /// The named StorageState came back without a resourceVersion to make the write
    /// conditional on.
    #[error("StorageState {0} was read without a resourceVersion")]
    NoResourceVersion(String),
    /// Creating a migration of the named resource failed.
    #[error("failed to create a migration of {0}")]
    Create(String, #[source] RequestError),
}

/// How the discovery trigger polls, from the controller's flags.
#[derive(Clone)]
pub struct Settings {
    /// Time between two polls when nothing is pending.
    pub interval: Duration,
    /// Its settle period: how long a new hash must be shown on every poll before it is acted
    /// on.
    pub encoding: EncodingPolicy,
    /// Fired when a CRD changes or one of its migrations ends: poll soon.
    pub poke: Arc<Notify>,
    /// Finished migrations of its own kept per resource; older ones are deleted.
    pub keep_finished: usize,
    /// Where encoding checks start as soon as a new hash is seen.
    pub observer: Observer,
}

/// Polls until `stop` fires; writes nothing once the leader's term of `requests` ends.
pub async fn run(requests: Requests, settings: Settings, stop: CancellationToken) {
    let mut guard = Guard::default();
    // Successes that proved nothing, by UID, once said.
    let mut explained = HashSet::new();
    // The longest poll so far: on a loaded apiserver a poll of every resource takes seconds,
    // and a heartbeat that aged by that much does not mean the trigger was away.
    let mut slowest = Duration::ZERO;
    // Polls that failed in a row: the next is tried again soon, not after the whole interval
    // (a StorageState CRD whose storage is still initializing answers 429 right after start).
    let mut failures = 0;
    // The version at which the last full poll found each resource: where fast polls look.
    let mut found_at = HashMap::new();
    let mut cadence = Cadence::default();
    // Whether the next poll is a full one, and when the next full one is due.
    let (mut full, mut full_at) = (true, Instant::now());
    loop {
        let began = Instant::now();
        let trusts = guard.trusts();
        let waiting: Vec<GroupResource> = guard.waiting().into_iter().map(|(r, _)| r).collect();
        match fast_reads(&waiting, &found_at).filter(|_| !full) {
            None => {
                let polled =
                    poll(&requests, &settings, &mut guard, &mut explained, slowest, &mut found_at);
                let polled = polled.await;
                slowest = slowest.max(began.elapsed());
                let due = match polled {
                    Ok(due) => {
                        crate::apiserver::reachability::reachable();
                        failures = 0;
                        due
                    }
                    Err(error) => {
                        let unreachable = crate::apiserver::reachability::unreachable(
                            &error,
                            "discovery trigger poll",
                        );
                        if !unreachable {
                            warn!(error = %crate::error_chain(&error), "discovery trigger poll failed");
                        }
                        failures += 1;
                        None
                    }
                };
                // A migration the trigger waits on is looked at again soon, a failing resource
                // when its retry is due.
                full_at = began + next_poll_in(failures, due, None, settings.interval);
            }
            Some(reads) => match fast_poll(&requests, &mut guard, &reads).await {
                Ok(false) => {}
                Ok(true) => full_at = Instant::now(),
                Err(error) => {
                    debug!(error = %crate::error_chain(&error), "fast discovery poll failed");
                    full_at = Instant::now();
                }
            },
        }
        // A hash waiting to be trusted is looked at again as often as its trust asks, by fast
        // polls, for a few trust periods at most.
        let now = Instant::now();
        let period = guard.trust_period(MIN_TRUST_POLL).unwrap_or(settings.encoding.settle);
        cadence.record(now, guard.pending(), guard.trusts() > trusts, period);
        let soon =
            guard.next_poll(MIN_TRUST_POLL).filter(|_| failures == 0 && cadence.fast(now, period));
        let until_full = full_at.saturating_duration_since(now);
        let wait;
        (full, wait) = match soon {
            Some(soon) if soon < until_full => (false, soon),
            _ => (true, until_full),
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
            () = settings.poke.notified() => {
                // Woken by a CRD change or a migration's end: at most a poll every so often,
                // however many come.
                tokio::time::sleep(MIN_FOLLOW_UP.saturating_sub(began.elapsed())).await;
                full = true;
            }
        }
    }
}

/// How long until the next poll, after `failures` failed polls in a row (the last one among
/// them, if any): soon after a failure, doubling; otherwise when the poll, or a hash it waits to
/// trust, asks (`due`, `soon`); at the latest after `interval`. Pure.
fn next_poll_in(
    failures: u32,
    due: Option<Duration>,
    soon: Option<Duration>,
    interval: Duration,
) -> Duration {
    let retry = (failures > 0).then(|| doubling(failures, MIN_FOLLOW_UP, interval));
    [retry, due, soon].into_iter().flatten().fold(interval, Duration::min)
}

/// How soon a poll that waits on something looks again.
fn follow_up(settings: &Settings) -> Duration {
    settings.encoding.settle.max(MIN_FOLLOW_UP).min(settings.interval)
}

/// One full poll; returns how soon something it waits on (a migration running, a failed one to
/// try again) should be looked at again.
async fn poll(
    requests: &Requests,
    settings: &Settings,
    guard: &mut Guard,
    explained: &mut HashSet<String>,
    slowest: Duration,
    found_at: &mut HashMap<GroupResource, String>,
) -> Result<Option<Duration>, Error> {
    let (discovered, unexamined) = discover(requests).await?;
    *found_at = discovered.iter().map(|d| (d.resource.clone(), d.version.clone())).collect();
    if !unexamined.is_empty() {
        warn!(
            ?unexamined,
            "discovery failed for some API groups; their resources were not examined"
        );
    }
    let client = requests.client();
    let states: Api<StorageState> = Api::all(client.clone());
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    let existing_states: BTreeMap<String, StorageState> = requests
        .send(states.list(&Default::default()))
        .await
        .map_err(|e| Error::List("StorageStates", e))?
        .items
        .into_iter()
        .map(|s| (s.metadata.name.clone().unwrap_or_default(), s))
        .collect();
    let existing_migrations = requests
        .send(migrations.list(&Default::default()))
        .await
        .map_err(|e| Error::List("StorageVersionMigrations", e))?
        .items;
    // Before any is created: the finished ones kept and the one this poll may create are all
    // there are of a resource.
    super::history::forget(
        requests,
        &migrations,
        &existing_migrations,
        Trigger::Discovery,
        settings.keep_finished,
    )
    .await;

    // Each poll asks one apiserver (a new connection): a new hash must be seen on as many polls
    // in a row as make it unlikely that one apiserver was never asked.
    let trust = Trust {
        window: settings.encoding.settle,
        polls: encoding::samples_needed(
            crate::evidence::apiservers::apiservers_or_assumed(client).await,
        ),
    };
    let now = Instant::now();
    let mut due: Option<Duration> = None;
    let mut look_again = |after: Duration| due = Some(due.map_or(after, |d| d.min(after)));
    // Two intervals, the settle period, and the last poll and this one as long as the slowest.
    let stale_after = settings.interval * 2 + settings.encoding.settle + slowest * 2;
    let crds = crd_names(requests).await;
    // The kube-apiserver processes answering now, what an unproven run is held against: read
    // once a poll, and only by a poll about to create a migration.
    let mut apiservers: Option<Option<Vec<String>>> = None;
    let timing = plan::Timing {
        stale_after,
        beat: settings.interval / 2,
        first_wait: follow_up(settings),
        longest_wait: settings.interval,
    };
    for found in &discovered {
        let Discovered { resource, kind, version, hash } = found;
        let name = resource.name();
        let state = existing_states.get(&name);
        let status = state.and_then(|s| s.status.as_ref());
        let recorded = status.and_then(|s| s.current_storage_version_hash.as_deref());
        let trusted = guard.observe(resource, hash, recorded, now, trust);
        // The first poll of the streak that just had the hash trusted, as a time.
        let streak = guard.trusted_streak(resource).and_then(|first| {
            let ago = SignedDuration::try_from(now.duration_since(first)).ok()?;
            Timestamp::now().checked_sub(ago).ok()
        });
        let seen = plan::Seen { found, state, trusted, streak, crd: crds.contains(&name) };
        let step = plan::step(&seen, &existing_migrations, &timing, Timestamp::now());
        // The encoding check of a new hash starts at the first poll that sees it, not once the
        // hash is trusted and its migration created: the two wait out their settle periods
        // together. A CRD's starts at its storage switch, from the CRD watch.
        if step.check {
            let expected = encoding::Expected::Hash { hash: hash.clone(), served: version.clone() };
            let GroupResource { group, resource: plural } = resource;
            let check = encoding::Check::new(group, plural, kind, expected, 0, settings.encoding);
            settings.observer.observe(requests, &check);
        }
        let Some(trusted) = step.trusted else {
            continue;
        };
        let current = &trusted.current;
        if trusted.next.other_seen {
            debug!(resource = %name, %current, seen = %hash, "discovery shows another hash");
        }
        if trusted.write {
            let written =
                write_state(requests, &states, resource, state, &trusted.next, trusted.stamp);
            if let Err(error) = written.await {
                skip_or_stop(error)?;
                continue;
            }
        }
        match trusted.migration {
            None => {}
            Some(Plan::Busy) => look_again(timing.first_wait),
            // A failing resource is tried again at the regular polls, not at every follow-up.
            Some(Plan::BackOff { wait, failures, unproven }) => {
                look_again(wait);
                match unproven {
                    Some((last, why)) => explain(explained, &name, last, why, failures, wait),
                    None => {
                        debug!(resource = %name, failures, ?wait, "failing; trying again later")
                    }
                }
            }
            Some(Plan::Try) => {
                let apis = (&states, &migrations);
                if try_migration(requests, apis, found, state, &trusted, &mut apiservers).await? {
                    look_again(timing.first_wait);
                }
            }
        }
    }
    let seen: Vec<GroupResource> = discovered.into_iter().map(|d| d.resource).collect();
    guard.retain(&seen);
    // Said once per migration, and forgotten with it: bounded by the migrations kept.
    let kept: HashSet<&str> =
        existing_migrations.iter().filter_map(|m| m.metadata.uid.as_deref()).collect();
    explained.retain(|uid| kept.contains(uid.as_str()));
    Ok(due)
}

/// Carries out [`Plan::Try`] for the resource `found`: holds it back, saying why on its
/// StorageState, when its runs for the trusted hash keep proving nothing against the apiservers
/// answering now (read once a poll, into `apiservers`) or kube-svm may not patch it; creates its
/// migration otherwise. Whether it tried to create one; `Err` ends the poll ([`skip_or_stop`]).
async fn try_migration(
    requests: &Requests,
    (states, migrations): (&Api<StorageState>, &Api<StorageVersionMigration>),
    found: &Discovered,
    state: Option<&StorageState>,
    trusted: &plan::Trusted<'_>,
    apiservers: &mut Option<Option<Vec<String>>>,
) -> Result<bool, Error> {
    let Discovered { resource, version, .. } = found;
    if apiservers.is_none() {
        let now = crate::lifecycle::resume::apiserver_processes(requests).await;
        *apiservers = Some(now.ok());
    }
    let answering = apiservers.as_ref().and_then(Option::as_ref);
    let (current, since) = (&trusted.current, Some(trusted.since));
    let proof = |m: &StorageVersionMigration| storage_state::proof(m, resource, current, since);
    let held = match plan::held(&trusted.of_resource, current, answering, proof) {
        Some(why) => Some(why),
        None => may_not_migrate(requests, resource).await,
    };
    if let Some(why) = held {
        if let Err(error) = hold(requests, states, state, Some(&why)).await {
            skip_or_stop(error)?;
        }
        return Ok(false);
    }
    if let Err(error) = hold(requests, states, state, None).await {
        skip_or_stop(error)?;
    }
    if let Err(error) = create_migration(requests, migrations, resource, version, current).await {
        skip_or_stop(error)?;
    }
    Ok(true)
}

/// Says why a success proves nothing when it holds the next migration of its resource back:
/// once per migration, not at every poll while it waits.
fn explain(
    explained: &mut HashSet<String>,
    resource: &str,
    migration: &StorageVersionMigration,
    unproven: storage_state::Unproven,
    failures: u32,
    wait: Duration,
) {
    if !explained.insert(migration.metadata.uid.clone().unwrap_or_default()) {
        return;
    }
    warn!(
        resource,
        migration = migration.metadata.name.as_deref().unwrap_or_default(),
        why = unproven.reason(),
        failures,
        ?wait,
        "a migration succeeded but does not prove the objects are stored in the current version; \
         the next one waits as after a failure"
    );
}

/// Why kube-svm may not migrate `resource`: its own access, asked of the apiserver, lacks
/// `list` or `patch` on it (a chart whose `rbac.migratableResources` leaves it out). `None`
/// when it may, or when the answer could not be had (the migration then says what fails).
async fn may_not_migrate(requests: &Requests, resource: &GroupResource) -> Option<String> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let reviews: Api<SelfSubjectAccessReview> = Api::all(requests.client().clone());
    for verb in ["list", "patch"] {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(resource.group.clone()),
                    resource: Some(resource.resource.clone()),
                    verb: Some(verb.to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let answer = requests.send(reviews.create(&PostParams::default(), &review)).await;
        let allowed = answer.ok().and_then(|r| r.status).map(|s| s.allowed);
        if allowed == Some(false) {
            return Some(format!(
                "kube-svm may not {verb} {}: its role leaves it out (rbac.migratableResources)",
                resource.name()
            ));
        }
    }
    None
}

/// Says on the StorageState `state` why no migration is created for it (`why`), or, with
/// `None`, takes that back; writes nothing when it already says so.
async fn hold(
    requests: &Requests,
    states: &Api<StorageState>,
    state: Option<&StorageState>,
    why: Option<&str>,
) -> Result<(), Error> {
    let Some(state) = state else { return Ok(()) };
    let said = state.metadata.annotations.as_ref().and_then(|a| a.get(HELD_ANNOTATION));
    if said.map(String::as_str) == why {
        return Ok(());
    }
    let name = state.metadata.name.clone().unwrap_or_default();
    if let Some(why) = why {
        info!(storage_state = name, why, "the discovery trigger creates no migration for it");
    }
    let patch = serde_json::json!({ "metadata": { "annotations": { HELD_ANNOTATION: why } } });
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    match requests.send(states.patch(&name, &params, &patch)).await {
        Ok(_) => Ok(()),
        Err(error) => Err(Error::Write(name, error)),
    }
}

/// A write for one resource that failed is said and skipped: the others go on. A closed fence
/// ends the poll, as nothing more may be written; so does an apiserver that cannot be reached,
/// as every other write would fail the same way.
fn skip_or_stop(error: Error) -> Result<(), Error> {
    if let Error::List(_, RequestError::Fenced)
    | Error::Write(_, RequestError::Fenced)
    | Error::Create(_, RequestError::Fenced) = error
    {
        return Err(error);
    }
    if crate::apiserver::reachability::unreachable(&error, "discovery trigger write") {
        return Err(error);
    }
    let said = "discovery trigger: skipped one resource this poll";
    match error {
        // Someone wrote it after this poll read it (another replica's trigger): no harm done.
        Error::Changed(_) => info!(error = %crate::error_chain(&error), "{said}"),
        _ => warn!(error = %crate::error_chain(&error), "{said}"),
    }
    Ok(())
}

/// Writes the StorageState of `resource`: creates it when this poll found none (`read` is
/// `None`), moves its persisted-since annotation to `stamp` when given, and writes `next`'s
/// status. Each write is conditional on the resourceVersion this poll read (or the previous
/// write returned): a write decided on an older read, such as a deposed leader's delayed one,
/// gets [`Error::Changed`] and changes nothing.
pub async fn write_state(
    requests: &Requests,
    states: &Api<StorageState>,
    resource: &GroupResource,
    read: Option<&StorageState>,
    next: &storage_state::Next,
    stamp: Option<Timestamp>,
) -> Result<(), Error> {
    let name = resource.name();
    let failed = |e: RequestError| match is_conflict(&e) {
        true => Error::Changed(name.clone()),
        false => Error::Write(name.clone(), e),
    };
    let since = stamp.map(|at| at.to_string());
    let version = match (read, since) {
        (None, since) => {
            let state = StorageState {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    annotations: since.map(|t| [(PERSISTED_SINCE_ANNOTATION.to_owned(), t)].into()),
                    ..ObjectMeta::default()
                },
                spec: StorageStateSpec { resource: resource.clone() },
                status: None,
            };
            // A 409 here is a state created meanwhile (by another trigger): read next poll.
            let params = PostParams::default();
            let created = requests.send(states.create(&params, &state)).await.map_err(failed)?;
            resource_version(&created, &name)?.to_owned()
        }
        (Some(read), Some(since)) => {
            let annotate = serde_json::json!({ "metadata": {
                "resourceVersion": resource_version(read, &name)?,
                "annotations": { PERSISTED_SINCE_ANNOTATION: since },
            }});
            let (params, patch) = (PatchParams::default(), Patch::Merge(&annotate));
            let patched = requests.send(states.patch(&name, &params, &patch)).await;
            resource_version(&patched.map_err(failed)?, &name)?.to_owned()
        }
        (Some(read), None) => resource_version(read, &name)?.to_owned(),
    };
    let status = serde_json::json!({
        "metadata": { "resourceVersion": version },
        "status": next.status,
    });
    requests
        .send(states.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)))
        .await
        .map_err(failed)?;
    if next.persisted_changed {
        info!(
            storage_state = name,
            persisted = ?next.status.persisted_storage_version_hashes,
            "storage state changed"
        );
    }
    Ok(())
}

/// The resourceVersion of `state`, which every conditional write carries.
fn resource_version<'a>(state: &'a StorageState, name: &str) -> Result<&'a str, Error> {
    state.metadata.resource_version.as_deref().ok_or_else(|| Error::NoResourceVersion(name.into()))
}

async fn create_migration(
    requests: &Requests,
    migrations: &Api<StorageVersionMigration>,
    resource: &GroupResource,
    version: &str,
    hash: &str,
) -> Result<(), Error> {
    let name = resource.name();
    let migration = StorageVersionMigration {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            labels: Some(
                [(TRIGGER_LABEL.to_owned(), Trigger::Discovery.label().to_owned())].into(),
            ),
            annotations: Some([(TARGET_HASH_ANNOTATION.to_owned(), hash.to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: StorageVersionMigrationSpec {
            resource: GroupVersionResource {
                group: resource.group.clone(),
                version: version.to_owned(),
                resource: resource.resource.clone(),
            },
            continue_token: None,
        },
        status: None,
    };
    let created = requests
        .send(migrations.create(&PostParams::default(), &migration))
        .await
        .map_err(|e| Error::Create(name.clone(), e))?;
    info!(
        migration = created.metadata.name.as_deref().unwrap_or_default(),
        storage_version_hash = hash,
        "created a migration for a changed storage version"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_poll_is_tried_again_soon_then_less_often_never_after_the_interval() {
        let interval = Duration::from_secs(600);
        let waits: Vec<u64> = (1..=10)
            .map(|failures| next_poll_in(failures, None, None, interval).as_secs())
            .collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64, 128, 256, 512, 600]);
        let soon = Some(Duration::from_secs(1));
        assert_eq!(
            next_poll_in(5, None, soon, interval),
            Duration::from_secs(1),
            "a hash to trust"
        );
    }

    #[test]
    fn a_poll_that_succeeded_waits_for_what_it_waits_on_or_the_interval() {
        let interval = Duration::from_secs(600);
        assert_eq!(next_poll_in(0, None, None, interval), interval);
        let due = Some(Duration::from_secs(10));
        assert_eq!(
            next_poll_in(0, due, Some(Duration::from_secs(30)), interval),
            Duration::from_secs(10)
        );
    }
}
