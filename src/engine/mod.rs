//! The migration engine: pages through every object of one resource and writes each back
//! unchanged, so the apiserver re-encodes it in the current storage version and encryption key.
//!
//! The engine knows nothing of StorageVersionMigration objects. It takes a resolved [`Resource`]
//! and where to start, publishes [`Progress`] after each page on a `watch` channel, and stops
//! promptly when its cancellation token fires.
//!
//! - `pipeline`: one run: pages read ahead, writes as one stream across pages, progress folded in
//!   list order;
//! - [`resource`]: discovery lookup and request paths;
//! - `request`: every request of a run in one loop, with what is done when one fails;
//! - `pager`: metadata-only paginated lists, 410 handling;
//! - `report`: what a run reports: its [`Progress`], how it [`Finished`], the [`Error`] that stopped it;
//! - `writer`: the minimal conditional write and its outcome;
//! - `outage`, `denial`: an apiserver that is down or still starting is waited out, not charged
//!   to objects;
//! - [`retry`], [`rate_limit`]: backoff decisions and the client-side rate limit;
//! - `window`: how many writes are sent at once, by the migration's [`Pace`];
//! - `pacer`: what a run waits for before each request, by its pace;
//! - `foreground`: the gentle pace's rate, steered by a probe of what other clients feel.

mod denial;
mod failing;
mod foreground;
mod outage;
mod pacer;
mod pager;
mod pipeline;
pub mod rate_limit;
mod recheck;
mod report;
mod request;
mod resource;
pub mod retry;
mod window;
mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::Client;
use tokio::time::Instant;

use crate::api::{Budget, Pace};
use crate::apiserver::fence::Fence;
use crate::apiserver::own_writes::OwnWrites;
use crate::ops::metrics::{self, Metrics, results};
use crate::rules::managed_fields::Served;
use outage::Availability;
pub use request::NoReply;

use crate::api::FailedObject;
pub use failing::KeepFailing;
pub use foreground::{
    Flight, Foreground, PROBE_ANNOTATION, PROBE_OBJECT, ProbeParams, Steered, Why,
};
use pacer::{ByProbe, ByWindow, Pacer};
pub use pager::Listed;
pub use rate_limit::RateLimiter;
pub use report::{Error, Finished, Progress, describe};
pub use resource::{ResolveError, Resource, migratable};
pub use retry::{Backoff, Retry};
use window::Window;
pub use window::{Band, Holding, Pacing, Restraint};
pub use writer::Outcome;

/// How the engine pages and writes.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Objects per list request.
    pub page_size: u32,
    /// Writes in flight at once, per migration, at most: throttling and latency narrow the
    /// window.
    pub writes_in_flight: usize,
    /// The pace of a job that does not ask for one.
    pub pace: Pace,
    /// The latency band of the gentle pace: [`Band::GENTLE`] (the bench tries others), when no
    /// foreground budget steers it.
    pub gentle_band: Band,
    /// How slow the gentle pace's probe may get, for a migration that asks for no stricter
    /// budget; `None` paces gentle runs by their own latency band instead.
    pub foreground_budget: Option<Budget>,
    /// The gentle pace's numbers, where a probe steers it.
    pub probe_params: ProbeParams,
    /// The namespace whose ConfigMap `kube-svm-probe` the probe writes; `None`: it only reads,
    /// in the kubeconfig's namespace.
    pub probe_namespace: Option<String>,
    /// The process's writes outside the engine (its records, Events, lease), which the gentle
    /// pace must not take for another client's.
    pub own_writes: OwnWrites,
    /// Attempts per object before it is recorded as failed. Throttled attempts (429) count
    /// against [`Settings::throttled_attempts`] instead.
    pub write_attempts: u32,
    /// How long a request that fails in a way the server may get over (5xx, no answer) keeps
    /// being tried, whatever [`Settings::write_attempts`] says: an admission webhook restarting
    /// takes seconds, and its objects are not at fault.
    pub retry_for: Duration,
    /// Throttled attempts (429) per request before it counts as failed: the apiserver asked to
    /// slow down, which is no reason to give up on an object soon.
    pub throttled_attempts: u32,
    /// Attempts per list request before the migration fails.
    pub list_attempts: u32,
    /// Failed objects kept with their details; the count is always exact.
    pub failures_kept: usize,
    /// Delays between attempts of one request.
    pub backoff: Backoff,
    /// Longest time one request may go unanswered before it counts as failed.
    pub request_timeout: Duration,
    /// Longest time a run waits, in all, for an apiserver that is down before it fails.
    pub outage_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            // The page size kube-storage-version-migrator and kubectl use.
            page_size: 500,
            // The window settles between about 20 and 50 on a CPU-bound apiserver (window.rs);
            // 64 leaves it room, and is where a bare client reaches the apiserver's limit.
            writes_in_flight: 64,
            pace: Pace::Gentle,
            gentle_band: Band::GENTLE,
            foreground_budget: None,
            probe_params: ProbeParams::default(),
            probe_namespace: None,
            own_writes: OwnWrites::default(),
            write_attempts: 5,
            // A webhook's pod restarting, or rolled, is back within half a minute; the breaker
            // that ends a run whose writes all fail waits as long (failing.rs).
            retry_for: Duration::from_secs(30),
            throttled_attempts: 30,
            list_attempts: 10,
            failures_kept: 20,
            backoff: Backoff::default(),
            // The apiserver answers a request within its own 60 s timeout, or with 504; a
            // patch or a page of metadata takes milliseconds. Half of that bounds a hung
            // connection without cutting off a slow but working apiserver.
            request_timeout: Duration::from_secs(30),
            // kube-storage-version-migrator's end-to-end test survives six minutes of
            // apiserver downtime; allow more than twice that.
            outage_timeout: Duration::from_secs(15 * 60),
        }
    }
}

