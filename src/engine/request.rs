//! Sending one request: rate-limited, with the raw status, headers and body kept, because
//! migration decisions need what `kube::Api` hides (`Retry-After`, the 410 Status's continue token).

use std::time::Duration;

use http::header::RETRY_AFTER;
use std::sync::atomic::Ordering;

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
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct StatusMetadata {
    /// On 410 Gone for an expired continue token: a token that continues at the latest revision.
    #[serde(rename = "continue")]
    pub continue_token: String,
}

impl Engine {
    /// Sends `request` once the rate limiter allows it.
    pub(super) async fn send(
        &self,
        request: http::Request<Vec<u8>>,
        run: &RunState,
    ) -> Result<Reply, kube::Error> {
        self.limiter.acquire().await;
        run.requests.fetch_add(1, Ordering::Relaxed);
        let verb = match *request.method() {
            http::Method::GET => "list",
            http::Method::PATCH => "patch",
            _ => "other",
        };
        let metrics = &self.metrics;
        let writing = (verb == "patch").then(|| InFlight::enter(&metrics.writes_in_flight));
        let started = std::time::Instant::now();
        let response = self.client.send(request.map(Body::from)).await;
        drop(writing);
        metrics
            .request_duration
            .with_label_values(&[verb])
            .observe(started.elapsed().as_secs_f64());
        let code = response.as_ref().ok().map(|r| r.status().as_u16());
        metrics.requests.with_label_values(&[verb, crate::metrics::code_class(code)]).inc();
        let response = response?;
        let code = response.status().as_u16();
        if code == 429 {
            run.throttled.fetch_add(1, Ordering::Relaxed);
            metrics.throttled.with_label_values(&[verb]).inc();
        }
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body = response.into_body().collect_bytes().await?;
        Ok(Reply { code, retry_after, body })
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
