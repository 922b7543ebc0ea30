//! Raw reads of etcd through its v3 JSON gateway, to check what the apiserver really stored.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kube_svm::census::stored::{self, Stored};
use serde::Deserialize;
use serde_json::json;

/// One key as etcd holds it.
#[derive(Clone, Debug)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// The revision of the last write to this key; the object's `metadata.resourceVersion`.
    pub mod_revision: i64,
}

impl KeyValue {
    /// How the value is encoded (JSON, protobuf, encrypted).
    pub fn stored(&self) -> Stored {
        stored::classify(&self.value)
    }

    /// The stored `apiVersion`; panics when the value is encrypted or unreadable.
    pub fn api_version(&self) -> String {
        match self.stored().api_version() {
            Some(version) => version.to_owned(),
            None => panic!("{} holds no readable apiVersion: {:?}", self.key, self.stored()),
        }
    }
}

pub struct Etcd {
    url: String,
    http: reqwest::Client,
}

// The gateway encodes bytes as base64 and 64-bit integers as strings.
#[derive(Deserialize)]
struct RangeResponse {
    header: Header,
    #[serde(default)]
    kvs: Vec<RawKeyValue>,
}

#[derive(Deserialize)]
struct Header {
    revision: String,
}

#[derive(Deserialize)]
struct RawKeyValue {
    key: String,
    #[serde(default)]
    value: String,
    mod_revision: String,
}

impl Etcd {
    pub fn new(url: &str) -> Etcd {
        Etcd { url: url.to_owned(), http: reqwest::Client::new() }
    }

    pub async fn wait_healthy(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let health = self.http.get(format!("{}/health", self.url)).send().await;
            if health.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "etcd at {} never became healthy", self.url);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One key, or `None` when it does not exist.
    pub async fn get(&self, key: &str) -> anyhow::Result<Option<KeyValue>> {
        let (_, mut kvs) = self.range(json!({ "key": STANDARD.encode(key) })).await?;
        Ok(kvs.pop())
    }

    /// Every key under `prefix`, in key order.
    pub async fn list(&self, prefix: &str) -> anyhow::Result<Vec<KeyValue>> {
        let end = prefix_end(prefix.as_bytes());
        let (_, kvs) = self
            .range(json!({ "key": STANDARD.encode(prefix), "range_end": STANDARD.encode(end) }))
            .await?;
        Ok(kvs)
    }

    /// etcd's current revision.
    pub async fn revision(&self) -> anyhow::Result<i64> {
        let (revision, _) =
            self.range(json!({ "key": STANDARD.encode("/"), "count_only": true })).await?;
        Ok(revision)
    }

    /// Compacts history up to `revision`: continue tokens older than it expire (HTTP 410).
    pub async fn compact(&self, revision: i64) -> anyhow::Result<()> {
        let response = self
            .http
            .post(format!("{}/v3/kv/compaction", self.url))
            .json(&json!({ "revision": revision.to_string(), "physical": true }))
            .send()
            .await?;
        anyhow::ensure!(
            response.status().is_success(),
            "compaction failed: {}",
            response.text().await?
        );
        Ok(())
    }

    async fn range(&self, request: serde_json::Value) -> anyhow::Result<(i64, Vec<KeyValue>)> {
        let response =
            self.http.post(format!("{}/v3/kv/range", self.url)).json(&request).send().await?;
        anyhow::ensure!(response.status().is_success(), "range failed: {}", response.text().await?);
        let RangeResponse { header, kvs } = response.json().await?;
        let kvs = kvs
            .into_iter()
            .map(|raw| {
                Ok(KeyValue {
                    key: String::from_utf8(STANDARD.decode(raw.key)?)?,
                    value: STANDARD.decode(raw.value)?,
                    mod_revision: raw.mod_revision.parse()?,
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok((header.revision.parse()?, kvs))
    }
}

/// The smallest key greater than every key starting with `prefix` (etcd's `range_end`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}
