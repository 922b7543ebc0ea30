//! Telling a run whose writes keep failing for one cause from a run with some failed objects.
//!
//! Behind a validating webhook whose backend refuses or never answers, every write fails. Each
//! object spends its attempts with backoff, the write window stays at one (it grows only on
//! success), and a run of 10,000 objects would hold its migration slot for days. So once the
//! objects keep failing, none succeeding, the run ends `Failed` with the last failure as the
//! cause; a later migration can try again. Pure: the pipeline feeds it outcomes as they come.

use std::time::Duration;

use tokio::time::Instant;

use super::{ObjectFailure, Outcome};

/// Objects failing in a row, none succeeding, that end a run at once: no resource with a few
/// bad objects has fifty of them in a row, written as they are listed (in key order) with many
/// writes in flight.
const FAILED_IN_A_ROW: u64 = 50;

/// Objects failing in a row that end a run once no object has succeeded for [`NO_SUCCESS_FOR`]:
/// with the window at one write and a webhook that never answers, an object takes five times
/// the webhook's `timeoutSeconds` (plus about 3 s of backoff) to spend its attempts: 13 s at
/// 2 s, 53 s at the default 10 s, so fifty would take from eleven to forty-four minutes.
const SLOW_FAILED_IN_A_ROW: u64 = 5;

/// How long without a single success makes [`SLOW_FAILED_IN_A_ROW`] failures enough.
const NO_SUCCESS_FOR: Duration = Duration::from_secs(120);

/// Outcomes since the last success.
#[derive(Debug)]
pub(super) struct FailingWrites {
    in_a_row: u64,
    /// When the last object succeeded (or the run started).
    last_success: Instant,
    last_failure: Option<ObjectFailure>,
}

/// Why a run's writes are judged to keep failing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeepFailing {
    /// Objects that failed in a row.
    pub objects: u64,
    /// How long no object succeeded.
    pub for_seconds: u64,
    /// The last failure: the cause an operator acts on.
    pub last: ObjectFailure,
}

impl FailingWrites {
    pub(super) fn new(now: Instant) -> FailingWrites {
        FailingWrites { in_a_row: 0, last_success: now, last_failure: None }
    }

    /// Counts one object's outcome, finished at `now`; says when the run should end.
    pub(super) fn record(&mut self, outcome: &Outcome, now: Instant) -> Option<KeepFailing> {
        let Outcome::Failed(failure) = outcome else {
            self.in_a_row = 0;
            self.last_success = now;
            self.last_failure = None;
            return None;
        };
        self.in_a_row += 1;
        self.last_failure = Some(failure.clone());
        let quiet = now.saturating_duration_since(self.last_success);
        let failing = self.in_a_row >= FAILED_IN_A_ROW
            || (self.in_a_row >= SLOW_FAILED_IN_A_ROW && quiet >= NO_SUCCESS_FOR);
        failing.then(|| KeepFailing {
            objects: self.in_a_row,
            for_seconds: quiet.as_secs(),
            last: failure.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(name: &str) -> Outcome {
        Outcome::Failed(ObjectFailure {
            namespace: String::new(),
            name: name.into(),
            code: 500,
            reason: "InternalError".into(),
            message: "failed calling webhook: context deadline exceeded".into(),
        })
    }

    #[test]
    fn fifty_failures_in_a_row_end_the_run_with_the_last_as_cause() {
        let start = Instant::now();
        let mut writes = FailingWrites::new(start);
        for i in 0..FAILED_IN_A_ROW - 1 {
            assert_eq!(writes.record(&failed(&format!("o-{i}")), start), None);
        }
        let ended = writes.record(&failed("last"), start).expect("fifty in a row end it");
        assert_eq!((ended.objects, ended.last.name.as_str()), (FAILED_IN_A_ROW, "last"));
    }

    #[test]
    fn any_success_starts_the_count_again() {
        let start = Instant::now();
        let mut writes = FailingWrites::new(start);
        for round in 0..5 {
            for i in 0..FAILED_IN_A_ROW - 1 {
                assert_eq!(writes.record(&failed(&format!("{round}-{i}")), start), None);
            }
            assert_eq!(writes.record(&Outcome::Rewritten, start), None);
            assert_eq!(writes.record(&Outcome::Conflict, start), None);
        }
    }

    #[test]
    fn slow_failures_end_the_run_once_nothing_succeeded_for_a_while() {
        let start = Instant::now();
        let mut writes = FailingWrites::new(start);
        let late = start + NO_SUCCESS_FOR;
        for i in 0..SLOW_FAILED_IN_A_ROW - 1 {
            assert_eq!(writes.record(&failed(&format!("o-{i}")), late), None, "too few yet");
        }
        let ended = writes.record(&failed("fifth"), late).expect("five failures, two minutes");
        assert_eq!(ended.for_seconds, NO_SUCCESS_FOR.as_secs());
        // Quick failures after a recent success are not enough.
        let mut quick = FailingWrites::new(start);
        quick.record(&Outcome::AlreadyCurrent, late);
        for i in 0..SLOW_FAILED_IN_A_ROW {
            assert_eq!(quick.record(&failed(&format!("q-{i}")), late), None);
        }
    }
}
