//! One migration, from its resource to its end, the same for the controller and for
//! `kube-svm migrate`:
//!
//! 1. resolve the resource (and the CRD behind it);
//! 2. where to start: the checkpoint to resume, or the first object;
//! 3. for a CRD that converts with a webhook, one read through the webhook
//!    ([`crate::evidence::conversion`]): a webhook that fails it ends the migration at once; then the
//!    target, and whether the apiservers already encode in it ([`crate::evidence::encoding`]);
//! 4. record the start, and mark the CRD `StorageMigrating`;
//! 5. run the engine, with progress recorded beside it and the target watched: a change of the
//!    storage version after the first write starts the run over (a bounded number of times), one
//!    before it only retargets;
//! 6. check at the end that the target still holds;
//! 7. settle the CRD's `storedVersions` ([`crate::rules::stored_versions`]);
//! 8. record the end.
//!
//! What differs between the two is the [`Host`]: where the record goes (the migration's status,
//! or a checkpoint file), how the operator hears of it (Events and metrics, or lines on standard
//! error), and its [`Options`], read once. The lifecycle computes every status the steps record
//! ([`status`], pure), follows the engine's progress (told at every page, recorded at most every
//! [`Options::checkpoint_interval`]), and holds the CRD's `StorageMigrating` mark until it ends
//! ([`Lifecycle::run_until`] unmarks it when stopped from outside).
//! The steps' requests: [`cluster`] (what they need of the process), [`steps`] (conversion
//! preflight, the target and its evidence kept fresh, the `StorageMigrating` mark),
//! [`target_watch`] with [`crd_watch`] and [`witness`] (whether the target, and the cluster the
//! run writes to, still hold, and the [`change::Change`] when they do not), [`prune`] (settling
//! `storedVersions`), `resolve` (the resource and its CRD, or the end when they cannot be had),
//! [`resume`] (which checkpoint may be resumed), [`turns`] (whose turn it is
//! to write, when migrations share them).

pub mod change;
pub mod cluster;
pub mod crd_watch;
mod host;
pub mod prune;
mod resolve;
pub mod resume;
mod run;
pub mod status;
pub mod steps;
pub mod target_watch;
pub mod turns;
pub mod witness;

use std::sync::Mutex;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::conditions::reasons;
use crate::api::{GroupVersionResource, MigrationTarget, StorageVersionMigrationStatus};
use crate::engine::{Engine, Progress, Resource};
use crate::rules::managed_fields::Served;
use change::{Change, Then};
use cluster::Cluster;
pub use host::{End, Host, LaterBecause, Moment, Notice, Options, Tries, Unrecorded};
use status::Start;
use target_watch::TargetWatch;

/// How long evidence gathered before waiting for a turn to write is taken as it is; after a
/// longer wait it is looked at again (the encoding checks' own freshness, a few seconds).
const EVIDENCE_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// A migration's lifecycle: what it runs with, and its host.
pub struct Lifecycle<'a, H: Host> {
    /// The cluster and the encoding checks the steps use.
    cluster: Cluster<'a>,
    /// Migrates the objects.
    engine: &'a Engine,
    /// The controller or `kube-svm migrate`.
    pub host: H,
    /// How the host runs it, read once.
    options: Options,
    /// Fires when the migration must stop (deleted, the process stopping).
    cancel: &'a CancellationToken,
    /// The resource whose CRD this lifecycle marked `StorageMigrating`, until unmarked.
    marked: Mutex<Option<Resource>>,
    /// Who migrates, as the CRD's `StorageMigrating` condition names it.
    by: String,
    /// Whether an operator's vouch for the encoding no longer counts: it covers the first run
    /// only, and lapses on a retry, a retarget or a start over.
    vouch_lapsed: bool,
}

/// How one run ended.
enum Attempt {
    Ended(End),
    /// The target changed before the first write: work it out again.
    Retarget(Change),
    /// The target changed after writes began (`current` is the status then): start over.
    StartOver {
        change: Change,
        current: Box<StorageVersionMigrationStatus>,
    },
    /// The run finished, Succeeded or Failed as its status says.
    Finished(Box<Finished>),
}

/// A run that finished: its target and the status it ends with.
struct Finished {
    target: MigrationTarget,
    done: StorageVersionMigrationStatus,
    /// The target as the run watched it, to its end.
    watch: TargetWatch,
}

/// How the engine's part of a run ended.
enum Ran {
    Ended(End),
    /// The target changed under the run (the resource's CRD, or for a built-in resource the
    /// hash discovery publishes); `current` is the status with its progress.
    Changed {
        change: Change,
        current: StorageVersionMigrationStatus,
    },
    /// Completed or failed, with the status it leads to.
    Finished {
        progress: Box<Progress>,
        done: StorageVersionMigrationStatus,
    },
}

