//! Automatic migrations: kube-svm creates StorageVersionMigrations on its own when storage
//! versions change.
//!
//! - [`crd`]: when a CRD's `storedVersions` lists more than its storage version.
//! - [`discovery`]: when a resource's storage version hash in discovery is not the only one
//!   its StorageState says objects may be stored under ([`storage_state`] decides).

pub mod crd;
pub mod discovery;
pub mod storage_state;

use std::time::Duration;

use kube::Client;

use crate::fence::Fence;

/// Label on the migrations a trigger creates: `crd` or `discovery`.
pub const TRIGGER_LABEL: &str = "kube-svm.io/trigger";

/// How long one request of a trigger may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a trigger's request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum Unanswered {
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("this process may no longer write: its leadership ended")]
    Fenced,
}

/// Runs `request` inside the leader's term, giving it at most [`REQUEST_TIMEOUT`].
async fn bounded<T>(fence: &Fence, request: impl Future<Output = T>) -> Result<T, Unanswered> {
    let limit = fence.deadline(REQUEST_TIMEOUT).ok_or(Unanswered::Fenced)?;
    tokio::time::timeout(limit, request).await.map_err(|_| Unanswered::TimedOut(limit))
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
