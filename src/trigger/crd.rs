//! The CRD trigger: when a CustomResourceDefinition's `status.storedVersions` holds anything but
//! its storage version, create a migration for it, unless one is pending or running for that
//! resource or the CRD opts out. Watch-driven: a storage version switch is seen within seconds.
//!
//! Migrations are named `<plural>.<group>-<storage version>-<generation>` (shortened, with a
//! hash of the full name, when that is longer than a name may be): the same CRD state never gets
//! a second migration, so a migration that failed is not retried in a loop; a changed CRD (new
//! generation) gets a new one once the previous has finished.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use sha2::{Digest, Sha256};

pub use super::TRIGGER_LABEL;
use super::{Clients, Requests, is_conflict};
use crate::api::{
    CLEAN_MANAGED_FIELDS_ANNOTATION, GroupVersionResource, Phase, StorageVersionMigration,
    StorageVersionMigrationSpec,
};
use crate::encoding::{Check, EncodingPolicy, Expected, Observer};
use crate::fence::Fence;
use crate::fence::RequestError;
use crate::storedversions::CrdState;

/// Annotation on a CRD: `"false"` keeps kube-svm from migrating it on its own.
pub const OPT_OUT_ANNOTATION: &str = "kube-svm.io/auto-migrate";

/// The longest name an object may have (a DNS subdomain).
const MAX_NAME: usize = 253;

/// Hex digits of the full name's sha256 kept in a shortened name: enough that two CRDs never
/// meet.
const NAME_HASH_DIGITS: usize = 10;

