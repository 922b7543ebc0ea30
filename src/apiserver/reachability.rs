//! Saying once that the apiserver is unreachable, and once that it is back.
//!
//! During an outage every part of the controller fails its requests at once: the reconcile
//! loop's watch, the triggers, the lease renewals. Each hands its failure here. The first failure
//! that means the apiserver cannot be reached (no answer, or a 502, 503 or 504 from it or the
//! load balancer in front) is said at WARN, with its cause, once; the others are logged at DEBUG;
//! the first success afterwards says at INFO that the apiserver is back, and after how long.
//! Other failures are the caller's to say.
//!
//! A watch that expires (410 Gone: etcd compacted past the revision it watched from, as after an
//! apiserver restart) is not a failure either: the watcher lists again on its own. It is logged at
//! DEBUG ([`expired_watch`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::{debug, info};

/// Since when the apiserver has been unreachable, if it is.
static DOWN_SINCE: Mutex<Option<Instant>> = Mutex::new(None);

/// Whether `error` (or an error it wraps) says the apiserver could not be reached. When it
/// does, the outage is said once and this failure logged at DEBUG, with `what` failed; the
/// caller says nothing more. Otherwise the caller says what went wrong.
pub fn unreachable(error: &(dyn std::error::Error + 'static), what: &str) -> bool {
    let Some(cause) = outage_cause(error) else { return false };
    let mut down = DOWN_SINCE.lock().unwrap_or_else(|p| p.into_inner());
    match *down {
        Some(_) => {
            debug!(what, error = %crate::error_chain(error), "the apiserver is still unreachable")
        }
        None => {
            *down = Some(Instant::now());
            info!(
                cause,
                "the apiserver is unreachable; waiting for it (requests that fail meanwhile are logged at debug)"
            );
        }
    }
    true
}

/// Whether `error` (or an error it wraps) is a watch that expired (410 Gone), which the watcher
/// recovers from by listing again; when it is, it is logged at DEBUG with `what` failed, and the
/// caller says nothing more.
pub fn expired_watch(error: &(dyn std::error::Error + 'static), what: &str) -> bool {
    let mut source = Some(error);
    while let Some(current) = source {
        let code = match current.downcast_ref::<kube::runtime::watcher::Error>() {
            Some(kube::runtime::watcher::Error::WatchError(status)) => Some(status.code),
            _ => match current.downcast_ref::<kube::Error>() {
                Some(kube::Error::Api(status)) => Some(status.code),
                _ => None,
            },
        };
        if code == Some(410) {
            debug!(what, error = %crate::error_chain(error), "a watch expired; listing again");
            return true;
        }
        source = current.source();
    }
    false
}

/// Records that a request got an answer: the apiserver is reachable (said once after an outage).
pub fn reachable() {
    let mut down = DOWN_SINCE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(since) = down.take() {
        let after = round(since.elapsed());
        info!(after = ?after, "the apiserver is reachable again");
    }
}

/// The outage `error` reveals, in words, if it reveals one.
fn outage_cause(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source = Some(error);
    while let Some(current) = source {
        if let Some(kube) = current.downcast_ref::<kube::Error>() {
            return match kube {
                kube::Error::Api(status) if matches!(status.code, 502..=504) => {
                    Some(format!("HTTP {} {}", status.code, status.reason))
                }
                kube::Error::Api(_) => None,
                other => Some(crate::error_chain(other)),
            };
        }
        source = current.source();
    }
    None
}

/// A duration to the tenth of a second, for logs.
fn round(duration: Duration) -> Duration {
    Duration::from_millis(duration.as_millis() as u64 / 100 * 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expired_watch_is_told_from_other_failures() {
        let expired = kube::runtime::watcher::Error::WatchError(
            kube::core::Status { code: 410, reason: "Expired".into(), ..Default::default() }
                .boxed(),
        );
        let queue: kube::runtime::controller::Error<std::io::Error, _> =
            kube::runtime::controller::Error::QueueError(expired);
        assert!(expired_watch(&queue, "reconcile"));
        let forbidden = kube::runtime::watcher::Error::WatchFailed(answer(403));
        assert!(!expired_watch(&forbidden, "reconcile"));
        assert!(expired_watch(&kube::runtime::watcher::Error::WatchStartFailed(answer(410)), "x"));
    }

    fn answer(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status { code, reason: "ServiceUnavailable".into(), ..Default::default() }
                .boxed(),
        )
    }

    #[derive(Debug, thiserror::Error)]
    #[error("failed to list StorageStates")]
    struct Wrapper(#[source] kube::Error);

    #[test]
    fn no_answer_and_gateway_errors_are_outages_other_answers_are_not() {
        assert_eq!(outage_cause(&answer(503)).as_deref(), Some("HTTP 503 ServiceUnavailable"));
        assert!(outage_cause(&Wrapper(answer(504))).is_some(), "found in the chain");
        assert!(outage_cause(&kube::Error::LinesCodecMaxLineLengthExceeded).is_some());
        assert_eq!(outage_cause(&answer(403)), None);
        assert_eq!(outage_cause(&Wrapper(answer(409))), None);
        let io = std::io::Error::other("not a kube error");
        assert_eq!(outage_cause(&io), None);
    }
}
