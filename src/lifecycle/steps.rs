//! The requests a migration makes around the engine that are neither a guard nor a prune:
//! whether a CRD's conversion webhook answers; what it targets when it starts, and whether the
//! apiservers already encode in it, kept fresh while it waits for its turn; whether it has
//! anything to write; and marking the CRD `StorageMigrating` while it runs.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, PostParams};
use tracing::warn;

use crate::api::MigrationTarget;
use crate::api::conditions::{STATUS_FALSE, STATUS_TRUE, STORAGE_MIGRATING, storage_migrating};
use crate::apiserver::answers;
use crate::apiserver::requests::RequestError;
use crate::engine::Resource;
use crate::evidence::conversion;
use crate::evidence::encoding::{self};
use crate::rules::crd::CrdState;
use crate::rules::encoding::Encoding;

use super::cluster::{Cluster, crd_name};
use super::target_watch::TargetWatch;

/// Whether the conversion webhook of `crd` (the CRD behind `resource`), if it has one, answers
/// a read of an object that needs converting ([`conversion::preflight`]).
pub async fn conversion_preflight(
    cluster: &Cluster<'_>,
    resource: &Resource,
    crd: &CustomResourceDefinition,
) -> Result<(), conversion::Unavailable> {
    let (client, timeout) = (cluster.requests.client(), cluster.requests.timeout());
    conversion::preflight(client, crd, Some(&resource.version), timeout).await
}

/// Why a resource's encoding cannot be checked.
pub enum Unchecked {
    /// A CRD names no storage version: there is nothing to check it against.
    CrdWithoutStorage,
    /// Discovery publishes no storage version hash for a built-in resource.
    NoHash,
}

/// The encoding check a migration of `resource` (served by `crd`, if a CRD serves it) needs: a
/// CRD's storage version, or the storage version hash discovery published for a built-in one.
pub fn encoding_check(
    cluster: &Cluster<'_>,
    resource: &Resource,
    crd: Option<&CustomResourceDefinition>,
) -> Result<encoding::Check, Unchecked> {
    let state = crd.and_then(CrdState::of);
    let expected = match (&state, &resource.storage_version_hash) {
        (Some(state), _) => encoding::Expected::StorageVersion(state.storage_version.clone()),
        (None, Some(hash)) => {
            encoding::Expected::Hash { hash: hash.clone(), served: resource.version.clone() }
        }
        (None, None) if crd.is_some() => return Err(Unchecked::CrdWithoutStorage),
        (None, None) => return Err(Unchecked::NoHash),
    };
    let generation = state.as_ref().map_or(0, |s| s.generation);
    let (group, plural, kind) = (&resource.group, &resource.plural, &resource.kind);
    Ok(encoding::Check::new(group, plural, kind, expected, generation, cluster.encoding))
}

