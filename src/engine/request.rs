//! Every request of a run, in one loop: [`Engine::request`] sends what an [`Exchange`] builds,
//! rate-limited, within a deadline, inside the leader's term, with the raw status, headers and
//! body kept, because migration decisions need what `kube::Api` hides (`Retry-After`, the
//! details of a 404, the 410 Status's continue token). The exchange says what an answer means;
//! what is done about a failure (an outage waited out, a denial reviewed, throttling and server
//! errors retried after a backoff, the attempts counted) is decided here, the same for a page,
//! a write and a read again.

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::header::RETRY_AFTER;
use kube::client::Body;
use serde::Deserialize;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::foreground::Flight;
use super::outage::Verdict;
use super::retry::Retry;
use super::window::Signal;
use super::{Engine, Resource, RunState};

/// What a request asks to do, for the review of a denial.
pub(super) struct Access<'a> {
    pub resource: &'a Resource,
    pub verb: &'static str,
    /// Empty for a cluster-wide request.
    pub namespace: &'a str,
    pub subresource: Option<&'static str>,
}

/// One request as a run sends it, attempt after attempt: what to send, and what its answer
/// means, in the caller's terms.
pub(super) trait Exchange {
    /// What a settled request gives.
    type Settled;
    /// Why the caller stops the run.
    type Error;
    /// Who asks what, for the review of a denial.
    fn access(&self) -> Access<'_>;
    /// Failed attempts, throttling and outages aside, before the request gives up.
    fn attempts(&self) -> u32;
    /// The request to send, built anew for each attempt; why it cannot be built.
    fn build(&self) -> Result<http::Request<Vec<u8>>, String>;
    /// Whether it is a write, paced: admitted by the run's pace and sent within its write
    /// window, its answer told to both.
    fn paced(&self) -> Option<Paced> {
        None
    }
    /// What an answer means; `failed` attempts came before it.
    async fn settle(
        &mut self,
        reply: Reply,
        failed: u32,
    ) -> Result<Settle<Self::Settled>, Self::Error>;
    /// A failed attempt was counted against the request (`first`: its first).
    fn charged(&mut self, _failure: &Failure, _first: bool) -> Result<(), Self::Error> {
        Ok(())
    }
    /// The request ended without a settled answer: what that comes to for the caller.
    fn unsettled(&self, why: Unsettled) -> Result<Self::Settled, Self::Error>;
}

/// A write the run's pace admits.
pub(super) struct Paced {
    /// The object's revision as listed, to tell a write that moved it from one that changed
    /// nothing (the pace counts only the first as a write).
    pub listed: Option<u64>,
}

/// What an answer means to the exchange that asked.
pub(super) enum Settle<T> {
    /// The request is done.
    Done(T),
    /// Send again at once, built anew: the exchange changed what it asks (a list's expired
    /// continue token goes on from the one handed out). Counted as a failed attempt.
    Again(Reply),
    /// A failure, for the run's policy to judge.
    Failed(Reply),
}

/// Why a request ended without a settled answer.
pub(super) enum Unsettled {
    /// The request could not be built.
    Unbuilt(String),
    /// The leader's term is over: not sent.
    Fenced,
    /// The apiserver stayed down past the run's outage budget.
    Unavailable(Duration),
    /// Every attempt failed; the last failure.
    GaveUp(Failure),
}

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

/// What to do after a failed request.
pub(super) enum Next {
    /// Send it again (any backoff has been waited out).
    Retry,
    /// The failure is final for this request.
    GiveUp,
    /// The apiserver stayed down past the run's outage budget.
    Unavailable { waited: Duration },
}

/// Failed attempts of one request so far.
#[derive(Default)]
pub(super) struct Attempts {
    pub throttled: u32,
    pub other: u32,
    /// Failures not counted: the apiserver was still starting.
    pub excused: u32,
    /// When the first failure was, counted or not.
    pub first_failure: Option<Instant>,
}

