//! Automatic migrations: kube-svm creates StorageVersionMigrations on its own when storage
//! versions change.
//!
//! - [`crd`]: when a CRD's `storedVersions` lists more than its storage version.

pub mod crd;

use kube::Client;

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
