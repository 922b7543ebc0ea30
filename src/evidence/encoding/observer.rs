//! The encoding checks of one process, kept so that migrations share them: one per resource and
//! storage version, started as soon as a storage switch is seen, and kept fresh while a
//! migration waits for its turn to write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Check, EncodingPolicy, Expected, Rounds, Settle, confirm_with, sample_of};
use crate::apiserver::requests::Requests;
use crate::evidence::apiservers;
use crate::rules::encoding::Encoding;

/// How old a confirmation may be and still be taken without a fresh look: a settle period's
/// worth at least.
const FRESH_FOR: Duration = Duration::from_secs(5);

/// The encoding checks of one process, one per resource and storage version, started as soon as
/// a storage switch is seen (the CRD trigger sees them within a second) rather than when a
/// migration starts: a migration created after the settle period has passed starts at once,
/// and one that waits for its turn to write keeps its confirmation fresh from the shared samples
/// meanwhile ([`Observer::keep_fresh`]), so that its turn writes at once too.
/// Cheap to clone; clones share the checks.
#[derive(Clone, Default)]
pub struct Observer {
    checks: Arc<Mutex<HashMap<CheckKey, Observation>>>,
    /// The discovery samples every check of the process shares.
    rounds: Rounds,
}

/// Group, plural, what is expected, CRD generation.
type CheckKey = (String, String, Expected, i64);

#[derive(Clone)]
struct Observation {
    /// The verdict once there is one, and when it was last known to hold.
    verdict: Arc<watch::Sender<Option<(Encoding, Instant)>>>,
}

impl Observation {
    /// Makes a confirmation too old to be taken as it is: a sample just disagreed with it, so
    /// the turn must look again rather than take a confirmation extended a moment before.
    fn age(&self, now: Instant) {
        let aged = now.checked_sub(FRESH_FOR).unwrap_or(now);
        self.verdict.send_modify(|verdict| {
            if let Some((_, at)) = verdict {
                *at = (*at).min(aged);
            }
        });
    }
}

/// How often a confirmation kept fresh ([`Observer::keep_fresh`]) is sampled again.
const KEEP_FRESH_INTERVAL: Duration = Duration::from_millis(500);

/// What a confirmation's words say once it has been looked at again, after its first proof.
const AGAIN: &str = ", then again";

/// What one more sample does to a confirmation kept fresh ([`Observer::keep_fresh`]).
#[derive(Debug, PartialEq, Eq)]
enum Kept {
    /// It disagreed, or failed: keeping stops, the confirmation ages.
    Stop,
    /// It agreed, but the confirmation aged before it, and too few samples in a row agree yet
    /// to renew it.
    Aged,
    /// The confirmation holds now, in these words.
    Fresh(String),
}

/// What the verdict of the samples in a row (`in_a_row` of them, `settled` once they are
/// enough) does to a confirmation (`by`, last known to hold `age` ago). Pure.
fn kept_by(by: &str, settled: Option<Encoding>, age: Duration, in_a_row: u32) -> Kept {
    match settled {
        Some(Encoding::Unconfirmed(_)) => Kept::Stop,
        Some(Encoding::Confirmed { by: again }) => {
            Kept::Fresh(format!("{}{AGAIN} while waiting to write: {again}", first_proof(by)))
        }
        None if age < FRESH_FOR => Kept::Fresh(format!(
            "{}{AGAIN} while waiting to write, in {in_a_row} samples in a row",
            first_proof(by)
        )),
        None => Kept::Aged,
    }
}

/// The first proof of a confirmation, without what looks since then added.
fn first_proof(by: &str) -> &str {
    by.split(AGAIN).next().unwrap_or(by)
}

impl Observer {
    /// Starts checking `check` in the background unless that is under way or confirmed.
    pub fn observe(&self, requests: &Requests, check: &Check) {
        let _ = self.observation(requests, check, false);
    }

    /// The verdict on `check`: the background check's, taken again quickly if it is more than a
    /// few seconds old (it must still hold), or a new check's.
    pub async fn confirm(&self, requests: &Requests, check: &Check) -> Encoding {
        let observation = self.observation(requests, check, false);
        let Some((encoding, at)) = settled(observation.verdict.subscribe()).await else {
            return Encoding::Unconfirmed("the encoding check stopped".to_owned());
        };
        let Encoding::Confirmed { by } = encoding else {
            // Given up before: look again, things may have settled since.
            return self.fresh(requests, check).await;
        };
        if at.elapsed() < FRESH_FOR {
            return Encoding::Confirmed { by };
        }
        // Still so? A short look (two agreeing samples) before trusting it.
        let quick = Check { policy: EncodingPolicy::AT_ONCE, ..check.clone() };
        match confirm_with(requests, &quick, &self.rounds).await {
            Encoding::Confirmed { .. } => {
                let age = at.elapsed().as_secs_f64();
                let by = format!("{}{AGAIN} {age:.0} s later", first_proof(&by));
                observation
                    .verdict
                    .send_replace(Some((Encoding::Confirmed { by: by.clone() }, Instant::now())));
                Encoding::Confirmed { by }
            }
            Encoding::Unconfirmed(_) => self.fresh(requests, check).await,
        }
    }

