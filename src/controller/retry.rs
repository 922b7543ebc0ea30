//! Running a Failed migration again in place, once per value of its retry annotation
//! ([`RETRY_ANNOTATION`]). One conditional status write clears the outcome and records the
//! token, so a restarted or resynced controller, or a second look at a stale copy, never runs it
//! again; an Event then keeps the outcome that was cleared. The migration is then taken up as a
//! new one is, through the same lifecycle, from the first object.

use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use tracing::{debug, info};

use super::Context;
use super::migration::publish;
use crate::api::conditions::events;
use crate::api::{RETRY_ANNOTATION, StorageVersionMigration};
use crate::apiserver::requests::RequestError;
use crate::lifecycle::status;

/// Why a retry could not be started this time; it is decided again later.
#[derive(Debug, thiserror::Error)]
#[error("failed to clear the status of migration {0} for its retry")]
pub struct Error(String, #[source] RequestError);

/// Acts on the retry `token` of the Failed `migration`: clears its status, recording the token
/// and counting the retry, then says what was cleared.
pub(super) async fn retry(
    context: &Context,
    migration: &StorageVersionMigration,
    token: &str,
) -> Result<Action, Error> {
    let name = migration.name_any();
    if context.running().contains_key(&name) {
        // The task that failed it is still ending; it asks for a new look when it has.
        return Ok(Action::await_change());
    }
    let previous = migration.status.as_ref();
    let note = status::retry_note(previous, token);
    let mut cleared = StorageVersionMigration::new(&name, migration.spec.clone());
    // Conditional on the version read: whoever changed it since decides again on the new one.
    cleared.metadata.resource_version = migration.resource_version();
    cleared.status = Some(status::retried(previous, token));
    let api: Api<StorageVersionMigration> = Api::all(context.requests.client().clone());
    let params = PostParams::default();
    let write = api.replace_status(&name, &params, &cleared);
    match context.requests.send(write).await {
        Ok(_) => {}
        Err(RequestError::Api(error)) if crate::apiserver::answers::is_conflict(&error) => {
            debug!(token, "the migration changed since it was read; deciding again");
            return Ok(Action::await_change());
        }
        Err(error) => return Err(Error(name, error)),
    }
    info!(
        annotation = RETRY_ANNOTATION,
        token,
        previous = note,
        "running the failed migration again"
    );
    publish(context, migration, EventType::Normal, events::RETRIED, note).await;
    Ok(Action::await_change())
}
