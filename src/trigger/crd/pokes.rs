//! When the CRD watch tells the discovery trigger to poll: a CRD that is new or whose spec
//! changed (its generation moved), at most once per discovery interval per CRD. A CRD whose
//! spec churns would otherwise have the trigger poll every few seconds for as long as it
//! churns; the regular poll, an interval later at most, sees what a poke held back would have
//! shown. Pure: time is passed in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What the discovery trigger was told, by CRD uid.
#[derive(Debug, Default)]
pub(super) struct Pokes {
    /// The generation last seen, and when the trigger was last poked for the CRD.
    told: HashMap<String, (i64, Option<Instant>)>,
}

impl Pokes {
    /// Records the CRD `uid` at `generation`, seen at `now`, and says whether to poke the
    /// trigger: a generation not seen before, unless it was poked for this CRD less than
    /// `every` ago.
    pub(super) fn poke(
        &mut self,
        uid: &str,
        generation: i64,
        now: Instant,
        every: Duration,
    ) -> bool {
        let (seen, poked) = self.told.entry(uid.to_owned()).or_insert((generation, None));
        let new = *seen != generation || poked.is_none();
        *seen = generation;
        let due = poked.is_none_or(|at| now.duration_since(at) >= every);
        if new && due {
            *poked = Some(now);
        }
        new && due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_crd_pokes_once_per_interval_for_a_new_generation() {
        let every = Duration::from_secs(600);
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut pokes = Pokes::default();
        // (uid, generation, seconds, pokes)
        let cases = [
            ("a", 1, 0, true),     // a CRD seen first
            ("a", 1, 1, false),    // the same generation: a status write
            ("a", 2, 2, false),    // a new one within the interval: held back
            ("b", 1, 3, true),     // another CRD has its own interval
            ("a", 3, 300, false),  // churn goes on
            ("a", 3, 600, false),  // the interval is over, but nothing new since
            ("a", 4, 601, true),   // a new generation after it
            ("a", 5, 1200, false), // within the interval that began at 601
            ("a", 6, 1201, true),
        ];
        for (uid, generation, seconds, poked) in cases {
            let answer = pokes.poke(uid, generation, at(seconds), every);
            assert_eq!(answer, poked, "{uid} at generation {generation}, {seconds} s");
        }
    }
}
