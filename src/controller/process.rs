//! The controller as a process: the admin server, the wait until kube-svm's CRDs can be used,
//! then the controller, led by this process alone or for as long as it holds the leader's Lease,
//! one term after another.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Run, Settings, Stopped, crds, leader};
use crate::apiserver::fence::Fence;
use crate::apiserver::requests::Requests;
use crate::engine::Engine;
use crate::ops::metrics::Metrics;
use crate::ops::server::{self, Health};

/// What the process runs with.
pub struct Process {
    /// The way to the cluster's apiserver.
    pub requests: Requests,
    /// Migrates objects; shared by every migration of every term.
    pub engine: Engine,
    /// The controller's flags.
    pub settings: Settings,
    /// The process's series, served on `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Where the admin server listens (`/metrics`, `/healthz`, `/readyz`).
    pub admin_address: SocketAddr,
    /// The leader's Lease, when replicas elect one; `None`: this process leads alone.
    pub election: Option<leader::Settings>,
    /// Fires when the process is to stop (a signal).
    pub shutdown: CancellationToken,
}

/// Runs the process until `shutdown` fires. A deposed leader stops every write, then stands
/// again as a candidate.
pub async fn run(process: Process) -> anyhow::Result<()> {
    let Process { requests, engine, settings, metrics, admin_address, election, shutdown } =
        process;
    let health = Arc::new(Health::default());
    let server_stop = CancellationToken::new();
    let listener = server::bind(admin_address)
        .await
        .with_context(|| format!("failed to listen on {admin_address}"))?;
    tokio::spawn(server::serve(listener, metrics.clone(), health.clone(), server_stop.clone()));
    let _stop_server = server_stop.drop_guard();
    // Nothing is watched or migrated until the CRDs can carry what kube-svm writes.
    if !crds::wait_until_usable(&requests, &health, &settings.identity, &shutdown).await {
        info!("stopped before kube-svm's CRDs could be used");
        return Ok(());
    }
    let term = |leadership_lost, fence| Run {
        requests: requests.within(fence),
        engine: engine.clone(),
        settings: settings.clone(),
        health: health.clone(),
        shutdown: shutdown.clone(),
        leadership_lost,
    };
    let Some(election) = election else {
        health.leadership_known.store(true, Ordering::Relaxed);
        metrics.leader.set(1);
        super::run(term(CancellationToken::new(), Fence::open())).await;
        return Ok(());
    };
    let on_attempt = |won: bool| {
        health.leadership_known.store(true, Ordering::Relaxed);
        health.beat();
        metrics.leader.set(i64::from(won));
    };
    loop {
        // However long acquiring takes, a signal ends the wait at once.
        let acquiring =
            leader::acquire(requests.client().clone(), election.clone(), &shutdown, on_attempt);
        let acquired = tokio::select! {
            acquired = acquiring => acquired,
            () = shutdown.cancelled() => None,
        };
        let Some(leadership) = acquired else {
            info!("stopped before becoming the leader");
            return Ok(());
        };
        let stopped = super::run(term(leadership.lost(), leadership.fence())).await;
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
