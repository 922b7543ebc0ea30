//! Cleaning `metadata.managedFields` of the entries that name a version a CRD no longer serves.
//!
//! Server-side apply converts every entry of an object's `managedFields` to the version of the
//! request. Once a version is removed from a CRD, an entry still naming it cannot be converted,
//! and every apply of the object fails ("request to convert CR to an invalid group/version").
//! Entries naming a version that is still defined but no longer served convert today and fail
//! the day the version is removed. Both kinds are removed here, before the operator removes the
//! version: the managers named lose the ownership those entries recorded (their next apply at a
//! served version takes it again), and nothing else about the object changes.
//!
//! An object whose every entry goes keeps one seed entry for its most recent manager, owning only
//! `metadata.name`: with no entries at all, the apiserver would invent a `before-first-apply`
//! manager owning every field at the next apply, a co-owner nobody asked for.

use std::collections::BTreeSet;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

/// The versions of a CRD that clients may still use: `group/version` of each served version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    api_versions: BTreeSet<String>,
    /// The storage version, when it is served: what a seed entry names, the version that stays
    /// longest.
    storage: Option<String>,
}

/// What cleaning an object's `managedFields` comes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cleaned {
    /// The entries to write instead: those naming a served version, or one seed entry.
    pub entries: Vec<Value>,
    /// Entries removed.
    pub removed: usize,
}

/// Why the `managedFields` a cleaning write was answered with are not clean.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotClean {
    /// Entries still name these versions (`group/version`), not served: the apiserver kept
    /// entries the write removed.
    StillNamed(Vec<String>),
    /// No entry is left, although the write kept some: the apiserver dropped the ownership
    /// the write kept along with the entries it removed.
    Dropped {
        /// The entries the write kept.
        written: usize,
    },
}

impl NotClean {
    /// The reason recorded for the object.
    pub fn reason(&self) -> &'static str {
        MANAGED_FIELDS_NOT_CLEANED
    }

    /// What happened, for the object's failure message.
    pub fn message(&self) -> String {
        match self {
            NotClean::StillNamed(named) => format!(
                "the apiserver wrote the object but its managedFields still name {}, not served",
                named.join(", ")
            ),
            NotClean::Dropped { written } => format!(
                "the apiserver wrote the object but dropped every managedFields entry, the {written} kept by the cleaning included"
            ),
        }
    }
}

/// Reason recorded when an object's `managedFields` were not cleaned: a write meant to clean
/// them changed nothing, they did not read back clean, or others wrote the object again and
/// again before it could be cleaned.
pub const MANAGED_FIELDS_NOT_CLEANED: &str = "ManagedFieldsNotCleaned";

impl Served {
    /// The served versions of `crd`.
    pub fn of(crd: &CustomResourceDefinition) -> Served {
        let group = &crd.spec.group;
        let api_versions = crd
            .spec
            .versions
            .iter()
            .filter(|version| version.served)
            .map(|version| format!("{group}/{}", version.name))
            .collect();
        let storage = crd.spec.versions.iter().find(|version| version.storage && version.served);
        let storage = storage.map(|version| format!("{group}/{}", version.name));
        Served { api_versions, storage }
    }

    /// Whether a `managedFields` entry naming `api_version` can still be converted by every
    /// request of a client.
    pub fn serves(&self, api_version: &str) -> bool {
        self.api_versions.contains(api_version)
    }

    /// The entries to write instead of `entries`, when some name a version not served; `None`
    /// when there is nothing to clean. A seed entry names the storage version, or `written`
    /// (the `group/version` the cleaning write is sent to) when the storage version is not
    /// served.
    pub fn clean(&self, entries: &[Value], written: &str) -> Option<Cleaned> {
        let (kept, removed): (Vec<&Value>, Vec<&Value>) =
            entries.iter().partition(|entry| self.serves(api_version(entry)));
        if removed.is_empty() {
            return None;
        }
        let entries = match kept.is_empty() {
            false => kept.into_iter().cloned().collect(),
            true => vec![seed(&removed, self.storage.as_deref().unwrap_or(written))],
        };
        Some(Cleaned { entries, removed: removed.len() })
    }

    /// Whether `answer`, the `managedFields` a cleaning write was answered with, reads back
    /// clean: no entry names a version not served, and some entry is left of the `written`
    /// ones. The apiserver answers with what it stored, not with what it was sent: it keeps the
    /// live entries for any write to a subresource, and its field manager, when it cannot
    /// convert an entry, falls back to the live entries or drops them all, writing the object
    /// all the same.
    pub fn reads_back(&self, written: &[Value], answer: &[Value]) -> Result<(), NotClean> {
        let unserved: BTreeSet<&str> = answer
            .iter()
            .map(api_version)
            .filter(|api_version| !self.serves(api_version))
            .collect();
        if !unserved.is_empty() {
            let named = unserved.into_iter().map(str::to_owned).collect();
            return Err(NotClean::StillNamed(named));
        }
        if answer.is_empty() && !written.is_empty() {
            return Err(NotClean::Dropped { written: written.len() });
        }
        Ok(())
    }

    /// The versions served, for messages: `v2, v3`.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self
            .api_versions
            .iter()
            .map(|api_version| api_version.rsplit('/').next().unwrap_or(api_version))
            .collect();
        names.join(", ")
    }
}

fn api_version(entry: &Value) -> &str {
    entry.get("apiVersion").and_then(Value::as_str).unwrap_or_default()
}

