//! `kube-svm controller`: reconciles StorageVersionMigrations and drives the engine.
//!
//! - [`reconcile`](self::reconcile): decides when a migration may start (one per resource, oldest
//!   first, a bounded number at once) and starts it;
//! - `migration`: one running migration: resolve, run the engine, checkpoint, finish;
//! - [`status`]: the pure status computations.

mod crd;
mod migration;
mod reconcile;
pub mod status;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::api::{GroupResource, StorageVersionMigration};
use crate::engine::Engine;
use crate::server::Health;

/// How often the controller's loop reports that it is alive.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// How the controller schedules and checkpoints migrations.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Migrations run at once (of different resources).
    pub concurrency: usize,
    /// Least time between two progress writes to a migration's status.
    pub checkpoint_interval: Duration,
    /// Name reported on Events, with this process's identity.
    pub identity: String,
    /// Whether to run the CRD trigger (on the leader only).
    pub crd_trigger: bool,
    /// How long the discovery hash must be seen unchanged before a CRD's encoding is trusted.
    pub storage_version_settle: Duration,
    /// Write through the `status` subresource wherever a resource has one.
    pub write_to_status: bool,
}

/// Why the controller stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    /// `shutdown` fired: work was checkpointed.
    Shutdown,
    /// Leadership was lost: work was stopped.
    LeadershipLost,
}

/// What reconciles share.
pub(crate) struct Context {
    client: Client,
    engine: Engine,
    recorder: Recorder,
    store: Store<StorageVersionMigration>,
    settings: Settings,
    /// Migrations running in this process, by name.
    running: Mutex<HashMap<String, GroupResource>>,
    slots: Arc<Semaphore>,
    tasks: TaskTracker,
    /// Fires when the controller stops taking work; running migrations checkpoint and end.
    stopping: CancellationToken,
}

impl Context {
    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, GroupResource>> {
        self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Runs the controller until `shutdown` or `leadership_lost` fires, then lets running migrations
/// checkpoint and returns.
pub async fn run(
    client: Client,
    engine: Engine,
    settings: Settings,
    health: Arc<Health>,
    shutdown: CancellationToken,
    leadership_lost: CancellationToken,
) -> Stopped {
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    let stopping = CancellationToken::new();
    let controller = Controller::new(api, watcher::Config::default());
    let reporter =
        Reporter { controller: "kube-svm".into(), instance: Some(settings.identity.clone()) };
    let context = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        store: controller.store(),
        slots: Arc::new(Semaphore::new(settings.concurrency.max(1))),
        running: Mutex::new(HashMap::new()),
        tasks: TaskTracker::new(),
        stopping: stopping.clone(),
        client,
        engine,
        settings,
    });
    let stopped = {
        let (shutdown, lost, stopping) =
            (shutdown.clone(), leadership_lost.clone(), stopping.clone());
        async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = lost.cancelled() => {}
            }
            stopping.cancel();
        }
    };
    info!("controller started");
    let store = context.store.clone();
    let reconciling = controller
        .graceful_shutdown_on(stopped)
        .run(reconcile::reconcile, reconcile::error_policy, context.clone())
        .for_each(|result| async move {
            if let Err(error) = result {
                warn!(error = %crate::error_chain(&error), "reconcile failed");
            }
        });
    // The heartbeat lives as long as the reconcile loop does.
    let heartbeat = async {
        if store.wait_until_ready().await.is_ok() {
            health.caches_synced.store(true, Ordering::Relaxed);
        }
        loop {
            health.beat();
            tokio::time::sleep(HEARTBEAT).await;
        }
    };
    let trigger = async {
        match context.settings.crd_trigger {
            true => crate::trigger::crd::run(context.client.clone(), stopping.clone()).await,
            false => stopping.cancelled().await,
        }
    };
    let controlling = async {
        tokio::select! {
            () = reconciling => {}
            () = heartbeat => {}
        }
    };
    // Both end when `stopping` fires.
    tokio::join!(controlling, trigger);
    // Running migrations saw `stopping` and are writing their checkpoints.
    context.tasks.close();
    context.tasks.wait().await;
    info!("controller stopped");
    if leadership_lost.is_cancelled() { Stopped::LeadershipLost } else { Stopped::Shutdown }
}
