//! Which of the trigger's migrations stands for a CRD's current state, and whether another is
//! due.
//!
//! A CRD's state, for the trigger, is its uid, its storage version and, for a cleaning of
//! `managedFields`, the versions it does not serve: not its generation. A CRD whose spec keeps
//! changing (a CA bundle injected, an operator or a GitOps tool that re-applies it) while its
//! storage stays put gets no new migration per change: the run follows the CRD and starts over
//! only when what is stored can change. A failed migration is retried in place, its retries
//! counted on it ([`super::MAX_RETRIES`]); one that succeeded without pruning (its encoding not
//! proved, say) is left, saying why, for the operator. A new migration is due only once the last
//! one pruned and `storedVersions` went stale again: the storage version was switched since.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::created_for;
use crate::api::conditions::{STATUS_TRUE, STORED_VERSIONS_PRUNED};
use crate::api::{CLEAN_MANAGED_FIELDS_ANNOTATION, Phase, StorageVersionMigration, Trigger};

/// Annotation on a cleaning migration of the trigger: the versions the CRD did not serve when it
/// was created (comma-separated), the state it cleans.
pub const UNSERVED_ANNOTATION: &str = "kube-svm.io/unserved";

/// The versions `crd` does not serve, comma-separated: the value of [`UNSERVED_ANNOTATION`].
pub fn unserved_of(crd: &CustomResourceDefinition) -> String {
    let unserved: Vec<&str> =
        crd.spec.versions.iter().filter(|v| !v.served).map(|v| v.name.as_str()).collect();
    unserved.join(",")
}

/// The newest of the trigger's `migrations` made for the current state of `crd`: its uid,
/// storage version `storage`, and, when `cleaning`, the versions it does not serve. Pure.
pub fn latest_for<'a>(
    migrations: &'a [StorageVersionMigration],
    crd: &CustomResourceDefinition,
    storage: &str,
    cleaning: bool,
) -> Option<&'a StorageVersionMigration> {
    let unserved = unserved_of(crd);
    let of_state = |m: &&StorageVersionMigration| {
        let annotations = m.metadata.annotations.as_ref();
        let annotated = |key: &str| annotations.and_then(|a| a.get(key));
        let ours = m.made_by() == Some(Trigger::Crd);
        let target = &m.spec.resource;
        let cleans = annotated(CLEAN_MANAGED_FIELDS_ANNOTATION).is_some_and(|v| v == "true");
        // One created before the unserved versions were recorded counts as this state's.
        let same_unserved = annotated(UNSERVED_ANNOTATION).is_none_or(|v| *v == unserved);
        ours && target.group == crd.spec.group
            && target.resource == crd.spec.names.plural
            && target.version == storage
            && cleans == cleaning
            && (!cleaning || same_unserved)
            && created_for(m, crd)
    };
    migrations.iter().filter(of_state).max_by(|a, b| {
        let at = |m: &StorageVersionMigration| {
            (m.metadata.creation_timestamp.as_ref().map(|t| t.0), m.metadata.name.clone())
        };
        at(a).cmp(&at(b))
    })
}

