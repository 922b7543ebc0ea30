//! What needs migrating, and what kube-svm would do: the pure part of `kube-svm plan`. The
//! command gathers CRDs, StorageStates, discovery, migrations and (optionally) the etcd census;
//! the functions here decide which resources are listed and why.

use serde::Serialize;

use crate::api::{Phase, StorageVersionMigration};
use crate::census::ResourceCensus;
use crate::rules::crd::CrdState;
use crate::rules::storage_hash::storage_version_hash;

/// `kube-svm plan`'s exit code when something needs migrating (0: nothing does; 1: an error).
pub const EXIT_NEEDS_MIGRATION: u8 = 3;

/// One resource in the plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Empty for the core group.
    pub group: String,
    /// The plural resource name, for example `secrets` or `crontabs`.
    pub resource: String,
    /// Why it needs migrating, one sentence each.
    pub reasons: Vec<String>,
    /// How many objects it holds: exact with a census, else from the apiserver's
    /// `remainingItemCount` (see `objectsExact`); absent when neither could tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objects: Option<u64>,
    /// Whether `objects` is exact (a census, or a listing that fit in one page) rather than the
    /// apiserver's estimate.
    pub objects_exact: bool,
    /// Objects stored in a version other than the storage version (with a census only, when
    /// every value is readable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_objects: Option<u64>,
    /// The migration that exists for it already, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration: Option<ExistingMigration>,
    /// What would make its migration fail before it writes anything (a conversion webhook
    /// that fails), one sentence each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// What a successful migration does afterwards.
    pub afterwards: String,
    /// The census of its keys, when etcd was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub census: Option<ResourceCensus>,
}

/// A StorageVersionMigration of the resource: the pending or running one, else the newest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExistingMigration {
    /// The migration's `metadata.name`.
    pub name: String,
    /// `New`, `Running`, `Succeeded` or `Failed`.
    pub phase: crate::api::Phase,
}

/// The whole plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The resources that need migrating, each with its reasons; empty when none does.
    pub resources: Vec<Entry>,
    /// What could not be examined (an aggregated API that did not answer discovery).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unexamined: Vec<String>,
}

impl Plan {
    /// The process exit code: [`EXIT_NEEDS_MIGRATION`] when any resource is listed.
    pub fn exit_code(&self) -> u8 {
        match self.resources.is_empty() {
            true => 0,
            false => EXIT_NEEDS_MIGRATION,
        }
    }

    /// The entry for `group`/`resource`, added when missing.
    pub fn entry(&mut self, group: &str, resource: &str) -> &mut Entry {
        let index =
            match self.resources.iter().position(|e| e.group == group && e.resource == resource) {
                Some(index) => index,
                None => {
                    self.resources.push(Entry {
                        group: group.to_owned(),
                        resource: resource.to_owned(),
                        afterwards: NOTHING_AFTERWARDS.into(),
                        ..Entry::default()
                    });
                    self.resources.len() - 1
                }
            };
        &mut self.resources[index]
    }
}

/// What a migration of a resource with nothing to prune leads to.
const NOTHING_AFTERWARDS: &str = "nothing beyond the rewrite: no stored versions are left to prune";

impl Entry {
    /// Adds what a successful migration leads to (a CRD's prune, a StorageState narrowed):
    /// each reason for the entry brings its own.
    pub fn add_afterwards(&mut self, what: String) {
        match self.afterwards.as_str() {
            NOTHING_AFTERWARDS => self.afterwards = what,
            _ => self.afterwards = format!("{}; {what}", self.afterwards),
        }
    }
}

/// Why a CRD needs migrating: its `storedVersions` names more than its storage version. Also
/// what kube-svm does with the list afterwards.
pub fn crd_reason(crd: &CrdState) -> Option<(String, String)> {
    if !crd.is_stale() {
        return None;
    }
    let CrdState { storage_version, stored_versions, .. } = crd;
    let reason = format!(
        "status.storedVersions is {stored_versions:?}, the storage version is {storage_version}"
    );
    let afterwards = format!(
        "status.storedVersions pruned from {stored_versions:?} to [{storage_version:?}] once the migration succeeds with every object listed and the encoding confirmed"
    );
    Some((reason, afterwards))
}

/// Why a resource with a StorageState needs migrating: discovery's hash is not the only one
/// its objects may be stored in.
pub fn storage_state_reason(persisted: &[String], current: Option<&str>) -> Option<String> {
    let current = current?;
    if persisted == [current] {
        return None;
    }
    Some(format!(
        "its StorageState says objects may be stored under {persisted:?}, the apiserver writes {current}"
    ))
}

