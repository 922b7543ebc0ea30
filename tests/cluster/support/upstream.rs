//! kube-storage-version-migrator's CRDs, installed as its manifests are (`kubectl apply`): the
//! same names, group, version and kinds as kube-svm's, but a StorageVersionMigration status
//! schema holding only `conditions`, so the apiserver drops every other status field.

use std::process::Command;

use super::fixtures::wait_established;
use super::{ControlPlane, asset};

/// The names of the two CRDs, the same as kube-svm's.
pub const CRDS: [&str; 2] =
    ["storageversionmigrations.migration.k8s.io", "storagestates.migration.k8s.io"];

/// Upstream's two CRDs (apiextensions v1, structural, unknown fields pruned): the schema shape
/// of its `manifests/`, with short descriptions.
const UPSTREAM_CRDS: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: storageversionmigrations.migration.k8s.io
  annotations:
    api-approved.kubernetes.io: "https://github.com/kubernetes/community/pull/2524"
spec:
  group: migration.k8s.io
  names:
    kind: StorageVersionMigration
    listKind: StorageVersionMigrationList
    plural: storageversionmigrations
    singular: storageversionmigration
  scope: Cluster
  preserveUnknownFields: false
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          spec:
            type: object
            required: [resource]
            properties:
              continueToken: {type: string}
              resource:
                type: object
                properties:
                  group: {type: string}
                  resource: {type: string}
                  version: {type: string}
          status:
            type: object
            properties:
              conditions:
                type: array
                items:
                  type: object
                  required: [status, type]
                  properties:
                    lastUpdateTime: {type: string, format: date-time}
                    message: {type: string}
                    reason: {type: string}
                    status: {type: string}
                    type: {type: string}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: storagestates.migration.k8s.io
  annotations:
    api-approved.kubernetes.io: "https://github.com/kubernetes/enhancements/pull/747"
spec:
  group: migration.k8s.io
  names:
    kind: StorageState
    listKind: StorageStateList
    plural: storagestates
    singular: storagestate
  scope: Cluster
  preserveUnknownFields: false
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata:
            type: object
            properties:
              name: {type: string}
          spec:
            type: object
            properties:
              resource:
                type: object
                properties:
                  group: {type: string}
                  resource: {type: string}
          status:
            type: object
            properties:
              currentStorageVersionHash: {type: string}
              lastHeartbeatTime: {type: string, format: date-time}
              persistedStorageVersionHashes:
                type: array
                items: {type: string}
"#;

/// Installs upstream's CRDs with `kubectl apply` (client-side, as its README does) and waits
/// until both are established.
pub async fn install_upstream_crds(control_plane: &ControlPlane) {
    let path = control_plane.path("upstream-crds.yaml");
    std::fs::write(&path, UPSTREAM_CRDS).expect("written");
    let path = path.to_string_lossy().into_owned();
    let out = kubectl(control_plane, &["apply", "-f", &path]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let client = control_plane.client().await;
    for name in CRDS {
        wait_established(&client, name).await;
    }
}

/// Runs the harness's kubectl with the admin kubeconfig.
pub fn kubectl(control_plane: &ControlPlane, args: &[&str]) -> std::process::Output {
    let kubectl = asset("kubectl").expect("kubectl (hack/control-plane.sh builds it)");
    Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(control_plane.kubeconfig())
        .args(args)
        .output()
        .expect("kubectl runs")
}

/// Runs the documented command that takes the CRDs over (the line of the docs' `sh` blocks that
/// starts with `kube-svm crds |`) with bash, as a reader would, with the harness's kubectl and this
/// kube-svm on `PATH`; returns what it printed, after checking it exited 0.
pub fn take_over_as_the_readme_says(control_plane: &ControlPlane) -> String {
    let lines = super::docs::sh_lines("kube-svm crds |");
    let line = lines.first().expect("the docs show how to take the CRDs over");
    let readers = super::process::ReadersPath::new();
    // pipefail: a failing `kube-svm crds` must fail the line.
    let output = Command::new("bash")
        .args(["-o", "pipefail", "-c"])
        .arg(format!("exec 2>&1\n{line}"))
        .env("PATH", &readers.path)
        .env("KUBECONFIG", control_plane.kubeconfig())
        .env_remove("RUST_LOG")
        .output()
        .expect("sh runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("$ {line}\n{text}");
    assert!(output.status.success(), "{line}: {text}");
    text
}
