//! kube-svm: a Kubernetes storage version migrator.
//!
//! The tree is laid out in tiers; a module imports only from its own tier and the tiers listed
//! below it (`docs/architecture.md` draws the flow of a migration and holds a glossary):
//!
//! - [`cli`]: the `kube-svm` binary's subcommands (`controller`, `migrate`, `plan`, `status`,
//!   `retry`, `inspect`, `crds`): arguments, printing, and the `migrate` host for now.
//! - [`controller`] and [`trigger`]: the controller (reconcile, status writes, leader election)
//!   and the migrations kube-svm creates on its own (CRD storage switches, discovery hashes).
//! - [`removal`]: the road to removing a version: what `kube-svm plan` lists, and what keeps a
//!   version in its CRD (`plan --drop`); pure.
//! - [`lifecycle`]: one migration from resource to end, the same for the controller and for
//!   `kube-svm migrate`: resolve, wait for the encoding, run the engine, prove, prune.
//! - [`engine`]: pages through every object of one resource and writes each back unchanged.
//! - [`evidence`]: what is read before and after writing: the apiservers' encoding, how many
//!   apiservers there are, whether a conversion webhook answers.
//! - [`census`]: how objects are really stored in etcd, read key by key.
//! - [`ops`]: Prometheus series, the admin HTTP server (`/metrics`, `/healthz`, `/readyz`), and
//!   logging.
//! - [`apiserver`]: talking to the apiserver: answers by status code, the leader's term every
//!   write checks (fence), saying an outage once, the in-tree migrator's migrations.
//! - [`rules`]: pure decisions, with no `kube::Client` below: the `storedVersions` prune
//!   decision, the encoding verdict, `managedFields` cleaning, the storage version hash.
//! - [`api`]: the `migration.k8s.io/v1alpha1` types (StorageVersionMigration, StorageState),
//!   their conditions, and which CRDs are installed.

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
