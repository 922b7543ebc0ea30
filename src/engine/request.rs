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
        let response = self.client.send(request.map(Body::from)).await?;
        let code = response.status().as_u16();
        if code == 429 {
            run.throttled.fetch_add(1, Ordering::Relaxed);
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
