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

use std::time::Duration;

use kube::Client;

use crate::apiserver::fence::{Fence, RequestError, bounded};

/// Label on the migrations a trigger creates: `crd` or `discovery`.
pub const TRIGGER_LABEL: &str = "kube-svm.io/trigger";

/// A trigger's requests: each inside the leader's term, given at most `timeout`
/// (`--request-timeout`).
#[derive(Clone, Copy)]
pub struct Requests<'a> {
    /// The leader's term: no request is sent once it has ended.
    pub fence: &'a Fence,
    /// Longest time one request may go unanswered (`--request-timeout`).
    pub timeout: Duration,
}

impl Requests<'_> {
    async fn send<T>(
        self,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, RequestError> {
        bounded(self.fence, self.timeout, request).await
    }
}

/// Whether `error` is an answer with HTTP `code`.
fn is_conflict(error: &RequestError) -> bool {
    matches!(error, RequestError::Api(error) if crate::apiserver::answers::is_conflict(error))
}

/// The clients a trigger talks through.
#[derive(Clone)]
pub struct Clients {
    /// For requests: every request has a deadline.
    pub requests: Client,
    /// For watches.
    pub watches: Client,
    /// What the request client was made from, for fresh connections (the encoding check).
    pub config: kube::Config,
}
