//! Test support: a real control plane, raw etcd reads, and small helpers for test objects.

pub mod admission;
pub mod chart;
mod control_plane;
mod etcd;
pub mod fixtures;
pub mod invariant;
pub mod migrations;
pub mod process;
mod secure_etcd;

pub use control_plane::{CONTROLLER_NAMESPACE, ControlPlane, shared};
pub use etcd::{Etcd, KeyValue};
pub use secure_etcd::SecureEtcd;
