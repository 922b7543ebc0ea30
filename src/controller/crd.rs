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

use crate::api::MigrationCondition;
use crate::api::MigrationTarget;
use crate::api::conditions::{
    STATUS_FALSE, STATUS_TRUE, STORAGE_MIGRATING, STORED_VERSIONS_PRUNED,
};
use crate::engine::Resource;
use crate::storedversions::{self, CrdState, Decision, Encoding};

/// The CRD serving `resource`, if it is a custom resource.
pub async fn crd_of(
    client: &Client,
    resource: &Resource,
) -> Result<Option<CustomResourceDefinition>, kube::Error> {
    if resource.group.is_empty() {
        return Ok(None);
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.get_opt(&format!("{}.{}", resource.plural, resource.group)).await
}

/// Records the CRD's generation and storage version in `target`, and whether the apiservers
/// already encode in it.
pub async fn record_target(
    client: &Client,
    resource: &Resource,
    crd: &CustomResourceDefinition,
    settle: std::time::Duration,
    target: &mut MigrationTarget,
) {
    let Some(state) = CrdState::of(crd) else { return };
    let encoding = storedversions::confirm_encoding(
        client,
        &resource.group,
        &resource.plural,
        &resource.kind,
        &state.storage_version,
        settle,
    )
    .await;
    let (confirmed, evidence) = match encoding {
        Encoding::Confirmed { by } => (true, format!("confirmed by {by}")),
        Encoding::Unconfirmed(seen) => (false, seen),
    };
    target.storage_version = Some(state.storage_version);
    target.crd_generation = Some(state.generation);
    target.encoding_confirmed = Some(confirmed);
    target.encoding_evidence = Some(evidence);
}

/// Decides on `storedVersions` after a completed migration, prunes when allowed, and returns the
/// condition that says what happened.
pub async fn settle_stored_versions(
    client: &Client,
    resource: &Resource,
    target: &MigrationTarget,
    failed: u64,
) -> Option<MigrationCondition> {
    let (Some(generation), Some(storage_version)) =
        (target.crd_generation, target.storage_version.clone())
    else {
        return None;
    };
    let started = CrdState { generation, storage_version, stored_versions: Vec::new() };
    let encoding = match (target.encoding_confirmed, &target.encoding_evidence) {
        (Some(true), _) => Encoding::Confirmed { by: "the recorded evidence" },
        (_, evidence) => Encoding::Unconfirmed(evidence.clone().unwrap_or_default()),
    };
    let crd = match crd_of(client, resource).await {
        Ok(Some(crd)) => crd,
        Ok(None) => return Some(condition(false, "CRDGone", "the CRD no longer exists".into())),
        Err(error) => {
            return Some(condition(
                false,
                "CRDUnreadable",
                format!("failed to read the CRD: {error}"),
            ));
        }
    };
    let now = CrdState::of(&crd)?;
    Some(match storedversions::decide(failed, &started, &now, &encoding) {
        Decision::Prune(stored_versions) => {
            let message = format!(
                "storedVersions set to {stored_versions:?} (was {:?})",
                now.stored_versions
            );
            match storedversions::prune(client, crd, stored_versions).await {
                Ok(()) => condition(true, "Pruned", message),
                Err(error) => condition(
                    false,
                    "PruneFailed",
                    format!("failed to prune storedVersions: {error}"),
                ),
            }
        }
        Decision::AlreadyPruned => condition(
            true,
            "AlreadyPruned",
            format!("storedVersions already lists only {}", now.storage_version),
        ),
        Decision::Keep(refusal) => condition(false, refusal.reason(), refusal.to_string()),
    })
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
/// condition informs, nothing depends on it.
pub async fn mark_migrating(
    client: &Client,
    resource: &Resource,
    migrating: bool,
    migration: &str,
) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = format!("{}.{}", resource.plural, resource.group);
    // One retry covers a concurrent status write by the apiserver.
    for _ in 0..2 {
        let Ok(Some(mut crd)) = crds.get_opt(&name).await else { return };
        let status = crd.status.get_or_insert_with(Default::default);
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != STORAGE_MIGRATING);
        let (state, reason, message) = if migrating {
            (
                STATUS_TRUE,
                "Migrating",
                format!("StorageVersionMigration {migration} is rewriting every object"),
            )
        } else {
            (
                STATUS_FALSE,
                "MigrationDone",
                format!("StorageVersionMigration {migration} has finished"),
            )
        };
        conditions.push(CustomResourceDefinitionCondition {
            type_: STORAGE_MIGRATING.to_owned(),
            status: state.to_owned(),
            reason: Some(reason.to_owned()),
            message: Some(message),
            last_transition_time: Some(Time(Timestamp::now())),
            observed_generation: None,
        });
        match crds.replace_status(&name, &PostParams::default(), &crd).await {
            Ok(_) => return,
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => {
                warn!(%error, crd = name, "failed to set the StorageMigrating condition");
                return;
            }
        }
    }
}
