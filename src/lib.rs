//! kube-svm: a Kubernetes storage version migrator.
//!
//! The file tree is the map: [`api`] holds the `migration.k8s.io` types, [`cli`] the subcommands
//! of the `kube-svm` binary, [`telemetry`] logging setup, [`storage_hash`] the apiserver's
//! storage version hash, and [`stored`] how a value in etcd is encoded.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod api;
pub mod cli;
pub mod engine;
pub mod storage_hash;
pub mod stored;
pub mod telemetry;