impl<'a, H: Host> Lifecycle<'a, H> {
    /// The lifecycle of `host`'s migration; `by` names who migrates in the CRD's
    /// `StorageMigrating` condition.
    pub fn new(
        cluster: Cluster<'a>,
        engine: &'a Engine,
        host: H,
        cancel: &'a CancellationToken,
        by: String,
    ) -> Self {
        let options = host.options();
        let vouch_lapsed = host.migration().retries() > 0;
        let marked = Mutex::new(None);
        Lifecycle { cluster, engine, host, options, cancel, marked, by, vouch_lapsed }
    }

    /// Runs the migration to its end, or until `stop` resolves: then the run is dropped where
    /// it stands (nothing more is recorded) and the CRD it marked is unmarked; `None`.
    pub async fn run_until(&mut self, stop: impl Future<Output = ()>) -> Option<End> {
        tokio::select! {
            end = self.run() => return Some(end),
            () = stop => {}
        }
        self.unmark().await;
        None
    }

    /// Runs the migration to its end, or until it must stop. The CRD it marked is unmarked
    /// unless a stopped run stays marked for another process to take up
    /// ([`Options::stopped_runs_stay_marked`]).
    pub async fn run(&mut self) -> End {
        let end = self.run_steps().await;
        if !matches!(end, End::Stopped { .. }) || !self.options.stopped_runs_stay_marked {
            self.unmark().await;
        }
        end
    }

    async fn run_steps(&mut self) -> End {
        let spec = self.host.migration().spec.resource.clone();
        let (mut resource, mut crd) = match self.resolve(&spec).await {
            Ok(resolved) => resolved,
            Err(end) => return end,
        };
        let hash = resource.storage_version_hash.as_deref();
        let crd_now = crd.as_ref().map(crate::rules::crd::CrdState::read);
        let mut start = status::start_point(self.host.migration(), hash, crd_now.as_ref());
        if start.keeps_target
            && let Some(why) = self.stale_checkpoint(&resource, &start).await
        {
            start = status::not_resumed(self.host.migration(), &why);
        }
        let mut last = self.host.migration().status.clone();
        let (mut retargets, mut redos) = (0, 0);
        loop {
            // Boxed: an attempt is a large future, and the runtime's threads have small stacks.
            let attempt =
                Box::pin(self.attempt(&spec, &resource, crd.as_ref(), &start, last.as_ref()));
            match attempt.await {
                Attempt::Ended(end) => return end,
                Attempt::Finished(finished) => {
                    let Finished { target, mut done, mut watch } = *finished;
                    if crd.is_some() {
                        self.settle_stored_versions(&resource, &target, &mut done, &mut watch)
                            .await;
                    }
                    return self.record_end(&resource, done).await;
                }
                Attempt::Retarget(change) => {
                    retargets += 1;
                    self.vouch_lapsed = true;
                    self.host.tell(Notice::Retarget(&change)).await;
                    if retargets > status::MAX_RETARGETS {
                        let done = status::kept_changing(last.as_ref(), &change, Timestamp::now());
                        return self.record_end(&resource, done).await;
                    }
                }
                Attempt::StartOver { change, current } if change.then() == Then::Redo => {
                    redos += 1;
                    self.vouch_lapsed = true;
                    // An Event says so; nothing for an operator to act on unless it goes on.
                    info!(
                        change = %change,
                        redos, "the cluster changed mid-run; starting over"
                    );
                    let now = Timestamp::now();
                    match status::redo(&current, &change, start.restarts + 1, redos, now) {
                        Ok(next) => (start, last) = (next, Some(*current)),
                        Err(failed) => return self.record_end(&resource, *failed).await,
                    }
                }
                Attempt::StartOver { change, current } => {
                    let restarts = start.restarts + 1;
                    self.vouch_lapsed = true;
                    warn!(
                        change = %change,
                        restarts, "the target changed mid-run; starting over"
                    );
                    // The start-overs for a changed storage version, not those of a changed cluster.
                    let switched = restarts.saturating_sub(redos);
                    let now = Timestamp::now();
                    match status::restart(&current, &change, restarts, switched, now) {
                        Ok(next) => (start, last) = (next, Some(*current)),
                        Err(failed) => return self.record_end(&resource, *failed).await,
                    }
                }
            }
            (resource, crd) = match self.resolve(&spec).await {
                Ok(resolved) => resolved,
                Err(end) => return end,
            };
        }
    }