/// Why the CRD trigger could not act on a CRD this time; the CRD is looked at again in five
/// seconds.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Listing the migrations, to see whether one is pending or running already, failed.
    #[error("failed to list StorageVersionMigrations")]
    List(#[source] RequestError),
    /// Creating the named migration failed (one that exists already is not an error).
    #[error("failed to create StorageVersionMigration {0}")]
    Create(String, #[source] RequestError),
}

/// `<plural>.<group>-<storage version>-<generation>`, or, when that is too long for a name, its
/// beginning, a hash of the whole, and the same ending.
pub fn migration_name(plural: &str, group: &str, storage: &str, generation: i64) -> String {
    let prefix = format!("{plural}.{group}");
    let suffix = format!("-{storage}-{generation}");
    let full = format!("{prefix}{suffix}");
    if full.len() <= MAX_NAME {
        return full;
    }
    let digest = Sha256::digest(full.as_bytes());
    let hash: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let hash = &hash[..NAME_HASH_DIGITS];
    let room = MAX_NAME - suffix.len() - hash.len() - 1;
    // The prefix is ASCII (a CRD's name); a name may not end in '.' or '-' before the hash.
    let kept = prefix[..room.min(prefix.len())].trim_end_matches(['.', '-']);
    format!("{kept}-{hash}{suffix}")
}

/// A migration a CRD needs.
#[derive(Debug, PartialEq, Eq)]
pub struct Needed {
    /// The migration's name, after the CRD's state.
    pub name: String,
    /// What it migrates.
    pub target: GroupVersionResource,
    /// Whether it removes `managedFields` entries naming versions no longer served.
    pub clean_managed_fields: bool,
}

/// The migration a CRD needs, if any: when its `storedVersions` is stale, or, with
/// `clean_unserved`, when it defines a version it does not serve (whose `managedFields` entries
/// would break server-side apply once the version is removed).
pub fn needed_migration(crd: &CustomResourceDefinition, clean_unserved: bool) -> Option<Needed> {
    if crd.annotations().get(OPT_OUT_ANNOTATION).is_some_and(|v| v == "false") {
        return None;
    }
    let storage = &crd.spec.versions.iter().find(|v| v.storage)?.name;
    let clean_managed_fields = clean_unserved && crd.spec.versions.iter().any(|v| !v.served);
    if !CrdState::of(crd)?.is_stale() && !clean_managed_fields {
        return None;
    }
    let plural = &crd.spec.names.plural;
    let group = &crd.spec.group;
    let generation = crd.metadata.generation.unwrap_or_default();
    let name = migration_name(plural, group, storage, generation);
    let target = GroupVersionResource {
        group: group.clone(),
        version: storage.clone(),
        resource: plural.clone(),
    };
    Some(Needed { name, target, clean_managed_fields })
}

/// What the CRD watch does besides creating migrations.
#[derive(Clone)]
pub struct Settings {
    /// Create migrations (`--crd-trigger`); when false the watch only starts encoding checks.
    pub create: bool,
    /// Where encoding checks start as soon as a storage switch is seen.
    pub observer: Observer,
    /// How long those checks take.
    pub encoding: EncodingPolicy,
    /// Told of every CRD change (the discovery trigger polls then).
    pub poke: Option<Arc<tokio::sync::Notify>>,
    /// Longest time one request may go unanswered.
    pub request_timeout: Duration,
    /// Also migrate a CRD that stopped serving a version, removing the `managedFields` entries
    /// that name it (`--clean-managed-fields`).
    pub clean_managed_fields: bool,
}

/// The encoding check a CRD with stale `storedVersions` needs before it can be pruned.
fn encoding_check(crd: &CustomResourceDefinition, settings: &Settings) -> Option<Check> {
    let storage = &crd.spec.versions.iter().find(|v| v.storage)?.name;
    if !CrdState::of(crd)?.is_stale() {
        return None;
    }
    Some(Check {
        group: crd.spec.group.clone(),
        plural: crd.spec.names.plural.clone(),
        kind: crd.spec.names.kind.clone(),
        expected: Expected::StorageVersion(storage.clone()),
        generation: crd.metadata.generation.unwrap_or_default(),
        settle: settings.encoding.settle,
        wait: settings.encoding.wait,
    })
}

struct Context {
    client: Client,
    config: kube::Config,
    fence: Fence,
    settings: Settings,
    /// The generation each CRD (by uid) had when the discovery trigger was last told of it.
    told: std::sync::Mutex<std::collections::HashMap<String, i64>>,
}

/// Runs until `stop` fires; creates nothing once `fence` closes.
pub async fn run(clients: Clients, settings: Settings, fence: Fence, stop: CancellationToken) {
    let Clients { requests: client, watches, config } = clients;
    let crds: Api<CustomResourceDefinition> = Api::all(watches.clone());
    let migrations: Api<StorageVersionMigration> = Api::all(watches);
    let controller = Controller::new(crds, watcher::Config::default());
    // A finished migration may leave its CRD needing another: look at the CRD again. Built-in
    // resources have no CRD to look at.
    let store = controller.store();
    let crd_of = move |migration: StorageVersionMigration| {
        let target = &migration.spec.resource;
        let crd = ObjectRef::new(&format!("{}.{}", target.resource, target.group));
        store.get(&crd).map(|_| crd)
    };
    controller
        .watches(migrations, watcher::Config::default(), crd_of)
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(
            reconcile,
            error_policy,
            Arc::new(Context { client, config, fence, settings, told: Default::default() }),
        )
        .for_each(|result| async move {
            match result {
                Ok(_) => {}
                Err(error) if crate::reachability::unreachable(&error, "CRD trigger") => {}
                Err(error) => warn!(error = %crate::error_chain(&error), "CRD trigger failed"),
            }
        })
        .await;
}

async fn reconcile(
    crd: Arc<CustomResourceDefinition>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    // The discovery trigger polls when a CRD is new or its spec changed (a storage switch, a
    // version served or not): not for every status write or migration checkpoint.
    if let Some(poke) = &context.settings.poke {
        let uid = crd.metadata.uid.clone().unwrap_or_default();
        let generation = crd.metadata.generation.unwrap_or_default();
        let mut told = context.told.lock().unwrap_or_else(|p| p.into_inner());
        if told.insert(uid, generation) != Some(generation) {
            poke.notify_one();
        }
    }
    // Whoever creates the migration, the encoding check starts now, at the storage switch.
    if let Some(check) = encoding_check(&crd, &context.settings) {
        context.settings.observer.observe(&context.client, &context.config, &check);
    }
    let needed = needed_migration(&crd, context.settings.clean_managed_fields);
    let Some(Needed { name, target, clean_managed_fields }) = needed else {
        return Ok(Action::await_change());
    };
    if !context.settings.create {
        return Ok(Action::await_change());
    }
    let api: Api<StorageVersionMigration> = Api::all(context.client.clone());
    let requests = Requests { fence: &context.fence, timeout: context.settings.request_timeout };
    let existing = requests.send(api.list(&Default::default())).await.map_err(Error::List)?;
    let busy = existing.items.iter().any(|m| {
        m.spec.resource.group == target.group
            && m.spec.resource.resource == target.resource
            && !Phase::of(m).is_terminal()
    });
    if busy {
        return Ok(Action::await_change());
    }
    let migration = StorageVersionMigration {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(TRIGGER_LABEL.to_owned(), "crd".to_owned())])),
            annotations: clean_managed_fields.then(|| {
                BTreeMap::from([(CLEAN_MANAGED_FIELDS_ANNOTATION.to_owned(), "true".to_owned())])
            }),
            ..ObjectMeta::default()
        },
        spec: StorageVersionMigrationSpec { resource: target, continue_token: None },
        status: None,
    };
    match requests.send(api.create(&PostParams::default(), &migration)).await {
        Ok(_) => info!(
            crd = crd.name_any(),
            migration = name,
            clean_managed_fields,
            "created a migration for the CRD"
        ),
        Err(error) if is_conflict(&error) => {
            debug!(migration = name, "a migration for this CRD state exists already");
        }
        Err(error) => return Err(Error::Create(name, error)),
    }
    Ok(Action::await_change())
}

