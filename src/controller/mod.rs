//! `kube-svm controller`: reconciles StorageVersionMigrations and drives the engine.
//!
//! - [`reconcile`](self::reconcile): decides when a migration may start (one per resource, oldest
//!   first, a bounded number at once, discovery failures retried later without holding a slot)
//!   and starts it;
//! - `lanes`: whose turn it is to write: by hand or for a switch first, then the catch-up, the
//!   discovery trigger's sweep beside them;
//! - `migration`: one running migration: the [`lifecycle`](crate::lifecycle), shared with
//!   `kube-svm migrate`, with the controller as its host (status, Events, metrics);
//! - `retry`: a Failed migration run again in place, once per value of its retry annotation;
//! - [`crds`]: the start-up gate, until kube-svm's CRDs are installed and kube-svm's own;
//! - `status_writer`: conditional status writes;
//! - `triggers`: the CRD and discovery triggers, wired to the controller's settings;
//! - [`process`]: the process around it: the admin server, the start-up gate, then the
//!   controller for one leader's term after another.

pub mod crds;
mod lanes;
pub mod leader;
mod migration;
pub mod process;
mod reconcile;
mod retry;
mod status_writer;

pub use reconcile::DISCOVERY_ATTEMPTS;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use kube::Api;
use kube::runtime::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::api::{GroupResource, StorageVersionMigration};
use crate::apiserver::requests::Requests;
use crate::engine::Engine;
use crate::evidence::encoding::{EncodingPolicy, Observer};
use crate::lifecycle::cluster::Cluster;
use crate::lifecycle::turns::Turns;
use crate::ops::server::Health;

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
    /// Whether the CRD trigger also migrates CRDs with a version no longer served, cleaning
    /// `managedFields`.
    pub clean_managed_fields: bool,
    /// How long a version must be seen unserved before the CRD trigger cleans it.
    pub clean_managed_fields_after: Duration,
    /// How long encoding checks take (and how long the discovery trigger must see a new hash).
    pub encoding: EncodingPolicy,
    /// Write through the `status` subresource wherever a resource has one.
    pub write_to_status: bool,
    /// Tries a migration gets when discovery cannot be read, before it fails.
    pub discovery_attempts: u32,
    /// Run the discovery trigger (on the leader only), polling this often.
    pub discovery_trigger: Option<Duration>,
    /// Finished migrations of the discovery trigger kept per resource.
    pub discovery_keep_finished: usize,
    /// Wait after a migration of the CRD trigger failed before it is retried; doubles with
    /// each retry.
    pub crd_trigger_retry_delay: Duration,
}

/// Why the controller stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    /// `shutdown` fired: work was checkpointed.
    Shutdown,
    /// Leadership was lost: work was stopped.
    LeadershipLost,
}

/// Migrations of the discovery trigger's sweep that write at once, in a lane of their own: a
/// sweep after an install or an upgrade creates one per resource, most of them with nothing to
/// rewrite, and a migration an operator or the CRD trigger creates never waits for it. One: a
/// second (measured) did not end a sweep of a cluster's built-in resources sooner, and slowed the
/// CRD trigger's migrations beside it on a small apiserver.
pub const SWEEP_SLOTS: usize = 1;

/// Migrations that gather evidence (resolve, the conversion preflight, the encoding check) at
/// once, before their turn to write, in each lane: enough for the sweep of a cluster's built-in
/// resources and a hundred or so CRDs to wait out one settle period together (their encoding
/// checks share one round of discovery samples), and a bound on what they ask of the apiserver.
pub const PREPARING: usize = 128;