/// Objects whose stored version is not the storage version, from a census: the storage
/// version is the CRD's, or (for a built-in) the stored version whose hash discovery publishes.
/// `None` when some value is encrypted or unreadable, or the storage version is unknown.
pub fn stale_objects(
    census: &ResourceCensus,
    group: &str,
    kind: &str,
    storage_version: Option<&str>,
    discovery_hash: Option<&str>,
) -> Option<u64> {
    if census.unencrypted != census.objects {
        return None;
    }
    let api_version = |version: &str| match group {
        "" => version.to_owned(),
        group => format!("{group}/{version}"),
    };
    let current = match storage_version {
        Some(version) => api_version(version),
        None => {
            let hash = discovery_hash?;
            let found = census.api_versions.keys().find(|stored| {
                let version = stored.rsplit('/').next().unwrap_or_default();
                storage_version_hash(group, version, kind) == hash
            });
            match found {
                Some(found) => found.clone(),
                // No object is stored in the storage version yet.
                None if census.objects > 0 => return Some(census.objects),
                None => return Some(0),
            }
        }
    };
    Some(census.objects - census.api_versions.get(&current).copied().unwrap_or(0))
}

/// The migration of `group`/`resource` that is pending or running, else the newest one.
pub fn existing(
    migrations: &[StorageVersionMigration],
    group: &str,
    resource: &str,
) -> Option<ExistingMigration> {
    let mut of: Vec<_> = migrations.iter().filter(|m| m.is_of(group, resource)).collect();
    of.sort_by_key(|m| m.metadata.creation_timestamp.clone());
    let chosen = of.iter().find(|m| m.is_unfinished()).or_else(|| of.last())?;
    Some(ExistingMigration {
        name: chosen.metadata.name.clone().unwrap_or_default(),
        phase: Phase::of(chosen),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(storage: &str, stored: &[&str]) -> CrdState {
        CrdState {
            uid: None,
            generation: 1,
            storage_version: storage.into(),
            stored_versions: stored.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn each_reason_says_what_follows_a_success() {
        let mut plan = Plan::default();
        let entry = plan.entry("example.com", "widgets");
        assert_eq!(entry.afterwards, NOTHING_AFTERWARDS);
        entry.add_afterwards("storedVersions pruned".into());
        entry.add_afterwards("its StorageState narrowed".into());
        assert_eq!(entry.afterwards, "storedVersions pruned; its StorageState narrowed");
    }

    #[test]
    fn a_crd_needs_migrating_while_stored_versions_hold_more_than_storage() {
        assert_eq!(crd_reason(&crd("v2", &["v2"])), None);
        let (reason, afterwards) = crd_reason(&crd("v2", &["v1", "v2"])).unwrap();
        assert_eq!(reason, r#"status.storedVersions is ["v1", "v2"], the storage version is v2"#);
        assert!(afterwards.contains(r#"to ["v2"]"#), "{afterwards}");
        assert!(crd_reason(&crd("v2", &["v1"])).is_some());
    }

    #[test]
    fn a_storage_state_needs_migrating_until_the_current_hash_is_alone() {
        let hashes = |h: &[&str]| h.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(storage_state_reason(&hashes(&["abc"]), Some("abc")), None);
        assert!(storage_state_reason(&hashes(&["Unknown"]), Some("abc")).is_some());
        assert!(storage_state_reason(&hashes(&["old", "abc"]), Some("abc")).is_some());
        assert_eq!(storage_state_reason(&hashes(&["old"]), None), None);
    }

    #[test]
    fn stale_objects_are_those_not_in_the_storage_version() {
        let census = ResourceCensus {
            objects: 30,
            unencrypted: 30,
            api_versions: [("example.com/v1".into(), 18), ("example.com/v2".into(), 12)].into(),
            ..ResourceCensus::default()
        };
        assert_eq!(stale_objects(&census, "example.com", "Widget", Some("v2"), None), Some(18));
        let hash = storage_version_hash("example.com", "v1", "Widget");
        assert_eq!(stale_objects(&census, "example.com", "Widget", None, Some(&hash)), Some(12));
        let other = storage_version_hash("example.com", "v3", "Widget");
        assert_eq!(stale_objects(&census, "example.com", "Widget", None, Some(&other)), Some(30));
        assert_eq!(stale_objects(&census, "example.com", "Widget", None, None), None);
        let encrypted = ResourceCensus { objects: 4, unencrypted: 0, ..ResourceCensus::default() };
        assert_eq!(stale_objects(&encrypted, "", "Secret", Some("v1"), None), None);
    }

    #[test]
    fn the_exit_code_says_whether_anything_is_listed() {
        let mut plan = Plan::default();
        assert_eq!(plan.exit_code(), 0);
        plan.entry("", "secrets").reasons.push("named".into());
        plan.entry("", "secrets");
        assert_eq!((plan.resources.len(), plan.exit_code()), (1, EXIT_NEEDS_MIGRATION));
    }
}
