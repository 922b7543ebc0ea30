//! The vocabulary kube-svm writes: condition types, their reasons, Event reasons, and the phase a
//! migration is in. Every part of kube-svm that reads or writes these uses the names here.
//!
//! The three state types are upstream's. Exactly one of them is present at a time and it is the
//! first condition, so `.status.conditions[0].type` tells a migration's state.

use super::StorageVersionMigration;

/// The migration is in progress.
pub const RUNNING: &str = "Running";
/// Every object was migrated.
pub const SUCCEEDED: &str = "Succeeded";
/// The migration could not be completed; the message says why.
pub const FAILED: &str = "Failed";

/// Condition status True, as in `corev1.ConditionStatus`.
pub const STATUS_TRUE: &str = "True";
/// Condition status False.
pub const STATUS_FALSE: &str = "False";

/// Whether the CRD's `status.storedVersions` was pruned after the migration; when False, the
/// reason and message say why it was left alone.
pub const STORED_VERSIONS_PRUNED: &str = "StoredVersionsPruned";

/// Condition kube-svm sets on a CustomResourceDefinition while one of its migrations runs, as the
/// in-tree migrator does.
pub const STORAGE_MIGRATING: &str = "StorageMigrating";

/// Reasons of the Running, Succeeded and Failed conditions.
pub mod reasons {
    /// The migration started (or resumed) migrating objects.
    pub const MIGRATING: &str = "Migrating";
    /// Every object was migrated.
    pub const COMPLETED: &str = "Completed";
    /// Some objects could not be migrated.
    pub const OBJECTS_FAILED: &str = "ObjectsFailed";
    /// The resource cannot be migrated (unknown, subresource, missing verbs).
    pub const INVALID_RESOURCE: &str = "InvalidResource";
    /// Discovery or the CRD behind the resource could not be read, again and again.
    pub const DISCOVERY_FAILED: &str = "DiscoveryFailed";
    /// Listing the resource failed for good.
    pub const LIST_FAILED: &str = "ListFailed";
    /// The resource stopped being served while the migration ran (its version or CRD removed).
    pub const RESOURCE_NOT_SERVED: &str = "ResourceNotServed";
    /// The storage version changed while the migration ran: objects written before the change
    /// are stored in the old one.
    pub const STORAGE_VERSION_CHANGED: &str = "StorageVersionChanged";
    /// A version whose `managedFields` entries the run was cleaning is served again: the run
    /// starts over keeping them.
    pub const VERSION_SERVED_AGAIN: &str = "VersionServedAgain";
    /// The apiserver stayed unreachable longer than the migration may wait for it.
    pub const APISERVER_UNAVAILABLE: &str = "ApiserverUnavailable";
    /// etcd was restored, or the apiservers restarted, again and again while the migration
    /// wrote: what it wrote may have been undone each time.
    pub const CLUSTER_CHANGED: &str = "ClusterChanged";
    /// Object after object failed, none succeeding (an admission webhook that refuses or never
    /// answers): the migration stopped early instead of holding its slot for hours.
    pub const WRITES_FAILING: &str = "WritesFailing";
    /// The CRD's conversion webhook failed a read through a version that needs it, again and
    /// again, before the first write: every write would have failed the same way.
    pub const CONVERSION_WEBHOOK_UNAVAILABLE: &str = "ConversionWebhookUnavailable";
}

/// Reasons of the StoredVersionsPruned condition (and of the stored-versions metric).
pub mod stored_versions {
    /// `storedVersions` was set to the storage version alone.
    pub const PRUNED: &str = "Pruned";
    /// `storedVersions` already listed the storage version alone.
    pub const ALREADY_PRUNED: &str = "AlreadyPruned";
    /// Objects failed, so some may still be stored in older versions.
    pub const MIGRATION_FAILED: &str = "MigrationFailed";
    /// The CRD's generation changed while the migration ran.
    pub const CRD_CHANGED: &str = "CRDChanged";
    /// The CRD's storage version changed while the migration ran.
    pub const STORAGE_VERSION_CHANGED: &str = "StorageVersionChanged";
    /// The apiservers were not proven to encode in the storage version before the first write.
    pub const ENCODING_UNCONFIRMED: &str = "EncodingUnconfirmed";
    /// `storedVersions` does not list the storage version: something else edited it.
    pub const STORAGE_VERSION_NOT_STORED: &str = "StorageVersionNotStored";
    /// The migration began at a continue token another migrator wrote: objects before it were
    /// never written by kube-svm.
    pub const PARTIAL_LISTING: &str = "PartialListing";
    /// The CRD was deleted.
    pub const CRD_GONE: &str = "CRDGone";
    /// The CRD could not be read.
    pub const CRD_UNREADABLE: &str = "CRDUnreadable";
    /// The prune was refused or kept conflicting with other writers.
    pub const PRUNE_FAILED: &str = "PruneFailed";
}

