//! Settling on a verdict: samples of the apiservers' encoding in, a verdict out. Pure: the caller
//! samples and sleeps.

use std::time::Duration;

use tokio::time::Instant;

use super::Check;
use crate::api::GroupResource;
use crate::evidence::apiservers::{self, Count, Unsampleable};
use crate::rules::encoding::Encoding;

/// Least discovery samples that must agree, whatever the settle period (at least two
/// connections).
pub const MIN_AGREEING_SAMPLES: u32 = 2;

/// The chance, at most, that agreeing discovery samples all missed one apiserver: every sample
/// goes through a fresh connection, which a load balancer hands to any apiserver.
pub(super) const MISS_AT_MOST: f64 = 0.01;

/// The agreeing samples that make it unlikely (at most [`MISS_AT_MOST`]) that one of
/// `apiservers` was never asked: `(1 - 1/n)^k <= MISS_AT_MOST`. Three apiservers need 12.
pub fn samples_needed(apiservers: usize) -> u32 {
    if apiservers <= 1 {
        return MIN_AGREEING_SAMPLES;
    }
    let missed_by_one = 1.0 - 1.0 / apiservers as f64;
    let needed = (MISS_AT_MOST.ln() / missed_by_one.ln()).ceil();
    // At most a few hundred for any real control plane.
    (needed as u32).max(MIN_AGREEING_SAMPLES)
}

/// What agreeing samples through fresh connections rest on, in words: how the apiservers were
/// counted, the chance that each was asked ([`apiservers::asked_every_apiserver`]), and that
/// this holds only if new connections are spread over them. Never "every apiserver" flatly.
fn reach_words(count: &Count, samples: u32) -> String {
    if count.apiservers <= 1 {
        return format!(
            "with {}, each sample asked it, unless an apiserver went uncounted",
            count.counted
        );
    }
    // Rounded down, so that the words never claim more than the number.
    let asked = (apiservers::asked_every_apiserver(count.apiservers, samples) * 1000.0).floor();
    format!(
        "with {}, every apiserver was asked with probability {:.3} or more, if the load balancer spreads new connections over them (the kubernetes Service has no client-IP affinity)",
        count.counted,
        asked / 1000.0
    )
}

/// One answer to "which version do the apiservers encode in?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sample {
    /// The StorageVersion API's common encoding version (`None` unless all apiservers agree).
    StorageVersionApi(Option<String>),
    /// The StorageVersion API could not be read.
    StorageVersionApiError(String),
    /// The discovery hash (the StorageVersion API is not served), or why it could not be read.
    Discovery(Result<Option<String>, String>),
    /// The discovery hash, the StorageVersion API having no entry for the resource.
    DiscoveryNoEntry(Result<Option<String>, String>),
}

/// Samples in, a verdict out once there is one: the StorageVersion API is trusted at its
/// word; discovery must publish the expected hash for the settle period, with at least
/// [`MIN_AGREEING_SAMPLES`] samples and no disagreement in between (one resets the period),
/// and confirms nothing at all when its samples cannot reach every apiserver ([`Unsampleable`]).
/// Gives up once `wait` has passed since the first sample. Pure: the caller samples and sleeps.
#[derive(Debug)]
pub struct Settle {
    expected_hash: String,
    settle: Duration,
    deadline: Instant,
    /// Agreeing discovery samples needed, for the number of apiservers.
    pub(super) samples: u32,
    /// How many apiservers there are, as counted, or why discovery samples cannot stand for
    /// all of them.
    sampling: Result<Count, Unsampleable>,
    /// Since when, and in how many samples, discovery has agreed.
    agreeing: Option<(Instant, u32)>,
    /// Hashes seen since the agreement last broke, and how often, for the message when giving
    /// up: during a rolling upgrade, two releases publish two hashes.
    seen: std::collections::BTreeMap<String, u32>,
    /// What was seen last, for the message when giving up.
    last_seen: String,
    check: Check,
}

impl Settle {
    /// A settle of `check`, needing as many agreeing discovery samples as the apiservers
    /// counted ask for ([`samples_needed`]), or none taken as evidence when `sampling` says they
    /// cannot reach every apiserver.
    pub fn new(check: &Check, sampling: Result<Count, Unsampleable>, now: Instant) -> Settle {
        let apiservers = sampling.as_ref().map_or(1, |count| count.apiservers);
        Settle {
            expected_hash: check.expected_hash(),
            settle: check.policy.settle,
            deadline: now + check.policy.wait,
            samples: samples_needed(apiservers),
            sampling,
            agreeing: None,
            seen: std::collections::BTreeMap::new(),
            last_seen: "nothing yet".to_owned(),
            check: check.clone(),
        }
    }

    /// Whether what decides on sampling should be read again: a read of it failed.
    pub fn needs_survey(&self) -> bool {
        self.sampling.as_ref().is_err_and(|unsampleable| !unsampleable.is_definite())
    }

    /// Takes what was read again about sampling (after [`Settle::needs_survey`]).
    pub fn resurvey(&mut self, sampling: Result<Count, Unsampleable>) {
        let apiservers = sampling.as_ref().map_or(1, |count| count.apiservers);
        self.samples = samples_needed(apiservers);
        self.sampling = sampling;
    }

