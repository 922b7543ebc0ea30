//! Pruning a CRD's `status.storedVersions` after a migration: the decision (pure) and the write.
//!
//! Removing a version from `storedVersions` is only safe once no object in etcd is still encoded
//! in it. kube-svm proves that before pruning: the migration succeeded with no failed object; the
//! CRD's generation and storage version did not change while it ran; and before it started, the
//! apiservers were already encoding in the storage version (the StorageVersion API where served,
//! otherwise the discovery hash, seen consistently over a settle period). Anything less and the
//! list stays as it is, with the reason said.

use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client};

/// How the apiservers' encoding was confirmed before the migration started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Confirmed: by the StorageVersion API, or by the discovery hash over the settle period.
    Confirmed { by: &'static str },
    /// Not confirmed; the message says what was seen.
    Unconfirmed(String),
}

/// A CRD's state, as far as pruning is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrdState {
    pub generation: i64,
    pub storage_version: String,
    pub stored_versions: Vec<String>,
}

impl CrdState {
    pub fn of(crd: &CustomResourceDefinition) -> Option<CrdState> {
        let storage_version = crd.spec.versions.iter().find(|v| v.storage)?.name.clone();
        Some(CrdState {
            generation: crd.metadata.generation.unwrap_or_default(),
            storage_version,
            stored_versions: crd
                .status
                .as_ref()
                .and_then(|s| s.stored_versions.clone())
                .unwrap_or_default(),
        })
    }
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
    MigrationFailed { failed: u64 },
    GenerationChanged { started: i64, now: i64 },
    StorageVersionChanged { started: String, now: String },
    EncodingUnconfirmed(String),
    StorageVersionNotStored(String),
}

