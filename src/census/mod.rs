//! The census: how each resource's objects are really stored in etcd, counted key by key from
//! the raw values (stored `apiVersion`, encryption provider and key name), never decrypting or
//! keeping a value. [`etcd`] reads (and can only read), [`keys`] maps resources to key prefixes,
//! [`stored`] classifies one value, and [`take`] puts them together at one etcd revision.

pub mod etcd;
pub mod keys;
pub mod stored;

use std::collections::BTreeMap;

use serde::Serialize;

pub use etcd::{Connection, EtcdReader};
pub use keys::Located;
use stored::Stored;

/// Keys per range read. Values are usually a few KiB; etcd caps each at 1.5 MiB, so a page
/// holds at most 150 MiB however large the objects, and a census never holds more than a page.
pub const PAGE_KEYS: u64 = 100;

/// How many times a census starts over when etcd compacts the revision it is reading at.
const COMPACTED_RETRIES: u32 = 3;

/// Why a census could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing at all is stored under the etcd prefix, most likely the wrong one.
    #[error(
        "etcd holds no key under {prefix}: is --etcd-prefix right? (kube-apiserver's default is /registry)"
    )]
    EmptyPrefix {
        /// The etcd prefix, such as `/registry`.
        prefix: String,
    },
    /// A range read failed.
    #[error("failed to read {prefix} from etcd")]
    Read {
        /// The key prefix being read.
        prefix: String,
        /// The read's failure.
        #[source]
        source: etcd::Error,
    },
}

/// Results of taking a census.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to count.
#[derive(Clone, Debug)]
pub enum Scope {
    /// These resources, each under its own key prefix.
    Resources(Vec<Located>),
    /// Every key under the etcd prefix, grouped by the resource its key names.
    Everything,
}

/// The census of one resource.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceCensus {
    /// Empty for the core group; absent when the keys alone do not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Empty when a key prefix was given instead of a resource.
    pub resource: String,
    /// The etcd key prefix counted, ending with `/`.
    pub key_prefix: String,
    /// Keys under the prefix.
    pub objects: u64,
    /// Keys by the `apiVersion` they are encoded in (unencrypted values only).
    pub api_versions: BTreeMap<String, u64>,
    /// Encrypted keys by provider and key name.
    pub encryption: Vec<EncryptionKey>,
    /// Keys written without encryption (the `identity` provider).
    pub unencrypted: u64,
    /// Keys whose value kube-svm cannot read (CBOR, an unknown envelope).
    pub unrecognized: u64,
    /// The oldest write among the keys: everything written since has been re-encoded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_mod_revision: Option<i64>,
}

/// How many of a resource's keys one encryption key encrypts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct EncryptionKey {
    /// The encryption provider, such as `aescbc` or `kms`.
    pub provider: String,
    /// The key's name in the apiserver's EncryptionConfiguration.
    pub key: String,
    /// Keys encrypted with it.
    pub objects: u64,
}

/// A census of several resources, all read at one etcd revision.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The etcd revision every resource was read at.
    pub etcd_revision: i64,
    /// The prefix kube-apiserver stores under (`--etcd-prefix`, `/registry` by default).
    pub etcd_prefix: String,
    /// One census per resource.
    pub resources: Vec<ResourceCensus>,
}

impl ResourceCensus {
    fn new(located: &Located) -> ResourceCensus {
        ResourceCensus {
            group: located.group.clone(),
            resource: located.resource.clone(),
            key_prefix: located.key_prefix.clone(),
            ..ResourceCensus::default()
        }
    }

    /// `resource.group` as kubectl writes it, or the key prefix.
    pub fn name(&self) -> String {
        Located {
            group: self.group.clone(),
            resource: self.resource.clone(),
            key_prefix: self.key_prefix.clone(),
        }
        .name()
    }

