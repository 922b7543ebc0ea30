//! kube-svm: a Kubernetes storage version migrator.
//!
//! The file tree is the map. A migration flows from the top of this list to the bottom
//! (`docs/architecture.md` draws it):
//!
//! - [`cli`]: the `kube-svm` binary's subcommands (`controller`, `migrate`, `plan`, `status`,
//!   `retry`, `inspect`, `crds`); each is a thin shell over the modules below.
//! - [`api`]: the `migration.k8s.io/v1alpha1` types (StorageVersionMigration, StorageState),
//!   their conditions, and which CRDs are installed.
//! - [`trigger`]: migrations kube-svm creates on its own (CRD storage switches, discovery hashes).
//! - [`controller`]: reconciles StorageVersionMigrations: admission, leadership, status writes.
//! - [`lifecycle`]: one migration from resource to end, the same for the controller and for
//!   `kube-svm migrate`: resolve, wait for the encoding, run the engine, prove, prune.
//! - [`engine`]: pages through every object of one resource and writes each back unchanged.
//! - [`managed_fields`]: which `managedFields` entries name a version no longer served, and what
//!   to keep of them.
//! - [`encoding`]: evidence that the apiservers encode a resource in the expected version.
//! - [`apiservers`]: how many apiservers there are, and whether discovery samples can reach each.
//! - [`conversion`]: whether a CRD's conversion webhook answers, before the first write.
//! - [`storedversions`]: the proof-checked pruning of a CRD's `status.storedVersions`.
//! - [`census`]: how objects are really stored in etcd, read key by key.
//! - [`plan`]: the pure part of `kube-svm plan` (what needs migrating and why).
//! - [`removal`]: the pure part of `kube-svm plan --drop` (what keeps a version in its CRD).
//! - [`in_tree`]: the in-tree migrator's `storagemigration.k8s.io/v1` migrations, to coexist.
//! - [`storage_hash`]: the apiserver's storage version hash.
//! - [`answers`]: reading the apiserver's answers by status code, in one place.
//! - [`reachability`]: saying once that the apiserver is unreachable, and once that it is back.
//! - [`leader`] and [`fence`]: leader election, and how long this process may still write.
//! - [`metrics`], [`server`] and [`telemetry`]: Prometheus series, the admin HTTP server
//!   (`/metrics`, `/healthz`, `/readyz`), and logging.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]
#![warn(missing_docs)]

pub mod api;
pub mod apiserver;
pub mod census;
pub mod cli;
pub mod controller;
pub mod engine;
pub mod evidence;
pub mod lifecycle;
pub mod ops;
pub mod removal;
pub mod rules;
pub mod trigger;

// The engine reaches these modules by their paths before the tiers; it is written against them.
use apiserver::{answers, fence};
use ops::metrics;
use rules::managed_fields;

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
