//! Pruning a CRD's `status.storedVersions` after a migration: the decision (pure; the lifecycle
//! writes it, [`crate::lifecycle::prune`]).
//!
//! Removing a version from `storedVersions` is only safe once no object in etcd is still encoded
//! in it. kube-svm proves that before pruning: the migration succeeded with no failed object,
//! having listed the resource from its first object; the CRD's generation and storage version did
//! not change while it ran; and before its first write, the apiservers were already encoding in
//! the storage version ([`crate::evidence::encoding`]). Anything less and the list stays as it is, with the
//! reason said.

use std::fmt;

use super::crd::{CrdChange, CrdState};
use super::encoding::Encoding;
use crate::api::conditions::stored_versions as reasons;

/// What a migration established, as far as pruning is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// Whether it ended Succeeded.
    pub succeeded: bool,
    /// Objects that could not be migrated.
    pub failed: u64,
    /// Whether it listed the resource from its first object.
    pub listed_from_start: bool,
}

/// What to do with `storedVersions`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Set `storedVersions` to exactly this.
    Prune(Vec<String>),
    /// It already lists the storage version alone.
    AlreadyPruned,
    /// Leave it alone, for this reason.
    Keep(Refusal),
}

/// Why `storedVersions` is left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The migration did not succeed, or left objects unmigrated.
    MigrationFailed {
        /// Objects that could not be migrated; 0 when the migration failed otherwise.
        failed: u64,
    },
    /// The migration did not list the resource from its first object (it began at another
    /// migrator's continue token), so earlier objects were never written.
    PartialListing,
    /// The CRD's generation moved while the migration ran: its versions may have changed.
    GenerationChanged {
        /// The generation when the migration started.
        started: i64,
        /// The generation now.
        now: i64,
    },
    /// The CRD's uid differs from the one recorded at the start, or none was recorded.
    CrdReplaced,
    /// The CRD's storage version changed while the migration ran.
    StorageVersionChanged {
        /// The storage version when the migration started.
        started: String,
        /// The storage version now.
        now: String,
    },
    /// The apiservers were not shown to encode in the storage version before the first write;
    /// holds what was seen instead.
    EncodingUnconfirmed(String),
    /// `storedVersions` does not list the storage version, named here.
    StorageVersionNotStored(String),
}

impl Refusal {
    /// A machine-readable reason, for conditions, events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::MigrationFailed { .. } => reasons::MIGRATION_FAILED,
            Refusal::PartialListing => reasons::PARTIAL_LISTING,
            Refusal::GenerationChanged { .. } | Refusal::CrdReplaced => reasons::CRD_CHANGED,
            Refusal::StorageVersionChanged { .. } => reasons::STORAGE_VERSION_CHANGED,
            Refusal::EncodingUnconfirmed(_) => reasons::ENCODING_UNCONFIRMED,
            Refusal::StorageVersionNotStored(_) => reasons::STORAGE_VERSION_NOT_STORED,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::MigrationFailed { failed: 0 } => {
                write!(
                    f,
                    "the migration did not succeed, so objects may still be stored in older versions"
                )
            }
            Refusal::MigrationFailed { failed } => {
                write!(
                    f,
                    "{failed} objects could not be migrated and may still be stored in older versions"
                )
            }
            Refusal::PartialListing => write!(
                f,
                "the migration began at a continue token another migrator left, so objects listed before it were never written by kube-svm; migrate again from the start"
            ),
            Refusal::GenerationChanged { started, now } => write!(
                f,
                "the CRD changed while the migration ran (generation {started} then {now}); migrate again"
            ),
            Refusal::CrdReplaced => write!(
                f,
                "the CRD is not the one the migration started with (deleted and created again, or its uid was not recorded then); migrate again"
            ),
            Refusal::StorageVersionChanged { started, now } => write!(
                f,
                "the storage version changed from {started} to {now} while the migration ran; migrate again"
            ),
            Refusal::EncodingUnconfirmed(seen) => write!(
                f,
                "the apiservers were not proven to encode in the storage version before the migration started: {seen}"
            ),
            Refusal::StorageVersionNotStored(version) => {
                write!(f, "storedVersions does not list the storage version {version}")
            }
        }
    }
}

