//! Automatic migrations: kube-svm creates StorageVersionMigrations on its own when storage
//! versions change.
//!
//! - [`crd`]: when a CRD's `storedVersions` lists more than its storage version.

pub mod crd;
