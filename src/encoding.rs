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

use std::time::Duration;

use k8s_openapi::api::apiserverinternal::v1alpha1::StorageVersion;
use kube::{Api, Client};
use tokio::time::Instant;

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
    /// How long discovery must publish the expected hash without a disagreement.
    pub settle: Duration,
    /// How long to wait, in all, for the expected hash to appear and settle.
    pub wait: Duration,
}

/// The StorageVersion API's group version (`internal.apiserver.k8s.io`).
const STORAGE_VERSION_API: &str = "internal.apiserver.k8s.io/v1alpha1";

/// Least time between two discovery samples.
const MIN_SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

/// Most time between two discovery samples: a settle period sees a few samples at least.
const MAX_SAMPLE_INTERVAL: Duration = Duration::from_secs(2);

/// Least samples that must agree, whatever the settle period (at least two connections).
const MIN_AGREEING_SAMPLES: u32 = 2;

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

/// Confirms that the apiservers encode `check.storage_version`. `config` makes a fresh client
/// (and so a fresh connection) for every discovery sample.
pub async fn confirm(client: &Client, config: &kube::Config, check: &Check) -> Encoding {
    let by = match from_storage_version_api(client, check).await {
        StorageVersionApi::Answered(encoding) => return encoding,
        StorageVersionApi::NotServed => "discovery",
        // kube-apiserver 1.37 publishes StorageVersions for built-in resources only.
        StorageVersionApi::NoEntry => {
            "discovery (the StorageVersion API has no entry for this resource)"
        }
    };
    from_discovery(config, check, by).await
}

/// Samples discovery until the expected hash has been published, by every connection asked,
/// for the settle period; gives up after `check.wait`.
async fn from_discovery(config: &kube::Config, check: &Check, by: &str) -> Encoding {
    let expected = check.expected_hash();
    let api_version = check.api_version();
    let started = Instant::now();
    let mut agreeing: Option<(Instant, u32)> = None;
    let mut last_seen = String::from("nothing yet");
    loop {
        match published_hash(config, check).await {
            Ok(Some(published)) if published == expected => {
                let (since, samples) = agreeing.get_or_insert((Instant::now(), 0));
                *samples += 1;
                if since.elapsed() >= check.settle && *samples >= MIN_AGREEING_SAMPLES {
                    return Encoding::Confirmed {
                        by: format!(
                            "{by}: {samples} samples over {:.1} s published {expected}",
                            since.elapsed().as_secs_f64()
                        ),
                    };
                }
            }
            Ok(published) => {
                agreeing = None;
                last_seen = format!("hash {}", published.as_deref().unwrap_or("none"));
            }
            Err(error) => {
                agreeing = None;
                last_seen = format!("an error: {error}");
            }
        }
        if started.elapsed() >= check.wait {
            return Encoding::Unconfirmed(format!(
                "discovery did not publish storage version hash {expected} ({api_version}) for {} {:.0} s in a row within {:.0} s; last seen: {last_seen}. \
                 If the apiserver's hash formula changed, or discovery never settles, check etcd and vouch for the encoding with the annotation {}: \"true\" on a new migration",
                display(check),
                check.settle.as_secs_f64(),
                check.wait.as_secs_f64(),
                crate::api::ENCODING_CONFIRMED_ANNOTATION,
            ));
        }
        tokio::time::sleep(check.sample_interval()).await;
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

fn display(check: &Check) -> String {
    match check.group.as_str() {
        "" => check.plural.clone(),
        group => format!("{}.{group}", check.plural),
    }
}

/// What the StorageVersion API says about a resource.
enum StorageVersionApi {
    NotServed,
    NoEntry,
    Answered(Encoding),
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
            return StorageVersionApi::Answered(Encoding::Unconfirmed(format!(
                "the StorageVersion API could not be read: {}",
                crate::error_chain(&error)
            )));
        }
    };
    let expected = check.api_version();
    let status = found.status.unwrap_or_default();
    let common = status.common_encoding_version.clone();
    let all_equal = status
        .conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "AllEncodingVersionsEqual" && c.status == "True");
    StorageVersionApi::Answered(if all_equal && common.as_deref() == Some(expected.as_str()) {
        Encoding::Confirmed { by: "the StorageVersion API".to_owned() }
    } else {
        Encoding::Unconfirmed(format!(
            "the StorageVersion API reports common encoding version {} (all equal: {all_equal}), not {expected}",
            common.as_deref().unwrap_or("none")
        ))
    })
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

    #[test]
    fn samples_are_spaced_to_see_several_in_a_settle_period() {
        assert_eq!(check("g", Duration::ZERO).sample_interval(), MIN_SAMPLE_INTERVAL);
        assert_eq!(check("g", Duration::from_secs(4)).sample_interval(), Duration::from_secs(1));
        assert_eq!(check("g", Duration::from_secs(60)).sample_interval(), MAX_SAMPLE_INTERVAL);
    }
}
