//! The requests a migration makes around the engine: whether a CRD's conversion webhook answers;
//! what it targets when it starts, and whether the apiservers already encode in it; marking the
//! CRD `StorageMigrating` while it runs; watching the target while it runs and checking it again
//! at the end; and pruning `storedVersions` afterwards when [`decide`] allows it.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::warn;

use super::prune::{self, PruneError};
use crate::api::conditions::{
    STATUS_FALSE, STATUS_TRUE, STORAGE_MIGRATING, STORED_VERSIONS_PRUNED, reasons,
    storage_migrating, stored_versions,
};
use crate::api::{GroupVersionResource, MigrationCondition, MigrationTarget};
use crate::apiserver::answers;
use crate::apiserver::fence::{Fence, RequestError, bounded};
use crate::engine::{ResolveError, Resource};
use crate::evidence::conversion;
use crate::evidence::encoding::{self, EncodingPolicy, Observer};
use crate::rules::encoding::Encoding;
use crate::rules::storage_hash::storage_version_hash;
use crate::rules::stored_versions::{CrdState, Decision, Run, decide};

use super::crd_watch::{self, Followed};

/// Times the prune is decided again after the CRD changed under it.
const PRUNE_CONFLICT_RETRIES: u32 = 5;

/// Tries, a second apart, to read discovery again when verifying the end of a run.
const VERIFY_ATTEMPTS: u32 = 5;

/// What the steps need of the process running them.
#[derive(Clone, Copy)]
pub struct Cluster<'a> {
    /// For requests: every request has a deadline.
    pub client: &'a Client,
    /// What `client` was made from, for fresh connections (the encoding check samples several
    /// apiservers behind a load balancer).
    pub config: &'a kube::Config,
    /// Nothing is written once it closes: the leader's term (open for `kube-svm migrate`).
    pub fence: &'a Fence,
    /// Longest time one request may go unanswered.
    pub request_timeout: Duration,
    /// How long the encoding checks take.
    pub encoding: EncodingPolicy,
    /// Encoding checks, shared by the migrations that need the same one.
    pub observer: &'a Observer,
}

/// The name of the CRD that would serve `resource`, if it can be a custom resource.
fn crd_name(resource: &Resource) -> Option<String> {
    (!resource.group.is_empty()).then(|| format!("{}.{}", resource.plural, resource.group))
}

/// The CRD serving `resource`; `None` for built-in and aggregated resources.
pub async fn crd_of(
    cluster: &Cluster<'_>,
    resource: &Resource,
) -> Result<Option<CustomResourceDefinition>, RequestError> {
    let Some(name) = crd_name(resource) else { return Ok(None) };
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    bounded(cluster.fence, cluster.request_timeout, crds.get_opt(&name)).await
}

/// Whether the conversion webhook of `crd` (the CRD behind `resource`), if it has one, answers
/// a read of an object that needs converting ([`conversion::preflight`]).
pub async fn conversion_preflight(
    cluster: &Cluster<'_>,
    resource: &Resource,
    crd: &CustomResourceDefinition,
) -> Result<(), conversion::Unavailable> {
    let timeout = cluster.request_timeout;
    conversion::preflight(cluster.client, crd, Some(&resource.version), timeout).await
}

