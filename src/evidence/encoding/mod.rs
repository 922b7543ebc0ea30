//! Whether the apiservers encode a resource in a given storage version yet.
//!
//! A migration only moves objects to the version the apiserver encodes in when it writes them.
//! Right after a CRD's storage switch, and while HA apiservers behind a load balancer catch up,
//! some may still encode the old one, so kube-svm confirms the encoding before its first write.
//! Where the StorageVersion API is served and has the resource, it says so directly. Otherwise
//! discovery's `storageVersionHash` must equal the hash of the version, sampled through fresh
//! connections (each may reach another apiserver) for a settle period without a single
//! disagreement, unless [`apiservers::sampling`] shows the samples cannot reach every apiserver
//! (an aggregated API, client-IP affinity): then discovery confirms nothing. A hash that has not
//! appeared yet is waited for, up to a limit; kube-svm never confirms on a guess.

use std::time::Duration;

use tokio::time::Instant;

mod observer;
mod rounds;
mod settle;

use crate::apiserver::requests::Requests;
use crate::evidence::apiservers;
use crate::rules::encoding::Encoding;
use crate::rules::storage_hash::storage_version_hash;
pub use observer::Observer;
pub use rounds::{Round, Rounds};
pub use settle::{MIN_AGREEING_SAMPLES, Sample, Settle, samples_needed};

/// What to check, and for how long.
#[derive(Clone, Debug)]
pub struct Check {
    /// The resource's API group; empty for the core group.
    pub group: String,
    /// The resource's plural name, such as `widgets`.
    pub plural: String,
    /// The resource's kind, part of what its storage version hash is computed from.
    pub kind: String,
    /// What the apiservers must encode in.
    pub expected: Expected,
    /// The CRD's generation the check is for: a storage switch bumps it, and with it the check
    /// starts anew, even back to a version confirmed before. 0 for a built-in resource.
    pub generation: i64,
    /// How long discovery must publish the expected hash without a disagreement, and how long
    /// to wait, in all, for it to appear and settle.
    pub policy: EncodingPolicy,
}

/// How long encoding checks take: discovery must agree for `settle` (with enough samples for
/// the apiservers' number), and is waited for `wait` at most before the check gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodingPolicy {
    /// How long discovery must agree (`--storage-version-settle`).
    pub settle: Duration,
    /// Longest wait for the hash to appear and settle (`--storage-version-wait`).
    pub wait: Duration,
}

impl EncodingPolicy {
    /// No settle and no wait: one look decides.
    pub const AT_ONCE: EncodingPolicy =
        EncodingPolicy { settle: Duration::ZERO, wait: Duration::ZERO };
}

/// What the apiservers must encode a resource in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Expected {
    /// A CRD's storage version: its hash is computed, and discovery is read at that version.
    StorageVersion(String),
    /// A built-in resource's storage version hash, as discovery published it when the migration
    /// started, read from discovery at `served` (a version of the group that serves it).
    Hash {
        /// The storage version hash discovery published.
        hash: String,
        /// The version of the group discovery is read at.
        served: String,
    },
}

/// The StorageVersion API's group version (`internal.apiserver.k8s.io`).
const STORAGE_VERSION_API: &str = "internal.apiserver.k8s.io/v1alpha1";

/// Least time between two discovery samples.
const MIN_SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

/// Time between two discovery samples of a check with no settle period.
const QUICK_SAMPLE_INTERVAL: Duration = Duration::from_millis(50);

/// Most time between two discovery samples: a settle period sees a few samples at least.
const MAX_SAMPLE_INTERVAL: Duration = Duration::from_secs(2);

impl Check {
    /// A check that the apiservers encode `group`'s `plural` (of `kind`) as `expected`, for the
    /// CRD's `generation` (0 for a built-in resource), taking as long as `policy` says.
    pub fn new(
        group: &str,
        plural: &str,
        kind: &str,
        expected: Expected,
        generation: i64,
        policy: EncodingPolicy,
    ) -> Check {
        Check {
            group: group.to_owned(),
            plural: plural.to_owned(),
            kind: kind.to_owned(),
            expected,
            generation,
            policy,
        }
    }