/// What reconciles share.
pub(crate) struct Context {
    /// The way to the apiserver, inside the leader's term: nothing is written once it ends.
    requests: Requests,
    engine: Engine,
    recorder: Recorder,
    store: Store<StorageVersionMigration>,
    settings: Settings,
    /// Migrations running in this process, by name.
    running: Mutex<HashMap<String, GroupResource>>,
    /// Turns to write ([`lanes::turn`]): `--concurrency` for every migration but the
    /// discovery trigger's sweep, the main lane's first; the sweep has [`SWEEP_SLOTS`] of its own.
    turns: Arc<Turns>,
    sweep_turns: Arc<Turns>,
    /// Migrations that may gather evidence at once, before their turn to write, in each lane
    /// apart (main, backlog, sweep), so that a later lane waiting for its turns never keeps a
    /// migration of an earlier one from starting.
    preparing: [Arc<Semaphore>; 3],
    tasks: TaskTracker,
    /// Fires when the controller stops taking work; running migrations checkpoint and end.
    stopping: CancellationToken,
    /// Migrations taken up again later (discovery failed, a status unwritable, the in-tree
    /// migrator busy), by UID: when, and how often each reason came.
    deferred: Mutex<HashMap<String, reconcile::Deferred>>,
    /// Encoding checks, started at storage switches and shared by the migrations that need them.
    observer: Observer,
    /// Asks for every migration to be looked at again, when a task ends: the migration it
    /// leaves unfinished, or the one waiting for its resource or slot, goes next.
    requeue: mpsc::UnboundedSender<()>,
    /// Wakes the discovery trigger: a CRD changed, or one of its migrations ended.
    discovery_poke: Arc<tokio::sync::Notify>,
}

impl Context {
    /// The context of a controller on `requests` that stops taking work when `stopping` fires
    /// and asks for every migration to be looked at again through `requeue`.
    fn new(
        requests: Requests,
        engine: Engine,
        settings: Settings,
        store: Store<StorageVersionMigration>,
        stopping: CancellationToken,
        requeue: mpsc::UnboundedSender<()>,
    ) -> Context {
        let instance = Some(settings.identity.clone());
        let reporter = Reporter { controller: "kube-svm".into(), instance };
        Context {
            recorder: Recorder::new(requests.client().clone(), reporter),
            store,
            turns: Turns::new(settings.concurrency),
            sweep_turns: Turns::new(SWEEP_SLOTS),
            preparing: std::array::from_fn(|_| Arc::new(Semaphore::new(PREPARING))),
            running: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
            stopping,
            deferred: Mutex::new(HashMap::new()),
            observer: Observer::default(),
            requeue,
            discovery_poke: Arc::new(tokio::sync::Notify::new()),
            requests,
            engine,
            settings,
        }
    }

