//! Whether the apiservers encode a resource in a given storage version yet.
//!
//! A migration only moves objects to the version the apiserver encodes in when it writes them.
//! Right after a CRD's storage switch, and while HA apiservers behind a load balancer catch up,
//! some may still encode the old one, so kube-svm confirms the encoding before its first write.
//! Where the StorageVersion API is served and has the resource, it says so directly. Otherwise
//! discovery's `storageVersionHash` must equal the hash of the version, sampled through fresh
//! connections (each may reach another apiserver) for a settle period without a single
//! disagreement. A hash that has not appeared yet is waited for, up to a limit; kube-svm never
//! confirms on a guess.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apiserverinternal::v1alpha1::StorageVersion;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::api::GroupResource;
use crate::storage_hash::storage_version_hash;

/// What was established about the apiservers' encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Confirmed; says by what.
    Confirmed { by: String },
    /// Not confirmed; the message says what was seen.
    Unconfirmed(String),
}

/// What to check, and for how long.
#[derive(Clone, Debug)]
pub struct Check {
    pub group: String,
    pub plural: String,
    pub kind: String,
    pub storage_version: String,
    /// The CRD's generation the check is for: a storage switch bumps it, and with it the check
    /// starts anew, even back to a version confirmed before.
    pub generation: i64,
    /// How long discovery must publish the expected hash without a disagreement.
    pub settle: Duration,
    /// How long to wait, in all, for the expected hash to appear and settle.
    pub wait: Duration,
}

/// How old a confirmation may be and still be taken without a fresh look: a settle period's
/// worth at least.
const FRESH_FOR: Duration = Duration::from_secs(5);

/// The encoding checks of one process, one per resource and storage version, started as soon as
/// a storage switch is seen (the CRD trigger sees them within a second) rather than when a
/// migration starts: a migration created after the settle period has passed starts at once.
/// Cheap to clone; clones share the checks.
#[derive(Clone, Default)]
pub struct Observer {
    checks: Arc<Mutex<HashMap<CheckKey, Observation>>>,
}

/// Group, plural, storage version, CRD generation.
type CheckKey = (String, String, String, i64);

#[derive(Clone)]
struct Observation {
    /// The verdict once there is one, and when it came.
    verdict: watch::Receiver<Option<(Encoding, Instant)>>,
}

impl Observer {
    /// Starts checking `check` in the background unless that is under way or confirmed.
    pub fn observe(&self, client: &Client, config: &kube::Config, check: &Check) {
        let _ = self.observation(client, config, check, false);
    }

    /// The verdict on `check`: the background check's, taken again quickly if it is more than a
    /// few seconds old (it must still hold), or a new check's.
    pub async fn confirm(&self, client: &Client, config: &kube::Config, check: &Check) -> Encoding {
        let verdict = self.observation(client, config, check, false).verdict;
        let Some((encoding, at)) = settled(verdict).await else {
            return Encoding::Unconfirmed("the encoding check stopped".to_owned());
        };
        let Encoding::Confirmed { by } = encoding else {
            // Given up before: look again, things may have settled since.
            return self.fresh(client, config, check).await;
        };
        if at.elapsed() < FRESH_FOR {
            return Encoding::Confirmed { by };
        }
        // Still so? A short look (two agreeing samples) before trusting it.
        let quick = Check { settle: Duration::ZERO, wait: Duration::ZERO, ..check.clone() };
        match confirm(client, config, &quick).await {
            Encoding::Confirmed { .. } => Encoding::Confirmed {
                by: format!("{by}, {:.0} s ago, and again now", at.elapsed().as_secs_f64()),
            },
            Encoding::Unconfirmed(_) => self.fresh(client, config, check).await,
        }
    }

    /// A new check, replacing the one kept, awaited.
    async fn fresh(&self, client: &Client, config: &kube::Config, check: &Check) -> Encoding {
        let verdict = self.observation(client, config, check, true).verdict;
        match settled(verdict).await {
            Some((encoding, _)) => encoding,
            None => Encoding::Unconfirmed("the encoding check stopped".to_owned()),
        }
    }

    fn observation(
        &self,
        client: &Client,
        config: &kube::Config,
        check: &Check,
        anew: bool,
    ) -> Observation {
        let key = (
            check.group.clone(),
            check.plural.clone(),
            check.storage_version.clone(),
            check.generation,
        );
        let mut checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        if !anew && let Some(existing) = checks.get(&key) {
            return existing.clone();
        }
        let (report, verdict) = watch::channel(None);
        let (client, config, check) = (client.clone(), config.clone(), check.clone());
        tokio::spawn(async move {
            let started = k8s_openapi::jiff::Timestamp::now();
            let encoding = match confirm(&client, &config, &check).await {
                Encoding::Confirmed { by } => {
                    Encoding::Confirmed { by: format!("{by} (checked from {started:.0})") }
                }
                unconfirmed => unconfirmed,
            };
            report.send_replace(Some((encoding, Instant::now())));
        });
        let observation = Observation { verdict };
        checks.insert(key, observation.clone());
        observation
    }
}