    /// The version of the group discovery is read at.
    fn version(&self) -> &str {
        match &self.expected {
            Expected::StorageVersion(version) => version,
            Expected::Hash { served, .. } => served,
        }
    }

    /// The `group/version` discovery is read at.
    fn discovery_version(&self) -> String {
        match self.group.as_str() {
            "" => self.version().to_owned(),
            group => format!("{group}/{}", self.version()),
        }
    }

    /// The storage version hash the apiservers publish once they encode as expected.
    pub fn expected_hash(&self) -> String {
        match &self.expected {
            Expected::StorageVersion(version) => {
                storage_version_hash(&self.group, version, &self.kind)
            }
            Expected::Hash { hash, .. } => hash.clone(),
        }
    }

    /// What is expected, in words: `example.com/v2`, or `hash 3Yzk/nb78XY=`.
    fn expected_words(&self) -> String {
        match &self.expected {
            Expected::StorageVersion(_) => self.discovery_version(),
            Expected::Hash { hash, .. } => format!("storage version hash {hash}"),
        }
    }

    /// Whether the StorageVersion API's common encoding version (`group/version`, or `version`
    /// for the core group) is what is expected.
    fn is_expected_version(&self, common: &str) -> bool {
        let version = common.rsplit('/').next().unwrap_or(common);
        storage_version_hash(&self.group, version, &self.kind) == self.expected_hash()
    }

    /// Time between two samples, so that `samples` of them fit in the settle period; for a
    /// check with no settle period (a verdict looked at again: is it still so?), as soon as new
    /// connections can be had, since how many apiservers the samples reach depends on how many
    /// new connections there are, not on the time between them.
    fn sample_interval(&self, samples: u32) -> Duration {
        if self.policy.settle.is_zero() {
            return QUICK_SAMPLE_INTERVAL;
        }
        (self.policy.settle / samples.max(1)).clamp(MIN_SAMPLE_INTERVAL, MAX_SAMPLE_INTERVAL)
    }
}

/// Confirms that the apiservers encode `check.storage_version`, asking until they do or
/// `check.wait` has passed. `config` makes a fresh client (and so a fresh connection) for every
/// discovery sample; what [`apiservers::survey`] reads first says whether such samples can
/// reach every apiserver, and how many are needed.
pub async fn confirm(requests: &Requests, check: &Check) -> Encoding {
    confirm_with(requests, check, &Rounds::default()).await
}

/// [`confirm`], its discovery samples taken from `rounds`, shared with the other checks.
async fn confirm_with(requests: &Requests, check: &Check, rounds: &Rounds) -> Encoding {
    let survey = apiservers::survey(requests.client(), &check.group, check.version()).await;
    let mut settle = Settle::new(check, apiservers::sampling(&survey), Instant::now());
    let interval = check.sample_interval(settle.samples);
    let mut sampling = rounds.join(requests, &check.discovery_version(), interval);
    loop {
        if settle.needs_survey() {
            let survey = apiservers::survey(requests.client(), &check.group, check.version()).await;
            settle.resurvey(apiservers::sampling(&survey));
        }
        let round = sampling.next().await;
        let sample = sample_of(check, &round);
        if let Some(verdict) = settle.observe(sample, Instant::now()) {
            return verdict;
        }
    }
}

/// What `round` says of `check`'s resource: what discovery published, unless the StorageVersion
/// API is served and answers for it. Pure.
fn sample_of(check: &Check, round: &Round) -> Sample {
    let published = round.hash_of(&check.discovery_version(), &check.plural);
    let group = if check.group.is_empty() { "core" } else { &check.group };
    match &round.storage_versions {
        None => Sample::Discovery(published),
        Some(Err(error)) => Sample::StorageVersionApiError(error.clone()),
        Some(Ok(versions)) => match versions.get(&format!("{group}.{}", check.plural)) {
            Some(common) => Sample::StorageVersionApi(common.clone()),
            // kube-apiserver 1.37 publishes StorageVersions for built-in resources only.
            None => Sample::DiscoveryNoEntry(published),
        },
    }
}

