//! `kube-svm controller`: what the container runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::kube::{KubeArgs, in_cluster};
use crate::controller::{self, Stopped};
use crate::engine::{self, Engine, RateLimiter};
use crate::leader;
use crate::metrics::Metrics;
use crate::server::{self, Health};

#[derive(Args, Debug)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub kube: KubeArgs,

    /// Requests per second to the apiserver, averaged (upstream's flag).
    #[arg(long, env = "KUBE_SVM_KUBE_API_QPS", default_value_t = 100.0)]
    pub kube_api_qps: f64,

    /// Requests sent at once above the average rate (upstream's flag).
    #[arg(long, env = "KUBE_SVM_KUBE_API_BURST", default_value_t = 200)]
    pub kube_api_burst: u32,

    /// Migrations of different resources run at once.
    #[arg(long, env = "KUBE_SVM_CONCURRENCY", default_value_t = 2)]
    pub concurrency: usize,

    /// Writes in flight per migration, at most (throttling narrows it).
    #[arg(long, env = "KUBE_SVM_WRITES_IN_FLIGHT", default_value_t = 16)]
    pub writes_in_flight: usize,

    /// Objects per list request.
    #[arg(long, env = "KUBE_SVM_PAGE_SIZE", default_value_t = 500)]
    pub page_size: u32,

    /// Least seconds between two progress writes to a migration's status.
    #[arg(long, env = "KUBE_SVM_CHECKPOINT_INTERVAL", default_value_t = 5.0)]
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
    #[arg(long, env = "KUBE_SVM_LEASE_DURATION", default_value_t = 15)]
    pub lease_duration: u64,

    /// This replica's identity in the Lease and on Events; defaults to the pod or host name.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// Seconds the discovery storage version hash of a CRD must be seen unchanged before
    /// kube-svm trusts that every apiserver encodes in the new version (where the StorageVersion
    /// API is not served).
    #[arg(long, env = "KUBE_SVM_STORAGE_VERSION_SETTLE", default_value_t = 10.0)]
    pub storage_version_settle: f64,

    /// Write objects back through their `status` subresource wherever the resource has one: it
    /// re-encodes the whole object, and admission webhooks and policies rarely guard it. A
    /// migration can ask for it alone with the annotation `kube-svm.io/write-to-status: "true"`.
    #[arg(long, env = "KUBE_SVM_WRITE_TO_STATUS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub write_to_status: bool,

    /// Create a migration when a CRD's storedVersions lists more than its storage version.
    #[arg(long, env = "KUBE_SVM_CRD_TRIGGER", default_value_t = true, action = clap::ArgAction::Set)]
    pub crd_trigger: bool,

    /// Address of the admin server: /metrics, /healthz, /readyz (upstream's port).
    #[arg(long, env = "KUBE_SVM_METRICS_BIND_ADDRESS", default_value = "0.0.0.0:2112")]
    pub metrics_bind_address: SocketAddr,
}

pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let ControllerArgs {
        kube,
        kube_api_qps,
        kube_api_burst,
        concurrency,
        writes_in_flight,
        page_size,
        checkpoint_interval,
        leader_elect,
        leader_election_namespace,
        leader_election_name,
        lease_duration,
        identity,
        metrics_bind_address,
        storage_version_settle,
        crd_trigger,
        write_to_status,
    } = args;
    let metrics = Arc::new(Metrics::new().context("failed to register the metrics")?);
    let health = Arc::new(Health::default());
    let config = kube.config().await?;
    let client = kube::Client::try_from(config.clone()).context("failed to create a client")?;
    let identity = identity.unwrap_or_else(default_identity);
    let limiter = Arc::new(RateLimiter::new(kube_api_qps, kube_api_burst));
    let engine_settings =
        engine::Settings { page_size, writes_in_flight, ..engine::Settings::default() };
    let engine = Engine::new(config, limiter, engine_settings, metrics.clone())
        .context("failed to create a client")?;
    let settings = controller::Settings {
        concurrency,
        checkpoint_interval: Duration::from_secs_f64(checkpoint_interval.max(0.0)),
        identity: identity.clone(),
        storage_version_settle: Duration::from_secs_f64(storage_version_settle.max(0.0)),
        crd_trigger,
        write_to_status,
    };

    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let server_stop = CancellationToken::new();
    let listener = server::bind(metrics_bind_address)
        .await
        .with_context(|| format!("failed to listen on {metrics_bind_address}"))?;
    tokio::spawn(server::serve(listener, metrics.clone(), health.clone(), server_stop.clone()));
    let _stop_server = server_stop.drop_guard();
    tokio::spawn(wait_for_crds(client.clone(), health.clone()));

    if !leader_elect.unwrap_or_else(in_cluster) {
        health.leadership_known.store(true, Ordering::Relaxed);
        metrics.leader.set(1);
        controller::run(client, engine, settings, health, shutdown, CancellationToken::new()).await;
        return Ok(());
    }
    let lease_duration = Duration::from_secs(lease_duration.max(2));
    let leader_settings = leader::Settings {
        namespace: leader_election_namespace
            .unwrap_or_else(|| client.default_namespace().to_owned()),
        name: leader_election_name,
        identity,
        lease_duration,
        // client-go's ratios: renew deadline 2/3 of the lease, retries every 2 s.
        renew_deadline: lease_duration * 2 / 3,
        retry_period: Duration::from_secs(2).min(lease_duration / 3),
    };
    let on_attempt = |won: bool| {
        health.leadership_known.store(true, Ordering::Relaxed);
        health.beat();
        metrics.leader.set(i64::from(won));
    };
    let Some(leadership) =
        leader::acquire(client.clone(), leader_settings, &shutdown, on_attempt).await?
    else {
        info!("stopped before becoming the leader");
        return Ok(());
    };
    let stopped =
        controller::run(client, engine, settings, health, shutdown, leadership.lost()).await;
    metrics.leader.set(0);
    match stopped {
        Stopped::Shutdown => {
            leadership.release().await;
            Ok(())
        }
        Stopped::LeadershipLost => {
            anyhow::bail!("lost leadership; exiting so a new leader takes over")
        }
    }
}

/// Marks the CRDs established once the apiserver says both are.
async fn wait_for_crds(client: kube::Client, health: Arc<Health>) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(client);
    loop {
        let mut established = true;
        for crd in crate::api::crds() {
            let name = crd.metadata.name.unwrap_or_default();
            let conditions = match crds.get_opt(&name).await {
                Ok(Some(found)) => found.status.and_then(|s| s.conditions).unwrap_or_default(),
                Ok(None) | Err(_) => Vec::new(),
            };
            established &=
                conditions.iter().any(|c| c.type_ == "Established" && c.status == "True");
        }
        if established {
            health.crds_established.store(true, Ordering::Relaxed);
            return;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn default_identity() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "kube-svm".to_owned());
    format!("{host}-{}", std::process::id())
}

/// Fires `shutdown` on SIGTERM or SIGINT.
async fn cancel_on_signal(shutdown: CancellationToken) {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                return;
            }
        };
    tokio::select! {
        _ = terminate.recv() => info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT: stopping"),
    }
    shutdown.cancel();
}