/// What a run's concurrent requests share: counts kept while a page is in flight, the window
/// of writes sent at once, the leader's term, and what is known of the apiserver's health.
struct RunState {
    pace: Pace,
    requests: AtomicU64,
    throttled: AtomicU64,
    expired_tokens: AtomicU64,
    window: Window,
    fence: Fence,
    availability: Availability,
    reviews: denial::Reviews,
    failing: std::sync::Mutex<failing::FailingWrites>,
    /// The versions whose `managedFields` entries are kept, when the run cleans them.
    cleaning: Option<Served>,
    /// What the run waits for before each request.
    pacer: Box<dyn Pacer>,
}

impl RunState {
    fn new(pace: Pace, window: Window, fence: Fence, pacer: Box<dyn Pacer>) -> RunState {
        RunState {
            pacer,
            pace,
            requests: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            expired_tokens: AtomicU64::new(0),
            window,
            fence,
            availability: Availability::default(),
            reviews: denial::Reviews::default(),
            failing: std::sync::Mutex::new(failing::FailingWrites::new(Instant::now())),
            cleaning: None,
        }
    }

    /// Waits until a write may go, as the run's pace says.
    async fn admit(&self) -> Option<Flight> {
        self.pacer.admit().await
    }

    /// Waits until a list may go, as the run's pace says.
    async fn before_list(&self) {
        self.pacer.before_list().await
    }

    /// Records that a write succeeded (or had nothing left to do).
    fn write_succeeded(&self) {
        self.failing().succeeded(Instant::now());
    }

    /// Records a failed write attempt; says when the run should end.
    fn write_failed(&self, first: bool, failure: &FailedObject) -> Option<KeepFailing> {
        self.failing().failed(first, failure, Instant::now())
    }

    fn failing(&self) -> std::sync::MutexGuard<'_, failing::FailingWrites> {
        self.failing.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Moves the counts into `progress`.
    fn drain_into(&self, progress: &mut Progress) {
        progress.requests += self.requests.swap(0, Ordering::Relaxed);
        progress.throttled += self.throttled.swap(0, Ordering::Relaxed);
        progress.expired_tokens += self.expired_tokens.swap(0, Ordering::Relaxed);
        progress.outages += self.availability.outages.swap(0, Ordering::Relaxed);
        let steered = self.pacer.seen();
        progress.pacing = Some(Pacing { pace: self.pace, window: self.window.holding(), steered });
    }
}

/// Runs migrations. Cheap to clone; clones share the rate limiter.
#[derive(Clone)]
pub struct Engine {
    client: Client,
    limiter: Arc<RateLimiter>,
    settings: Settings,
    metrics: Arc<Metrics>,
    request_metrics: Arc<request::RequestMetrics>,
    /// The gentle pace's gate, shared by every gentle run of the process, when a foreground
    /// budget steers the gentle pace.
    foreground: Option<Arc<Foreground>>,
}

/// One migration to run.
#[derive(Clone, Debug)]
pub struct Job {
    /// The resource to migrate, as discovery resolved it.
    pub resource: Resource,
    /// Write through the `status` subresource instead of the resource itself.
    pub write_to_status: bool,
    /// How hard to press the apiserver; `None` keeps the engine's [`Settings::pace`].
    pub pace: Option<Pace>,
    /// Where a previous run stopped; the run goes on from it.
    pub resume: Progress,
    /// No request is sent once this closes: the leader's term.
    pub fence: Fence,
    /// Remove the `managedFields` entries naming a version not among these (a CRD's served
    /// versions) from the objects that have any; `None` leaves `managedFields` alone.
    pub clean_managed_fields: Option<Served>,
    /// The gentle pace's budget this migration asks for; the stricter of it and the engine's
    /// applies.
    pub budget: Option<Budget>,
}

