//! The safety invariant, checked in etcd: whenever kube-svm has set a CRD's `storedVersions` to
//! `[v]`, every key of that resource is encoded as `v`; whenever a migration that listed from the
//! start is Succeeded, every object that still exists was written through the storage version (and
//! encryption key) it targeted. Every fault scenario ends here, with the number of objects it
//! knows it left: a census of the wrong keys, or of none, would satisfy "every key is v2".

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};
use kube_svm::api::{Phase, StorageVersionMigration};

use super::Etcd;
use super::fixtures::WidgetCrd;

/// How the keys under one prefix are stored: key count by stored form, the `apiVersion` of a
/// readable value, `<provider>:<key>` (`aescbc:key2`) for an encrypted one, `unrecognized` for
/// the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census(pub BTreeMap<String, usize>);

impl Census {
    /// Counts every key of `widgets` with kube-svm's census.
    pub async fn of(etcd: &Etcd, widgets: &WidgetCrd) -> Census {
        Census::under(etcd, &widgets.etcd_prefix()).await
    }

    /// Counts every key under `key_prefix` with kube-svm's census.
    pub async fn under(etcd: &Etcd, key_prefix: &str) -> Census {
        let census = etcd.census(key_prefix).await.expect("etcd answers");
        let mut counts: BTreeMap<String, usize> =
            census.api_versions.into_iter().map(|(v, n)| (v, to_usize(n))).collect();
        for key in census.encryption {
            counts.insert(format!("{}:{}", key.provider, key.key), to_usize(key.objects));
        }
        if census.unrecognized > 0 {
            counts.insert("unrecognized".to_owned(), to_usize(census.unrecognized));
        }
        Census(counts)
    }

    pub fn total(&self) -> usize {
        self.0.values().sum()
    }

    /// Keys stored as `form`.
    pub fn count(&self, form: &str) -> usize {
        self.0.get(form).copied().unwrap_or(0)
    }
}

/// What a migration ended with, as far as the invariant is concerned.
#[derive(Clone, Debug, Default)]
pub struct Ending {
    /// How every key must be stored because the migration Succeeded having listed from the
    /// start: its target's `apiVersion` (a custom resource), or the encryption key the apiserver
    /// writes with (an encrypted built-in).
    pub succeeded_as: Option<String>,
    /// How every key must be stored because `storedVersions` holds one version: its
    /// `apiVersion`.
    pub stored_versions_only: Option<String>,
}

/// The invariant, decided on what was read: `Err` says how etcd breaks it. `expected` is how many
/// objects the scenario left, which the census must find before anything it says counts.
pub fn judge(census: &Census, expected: usize, ending: &Ending) -> Result<(), String> {
    if census.total() != expected {
        return Err(format!(
            "etcd holds {} keys, not the {expected} objects the scenario left: {:?}",
            census.total(),
            census.0
        ));
    }
    let all = |form: &str| census.count(form) == census.total();
    if let Some(form) = &ending.stored_versions_only
        && !all(form)
    {
        return Err(format!("storedVersions is [{form}] but etcd holds {:?}", census.0));
    }
    if let Some(form) = &ending.succeeded_as
        && !all(form)
    {
        return Err(format!(
            "the migration Succeeded but etcd holds {:?}, not only {form}",
            census.0
        ));
    }
    Ok(())
}

/// What a fault scenario ended with, once the invariant has been checked.
#[derive(Debug)]
pub struct Outcome {
    pub phase: Phase,
    /// The CRD's `status.storedVersions`.
    pub stored_versions: Vec<String>,
    /// Whether the migration says it pruned them.
    pub pruned: bool,
    /// The StoredVersionsPruned condition's reason, if any.
    pub pruned_reason: Option<String>,
    pub census: Census,
}

/// Checks the invariant for `widgets` after `migration` has ended, with `expected` widgets left,
/// and returns what was found so the scenario can assert its own expectations.
pub async fn check(
    client: &Client,
    etcd: &Etcd,
    widgets: &WidgetCrd,
    migration: &str,
    expected: usize,
) -> Outcome {
    let migration = migration_named(client, migration).await;
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get(&widgets.name())
        .await
        .expect("the CRD exists");
    let stored_versions = crd.status.and_then(|s| s.stored_versions).unwrap_or_default();
    let census = Census::of(etcd, widgets).await;
    let status = migration.status.clone().unwrap_or_default();
    let condition = status.conditions.iter().find(|c| c.type_ == "StoredVersionsPruned");
    let pruned =
        condition.is_some_and(|c| c.status == "True" && c.reason.as_deref() == Some("Pruned"));
    let target = status.target.as_ref().and_then(|t| t.storage_version.clone());
    let phase = Phase::of(&migration);

    if pruned {
        let version = target.clone().expect("a pruning migration recorded its storage version");
        assert_eq!(stored_versions, [version], "pruned to the storage version alone");
    }
    let ending = Ending {
        succeeded_as: succeeded(&migration)
            .then_some(target)
            .flatten()
            .map(|v| widgets.api_version(&v)),
        stored_versions_only: match stored_versions.as_slice() {
            [only] => Some(widgets.api_version(only)),
            _ => None,
        },
    };
    if let Err(breach) = judge(&census, expected, &ending) {
        panic!("{}: {breach}", migration.metadata.name.as_deref().unwrap_or_default());
    }
    Outcome {
        phase,
        stored_versions,
        pruned,
        pruned_reason: condition.and_then(|c| c.reason.clone()),
        census,
    }
}

