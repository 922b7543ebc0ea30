//! The prune of a CRD's `status.storedVersions`, once [`crate::rules::stored_versions::decide`]
//! allows it: a conditional write of the CRD as read.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client};

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
    client: &Client,
    mut crd: CustomResourceDefinition,
    stored_versions: Vec<String>,
    limit: Option<Duration>,
) -> Result<(), PruneError> {
    let limit = limit.ok_or(PruneError::Fenced)?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    crd.status.get_or_insert_with(Default::default).stored_versions = Some(stored_versions);
    match tokio::time::timeout(limit, api.replace_status(&name, &PostParams::default(), &crd)).await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) if crate::apiserver::answers::is_conflict(&error) => {
            Err(PruneError::Conflict)
        }
        Ok(Err(error)) => Err(PruneError::Write(error)),
        Err(_) => Err(PruneError::TimedOut(limit)),
    }
}