/// What discovery published at the end of a run of a built-in resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AtEnd {
    /// Every sample published the hash the run targeted.
    Same,
    /// Every sample published this other hash: the storage version moved, everywhere.
    Moved(String),
    /// The samples disagree (or some failed): what was seen, in words.
    Mixed(String),
}

/// Samples discovery through fresh connections as often as the apiservers' number asks, and
/// says whether they all still publish `check`'s expected hash.
pub async fn at_end(requests: &Requests, check: &Check) -> AtEnd {
    let apiservers = apiservers::apiservers_or_assumed(requests.client()).await;
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..samples_needed(apiservers) {
        let sample = match published_hash(requests, check).await {
            Ok(hash) => hash.unwrap_or_else(|| "none".to_owned()),
            Err(error) => format!("an error ({error})"),
        };
        *seen.entry(sample).or_insert(0u32) += 1;
        tokio::time::sleep(MIN_SAMPLE_INTERVAL).await;
    }
    judge_end(&check.expected_hash(), &seen)
}

/// The verdict on the samples taken at the end of a run: how often each hash was seen.
fn judge_end(expected: &str, seen: &std::collections::BTreeMap<String, u32>) -> AtEnd {
    let mut hashes = seen.keys();
    match (hashes.next(), hashes.next()) {
        (Some(only), None) if only == expected => AtEnd::Same,
        (Some(only), None) if !only.starts_with("an error") && only != "none" => {
            AtEnd::Moved(only.clone())
        }
        _ => {
            let words: Vec<String> =
                seen.iter().map(|(hash, n)| format!("{hash} ({n} samples)")).collect();
            AtEnd::Mixed(words.join(", "))
        }
    }
}

/// What one discovery sample, taken while a run of a built-in resource writes, says about the
/// hash the run targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DuringRun {
    /// The apiserver asked publishes the target.
    Target,
    /// The apiserver asked publishes another hash (`none` when it publishes none for the
    /// resource): it encodes in another version, so objects the run writes through it may be
    /// stored there.
    Other(String),
    /// No answer (an apiserver restarting, a connection refused): nothing about the encoding.
    /// The next sample, and the samples at the end of the run, decide.
    Unread(String),
}

/// The verdict on one discovery sample taken during a run that targets `expected`. Pure.
pub fn judge_during_run(expected: &str, sample: Result<Option<String>, String>) -> DuringRun {
    match sample {
        Ok(Some(hash)) if hash == expected => DuringRun::Target,
        Ok(Some(other)) => DuringRun::Other(other),
        Ok(None) => DuringRun::Other("none".to_owned()),
        Err(error) => DuringRun::Unread(error),
    }
}

/// One discovery sample through a new connection (behind a load balancer, consecutive samples
/// may reach different apiservers), judged against `check`'s expected hash.
pub async fn sample_during_run(requests: &Requests, check: &Check) -> DuringRun {
    judge_during_run(&check.expected_hash(), published_hash(requests, check).await)
}

/// How long one discovery sample may take: an apiserver that does not answer (frozen, or its
/// connection hung) counts as one that does not agree, not as a wait without end.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);

/// The hash discovery publishes for the resource, read through a new connection.
async fn published_hash(requests: &Requests, check: &Check) -> Result<Option<String>, String> {
    match tokio::time::timeout(SAMPLE_TIMEOUT, published_hash_now(requests, check)).await {
        Ok(published) => published,
        Err(_) => Err(format!("no answer within {SAMPLE_TIMEOUT:?}")),
    }
}

