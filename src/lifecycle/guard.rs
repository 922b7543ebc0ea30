//! Whether what a run targets still holds: the CRD is watched while the run writes ([`guard`])
//! and read again at the end ([`changed_since_start`]); only a change that can affect what is
//! stored counts ([`super::crd_watch`]). Built-in runs sample discovery's storage version hash
//! instead.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::api::{GroupVersionResource, MigrationTarget};
use crate::engine::{ResolveError, Resource};
use crate::evidence::encoding;
use crate::rules::crd::{CrdChange, CrdState};

use super::change::{Change, Unseen};
use super::cluster::{Cluster, crd_of};
use super::crd_watch::{self, Followed};

/// Tries, a second apart, to read discovery again when verifying the end of a run.
const VERIFY_ATTEMPTS: u32 = 5;

/// How often a running migration of a CRD-backed resource reads its CRD to see whether its
/// target still holds. Objects written through the old target meanwhile are written again by
/// the run that starts over, so this bounds wasted work, not safety.
const GUARD_INTERVAL: Duration = Duration::from_secs(2);

/// What changed about a CRD-backed `resource`'s CRD (`now`, `None` when deleted) since `target`
/// was recorded: deleted, replaced, its storage version switched, or its generation moved (any
/// spec change; a storage switch there and back leaves the same storage version and a newer
/// generation). `None` when nothing changed or the resource is not CRD-backed. Pure.
pub fn crd_change(
    resource: &Resource,
    target: &MigrationTarget,
    now: Option<&CustomResourceDefinition>,
) -> Option<Change> {
    let recorded = CrdState::recorded(target)?;
    let now = now.map(CrdState::read);
    // A target recorded without the uid is left to the prune's own check, which refuses it.
    let resource = resource.to_string();
    Some(match CrdChange::between(&recorded, now.as_ref())? {
        CrdChange::Deleted => Change::Deleted { resource },
        CrdChange::Replaced => Change::Replaced { resource },
        CrdChange::StorageSwitched { from, to } => {
            Change::StorageSwitched { resource, from, to, generation: None }
        }
        CrdChange::Edited { from, to } => {
            Change::Edited { resource, from, to, unseen: Unseen::Polled }
        }
    })
}

/// Resolves once the CRD behind `resource` is no longer at the generation (or uid) of `state`,
/// reading it every [`GUARD_INTERVAL`]; says how it moved.
pub(super) async fn crd_moves(
    cluster: &Cluster<'_>,
    resource: &Resource,
    state: &CrdState,
) -> String {
    loop {
        tokio::time::sleep(GUARD_INTERVAL).await;
        let Ok(crd) = crd_of(cluster, resource).await else { continue };
        let now = crd.as_ref().map(CrdState::read);
        // Any change at all: the check was for the CRD as it was.
        if let Some(change) = CrdChange::between(state, now.as_ref()) {
            return format!("the CRD of {resource} changed during the encoding check ({change})");
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
        let seen = encoding::sample_during_run(cluster.requests, &check).await;
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
    Some(hash_check(resource, target.storage_version_hash.clone()?))
}

/// One look at the hash discovery publishes for a built-in `resource`, read at the version it
/// is served at, against `hash`: no settle, no wait.
fn hash_check(resource: &Resource, hash: String) -> encoding::Check {
    encoding::Check {
        group: resource.group.clone(),
        plural: resource.plural.clone(),
        kind: resource.kind.clone(),
        expected: encoding::Expected::Hash { hash, served: resource.version.clone() },
        generation: 0,
        policy: encoding::EncodingPolicy::AT_ONCE,
    }
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
    Some(Change::OtherHash { resource: resource.to_string(), target: hash.clone(), seen: other })
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
        match Resource::resolve(cluster.requests.client(), spec, requires_status).await {
            Ok(now) => break now,
            Err(error) if error.is_transient() && attempts + 1 < VERIFY_ATTEMPTS => {
                attempts += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(error @ ResolveError::Discovery(..)) => {
                let why = crate::error_chain(&error);
                return Some(Change::DiscoveryUnreadable { resource: resource.to_string(), why });
            }
            Err(error) => {
                let why = crate::error_chain(&error);
                return Some(Change::NotServed { resource: resource.to_string(), why });
            }
        }
    };
    // For a CRD the CRD itself says (below); discovery may lag behind it. For a built-in
    // resource every apiserver must still publish the hash the run targeted: sampled again.
    if target.crd_generation.is_none() {
        let hash = target.storage_version_hash.clone()?;
        let check = hash_check(&now, hash.clone());
        return match encoding::at_end(cluster.requests, &check).await {
            encoding::AtEnd::Same => None,
            encoding::AtEnd::Moved(to) => {
                Some(Change::HashMoved { resource: resource.to_string(), from: hash, to })
            }
            encoding::AtEnd::Mixed(seen) => {
                Some(Change::ApiserversDisagree { resource: resource.to_string(), hash, seen })
            }
        };
    }
    match crd_of(cluster, resource).await {
        Ok(Some(crd)) if followed.is_some() => {
            let followed = followed?;
            followed.catch_up(cluster, resource, &crd).await
        }
        Ok(crd) => crd_change(resource, target, crd.as_ref()),
        Err(error) => {
            let why = crate::error_chain(&error);
            Some(Change::CrdUnreadable { resource: resource.to_string(), why })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::reasons;

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
        assert!(switched.to_string().contains("from v2 to v1"), "{switched}");
        // v2 -> v1 -> v2: the same storage version, two generations later.
        let back = crd_change(&Resource::widgets(), &target(), Some(&crd("u1", 6, "v2")))
            .expect("a change");
        assert!(back.starts_over());
        assert!(back.to_string().contains("generation 4 then 6"), "{back}");
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
        assert_eq!(other.reason(), reasons::STORAGE_VERSION_CHANGED);
        let message = other.to_string();
        assert!(message.contains("hash B") && message.contains("in A"), "{message}");
    }

    #[test]
    fn a_deleted_or_replaced_crd_ends_the_migration() {
        let gone = crd_change(&Resource::widgets(), &target(), None).expect("a change");
        assert_eq!((gone.reason(), gone.starts_over()), (reasons::RESOURCE_NOT_SERVED, false));
        let other = crd_change(&Resource::widgets(), &target(), Some(&crd("u2", 4, "v2")))
            .expect("a change");
        assert!(!other.starts_over());
    }
}