/// What the migration targets, and whether the apiservers already encode in it (`vouched` when
/// an operator said so on the migration). For a CRD-backed resource: the CRD's generation, uid
/// and storage version. For a built-in resource: the storage version hash discovery publishes,
/// which every apiserver must publish too (during a rolling upgrade, two releases publish two).
pub async fn target_of(
    cluster: &Cluster<'_>,
    resource: &Resource,
    crd: Option<&CustomResourceDefinition>,
    vouched: bool,
) -> MigrationTarget {
    let mut target = MigrationTarget {
        storage_version_hash: resource.storage_version_hash.clone(),
        ..MigrationTarget::default()
    };
    let state = crd.and_then(CrdState::of);
    let mut followed = crd.and_then(Followed::from_crd);
    let expected = match (&state, &resource.storage_version_hash) {
        (Some(state), _) => encoding::Expected::StorageVersion(state.storage_version.clone()),
        (None, Some(hash)) => {
            encoding::Expected::Hash { hash: hash.clone(), served: resource.version.clone() }
        }
        (None, None) if crd.is_some() => return target,
        (None, None) => {
            target.encoding_confirmed = Some(false);
            target.encoding_evidence = Some(format!(
                "discovery publishes no storage version hash for {resource}, so nothing shows how the apiservers encode it"
            ));
            return target;
        }
    };
    let encoding = match vouched {
        true => Encoding::Confirmed {
            by: format!(
                "the operator: the migration carries the annotation {}: \"true\"",
                crate::api::ENCODING_CONFIRMED_ANNOTATION
            ),
        },
        false => {
            let check = encoding::Check {
                group: resource.group.clone(),
                plural: resource.plural.clone(),
                kind: resource.kind.clone(),
                expected,
                generation: state.as_ref().map_or(0, |s| s.generation),
                settle: cluster.encoding.settle,
                wait: cluster.encoding.wait,
            };
            let confirming = cluster.observer.confirm(cluster.client, cluster.config, &check);
            // A CRD whose storage changes during the check makes its verdict moot: no need to
            // wait it out. Other changes to it are followed, and the target records the last.
            match (&state, followed.as_mut()) {
                (Some(_), Some(followed)) => tokio::select! {
                    encoding = confirming => encoding,
                    moved = followed.follow(cluster, resource) => Encoding::Unconfirmed(format!(
                        "{} during the encoding check", moved.message
                    )),
                },
                (Some(state), None) => tokio::select! {
                    encoding = confirming => encoding,
                    moved = crd_moves(cluster, resource, state) => Encoding::Unconfirmed(moved),
                },
                (None, _) => confirming.await,
            }
        }
    };
    let (confirmed, evidence) = match encoding {
        Encoding::Confirmed { by } => (true, format!("confirmed by {by}")),
        Encoding::Unconfirmed(seen) => (false, seen),
    };
    target.encoding_confirmed = Some(confirmed);
    target.encoding_evidence = Some(evidence);
    if let Some(state) = state {
        // What the apiservers encode once the check passes: discovery may still lag behind now.
        target.storage_version_hash =
            Some(storage_version_hash(&resource.group, &state.storage_version, &resource.kind));
        target.storage_version = Some(state.storage_version);
        target.crd_generation = Some(state.generation);
        target.crd_uid = state.uid;
        if let Some(followed) = followed {
            target.crd_generation = Some(followed.generation());
            target.crd_resource_version = Some(followed.resource_version().to_owned());
        }
    }
    target
}

/// How often a running migration of a CRD-backed resource reads its CRD to see whether its
/// target still holds. Objects written through the old target meanwhile are written again by
/// the run that starts over, so this bounds wasted work, not safety.
const GUARD_INTERVAL: Duration = Duration::from_secs(2);

/// A change to the resource that voids (or leaves unproven) a run's writes so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The Failed condition's reason, should the migration end on it.
    pub reason: &'static str,
    /// What changed, in words: the Failed condition's message or the note of the Event that
    /// tells of it.
    pub message: String,
    /// What the migration does about it.
    pub then: Then,
}

/// What a migration does about a [`Change`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// Start over from the first object with the new target: the storage version changed.
    StartOver,
    /// End Failed: the resource or its CRD is gone, or could not be read.
    Fail,
    /// End as the run did, but prove nothing: the apiservers disagree on the encoding (a
    /// rolling upgrade), so `status.target.encodingConfirmed` becomes false.
    Unproven,
}

impl Change {
    pub(super) fn new(reason: &'static str, message: String) -> Change {
        let then = match reason {
            reasons::STORAGE_VERSION_CHANGED | reasons::VERSION_SERVED_AGAIN => Then::StartOver,
            _ => Then::Fail,
        };
        Change { reason, message, then }
    }