/// What the migration targets, and whether the apiservers already encode in it (`vouched` when
/// an operator said so on the migration). For a CRD-backed resource: the CRD's generation, uid
/// and storage version, as `watch` followed it through the encoding check. For a built-in
/// resource: the storage version hash discovery publishes, which every apiserver must publish
/// too (during a rolling upgrade, two releases publish two).
pub async fn target_of(
    cluster: &Cluster<'_>,
    resource: &Resource,
    crd: Option<&CustomResourceDefinition>,
    vouched: bool,
    watch: &mut TargetWatch,
) -> MigrationTarget {
    let mut target = MigrationTarget {
        storage_version_hash: resource.storage_version_hash.clone(),
        ..MigrationTarget::default()
    };
    let state = crd.and_then(CrdState::of);
    let check = match encoding_check(cluster, resource, crd) {
        Ok(check) => check,
        Err(Unchecked::CrdWithoutStorage) => return target,
        Err(Unchecked::NoHash) => {
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
            let confirming = cluster.observer.confirm(cluster.requests, &check);
            // A CRD whose storage changes during the check makes its verdict moot: no need to
            // wait it out. Other changes to it are followed, and the target records the last.
            match &state {
                Some(_) => tokio::select! {
                    encoding = confirming => encoding,
                    moved = watch.next_change(cluster) => {
                        Encoding::Unconfirmed(format!("{moved} during the encoding check"))
                    }
                },
                None => confirming.await,
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
        target.storage_version_hash = Some(check.expected_hash());
        target.storage_version = Some(state.storage_version);
        target.crd_generation = Some(state.generation);
        target.crd_uid = state.uid;
        watch.record_into(&mut target);
    }
    target
}

/// Keeps the confirmation that the apiservers encode in `target` fresh while the migration of
/// `resource` waits for its turn to write, from the encoding checks' shared samples, so that the
/// turn writes at once. Never ends: it is raced with the wait.
pub async fn keep_fresh(
    cluster: &Cluster<'_>,
    resource: &Resource,
    crd: Option<&CustomResourceDefinition>,
    target: &MigrationTarget,
) -> std::convert::Infallible {
    if target.encoding_confirmed == Some(true)
        && let Ok(check) = encoding_check(cluster, resource, crd)
    {
        cluster.observer.keep_fresh(cluster.requests, &check).await;
    }
    std::future::pending().await
}

/// Whether nothing of `resource` is stored: a list of at most one object's metadata (as the
/// engine's pages are read: no Secret's data) finds none. `false` when the list fails or its
/// answer is not a list: the run finds out. Nothing is proved by it: the run lists every page
/// all the same, and an answer misread only costs a turn or spares one.
pub async fn stores_nothing(cluster: &Cluster<'_>, resource: &Resource) -> bool {
    let params = ListParams::default().limit(1);
    let request = kube::core::Request::new(resource.collection_path()).list_metadata(&params);
    let Ok(request) = request else { return false };
    let listed = cluster.requests.client().request::<serde_json::Value>(request);
    match cluster.requests.send(listed).await {
        Ok(list) => lists_nothing(&list),
        Err(_) => false,
    }
}

/// Whether `list` is a list with no item: `items` empty, or `null` (as a metadata-only list of
/// nothing is sent). Pure.
fn lists_nothing(list: &serde_json::Value) -> bool {
    let is_list = list.get("kind").and_then(|k| k.as_str()).is_some_and(|k| k.ends_with("List"));
    match list.get("items") {
        Some(serde_json::Value::Array(items)) => is_list && items.is_empty(),
        Some(serde_json::Value::Null) => is_list,
        _ => false,
    }
}

/// Sets the CRD's `StorageMigrating` condition: True with `migrating`'s reason while a
/// migration runs, False once `None`. Best effort: the condition informs (and holds the
/// controller back while `kube-svm migrate` writes); failures are logged. `by` names who
/// migrates, for the condition's message (`StorageVersionMigration NAME`).
pub async fn mark_migrating(
    cluster: &Cluster<'_>,
    resource: &Resource,
    migrating: Option<&'static str>,
    by: &str,
) {
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
    migrating: Option<&'static str>,
    by: &str,
) -> Result<(), RequestError> {
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.requests.client().clone());
    let mut crd = cluster.requests.send(crds.get(name)).await?;
    let status = crd.status.get_or_insert_with(Default::default);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let (state, reason, message) = match migrating {
        Some(reason) => (STATUS_TRUE, reason, format!("{by} is rewriting every object")),
        None => (STATUS_FALSE, storage_migrating::MIGRATION_DONE, format!("{by} has ended")),
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
    cluster.requests.send(crds.replace_status(name, &PostParams::default(), &crd)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_a_list_without_items_lists_nothing() {
        let kind = "PartialObjectMetadataList";
        assert!(lists_nothing(&json!({ "kind": kind, "items": [] })));
        assert!(lists_nothing(&json!({ "kind": kind, "items": null })));
        assert!(!lists_nothing(&json!({ "kind": kind, "items": [{ "metadata": {} }] })));
        assert!(!lists_nothing(&json!({ "kind": kind })), "no items: not known to be empty");
        assert!(!lists_nothing(&json!({ "kind": "Status", "items": [] })), "not a list");
    }
}