    /// One run from `start`, after `last` (the status last recorded): target, start, engine and
    /// the check at the end.
    async fn attempt(
        &mut self,
        spec: &GroupVersionResource,
        resource: &Resource,
        crd: Option<&CustomResourceDefinition>,
        start: &Start,
        last: Option<&StorageVersionMigrationStatus>,
    ) -> Attempt {
        if let Some(crd) = crd {
            let preflight = steps::conversion_preflight(&self.cluster, resource, crd);
            let unavailable = tokio::select! {
                checked = preflight => checked.err(),
                () = self.cancel.cancelled() => return Attempt::Ended(self.stopped(start, "stopped before the first write")),
            };
            if let Some(unavailable) = unavailable {
                let (reason, message) =
                    (reasons::CONVERSION_WEBHOOK_UNAVAILABLE, unavailable.to_string());
                let done = status::failed(last, reason, message, Timestamp::now());
                return Attempt::Ended(self.record_end(resource, done).await);
            }
        }
        // One watch of the target from the encoding check to the prune: a target kept from a
        // checkpoint is watched from where it was recorded, a new one from the CRD as resolved.
        let known = status::known_target(last, start);
        let mut watch = match &known {
            Some(known) => TargetWatch::of_target(resource, known),
            None => TargetWatch::of_crd(resource, crd),
        };
        // The encoding check may wait minutes: a stopping process does not wait for it.
        let target = tokio::select! {
            target = self.target(resource, crd, known.clone(), &mut watch) => target,
            () = self.cancel.cancelled() => return Attempt::Ended(self.stopped(start, "stopped before the first write")),
        };
        let waiting = std::time::Instant::now();
        // A resource that stores nothing has nothing to write: its run is one list, and it takes
        // no turn from those that write (a sweep finds most built-in resources empty).
        let turn = match steps::stores_nothing(&self.cluster, resource).await {
            true => None,
            false => tokio::select! {
                turn = self.host.turn() => turn,
                never = steps::keep_fresh(&self.cluster, resource, crd, &target) => match never {},
                () = self.cancel.cancelled() => return Attempt::Ended(self.stopped(start, "stopped while waiting for its turn to write")),
            },
        };
        // Evidence that aged while other migrations wrote is taken again (at once when it still
        // holds: the encoding checks keep their verdicts).
        let target = match waiting.elapsed() < EVIDENCE_FRESH_FOR {
            true => target,
            false => tokio::select! {
                target = self.target(resource, crd, known, &mut watch) => target,
                () = self.cancel.cancelled() => return Attempt::Ended(self.stopped(start, "stopped before the first write")),
            },
        };
        // Watched from here on as the run writes for it.
        watch.aim(&target, self.cleaning(crd).and(crd));
        if let Some(change) = watch.changed_by_now(&self.cluster).await {
            return Attempt::Retarget(change);
        }
        let current = match self.record_start(resource, crd, &target, start, last).await {
            Ok(current) => current,
            Err(end) => return Attempt::Ended(end),
        };
        // The cluster the writes go to, held to until the end: restored or restarted, the run
        // is done again.
        if let Err(change) = watch.hold_cluster(&self.cluster, target.apiservers.clone()).await {
            return Attempt::StartOver { change, current: Box::new(current) };
        }
        // While the engine writes: the target guarded, and the cluster held to.
        let cluster = self.cluster;
        let moves = watch.next_change(&cluster);
        let ran = Box::pin(self.run_engine(resource, crd, &target, start.clone(), current, moves));
        let (progress, mut done) = match ran.await {
            Ran::Ended(end) => return Attempt::Ended(end),
            Ran::Changed { change, current } => {
                return Attempt::StartOver { change, current: Box::new(current) };
            }
            Ran::Finished { progress, done } => (*progress, done),
        };
        // The writes are over: the check at the end samples, and writes nothing.
        drop(turn);
        let change = tokio::select! {
            change = self.check_at_end(spec, &done, &mut watch) => change,
            // Stopping: the migration is taken up again from its last checkpoint.
            () = self.cancel.cancelled() => {
                return Attempt::Ended(self.stopped(start, "stopped during the check at the end"));
            }
        };
        match change {
            Some(change) if change.starts_over() => {
                return Attempt::StartOver { change, current: Box::new(done) };
            }
            Some(change) if change.then() == Then::Unproven => {
                self.host.tell(Notice::Unproven(&change)).await;
                done = status::unproven(done, &change.to_string());
            }
            Some(change) => {
                let processed = progress.processed();
                done = status::changed_at_end(&done, &change, processed, Timestamp::now());
            }
            None => {}
        }
        Attempt::Finished(Box::new(Finished { target, done, watch }))
    }