    /// Counts one key stored as `stored`.
    pub fn add(&mut self, stored: &Stored, mod_revision: i64) {
        self.objects += 1;
        self.oldest_mod_revision =
            Some(self.oldest_mod_revision.map_or(mod_revision, |o| o.min(mod_revision)));
        if let Some(api_version) = stored.api_version() {
            *self.api_versions.entry(api_version.to_owned()).or_insert(0) += 1;
            if self.group.is_none() && !self.resource.is_empty() {
                self.group = Some(group_of(api_version).to_owned());
            }
        }
        match stored {
            Stored::Encrypted { provider, key_name } => {
                match self
                    .encryption
                    .iter_mut()
                    .find(|k| k.provider == *provider && k.key == *key_name)
                {
                    Some(key) => key.objects += 1,
                    None => {
                        self.encryption.push(EncryptionKey {
                            provider: provider.clone(),
                            key: key_name.clone(),
                            objects: 1,
                        });
                        self.encryption.sort();
                    }
                }
            }
            Stored::Json { .. } | Stored::Protobuf { .. } => self.unencrypted += 1,
            Stored::Unrecognized => self.unrecognized += 1,
        }
    }
}

/// The group of an `apiVersion` (`apps/v1` → `apps`, `v1` → the core group).
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// Whether a key stored as `stored` matches what `--list` asked for: an `apiVersion`, an
/// encryption key as `provider:key` or its name alone, `unencrypted` or `unrecognized`.
pub fn matches(selector: &str, stored: &Stored) -> bool {
    match stored {
        Stored::Json { api_version, .. } | Stored::Protobuf { api_version, .. } => {
            selector == api_version || selector == "unencrypted"
        }
        Stored::Encrypted { provider, key_name } => {
            selector == key_name || selector.split_once(':') == Some((provider, key_name))
        }
        Stored::Unrecognized => selector == "unrecognized",
    }
}

/// Counts `scope` under `etcd_prefix` at one revision, calling `visit` with each key and how it
/// is stored (values are dropped page by page). Starts over at a new revision when etcd
/// compacts the one being read, at most [`COMPACTED_RETRIES`] times; `visit` is told which
/// attempt a key belongs to (only the last attempt's keys make the census).
pub async fn take(
    reader: &EtcdReader,
    etcd_prefix: &str,
    scope: &Scope,
    mut visit: impl FnMut(u32, &[u8], &Stored),
) -> Result<Report> {
    let etcd_prefix = etcd_prefix.trim_end_matches('/');
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut visit_attempt = |key: &[u8], stored: &Stored| visit(attempt, key, stored);
        match take_once(reader, etcd_prefix, scope, &mut visit_attempt).await {
            Err(Error::Read { source: etcd::Error::Compacted { .. }, .. })
                if attempt < COMPACTED_RETRIES =>
            {
                tracing::info!(attempt, "etcd compacted the revision being read; starting over");
            }
            other => return other,
        }
    }
}

async fn take_once(
    reader: &EtcdReader,
    etcd_prefix: &str,
    scope: &Scope,
    visit: &mut impl FnMut(&[u8], &Stored),
) -> Result<Report> {
    let root = format!("{etcd_prefix}/");
    let read = |prefix: &str| {
        let prefix = prefix.to_owned();
        move |source| Error::Read { prefix, source }
    };
    let whole = reader
        .count(root.as_bytes(), &etcd::prefix_end(root.as_bytes()))
        .await
        .map_err(read(&root))?;
    if whole.count == 0 {
        return Err(Error::EmptyPrefix { prefix: root });
    }
    let revision = whole.revision;
    let resources = match scope {
        Scope::Resources(located) => {
            let mut resources = Vec::with_capacity(located.len());
            for located in located {
                let mut census = ResourceCensus::new(located);
                scan(reader, &located.key_prefix, revision, |key, stored, mod_revision| {
                    census.add(stored, mod_revision);
                    visit(key, stored);
                })
                .await
                .map_err(read(&located.key_prefix))?;
                resources.push(census);
            }
            resources
        }
        Scope::Everything => {
            let mut by_prefix: BTreeMap<String, ResourceCensus> = BTreeMap::new();
            scan(reader, &root, revision, |key, stored, mod_revision| {
                let Some(located) = keys::resource_of(etcd_prefix, key) else { return };
                by_prefix
                    .entry(located.key_prefix.clone())
                    .or_insert_with(|| ResourceCensus::new(&located))
                    .add(stored, mod_revision);
                visit(key, stored);
            })
            .await
            .map_err(read(&root))?;
            by_prefix.into_values().collect()
        }
    };
    Ok(Report { etcd_revision: revision, etcd_prefix: etcd_prefix.to_owned(), resources })
}

