//! The admin HTTP server (default `:2112`, as kube-storage-version-migrator's): `/metrics`,
//! `/healthz` (the process's loops are alive) and `/readyz` (CRDs usable, caches synced,
//! leadership known).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::ops::metrics::Metrics;

/// A loop that has not beaten for this long is considered stuck.
const STALE_HEARTBEAT: Duration = Duration::from_secs(30);

/// What the probes report, set by the parts of the controller as they come up.
pub struct Health {
    /// Why kube-svm's CRDs cannot be used yet (not installed, someone else's schema, not
    /// established); `None` once they can.
    crds: Mutex<Option<String>>,
    /// Whether the controller's cache of migrations has synced; `/readyz` fails until it has.
    pub caches_synced: AtomicBool,
    /// Whether this process knows if it leads (an election attempt finished, or election is
    /// off); `/readyz` fails until it does.
    pub leadership_known: AtomicBool,
    heartbeat: Mutex<Instant>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            crds: Mutex::new(Some("CRDs not checked yet".to_owned())),
            caches_synced: AtomicBool::new(false),
            leadership_known: AtomicBool::new(false),
            heartbeat: Mutex::new(Instant::now()),
        }
    }
}

impl Health {
    /// Records that a loop made progress.
    pub fn beat(&self) {
        *self.heartbeat.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Records why kube-svm's CRDs cannot be used, or (`None`) that they can.
    pub fn set_crds_unusable(&self, why: Option<String>) {
        *self.crds.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    fn alive(&self) -> bool {
        self.heartbeat.lock().unwrap_or_else(|p| p.into_inner()).elapsed() < STALE_HEARTBEAT
    }

    /// What is not ready yet; empty when ready.
    fn not_ready(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if let Some(why) = self.crds.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            missing.push(why);
        }
        if !self.caches_synced.load(Ordering::Relaxed) {
            missing.push("caches not synced".to_owned());
        }
        if !self.leadership_known.load(Ordering::Relaxed) {
            missing.push("leadership not known".to_owned());
        }
        missing
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// Binds the admin server's address, so a taken port fails at start.
pub async fn bind(address: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(address = %listener.local_addr()?, "admin server listening");
    Ok(listener)
}

/// Serves until `shutdown` fires.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, health });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

async fn render_metrics(State(state): State<AppState>) -> (StatusCode, String) {
    match state.metrics.render() {
        Ok(text) => (StatusCode::OK, text),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

async fn healthz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.health.alive() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "the controller's loops have stopped\n")
    }
}

async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    match state.health.not_ready().as_slice() {
        [] => (StatusCode::OK, "ok\n".to_owned()),
        missing => (StatusCode::SERVICE_UNAVAILABLE, format!("{}\n", missing.join(", "))),
    }
}
