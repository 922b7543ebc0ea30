//! The safety invariant, checked in etcd: whenever kube-svm has set a CRD's `storedVersions` to
//! `[v]`, every key of that resource is encoded as `v`; whenever a migration that listed from the
//! start is Succeeded, every object that still exists was written through the storage version it
//! targeted. Every fault scenario ends here.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};
use kube_svm::api::{Phase, StorageVersionMigration};

use super::Etcd;
use super::fixtures::WidgetCrd;

/// How the widgets of one CRD are stored: key count by stored `apiVersion` (`"encrypted"` or
/// `"unrecognized"` for values without a readable one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census(pub BTreeMap<String, usize>);

impl Census {
    /// Counts every key of `widgets` with kube-svm's census.
    pub async fn of(etcd: &Etcd, widgets: &WidgetCrd) -> Census {
        let census = etcd.census(&widgets.etcd_prefix()).await.expect("etcd answers");
        let mut counts: BTreeMap<String, usize> =
            census.api_versions.into_iter().map(|(v, n)| (v, to_usize(n))).collect();
        let encrypted: u64 = census.encryption.iter().map(|k| k.objects).sum();
        for (label, n) in [("encrypted", encrypted), ("unrecognized", census.unrecognized)] {
            if n > 0 {
                counts.insert(label.to_owned(), to_usize(n));
            }
        }
        Census(counts)
    }

    pub fn total(&self) -> usize {
        self.0.values().sum()
    }

    /// Keys stored as `api_version`.
    pub fn count(&self, api_version: &str) -> usize {
        self.0.get(api_version).copied().unwrap_or(0)
    }

    /// Whether every key is stored as `api_version` (true of no key at all).
    pub fn all(&self, api_version: &str) -> bool {
        self.count(api_version) == self.total()
    }
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

/// Checks the invariant for `widgets` after `migration` has ended, and returns what was found
/// so the scenario can assert its own expectations (exact counts, never "all of nothing").
pub async fn check(client: &Client, etcd: &Etcd, widgets: &WidgetCrd, migration: &str) -> Outcome {
    let migration = Api::<StorageVersionMigration>::all(client.clone())
        .get(migration)
        .await
        .expect("the migration exists");
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
    if let [only] = stored_versions.as_slice() {
        let expected = widgets.api_version(only);
        assert!(census.all(&expected), "storedVersions is [{only}] but etcd holds {:?}", census.0);
    }
    // A run that began at a foreign continue token vouches only for what it listed.
    let whole = status.listed_from_start == Some(true);
    if phase == Phase::Succeeded
        && whole
        && let Some(version) = &target
    {
        let expected = widgets.api_version(version);
        assert!(
            census.all(&expected),
            "{} Succeeded but etcd holds {:?}, not only {expected}",
            migration.metadata.name.as_deref().unwrap_or_default(),
            census.0
        );
    }
    Outcome {
        phase,
        stored_versions,
        pruned,
        pruned_reason: condition.and_then(|c| c.reason.clone()),
        census,
    }
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).expect("a count fits in usize")
}
