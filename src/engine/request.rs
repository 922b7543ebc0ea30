//! Sending one request: rate-limited, within a deadline, inside the leader's term, with the raw
//! status, headers and body kept, because migration decisions need what `kube::Api` hides
//! (`Retry-After`, the details of a 404, the 410 Status's continue token).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http::header::RETRY_AFTER;
use kube::client::Body;
use serde::Deserialize;

use super::{Engine, RunState};

/// An HTTP answer from the apiserver.
pub struct Reply {
    pub code: u16,
    pub retry_after: Option<Duration>,
    pub body: bytes::Bytes,
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum NoReply {
    /// The leader's term is over: the request was not sent.
    #[error("this process may no longer write: its leadership ended")]
    Fenced,
    /// No answer within the request timeout given.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// The request could not be sent or its answer read: no connection, TLS, a broken stream.
    #[error(transparent)]
    Transport(#[from] kube::Error),
}

impl Reply {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.code)
    }

    /// The `metav1.Status` of an error reply; empty fields when the body is not one.
    pub fn status(&self) -> ApiStatus {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

/// Why a request failed: no answer at all, or an answer that is an error.
pub enum Failure {
    NoAnswer(NoReply),
    Answer(Reply),
}

impl Failure {
    /// The answer's status code; `None` when there was no answer.
    pub fn code(&self) -> Option<u16> {
        match self {
            Failure::NoAnswer(_) => None,
            Failure::Answer(reply) => Some(reply.code),
        }
    }

    /// How long the apiserver asked to wait before asking again.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Failure::NoAnswer(_) => None,
            Failure::Answer(reply) => reply.retry_after,
        }
    }
}

/// The parts of `metav1.Status` kube-svm reads.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ApiStatus {
    pub reason: String,
    pub message: String,
    pub metadata: StatusMetadata,
    pub details: Option<StatusDetails>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct StatusMetadata {
    /// On 410 Gone for an expired continue token: a token that continues at the latest revision.
    #[serde(rename = "continue")]
    pub continue_token: String,
}

/// Which object an error is about. A 404 for a deleted object names it here; a 404 for a
/// resource or version the apiserver does not serve names nothing.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct StatusDetails {
    pub name: String,
    pub group: String,
    /// The resource (plural), despite the field's name.
    pub kind: String,
}

/// The verbs the engine sends, as metric labels.
const VERBS: [&str; 3] = ["list", "patch", "other"];

/// The metric series one request touches, resolved once per engine rather than per request.
pub(super) struct RequestMetrics {
    /// By verb: latency, requests by code class, throttled requests.
    verbs: [VerbMetrics; 3],
    writes_in_flight: prometheus::IntGauge,
}

struct VerbMetrics {
    duration: prometheus::Histogram,
    by_class: [prometheus::IntCounter; 5],
    throttled: prometheus::IntCounter,
}

impl RequestMetrics {
    pub(super) fn new(metrics: &crate::ops::metrics::Metrics) -> RequestMetrics {
        RequestMetrics {
            verbs: VERBS.map(|verb| VerbMetrics {
                duration: metrics.request_duration.with_label_values(&[verb]),
                by_class: crate::ops::metrics::CODE_CLASSES
                    .map(|class| metrics.requests.with_label_values(&[verb, class])),
                throttled: metrics.throttled.with_label_values(&[verb]),
            }),
            writes_in_flight: metrics.writes_in_flight.clone(),
        }
    }

    fn verb(&self, request: &http::Request<Vec<u8>>) -> (&VerbMetrics, bool) {
        match *request.method() {
            http::Method::GET => (&self.verbs[0], false),
            http::Method::PATCH => (&self.verbs[1], true),
            _ => (&self.verbs[2], false),
        }
    }
}

impl VerbMetrics {
    fn count(&self, code: Option<u16>) {
        self.by_class[crate::ops::metrics::code_class_index(code)].inc();
    }
}

impl Engine {
    /// Sends `request` once the rate limiter allows it, if the leader's term allows it, and
    /// gives up when no answer comes within the request timeout (or the end of the term).
    pub(super) async fn send(
        &self,
        request: http::Request<Vec<u8>>,
        run: &RunState,
    ) -> Result<Reply, NoReply> {
        self.limiter.acquire().await;
        let limit = run.fence.deadline(self.settings.request_timeout).ok_or(NoReply::Fenced)?;
        run.requests.fetch_add(1, Ordering::Relaxed);
        let (metrics, write) = self.request_metrics.verb(&request);
        let writing = write.then(|| InFlight::enter(&self.request_metrics.writes_in_flight));
        let started = Instant::now();
        let exchange = async {
            let response = self.client.send(request.map(Body::from)).await?;
            let code = response.status().as_u16();
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = response.into_body().collect_bytes().await?;
            Ok::<_, kube::Error>(Reply { code, retry_after, body })
        };
        let result = match tokio::time::timeout(limit, exchange).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(error)) => Err(NoReply::Transport(error)),
            Err(_) => Err(NoReply::TimedOut(limit)),
        };
        drop(writing);
        metrics.duration.observe(started.elapsed().as_secs_f64());
        let code = result.as_ref().ok().map(|reply| reply.code);
        metrics.count(code);
        if code == Some(429) {
            run.throttled.fetch_add(1, Ordering::Relaxed);
            metrics.throttled.inc();
        }
        result
    }
}

/// Counts a request in a gauge while it is in flight.
struct InFlight<'a>(&'a prometheus::IntGauge);

impl<'a> InFlight<'a> {
    fn enter(gauge: &'a prometheus::IntGauge) -> InFlight<'a> {
        gauge.inc();
        InFlight(gauge)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
