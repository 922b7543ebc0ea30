//! Automatic migrations: kube-svm creates StorageVersionMigrations on its own when storage
//! versions change.
//!
//! - [`crd`]: when a CRD's `storedVersions` lists more than its storage version.
//! - [`discovery`]: when a resource's storage version hash in discovery is not the only one
//!   its StorageState says objects may be stored under ([`storage_state`] decides); it keeps
//!   only its newest finished migrations of each resource ([`history`]).

pub mod crd;
pub mod discovery;
pub mod history;
pub mod storage_state;

pub use crate::api::TRIGGER_LABEL;
use crate::apiserver::requests::RequestError;

/// Whether `error` is an answer with HTTP `code`.
fn is_conflict(error: &RequestError) -> bool {
    matches!(error, RequestError::Api(error) if crate::apiserver::answers::is_conflict(error))
}