/// The verdict of an observation, once it has one.
async fn settled(
    mut verdict: watch::Receiver<Option<(Encoding, Instant)>>,
) -> Option<(Encoding, Instant)> {
    verdict.wait_for(Option::is_some).await.ok().and_then(|seen| seen.clone())
}

/// The StorageVersion API's group version (`internal.apiserver.k8s.io`).
const STORAGE_VERSION_API: &str = "internal.apiserver.k8s.io/v1alpha1";

/// Least time between two discovery samples.
const MIN_SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

/// Most time between two discovery samples: a settle period sees a few samples at least.
const MAX_SAMPLE_INTERVAL: Duration = Duration::from_secs(2);

/// Least discovery samples that must agree, whatever the settle period (at least two
/// connections).
pub const MIN_AGREEING_SAMPLES: u32 = 2;

impl Check {
    fn api_version(&self) -> String {
        match self.group.as_str() {
            "" => self.storage_version.clone(),
            group => format!("{group}/{}", self.storage_version),
        }
    }

    fn expected_hash(&self) -> String {
        storage_version_hash(&self.group, &self.storage_version, &self.kind)
    }

    fn sample_interval(&self) -> Duration {
        (self.settle / 4).clamp(MIN_SAMPLE_INTERVAL, MAX_SAMPLE_INTERVAL)
    }
}

