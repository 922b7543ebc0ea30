//! Whether a CRD's conversion webhook answers, found out before a migration's first write.
//!
//! Every write of an object stored in another version than the one it is written through goes
//! through the CRD's conversion webhook. A webhook that is down fails every such write, one
//! object at a time, after every attempt. One list of one full object through a version that
//! needs converting finds that out at once: the objects' stored version is not known, so one
//! list at the storage version (converts objects stored in an older version) and one at another
//! served version (converts objects stored in the storage version) between them convert the
//! first object whatever version it is stored in.
//!
//! Only the apiserver's own words tell a failed conversion from another server error: it answers
//! 500 (`StorageReadError` for a list, `InternalError` for a single object) with a message that
//! names the conversion webhook, the same code and reasons as an undecryptable object or an
//! overloaded apiserver. [`webhook_failure`] reads that message; everything else is left to the
//! engine's own handling of outages and throttling.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, WebhookClientConfig,
};
use kube::api::ListParams;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::apiserver::answers;

/// The words kube-apiserver (apiextensions-apiserver's webhook converter) puts before the
/// webhook's own error when a conversion fails: `conversion webhook for <group/version, Kind>
/// failed: <error>`.
const WEBHOOK_FAILED: &str = "conversion webhook for ";

/// How long every read of one version must fail before the webhook counts as unavailable: a
/// single-replica webhook restarting, or its pod rescheduled, fails reads for a few seconds;
/// one failing for this long is not restarting (and the migration still ends within seconds,
/// not after the engine's attempts at every object).
const FAILING_FOR: Duration = Duration::from_secs(10);

/// Between two reads of one version.
const READ_INTERVAL: Duration = Duration::from_secs(1);

/// The webhook's error, when an answer of `code` with `message` says the apiserver's call to a
/// conversion webhook failed: a 5xx whose message names it. `None` for any other answer. Pure.
pub fn webhook_failure(code: u16, message: &str) -> Option<String> {
    if !(500..600).contains(&code) {
        return None;
    }
    let at = message.find(WEBHOOK_FAILED)?;
    let error = &message[at..];
    // A list names the first object that failed and counts the others: "(and 2 more)".
    let error = match error.rfind(" (and ") {
        Some(end) if error.ends_with(" more)") => &error[..end],
        _ => error,
    };
    Some(error.to_owned())
}

/// Where the CRD's conversion webhook is, in words, when its conversion strategy is `Webhook`;
/// `None` otherwise. Pure.
pub fn webhook_of(crd: &CustomResourceDefinition) -> Option<String> {
    let conversion = crd.spec.conversion.as_ref()?;
    if conversion.strategy != "Webhook" {
        return None;
    }
    let config = conversion.webhook.as_ref().and_then(|w| w.client_config.as_ref());
    Some(config.map_or_else(|| "no clientConfig".to_owned(), describe))
}

/// A webhook `clientConfig` in words: `service <namespace>/<name> port <port> path <path>` (the
/// port the apiserver defaults to, 443, when none is given), or `URL <url>`. Pure.
pub fn describe(config: &WebhookClientConfig) -> String {
    match (&config.service, &config.url) {
        (Some(service), _) => {
            let mut words = format!(
                "service {}/{} port {}",
                service.namespace,
                service.name,
                service.port.unwrap_or(443)
            );
            if let Some(path) = service.path.as_deref().filter(|p| !p.is_empty()) {
                words.push_str(&format!(" path {path}"));
            }
            words
        }
        (None, Some(url)) => format!("URL {url}"),
        (None, None) => "no service or URL".to_owned(),
    }
}