/// Decides whether `storedVersions` can become `[storage version]` after `run`.
pub fn decide(run: &Run, started: &CrdState, now: &CrdState, encoding: &Encoding) -> Decision {
    if !run.succeeded || run.failed > 0 {
        return Decision::Keep(Refusal::MigrationFailed { failed: run.failed });
    }
    if !run.listed_from_start {
        return Decision::Keep(Refusal::PartialListing);
    }
    // Pruning needs proof that this is the CRD the run started with: a record without its uid
    // cannot give it.
    if !started.identified() {
        return Decision::Keep(Refusal::CrdReplaced);
    }
    match CrdChange::between(started, Some(now)) {
        None => {}
        Some(CrdChange::Deleted | CrdChange::Replaced) => {
            return Decision::Keep(Refusal::CrdReplaced);
        }
        Some(CrdChange::StorageSwitched { from, to }) => {
            return Decision::Keep(Refusal::StorageVersionChanged { started: from, now: to });
        }
        Some(CrdChange::Edited { from, to }) => {
            return Decision::Keep(Refusal::GenerationChanged { started: from, now: to });
        }
    }
    if let Encoding::Unconfirmed(seen) = encoding {
        return Decision::Keep(Refusal::EncodingUnconfirmed(seen.clone()));
    }
    if !now.is_stale() && !now.stored_versions.is_empty() {
        return Decision::AlreadyPruned;
    }
    if !now.stored_versions.contains(&now.storage_version) {
        return Decision::Keep(Refusal::StorageVersionNotStored(now.storage_version.clone()));
    }
    Decision::Prune(vec![now.storage_version.clone()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crd_is_stale_while_stored_versions_names_another_version() {
        let state = |stored: &[&str]| CrdState {
            uid: None,
            generation: 1,
            storage_version: "v2".into(),
            stored_versions: stored.iter().map(|v| v.to_string()).collect(),
        };
        assert!(state(&["v1", "v2"]).is_stale());
        assert!(state(&["v1"]).is_stale(), "even when it does not list the storage version");
        assert!(!state(&["v2"]).is_stale());
        assert!(!state(&[]).is_stale(), "storedVersions not set yet: nothing stored elsewhere");
    }

    fn crd(generation: i64, storage: &str, stored: &[&str]) -> CrdState {
        CrdState {
            uid: Some("crd-uid".into()),
            generation,
            storage_version: storage.into(),
            stored_versions: stored.iter().map(|v| v.to_string()).collect(),
        }
    }

    fn confirmed() -> Encoding {
        Encoding::Confirmed { by: "discovery".into() }
    }

    const SUCCEEDED: Run = Run { succeeded: true, failed: 0, listed_from_start: true };

    #[test]
    fn prunes_to_the_storage_version_when_everything_holds() {
        let started = crd(2, "v2", &["v1", "v2"]);
        assert_eq!(
            decide(&SUCCEEDED, &started, &started, &confirmed()),
            Decision::Prune(vec!["v2".into()])
        );
    }

    #[test]
    fn never_prunes_after_failed_objects_or_a_failed_migration() {
        let started = crd(2, "v2", &["v1", "v2"]);
        let failed = Run { succeeded: false, failed: 1, ..SUCCEEDED };
        let decision = decide(&failed, &started, &started, &confirmed());
        assert_eq!(decision, Decision::Keep(Refusal::MigrationFailed { failed: 1 }));
        // Failed without a failed object: the resource stopped being served, for example.
        let failed = Run { succeeded: false, failed: 0, ..SUCCEEDED };
        let Decision::Keep(refusal) = decide(&failed, &started, &started, &confirmed()) else {
            panic!("must keep")
        };
        assert_eq!(refusal.reason(), "MigrationFailed");
        assert!(refusal.to_string().contains("did not succeed"), "{refusal}");
    }

    #[test]
    fn never_prunes_after_a_run_that_began_at_a_foreign_continue_token() {
        let started = crd(2, "v2", &["v1", "v2"]);
        let partial = Run { listed_from_start: false, ..SUCCEEDED };
        let decision = decide(&partial, &started, &started, &confirmed());
        assert_eq!(decision, Decision::Keep(Refusal::PartialListing));
        assert_eq!(Refusal::PartialListing.reason(), "PartialListing");
    }

    #[test]
    fn never_prunes_when_the_crd_changed_while_migrating() {
        let started = crd(2, "v2", &["v1", "v2"]);
        let decision = decide(&SUCCEEDED, &started, &crd(3, "v2", &["v1", "v2"]), &confirmed());
        assert_eq!(decision, Decision::Keep(Refusal::GenerationChanged { started: 2, now: 3 }));
        // A storage switch bumps the generation too; either way nothing is pruned.
        let switched = crd(2, "v3", &["v1", "v2", "v3"]);
        let decision = decide(&SUCCEEDED, &started, &switched, &confirmed());
        assert!(
            matches!(decision, Decision::Keep(Refusal::StorageVersionChanged { .. })),
            "{decision:?}"
        );
    }

    #[test]
    fn never_prunes_a_crd_created_again_under_the_same_name() {
        let started = crd(2, "v2", &["v1", "v2"]);
        let replaced = CrdState { uid: Some("another".into()), ..started.clone() };
        let decision = decide(&SUCCEEDED, &started, &replaced, &confirmed());
        assert_eq!(decision, Decision::Keep(Refusal::CrdReplaced));
        assert_eq!(Refusal::CrdReplaced.reason(), "CRDChanged");
        // A target recorded before the uid was: not proven to be the same CRD.
        let unrecorded = CrdState { uid: None, ..started.clone() };
        let decision = decide(&SUCCEEDED, &unrecorded, &started, &confirmed());
        assert_eq!(decision, Decision::Keep(Refusal::CrdReplaced));
    }

    #[test]
    fn never_prunes_on_an_unconfirmed_encoding() {
        let started = crd(2, "v2", &["v1", "v2"]);
        let encoding = Encoding::Unconfirmed("discovery published x, expected y".into());
        let Decision::Keep(refusal) = decide(&SUCCEEDED, &started, &started, &encoding) else {
            panic!()
        };
        assert_eq!(refusal.reason(), "EncodingUnconfirmed");
        assert!(refusal.to_string().contains("discovery published x, expected y"));
    }

    #[test]
    fn already_pruned_and_odd_lists_are_left_alone() {
        let pruned = crd(2, "v2", &["v2"]);
        assert_eq!(decide(&SUCCEEDED, &pruned, &pruned, &confirmed()), Decision::AlreadyPruned);
        let odd = crd(2, "v2", &["v1"]);
        assert!(matches!(
            decide(&SUCCEEDED, &odd, &odd, &confirmed()),
            Decision::Keep(Refusal::StorageVersionNotStored(_))
        ));
    }
}
