//! The `migration.k8s.io/v1alpha1` API that kube-svm serves and acts on.
//!
//! The types are wire-compatible with kubernetes-sigs/kube-storage-version-migrator: every upstream
//! field keeps its name and meaning, and kube-svm only adds optional status fields. The CRD YAML
//! committed under `config/crd/` is generated from these types (`kube-svm crds`).

pub mod conditions;
mod migration;
mod storage_state;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use migration::{
    Checkpoint, FailedObject, GroupVersionResource, MigrationCondition, MigrationProgress,
    MigrationTarget, StorageVersionMigration, StorageVersionMigrationSpec,
    StorageVersionMigrationStatus,
};
pub use storage_state::{GroupResource, StorageState, StorageStateSpec, StorageStateStatus};

/// The API group of kube-svm's own resources, shared with the upstream migrator.
pub const GROUP: &str = "migration.k8s.io";

/// Annotation every CRD in a `*.k8s.io` group must carry, or the apiserver rejects it.
pub const API_APPROVED_ANNOTATION: &str = "api-approved.kubernetes.io";

/// Value of [`API_APPROVED_ANNOTATION`]. Upstream uses a value starting with `unapproved`, which the
/// apiserver accepts and reports through the `KubernetesAPIApprovalPolicyConformant` condition.
pub const API_APPROVED_VALUE: &str =
    "unapproved, kube-svm serves the kube-storage-version-migrator API";

/// Both CRDs, in the order they are printed and installed.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![StorageVersionMigration::crd(), StorageState::crd()]
}

/// The CRDs as one multi-document YAML stream, exactly as committed under `config/crd/`.
pub fn crds_yaml() -> Result<String, serde_yaml_ng::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed CRDs are what `kube-svm crds` prints; regenerate with `make crds`.
    #[test]
    fn committed_crds_match_the_types() {
        let committed = include_str!("../../config/crd/migration.k8s.io.yaml");
        let generated = crds_yaml().expect("CRDs serialize");
        assert!(
            committed == generated,
            "config/crd/migration.k8s.io.yaml is out of date: run `make crds`"
        );
    }

    #[test]
    fn crds_carry_the_api_approval_annotation() {
        for crd in crds() {
            let annotations = crd.metadata.annotations.unwrap_or_default();
            assert_eq!(
                annotations.get(API_APPROVED_ANNOTATION).map(String::as_str),
                Some(API_APPROVED_VALUE)
            );
            assert!(API_APPROVED_VALUE.starts_with("unapproved"));
        }
    }

    #[test]
    fn crds_are_cluster_scoped_with_status_subresource() {
        for crd in crds() {
            assert_eq!(crd.spec.group, GROUP);
            assert_eq!(crd.spec.scope, "Cluster");
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, "v1alpha1");
            assert!(version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
        }
    }
}
