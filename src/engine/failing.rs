//! Telling a run whose writes keep failing from a run with some failed objects.
//!
//! Behind a validating webhook whose backend refuses or never answers, every write fails. Each
//! object spends its attempts with backoff, the write window stays at one (it grows only on
//! success), and the objects of a page take turns at that one write: with a webhook that times
//! out after 2 s, fifty objects each waiting for their fifth attempt take eight minutes before
//! the first of them is even recorded as failed, and a run of 10,000 objects would hold its
//! migration slot for days. So the run counts write attempts as they fail: once they keep
//! failing, on many objects, none succeeding, it ends `Failed` with the last failure as the
//! cause, and a later migration can try again. Pure: the writers feed it what each attempt got.

use std::time::Duration;

use tokio::time::Instant;

use crate::api::FailedObject;

/// Objects with a failed attempt, none succeeding since, that end a run once no write has
/// succeeded for [`FAST_NO_SUCCESS_FOR`]. No resource with a few bad objects has fifty of them
/// in a row: objects are written as they are listed, in key order, with many writes in flight.
const FAILED_OBJECTS: u64 = 50;

/// How long without a single successful write makes [`FAILED_OBJECTS`] enough. Writes that fail
/// at once (a webhook refusing, or restarting and answered 500 by the apiserver) reach fifty
/// objects in well under a second: a single-replica webhook's rolling update, a rescheduled pod
/// or an etcd leader change is a blip of a few seconds to be waited out, object by object, not
/// a run to end. Writes that keep failing for this long are not a blip.
const FAST_NO_SUCCESS_FOR: Duration = Duration::from_secs(30);

/// Objects with a failed attempt that end a run once no write has succeeded for
/// [`NO_SUCCESS_FOR`] (and [`SLOW_FAILED_ATTEMPTS`] attempts failed): a webhook that never
/// answers fails one attempt per `timeoutSeconds` (10 s by default) with the window at one.
const SLOW_FAILED_OBJECTS: u64 = 5;

/// Failed attempts that, with [`SLOW_FAILED_OBJECTS`], end a run after [`NO_SUCCESS_FOR`].
const SLOW_FAILED_ATTEMPTS: u64 = 10;

/// How long without a single successful write makes a few failing objects enough.
const NO_SUCCESS_FOR: Duration = Duration::from_secs(120);

/// Write attempts since the last success.
#[derive(Debug)]
pub(super) struct FailingWrites {
    attempts: u64,
    objects: u64,
    /// When a write last succeeded (or the run started).
    last_success: Instant,
}

/// Why a run's writes are judged to keep failing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeepFailing {
    /// Failed attempts since the last success.
    pub attempts: u64,
    /// Objects with a failed attempt since the last success.
    pub objects: u64,
    /// How long no write succeeded.
    pub for_seconds: u64,
    /// The last failure: the cause an operator acts on.
    pub last: FailedObject,
}

impl FailingWrites {
    pub(super) fn new(now: Instant) -> FailingWrites {
        FailingWrites { attempts: 0, objects: 0, last_success: now }
    }

    /// A write that succeeded, or found its object written by someone else or deleted.
    pub(super) fn succeeded(&mut self, now: Instant) {
        self.attempts = 0;
        self.objects = 0;
        self.last_success = now;
    }

    /// A failed attempt at an object (`first` when it is the object's first failed attempt);
    /// says when the run should end.
    pub(super) fn failed(
        &mut self,
        first: bool,
        failure: &FailedObject,
        now: Instant,
    ) -> Option<KeepFailing> {
        self.attempts += 1;
        self.objects += u64::from(first);
        let quiet = now.saturating_duration_since(self.last_success);
        let failing = (self.objects >= FAILED_OBJECTS && quiet >= FAST_NO_SUCCESS_FOR)
            || (self.objects >= SLOW_FAILED_OBJECTS
                && self.attempts >= SLOW_FAILED_ATTEMPTS
                && quiet >= NO_SUCCESS_FOR);
        failing.then(|| KeepFailing {
            attempts: self.attempts,
            objects: self.objects,
            for_seconds: quiet.as_secs(),
            last: failure.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(name: &str) -> FailedObject {
        FailedObject {
            namespace: String::new(),
            name: name.into(),
            code: 500,
            reason: "InternalError".into(),
            message: "failed calling webhook: context deadline exceeded".into(),
        }
    }

    #[test]
    fn fifty_failing_objects_end_the_run_with_the_last_failure_as_cause() {
        let start = Instant::now();
        let late = start + FAST_NO_SUCCESS_FOR;
        let mut writes = FailingWrites::new(start);
        for i in 0..FAILED_OBJECTS - 1 {
            assert_eq!(writes.failed(true, &failure(&format!("o-{i}")), late), None);
            // Further attempts at an object do not make it count twice.
            assert_eq!(writes.failed(false, &failure(&format!("o-{i}")), late), None);
        }
        let ended = writes.failed(true, &failure("last"), late).expect("fifty objects end it");
        assert_eq!((ended.objects, ended.last.name.as_str()), (FAILED_OBJECTS, "last"));
        assert_eq!(ended.attempts, 2 * FAILED_OBJECTS - 1);
    }

    #[test]
    fn a_blip_of_failures_at_once_is_waited_out() {
        let start = Instant::now();
        let mut writes = FailingWrites::new(start);
        // A webhook restarting: hundreds of objects refused within a second.
        let blip = start + Duration::from_millis(800);
        for i in 0..10 * FAILED_OBJECTS {
            assert_eq!(writes.failed(true, &failure(&format!("o-{i}")), blip), None);
        }
        // Still refusing after the quiet period: not a blip.
        let later = start + FAST_NO_SUCCESS_FOR;
        assert!(writes.failed(false, &failure("o-1"), later).is_some());
    }

    #[test]
    fn any_success_starts_the_count_again() {
        let start = Instant::now();
        let mut writes = FailingWrites::new(start);
        let late = start + FAST_NO_SUCCESS_FOR;
        for round in 0..5 {
            for i in 0..FAILED_OBJECTS - 1 {
                assert_eq!(writes.failed(true, &failure(&format!("{round}-{i}")), late), None);
            }
            writes.succeeded(late);
        }
    }

    #[test]
    fn slow_failures_end_the_run_once_nothing_succeeded_for_a_while() {
        let start = Instant::now();
        let mut writes = FailingWrites::new(start);
        let late = start + NO_SUCCESS_FOR;
        for i in 0..SLOW_FAILED_OBJECTS {
            assert_eq!(writes.failed(true, &failure(&format!("o-{i}")), late), None);
        }
        for _ in SLOW_FAILED_OBJECTS..SLOW_FAILED_ATTEMPTS - 1 {
            assert_eq!(writes.failed(false, &failure("o-0"), late), None, "too few attempts");
        }
        let ended = writes.failed(false, &failure("o-1"), late).expect("ten attempts, two minutes");
        assert_eq!(ended.for_seconds, NO_SUCCESS_FOR.as_secs());
        // Failures soon after a success are not enough.
        let mut quick = FailingWrites::new(start);
        quick.succeeded(late);
        for i in 0..2 * SLOW_FAILED_ATTEMPTS {
            assert_eq!(quick.failed(i < SLOW_FAILED_OBJECTS, &failure("q"), late), None);
        }
    }
}
