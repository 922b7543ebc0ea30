//! What a migration does to the CustomResourceDefinition behind its resource: record what it
//! targets when it starts, mark the CRD `StorageMigrating` while it runs, and prune
//! `storedVersions` afterwards when [`storedversions::decide`] allows it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::warn;

use super::{Context, RequestError, bounded};
use crate::api::conditions::{
    STATUS_FALSE, STATUS_TRUE, STORAGE_MIGRATING, STORED_VERSIONS_PRUNED, storage_migrating,
    stored_versions as reasons,
};
use crate::api::{MigrationCondition, MigrationTarget};
use crate::encoding::{self, Encoding};
use crate::engine::Resource;
use crate::fence::Fence;
use crate::storage_hash::storage_version_hash;
use crate::storedversions::{self, CrdState, Decision, PruneError, Run};

/// Times the prune is decided again after the CRD changed under it.
const PRUNE_CONFLICT_RETRIES: u32 = 5;

/// The name of the CRD that would serve `resource`, if it can be a custom resource.
fn crd_name(resource: &Resource) -> Option<String> {
    (!resource.group.is_empty()).then(|| format!("{}.{}", resource.plural, resource.group))
}

/// The CRD serving `resource`; `None` for built-in and aggregated resources.
pub async fn crd_of(
    context: &Context,
    resource: &Resource,
) -> Result<Option<CustomResourceDefinition>, RequestError> {
    let Some(name) = crd_name(resource) else { return Ok(None) };
    let crds: Api<CustomResourceDefinition> = Api::all(context.client.clone());
    bounded(&context.fence, context.settings.request_timeout, crds.get_opt(&name)).await
}

/// What the migration targets for a CRD-backed resource: the CRD's generation and storage
/// version, and whether the apiservers already encode in it (`vouched` when an operator said
/// so on the migration).
pub async fn target_of(
    context: &Context,
    resource: &Resource,
    crd: &CustomResourceDefinition,
    vouched: bool,
) -> MigrationTarget {
    let mut target = MigrationTarget {
        storage_version_hash: resource.storage_version_hash.clone(),
        ..MigrationTarget::default()
    };
    let Some(state) = CrdState::of(crd) else { return target };
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
                storage_version: state.storage_version.clone(),
                generation: state.generation,
                settle: context.settings.storage_version_settle,
                wait: context.settings.storage_version_wait,
            };
            context.observer.confirm(&context.client, &context.config, &check).await
        }
    };
    let (confirmed, evidence) = match encoding {
        Encoding::Confirmed { by } => (true, format!("confirmed by {by}")),
        Encoding::Unconfirmed(seen) => (false, seen),
    };
    // What the apiservers encode once the check passes: discovery may still lag behind now.
    target.storage_version_hash =
        Some(storage_version_hash(&resource.group, &state.storage_version, &resource.kind));
    target.storage_version = Some(state.storage_version);
    target.crd_generation = Some(state.generation);
    target.encoding_confirmed = Some(confirmed);
    target.encoding_evidence = Some(evidence);
    target
}

/// Decides on `storedVersions` after `run`, prunes when allowed (reading the CRD again and
/// deciding again when it changed under the prune), and returns the condition that says what
/// happened. `None` when the resource is not CRD-backed or nothing was recorded at the start.
pub async fn settle_stored_versions(
    context: &Context,
    resource: &Resource,
    target: &MigrationTarget,
    run: &Run,
) -> Option<MigrationCondition> {
    let (Some(generation), Some(storage_version)) =
        (target.crd_generation, target.storage_version.clone())
    else {
        return None;
    };
    let started = CrdState { generation, storage_version, stored_versions: Vec::new() };
    let encoding = match (target.encoding_confirmed, &target.encoding_evidence) {
        (Some(true), evidence) => Encoding::Confirmed { by: evidence.clone().unwrap_or_default() },
        (_, evidence) => Encoding::Unconfirmed(evidence.clone().unwrap_or_default()),
    };
    let mut last_conflict = String::new();
    for _ in 0..PRUNE_CONFLICT_RETRIES {
        let crd = match crd_of(context, resource).await {
            Ok(Some(crd)) => crd,
            Ok(None) => {
                return Some(condition(
                    false,
                    reasons::CRD_GONE,
                    "the CRD no longer exists".into(),
                ));
            }
            Err(error) => {
                return Some(condition(
                    false,
                    reasons::CRD_UNREADABLE,
                    format!("failed to read the CRD: {}", crate::error_chain(&error)),
                ));
            }
        };
        let Some(now) = CrdState::of(&crd) else {
            return Some(condition(
                false,
                reasons::CRD_CHANGED,
                "the CRD no longer names a storage version".into(),
            ));
        };
        let stored_versions = match storedversions::decide(run, &started, &now, &encoding) {
            Decision::Prune(stored_versions) => stored_versions,
            Decision::AlreadyPruned => {
                return Some(condition(
                    true,
                    reasons::ALREADY_PRUNED,
                    format!("storedVersions already lists only {}", now.storage_version),
                ));
            }
            Decision::Keep(refusal) => {
                return Some(condition(false, refusal.reason(), refusal.to_string()));
            }
        };
        let message =
            format!("storedVersions set to {stored_versions:?} (was {:?})", now.stored_versions);
        let limit = context.fence.deadline(context.settings.request_timeout);
        match storedversions::prune(&context.client, crd, stored_versions, limit).await {
            Ok(()) => return Some(condition(true, reasons::PRUNED, message)),
            Err(PruneError::Conflict) => last_conflict = PruneError::Conflict.to_string(),
            Err(error) => {
                return Some(condition(
                    false,
                    reasons::PRUNE_FAILED,
                    format!("failed to prune storedVersions: {}", crate::error_chain(&error)),
                ));
            }
        }
    }
    Some(condition(
        false,
        reasons::PRUNE_FAILED,
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
        message: Some(message),
    }
}

/// Sets the CRD's `StorageMigrating` condition (True while a migration runs). Best effort: the
/// condition informs, nothing depends on it; failures are logged.
pub async fn mark_migrating(
    context: &Context,
    resource: &Resource,
    migrating: bool,
    migration: &str,
) {
    let Some(name) = crd_name(resource) else { return };
    let client = &context.client;
    // One retry covers a concurrent status write by the apiserver.
    for _ in 0..2 {
        match set_condition(client, &context.fence, context, &name, migrating, migration).await {
            Ok(()) => return,
            Err(RequestError::Api(kube::Error::Api(status))) if status.code == 409 => continue,
            Err(RequestError::Api(kube::Error::Api(status))) if status.code == 404 => return,
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
    client: &Client,
    fence: &Fence,
    context: &Context,
    name: &str,
    migrating: bool,
    migration: &str,
) -> Result<(), RequestError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let timeout = context.settings.request_timeout;
    let mut crd = bounded(fence, timeout, crds.get(name)).await?;
    let status = crd.status.get_or_insert_with(Default::default);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let (state, reason, message) = if migrating {
        (
            STATUS_TRUE,
            storage_migrating::MIGRATING,
            format!("StorageVersionMigration {migration} is rewriting every object"),
        )
    } else {
        (
            STATUS_FALSE,
            storage_migrating::MIGRATION_DONE,
            format!("StorageVersionMigration {migration} has ended"),
        )
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