    /// Why the checkpoint `start` would resume no longer describes the cluster
    /// ([`resume::refusal`]); `None` when it still does.
    async fn stale_checkpoint(&self, resource: &Resource, start: &Start) -> Option<String> {
        let recorded = self.host.migration().status.as_ref().and_then(|s| s.target.clone());
        let token = start.progress.continue_token.as_deref().unwrap_or_default();
        let witness = resume::Witness {
            apiservers: resume::apiserver_processes(self.cluster.requests).await,
            snapshot: resume::snapshot(self.cluster.requests, resource, token).await,
        };
        let refusal = resume::refusal(&recorded.unwrap_or_default(), &witness);
        if let Some(why) = &refusal {
            info!(%resource, why, "not resuming the checkpoint");
        }
        refusal
    }

    /// The served versions whose `managedFields` entries the run keeps, when the migration asks
    /// for the others to be removed; built-in resources have no CRD, and nothing to clean.
    fn cleaning(&self, crd: Option<&CustomResourceDefinition>) -> Option<Served> {
        crd.filter(|_| self.options.clean_managed_fields).map(Served::of)
    }

    fn stopped(&self, start: &Start, why: &str) -> End {
        End::Stopped { progress: Box::new(start.progress.clone()), why: why.to_owned() }
    }

    /// What the run targets, `watch` following it through the encoding check. A resumed run
    /// keeps what it recorded when it first started (`known`); otherwise the storage version
    /// (hash) and whether the apiservers already encode in it (confirmed before the first
    /// write, or vouched for by the operator).
    async fn target(
        &self,
        resource: &Resource,
        crd: Option<&CustomResourceDefinition>,
        known: Option<MigrationTarget>,
        watch: &mut TargetWatch,
    ) -> MigrationTarget {
        if let Some(mut known) = known {
            if known.encoding_confirmed.is_some() {
                return known;
            }
            // Not recorded (a checkpoint file, which is not trusted with it): proved again.
            let vouched = false;
            let proved = steps::target_of(&self.cluster, resource, crd, vouched, watch).await;
            (known.encoding_confirmed, known.encoding_evidence) =
                (proved.encoding_confirmed, proved.encoding_evidence);
            return known;
        }
        let (storage, stored_as) = match crd.and_then(crate::rules::crd::CrdState::of) {
            Some(state) => (state.storage_version.clone(), state.storage_version),
            None => {
                let hash = resource.storage_version_hash.clone().unwrap_or_default();
                (
                    format!(
                        "storage version hash {}",
                        if hash.is_empty() { "none" } else { &hash }
                    ),
                    hash,
                )
            }
        };
        self.host.tell(Notice::Confirming { resource, storage: &storage }).await;
        let vouch = self.host.migration().vouch();
        let vouched = !self.vouch_lapsed && vouch.covers(&stored_as);
        if vouch != crate::api::Vouch::None && !vouched {
            info!(%resource, ?vouch, storage, lapsed = self.vouch_lapsed, "the operator's vouch does not cover this target: checking the encoding");
        }
        let mut target = steps::target_of(&self.cluster, resource, crd, vouched, watch).await;
        target.apiservers = resume::apiserver_processes(self.cluster.requests).await.ok();
        let evidence = target.encoding_evidence.clone().unwrap_or_default();
        let confirmed = target.encoding_confirmed;
        self.host.tell(Notice::Encoding { vouched, confirmed, evidence: &evidence }).await;
        target
    }

    /// The Running status, the CRD's `StorageMigrating` condition, what kind of start it is.
    async fn record_start(
        &mut self,
        resource: &Resource,
        crd: Option<&CustomResourceDefinition>,
        target: &MigrationTarget,
        start: &Start,
        last: Option<&StorageVersionMigrationStatus>,
    ) -> Result<StorageVersionMigrationStatus, End> {
        let current = status::started(last, target, start, Timestamp::now());
        if let Err(unrecorded) = self.host.record(&current, Moment::Start).await {
            return Err(self.unrecorded(unrecorded, start.progress.clone()));
        }
        let unmarked = self.marked().is_none();
        if target.crd_generation.is_some() && unmarked {
            steps::mark_migrating(
                &self.cluster,
                resource,
                Some(self.options.mark_reason),
                &self.by,
            )
            .await;
            *self.marked.lock().unwrap_or_else(|p| p.into_inner()) = Some(resource.clone());
        }
        let cleaning = self.options.clean_managed_fields.then(|| match self.cleaning(crd) {
            Some(served) => {
                status::Cleaning::Crd { served, writes_to_status: self.writes_to_status(resource) }
            }
            None => status::Cleaning::NoCrd,
        });
        let note = status::start_note(self.host.migration(), start, cleaning);
        let processed = start.progress.processed();
        self.host.tell(Notice::Start { event: start.event, note: &note, processed }).await;
        Ok(current)
    }