/// Confirms that the apiservers encode `check.storage_version`, asking until they do or
/// `check.wait` has passed. `config` makes a fresh client (and so a fresh connection) for every
/// discovery sample.
pub async fn confirm(client: &Client, config: &kube::Config, check: &Check) -> Encoding {
    let mut settle = Settle::new(check, Instant::now());
    loop {
        let sample = match from_storage_version_api(client, check).await {
            StorageVersionApi::Answered(sample) => sample,
            StorageVersionApi::NotServed => Sample::Discovery(published_hash(config, check).await),
            // kube-apiserver 1.37 publishes StorageVersions for built-in resources only.
            StorageVersionApi::NoEntry => {
                Sample::DiscoveryNoEntry(published_hash(config, check).await)
            }
        };
        if let Some(verdict) = settle.observe(sample, Instant::now()) {
            return verdict;
        }
        tokio::time::sleep(check.sample_interval()).await;
    }
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
/// [`MIN_AGREEING_SAMPLES`] samples and no disagreement in between (one resets the period).
/// Gives up once `wait` has passed since the first sample. Pure: the caller samples and sleeps.
#[derive(Debug)]
pub struct Settle {
    expected_hash: String,
    expected_version: String,
    settle: Duration,
    deadline: Instant,
    /// Since when, and in how many samples, discovery has agreed.
    agreeing: Option<(Instant, u32)>,
    /// What was seen last, for the message when giving up.
    last_seen: String,
    check: Check,
}

impl Settle {
    pub fn new(check: &Check, now: Instant) -> Settle {
        Settle {
            expected_hash: check.expected_hash(),
            expected_version: check.api_version(),
            settle: check.settle,
            deadline: now + check.wait,
            agreeing: None,
            last_seen: "nothing yet".to_owned(),
            check: check.clone(),
        }
    }

    /// Takes one sample taken at `now`; returns the verdict once there is one.
    pub fn observe(&mut self, sample: Sample, now: Instant) -> Option<Encoding> {
        let (published, by) = match sample {
            Sample::StorageVersionApi(Some(common)) if common == self.expected_version => {
                return Some(Encoding::Confirmed { by: "the StorageVersion API".to_owned() });
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
        match published {
            Ok(Some(hash)) if hash == self.expected_hash => {
                let (since, samples) = self.agreeing.get_or_insert((now, 0));
                *samples += 1;
                let held = now.saturating_duration_since(*since);
                if held >= self.settle && *samples >= MIN_AGREEING_SAMPLES {
                    let by = format!(
                        "{by}: {samples} samples over {:.1} s published {}",
                        held.as_secs_f64(),
                        self.expected_hash
                    );
                    return Some(Encoding::Confirmed { by });
                }
                None
            }
            Ok(other) => {
                self.agreeing = None;
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

    fn unless_too_late(&self, now: Instant) -> Option<Encoding> {
        (now >= self.deadline).then(|| {
            Encoding::Unconfirmed(format!(
                "the apiservers were not seen encoding {} of {} ({}) for {:.0} s in a row within {:.0} s; last seen: {}. \
                 If the apiserver's hash formula changed, or discovery never settles, check etcd and vouch for the encoding with the annotation {}: \"true\" on a new migration",
                self.expected_version,
                GroupResource::name_of(&self.check.group, &self.check.plural),
                self.expected_hash,
                self.settle.as_secs_f64(),
                self.check.wait.as_secs_f64(),
                self.last_seen,
                crate::api::ENCODING_CONFIRMED_ANNOTATION,
            ))
        })
    }
}

/// The hash discovery publishes for the resource, read through a new connection.
async fn published_hash(config: &kube::Config, check: &Check) -> Result<Option<String>, String> {
    let client = Client::try_from(config.clone()).map_err(|e| crate::error_chain(&e))?;
    let api_version = check.api_version();
    let list = match check.group.as_str() {
        "" => client.list_core_api_resources(&check.storage_version).await,
        _ => client.list_api_group_resources(&api_version).await,
    };
    let list = list.map_err(|e| crate::error_chain(&e))?;
    Ok(list
        .resources
        .into_iter()
        .find(|r| r.name == check.plural)
        .and_then(|r| r.storage_version_hash))
}

/// What the StorageVersion API says about a resource.
enum StorageVersionApi {
    NotServed,
    NoEntry,
    Answered(Sample),
}

async fn from_storage_version_api(client: &Client, check: &Check) -> StorageVersionApi {
    if client.list_api_group_resources(STORAGE_VERSION_API).await.is_err() {
        return StorageVersionApi::NotServed;
    }
    let api: Api<StorageVersion> = Api::all(client.clone());
    let group = if check.group.is_empty() { "core" } else { &check.group };
    let name = format!("{group}.{}", check.plural);
    let found = match api.get_opt(&name).await {
        Ok(Some(found)) => found,
        Ok(None) => return StorageVersionApi::NoEntry,
        Err(error) => {
            return StorageVersionApi::Answered(Sample::StorageVersionApiError(
                crate::error_chain(&error),
            ));
        }
    };
    let status = found.status.unwrap_or_default();
    let all_equal = status
        .conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "AllEncodingVersionsEqual" && c.status == "True");
    let common = status.common_encoding_version.filter(|_| all_equal);
    StorageVersionApi::Answered(Sample::StorageVersionApi(common))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(group: &str, settle: Duration) -> Check {
        Check {
            group: group.into(),
            plural: "widgets".into(),
            kind: "Widget".into(),
            storage_version: "v2".into(),
            generation: 2,
            settle,
            wait: Duration::from_secs(60),
        }
    }

    #[test]
    fn names_and_hashes_follow_the_group() {
        assert_eq!(check("example.com", Duration::ZERO).api_version(), "example.com/v2");
        assert_eq!(check("", Duration::ZERO).api_version(), "v2");
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
        let mut settle = Settle::new(&check("example.com", Duration::from_secs(10)), start);
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
        assert!(by.starts_with("discovery: 3 samples over 10.0 s"), "{by}");
    }

    #[test]
    fn one_disagreement_starts_the_settle_period_over() {
        let start = Instant::now();
        let mut settle = Settle::new(&check("example.com", Duration::from_secs(10)), start);
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
        let mut settle = Settle::new(&check("example.com", Duration::from_secs(10)), start);
        assert_eq!(settle.observe(Sample::Discovery(hash("v1")), at(start, 30)), None);
        let Some(Encoding::Unconfirmed(why)) =
            settle.observe(Sample::Discovery(hash("v1")), at(start, 60))
        else {
            panic!("too late")
        };
        assert!(why.contains(&storage_version_hash("example.com", "v1", "Widget")), "{why}");
        assert!(why.contains("kube-svm.io/encoding-confirmed"), "{why}");
        // An error is no confirmation either.
        let impatient = Check { wait: Duration::ZERO, ..check("example.com", Duration::ZERO) };
        let mut settle = Settle::new(&impatient, start);
        let verdict = settle.observe(Sample::Discovery(Err("refused".into())), at(start, 0));
        assert!(matches!(verdict, Some(Encoding::Unconfirmed(why)) if why.contains("refused")));
    }

    #[test]
    fn the_storage_version_api_is_taken_at_its_word_but_waited_for() {
        let start = Instant::now();
        let mut settle = Settle::new(&check("example.com", Duration::from_secs(10)), start);
        let common = |v: &str| Sample::StorageVersionApi(Some(format!("example.com/{v}")));
        assert_eq!(settle.observe(common("v1"), at(start, 0)), None);
        assert_eq!(settle.observe(Sample::StorageVersionApi(None), at(start, 1)), None);
        let verdict = settle.observe(common("v2"), at(start, 2));
        assert_eq!(verdict, Some(Encoding::Confirmed { by: "the StorageVersion API".into() }));
    }

    #[test]
    fn samples_are_spaced_to_see_several_in_a_settle_period() {
        assert_eq!(check("g", Duration::ZERO).sample_interval(), MIN_SAMPLE_INTERVAL);
        assert_eq!(check("g", Duration::from_secs(4)).sample_interval(), Duration::from_secs(1));
        assert_eq!(check("g", Duration::from_secs(60)).sample_interval(), MAX_SAMPLE_INTERVAL);
    }
}