    /// Keeps the confirmation of `check` fresh for as long as this runs (while a migration
    /// waits for its turn to write; dropped when the turn comes), so that the turn writes at
    /// once rather than after a look of its own. Every round of the shared discovery samples
    /// that publishes the expected hash extends a confirmation still fresh; one that aged is
    /// renewed by as many agreeing samples in a row as the apiservers' number asks for, as the
    /// look at the turn would be. A disagreement, or a sample that fails, stops it: the
    /// confirmation then ages, and the look at the turn decides. Returns at once when there is
    /// no confirmation to keep.
    pub async fn keep_fresh(&self, requests: &Requests, check: &Check) {
        let Some(observation) = self.existing(check) else { return };
        let survey = apiservers::survey(requests.client(), &check.group, check.version()).await;
        let quick = Check { policy: EncodingPolicy::AT_ONCE, ..check.clone() };
        let mut settle = Settle::new(&quick, apiservers::sampling(&survey), Instant::now());
        let mut sampling =
            self.rounds.join(requests, &check.discovery_version(), KEEP_FRESH_INTERVAL);
        let mut in_a_row = 0u32;
        loop {
            let round = sampling.next().await;
            let sample = sample_of(check, &round);
            let now = Instant::now();
            let verdict = settle.observe(sample, now);
            let kept = observation.verdict.borrow().clone();
            let Some((Encoding::Confirmed { by }, at)) = kept else { return };
            in_a_row += 1;
            match kept_by(&by, verdict, now.saturating_duration_since(at), in_a_row) {
                Kept::Stop => {
                    observation.age(now);
                    return;
                }
                Kept::Aged => {}
                Kept::Fresh(by) => {
                    observation.verdict.send_replace(Some((Encoding::Confirmed { by }, now)));
                }
            }
        }
    }

    /// The observation of `check` kept, if any.
    fn existing(&self, check: &Check) -> Option<Observation> {
        let checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        checks.get(&key_of(check)).cloned()
    }

    /// A new check, replacing the one kept, awaited.
    async fn fresh(&self, requests: &Requests, check: &Check) -> Encoding {
        let verdict = self.observation(requests, check, true).verdict.subscribe();
        match settled(verdict).await {
            Some((encoding, _)) => encoding,
            None => Encoding::Unconfirmed("the encoding check stopped".to_owned()),
        }
    }

    fn observation(&self, requests: &Requests, check: &Check, anew: bool) -> Observation {
        let key = key_of(check);
        let mut checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        if !anew && let Some(existing) = checks.get(&key) {
            return existing.clone();
        }
        let report = Arc::new(watch::Sender::new(None));
        let observation = Observation { verdict: report.clone() };
        let (requests, check) = (requests.clone(), check.clone());
        let rounds = self.rounds.clone();
        tokio::spawn(async move {
            let started = k8s_openapi::jiff::Timestamp::now();
            let encoding = match confirm_with(&requests, &check, &rounds).await {
                Encoding::Confirmed { by } => {
                    Encoding::Confirmed { by: format!("{by} (checked from {started:.0})") }
                }
                unconfirmed => unconfirmed,
            };
            report.send_replace(Some((encoding, Instant::now())));
        });
        // A CRD whose spec churns (a caBundle injected again and again) gets a check per
        // generation: only the newest of each resource is kept (older ones still report to
        // whoever awaits them).
        let (group, plural, _, generation) = &key;
        checks.retain(|(g, p, _, older), _| !(g == group && p == plural && older < generation));
        checks.insert(key, observation.clone());
        observation
    }
}

fn key_of(check: &Check) -> CheckKey {
    (check.group.clone(), check.plural.clone(), check.expected.clone(), check.generation)
}

/// The verdict of an observation, once it has one.
async fn settled(
    mut verdict: watch::Receiver<Option<(Encoding, Instant)>>,
) -> Option<(Encoding, Instant)> {
    verdict.wait_for(Option::is_some).await.ok().and_then(|seen| seen.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confirmation_is_kept_fresh_only_by_agreement_in_time() {
        let by = "discovery: 12 samples (checked from 10:00:00), then again 7 s later";
        let agreed = Encoding::Confirmed { by: "discovery: 12 samples".into() };
        let quick = Duration::from_millis(500);
        assert_eq!(
            kept_by(by, None, quick, 3),
            Kept::Fresh(
                "discovery: 12 samples (checked from 10:00:00), then again while waiting to write, in 3 samples in a row".into()
            ),
            "an agreeing sample extends a fresh confirmation, its first proof kept once"
        );
        assert_eq!(kept_by(by, None, FRESH_FOR, 3), Kept::Aged, "an aged one is not extended");
        assert_eq!(
            kept_by(by, Some(agreed), FRESH_FOR * 10, 12),
            Kept::Fresh(
                "discovery: 12 samples (checked from 10:00:00), then again while waiting to write: discovery: 12 samples".into()
            ),
            "enough samples in a row renew an aged one"
        );
        let disagreed = Encoding::Unconfirmed("hash B".into());
        assert_eq!(kept_by(by, Some(disagreed), quick, 4), Kept::Stop);
    }

    #[test]
    fn a_confirmation_a_sample_disagreed_with_is_never_taken_as_fresh() {
        let now = Instant::now();
        let confirmed = Encoding::Confirmed { by: "discovery".into() };
        let observation =
            Observation { verdict: Arc::new(watch::Sender::new(Some((confirmed, now)))) };
        observation.age(now);
        let (_, at) = observation.verdict.borrow().clone().expect("a verdict");
        assert!(now.saturating_duration_since(at) >= FRESH_FOR, "the turn looks again");
    }
}
