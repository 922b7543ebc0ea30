//! `kube-svm crds`: print the CustomResourceDefinitions generated from the Rust types.

use std::io::Write;

use anyhow::Context;
use clap::Args;

use crate::api;

#[derive(Args, Debug)]
pub struct CrdsArgs {
    /// Print them as the Helm chart's template (optional install, kept on uninstall).
    #[arg(long)]
    pub chart_template: bool,
}

pub fn run(args: CrdsArgs) -> anyhow::Result<()> {
    let CrdsArgs { chart_template } = args;
    let yaml = match chart_template {
        true => api::crds_chart_template(),
        false => api::crds_yaml(),
    };
    let yaml = yaml.context("failed to serialize the CRDs")?;
    std::io::stdout().write_all(yaml.as_bytes()).context("failed to write the CRDs")
}