    /// Whether the migration can start over from the first object with the new target (its
    /// storage version changed), rather than end (the resource or its CRD is gone).
    pub fn starts_over(&self) -> bool {
        self.then == Then::StartOver
    }
}

/// What changed about a CRD-backed `resource`'s CRD (`now`, `None` when deleted) since `target`
/// was recorded: deleted, replaced, its storage version switched, or its generation moved (any
/// spec change; a storage switch there and back leaves the same storage version and a newer
/// generation). `None` when nothing changed or the resource is not CRD-backed. Pure.
pub fn crd_change(
    resource: &Resource,
    target: &MigrationTarget,
    now: Option<&CustomResourceDefinition>,
) -> Option<Change> {
    let (Some(generation), Some(storage)) = (target.crd_generation, &target.storage_version) else {
        return None;
    };
    let Some(crd) = now else {
        let why = format!("the CRD of {resource} was deleted while the migration ran");
        return Some(Change::new(reasons::RESOURCE_NOT_SERVED, why));
    };
    // A target recorded before the uid was (an older kube-svm) is left to the prune's own check.
    if target.crd_uid.is_some() && crd.metadata.uid != target.crd_uid {
        let why =
            format!("the CRD of {resource} was deleted and created again while the migration ran");
        return Some(Change::new(reasons::RESOURCE_NOT_SERVED, why));
    }
    let state = CrdState::of(crd);
    let storage_now = state.as_ref().map(|s| s.storage_version.as_str());
    if storage_now != Some(storage.as_str()) {
        let why = format!(
            "the storage version of {resource} changed from {storage} to {}",
            storage_now.unwrap_or("none")
        );
        return Some(Change::new(reasons::STORAGE_VERSION_CHANGED, why));
    }
    let generation_now = state.map_or(generation, |s| s.generation);
    (generation_now != generation).then(|| {
        let why = format!(
            "the CRD of {resource} changed (generation {generation} then {generation_now}): its storage version may have been switched and switched back"
        );
        Change::new(reasons::STORAGE_VERSION_CHANGED, why)
    })
}

/// Resolves once the CRD behind `resource` is no longer at the generation (or uid) of `state`,
/// reading it every [`GUARD_INTERVAL`]; says how it moved.
async fn crd_moves(cluster: &Cluster<'_>, resource: &Resource, state: &CrdState) -> String {
    loop {
        tokio::time::sleep(GUARD_INTERVAL).await;
        let Ok(crd) = crd_of(cluster, resource).await else { continue };
        let now = crd.as_ref().and_then(CrdState::of);
        let moved = now
            .as_ref()
            .is_none_or(|now| now.generation != state.generation || now.uid != state.uid);
        if moved {
            let generation =
                now.map_or_else(|| "none".to_owned(), |now| now.generation.to_string());
            return format!(
                "the CRD of {resource} changed during the encoding check (generation {} then {generation})",
                state.generation
            );
        }
    }
}

/// Whether the CRD behind `resource` still is what `target` recorded, read now: `None` when it
/// is (or cannot be read: the guard asks again, the end of the run decides).
/// With `followed` (the CRD as the run followed it), only a change that can affect what is
/// stored counts ([`crd_watch`]); without it, any change of the generation.
pub async fn target_changed(
    cluster: &Cluster<'_>,
    resource: &Resource,
    target: &MigrationTarget,
    followed: Option<&mut Followed>,
) -> Option<Change> {
    target.crd_generation?;
    if let Some(followed) = followed {
        return crd_watch::changed_by_now(cluster, resource, followed).await;
    }
    let crd = crd_of(cluster, resource).await.ok()?;
    crd_change(resource, target, crd.as_ref())
}

