//! The probe task: its own thread, runtime and connection, sending a probe while gentle writes
//! go (and in quiet windows).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use kube::Client;
use tokio::time::Instant;
use tracing::warn;

use super::company::revision;
use super::steering::Change;
use super::{Foreground, PROBE_ANNOTATION, PROBE_TIMEOUT, PROBE_WRITE_EVERY};

impl Foreground {
    /// Whether the probe may write now: [`PROBE_WRITE_EVERY`] since the last write was answered,
    /// so that a slow write is followed by reads, not by another write at once.
    fn write_due(&self) -> bool {
        let last = self.last_write.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        last.is_none_or(|at| now.duration_since(at) >= PROBE_WRITE_EVERY)
    }

    /// A write of the probe was answered (or given up on) now.
    fn wrote(&self) {
        *self.last_write.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(std::time::Instant::now());
    }

    /// Starts the probe task on its first call; later calls do nothing.
    pub(super) fn start_probing(self: &Arc<Self>) {
        if self.probing.swap(true, Ordering::Relaxed) {
            return;
        }
        let (gate, config) = (Arc::downgrade(self), self.config.clone());
        let spawned = std::thread::Builder::new().name("kube-svm-probe".into()).spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            match runtime {
                Ok(runtime) => runtime.block_on(probe(gate, config)),
                Err(error) => {
                    warn!(%error, "the probe cannot start: the gentle rate stays as it is")
                }
            }
        });
        if let Err(error) = spawned {
            warn!(%error, "the probe cannot start: the gentle rate stays as it is");
        }
    }

    /// One probe through `client`, a read or now and then a write: its latency, or `None` when
    /// no answer came (the connection failed).
    async fn probe_once(&self, client: &Client) -> Option<Duration> {
        let nth = self.probes.fetch_add(1, Ordering::Relaxed);
        let write = self.writes.load(Ordering::Relaxed) && self.write_due();
        let request = match write {
            true => http::Request::patch(&self.path)
                .header(http::header::CONTENT_TYPE, "application/merge-patch+json")
                .body(
                    serde_json::json!({ "metadata": { "annotations": { PROBE_ANNOTATION: nth.to_string() } } })
                        .to_string()
                        .into_bytes(),
                ),
            false => http::Request::get(&self.path).body(Vec::new()),
        };
        let request = request.ok()?;
        let sent = Instant::now();
        let answered = tokio::time::timeout(PROBE_TIMEOUT, async {
            let response = client.send(request.map(kube::client::Body::from)).await.ok()?;
            let code = response.status();
            // The latency a client feels includes reading the answer.
            response.into_body().collect_bytes().await.ok().map(|body| (code, body))
        })
        .await;
        if write {
            self.wrote();
        }
        match answered {
            Ok(Some((code, body))) => {
                if let Some(revision) = write.then(|| revision(&body)).flatten() {
                    self.lock().company.wrote(Instant::now(), revision);
                }
                // Refused for good (no such object, no permission, an admission webhook that
                // rejects the annotation): the probe reads only. A 429 is the apiserver's load,
                // which is what the probe measures.
                let refused = code.is_client_error() && code.as_u16() != 429;
                if write && refused && self.writes.swap(false, Ordering::Relaxed) {
                    warn!(
                        code = code.as_u16(),
                        object = %self.path,
                        "the probe reads only, and feels no write's wait: its ConfigMap cannot be written here (the chart creates it in the release's namespace and lets kube-svm patch it)"
                    );
                }
                Some(sent.elapsed())
            }
            Ok(None) => None,
            Err(_) => Some(PROBE_TIMEOUT),
        }
    }

    /// Records one probe sent at `sent`, taking `latency`, and lets the law look.
    fn record(&self, sent: Instant, latency: Duration) {
        self.metrics.probe_latency.observe(latency.as_secs_f64());
        let mut state = self.lock();
        let change = state.record(sent, latency, self.budget);
        self.metrics.gentle_rate.set(state.seen.rate);
        self.metrics.gentle_alone.set(i64::from(state.seen.why == super::Why::Alone));
        self.metrics.probe_budget.set(state.seen.limit.map_or(0.0, |l| l.as_secs_f64()));
        let counted = match change {
            Some(Change::Cut { .. }) => "cut",
            Some(Change::Undone { .. }) => "undone",
            Some(Change::Grew { .. }) => "grew",
            Some(Change::Held | Change::Judge | Change::Stood { .. }) | None => return,
        };
        self.metrics.gentle_changes.with_label_values(&[counted]).inc();
    }
}

/// The probe task, on its own runtime: probes while gentle writes go (and in quiet windows),
/// rests otherwise, and ends with its gate.
pub(super) async fn probe(gate: Weak<Foreground>, config: kube::Config) {
    let client = match Client::try_from(config) {
        Ok(client) => client,
        Err(error) => {
            warn!(%error, "the probe has no client: the gentle rate stays as it is");
            return;
        }
    };
    loop {
        let Some(foreground) = gate.upgrade() else { return };
        let next = foreground.lock().next_probe(Instant::now());
        let Some(wait) = next else {
            drop(foreground);
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        tokio::time::sleep(wait).await;
        let sent = Instant::now();
        if let Some(latency) = foreground.probe_once(&client).await {
            foreground.record(sent, latency);
        }
    }
}