impl Refusal {
    /// A machine-readable reason, for conditions, events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::MigrationFailed { .. } => "MigrationFailed",
            Refusal::GenerationChanged { .. } => "CRDChanged",
            Refusal::StorageVersionChanged { .. } => "StorageVersionChanged",
            Refusal::EncodingUnconfirmed(_) => "EncodingUnconfirmed",
            Refusal::StorageVersionNotStored(_) => "StorageVersionNotStored",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::MigrationFailed { failed } => {
                write!(
                    f,
                    "{failed} objects could not be migrated and may still be stored in older versions"
                )
            }
            Refusal::GenerationChanged { started, now } => write!(
                f,
                "the CRD changed while the migration ran (generation {started} then {now}); migrate again"
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

/// Decides whether `storedVersions` can become `[storage version]`.
pub fn decide(failed: u64, started: &CrdState, now: &CrdState, encoding: &Encoding) -> Decision {
    if failed > 0 {
        return Decision::Keep(Refusal::MigrationFailed { failed });
    }
    if started.generation != now.generation {
        return Decision::Keep(Refusal::GenerationChanged {
            started: started.generation,
            now: now.generation,
        });
    }
    if started.storage_version != now.storage_version {
        return Decision::Keep(Refusal::StorageVersionChanged {
            started: started.storage_version.clone(),
            now: now.storage_version.clone(),
        });
    }
    if let Encoding::Unconfirmed(seen) = encoding {
        return Decision::Keep(Refusal::EncodingUnconfirmed(seen.clone()));
    }
    if now.stored_versions == [now.storage_version.clone()] {
        return Decision::AlreadyPruned;
    }
    if !now.stored_versions.contains(&now.storage_version) {
        return Decision::Keep(Refusal::StorageVersionNotStored(now.storage_version.clone()));
    }
    Decision::Prune(vec![now.storage_version.clone()])
}

/// Sets `storedVersions` on `crd` as read, so the write fails (409) if the CRD changed since.
pub async fn prune(
    client: &Client,
    mut crd: CustomResourceDefinition,
    stored_versions: Vec<String>,
) -> Result<(), kube::Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    crd.status.get_or_insert_with(Default::default).stored_versions = Some(stored_versions);
    api.replace_status(&name, &PostParams::default(), &crd).await?;
    Ok(())
}

/// The StorageVersion API's group version (`internal.apiserver.k8s.io`).
const STORAGE_VERSION_API: &str = "internal.apiserver.k8s.io/v1alpha1";

/// How many times discovery is read over the settle period.
const DISCOVERY_SAMPLES: u32 = 4;

/// Checks that the apiservers encode `group/storage_version` for `plural`: through the
/// StorageVersion API where it is served and has the resource, otherwise by reading the
/// discovery hash several times over `settle` (apiservers behind a load balancer can disagree).
pub async fn confirm_encoding(
    client: &Client,
    group: &str,
    plural: &str,
    kind: &str,
    storage_version: &str,
    settle: std::time::Duration,
) -> Encoding {
    let expected_version = format!("{group}/{storage_version}");
    let by = match from_storage_version_api(client, group, plural, &expected_version).await {
        StorageVersionApi::Answered(encoding) => return encoding,
        StorageVersionApi::NotServed => "discovery",
        // kube-apiserver 1.37 publishes StorageVersions for built-in resources only.
        StorageVersionApi::NoEntry => {
            "discovery (the StorageVersion API has no entry for this resource)"
        }
    };
    let expected = crate::storage_hash::storage_version_hash(group, storage_version, kind);
    for sample in 0..DISCOVERY_SAMPLES {
        if sample > 0 {
            tokio::time::sleep(settle / (DISCOVERY_SAMPLES - 1)).await;
        }
        let published = match client.list_api_group_resources(&expected_version).await {
            Ok(list) => list
                .resources
                .into_iter()
                .find(|r| r.name == plural)
                .and_then(|r| r.storage_version_hash),
            Err(error) => {
                return Encoding::Unconfirmed(format!("discovery could not be read: {error}"));
            }
        };
        if published.as_deref() != Some(expected.as_str()) {
            return Encoding::Unconfirmed(format!(
                "discovery published storage version hash {} for {plural}.{group}, not {expected} ({expected_version}); \
                 if the apiserver's hash formula changed, prune storedVersions by hand",
                published.as_deref().unwrap_or("none")
            ));
        }
    }
    Encoding::Confirmed { by }
}

/// What the StorageVersion API says about a resource.
enum StorageVersionApi {
    NotServed,
    NoEntry,
    Answered(Encoding),
}

async fn from_storage_version_api(
    client: &Client,
    group: &str,
    plural: &str,
    expected: &str,
) -> StorageVersionApi {
    use k8s_openapi::api::apiserverinternal::v1alpha1::StorageVersion;
    if client.list_api_group_resources(STORAGE_VERSION_API).await.is_err() {
        return StorageVersionApi::NotServed;
    }
    let api: Api<StorageVersion> = Api::all(client.clone());
    let name = format!("{}.{plural}", if group.is_empty() { "core" } else { group });
    let found = match api.get_opt(&name).await {
        Ok(Some(found)) => found,
        Ok(None) => return StorageVersionApi::NoEntry,
        Err(error) => {
            return StorageVersionApi::Answered(Encoding::Unconfirmed(format!(
                "the StorageVersion API could not be read: {error}"
            )));
        }
    };
    let status = found.status.unwrap_or_default();
    let common = status.common_encoding_version.clone();
    let all_equal = status
        .conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "AllEncodingVersionsEqual" && c.status == "True");
    StorageVersionApi::Answered(if all_equal && common.as_deref() == Some(expected) {
        Encoding::Confirmed { by: "the StorageVersion API" }
    } else {
        Encoding::Unconfirmed(format!(
            "the StorageVersion API reports common encoding version {} (all equal: {all_equal}), not {expected}",
            common.as_deref().unwrap_or("none")
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(generation: i64, storage: &str, stored: &[&str]) -> CrdState {
        CrdState {
            generation,
            storage_version: storage.into(),
            stored_versions: stored.iter().map(|v| v.to_string()).collect(),
        }
    }

    const CONFIRMED: Encoding = Encoding::Confirmed { by: "discovery" };

    #[test]
    fn prunes_to_the_storage_version_when_everything_holds() {
        let started = crd(2, "v2", &["v1", "v2"]);
        assert_eq!(decide(0, &started, &started, &CONFIRMED), Decision::Prune(vec!["v2".into()]));
    }

    #[test]
    fn never_prunes_after_failed_objects() {
        let started = crd(2, "v2", &["v1", "v2"]);
        let decision = decide(1, &started, &started, &CONFIRMED);
        assert_eq!(decision, Decision::Keep(Refusal::MigrationFailed { failed: 1 }));
    }

    #[test]
    fn never_prunes_when_the_crd_changed_while_migrating() {
        let started = crd(2, "v2", &["v1", "v2"]);
        let decision = decide(0, &started, &crd(3, "v2", &["v1", "v2"]), &CONFIRMED);
        assert_eq!(decision, Decision::Keep(Refusal::GenerationChanged { started: 2, now: 3 }));
        // A storage switch bumps the generation too; either way nothing is pruned.
        let switched = crd(2, "v3", &["v1", "v2", "v3"]);
        let decision = decide(0, &started, &switched, &CONFIRMED);
        assert!(
            matches!(decision, Decision::Keep(Refusal::StorageVersionChanged { .. })),
            "{decision:?}"
        );
    }

    #[test]
    fn never_prunes_on_an_unconfirmed_encoding() {
        let started = crd(2, "v2", &["v1", "v2"]);
        let encoding = Encoding::Unconfirmed("discovery published x, expected y".into());
        let Decision::Keep(refusal) = decide(0, &started, &started, &encoding) else { panic!() };
        assert_eq!(refusal.reason(), "EncodingUnconfirmed");
        assert!(refusal.to_string().contains("discovery published x, expected y"));
    }

    #[test]
    fn already_pruned_and_odd_lists_are_left_alone() {
        let pruned = crd(2, "v2", &["v2"]);
        assert_eq!(decide(0, &pruned, &pruned, &CONFIRMED), Decision::AlreadyPruned);
        let odd = crd(2, "v2", &["v1"]);
        assert!(matches!(
            decide(0, &odd, &odd, &CONFIRMED),
            Decision::Keep(Refusal::StorageVersionNotStored(_))
        ));
    }
}