/// Resolves once the target of the run no longer holds: for a CRD-backed `resource`, once its
/// CRD no longer is what `target` recorded, reading it every [`GUARD_INTERVAL`]; for a built-in
/// resource whose encoding was confirmed, once a discovery sample through a new connection,
/// taken every [`GUARD_INTERVAL`], shows another hash than the target (an apiserver of another
/// release, or one rolled back, stores what the run writes through it in another version).
/// Never for a run that proves nothing anyway (its encoding not confirmed, or no hash to
/// compare): the end of the run checks those.
///
/// A CRD `followed` is watched, change by change, and only a change that can affect what is
/// stored resolves it ([`crd_watch`]).
pub async fn guard(
    cluster: &Cluster<'_>,
    resource: &Resource,
    target: &MigrationTarget,
    followed: Option<&mut Followed>,
) -> Change {
    if let Some(followed) = followed {
        return followed.follow(cluster, resource).await;
    }
    if target.crd_generation.is_some() {
        loop {
            tokio::time::sleep(GUARD_INTERVAL).await;
            if let Some(change) = target_changed(cluster, resource, target, None).await {
                return change;
            }
        }
    }
    let Some(check) = built_in_check(resource, target) else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(GUARD_INTERVAL).await;
        let seen = encoding::sample_during_run(cluster.config, &check).await;
        if let Some(change) = hash_change(resource, &check, seen) {
            return change;
        }
    }
}

/// What a built-in resource's run samples discovery for while it writes: the hash it targets,
/// read at the version it writes through. `None` when the run is not sampled: a CRD-backed
/// resource (its CRD says), no hash recorded, or the encoding not confirmed at the start.
fn built_in_check(resource: &Resource, target: &MigrationTarget) -> Option<encoding::Check> {
    if target.crd_generation.is_some() || target.encoding_confirmed != Some(true) {
        return None;
    }
    let hash = target.storage_version_hash.clone()?;
    Some(encoding::Check {
        group: resource.group.clone(),
        plural: resource.plural.clone(),
        kind: resource.kind.clone(),
        expected: encoding::Expected::Hash { hash, served: resource.version.clone() },
        generation: 0,
        settle: Duration::ZERO,
        wait: Duration::ZERO,
    })
}

/// The change one discovery sample taken during a built-in resource's run shows, if any: a hash
/// other than the target starts the run over, as a CRD's storage switch does (a flip there and
/// back before the end is a mixed run all the same). Pure.
fn hash_change(
    resource: &Resource,
    check: &encoding::Check,
    seen: encoding::DuringRun,
) -> Option<Change> {
    let encoding::DuringRun::Other(other) = seen else { return None };
    let encoding::Expected::Hash { hash, .. } = &check.expected else { return None };
    let why = format!(
        "discovery published storage version hash {other} for {resource} while the run wrote in {hash}: an apiserver encodes it in another version, so objects written through it may be stored there"
    );
    Some(Change::new(reasons::STORAGE_VERSION_CHANGED, why))
}