impl Engine {
    /// Sends what `exchange` builds until it settles, or until the run's policy gives up on it.
    pub(super) async fn request<X: Exchange>(
        &self,
        run: &RunState,
        exchange: &mut X,
    ) -> Result<X::Settled, X::Error> {
        let mut attempts = Attempts::default();
        loop {
            let request = match exchange.build() {
                Ok(request) => request,
                Err(message) => return exchange.unsettled(Unsettled::Unbuilt(message)),
            };
            // Named in the log when no answer comes: shares the request's bytes, copies none.
            let uri = request.uri().clone();
            let (sent, result) = match exchange.paced() {
                Some(Paced { listed }) => self.send_paced(request, run, listed).await,
                None => (Instant::now(), self.send(request, run).await),
            };
            let failed = match result {
                Ok(reply) => match exchange.settle(reply, attempts.other).await? {
                    Settle::Done(settled) => return Ok(settled),
                    Settle::Again(reply) => {
                        // Bounded like any other failure: an answer that asks again and again
                        // ends the request rather than looping.
                        attempts.other += 1;
                        if attempts.other >= exchange.attempts() {
                            let failed = Failure::Answer(reply);
                            return exchange.unsettled(Unsettled::GaveUp(failed));
                        }
                        continue;
                    }
                    Settle::Failed(reply) => Failure::Answer(reply),
                },
                Err(NoReply::Fenced) => return exchange.unsettled(Unsettled::Fenced),
                Err(error) => {
                    let access = exchange.access();
                    let path = uri.path();
                    debug!(resource = %access.resource, verb = access.verb, path, %error, "request failed");
                    Failure::NoAnswer(error)
                }
            };
            let counted_before = attempts.other;
            let limit = exchange.attempts();
            let next = self
                .after_failure(run, &exchange.access(), sent, &failed, &mut attempts, limit)
                .await;
            // Throttling and outages are waited out, not counted against the request.
            if attempts.other > counted_before || matches!(next, Next::GiveUp) {
                exchange.charged(&failed, counted_before == 0)?;
            }
            match next {
                Next::Retry => {}
                Next::Unavailable { waited } => {
                    return exchange.unsettled(Unsettled::Unavailable(waited));
                }
                Next::GiveUp => return exchange.unsettled(Unsettled::GaveUp(failed)),
            }
        }
    }

    /// Sends a write once the run's pace admits it and its write window has room, and tells
    /// both how it went; when it was sent, and its answer.
    async fn send_paced(
        &self,
        request: http::Request<Vec<u8>>,
        run: &RunState,
        listed: Option<u64>,
    ) -> (Instant, Result<Reply, NoReply>) {
        let flight: Option<Flight> = run.admit().await;
        let slot = run.window.enter().await;
        let sent = Instant::now();
        let result = self.send(request, run).await;
        let latency = sent.elapsed();
        let signal = match &result {
            Ok(reply) if reply.code == 429 => Signal::Throttled,
            Ok(reply) if reply.code < 300 || reply.code == 404 || reply.code == 409 => {
                Signal::Success(latency)
            }
            _ => Signal::Neutral,
        };
        if let (Some(flight), Signal::Success(latency), Ok(reply)) = (flight, signal, &result) {
            // A write that changed nothing keeps the object's revision: not a write.
            let written = (reply.code < 300).then(|| super::foreground::revision(&reply.body));
            flight.answered(latency, written.flatten().filter(|r| Some(*r) != listed));
        }
        slot.leave(signal);
        (sent, result)
    }

    /// What to do after a request sent at `sent` failed: an apiserver outage is waited out and
    /// not counted; other failures count in `attempts` and are retried after a backoff until
    /// the throttled or the other failures reach their limit (`other_limit`).
    async fn after_failure(
        &self,
        run: &RunState,
        request: &Access<'_>,
        sent: Instant,
        failed: &Failure,
        attempts: &mut Attempts,
        other_limit: u32,
    ) -> Next {
        // No answer, or a server error: maybe the apiserver is down, not the request at fault.
        let outage_like = failed.code().is_none_or(|code| code >= 500);
        if failed.code() == Some(403) {
            return self.after_denial(run, request, attempts, other_limit).await;
        }
        if outage_like {
            match self.judge_failure(run, sent).await {
                Verdict::Excuse => return Next::Retry,
                Verdict::GaveUp { waited } => {
                    warn!(?waited, "the apiserver stayed unavailable; giving up");
                    return Next::Unavailable { waited };
                }
                Verdict::Charge => {}
            }
        }
        match self.retry_decision(failed, attempts, other_limit) {
            Retry::After(wait) => {
                tokio::time::sleep(wait).await;
                Next::Retry
            }
            Retry::Never => Next::GiveUp,
        }
    }

    /// The retry decision after a failure, counting it in `attempts`; gives up once the
    /// throttled or the other failures reach their limit (`other_limit`).
    fn retry_decision(&self, failed: &Failure, attempts: &mut Attempts, other_limit: u32) -> Retry {
        let (count, limit) = match failed.code() {
            Some(crate::apiserver::answers::TOO_MANY_REQUESTS) => {
                (&mut attempts.throttled, self.settings.throttled_attempts)
            }
            _ => (&mut attempts.other, other_limit),
        };
        *count += 1;
        let first_failure = *attempts.first_failure.get_or_insert_with(Instant::now);
        let (code, retry_after) = (failed.code(), failed.retry_after());
        let passing = code.is_none_or(crate::apiserver::answers::is_transient_code)
            && first_failure.elapsed() < self.settings.retry_for;
        if *count >= limit && !passing {
            return Retry::Never;
        }
        self.settings.backoff.decide(code, retry_after, *count, fastrand::f64())
    }

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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::json;