/// The served versions to read through so that the first object is converted whatever version
/// it is stored in: the storage version, then `writes_through` (the version the migration writes
/// through) when it is another served version, else a served version the CRD's
/// `storedVersions` names, else any other served version. Pure.
pub fn versions_to_read(
    crd: &CustomResourceDefinition,
    writes_through: Option<&str>,
) -> Vec<String> {
    let served: Vec<&str> =
        crd.spec.versions.iter().filter(|v| v.served).map(|v| v.name.as_str()).collect();
    let storage = crd.spec.versions.iter().find(|v| v.storage).map(|v| v.name.as_str());
    let mut versions: Vec<String> = storage.iter().map(|s| (*s).to_owned()).collect();
    let stored = crd.status.as_ref().and_then(|s| s.stored_versions.clone()).unwrap_or_default();
    let other = writes_through
        .into_iter()
        .chain(stored.iter().map(String::as_str))
        .chain(served.iter().copied())
        .find(|v| Some(*v) != storage && served.contains(v));
    versions.extend(other.map(str::to_owned));
    versions
}

/// The CRD's conversion webhook failed every read through a version that needs it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the conversion webhook of {crd} ({webhook}) failed every read of {plural} through {version} for {seconds} s ({reads} reads), the last: {error}; every write of an object stored in another version would fail the same way: make the webhook answer, then migrate again"
)]
pub struct Unavailable {
    /// The CRD's name.
    pub crd: String,
    /// Where the webhook is ([`describe`]).
    pub webhook: String,
    /// The resource's plural name.
    pub plural: String,
    /// The version the reads went through.
    pub version: String,
    /// Reads that failed.
    pub reads: u32,
    /// For how long every read failed, in seconds.
    pub seconds: u64,
    /// The webhook's error, as the apiserver reported it.
    pub error: String,
}

