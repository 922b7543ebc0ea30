//! Test support: a real control plane, raw etcd reads, and small helpers for test objects.

pub mod admission;
pub mod chart;
mod control_plane;
pub mod conversion;
pub mod docs;
mod etcd;
pub mod fixtures;
pub mod image;
pub mod invariant;
pub mod migrations;
pub mod process;
pub mod real_crds;
pub mod recorder;
pub mod scenario;
mod secure_etcd;
pub mod upstream;
pub mod webhook;

pub use control_plane::{
    AuditEvent, CONTROLLER_NAMESPACE, ControlPlane, Topology, asset, free_port, shared,
};
pub use etcd::{Etcd, KeyValue};
pub use scenario::Scenario;
pub use secure_etcd::SecureEtcd;

/// A plain HTTP client for the harness's own requests (etcd's health and compaction, the admin
/// port). kube-svm builds reqwest without a default TLS provider, so one is installed first even
/// though these requests never use TLS.
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}