    use super::super::pager::Listed;
    use super::super::{Engine, Error, Outcome, RateLimiter, Resource, RunState, Settings};
    use crate::apiserver::fake;
    use crate::apiserver::fence::Fence;
    use crate::ops::metrics::Metrics;

    /// An engine whose every request `answer` answers, with a run of the widgets at the fast
    /// pace and backoffs of a millisecond.
    fn engine(
        answer: impl Fn(&fake::Sent) -> (u16, serde_json::Value) + Send + Sync + 'static,
    ) -> (Engine, RunState, fake::Recorded) {
        let (client, recorded) = fake::client(answer);
        let settings = Settings {
            backoff: super::super::Backoff {
                base: std::time::Duration::from_millis(1),
                cap: std::time::Duration::from_millis(1),
                ..Default::default()
            },
            ..Settings::default()
        };
        let metrics = Arc::new(Metrics::new().unwrap());
        let limiter = Arc::new(RateLimiter::new(0.0, 0));
        let engine = Engine::with_client(client, limiter, settings, metrics);
        let run = engine.run_state(
            &Resource::widgets(),
            Some(crate::api::Pace::Fast),
            None,
            Fence::open(),
        );
        (engine, run, recorded)
    }

    fn status(code: u16, reason: &str) -> (u16, serde_json::Value) {
        let body = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "code": code, "reason": reason, "message": reason, "metadata": {} });
        (code, body)
    }

    /// The answer of a write that moved the object to resourceVersion 6.
    fn written() -> (u16, serde_json::Value) {
        let meta = json!({ "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": { "name": "w-1", "uid": "u", "resourceVersion": "6" } });
        (200, meta)
    }

    #[tokio::test]
    async fn a_throttled_write_is_sent_again_until_it_settles() {
        let patches = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&patches);
        let (engine, run, _) = engine(move |sent| match sent.method.as_str() {
            "PATCH" if count.fetch_add(1, Ordering::SeqCst) < 2 => status(429, "TooManyRequests"),
            "PATCH" => written(),
            _ => fake::not_found(sent),
        });
        let outcome = engine.write(&Resource::widgets(), &Listed::w_1(), false, &run).await;
        assert_eq!(outcome.ok(), Some(Outcome::Rewritten));
        assert_eq!(patches.load(Ordering::SeqCst), 3, "two throttled, then written");
        assert_eq!(run.throttled.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_write_denied_for_good_fails_its_object_after_one_review() {
        let (engine, run, recorded) = engine(|sent| match sent.method.as_str() {
            "PATCH" => status(403, "Forbidden"),
            "POST" if sent.path.ends_with("/selfsubjectaccessreviews") => (
                201,
                json!({ "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectAccessReview", "spec": {}, "status": { "allowed": false } }),
            ),
            _ => fake::not_found(sent),
        });
        let outcome = engine.write(&Resource::widgets(), &Listed::w_1(), false, &run).await;
        let Ok(Outcome::Failed(failed)) = outcome else { panic!("failed, not {outcome:?}") };
        assert_eq!((failed.code, failed.reason.as_str()), (403, "Forbidden"));
        let writes: Vec<String> = recorded.writes().iter().map(|s| s.method.clone()).collect();
        assert_eq!(writes, ["PATCH", "POST"], "one write, one review, and no retry");
    }

    #[tokio::test]
    async fn a_refusal_fails_its_object_without_a_retry() {
        let (engine, run, recorded) = engine(|sent| match sent.method.as_str() {
            "PATCH" => status(422, "Invalid"),
            _ => fake::not_found(sent),
        });
        let outcome = engine.write(&Resource::widgets(), &Listed::w_1(), false, &run).await;
        let Ok(Outcome::Failed(failed)) = outcome else { panic!("failed, not {outcome:?}") };
        assert_eq!((failed.code, failed.reason.as_str()), (422, "Invalid"));
        assert_eq!(recorded.writes().len(), 1);
    }

    #[tokio::test]
    async fn a_page_whose_token_keeps_expiring_ends_after_its_attempts() {
        let lists = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&lists);
        let (engine, run, _) = engine(move |sent| {
            count.fetch_add(1, Ordering::SeqCst);
            let (code, mut body) = status(410, "Expired");
            body["metadata"] = json!({ "continue": "from-the-latest" });
            match sent.method.as_str() {
                "GET" => (code, body),
                _ => fake::not_found(sent),
            }
        });
        let page = engine.list_page(&Resource::widgets(), Some("old"), &run).await;
        assert!(matches!(page, Err(Error::ListExpired(_))), "{:?}", page.err());
        let attempts = engine.settings.list_attempts as usize;
        assert_eq!(lists.load(Ordering::SeqCst), attempts);
        assert_eq!(run.expired_tokens.load(Ordering::Relaxed), attempts as u64);
    }
}