/// The entry kept for an object whose every entry was removed: its most recent manager (by the
/// entries' `time`), owning `metadata.name` only.
fn seed(removed: &[&Value], seed_version: &str) -> Value {
    fn time(entry: &Value) -> &str {
        entry.get("time").and_then(Value::as_str).unwrap_or_default()
    }
    // RFC 3339 times in UTC, as the apiserver writes them, order as strings do.
    let latest = removed.iter().max_by(|a, b| time(a).cmp(time(b)));
    let field = |name: &str| latest.and_then(|entry| entry.get(name)).cloned();
    let mut seed = json!({
        "manager": field("manager").unwrap_or_else(|| json!("before-first-apply")),
        "operation": field("operation").unwrap_or_else(|| json!("Update")),
        "apiVersion": seed_version,
        "fieldsType": "FieldsV1",
        "fieldsV1": { "f:metadata": { "f:name": {} } },
    });
    if let Some(time) = field("time") {
        seed["time"] = time;
    }
    seed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(versions: &[(&str, bool)]) -> Served {
        let versions: Vec<Value> = versions
            .iter()
            .map(|(name, served)| json!({ "name": name, "served": served, "storage": *name == "v2" }))
            .collect();
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": { "name": "widgets.example.com" },
            "spec": {
                "group": "example.com",
                "names": { "plural": "widgets", "kind": "Widget" },
                "scope": "Namespaced",
                "versions": versions,
            }
        }))
        .expect("a CRD");
        Served::of(&crd)
    }

    fn entry(manager: &str, api_version: &str, time: &str) -> Value {
        json!({
            "manager": manager,
            "operation": "Apply",
            "apiVersion": api_version,
            "time": time,
            "fieldsType": "FieldsV1",
            "fieldsV1": { "f:spec": { "f:size": {} } },
        })
    }

    #[test]
    fn only_served_versions_count_as_served() {
        let served = served(&[("v1", false), ("v2", true), ("v3", true)]);
        assert!(served.serves("example.com/v2") && served.serves("example.com/v3"));
        assert!(!served.serves("example.com/v1"), "defined but not served");
        assert!(!served.serves("example.com/v0"), "removed from the CRD");
        assert!(!served.serves("v2"), "another group");
        assert_eq!(served.names(), "v2, v3");
    }

    #[test]
    fn entries_of_served_versions_are_kept_as_they_are() {
        let served = served(&[("v1", false), ("v2", true)]);
        let current = entry("kubectl", "example.com/v2", "2026-01-02T00:00:00Z");
        assert_eq!(served.clean(std::slice::from_ref(&current), "example.com/v2"), None);
        let old = entry("controller", "example.com/v1", "2026-01-01T00:00:00Z");
        let cleaned = served.clean(&[old, current.clone()], "example.com/v2").expect("cleaned");
        assert_eq!(cleaned, Cleaned { entries: vec![current], removed: 1 });
    }

    #[test]
    fn an_answer_naming_only_served_versions_reads_back_clean() {
        let served = served(&[("v1", false), ("v2", true), ("v3", true)]);
        let written = [entry("tuner", "example.com/v2", "t"), entry("ops", "example.com/v3", "t")];
        assert_eq!(served.reads_back(&written, &written), Ok(()));
        // The apiserver may keep fewer, or other, entries of served versions.
        assert_eq!(served.reads_back(&written, &written[1..]), Ok(()));
    }

    #[test]
    fn an_answer_still_naming_an_unserved_version_is_not_clean() {
        let served = served(&[("v0", false), ("v1", false), ("v2", true)]);
        let kept = entry("tuner", "example.com/v2", "t");
        // What a write to `/status` gets: the live entries, as they were.
        let live = [
            entry("deployer", "example.com/v1", "t"),
            kept.clone(),
            entry("old", "example.com/v0", "t"),
            entry("other", "example.com/v1", "t"),
        ];
        let not_clean = served.reads_back(std::slice::from_ref(&kept), &live);
        let named = vec!["example.com/v0".to_owned(), "example.com/v1".to_owned()];
        assert_eq!(not_clean, Err(NotClean::StillNamed(named)));
        let message = not_clean.err().map(|not_clean| not_clean.message()).unwrap_or_default();
        assert!(message.contains("still name example.com/v0, example.com/v1"), "{message}");
    }

    #[test]
    fn an_answer_with_every_entry_dropped_is_not_clean() {
        let served = served(&[("v1", false), ("v2", true)]);
        let written = [entry("tuner", "example.com/v2", "t")];
        assert_eq!(served.reads_back(&written, &[]), Err(NotClean::Dropped { written: 1 }));
        assert_eq!(NotClean::Dropped { written: 1 }.reason(), "ManagedFieldsNotCleaned");
    }

    #[test]
    fn an_object_left_with_no_entry_keeps_a_seed_for_its_latest_manager() {
        let served = served(&[("v1", false), ("v2", true)]);
        let entries = [
            entry("first", "example.com/v1", "2026-01-01T00:00:00Z"),
            entry("latest", "example.com/v1", "2026-03-01T00:00:00Z"),
            entry("middle", "example.com/v1", "2026-02-01T00:00:00Z"),
        ];
        let cleaned = served.clean(&entries, "example.com/v3").expect("cleaned");
        assert_eq!(cleaned.removed, 3);
        assert_eq!(
            cleaned.entries,
            [json!({
                "manager": "latest",
                "operation": "Apply",
                // The storage version, not the version written to.
                "apiVersion": "example.com/v2",
                "time": "2026-03-01T00:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": { "f:metadata": { "f:name": {} } },
            })]
        );
    }
}
