//! A CRD as kube-svm reasons about it: one snapshot ([`CrdState`]: uid, generation, storage
//! version, `storedVersions`), and whether it is still the one a migration recorded: one
//! classifier ([`CrdChange::between`]) for every check that asks (where a run starts, the guard
//! and its watch, the encoding check, the prune). Each of them says in one `match` what a
//! change means to it.

use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::api::MigrationTarget;

/// A CRD's state, as far as pruning is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrdState {
    /// `metadata.uid`: tells a CRD from one deleted and created again under its name.
    pub uid: Option<String>,
    /// `metadata.generation`: moves on any change to the CRD's spec, a storage switch included.
    pub generation: i64,
    /// The version marked `storage: true` in `spec.versions`: what the apiservers write in.
    pub storage_version: String,
    /// `status.storedVersions`: every version objects may be stored in; empty until the
    /// apiserver sets it.
    pub stored_versions: Vec<String>,
}

impl CrdState {
    /// Whether the CRD is stale: its `storedVersions` names a version other than its storage
    /// version, so objects may be stored in it and a migration is needed before it can be
    /// removed. A CRD whose `storedVersions` the apiserver has not set yet is not: nothing was
    /// stored in another version. The one answer every part of kube-svm uses (the CRD trigger,
    /// `plan`, `migrate --all-stale`, the prune).
    pub fn is_stale(&self) -> bool {
        self.stored_versions.iter().any(|version| *version != self.storage_version)
    }

    /// The state of `crd`; `None` when no version is marked as the storage version.
    pub fn of(crd: &CustomResourceDefinition) -> Option<CrdState> {
        Some(CrdState::read(crd)).filter(|state| !state.storage_version.is_empty())
    }

    /// The state of `crd` as it is, its storage version empty when none is marked.
    pub fn read(crd: &CustomResourceDefinition) -> CrdState {
        let storage = crd.spec.versions.iter().find(|v| v.storage);
        CrdState {
            uid: crd.metadata.uid.clone(),
            generation: crd.metadata.generation.unwrap_or_default(),
            storage_version: storage.map(|v| v.name.clone()).unwrap_or_default(),
            stored_versions: crd
                .status
                .as_ref()
                .and_then(|s| s.stored_versions.clone())
                .unwrap_or_default(),
        }
    }

    /// The CRD as `target` recorded it when its migration started (its `storedVersions`
    /// unknown); `None` for a resource no CRD backs.
    pub fn recorded(target: &MigrationTarget) -> Option<CrdState> {
        Some(CrdState {
            uid: target.crd_uid.clone(),
            generation: target.crd_generation?,
            storage_version: target.storage_version.clone()?,
            stored_versions: Vec::new(),
        })
    }

    /// Whether the state holds the CRD's uid, which tells it from one deleted and created again
    /// under its name; kube-svm has always recorded it save in its first releases.
    pub fn identified(&self) -> bool {
        self.uid.is_some()
    }
}

/// How a CRD differs from a state recorded of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrdChange {
    /// It is gone.
    Deleted,
    /// Deleted and created again under its name: another uid.
    Replaced,
    /// Another version is marked as the storage version (empty: none is).
    StorageSwitched {
        /// The storage version recorded.
        from: String,
        /// The storage version now.
        to: String,
    },
    /// The spec changed (the generation moved) and the storage version is the same: any edit,
    /// or a storage switch there and back.
    Edited {
        /// The generation recorded.
        from: i64,
        /// The generation now.
        to: i64,
    },
}

impl CrdChange {
    /// How `now` (`None`: deleted) differs from `recorded`, the first that applies of deleted,
    /// replaced, storage switched, edited; `None` when it does not differ. The uids are
    /// compared only when `recorded` holds one: a state recorded without it (by a kube-svm that
    /// did not record uids) cannot tell a CRD created again, and what such a record is worth is
    /// the caller's policy ([`CrdState::identified`]). Pure.
    pub fn between(recorded: &CrdState, now: Option<&CrdState>) -> Option<CrdChange> {
        let Some(now) = now else {
            return Some(CrdChange::Deleted);
        };
        if recorded.uid.is_some() && now.uid != recorded.uid {
            return Some(CrdChange::Replaced);
        }
        if now.storage_version != recorded.storage_version {
            let (from, to) = (recorded.storage_version.clone(), now.storage_version.clone());
            return Some(CrdChange::StorageSwitched { from, to });
        }
        (now.generation != recorded.generation)
            .then_some(CrdChange::Edited { from: recorded.generation, to: now.generation })
    }
}

impl fmt::Display for CrdChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrdChange::Deleted => write!(f, "deleted"),
            CrdChange::Replaced => write!(f, "deleted and created again"),
            CrdChange::StorageSwitched { from, to } => {
                let to = if to.is_empty() { "none" } else { to };
                write!(f, "storage version {from} then {to}")
            }
            CrdChange::Edited { from, to } => write!(f, "generation {from} then {to}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(uid: Option<&str>, generation: i64, storage: &str) -> CrdState {
        CrdState {
            uid: uid.map(str::to_owned),
            generation,
            storage_version: storage.into(),
            stored_versions: Vec::new(),
        }
    }

    #[test]
    fn the_first_change_that_applies_of_deleted_replaced_switched_edited() {
        let recorded = state(Some("u1"), 4, "v2");
        let between = |now: Option<&CrdState>| CrdChange::between(&recorded, now);
        assert_eq!(between(Some(&state(Some("u1"), 4, "v2"))), None);
        assert_eq!(between(None), Some(CrdChange::Deleted));
        // Another uid, whatever else changed.
        assert_eq!(between(Some(&state(Some("u2"), 4, "v2"))), Some(CrdChange::Replaced));
        assert_eq!(between(Some(&state(None, 9, "v1"))), Some(CrdChange::Replaced));
        // A switch moves the generation too: it is said as the switch.
        let switched = between(Some(&state(Some("u1"), 5, "v1"))).unwrap();
        assert_eq!(switched, CrdChange::StorageSwitched { from: "v2".into(), to: "v1".into() });
        assert_eq!(switched.to_string(), "storage version v2 then v1");
        let back = between(Some(&state(Some("u1"), 6, "v2"))).unwrap();
        assert_eq!(back, CrdChange::Edited { from: 4, to: 6 });
        assert_eq!(back.to_string(), "generation 4 then 6");
        let none = CrdChange::StorageSwitched { from: "v2".into(), to: String::new() };
        assert_eq!(none.to_string(), "storage version v2 then none");
    }

    #[test]
    fn a_record_without_a_uid_cannot_tell_a_crd_created_again() {
        let unidentified = state(None, 4, "v2");
        assert!(!unidentified.identified());
        let other = state(Some("u2"), 4, "v2");
        assert_eq!(CrdChange::between(&unidentified, Some(&other)), None);
        let edited = state(Some("u2"), 5, "v2");
        let change = CrdChange::between(&unidentified, Some(&edited));
        assert_eq!(change, Some(CrdChange::Edited { from: 4, to: 5 }));
    }
}