async fn published_hash_now(requests: &Requests, check: &Check) -> Result<Option<String>, String> {
    let client = requests.fresh_client().map_err(|e| crate::error_chain(&e))?;
    let api_version = check.discovery_version();
    let list = match check.group.as_str() {
        "" => client.list_core_api_resources(&api_version).await,
        _ => client.list_api_group_resources(&api_version).await,
    };
    let list = list.map_err(|e| crate::error_chain(&e))?;
    Ok(list
        .resources
        .into_iter()
        .find(|r| r.name == check.plural)
        .and_then(|r| r.storage_version_hash))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::settle::MISS_AT_MOST;
    use super::*;
    use crate::evidence::apiservers::{Count, Unsampleable};

    fn check(group: &str, settle: Duration) -> Check {
        Check {
            group: group.into(),
            plural: "widgets".into(),
            kind: "Widget".into(),
            expected: Expected::StorageVersion("v2".into()),
            generation: 2,
            policy: EncodingPolicy { settle, wait: Duration::from_secs(60) },
        }
    }

    /// `n` apiservers, counted.
    fn counted(n: usize) -> Count {
        Count { apiservers: n, counted: format!("{n} apiservers counted") }
    }

    /// A settle needing two agreeing samples, as with one apiserver.
    fn settle_of(check: &Check, now: Instant) -> Settle {
        Settle::new(check, Ok(counted(1)), now)
    }

    #[test]
    fn a_round_answers_through_the_storage_version_api_where_it_has_an_entry() {
        let check = check("", Duration::from_secs(10));
        let hashes = HashMap::from([("widgets".to_owned(), Some("H2".to_owned()))]);
        let mut round = Round {
            number: 1,
            storage_versions: None,
            documents: HashMap::from([("v2".to_owned(), Ok(hashes))]),
        };
        assert_eq!(sample_of(&check, &round), Sample::Discovery(Ok(Some("H2".into()))));
        let common = HashMap::from([("core.widgets".to_owned(), Some("v2".to_owned()))]);
        round.storage_versions = Some(Ok(common));
        assert_eq!(sample_of(&check, &round), Sample::StorageVersionApi(Some("v2".into())));
        round.storage_versions = Some(Ok(HashMap::new()));
        assert_eq!(sample_of(&check, &round), Sample::DiscoveryNoEntry(Ok(Some("H2".into()))));
        round.storage_versions = Some(Err("HTTP 503".into()));
        assert_eq!(sample_of(&check, &round), Sample::StorageVersionApiError("HTTP 503".into()));
    }

    #[test]
    fn a_round_answers_for_the_group_versions_it_asked() {
        let hashes = HashMap::from([("widgets".to_owned(), Some("H2".to_owned()))]);
        let round = Round {
            number: 3,
            storage_versions: None,
            documents: HashMap::from([
                ("example.com/v2".to_owned(), Ok(hashes)),
                ("other.io/v1".to_owned(), Err("HTTP 503".to_owned())),
            ]),
        };
        assert_eq!(round.hash_of("example.com/v2", "widgets"), Ok(Some("H2".into())));
        assert_eq!(round.hash_of("example.com/v2", "gadgets"), Ok(None));
        assert_eq!(round.hash_of("other.io/v1", "things"), Err("HTTP 503".into()));
        assert!(round.hash_of("v1", "secrets").is_err(), "not asked: no sample");
    }

    #[test]
    fn names_and_hashes_follow_the_group() {
        assert_eq!(check("example.com", Duration::ZERO).discovery_version(), "example.com/v2");
        assert_eq!(check("", Duration::ZERO).discovery_version(), "v2");
        assert_eq!(
            check("example.com", Duration::ZERO).expected_hash(),
            storage_version_hash("example.com", "v2", "Widget")
        );
    }

    fn hash(version: &str) -> Result<Option<String>, String> {
        Ok(Some(storage_version_hash("example.com", version, "Widget")))
    }

    fn at(start: Instant, seconds: u64) -> Instant {
        start + Duration::from_secs(seconds)
    }

    #[test]
    fn a_hash_that_has_not_appeared_yet_is_waited_for_then_must_hold() {
        let start = Instant::now();
        let mut settle = settle_of(&check("example.com", Duration::from_secs(10)), start);
        // Right after the switch, discovery lags: the old hash, then none. Not a verdict yet.
        assert_eq!(settle.observe(Sample::Discovery(hash("v1")), at(start, 0)), None);
        assert_eq!(settle.observe(Sample::Discovery(Ok(None)), at(start, 1)), None);
        assert_eq!(settle.observe(Sample::Discovery(hash("v2")), at(start, 2)), None);
        assert_eq!(settle.observe(Sample::Discovery(hash("v2")), at(start, 8)), None);
        let Some(Encoding::Confirmed { by }) =
            settle.observe(Sample::Discovery(hash("v2")), at(start, 12))
        else {
            panic!("held for the settle period")
        };
        assert!(
            by.starts_with("discovery: 3 samples through fresh connections over 10.0 s"),
            "{by}"
        );
    }

    #[test]
    fn one_disagreement_starts_the_settle_period_over() {
        let start = Instant::now();
        let mut settle = settle_of(&check("example.com", Duration::from_secs(10)), start);
        settle.observe(Sample::Discovery(hash("v2")), at(start, 0));
        // Another apiserver behind the load balancer still encodes v1.
        assert_eq!(settle.observe(Sample::Discovery(hash("v1")), at(start, 5)), None);
        assert_eq!(settle.observe(Sample::Discovery(hash("v2")), at(start, 11)), None);
        assert_eq!(settle.observe(Sample::Discovery(hash("v2")), at(start, 20)), None);
        assert!(matches!(
            settle.observe(Sample::Discovery(hash("v2")), at(start, 21)),
            Some(Encoding::Confirmed { .. })
        ));
    }

    #[test]
    fn gives_up_after_the_wait_saying_what_was_seen_and_how_to_override() {
        let start = Instant::now();
        let mut settle = settle_of(&check("example.com", Duration::from_secs(10)), start);
        assert_eq!(settle.observe(Sample::Discovery(hash("v1")), at(start, 30)), None);
        let Some(Encoding::Unconfirmed(why)) =
            settle.observe(Sample::Discovery(hash("v1")), at(start, 60))
        else {
            panic!("too late")
        };
        assert!(why.contains(&storage_version_hash("example.com", "v1", "Widget")), "{why}");
        assert!(why.contains("kube-svm.io/encoding-confirmed"), "{why}");
        // An error is no confirmation either.
        let impatient =
            Check { policy: EncodingPolicy::AT_ONCE, ..check("example.com", Duration::ZERO) };
        let mut settle = settle_of(&impatient, start);
        let verdict = settle.observe(Sample::Discovery(Err("refused".into())), at(start, 0));
        assert!(matches!(verdict, Some(Encoding::Unconfirmed(why)) if why.contains("refused")));
    }

    #[test]
    fn the_storage_version_api_is_taken_at_its_word_but_waited_for() {
        let start = Instant::now();
        let mut settle = settle_of(&check("example.com", Duration::from_secs(10)), start);
        let common = |v: &str| Sample::StorageVersionApi(Some(format!("example.com/{v}")));
        assert_eq!(settle.observe(common("v1"), at(start, 0)), None);
        assert_eq!(settle.observe(Sample::StorageVersionApi(None), at(start, 1)), None);
        let verdict = settle.observe(common("v2"), at(start, 2));
        let Some(Encoding::Confirmed { by }) = verdict else { panic!("confirmed") };
        assert!(by.starts_with("the StorageVersion API"), "{by}");
    }

    #[test]
    fn samples_are_spaced_to_fit_the_settle_period() {
        assert_eq!(check("g", Duration::ZERO).sample_interval(12), QUICK_SAMPLE_INTERVAL);
        assert_eq!(check("g", Duration::from_secs(4)).sample_interval(4), Duration::from_secs(1));
        assert_eq!(check("g", Duration::from_secs(60)).sample_interval(2), MAX_SAMPLE_INTERVAL);
    }

    #[test]
    fn the_end_of_a_run_tells_a_move_from_a_mix() {
        let seen = |pairs: &[(&str, u32)]| {
            pairs
                .iter()
                .map(|(h, n)| (h.to_string(), *n))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        assert_eq!(judge_end("A", &seen(&[("A", 12)])), AtEnd::Same);
        assert_eq!(judge_end("A", &seen(&[("B", 12)])), AtEnd::Moved("B".into()));
        let AtEnd::Mixed(words) = judge_end("A", &seen(&[("A", 8), ("B", 4)])) else {
            panic!("two releases, two hashes")
        };
        assert!(words.contains("A (8 samples)") && words.contains("B (4 samples)"), "{words}");
        assert!(matches!(judge_end("A", &seen(&[("none", 12)])), AtEnd::Mixed(_)));
        assert!(matches!(judge_end("A", &seen(&[("an error (refused)", 12)])), AtEnd::Mixed(_)));
    }

    #[test]
    fn a_sample_during_a_run_tells_another_hash_from_no_answer() {
        assert_eq!(judge_during_run("A", Ok(Some("A".into()))), DuringRun::Target);
        assert_eq!(judge_during_run("A", Ok(Some("B".into()))), DuringRun::Other("B".into()));
        // An apiserver that publishes no hash for the resource is of another release too.
        assert_eq!(judge_during_run("A", Ok(None)), DuringRun::Other("none".into()));
        // A refused connection says nothing about how anything is encoded.
        assert_eq!(
            judge_during_run("A", Err("connection refused".into())),
            DuringRun::Unread("connection refused".into())
        );
    }

    #[test]
    fn enough_samples_that_no_apiserver_was_likely_missed() {
        assert_eq!(samples_needed(0), MIN_AGREEING_SAMPLES);
        assert_eq!(samples_needed(1), MIN_AGREEING_SAMPLES);
        assert_eq!(samples_needed(2), 7);
        assert_eq!(samples_needed(3), 12);
        assert_eq!(samples_needed(5), 21);
        for n in 2..10 {
            let missed = (1.0 - 1.0 / n as f64).powi(samples_needed(n) as i32);
            assert!(missed <= MISS_AT_MOST, "{n} apiservers: {missed}");
        }
    }

    #[test]
    fn three_apiservers_need_twelve_agreeing_samples_and_one_disagreement_resets_them() {
        let start = Instant::now();
        let quick = check("example.com", Duration::ZERO);
        let mut settle = Settle::new(&quick, Ok(counted(3)), start);
        for i in 0..11 {
            assert_eq!(settle.observe(Sample::Discovery(hash("v2")), at(start, i)), None);
        }
        // The third apiserver still encodes v1: the count starts over.
        assert_eq!(settle.observe(Sample::Discovery(hash("v1")), at(start, 11)), None);
        for i in 12..23 {
            assert_eq!(settle.observe(Sample::Discovery(hash("v2")), at(start, i)), None);
        }
        let verdict = settle.observe(Sample::Discovery(hash("v2")), at(start, 23));
        let Some(Encoding::Confirmed { by }) = verdict else { panic!("twelve in a row") };
        assert!(by.contains("12 samples") && by.contains("3 apiservers"), "{by}");
        // What the confirmation rests on: a chance, and connections being spread.
        assert!(by.contains("with probability 0.976 or more"), "{by}");
        assert!(by.contains("if the load balancer spreads new connections"), "{by}");
        assert!(!by.contains("every apiserver encodes"), "{by}");
    }

    #[test]
    fn samples_that_cannot_reach_every_apiserver_confirm_nothing_at_once() {
        let start = Instant::now();
        let pinned = Err(Unsampleable::ClientIpAffinity(counted(3)));
        let mut settle = Settle::new(&check("example.com", Duration::ZERO), pinned, start);
        // However many agree, and before the wait is over: no sample stands for the others.
        let Some(Encoding::Unconfirmed(why)) = settle.observe(Sample::Discovery(hash("v2")), start)
        else {
            panic!("pinned samples confirm nothing")
        };
        assert!(why.contains("sessionAffinity: ClientIP"), "{why}");
        assert!(why.contains("kube-svm.io/encoding-confirmed"), "{why}");
        assert!(why.starts_with("discovery samples cannot confirm"), "{why}");
        let aggregated = Err(Unsampleable::Aggregated {
            group_version: "example.com/v2".into(),
            service: "storage/api".into(),
        });
        let mut settle = Settle::new(&check("example.com", Duration::ZERO), aggregated, start);
        let verdict = settle.observe(Sample::DiscoveryNoEntry(hash("v2")), start);
        assert!(
            matches!(&verdict, Some(Encoding::Unconfirmed(why)) if why.contains("aggregated API")),
            "{verdict:?}"
        );
        // A read that failed is asked again, not taken for a refusal, until the wait is over.
        let unread = Err(Unsampleable::AffinityUnknown {
            count: counted(3),
            why: "connection refused".into(),
        });
        let patient = Check {
            policy: EncodingPolicy { settle: Duration::ZERO, wait: Duration::from_secs(10) },
            ..check("example.com", Duration::ZERO)
        };
        let mut settle = Settle::new(&patient, unread.clone(), start);
        assert!(settle.needs_survey());
        assert_eq!(settle.observe(Sample::Discovery(hash("v2")), start), None);
        settle.resurvey(Ok(counted(1)));
        assert!(!settle.needs_survey());
        assert_eq!(settle.observe(Sample::Discovery(hash("v2")), at(start, 1)), None);
        let verdict = settle.observe(Sample::Discovery(hash("v2")), at(start, 2));
        assert!(matches!(verdict, Some(Encoding::Confirmed { .. })), "{verdict:?}");
        let mut settle = Settle::new(&patient, unread, start);
        let verdict = settle.observe(Sample::Discovery(hash("v2")), at(start, 10));
        assert!(
            matches!(&verdict, Some(Encoding::Unconfirmed(why)) if why.contains("connection refused")),
            "{verdict:?}"
        );
        // The StorageVersion API asks no connection to reach anything: it still confirms.
        let pinned = Err(Unsampleable::ClientIpAffinity(counted(3)));
        let mut settle = Settle::new(&check("example.com", Duration::ZERO), pinned, start);
        let common = Sample::StorageVersionApi(Some("example.com/v2".into()));
        assert!(matches!(settle.observe(common, start), Some(Encoding::Confirmed { .. })));
    }

    #[test]
    fn a_built_in_resource_is_checked_against_the_hash_discovery_published() {
        let start = Instant::now();
        let published = storage_version_hash("admissionregistration.k8s.io", "v1", "Widget");
        let built_in = Check {
            group: "admissionregistration.k8s.io".into(),
            expected: Expected::Hash { hash: published.clone(), served: "v1beta1".into() },
            ..check("example.com", Duration::ZERO)
        };
        assert_eq!(built_in.discovery_version(), "admissionregistration.k8s.io/v1beta1");
        assert!(built_in.is_expected_version("admissionregistration.k8s.io/v1"));
        assert!(!built_in.is_expected_version("admissionregistration.k8s.io/v1beta1"));
        let mut settle = settle_of(&built_in, start);
        let old = storage_version_hash("admissionregistration.k8s.io", "v1beta1", "Widget");
        assert_eq!(settle.observe(Sample::Discovery(Ok(Some(old.clone()))), start), None);
        settle.observe(Sample::Discovery(Ok(Some(published.clone()))), start);
        let verdict = settle.observe(Sample::Discovery(Ok(Some(published))), at(start, 1));
        assert!(matches!(verdict, Some(Encoding::Confirmed { .. })), "{verdict:?}");
    }
}
