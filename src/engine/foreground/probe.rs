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
use super::{Foreground, PROBE_ANNOTATION, PROBE_TIMEOUT};

impl Foreground {
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

    /// Whether the next probe writes: one in `write_every`, in quiet windows and out alike,
    /// unless the probe's last write is still unanswered (then it reads). A write taken is in
    /// flight until the probe task has its answer.
    fn write_turn(&self) -> bool {
        let nth = self.probes.fetch_add(1, Ordering::Relaxed);
        nth.is_multiple_of(self.write_every)
            && self.writes.load(Ordering::Relaxed)
            && !self.writing.swap(true, Ordering::Relaxed)
    }

    /// One probe through `client`, a `write` or a read: its latency, or `None` when no answer
    /// came (the connection failed).
    async fn probe_once(&self, client: &Client, write: bool) -> Option<Duration> {
        let nth = self.probes.load(Ordering::Relaxed);
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
        let write = foreground.write_turn();
        let client = client.clone();
        let probe = async move {
            let latency = foreground.probe_once(&client, write).await;
            if write {
                foreground.writing.store(false, Ordering::Relaxed);
            }
            if let Some(latency) = latency {
                foreground.record(sent, latency);
            }
        };
        // A write goes beside the reads: one held long (a webhook, etcd's commit) holds no read.
        match write {
            true => drop(tokio::spawn(probe)),
            false => probe.await,
        }
    }
}
