//! kube-svm: a Kubernetes storage version migrator.
//!
//! The tree is laid out in tiers; a module imports only from its own tier and the tiers listed
//! below it (`docs/architecture.md` draws the flow of a migration and holds a glossary):
//!
//! - [`cli`]: the `kube-svm` binary's subcommands (`controller`, `migrate`, `plan`, `status`,
//!   `retry`, `inspect`, `crds`): arguments and printing.
//! - [`controller`], [`migrate`] and [`trigger`]: the controller (reconcile, status writes,
//!   leader election), `kube-svm migrate`'s migrations in this process (checkpoint files), and
//!   the migrations kube-svm creates on its own (CRD storage switches, discovery hashes).
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
pub mod migrate;
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

    /// The tree as `docs/architecture.md` draws it, read from the source: tiers from the bottom
    /// up (`controller`, `migrate` and `trigger` share one); a module names only its own tier and those
    /// below it.
    const TIERS: [&[&str]; 11] = [
        &["api"],
        &["rules"],
        &["apiserver"],
        &["ops"],
        &["census"],
        &["evidence"],
        &["engine"],
        &["lifecycle"],
        &["removal"],
        &["controller", "migrate", "trigger"],
        &["cli"],
    ];

    /// The most lines of code (tests aside) one file may hold.
    const MOST_LINES: usize = 500;

    /// Every source file under `src/`: its module path and its code without its tests.
    fn modules() -> Vec<(Vec<String>, String)> {
        fn walk(dir: &std::path::Path, path: &[String], out: &mut Vec<(Vec<String>, String)>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap().path();
                let name = entry.file_stem().unwrap().to_string_lossy().into_owned();
                let mut here = path.to_vec();
                if entry.is_dir() {
                    here.push(name);
                    walk(&entry, &here, out);
                    continue;
                }
                if !["lib", "main", "mod"].contains(&name.as_str()) {
                    here.push(name);
                }
                let text = std::fs::read_to_string(&entry).unwrap();
                let code = text.split("\n#[cfg(test)]\nmod ").next().unwrap();
                let code: Vec<&str> =
                    code.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
                out.push((here, code.join("\n")));
            }
        }
        let mut out = Vec::new();
        walk(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &[], &mut out);
        out
    }

    /// The modules `code` (of module `path`) names through `crate::` and `super::`, resolved to
    /// the longest module that exists; the module itself and its ancestors left out.
    fn imports(path: &[String], code: &str, known: &[Vec<String>]) -> Vec<Vec<String>> {
        let word = |c: char| c.is_alphanumeric() || c == '_';
        let mut found = Vec::new();
        for (prefix, base) in
            [("crate::", Vec::new()), ("super::", path[..path.len().saturating_sub(1)].to_vec())]
        {
            for (at, _) in code.match_indices(prefix) {
                if at > 0 && code[..at].ends_with(|c: char| word(c) || c == ':') {
                    continue;
                }
                let rest = &code[at + prefix.len()..];
                // `a::b::{c, d::e}`: each name in braces is a path of its own.
                let head: String = rest.chars().take_while(|&c| word(c) || c == ':').collect();
                let head: Vec<String> =
                    head.split("::").filter(|p| !p.is_empty()).map(str::to_owned).collect();
                let mut paths = vec![head.clone()];
                let after = &rest[rest.chars().take_while(|&c| word(c) || c == ':').count()..];
                if let Some(inner) = after.strip_prefix('{') {
                    let inner = &inner[..inner.find('}').unwrap_or(inner.len())];
                    for name in inner.split(',') {
                        let name: Vec<String> =
                            name.trim().split("::").map(str::to_owned).collect();
                        paths.push(head.iter().cloned().chain(name).collect());
                    }
                }
                for tail in paths {
                    let mut full: Vec<String> = base.iter().cloned().chain(tail).collect();
                    while !full.is_empty() && !known.contains(&full) {
                        full.pop();
                    }
                    if !full.is_empty() && !path.starts_with(&full) {
                        found.push(full);
                    }
                }
            }
        }
        found
    }

    #[test]
    fn the_tree_keeps_its_tiers() {
        let modules = modules();
        let known: Vec<Vec<String>> = modules.iter().map(|(path, _)| path.clone()).collect();
        let tier = |path: &[String]| {
            let top = path.first().map(String::as_str).unwrap_or("");
            TIERS.iter().position(|tier| tier.contains(&top))
        };
        let mut wrong = Vec::new();
        let mut edges = std::collections::BTreeMap::<Vec<String>, Vec<Vec<String>>>::new();
        for (path, code) in &modules {
            let name = path.join("::");
            if path.len() == 1 && tier(path).is_none() {
                wrong.push(format!("{name}: a flat module outside the tiers"));
            }
            let lines = code.lines().filter(|l| !l.trim().is_empty()).count();
            if lines > MOST_LINES {
                wrong.push(format!("{name}: {lines} lines of code, more than {MOST_LINES}"));
            }
            if path.first().is_some_and(|top| top == "rules") && code.contains("Client") {
                wrong.push(format!("{name}: a rule names a client"));
            }
            for import in imports(path, code, &known) {
                if let (Some(from), Some(to)) = (tier(path), tier(&import))
                    && to > from
                {
                    let import = import.join("::");
                    wrong.push(format!("{name} imports {import} from a higher tier"));
                }
                edges.entry(path.clone()).or_default().push(import);
            }
        }
        // Two modules that reach each other through their imports.
        for (from, tos) in &edges {
            for to in tos {
                let mut seen = vec![to.clone()];
                let mut next = vec![to.clone()];
                while let Some(at) = next.pop() {
                    for further in edges.get(&at).into_iter().flatten() {
                        if !seen.contains(further) {
                            seen.push(further.clone());
                            next.push(further.clone());
                        }
                    }
                }
                if seen.contains(from) {
                    wrong.push(format!(
                        "{} and {} import each other",
                        from.join("::"),
                        to.join("::")
                    ));
                }
            }
        }
        wrong.sort();
        wrong.dedup();
        assert!(wrong.is_empty(), "the tree leaves its tiers:\n{}", wrong.join("\n"));
    }
}