fn error_policy(
    _crd: Arc<CustomResourceDefinition>,
    _error: &Error,
    _context: Arc<Context>,
) -> Action {
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(storage: &str, stored: &[&str], annotation: Option<&str>) -> CustomResourceDefinition {
        let mut crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "widgets.example.com", "generation": 4 },
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": { "plural": "widgets", "kind": "Widget" },
                "versions": [
                    { "name": "v1", "served": true, "storage": storage == "v1" },
                    { "name": "v2", "served": true, "storage": storage == "v2" },
                ],
            },
            "status": { "storedVersions": stored, "acceptedNames": { "plural": "widgets", "kind": "Widget" } },
        }))
        .unwrap();
        if let Some(value) = annotation {
            crd.annotations_mut().insert(OPT_OUT_ANNOTATION.into(), value.into());
        }
        crd
    }

    #[test]
    fn stale_stored_versions_need_a_migration_named_after_the_crd_state() {
        let Needed { name, target, clean_managed_fields } =
            needed_migration(&crd("v2", &["v1", "v2"], None), true).unwrap();
        assert!(!clean_managed_fields, "every version is served");
        assert_eq!(name, "widgets.example.com-v2-4");
        assert_eq!(
            (target.group.as_str(), target.version.as_str(), target.resource.as_str()),
            ("example.com", "v2", "widgets")
        );
    }

    #[test]
    fn current_stored_versions_need_nothing() {
        assert_eq!(needed_migration(&crd("v2", &["v2"], None), true), None);
    }

    #[test]
    fn names_too_long_for_an_object_are_shortened_but_stay_distinct_and_valid() {
        let group = format!("{}.example.com", "g".repeat(230));
        let name = migration_name("widgets", &group, "v2", 12);
        assert_eq!(name.len(), MAX_NAME, "{name}");
        assert!(name.ends_with("-v2-12") && name.starts_with("widgets.ggg"), "{name}");
        let other =
            migration_name("widgets", &format!("{}.example.org", "g".repeat(230)), "v2", 12);
        assert_ne!(name, other, "the hash tells them apart");
        assert_eq!(
            migration_name("widgets", &group, "v2", 12),
            name,
            "the same CRD state, the same name"
        );
        let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
        assert!(name.chars().all(valid), "{name}");
        // Short names are left as they are.
        assert_eq!(migration_name("widgets", "example.com", "v2", 4), "widgets.example.com-v2-4");
    }

    #[test]
    fn the_opt_out_annotation_is_respected() {
        assert_eq!(needed_migration(&crd("v2", &["v1", "v2"], Some("false")), true), None);
        assert!(needed_migration(&crd("v2", &["v1", "v2"], Some("true")), true).is_some());
    }
}
