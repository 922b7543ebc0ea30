//! `kube-svm controller`: what the container runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::kube::{KubeArgs, in_cluster};
use crate::controller::{self, Stopped};
use crate::engine::{self, Engine, RateLimiter, rate_limit};
use crate::fence::Fence;
use crate::leader;
use crate::metrics::Metrics;
use crate::server::{self, Health};

#[derive(Args, Debug)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub kube: KubeArgs,

    /// Requests per second to the apiserver, averaged (upstream's flag); 0, the default, sets no
    /// client-side limit: the write window yields to the apiserver's throttling and latency.
    #[arg(long, env = "KUBE_SVM_KUBE_API_QPS", default_value_t = rate_limit::DEFAULT_QPS)]
    pub kube_api_qps: f64,

    /// Requests sent at once above the average rate (upstream's flag).
    #[arg(long, env = "KUBE_SVM_KUBE_API_BURST", default_value_t = rate_limit::DEFAULT_BURST)]
    pub kube_api_burst: u32,

    /// Migrations of different resources run at once.
    #[arg(long, env = "KUBE_SVM_CONCURRENCY", default_value_t = 2)]
    pub concurrency: usize,

    /// Writes in flight per migration, at most (throttling and rising latency narrow it).
    #[arg(long, env = "KUBE_SVM_WRITES_IN_FLIGHT", default_value_t = 64)]
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

    /// Seconds to wait, in all, for discovery to publish a CRD's new storage version hash and
    /// hold it for the settle period; past that the migration runs but storedVersions is kept.
    #[arg(long, env = "KUBE_SVM_STORAGE_VERSION_WAIT", default_value_t = 120.0)]
    pub storage_version_wait: f64,

    /// Seconds one request to the apiserver may go unanswered (watches excepted).
    #[arg(long, env = "KUBE_SVM_REQUEST_TIMEOUT", default_value_t = 30.0)]
    pub request_timeout: f64,

    /// Tries a migration gets when discovery of its resource cannot be read (5 s apart, doubling
    /// up to a minute), before it fails.
    #[arg(long, env = "KUBE_SVM_DISCOVERY_ATTEMPTS", default_value_t = controller::DISCOVERY_ATTEMPTS)]
    pub discovery_attempts: u32,

    /// Seconds a migration waits, in all, for an apiserver that is down before it fails.
    #[arg(long, env = "KUBE_SVM_APISERVER_OUTAGE_TIMEOUT", default_value_t = 900.0)]
    pub apiserver_outage_timeout: f64,

    /// Write objects back through their `status` subresource wherever the resource has one: it
    /// re-encodes the whole object, and admission webhooks and policies rarely guard it. A
    /// migration can ask for it alone with the annotation `kube-svm.io/write-to-status: "true"`.
    #[arg(long, env = "KUBE_SVM_WRITE_TO_STATUS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub write_to_status: bool,

    /// Create a migration when a CRD's storedVersions lists more than its storage version.
    #[arg(long, env = "KUBE_SVM_CRD_TRIGGER", default_value_t = true, action = clap::ArgAction::Set)]
    pub crd_trigger: bool,

    /// Keep a StorageState per resource from discovery, and create a migration when a
    /// resource's storage version hash changes (kube-storage-version-migrator's trigger).
    #[arg(long, env = "KUBE_SVM_DISCOVERY_TRIGGER", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub discovery_trigger: bool,

    /// Seconds between two polls of discovery by the discovery trigger (it also polls whenever
    /// a CRD changes).
    #[arg(long, env = "KUBE_SVM_DISCOVERY_INTERVAL", default_value_t = 600.0)]
    pub discovery_interval: f64,

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
        storage_version_wait,
        request_timeout,
        apiserver_outage_timeout,
        discovery_attempts,
        crd_trigger,
        discovery_trigger,
        discovery_interval,
        write_to_status,
    } = args;
    let seconds = |value: f64| Duration::from_secs_f64(value.max(0.0));
    let request_timeout = seconds(request_timeout).max(Duration::from_secs(1));
    let metrics = Arc::new(Metrics::new().context("failed to register the metrics")?);
    let health = Arc::new(Health::default());
    let config = kube.config().await?;
    let requests = with_deadlines(config.clone(), request_timeout);
    let clients = controller::Clients {
        requests: kube::Client::try_from(requests.clone()).context("failed to create a client")?,
        watches: kube::Client::try_from(config.clone()).context("failed to create a client")?,
        config: requests.clone(),
    };
    let client = clients.requests.clone();
    let identity = identity.unwrap_or_else(default_identity);
    let limiter = Arc::new(RateLimiter::new(kube_api_qps, kube_api_burst));
    let engine_settings = engine::Settings {
        page_size,
        writes_in_flight,
        request_timeout,
        outage_timeout: seconds(apiserver_outage_timeout),
        ..engine::Settings::default()
    };
    let engine = Engine::new(requests, limiter, engine_settings, metrics.clone())
        .context("failed to create a client")?;
    let settings = controller::Settings {
        concurrency,
        checkpoint_interval: seconds(checkpoint_interval),
        identity: identity.clone(),
        storage_version_settle: seconds(storage_version_settle),
        storage_version_wait: seconds(storage_version_wait),
        crd_trigger,
        write_to_status,
        request_timeout,
        discovery_attempts: discovery_attempts.max(1),
        discovery_trigger: discovery_trigger
            .then(|| seconds(discovery_interval).max(Duration::from_secs(1))),
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
        let never = CancellationToken::new();
        controller::run(clients, engine, settings, health, shutdown, never, Fence::open()).await;
        return Ok(());
    }
    let leader_settings = leader::Settings::new(
        leader_election_namespace.unwrap_or_else(|| client.default_namespace().to_owned()),
        leader_election_name,
        identity,
        Duration::from_secs(lease_duration),
    );
    let on_attempt = |won: bool| {
        health.leadership_known.store(true, Ordering::Relaxed);
        health.beat();
        metrics.leader.set(i64::from(won));
    };
    // A deposed leader stops every write, then stands again as a candidate.
    loop {
        let acquired =
            leader::acquire(client.clone(), leader_settings.clone(), &shutdown, on_attempt).await;
        let Some(leadership) = acquired else {
            info!("stopped before becoming the leader");
            return Ok(());
        };
        let stopped = controller::run(
            clients.clone(),
            engine.clone(),
            settings.clone(),
            health.clone(),
            shutdown.clone(),
            leadership.lost(),
            leadership.fence(),
        )
        .await;
        metrics.leader.set(0);
        match stopped {
            Stopped::Shutdown => {
                leadership.release().await;
                return Ok(());
            }
            Stopped::LeadershipLost => {
                warn!("lost leadership: every write stopped; waiting to lead again");
            }
        }
    }
}

/// `config` with a deadline on every request: connections that hang, and answers that stop
/// coming, fail after `timeout` instead of never; and no retries behind kube-svm's back.
fn with_deadlines(mut config: kube::Config, timeout: Duration) -> kube::Config {
    config.connect_timeout = Some(timeout.min(Duration::from_secs(10)));
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    // Count from when a request is sent, not from when its pooled connection last read.
    config.reset_reader_on_write = true;
    // kube-svm decides itself what to retry, and for how long: the client's own retries would
    // stretch a request past its deadline and hide an unavailable API behind one slow call.
    config.default_retry = false;
    config
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