/// Reads every key under `prefix` at `revision`, a page at a time.
async fn scan(
    reader: &EtcdReader,
    prefix: &str,
    revision: i64,
    mut each: impl FnMut(&[u8], &Stored, i64),
) -> Result<(), etcd::Error> {
    let end = etcd::prefix_end(prefix.as_bytes());
    let mut start = prefix.as_bytes().to_vec();
    loop {
        let page = reader.range(&start, &end, PAGE_KEYS, revision).await?;
        for kv in &page.kvs {
            each(&kv.key, &stored::classify(&kv.value), kv.mod_revision);
        }
        match (page.more, page.kvs.last()) {
            (true, Some(last)) => {
                // The next page starts just after the last key read.
                start = last.key.clone();
                start.push(0);
            }
            _ => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(api_version: &str) -> Stored {
        Stored::Json { api_version: api_version.into(), kind: "Widget".into() }
    }

    fn encrypted(key: &str) -> Stored {
        Stored::Encrypted { provider: "aescbc".into(), key_name: key.into() }
    }

    #[test]
    fn counts_versions_keys_and_the_oldest_write() {
        let mut census = ResourceCensus::new(&keys::locate("/registry", "widgets.example.com"));
        census.add(&json("example.com/v1"), 30);
        census.add(&json("example.com/v2"), 12);
        census.add(&json("example.com/v1"), 40);
        census.add(&Stored::Unrecognized, 50);
        assert_eq!(census.objects, 4);
        assert_eq!(
            census.api_versions,
            [("example.com/v1".into(), 2), ("example.com/v2".into(), 1)].into()
        );
        assert_eq!((census.unencrypted, census.unrecognized), (3, 1));
        assert_eq!(census.oldest_mod_revision, Some(12));
        assert!(census.encryption.is_empty());
    }

    #[test]
    fn counts_encryption_keys_in_order() {
        let mut census = ResourceCensus::new(&keys::locate("/registry", "secrets"));
        for key in ["key2", "key1", "key2"] {
            census.add(&encrypted(key), 5);
        }
        let counts: Vec<_> =
            census.encryption.iter().map(|k| (k.key.as_str(), k.objects)).collect();
        assert_eq!(counts, [("key1", 1), ("key2", 2)]);
        assert!(census.api_versions.is_empty());
        assert_eq!(census.unencrypted, 0);
    }

    #[test]
    fn learns_a_built_in_group_from_the_values() {
        let located = keys::resource_of("/registry", b"/registry/deployments/default/web").unwrap();
        let mut census = ResourceCensus::new(&located);
        census.add(&encrypted("key1"), 3);
        assert_eq!(census.name(), "deployments");
        census
            .add(&Stored::Protobuf { api_version: "apps/v1".into(), kind: "Deployment".into() }, 4);
        assert_eq!(census.name(), "deployments.apps");
        let mut core =
            ResourceCensus::new(&keys::resource_of("/registry", b"/registry/pods/a/b").unwrap());
        core.add(&Stored::Protobuf { api_version: "v1".into(), kind: "Pod".into() }, 4);
        assert_eq!(core.name(), "pods");
    }

    #[test]
    fn list_selectors() {
        assert!(matches("example.com/v1", &json("example.com/v1")));
        assert!(!matches("example.com/v2", &json("example.com/v1")));
        assert!(matches("unencrypted", &json("example.com/v1")));
        assert!(matches("key1", &encrypted("key1")));
        assert!(matches("aescbc:key1", &encrypted("key1")));
        assert!(!matches("aesgcm:key1", &encrypted("key1")));
        assert!(!matches("unencrypted", &encrypted("key1")));
        assert!(matches("unrecognized", &Stored::Unrecognized));
    }
}
