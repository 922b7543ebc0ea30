//! Telling an apiserver outage from an object's failure.
//!
//! When a request gets no answer or a 5xx, the engine asks the apiserver's `/readyz`. If the
//! apiserver answers ready, the failure is the object's (or its webhook's) and counts against the
//! object's attempts. If it does not, the apiserver is down or restarting: every request would
//! fail the same way, so the run waits for it instead, probing with backoff, and no object is
//! charged an attempt. One request probes at a time; the others wait for its verdict. The wait is
//! bounded by the run's outage budget, after which the run fails with that reason.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::info;

use super::{Engine, RunState};

/// How long one `/readyz` probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// First wait between probes while the apiserver is down; doubles up to [`MAX_PROBE_INTERVAL`].
const FIRST_PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Longest wait between probes: a restarted apiserver is noticed within this.
const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(5);

/// What a run knows of the apiserver's availability.
#[derive(Default)]
pub(super) struct Availability {
    /// Held by the request that probes; the others queue behind it.
    state: Mutex<Waited>,
    /// Outages waited out, not yet moved into the run's progress.
    pub outages: AtomicU64,
}

#[derive(Default)]
struct Waited {
    /// Time spent waiting for the apiserver in this run.
    total: Duration,
    /// When the apiserver was last seen back after an outage: requests sent before then failed
    /// because of the outage.
    recovered_at: Option<Instant>,
}

/// The verdict on a failed request.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The apiserver is up: the failure is the request's own.
    Charge,
    /// The apiserver was down and is back: try again without counting the attempt.
    Excuse,
    /// The apiserver stayed down past the run's outage budget.
    GaveUp { waited: Duration },
}

impl Engine {
    /// Judges a request sent at `sent` that failed without an answer or with a 5xx: waits out
    /// an apiserver outage, or says the failure is the request's own.
    pub(super) async fn judge_failure(&self, run: &RunState, sent: Instant) -> Verdict {
        let mut guard = run.availability.state.lock().await;
        let state = &mut *guard;
        if state.recovered_at.is_some_and(|recovered| sent < recovered) {
            return Verdict::Excuse;
        }
        if self.apiserver_ready().await {
            return Verdict::Charge;
        }
        let waited = &mut state.total;
        let outages = run.availability.outages.fetch_add(1, Ordering::Relaxed) + 1;
        let budget = self.settings.outage_timeout.saturating_sub(*waited);
        // Waited out, an outage is nothing to act on: INFO, counted. Giving up is WARN.
        info!(outages, waited = ?*waited, ?budget, "the apiserver is not ready; pausing requests");
        let started = Instant::now();
        let mut probes = 0;
        loop {
            probes += 1;
            let interval =
                crate::rules::backoff::doubling(probes, FIRST_PROBE_INTERVAL, MAX_PROBE_INTERVAL);
            if started.elapsed() >= budget {
                *waited += started.elapsed();
                return Verdict::GaveUp { waited: *waited };
            }
            tokio::time::sleep(interval.min(budget.saturating_sub(started.elapsed()))).await;
            if self.apiserver_ready().await {
                *waited += started.elapsed();
                state.recovered_at = Some(Instant::now());
                info!(after = ?started.elapsed(), "the apiserver is ready again; resuming");
                return Verdict::Excuse;
            }
        }
    }

    /// Whether the apiserver answers `/readyz` in time with 200, or with a refusal to show it
    /// (401, 403, 404 on a hardened cluster: it answers, so it is up).
    async fn apiserver_ready(&self) -> bool {
        let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else { return false };
        let probe = self.client.request_text(request);
        match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
            Ok(Ok(_)) => true,
            Ok(Err(kube::Error::Api(status))) => matches!(status.code, 401 | 403 | 404),
            Ok(Err(_)) | Err(_) => false,
        }
    }
}
