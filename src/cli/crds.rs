//! `kube-svm crds`: print the CustomResourceDefinitions generated from the Rust types.

use std::io::Write;

use anyhow::Context;

use crate::api;

pub fn run() -> anyhow::Result<()> {
    let yaml = api::crds_yaml().context("failed to serialize the CRDs")?;
    std::io::stdout().write_all(yaml.as_bytes()).context("failed to write the CRDs")
}
