//! Condition types and reasons written into `StorageVersionMigration.status.conditions`.
//!
//! The three types are upstream's. Exactly one of them is present at a time and it is the first
//! condition, so `.status.conditions[0].type` tells a migration's state.

/// The migration is in progress.
pub const RUNNING: &str = "Running";
/// Every object was migrated.
pub const SUCCEEDED: &str = "Succeeded";
/// The migration could not be completed; the message says why.
pub const FAILED: &str = "Failed";

/// Condition status values, as in `corev1.ConditionStatus`.
pub const STATUS_TRUE: &str = "True";

/// Whether the CRD's `status.storedVersions` was pruned after the migration; when False, the
/// reason and message say why it was left alone.
pub const STORED_VERSIONS_PRUNED: &str = "StoredVersionsPruned";

/// Condition kube-svm sets on a CustomResourceDefinition while one of its migrations runs, as the
/// in-tree migrator does.
pub const STORAGE_MIGRATING: &str = "StorageMigrating";

/// Condition status False.
pub const STATUS_FALSE: &str = "False";