/// Reads one full object of `crd`'s resource through each of [`versions_to_read`], each read
/// bounded by `timeout`, when the CRD converts with a webhook. `Err` when the apiserver says the
/// webhook failed, read after read, through one of them; `Ok` when every read went through, and
/// also when a read failed otherwise (no answer, throttling, another error): that is no proof
/// against the webhook, and the engine deals with it.
pub async fn preflight(
    client: &Client,
    crd: &CustomResourceDefinition,
    writes_through: Option<&str>,
    timeout: Duration,
) -> Result<(), Unavailable> {
    let Some(webhook) = webhook_of(crd) else { return Ok(()) };
    let crd_name = crd.metadata.name.clone().unwrap_or_default();
    let (group, kind, plural) = (&crd.spec.group, &crd.spec.names.kind, &crd.spec.names.plural);
    for version in versions_to_read(crd, writes_through) {
        let gvk = GroupVersionKind::gvk(group, &version, kind);
        let api: Api<DynamicObject> =
            Api::all_with(client.clone(), &ApiResource::from_gvk_with_plural(&gvk, plural));
        let (started, one) = (Instant::now(), ListParams::default().limit(1));
        let mut reads = 0;
        let mut failing_since: Option<Instant> = None;
        let error = loop {
            reads += 1;
            let read = tokio::time::timeout(timeout, api.list(&one));
            let failed = match read.await {
                Ok(Ok(_)) => None,
                Ok(Err(kube::Error::Api(status))) => webhook_failure(status.code, &status.message),
                Ok(Err(error)) => {
                    debug!(%crd_name, %version, code = ?answers::code(&error), "preflight read inconclusive");
                    None
                }
                Err(_) => None,
            };
            let since = *failing_since.get_or_insert_with(Instant::now);
            match failed {
                None => break None,
                Some(error) if since.elapsed() >= FAILING_FOR => break Some(error),
                Some(error) => {
                    debug!(%crd_name, %version, %error, "the conversion webhook failed a read; reading again");
                    tokio::time::sleep(READ_INTERVAL).await;
                }
            }
        };
        if let Some(error) = error {
            info!(%crd_name, %version, elapsed = ?started.elapsed(), "the conversion webhook is unavailable");
            return Err(Unavailable {
                crd: crd_name,
                webhook,
                plural: plural.clone(),
                version,
                reads,
                seconds: failing_since.map_or(0, |since| since.elapsed().as_secs()),
                error,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What kube-apiserver 1.37 answered a list of widgets at v2 whose first object is stored
    /// at v1, with the webhook's port closed.
    const REFUSED: &str = r#"failed to read one or more widgets.example.com from the storage: StorageError: corrupt object, Code: 7, Key: /registry/example.com/widgets/w-0, ResourceVersion: 0, AdditionalErrorMsg: object not decodable revision=225: conversion webhook for example.com/v1, Kind=Widget failed: Post "https://127.0.0.1:35359/convert?timeout=30s": dial tcp 127.0.0.1:35359: connect: connection refused (and 2 more)"#;

    #[test]
    fn a_failed_conversion_is_told_from_other_server_errors() {
        assert_eq!(
            webhook_failure(500, REFUSED).as_deref(),
            Some(
                r#"conversion webhook for example.com/v1, Kind=Widget failed: Post "https://127.0.0.1:35359/convert?timeout=30s": dial tcp 127.0.0.1:35359: connect: connection refused"#
            )
        );
        // An object the apiserver cannot decrypt: the same code and reason, no webhook.
        let undecryptable = "failed to read one or more secrets from the storage: StorageError: corrupt object, Code: 7, Key: /registry/secrets/default/s, AdditionalErrorMsg: no matching key was found for the provided AES transformer";
        assert_eq!(webhook_failure(500, undecryptable), None);
        assert_eq!(
            webhook_failure(503, "the server is currently unable to handle the request"),
            None
        );
        assert_eq!(webhook_failure(429, "too many requests"), None);
        // The words alone, in an answer that is not a server error, are not the apiserver's.
        assert_eq!(webhook_failure(422, REFUSED), None);
        let single = "conversion webhook for example.com/v1, Kind=Widget failed: the server could not find the requested resource";
        assert_eq!(webhook_failure(500, single).as_deref(), Some(single));
    }

    fn crd(conversion: serde_json::Value, stored: &[&str]) -> CustomResourceDefinition {
        let versions: Vec<_> = [("v1", true), ("v2", true), ("v3", true), ("v0", false)]
            .iter()
            .map(|(v, served)| serde_json::json!({ "name": v, "served": served, "storage": *v == "v2" }))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "widgets.example.com" },
            "spec": {
                "group": "example.com", "scope": "Cluster",
                "names": { "kind": "Widget", "plural": "widgets" },
                "versions": versions,
                "conversion": conversion,
            },
            "status": { "storedVersions": stored },
        }))
        .expect("a CRD")
    }

    #[test]
    fn the_webhook_is_described_by_its_client_config() {
        let service = serde_json::json!({ "strategy": "Webhook", "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": { "service": { "namespace": "shop", "name": "widgets-webhook", "path": "/convert" } },
        }});
        assert_eq!(
            webhook_of(&crd(service, &[])).as_deref(),
            Some("service shop/widgets-webhook port 443 path /convert")
        );
        let url = serde_json::json!({ "strategy": "Webhook", "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": { "url": "https://10.0.0.9:9443/convert" },
        }});
        assert_eq!(
            webhook_of(&crd(url, &[])).as_deref(),
            Some("URL https://10.0.0.9:9443/convert")
        );
        let service_port = serde_json::json!({ "strategy": "Webhook", "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": { "service": { "namespace": "a", "name": "b", "port": 8443 } },
        }});
        assert_eq!(webhook_of(&crd(service_port, &[])).as_deref(), Some("service a/b port 8443"));
        assert_eq!(webhook_of(&crd(serde_json::json!({ "strategy": "None" }), &[])), None);
    }

    #[test]
    fn the_storage_version_and_one_other_served_version_are_read() {
        let none = serde_json::json!({ "strategy": "None" });
        // The version the migration writes through comes first, when served and not storage.
        assert_eq!(versions_to_read(&crd(none.clone(), &["v1", "v2"]), Some("v3")), ["v2", "v3"]);
        // Else an older stored version, when still served.
        assert_eq!(versions_to_read(&crd(none.clone(), &["v2", "v3"]), Some("v2")), ["v2", "v3"]);
        // An unserved stored version cannot be read: another served version is.
        assert_eq!(versions_to_read(&crd(none.clone(), &["v0", "v2"]), None), ["v2", "v1"]);
    }
}
