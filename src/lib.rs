//! kube-svm: a Kubernetes storage version migrator.
//!
//! The file tree is the map: [`api`] holds the `migration.k8s.io` types, [`cli`] the subcommands
//! of the `kube-svm` binary, [`telemetry`] logging setup, [`storage_hash`] the apiserver's
//! storage version hash, and [`census`] how objects are really stored in etcd.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod answers;
pub mod api;
pub mod census;
pub mod cli;
pub mod controller;
pub mod encoding;
pub mod engine;
pub mod fence;
pub mod in_tree;
pub mod leader;
pub mod lifecycle;
pub mod metrics;
pub mod plan;
pub mod reachability;
pub mod server;
pub mod storage_hash;
pub mod storedversions;
pub mod telemetry;
pub mod trigger;

/// An error and its sources, joined with `: `, for logs and status messages. A source whose
/// words are already there (errors that print their source, as kube's and hyper's do) is not
/// said twice.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let words = cause.to_string();
        if !out.contains(&words) {
            out.push_str(": ");
            out.push_str(&words);
        }
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("failed to start watching object: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("failed to list widgets")]
    struct Wraps(#[source] std::io::Error);

    #[test]
    fn an_error_chain_says_each_cause_once() {
        let refused = || std::io::Error::other("connection refused");
        assert_eq!(
            super::error_chain(&Repeats(refused())),
            "failed to start watching object: connection refused"
        );
        assert_eq!(
            super::error_chain(&Wraps(refused())),
            "failed to list widgets: connection refused"
        );
    }
}