impl Engine {
    /// An engine talking to the cluster of `config`. The engine retries by its own rules
    /// (throttling budget, `Retry-After`, write window), so the client's own retries are off:
    /// they would hide the 429s the engine adapts to.
    pub fn new(
        mut config: kube::Config,
        limiter: Arc<RateLimiter>,
        settings: Settings,
        metrics: Arc<Metrics>,
    ) -> Result<Engine, kube::Error> {
        config.default_retry = false;
        // The probe, when the gentle pace steers by one, has a connection (and a thread) of its
        // own, as another client would.
        let foreground = settings.foreground_budget.map(|budget| {
            let namespace = settings.probe_namespace.as_deref();
            let (params, own_writes) = (settings.probe_params, settings.own_writes.clone());
            let gate = Foreground::new(config.clone(), namespace, budget, params, metrics.clone());
            Arc::new(gate.counting(own_writes))
        });
        let client = Client::try_from(config)?;
        let mut engine = Engine::with_client(client, limiter, settings, metrics);
        engine.foreground = foreground;
        Ok(engine)
    }

    /// An engine talking through `client` as it is (its retries included), with no probe of
    /// its own: for a client made elsewhere, such as a test's fake apiserver.
    pub fn with_client(
        client: Client,
        limiter: Arc<RateLimiter>,
        settings: Settings,
        metrics: Arc<Metrics>,
    ) -> Engine {
        let request_metrics = Arc::new(request::RequestMetrics::new(&metrics));
        Engine { client, limiter, settings, metrics, request_metrics, foreground: None }
    }

    /// The settings the engine runs every migration with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// What a run of `resource` at `pace` (or the engine's) shares among its requests: a write
    /// window of that pace, shown on the resource's window gauges.
    fn run_state(
        &self,
        resource: &Resource,
        pace: Option<Pace>,
        budget: Option<Budget>,
        fence: Fence,
    ) -> RunState {
        let pace = pace.unwrap_or(self.settings.pace);
        // A gentle run steered by the probe keeps its window to what the apiserver grants (429s
        // and the latency ceiling), as the rate holds it back.
        let (pacer, band): (Box<dyn Pacer>, Band) = match (pace, &self.foreground) {
            (Pace::Gentle, Some(gate)) => {
                (Box::new(ByProbe { gate: Arc::clone(gate), budget }), Band::FAST)
            }
            (Pace::Gentle, None) => (Box::new(ByWindow), self.settings.gentle_band),
            (Pace::Fast, _) => (Box::new(ByWindow), Band::FAST),
        };
        let label = metrics::resource_label(&resource.group, &resource.version, &resource.plural);
        let gauges = window::Gauges {
            size: self.metrics.write_window.with_label_values(&[&label, pace.name()]),
            restraints: Restraint::ALL.map(|restraint| {
                self.metrics.write_window_held_back.with_label_values(&[&label, restraint.name()])
            }),
        };
        let window = Window::new(self.settings.writes_in_flight, band, Some(gauges));
        RunState::new(pace, window, fence, pacer)
    }

    /// The metrics this engine records into, shared with whoever serves them.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Adds a page's outcomes to the metrics.
    fn observe_page(&self, resource: &Resource, before: &Progress, after: &Progress) {
        let label = metrics::resource_label(&resource.group, &resource.version, &resource.plural);
        let metrics = &self.metrics;
        for (result, count) in [
            (results::REWRITTEN, after.rewritten - before.rewritten),
            (results::CLEANED, after.cleaned - before.cleaned),
            (results::ALREADY_CURRENT, after.already_current - before.already_current),
            (results::SKIPPED, after.skipped - before.skipped),
            (results::FAILED, after.failed - before.failed),
        ] {
            metrics.objects.with_label_values(&[label.as_str(), result]).inc_by(count);
        }
        let migrated = (after.processed() - before.processed()) - (after.failed - before.failed);
        metrics.migrated_objects.with_label_values(&[&label]).inc_by(migrated);
        let remaining = i64::try_from(after.remaining.unwrap_or(0)).unwrap_or(i64::MAX);
        metrics.remaining_objects.with_label_values(&[&label]).set(remaining);
    }
}