/// What changed about the resource since the migration started, if anything.
///
/// A run that completed proves nothing if the resource stopped being served, or its storage
/// version (or for a CRD, anything of its spec) changed, while it ran: then objects written
/// earlier may be stored in the old version.
pub async fn changed_since_start(
    cluster: &Cluster<'_>,
    spec: &GroupVersionResource,
    requires_status: bool,
    resource: &Resource,
    target: &MigrationTarget,
    followed: Option<&mut Followed>,
) -> Option<Change> {
    let mut attempts = 0;
    let now = loop {
        match Resource::resolve(cluster.client, spec, requires_status).await {
            Ok(now) => break now,
            Err(error) if error.is_transient() && attempts + 1 < VERIFY_ATTEMPTS => {
                attempts += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(error @ ResolveError::Discovery(..)) => {
                let why = format!(
                    "could not confirm that {resource} was still served at the end: {}",
                    crate::error_chain(&error)
                );
                return Some(Change::new(reasons::DISCOVERY_FAILED, why));
            }
            Err(error) => {
                let why = format!(
                    "{resource} stopped being served while the migration ran: {}",
                    crate::error_chain(&error)
                );
                return Some(Change::new(reasons::RESOURCE_NOT_SERVED, why));
            }
        }
    };
    // For a CRD the CRD itself says (below); discovery may lag behind it. For a built-in
    // resource every apiserver must still publish the hash the run targeted: sampled again.
    if target.crd_generation.is_none() {
        let hash = target.storage_version_hash.clone()?;
        let check = encoding::Check {
            group: now.group.clone(),
            plural: now.plural.clone(),
            kind: now.kind.clone(),
            expected: encoding::Expected::Hash { hash: hash.clone(), served: now.version.clone() },
            generation: 0,
            settle: Duration::ZERO,
            wait: Duration::ZERO,
        };
        return match encoding::at_end(cluster.client, cluster.config, &check).await {
            encoding::AtEnd::Same => None,
            encoding::AtEnd::Moved(other) => {
                let why = format!(
                    "the storage version hash of {resource} changed from {hash} to {other} while the migration ran"
                );
                Some(Change::new(reasons::STORAGE_VERSION_CHANGED, why))
            }
            encoding::AtEnd::Mixed(seen) => Some(Change {
                reason: reasons::STORAGE_VERSION_CHANGED,
                message: format!(
                    "at the end of the run the apiservers did not all publish {hash} for {resource}: {seen}"
                ),
                then: Then::Unproven,
            }),
        };
    }
    match crd_of(cluster, resource).await {
        Ok(Some(crd)) if followed.is_some() => {
            let followed = followed?;
            followed.catch_up(cluster, resource, &crd).await
        }
        Ok(crd) => crd_change(resource, target, crd.as_ref()),
        Err(error) => {
            let why = format!(
                "could not read the CRD of {resource} at the end: {}",
                crate::error_chain(&error)
            );
            Some(Change::new(reasons::DISCOVERY_FAILED, why))
        }
    }
}

/// Decides on `storedVersions` after `run`, prunes when allowed (reading the CRD again and
/// deciding again when it changed under the prune), and returns the condition that says what
/// happened. `None` when the resource is not CRD-backed or nothing was recorded at the start.
pub async fn settle_stored_versions(
    cluster: &Cluster<'_>,
    resource: &Resource,
    target: &MigrationTarget,
    run: &Run,
    mut followed: Option<&mut Followed>,
) -> Option<MigrationCondition> {
    let (Some(generation), Some(storage_version)) =
        (target.crd_generation, target.storage_version.clone())
    else {
        return None;
    };
    let uid = target.crd_uid.clone();
    let mut started = CrdState { uid, generation, storage_version, stored_versions: Vec::new() };
    let encoding = match (target.encoding_confirmed, &target.encoding_evidence) {
        (Some(true), evidence) => Encoding::Confirmed { by: evidence.clone().unwrap_or_default() },
        (_, evidence) => Encoding::Unconfirmed(evidence.clone().unwrap_or_default()),
    };
    let mut last_conflict = String::new();
    for _ in 0..PRUNE_CONFLICT_RETRIES {
        let crd = match crd_of(cluster, resource).await {
            Ok(Some(crd)) => crd,
            Ok(None) => {
                return Some(condition(
                    false,
                    stored_versions::CRD_GONE,
                    "the CRD no longer exists".into(),
                ));
            }
            Err(error) => {
                return Some(condition(
                    false,
                    stored_versions::CRD_UNREADABLE,
                    format!("failed to read the CRD: {}", crate::error_chain(&error)),
                ));
            }
        };
        let Some(now) = CrdState::of(&crd) else {
            return Some(condition(
                false,
                stored_versions::CRD_CHANGED,
                "the CRD no longer names a storage version".into(),
            ));
        };
        // Followed to this read: changes that left what is stored alone do not count.
        if let Some(followed) = followed.as_deref_mut() {
            if let Some(change) = followed.catch_up(cluster, resource, &crd).await {
                return Some(condition(false, stored_versions::CRD_CHANGED, change.message));
            }
            started.generation = followed.generation();
        }
        let stored_versions = match decide(run, &started, &now, &encoding) {
            Decision::Prune(stored_versions) => stored_versions,
            Decision::AlreadyPruned => {
                return Some(condition(
                    true,
                    stored_versions::ALREADY_PRUNED,
                    format!("storedVersions already lists only {}", now.storage_version),
                ));
            }
            Decision::Keep(refusal) => {
                return Some(condition(false, refusal.reason(), refusal.to_string()));
            }
        };
        let message =
            format!("storedVersions set to {stored_versions:?} (was {:?})", now.stored_versions);
        let limit = cluster.fence.deadline(cluster.request_timeout);
        match prune::prune(cluster.client, crd, stored_versions, limit).await {
            Ok(()) => return Some(condition(true, stored_versions::PRUNED, message)),
            Err(PruneError::Conflict) => last_conflict = PruneError::Conflict.to_string(),
            Err(error) => {
                return Some(condition(
                    false,
                    stored_versions::PRUNE_FAILED,
                    format!("failed to prune storedVersions: {}", crate::error_chain(&error)),
                ));
            }
        }
    }
    Some(condition(
        false,
        stored_versions::PRUNE_FAILED,
        format!(
            "failed to prune storedVersions: {last_conflict}, {PRUNE_CONFLICT_RETRIES} times in a row"
        ),
    ))
}

fn condition(pruned: bool, reason: &str, message: String) -> MigrationCondition {
    MigrationCondition {
        type_: STORED_VERSIONS_PRUNED.to_owned(),
        status: if pruned { STATUS_TRUE } else { STATUS_FALSE }.to_owned(),
        last_update_time: Some(Time(Timestamp::now())),
        reason: Some(reason.to_owned()),
        message: Some(crate::api::cut(&message, crate::api::CONDITION_MESSAGE_LIMIT)),
    }
}

/// Sets the CRD's `StorageMigrating` condition (True while a migration runs). Best effort: the
/// condition informs, nothing depends on it; failures are logged.
/// `by` names who migrates, for the condition's message (`StorageVersionMigration NAME`).
pub async fn mark_migrating(cluster: &Cluster<'_>, resource: &Resource, migrating: bool, by: &str) {
    let Some(name) = crd_name(resource) else { return };
    // One retry covers a concurrent status write by the apiserver.
    for _ in 0..2 {
        match set_condition(cluster, &name, migrating, by).await {
            Ok(()) => return,
            Err(RequestError::Api(error)) if answers::is_conflict(&error) => continue,
            Err(RequestError::Api(error)) if answers::is_not_found(&error) => return,
            Err(error) => {
                warn!(
                    error = %crate::error_chain(&error),
                    crd = name,
                    "failed to set the StorageMigrating condition"
                );
                return;
            }
        }
    }
}

async fn set_condition(
    cluster: &Cluster<'_>,
    name: &str,
    migrating: bool,
    by: &str,
) -> Result<(), RequestError> {
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    let (fence, timeout) = (cluster.fence, cluster.request_timeout);
    let mut crd = bounded(fence, timeout, crds.get(name)).await?;
    let status = crd.status.get_or_insert_with(Default::default);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let (state, reason, message) = if migrating {
        (STATUS_TRUE, storage_migrating::MIGRATING, format!("{by} is rewriting every object"))
    } else {
        (STATUS_FALSE, storage_migrating::MIGRATION_DONE, format!("{by} has ended"))
    };
    let unchanged = conditions.iter().any(|c| {
        c.type_ == STORAGE_MIGRATING && c.status == state && c.message.as_deref() == Some(&message)
    });
    if unchanged {
        return Ok(());
    }
    conditions.retain(|c| c.type_ != STORAGE_MIGRATING);
    conditions.push(CustomResourceDefinitionCondition {
        type_: STORAGE_MIGRATING.to_owned(),
        status: state.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message),
        last_transition_time: Some(Time(Timestamp::now())),
        observed_generation: None,
    });
    bounded(fence, timeout, crds.replace_status(name, &PostParams::default(), &crd)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(uid: &str, generation: i64, storage: &str) -> CustomResourceDefinition {
        let versions: Vec<_> = ["v1", "v2"]
            .iter()
            .map(|v| serde_json::json!({ "name": v, "served": true, "storage": *v == storage }))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "widgets.example.com", "uid": uid, "generation": generation },
            "spec": {
                "group": "example.com", "scope": "Cluster",
                "names": { "kind": "Widget", "plural": "widgets" },
                "versions": versions,
            },
        }))
        .expect("a CRD")
    }

    fn target() -> MigrationTarget {
        MigrationTarget {
            storage_version: Some("v2".into()),
            crd_generation: Some(4),
            crd_uid: Some("u1".into()),
            ..MigrationTarget::default()
        }
    }

    #[test]
    fn an_unchanged_crd_is_no_change() {
        assert_eq!(crd_change(&Resource::widgets(), &target(), Some(&crd("u1", 4, "v2"))), None);
        let built_in = MigrationTarget::default();
        assert_eq!(crd_change(&Resource::widgets(), &built_in, None), None, "no CRD behind it");
    }

    #[test]
    fn a_switch_or_any_spec_change_starts_over() {
        let switched = crd_change(&Resource::widgets(), &target(), Some(&crd("u1", 5, "v1")));
        let switched = switched.expect("a change");
        assert!(switched.starts_over());
        assert!(switched.message.contains("from v2 to v1"), "{}", switched.message);
        // v2 -> v1 -> v2: the same storage version, two generations later.
        let back = crd_change(&Resource::widgets(), &target(), Some(&crd("u1", 6, "v2")))
            .expect("a change");
        assert!(back.starts_over());
        assert!(back.message.contains("generation 4 then 6"), "{}", back.message);
    }

    fn built_in_target(confirmed: Option<bool>) -> MigrationTarget {
        MigrationTarget {
            storage_version_hash: Some("A".into()),
            encoding_confirmed: confirmed,
            ..MigrationTarget::default()
        }
    }

    #[test]
    fn only_a_confirmed_built_in_run_samples_discovery_while_it_writes() {
        let resource = Resource::widgets();
        assert!(built_in_check(&resource, &built_in_target(Some(true))).is_some());
        // It proves nothing anyway; the end of the run checks it.
        assert!(built_in_check(&resource, &built_in_target(Some(false))).is_none());
        assert!(built_in_check(&resource, &built_in_target(None)).is_none());
        let no_hash = MigrationTarget { storage_version_hash: None, ..built_in_target(Some(true)) };
        assert!(built_in_check(&resource, &no_hash).is_none());
        // A CRD's run is guarded by its CRD.
        let crd = MigrationTarget { encoding_confirmed: Some(true), ..target() };
        assert!(built_in_check(&resource, &crd).is_none());
    }

    #[test]
    fn another_hash_mid_run_starts_a_built_in_run_over() {
        let resource = Resource::widgets();
        let check = built_in_check(&resource, &built_in_target(Some(true))).expect("sampled");
        assert_eq!(hash_change(&resource, &check, encoding::DuringRun::Target), None);
        let unread = encoding::DuringRun::Unread("connection refused".into());
        assert_eq!(hash_change(&resource, &check, unread), None, "a restart is no flip");
        let other = hash_change(&resource, &check, encoding::DuringRun::Other("B".into()))
            .expect("a change");
        assert!(other.starts_over());
        assert_eq!(other.reason, reasons::STORAGE_VERSION_CHANGED);
        assert!(
            other.message.contains("hash B") && other.message.contains("in A"),
            "{}",
            other.message
        );
    }

    #[test]
    fn a_deleted_or_replaced_crd_ends_the_migration() {
        let gone = crd_change(&Resource::widgets(), &target(), None).expect("a change");
        assert_eq!((gone.reason, gone.starts_over()), (reasons::RESOURCE_NOT_SERVED, false));
        let other = crd_change(&Resource::widgets(), &target(), Some(&crd("u2", 4, "v2")))
            .expect("a change");
        assert!(!other.starts_over());
    }
}
