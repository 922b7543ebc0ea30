//! `kube-svm controller`: reconciles StorageVersionMigrations and drives the engine.
//!
//! - [`reconcile`](self::reconcile): decides when a migration may start (one per resource, oldest
//!   first, a bounded number at once, discovery failures retried later without holding a slot)
//!   and starts it;
//! - `migration`: one running migration, as a short list of named steps;
//! - [`crds`]: the start-up gate, until kube-svm's CRDs are installed and kube-svm's own;
//! - [`status`]: the pure status computations; `status_writer`: conditional status writes;
//! - what a migration does around the engine (its CRD, the checks at the end) is in
//!   [`crate::steps`], shared with `kube-svm migrate`.

pub mod crds;
mod migration;
mod reconcile;
pub mod status;

pub use reconcile::DISCOVERY_ATTEMPTS;
mod status_writer;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
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
use crate::encoding::Observer;
use crate::engine::Engine;
use crate::fence::Fence;
use crate::server::Health;
use crate::steps;

/// How often the controller's loop reports that it is alive.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// How long the watches get to stop once the controller stops: they stop in milliseconds
/// unless stuck (kube-runtime's graceful shutdown waits on a watch that cannot list), and a
/// signal must end the process within a couple of seconds.
const STOP_GRACE: Duration = Duration::from_secs(1);

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
    /// How long to wait, in all, for discovery to publish a CRD's new storage version hash and
    /// hold it for the settle period.
    pub storage_version_wait: Duration,
    /// Write through the `status` subresource wherever a resource has one.
    pub write_to_status: bool,
    /// Longest time one request (other than a watch) may go unanswered.
    pub request_timeout: Duration,
    /// Tries a migration gets when discovery cannot be read, before it fails.
    pub discovery_attempts: u32,
    /// Run the discovery trigger (on the leader only), polling this often.
    pub discovery_trigger: Option<Duration>,
}

/// The clients the controller talks through.
#[derive(Clone)]
pub struct Clients {
    /// For requests: every request has a deadline.
    pub requests: Client,
    /// For watches, which stay open for minutes and are kept alive by the watcher.
    pub watches: Client,
    /// What both were made from, for fresh connections (the encoding check samples several
    /// apiservers behind a load balancer).
    pub config: kube::Config,
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
    config: kube::Config,
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
    /// The leader's term: nothing is written once it closes.
    fence: Fence,
    /// Migrations whose discovery failed, by UID: when to try again, and how often it failed.
    retries: Mutex<HashMap<String, reconcile::Retrying>>,
    /// Encoding checks, started at storage switches and shared by the migrations that need them.
    observer: Observer,
    /// Asks for every migration to be looked at again, when a task ends: the migration it
    /// leaves unfinished, or the one waiting for its resource or slot, goes next.
    requeue: mpsc::UnboundedSender<()>,
}

impl Context {
    /// What the steps around the engine need.
    fn cluster(&self) -> steps::Cluster<'_> {
        steps::Cluster {
            client: &self.client,
            config: &self.config,
            fence: &self.fence,
            request_timeout: self.settings.request_timeout,
            storage_version_settle: self.settings.storage_version_settle,
            storage_version_wait: self.settings.storage_version_wait,
            observer: &self.observer,
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, GroupResource>> {
        self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn retries(&self) -> std::sync::MutexGuard<'_, HashMap<String, reconcile::Retrying>> {
        self.retries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Runs the controller until `shutdown` or `leadership_lost` fires, then lets running migrations
/// checkpoint (on shutdown; a deposed leader's fence is closed, so it writes nothing) and
/// returns.
pub async fn run(
    clients: Clients,
    engine: Engine,
    settings: Settings,
    health: Arc<Health>,
    shutdown: CancellationToken,
    leadership_lost: CancellationToken,
    fence: Fence,
) -> Stopped {
    let Clients { requests: client, watches, config } = clients;
    let api: Api<StorageVersionMigration> = Api::all(watches.clone());
    let stopping = CancellationToken::new();
    let (requeue, requeued) = mpsc::unbounded();
    let controller = Controller::new(api, watcher::Config::default()).reconcile_all_on(requeued);
    let reporter =
        Reporter { controller: "kube-svm".into(), instance: Some(settings.identity.clone()) };
    let context = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        store: controller.store(),
        slots: Arc::new(Semaphore::new(settings.concurrency.max(1))),
        running: Mutex::new(HashMap::new()),
        tasks: TaskTracker::new(),
        stopping: stopping.clone(),
        retries: Mutex::new(HashMap::new()),
        observer: Observer::default(),
        requeue,
        fence,
        client,
        config,
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
    // The CRD watch runs either way: it starts encoding checks at storage switches; it creates
    // migrations only with the CRD trigger on.
    let trigger = async {
        let clients = crate::trigger::Clients {
            requests: context.client.clone(),
            watches: watches.clone(),
            config: context.config.clone(),
        };
        let discovery = context.settings.discovery_trigger.map(|interval| {
            crate::trigger::discovery::Settings {
                interval,
                window: context.settings.storage_version_settle,
                poke: Arc::new(tokio::sync::Notify::new()),
                request_timeout: context.settings.request_timeout,
            }
        });
        let settings = crate::trigger::crd::Settings {
            create: context.settings.crd_trigger,
            observer: context.observer.clone(),
            settle: context.settings.storage_version_settle,
            wait: context.settings.storage_version_wait,
            poke: discovery.as_ref().map(|d| d.poke.clone()),
            request_timeout: context.settings.request_timeout,
        };
        let crd = crate::trigger::crd::run(
            clients.clone(),
            settings,
            context.fence.clone(),
            stopping.clone(),
        );
        let discovery = async {
            if let Some(settings) = discovery {
                let fence = context.fence.clone();
                crate::trigger::discovery::run(clients, settings, fence, stopping.clone()).await;
            }
        };
        tokio::join!(crd, discovery);
    };
    let controlling = async {
        tokio::select! {
            () = reconciling => {}
            () = heartbeat => {}
        }
    };
    // Both end soon after `stopping` fires; a watch whose resource is not served (its CRD
    // deleted) keeps them waiting, so they get a moment and no more: nothing they do then needs
    // finishing, as a reconcile that sees `stopping` returns at once.
    let both = async { tokio::join!(controlling, trigger) };
    let grace = async {
        stopping.cancelled().await;
        tokio::time::sleep(STOP_GRACE).await;
    };
    tokio::select! {
        _ = both => {}
        () = grace => warn!(?STOP_GRACE, "the watches did not stop in time; stopping without them"),
    }
    // Running migrations saw `stopping` and are writing their checkpoints.
    context.tasks.close();
    context.tasks.wait().await;
    info!("controller stopped");
    if leadership_lost.is_cancelled() { Stopped::LeadershipLost } else { Stopped::Shutdown }
}
