//! Settling a CRD's `status.storedVersions` after a run: what
//! [`crate::rules::stored_versions::decide`] allows, written as a conditional write of the CRD as
//! read (decided again when the CRD changed under it), and the condition that says what happened.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;

use crate::api::conditions::{STATUS_FALSE, STATUS_TRUE, STORED_VERSIONS_PRUNED, stored_versions};
use crate::api::{MigrationCondition, MigrationTarget};
use crate::apiserver::requests::{RequestError, Requests};
use crate::engine::Resource;
use crate::rules::crd::CrdState;
use crate::rules::encoding::Encoding;
use crate::rules::stored_versions::{Decision, Run, decide};

use super::cluster::{Cluster, crd_of};
use super::target_watch::TargetWatch;

/// Why the prune could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    /// The CRD changed since it was read (409): read it again and decide again.
    #[error("the CRD changed since it was read")]
    Conflict,
    /// The apiserver did not answer within the limit given.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// No write was sent: this process's leadership ended, so it may no longer write.
    #[error("this process may no longer write: its leadership ended")]
    Fenced,
    /// The write failed otherwise: the apiserver refused it or could not be reached.
    #[error("failed to write the CRD's status")]
    Write(#[source] kube::Error),
}

/// Sets `storedVersions` on `crd` as read, within `limit`, so the write fails with
/// [`PruneError::Conflict`] if the CRD changed since: the caller reads it again and decides again.
pub async fn prune(
    requests: &Requests,
    mut crd: CustomResourceDefinition,
    stored_versions: Vec<String>,
) -> Result<(), PruneError> {
    let api: Api<CustomResourceDefinition> = Api::all(requests.client().clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    crd.status.get_or_insert_with(Default::default).stored_versions = Some(stored_versions);
    match requests.send(api.replace_status(&name, &PostParams::default(), &crd)).await {
        Ok(_) => Ok(()),
        Err(RequestError::Api(error)) if crate::apiserver::answers::is_conflict(&error) => {
            Err(PruneError::Conflict)
        }
        Err(RequestError::Api(error)) => Err(PruneError::Write(error)),
        Err(RequestError::TimedOut(limit)) => Err(PruneError::TimedOut(limit)),
        Err(RequestError::Fenced) => Err(PruneError::Fenced),
    }
}

/// Times the prune is decided again after the CRD changed under it.
const PRUNE_CONFLICT_RETRIES: u32 = 5;

/// Decides on `storedVersions` after `run`, prunes when allowed (reading the CRD again and
/// deciding again when it changed under the prune), and returns the condition that says what
/// happened. `None` when the resource is not CRD-backed or nothing was recorded at the start.
pub async fn settle_stored_versions(
    cluster: &Cluster<'_>,
    resource: &Resource,
    target: &MigrationTarget,
    run: &Run,
    watch: &mut TargetWatch,
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
        match watch.caught_up(cluster, &crd).await {
            Ok(Some(generation)) => started.generation = generation,
            Ok(None) => {}
            Err(change) => {
                return Some(condition(false, stored_versions::CRD_CHANGED, change.to_string()));
            }
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
        match prune(cluster.requests, crd, stored_versions).await {
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
