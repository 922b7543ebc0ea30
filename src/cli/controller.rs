//! `kube-svm controller`: what the container runs; its arguments, made into a
//! [`Process`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;

use super::cancel_on_signal;
use super::engine::{Built, EngineArgs, seconds};
use super::kube::{KubeArgs, in_cluster};
use super::values;
use crate::controller::process::{self, Process};
use crate::controller::{self, leader};
use crate::ops::metrics::Metrics;

/// The most migrations `--concurrency` lets run at once: each has a write window of its own, so
/// past a few the apiserver is the bound, and a thousand is far beyond any cluster's resources
/// worth migrating at once (and far from the semaphore's limit, where tokio panics).
const MAX_CONCURRENCY: usize = 1_000;

#[derive(Args, Debug)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub kube: KubeArgs,

    #[command(flatten)]
    pub engine: EngineArgs,

    /// Migrations of different resources run at once.
    #[arg(long, env = "KUBE_SVM_CONCURRENCY", default_value_t = 2, value_parser = values::count(1, MAX_CONCURRENCY))]
    pub concurrency: usize,

    /// Least seconds between two progress writes to a migration's status.
    #[arg(long, env = "KUBE_SVM_CHECKPOINT_INTERVAL", default_value_t = 5.0, value_parser = values::seconds(0.0))]
    pub checkpoint_interval: f64,

    /// Elect a leader on a Lease so only one replica migrates; on by default in a pod.
    #[arg(long, env = "KUBE_SVM_LEADER_ELECT")]
    pub leader_elect: Option<bool>,

    /// Namespace of the Lease; defaults to the kubeconfig's (or the pod's) namespace.
    #[arg(long, env = "KUBE_SVM_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// Name of the Lease.
    #[arg(long, env = "KUBE_SVM_LEADER_ELECTION_NAME", default_value = "kube-svm")]
    pub leader_election_name: String,

    /// Seconds a Lease is valid without renewal.
    #[arg(long, env = "KUBE_SVM_LEASE_DURATION", default_value_t = 15, value_parser = values::count(leader::MIN_LEASE_SECONDS, leader::MAX_LEASE_SECONDS))]
    pub lease_duration: u64,

    /// This replica's identity in the Lease and on Events; defaults to the pod or host name.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// Tries a migration gets when discovery of its resource cannot be read (5 s apart, doubling
    /// up to a minute), before it fails.
    #[arg(long, env = "KUBE_SVM_DISCOVERY_ATTEMPTS", default_value_t = controller::DISCOVERY_ATTEMPTS, value_parser = values::count(1, u32::MAX))]
    pub discovery_attempts: u32,

    /// Create a migration when a CRD's storedVersions lists more than its storage version.
    #[arg(long, env = "KUBE_SVM_CRD_TRIGGER", default_value_t = true, action = clap::ArgAction::Set)]
    pub crd_trigger: bool,

    /// With the CRD trigger: also migrate a CRD that defines a version it no longer serves,
    /// removing from every object the `managedFields` entries naming such versions, so they can
    /// be removed from the CRD without breaking server-side apply.
    #[arg(long, env = "KUBE_SVM_CLEAN_MANAGED_FIELDS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub clean_managed_fields: bool,
    /// With --clean-managed-fields: seconds a version must be seen unserved before its
    /// entries are cleaned (serving it again meanwhile keeps them), unless the CRD names it in
    /// the annotation kube-svm.io/remove-versions. The grace starts over when the controller
    /// restarts.
    #[arg(long, env = "KUBE_SVM_CLEAN_MANAGED_FIELDS_AFTER", default_value_t = 86400.0, value_parser = values::seconds(0.0))]
    pub clean_managed_fields_after: f64,
    /// Seconds the CRD trigger waits after one of its migrations failed before it runs it again
    /// in place; the wait doubles with each retry, up to an hour, for at most 10 retries.
    #[arg(long, env = "KUBE_SVM_CRD_TRIGGER_RETRY_DELAY", default_value_t = 60.0, value_parser = values::seconds(1.0))]
    pub crd_trigger_retry_delay: f64,

    /// Keep a StorageState per resource from discovery, and create a migration when a
    /// resource's storage version hash changes (kube-storage-version-migrator's trigger).
    #[arg(long, env = "KUBE_SVM_DISCOVERY_TRIGGER", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub discovery_trigger: bool,

    /// Seconds between two polls of discovery by the discovery trigger (it also polls whenever
    /// a CRD changes).
    #[arg(long, env = "KUBE_SVM_DISCOVERY_INTERVAL", default_value_t = 600.0, value_parser = values::seconds(1.0))]
    pub discovery_interval: f64,

    /// Finished migrations the discovery trigger keeps of each resource, newest first; it
    /// deletes older ones (its back-off counts the failures in a row among those kept).
    #[arg(long, env = "KUBE_SVM_DISCOVERY_KEEP_FINISHED", default_value_t = crate::trigger::history::KEPT_PER_RESOURCE, value_parser = values::count(1usize, 1000))]
    pub discovery_keep_finished: usize,

    /// Address of the admin server: /metrics, /healthz, /readyz (upstream's port).
    #[arg(long, env = "KUBE_SVM_METRICS_BIND_ADDRESS", default_value = "0.0.0.0:2112")]
    pub metrics_bind_address: SocketAddr,
}

pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let ControllerArgs {
        kube,
        engine,
        concurrency,
        checkpoint_interval,
        leader_elect,
        leader_election_namespace,
        leader_election_name,
        lease_duration,
        identity,
        metrics_bind_address,
        discovery_attempts,
        crd_trigger,
        clean_managed_fields,
        clean_managed_fields_after,
        crd_trigger_retry_delay,
        discovery_trigger,
        discovery_interval,
        discovery_keep_finished,
    } = args;
    let metrics = Arc::new(Metrics::new().context("failed to register the metrics")?);
    let config = kube.config().await?;
    let own_namespace = Some(config.default_namespace.clone());
    let Built { engine, requests, encoding, write_to_status } =
        engine.build(config, metrics.clone(), own_namespace)?;
    let identity = identity.unwrap_or_else(default_identity);
    let election = leader_elect.unwrap_or_else(in_cluster).then(|| {
        leader::Settings::new(
            leader_election_namespace
                .unwrap_or_else(|| requests.client().default_namespace().to_owned()),
            leader_election_name,
            identity.clone(),
            Duration::from_secs(lease_duration),
        )
    });
    let settings = controller::Settings {
        concurrency,
        checkpoint_interval: seconds(checkpoint_interval),
        identity,
        encoding,
        crd_trigger,
        clean_managed_fields,
        clean_managed_fields_after: seconds(clean_managed_fields_after),
        write_to_status,
        discovery_attempts: discovery_attempts.max(1),
        discovery_trigger: discovery_trigger
            .then(|| seconds(discovery_interval).max(Duration::from_secs(1))),
        discovery_keep_finished,
        crd_trigger_retry_delay: seconds(crd_trigger_retry_delay),
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    process::run(Process {
        requests,
        engine,
        settings,
        metrics,
        admin_address: metrics_bind_address,
        election,
        shutdown,
    })
    .await
}

fn default_identity() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "kube-svm".to_owned());
    format!("{host}-{}", std::process::id())
}