    /// Whether the run writes through the `status` subresource of `resource`: where the
    /// migration requires it, or the host chooses it and the resource has one to patch.
    fn writes_to_status(&self, resource: &Resource) -> bool {
        self.host.migration().requests_status_writes()
            || (self.options.write_to_status && resource.patchable_status)
    }

    /// Unmarks the CRD this lifecycle marked `StorageMigrating`, if any. The mark is forgotten
    /// only once unmarked: an unmarking cut short is done again by the next.
    async fn unmark(&self) {
        if let Some(resource) = self.marked() {
            steps::mark_migrating(&self.cluster, &resource, None, &self.by).await;
            *self.marked.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    fn marked(&self) -> Option<Resource> {
        self.marked.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What a record that could not be written means for the migration.
    fn unrecorded(&self, unrecorded: Unrecorded, progress: Progress) -> End {
        match unrecorded {
            // Deleted, finished by another writer, or a term that ended: nothing to act on.
            Unrecorded::Stop(why) => {
                info!(why, "stopped: the migration is no longer this run's to record");
                End::Stopped { progress: Box::new(progress), why }
            }
            Unrecorded::Later(why) => {
                warn!(why, "could not record the migration; taking it up again later");
                End::Later(LaterBecause::Unrecorded)
            }
        }
    }
}

/// The lifecycle against a fake apiserver serving one resource that no CRD backs
/// (`widgets.example.com/v1`, three objects), with a recording host: what it records, tells and
/// writes, in seconds.
#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::*;
    use crate::api::StorageVersionMigration;
    use crate::apiserver::fake::{self, Recorded};
    use crate::engine::rate_limit::RateLimiter;
    use crate::evidence::encoding::{EncodingPolicy, Observer};
    use crate::ops::metrics::Metrics;

    const OBJECTS: &str = "/apis/example.com/v1/widgets";

    /// The recording host's [`Options::checkpoint_interval`].
    const RECORD_EVERY: Duration = Duration::from_secs(10);

    /// What the fake host was asked to do.
    #[derive(Clone, Default)]
    struct Seen {
        recorded: Arc<Mutex<Vec<(Moment, StorageVersionMigrationStatus)>>>,
        told: Arc<Mutex<Vec<String>>>,
        confirming: Arc<tokio::sync::Notify>,
        /// Turns to write asked for.
        turns: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Seen {
        fn moments(&self) -> Vec<Moment> {
            self.recorded.lock().unwrap().iter().map(|(moment, _)| *moment).collect()
        }
    }

    /// A host that records in memory, and refuses the record of `refused` as `refusal` says.
    struct Recording {
        migration: StorageVersionMigration,
        seen: Seen,
        refused: Option<(Moment, fn() -> Unrecorded)>,
        discovery: Tries,
    }

    impl Host for Recording {
        fn migration(&self) -> &StorageVersionMigration {
            &self.migration
        }

        fn options(&self) -> Options {
            Options {
                mark_reason: crate::api::conditions::storage_migrating::MIGRATING,
                write_to_status: false,
                clean_managed_fields: false,
                checkpoint_interval: RECORD_EVERY,
                discovery: self.discovery,
                stopped_runs_stay_marked: false,
            }
        }

        async fn turn(&self) -> Option<super::turns::Turn> {
            self.seen.turns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            None
        }

        async fn record(
            &mut self,
            status: &StorageVersionMigrationStatus,
            moment: Moment,
        ) -> Result<(), Unrecorded> {
            self.seen.recorded.lock().unwrap().push((moment, status.clone()));
            match self.refused {
                Some((refused, refusal)) if refused == moment => Err(refusal()),
                _ => Ok(()),
            }
        }

        async fn tell(&self, notice: Notice<'_>) {
            let name = format!("{notice:?}");
            let kind = name.split([' ', '(', '{']).next().unwrap_or_default().to_owned();
            self.seen.told.lock().unwrap().push(kind);
            if matches!(notice, Notice::Confirming { .. }) {
                self.seen.confirming.notify_one();
            }
        }
    }

    /// The fake apiserver: discovery publishes `resources` in `example.com/v1`; no CRD; the
    /// widgets list three objects, and every write of one is taken.
    fn apiserver(resources: Value) -> (kube::Client, Recorded) {
        apiserver_storing(resources, 3)
    }

    /// [`apiserver`], the widgets listing `objects` objects.
    fn apiserver_storing(resources: Value, objects: u32) -> (kube::Client, Recorded) {
        fake::client(move |sent| match (sent.method.as_str(), sent.path.as_str()) {
            ("GET", "/apis/example.com/v1") => (
                200,
                json!({
                    "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "example.com/v1",
                    "resources": resources.clone(),
                }),
            ),
            ("GET", OBJECTS) => {
                let item = |i: u32| {
                    json!({
                        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                        "metadata": { "name": format!("w-{i}"), "namespace": "default",
                                      "resourceVersion": format!("{}", 10 + i), "uid": format!("u{i}") },
                    })
                };
                (
                    200,
                    json!({
                        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                        "metadata": { "resourceVersion": "20" }, "items": (0..objects).map(item).collect::<Vec<_>>(),
                    }),
                )
            }
            ("PATCH", path)
                if path.starts_with("/apis/example.com/v1/namespaces/default/widgets/") =>
            {
                let name = path.rsplit('/').next().unwrap_or_default();
                (
                    200,
                    json!({
                        "apiVersion": "example.com/v1", "kind": "Widget",
                        "metadata": { "name": name, "namespace": "default", "resourceVersion": "99" },
                    }),
                )
            }
            _ => fake::not_found(sent),
        })
    }

    fn widgets() -> Value {
        json!([{
            "name": "widgets", "singularName": "widget", "namespaced": true, "kind": "Widget",
            "verbs": ["get", "list", "patch", "update"], "storageVersionHash": "h1",
        }])
    }

    fn migration() -> StorageVersionMigration {
        let spec = crate::api::StorageVersionMigrationSpec {
            resource: GroupVersionResource {
                group: "example.com".into(),
                version: "v1".into(),
                resource: "widgets".into(),
            },
            continue_token: None,
        };
        StorageVersionMigration::new("widgets", spec)
    }

    /// Runs a lifecycle of [`migration`] to its end against `client`, with `settle` as the
    /// encoding check's settle period and longest wait; `stop` fires its cancel.
    async fn run(
        client: kube::Client,
        host: Recording,
        settle: Duration,
        stop: &CancellationToken,
    ) -> End {
        let (requests, observer) = (fake::requests(client.clone()), Observer::default());
        let cluster = Cluster {
            requests: &requests,
            encoding: EncodingPolicy { settle, wait: settle },
            observer: &observer,
        };
        let limiter = Arc::new(RateLimiter::new(0.0, 0));
        let metrics = Arc::new(Metrics::new().unwrap());
        let engine = Engine::with_client(client.clone(), limiter, Default::default(), metrics);
        let mut lifecycle = Lifecycle::new(cluster, &engine, host, stop, "test".into());
        lifecycle.run().await
    }

    fn host(refused: Option<(Moment, fn() -> Unrecorded)>) -> (Recording, Seen) {
        let seen = Seen::default();
        let discovery = Tries::ONCE;
        (Recording { migration: migration(), seen: seen.clone(), refused, discovery }, seen)
    }

    fn processed(rewritten: u64) -> Progress {
        Progress { rewritten, ..Progress::default() }
    }

    /// The objects processed in each Running record so far.
    fn running_records(seen: &Seen) -> Vec<u64> {
        let recorded = seen.recorded.lock().unwrap();
        let running = recorded.iter().filter(|(moment, _)| *moment == Moment::Running);
        running.map(|(_, status)| status.progress.as_ref().map_or(0, |p| p.processed)).collect()
    }

    fn told_progress(seen: &Seen) -> usize {
        seen.told.lock().unwrap().iter().filter(|kind| *kind == "Progress").count()
    }

    #[tokio::test(start_paused = true)]
    async fn progress_is_told_at_once_and_recorded_at_most_every_interval_the_latest_only() {
        let (mut host, seen) = host(None);
        let (report, updates) = tokio::sync::watch::channel(Progress::default());
        let mut current = StorageVersionMigrationStatus::default();
        let target = MigrationTarget::default();
        let following = run::follow(&mut host, RECORD_EVERY, &mut current, &target, updates);
        let script = async {
            let second = Duration::from_secs(1);
            report.send_replace(processed(1));
            tokio::time::sleep(second).await;
            assert_eq!((told_progress(&seen), running_records(&seen)), (1, vec![]));
            tokio::time::sleep(RECORD_EVERY).await;
            assert_eq!(running_records(&seen), [1]);
            report.send_replace(processed(2));
            tokio::time::sleep(second).await;
            report.send_replace(processed(3));
            tokio::time::sleep(second).await;
            assert_eq!((told_progress(&seen), running_records(&seen)), (3, vec![1]));
            tokio::time::sleep(RECORD_EVERY).await;
            assert_eq!(running_records(&seen), [1, 3]);
            // Nothing new: nothing recorded again.
            tokio::time::sleep(3 * RECORD_EVERY).await;
            assert_eq!(running_records(&seen), [1, 3]);
        };
        tokio::select! {
            stopped = following => panic!("following stopped: {stopped:?}"),
            () = script => {}
        }
        assert_eq!(current.progress.map(|p| p.processed), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_refused_for_now_is_tried_again_and_one_that_must_stop_ends_following() {
        let later: fn() -> Unrecorded = || Unrecorded::Later("busy".into());
        let (mut host, seen) = host(Some((Moment::Running, later)));
        let (report, updates) = tokio::sync::watch::channel(Progress::default());
        let mut current = StorageVersionMigrationStatus::default();
        let target = MigrationTarget::default();
        let following = run::follow(&mut host, RECORD_EVERY, &mut current, &target, updates);
        let script = async {
            for rewritten in 1..=2 {
                report.send_replace(processed(rewritten));
                tokio::time::sleep(2 * RECORD_EVERY).await;
            }
        };
        tokio::select! {
            stopped = following => panic!("following stopped: {stopped:?}"),
            () = script => {}
        }
        assert_eq!(running_records(&seen), [1, 2]);
        assert_eq!(current.progress, None, "a refused record is not the current status");

        let stop: fn() -> Unrecorded = || Unrecorded::Stop("deposed".into());
        let (mut stopping, _) = super::tests::host(Some((Moment::Running, stop)));
        let (report, updates) = tokio::sync::watch::channel(Progress::default());
        report.send_replace(processed(1));
        let following = run::follow(&mut stopping, RECORD_EVERY, &mut current, &target, updates);
        let stopped = tokio::time::timeout(2 * RECORD_EVERY, following).await;
        assert!(matches!(stopped, Ok(Unrecorded::Stop(_))), "{stopped:?}");
    }

    #[tokio::test]
    async fn an_unwritable_start_writes_no_object_and_is_taken_up_later() {
        let (client, requests) = apiserver(widgets());
        let refusal: fn() -> Unrecorded = || Unrecorded::Later("refused".into());
        let (host, seen) = host(Some((Moment::Start, refusal)));
        let end = run(client, host, Duration::ZERO, &CancellationToken::new()).await;
        assert!(matches!(end, End::Later(LaterBecause::Unrecorded)), "{end:?}");
        assert_eq!(seen.moments(), [Moment::Start]);
        assert!(requests.writes().is_empty(), "{:?}", requests.writes());
    }

    #[tokio::test]
    async fn a_start_that_may_not_be_written_stops_it() {
        let (client, requests) = apiserver(widgets());
        let refusal: fn() -> Unrecorded = || Unrecorded::Stop("deleted".into());
        let (host, seen) = host(Some((Moment::Start, refusal)));
        let end = run(client, host, Duration::ZERO, &CancellationToken::new()).await;
        assert!(matches!(&end, End::Stopped { why, .. } if why == "deleted"), "{end:?}");
        assert_eq!(seen.moments(), [Moment::Start]);
        assert!(requests.writes().is_empty(), "{:?}", requests.writes());
    }

    #[tokio::test]
    async fn a_stop_during_the_encoding_check_records_and_writes_nothing() {
        let (client, requests) = apiserver(widgets());
        let (host, seen) = host(None);
        let stop = CancellationToken::new();
        let confirming = seen.confirming.clone();
        let stopper = stop.clone();
        tokio::spawn(async move {
            confirming.notified().await;
            stopper.cancel();
        });
        let end = run(client, host, Duration::from_secs(3600), &stop);
        let end = tokio::time::timeout(Duration::from_secs(60), end).await.expect("it stops");
        assert!(
            matches!(&end, End::Stopped { why, .. } if why == "stopped before the first write"),
            "{end:?}"
        );
        assert!(seen.moments().is_empty(), "nothing recorded");
        assert!(requests.writes().is_empty(), "{:?}", requests.writes());
    }

    #[tokio::test]
    async fn a_resource_discovery_does_not_serve_is_unresolved_for_good() {
        let (client, requests) = apiserver(json!([]));
        let (mut host, seen) = host(None);
        host.discovery = Tries { this: 1, of: 3 };
        let end = run(client, host, Duration::ZERO, &CancellationToken::new()).await;
        let End::Finished(failed) = end else { panic!("failed: {end:?}") };
        let condition = failed.conditions.first().expect("a condition");
        assert_eq!(condition.reason.as_deref(), Some(reasons::INVALID_RESOURCE));
        assert_eq!(seen.moments(), [Moment::Unresolved]);
        assert_eq!(*seen.told.lock().unwrap(), ["Unresolvable"]);
        assert!(requests.writes().is_empty());
    }

    #[tokio::test]
    async fn discovery_that_fails_is_tried_again_later_until_its_last_try_fails_it() {
        let unavailable = || fake::client(|_| (503, json!({ "kind": "Status", "code": 503 })));
        let failed_on = |this: u32| async move {
            let (client, requests) = unavailable();
            let (mut host, seen) = host(None);
            host.discovery = Tries { this, of: 3 };
            let end = run(client, host, Duration::ZERO, &CancellationToken::new()).await;
            assert!(requests.writes().is_empty());
            (end, seen)
        };
        for this in 1..=2 {
            let (end, seen) = failed_on(this).await;
            assert!(matches!(end, End::Later(LaterBecause::Discovery)), "{end:?}");
            assert_eq!(seen.moments(), []);
            assert_eq!(*seen.told.lock().unwrap(), ["Unresolved"]);
        }
        let (end, seen) = failed_on(3).await;
        let End::Finished(failed) = end else { panic!("failed: {end:?}") };
        let condition = failed.conditions.first().expect("a condition");
        assert_eq!(condition.reason.as_deref(), Some(reasons::DISCOVERY_FAILED));
        let message = condition.message.clone().unwrap_or_default();
        assert!(message.ends_with("(3 tries)"), "{message}");
        assert_eq!(seen.moments(), [Moment::Unresolved]);
        assert_eq!(*seen.told.lock().unwrap(), ["Unresolvable"]);
    }

    #[tokio::test]
    async fn a_run_writes_every_object_once_and_records_its_start_and_end() {
        let (client, requests) = apiserver(widgets());
        let (host, seen) = host(None);
        let end = run(client, host, Duration::ZERO, &CancellationToken::new()).await;
        let End::Finished(done) = end else { panic!("finished: {end:?}") };
        let first = done.conditions.first().map(|c| (c.type_.as_str(), c.status.as_str()));
        assert_eq!(first, Some(("Succeeded", "True")), "{done:?}");
        let written: Vec<String> = requests.writes().into_iter().map(|w| w.path).collect();
        let expected: Vec<String> = (0..3)
            .map(|i| format!("/apis/example.com/v1/namespaces/default/widgets/w-{i}"))
            .collect();
        assert_eq!(written, expected);
        assert_eq!(seen.moments(), [Moment::Start, Moment::End]);
        assert_eq!(seen.turns.load(std::sync::atomic::Ordering::Relaxed), 1, "one turn to write");
        let target = done.target.clone().unwrap_or_default();
        assert_eq!(target.encoding_confirmed, Some(false), "no sample could be taken: {target:?}");
    }

    #[tokio::test]
    async fn a_resource_that_stores_nothing_takes_no_turn_to_write() {
        let (client, requests) = apiserver_storing(widgets(), 0);
        let (host, seen) = host(None);
        let end = run(client, host, Duration::ZERO, &CancellationToken::new()).await;
        let End::Finished(done) = end else { panic!("finished: {end:?}") };
        let first = done.conditions.first().map(|c| (c.type_.as_str(), c.status.as_str()));
        assert_eq!(first, Some(("Succeeded", "True")), "{done:?}");
        assert_eq!(seen.moments(), [Moment::Start, Moment::End]);
        assert_eq!(seen.turns.load(std::sync::atomic::Ordering::Relaxed), 0, "no turn taken");
        assert!(requests.writes().is_empty(), "{:?}", requests.writes());
    }

    #[tokio::test]
    async fn an_unwritable_end_is_taken_up_later_after_the_writes() {
        let (client, requests) = apiserver(widgets());
        let refusal: fn() -> Unrecorded = || Unrecorded::Later("refused".into());
        let (host, seen) = host(Some((Moment::End, refusal)));
        let end = run(client, host, Duration::ZERO, &CancellationToken::new()).await;
        assert!(matches!(end, End::Later(LaterBecause::Unrecorded)), "{end:?}");
        assert_eq!(seen.moments(), [Moment::Start, Moment::End]);
        assert_eq!(requests.writes().len(), 3);
        assert!(!seen.told.lock().unwrap().iter().any(|t| t == "Ended"), "no end told");
    }
}