    /// What the steps around the engine need.
    fn cluster(&self) -> Cluster<'_> {
        Cluster {
            requests: &self.requests,
            encoding: self.settings.encoding,
            observer: &self.observer,
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, GroupResource>> {
        self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn deferred(&self) -> std::sync::MutexGuard<'_, HashMap<String, reconcile::Deferred>> {
        self.deferred.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A controller's context on `client` (a test's fake apiserver), as a migration's task sees it:
/// one turn to write, encoding checks at once, no trigger.
#[cfg(test)]
pub(crate) fn context_for_tests(client: kube::Client) -> Context {
    let requests = crate::apiserver::fake::requests(client.clone());
    let metrics = Arc::new(crate::ops::metrics::Metrics::new().expect("the metrics"));
    let limiter = Arc::new(crate::engine::rate_limit::RateLimiter::new(0.0, 0));
    let engine = Engine::with_client(client.clone(), limiter, Default::default(), metrics);
    let settings = Settings {
        concurrency: 1,
        checkpoint_interval: Duration::from_secs(10),
        identity: "test".into(),
        crd_trigger: false,
        clean_managed_fields: false,
        clean_managed_fields_after: Duration::ZERO,
        encoding: EncodingPolicy::AT_ONCE,
        write_to_status: false,
        discovery_attempts: DISCOVERY_ATTEMPTS,
        discovery_trigger: None,
        discovery_keep_finished: 0,
        crd_trigger_retry_delay: Duration::ZERO,
    };
    let (requeue, _) = mpsc::unbounded();
    let store = kube::runtime::reflector::store::Writer::<StorageVersionMigration>::default();
    Context::new(requests, engine, settings, store.as_reader(), CancellationToken::new(), requeue)
}

/// What the controller runs with: its clients, engine and settings, where it reports its
/// health, and the signals that stop it.
pub struct Run {
    /// The way to the cluster's apiserver, inside the leader's term: nothing is written once it
    /// ends.
    pub requests: Requests,
    /// Migrates objects; shared by every migration.
    pub engine: Engine,
    /// The controller's flags.
    pub settings: Settings,
    /// What the probes report; the controller marks its caches synced here.
    pub health: Arc<Health>,
    /// Fires when the process stops: running migrations checkpoint.
    pub shutdown: CancellationToken,
    /// Fires when this process stops leading: every write stops.
    pub leadership_lost: CancellationToken,
}

/// Runs the controller until `shutdown` or `leadership_lost` fires, then lets running migrations
/// checkpoint (on shutdown; a deposed leader's fence is closed, so it writes nothing) and
/// returns.
pub async fn run(run: Run) -> Stopped {
    let Run { requests, engine, settings, health, shutdown, leadership_lost } = run;
    let api: Api<StorageVersionMigration> = Api::all(requests.watches().clone());
    let stopping = CancellationToken::new();
    let (requeue, requeued) = mpsc::unbounded();
    let controller = Controller::new(api, watcher::Config::default()).reconcile_all_on(requeued);
    let store = controller.store();
    let context =
        Arc::new(Context::new(requests, engine, settings, store, stopping.clone(), requeue));
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
            match result {
                Ok(_) => {}
                Err(error) if crate::apiserver::reachability::unreachable(&error, "reconcile") => {}
                Err(error)
                    if crate::apiserver::reachability::expired_watch(&error, "reconcile") => {}
                Err(error) => warn!(error = %crate::error_chain(&error), "reconcile failed"),
            }
        });
    // The heartbeat lives as long as the reconcile loop does, and beats from the start: listing
    // every migration for the cache can take long where there are many, and that is readiness
    // (caches synced), not liveness.
    let heartbeat = async {
        let synced = async {
            if store.wait_until_ready().await.is_ok() {
                health.caches_synced.store(true, Ordering::Relaxed);
            }
            std::future::pending::<()>().await
        };
        let beating = async {
            loop {
                health.beat();
                tokio::time::sleep(HEARTBEAT).await;
            }
        };
        tokio::join!(synced, beating);
    };
    let trigger = triggers(&context, stopping.clone());
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

/// The CRD watch, and the discovery trigger when it is on, until `stop` fires. The CRD watch
/// runs either way: it starts encoding checks at storage switches, and creates migrations only
/// with the CRD trigger on.
async fn triggers(context: &Context, stop: CancellationToken) {
    let settings = &context.settings;
    let discovery =
        settings.discovery_trigger.map(|interval| crate::trigger::discovery::Settings {
            interval,
            encoding: settings.encoding,
            poke: context.discovery_poke.clone(),
            keep_finished: settings.discovery_keep_finished,
            observer: context.observer.clone(),
        });
    let crd_settings = crate::trigger::crd::Settings {
        create: settings.crd_trigger,
        observer: context.observer.clone(),
        encoding: settings.encoding,
        poke: discovery.as_ref().map(|d| (d.poke.clone(), d.interval)),
        clean_managed_fields: settings.clean_managed_fields,
        clean_after: settings.clean_managed_fields_after,
        retry_delay: settings.crd_trigger_retry_delay,
    };
    let requests = &context.requests;
    let crd = crate::trigger::crd::run(requests.clone(), crd_settings, stop.clone());
    let discovery = async {
        if let Some(discovery) = discovery {
            crate::trigger::discovery::run(requests.clone(), discovery, stop).await;
        }
    };
    tokio::join!(crd, discovery);
}
