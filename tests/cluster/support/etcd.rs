//! Raw reads of etcd with kube-svm's own read-only census client, to check what the apiserver
//! really stored; and compaction, the one write a test needs.

use std::time::{Duration, Instant};

use kube_svm::census::etcd::{self, Connection, EtcdReader};
use kube_svm::census::stored::{self, Stored};
use kube_svm::census::{self, Scope};
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
    reader: EtcdReader,
    http: reqwest::Client,
}

impl Etcd {
    pub fn new(url: &str) -> Etcd {
        let connection = Connection { endpoints: vec![url.to_owned()], ..Default::default() };
        let reader = EtcdReader::connect(&connection).expect("a plain http endpoint");
        Etcd { url: url.to_owned(), reader, http: super::http_client() }
    }

    pub fn url(&self) -> &str {
        &self.url
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
        let mut end = key.as_bytes().to_vec();
        end.push(0);
        let page = self.reader.range(key.as_bytes(), &end, 1, 0).await?;
        page.kvs.into_iter().next().map(key_value).transpose()
    }

    /// Every key under `prefix`, in key order, read at one revision.
    pub async fn list(&self, prefix: &str) -> anyhow::Result<Vec<KeyValue>> {
        let end = etcd::prefix_end(prefix.as_bytes());
        let (mut start, mut revision, mut kvs) = (prefix.as_bytes().to_vec(), 0, Vec::new());
        loop {
            let page = self.reader.range(&start, &end, census::PAGE_KEYS, revision).await?;
            revision = page.revision;
            if let Some(last) = page.kvs.last() {
                start = [last.key.as_slice(), b"\0"].concat();
            }
            for kv in page.kvs {
                kvs.push(key_value(kv)?);
            }
            if !page.more {
                return Ok(kvs);
            }
        }
    }

    /// kube-svm's census of the keys under `key_prefix`.
    pub async fn census(&self, key_prefix: &str) -> anyhow::Result<census::ResourceCensus> {
        let located = census::keys::locate("/registry", key_prefix);
        let mut report =
            census::take(&self.reader, "/registry", &Scope::Resources(vec![located]), |_, _, _| {})
                .await?;
        Ok(report.resources.remove(0))
    }

    /// etcd's current revision.
    pub async fn revision(&self) -> anyhow::Result<i64> {
        Ok(self.reader.count(b"/", b"\0").await?.revision)
    }

    /// Writes `value` at `key` directly, as no apiserver would.
    pub async fn put(&self, key: &str, value: &[u8]) -> anyhow::Result<()> {
        use base64::Engine;
        let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let response = self
            .http
            .post(format!("{}/v3/kv/put", self.url))
            .json(&json!({ "key": encode(key.as_bytes()), "value": encode(value) }))
            .send()
            .await?;
        anyhow::ensure!(response.status().is_success(), "put failed: {}", response.text().await?);
        Ok(())
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
}

fn key_value(kv: etcd::KeyValue) -> anyhow::Result<KeyValue> {
    Ok(KeyValue { key: String::from_utf8(kv.key)?, value: kv.value, mod_revision: kv.mod_revision })
}