/// Checks the invariant for a built-in resource kept under `key_prefix` (the whole resource:
/// `/registry/secrets/`) after `migration` has ended, with `expected` objects left: once it
/// Succeeded, every key is stored as `stored_as` (`aescbc:key2` after a key rotation, `v1` for
/// an unencrypted resource). Returns the migration's phase and the census.
pub async fn check_built_in(
    client: &Client,
    etcd: &Etcd,
    key_prefix: &str,
    migration: &str,
    expected: usize,
    stored_as: &str,
) -> (Phase, Census) {
    let migration = migration_named(client, migration).await;
    let census = Census::under(etcd, key_prefix).await;
    let ending = Ending {
        succeeded_as: succeeded(&migration).then(|| stored_as.to_owned()),
        stored_versions_only: None,
    };
    if let Err(breach) = judge(&census, expected, &ending) {
        panic!("{}: {breach}", migration.metadata.name.as_deref().unwrap_or_default());
    }
    (Phase::of(&migration), census)
}

async fn migration_named(client: &Client, name: &str) -> StorageVersionMigration {
    Api::<StorageVersionMigration>::all(client.clone())
        .get(name)
        .await
        .expect("the migration exists")
}

/// Whether `migration` Succeeded having listed its resource from the start (a run that began at
/// a foreign continue token vouches only for what it listed).
fn succeeded(migration: &StorageVersionMigration) -> bool {
    let whole = migration.status.as_ref().and_then(|s| s.listed_from_start) == Some(true);
    Phase::of(migration) == Phase::Succeeded && whole
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).expect("a count fits in usize")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn census(forms: &[(&str, usize)]) -> Census {
        Census(forms.iter().map(|(form, n)| (form.to_string(), *n)).collect())
    }

    fn succeeded_as(form: &str) -> Ending {
        Ending { succeeded_as: Some(form.to_owned()), stored_versions_only: None }
    }

    #[test]
    fn an_empty_census_proves_nothing_about_objects_that_exist() {
        let ending = Ending {
            succeeded_as: Some("example.com/v2".into()),
            stored_versions_only: Some("example.com/v2".into()),
        };
        let breach = judge(&Census::default(), 300, &ending).expect_err("300 objects, no key read");
        assert!(breach.contains("holds 0 keys, not the 300"), "{breach}");
        assert_eq!(judge(&Census::default(), 0, &ending), Ok(()), "an emptied resource");
    }

    #[test]
    fn every_key_must_be_stored_as_the_succeeded_target() {
        let ending = succeeded_as("example.com/v2");
        let mixed = census(&[("example.com/v1", 30), ("example.com/v2", 270)]);
        assert!(judge(&mixed, 300, &ending).is_err());
        let migrated = census(&[("example.com/v2", 300)]);
        assert_eq!(judge(&migrated, 300, &ending), Ok(()));
        assert!(judge(&migrated, 301, &ending).is_err(), "a key missing from the census");
        assert_eq!(
            judge(&mixed, 300, &Ending::default()),
            Ok(()),
            "a failed run vouches for nothing"
        );
    }

    #[test]
    fn a_pruned_crd_needs_every_key_in_its_one_version() {
        let ending =
            Ending { succeeded_as: None, stored_versions_only: Some("example.com/v2".into()) };
        let left = census(&[("example.com/v1", 1), ("example.com/v2", 9)]);
        assert!(judge(&left, 10, &ending).is_err());
    }

    #[test]
    fn built_ins_are_judged_by_their_encryption_key() {
        let ending = succeeded_as("aescbc:key2");
        let half = census(&[("aescbc:key1", 3), ("aescbc:key2", 47)]);
        assert!(judge(&half, 50, &ending).is_err());
        let plain = census(&[("v1", 50)]);
        assert!(judge(&plain, 50, &ending).is_err(), "unencrypted is not key2");
        assert_eq!(judge(&census(&[("aescbc:key2", 50)]), 50, &ending), Ok(()));
    }
}