/// Whether `latest`, the newest migration for a CRD state that needs migrating, is done with:
/// a plain migration that pruned `storedVersions` (they went stale again since, so the storage
/// version was switched away and back). A cleaning migration stands for its state for good, as
/// does one that failed (it is retried in place) or succeeded without pruning. Pure.
pub fn round_over(latest: &StorageVersionMigration, cleaning: bool) -> bool {
    let pruned = latest.status.as_ref().is_some_and(|status| {
        status
            .conditions
            .iter()
            .any(|c| c.type_ == STORED_VERSIONS_PRUNED && c.status == STATUS_TRUE)
    });
    !cleaning && Phase::of(latest) == Phase::Succeeded && pruned
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TRIGGER_LABEL;
    use crate::api::conditions::{FAILED, SUCCEEDED};
    use crate::api::{
        GroupVersionResource, MigrationCondition, StorageVersionMigrationSpec,
        StorageVersionMigrationStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use std::collections::BTreeMap;

    fn crd(storage: &str, unserved: &[&str]) -> CustomResourceDefinition {
        let versions: Vec<serde_json::Value> = ["v1", "v2", "v3"]
            .iter()
            .map(|v| {
                serde_json::json!({
                    "name": v, "served": !unserved.contains(v), "storage": *v == storage,
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "widgets.example.com", "uid": "u-1", "generation": 7 },
            "spec": {
                "group": "example.com",
                "names": { "plural": "widgets", "kind": "Widget" },
                "scope": "Cluster",
                "versions": versions,
            },
        }))
        .expect("a CRD")
    }

    fn migration(
        name: &str,
        version: &str,
        seconds: i64,
        cleaning: bool,
    ) -> StorageVersionMigration {
        let mut annotations =
            BTreeMap::from([("kube-svm.io/crd-uid".to_owned(), "u-1".to_owned())]);
        if cleaning {
            annotations.insert(CLEAN_MANAGED_FIELDS_ANNOTATION.to_owned(), "true".to_owned());
        }
        let mut migration = StorageVersionMigration::new(
            name,
            StorageVersionMigrationSpec {
                resource: GroupVersionResource {
                    group: "example.com".into(),
                    version: version.into(),
                    resource: "widgets".into(),
                },
                continue_token: None,
            },
        );
        migration.metadata.labels =
            Some(BTreeMap::from([(TRIGGER_LABEL.to_owned(), "crd".to_owned())]));
        migration.metadata.annotations = Some(annotations);
        let at = Timestamp::from_second(1_700_000_000 + seconds).expect("a time");
        migration.metadata.creation_timestamp = Some(Time(at));
        migration
    }

    fn ended(
        mut migration: StorageVersionMigration,
        type_: &str,
        pruned: bool,
    ) -> StorageVersionMigration {
        let condition = |type_: &str, status: &str| MigrationCondition {
            type_: type_.into(),
            status: status.into(),
            ..MigrationCondition::default()
        };
        let mut conditions = vec![condition(type_, STATUS_TRUE)];
        conditions.push(condition(STORED_VERSIONS_PRUNED, if pruned { "True" } else { "False" }));
        migration.status = Some(StorageVersionMigrationStatus { conditions, ..Default::default() });
        migration
    }

    #[test]
    fn the_newest_migration_of_the_same_storage_stands_for_the_state_whatever_the_generation() {
        let all = [
            migration("widgets.example.com-v2-3", "v2", 10, false),
            migration("widgets.example.com-v2-5", "v2", 20, false),
            migration("widgets.example.com-v3-6", "v3", 30, false),
            migration("widgets.example.com-v2-5-clean", "v2", 40, true),
        ];
        let found = latest_for(&all, &crd("v2", &[]), "v2", false).expect("one");
        assert_eq!(found.metadata.name.as_deref(), Some("widgets.example.com-v2-5"));
        let cleaning = latest_for(&all, &crd("v2", &["v1"]), "v2", true).expect("one");
        assert_eq!(cleaning.metadata.name.as_deref(), Some("widgets.example.com-v2-5-clean"));
        assert!(latest_for(&all, &crd("v1", &[]), "v1", false).is_none());
    }

    #[test]
    fn another_crd_or_another_unserved_set_is_another_state() {
        let mut other = migration("widgets.example.com-v2-3", "v2", 10, false);
        other.metadata.annotations =
            Some(BTreeMap::from([("kube-svm.io/crd-uid".to_owned(), "u-0".to_owned())]));
        assert!(latest_for(&[other], &crd("v2", &[]), "v2", false).is_none());
        let mut cleaned_v1 = migration("widgets.example.com-v3-5-clean", "v3", 10, true);
        cleaned_v1
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(UNSERVED_ANNOTATION.into(), "v1".into());
        let all = [cleaned_v1];
        assert!(latest_for(&all, &crd("v3", &["v1"]), "v3", true).is_some());
        assert!(latest_for(&all, &crd("v3", &["v1", "v2"]), "v3", true).is_none());
    }

    #[test]
    fn only_a_pruned_success_makes_way_for_another_round() {
        let plain = migration("widgets.example.com-v2-3", "v2", 10, false);
        assert!(round_over(&ended(plain.clone(), SUCCEEDED, true), false));
        assert!(!round_over(&ended(plain.clone(), SUCCEEDED, false), false));
        assert!(!round_over(&ended(plain.clone(), FAILED, false), false));
        assert!(!round_over(&plain, false));
        let cleaning = migration("widgets.example.com-v2-3-clean", "v2", 10, true);
        assert!(!round_over(&ended(cleaning, SUCCEEDED, true), true));
    }
}