/// Reasons of the StorageMigrating condition on a CRD.
pub mod storage_migrating {
    /// A migration of the CRD's resource is running.
    pub const MIGRATING: &str = "Migrating";
    /// `kube-svm migrate` is migrating the CRD's resource: the controller waits for it.
    pub const MIGRATING_BY_HAND: &str = "MigratingByHand";
    /// The migration ended (or was deleted).
    pub const MIGRATION_DONE: &str = "MigrationDone";
}

/// Reasons of the Events kube-svm publishes on a migration.
pub mod events {
    /// The migration started, from the first object or from `spec.continueToken`.
    pub const STARTED: &str = "Started";
    /// The migration went on from its checkpoint, as after kube-svm restarted mid-run.
    pub const RESUMED: &str = "Resumed";
    /// The migration started again from the first object: its target changed, or it had no
    /// checkpoint to resume from.
    pub const RESTARTED: &str = "Restarted";
    /// Every object was migrated.
    pub const SUCCEEDED: &str = "Succeeded";
    /// The migration failed; the note says why.
    pub const FAILED: &str = "Failed";
    /// A Failed migration is run again in place (annotation `kube-svm.io/retry`); the note keeps
    /// the outcome the retry cleared.
    pub const RETRIED: &str = "Retried";
    /// The CRD's `storedVersions` was pruned to the storage version.
    pub const STORED_VERSIONS_PRUNED: &str = "StoredVersionsPruned";
    /// The CRD's `storedVersions` was left alone; the note says why.
    pub const STORED_VERSIONS_KEPT: &str = "StoredVersionsKept";
    /// Discovery could not be read; the migration is retried later.
    pub const DISCOVERY_RETRY: &str = "DiscoveryRetry";
    /// The encoding check was skipped because an operator said so on the migration.
    pub const ENCODING_OVERRIDDEN: &str = "EncodingOverridden";
    /// The encoding could not be confirmed; the migration runs, storedVersions will be kept.
    pub const ENCODING_UNCONFIRMED: &str = "EncodingUnconfirmed";
    /// The apiserver was unreachable; the migration waited for it.
    pub const APISERVER_UNAVAILABLE: &str = "ApiserverUnavailable";
    /// The in-tree migrator is migrating the same resource; the migration waits for it.
    pub const WAITING_FOR_IN_TREE: &str = "WaitingForInTreeMigrator";
    /// The migration waits for `kube-svm migrate`, which is migrating the same resource.
    pub const WAITING_FOR_MIGRATE: &str = "WaitingForKubeSvmMigrate";
    /// On one of kube-svm's own CRDs, not a migration: the installed CRD is someone else's
    /// (kube-storage-version-migrator's) and would drop fields kube-svm writes.
    pub const INCOMPATIBLE_SCHEMA: &str = "IncompatibleSchema";
}

/// Which of the three states a migration is in, from its first condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Phase {
    /// Not picked up yet.
    New,
    /// Migrating objects.
    Running,
    /// Every object was migrated.
    Succeeded,
    /// Stopped without migrating every object.
    Failed,
}

impl Phase {
    /// The phase `migration` is in, read from its first condition.
    pub fn of(migration: &StorageVersionMigration) -> Phase {
        let first = migration.status.as_ref().and_then(|status| status.conditions.first());
        match first.filter(|c| c.status == STATUS_TRUE).map(|c| c.type_.as_str()) {
            Some(RUNNING) => Phase::Running,
            Some(SUCCEEDED) => Phase::Succeeded,
            Some(FAILED) => Phase::Failed,
            _ => Phase::New,
        }
    }

    /// Whether the migration has ended and will not run again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }

    /// As tables and JSON name it: `New`, `Running`, `Succeeded`, `Failed`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::New => "New",
            Phase::Running => RUNNING,
            Phase::Succeeded => SUCCEEDED,
            Phase::Failed => FAILED,
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