    /// Takes one sample taken at `now`; returns the verdict once there is one.
    pub fn observe(&mut self, sample: Sample, now: Instant) -> Option<Encoding> {
        let (published, by) = match sample {
            Sample::StorageVersionApi(Some(common)) if self.check.is_expected_version(&common) => {
                return Some(Encoding::Confirmed {
                    by: format!("the StorageVersion API: every apiserver encodes {common}"),
                });
            }
            Sample::StorageVersionApi(common) => {
                self.last_seen = format!(
                    "the StorageVersion API reports common encoding version {}",
                    common.as_deref().unwrap_or("none (the apiservers disagree)")
                );
                return self.unless_too_late(now);
            }
            Sample::StorageVersionApiError(error) => {
                self.last_seen = format!("the StorageVersion API could not be read: {error}");
                return self.unless_too_late(now);
            }
            Sample::Discovery(published) => (published, "discovery"),
            Sample::DiscoveryNoEntry(published) => {
                (published, "discovery (the StorageVersion API has no entry for this resource)")
            }
        };
        let count = match &self.sampling {
            Ok(count) => count.clone(),
            Err(unsampleable) if unsampleable.is_definite() => {
                return Some(self.unsampleable(unsampleable, &published));
            }
            // A read that failed (an apiserver restarting): no sample counts until it succeeds.
            Err(unsampleable) => {
                self.agreeing = None;
                self.last_seen = unsampleable.to_string();
                return self.unless_too_late(now);
            }
        };
        if let Ok(hash) = &published {
            *self.seen.entry(hash.clone().unwrap_or_else(|| "none".to_owned())).or_default() += 1;
        }
        match published {
            Ok(Some(hash)) if hash == self.expected_hash => {
                let (since, samples) = self.agreeing.get_or_insert((now, 0));
                *samples += 1;
                let held = now.saturating_duration_since(*since);
                if held >= self.settle && *samples >= self.samples {
                    let by = format!(
                        "{by}: {samples} samples through fresh connections over {:.1} s published {}, none other; {}",
                        held.as_secs_f64(),
                        self.expected_hash,
                        reach_words(&count, *samples),
                    );
                    return Some(Encoding::Confirmed { by });
                }
                None
            }
            Ok(other) => {
                if self.agreeing.take().is_some() {
                    self.seen.clear();
                    *self
                        .seen
                        .entry(other.clone().unwrap_or_else(|| "none".into()))
                        .or_default() += 1;
                }
                self.last_seen = format!("hash {}", other.as_deref().unwrap_or("none"));
                self.unless_too_late(now)
            }
            Err(error) => {
                self.agreeing = None;
                self.last_seen = format!("an error: {error}");
                self.unless_too_late(now)
            }
        }
    }

    /// The verdict when discovery answered but its samples cannot stand for every apiserver:
    /// unconfirmed, saying why first (a condition's message may be cut), then what was seen.
    fn unsampleable(
        &self,
        unsampleable: &Unsampleable,
        published: &Result<Option<String>, String>,
    ) -> Encoding {
        let seen = match published {
            Ok(hash) => format!("published {}", hash.as_deref().unwrap_or("no hash")),
            Err(error) => format!("could not be read: {error}"),
        };
        Encoding::Unconfirmed(format!(
            "discovery samples cannot confirm the encoding of {}: {unsampleable}. Discovery {seen} (expected {}, {}). \
             The StorageVersion API, where it is served and lists the resource, is used instead; without it, check etcd and vouch for the encoding with the annotation {}: \"true\" on a new migration",
            GroupResource::name_of(&self.check.group, &self.check.plural),
            self.check.expected_words(),
            self.expected_hash,
            crate::api::ENCODING_CONFIRMED_ANNOTATION,
        ))
    }

    fn unless_too_late(&self, now: Instant) -> Option<Encoding> {
        (now >= self.deadline).then(|| {
            let seen: Vec<String> =
                self.seen.iter().map(|(hash, n)| format!("{hash} ({n} samples)")).collect();
            Encoding::Unconfirmed(format!(
                "the apiservers were not seen encoding {} of {} ({}) in {} agreeing samples over {:.0} s within {:.0} s ({}); last seen: {}; published since the last agreement: {}. \
                 If the apiserver's hash formula changed, or discovery never settles, check etcd and vouch for the encoding with the annotation {}: \"true\" on a new migration",
                self.check.expected_words(),
                GroupResource::name_of(&self.check.group, &self.check.plural),
                self.expected_hash,
                self.samples,
                self.settle.as_secs_f64(),
                self.check.policy.wait.as_secs_f64(),
                match &self.sampling {
                    Ok(count) => count.counted.clone(),
                    Err(unsampleable) => unsampleable.to_string(),
                },
                self.last_seen,
                if seen.is_empty() { "nothing".to_owned() } else { seen.join(", ") },
                crate::api::ENCODING_CONFIRMED_ANNOTATION,
            ))
        })
    }
}
