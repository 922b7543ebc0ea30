//! When the CRD watch tells the discovery trigger to poll: a CRD that is new or whose spec
//! changed (its generation moved). The first change after a quiet interval pokes at once; while
//! a CRD keeps changing, its pokes come ever further apart (2 s, then twice as long each time,
//! [`crate::rules::backoff::doubling`]), so that one that churns for good pokes once per
//! discovery interval, not every few seconds. A change made while a poke is due is not lost: the
//! poll that poke brings reads discovery as it is then. Pure: time is passed in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The wait before the second poke of a CRD that keeps changing: the discovery trigger's least
/// time between two polls that follow a change.
const FIRST_SPACING: Duration = Duration::from_secs(2);

/// What the discovery trigger was told, by CRD uid.
#[derive(Debug, Default)]
pub(super) struct Pokes {
    told: HashMap<String, Told>,
}

#[derive(Debug)]
struct Told {
    /// The generation last seen.
    generation: i64,
    /// When the last poke was (or is to be) given.
    at: Instant,
    /// Pokes in a row, each less than an interval after the one before.
    streak: u32,
}

impl Pokes {
    /// Records the CRD `uid` at `generation`, seen at `now`, and says when to poke the
    /// discovery trigger for it, from now (zero: at once): for a generation not seen before,
    /// unless a poke is due already; `None` when nothing is to be told. `every` is the
    /// discovery interval, the longest spacing.
    pub(super) fn poke(
        &mut self,
        uid: &str,
        generation: i64,
        now: Instant,
        every: Duration,
    ) -> Option<Duration> {
        let Some(told) = self.told.get_mut(uid) else {
            self.told.insert(uid.to_owned(), Told { generation, at: now, streak: 1 });
            return Some(Duration::ZERO);
        };
        if told.generation == generation || told.at >= now {
            told.generation = generation;
            return None;
        }
        told.generation = generation;
        let since = now.duration_since(told.at);
        if since >= every {
            (told.at, told.streak) = (now, 1);
            return Some(Duration::ZERO);
        }
        let spacing = crate::rules::backoff::doubling(told.streak, FIRST_SPACING, every);
        let wait = spacing.saturating_sub(since);
        (told.at, told.streak) = (now + wait, told.streak + 1);
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crd_that_keeps_changing_pokes_ever_less_often() {
        let every = Duration::from_secs(600);
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut pokes = Pokes::default();
        let secs = |s: u64| Some(Duration::from_secs(s));
        // (uid, generation, seconds, poke in)
        let cases = [
            ("a", 1, 0, secs(0)),    // a CRD seen first
            ("a", 1, 1, None),       // the same generation: a status write
            ("a", 2, 1, secs(1)),    // changed 1 s after the poke: 2 s after it
            ("a", 3, 2, None),       // the poke due at 2 s reads this one too
            ("b", 1, 2, secs(0)),    // another CRD is told of on its own
            ("a", 4, 3, secs(3)),    // then 4 s after the one before
            ("a", 5, 100, secs(0)),  // 8 s had passed: at once
            ("a", 6, 101, secs(15)), // 16 s after it
            ("a", 7, 2000, secs(0)), // after a quiet interval, at once again
            ("a", 8, 2001, secs(1)), // and 2 s after it
            ("a", 8, 2002, None),    // nothing new
        ];
        for (uid, generation, seconds, wait) in cases {
            let answer = pokes.poke(uid, generation, at(seconds), every);
            assert_eq!(answer, wait, "{uid} at generation {generation}, {seconds} s");
        }
    }

    #[test]
    fn a_crd_that_churns_for_good_pokes_once_per_interval() {
        let every = Duration::from_secs(600);
        let start = Instant::now();
        let mut pokes = Pokes::default();
        let mut given = Vec::new();
        for second in 0..3600 {
            let now = start + Duration::from_secs(second);
            if let Some(wait) = pokes.poke("a", second as i64, now, every) {
                given.push(second + wait.as_secs());
            }
        }
        // 2 s, 4 s, 8 s ... apart, then an interval apart: 15 pokes in an hour, not 1800.
        assert_eq!(given.len(), 15, "{given:?}");
        assert!(given.windows(2).skip(10).all(|w| w[1] - w[0] == 600), "{given:?}");
    }
}
