//! Sending one request: rate-limited, within a deadline, inside the leader's term, with the raw
//! status, headers and body kept, because migration decisions need what `kube::Api` hides
//! (`Retry-After`, the details of a 404, the 410 Status's continue token).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http::header::RETRY_AFTER;
use kube::client::Body;
use serde::Deserialize;

use super::retry::Failure;
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
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
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

    /// This reply as a failure, for the retry decision.
    pub fn failure(&self) -> Failure {
        Failure::Status { code: self.code, retry_after: self.retry_after }
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

/// The request verb, for metrics.
fn verb(request: &http::Request<Vec<u8>>) -> &'static str {
    match *request.method() {
        http::Method::GET => "list",
        http::Method::PATCH => "patch",
        _ => "other",
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
        let verb = verb(&request);
        let metrics = &self.metrics;
        let writing = (verb == "patch").then(|| InFlight::enter(&metrics.writes_in_flight));
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
        metrics
            .request_duration
            .with_label_values(&[verb])
            .observe(started.elapsed().as_secs_f64());
        let code = result.as_ref().ok().map(|reply| reply.code);
        metrics.requests.with_label_values(&[verb, crate::metrics::code_class(code)]).inc();
        if code == Some(429) {
            run.throttled.fetch_add(1, Ordering::Relaxed);
            metrics.throttled.with_label_values(&[verb]).inc();
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
