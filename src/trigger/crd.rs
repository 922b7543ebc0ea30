//! The CRD trigger: when a CustomResourceDefinition's `status.storedVersions` holds anything but
//! its storage version, create a migration for it, unless one is pending or running for that
//! resource or the CRD opts out. Watch-driven: a storage version switch is seen within seconds.
//!
//! Migrations are named `<plural>.<group>-<storage version>-<generation>`: the same CRD state
//! never gets a second migration, so a migration that failed is not retried in a loop; a changed
//! CRD (new generation) gets a new one once the previous has finished.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::{GroupVersionResource, StorageVersionMigration, StorageVersionMigrationSpec};
use crate::controller::status::Phase;

/// Annotation on a CRD: `"false"` keeps kube-svm from migrating it on its own.
pub const OPT_OUT_ANNOTATION: &str = "kube-svm.io/auto-migrate";

/// Label on the migrations the trigger creates.
pub const TRIGGER_LABEL: &str = "kube-svm.io/trigger";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to list StorageVersionMigrations")]
    List(#[source] kube::Error),
    #[error("failed to create StorageVersionMigration {0}")]
    Create(String, #[source] kube::Error),
}

/// The migration a CRD needs, if any: its name and what it migrates.
pub fn needed_migration(crd: &CustomResourceDefinition) -> Option<(String, GroupVersionResource)> {
    if crd.annotations().get(OPT_OUT_ANNOTATION).is_some_and(|v| v == "false") {
        return None;
    }
    let storage = &crd.spec.versions.iter().find(|v| v.storage)?.name;
    let stored = crd.status.as_ref()?.stored_versions.as_ref()?;
    if stored.iter().all(|v| v == storage) {
        return None;
    }
    let plural = &crd.spec.names.plural;
    let group = &crd.spec.group;
    let generation = crd.metadata.generation.unwrap_or_default();
    let name = format!("{plural}.{group}-{storage}-{generation}");
    let target = GroupVersionResource {
        group: group.clone(),
        version: storage.clone(),
        resource: plural.clone(),
    };
    Some((name, target))
}

struct Context {
    client: Client,
}

/// Runs until `stop` fires.
pub async fn run(client: Client, stop: CancellationToken) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    // A finished migration may leave its CRD needing another: look at the CRD again.
    let crd_of = |migration: StorageVersionMigration| {
        let target = &migration.spec.resource;
        (!target.group.is_empty())
            .then(|| ObjectRef::new(&format!("{}.{}", target.resource, target.group)))
    };
    Controller::new(crds, watcher::Config::default())
        .watches(migrations, watcher::Config::default(), crd_of)
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile, error_policy, Arc::new(Context { client }))
        .for_each(|result| async move {
            if let Err(error) = result {
                warn!(error = %crate::error_chain(&error), "CRD trigger failed");
            }
        })
        .await;
}

async fn reconcile(
    crd: Arc<CustomResourceDefinition>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    let Some((name, target)) = needed_migration(&crd) else { return Ok(Action::await_change()) };
    let api: Api<StorageVersionMigration> = Api::all(context.client.clone());
    let existing = api.list(&Default::default()).await.map_err(Error::List)?;
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
            ..ObjectMeta::default()
        },
        spec: StorageVersionMigrationSpec { resource: target, continue_token: None },
        status: None,
    };
    match api.create(&PostParams::default(), &migration).await {
        Ok(_) => info!(
            crd = crd.name_any(),
            migration = name,
            "created a migration for stale storedVersions"
        ),
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => return Err(Error::Create(name, error)),
    }
    Ok(Action::await_change())
}

fn error_policy(
    _crd: Arc<CustomResourceDefinition>,
    _error: &Error,
    _context: Arc<Context>,
) -> Action {
    Action::requeue(std::time::Duration::from_secs(5))
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
        let (name, target) = needed_migration(&crd("v2", &["v1", "v2"], None)).unwrap();
        assert_eq!(name, "widgets.example.com-v2-4");
        assert_eq!(
            (target.group.as_str(), target.version.as_str(), target.resource.as_str()),
            ("example.com", "v2", "widgets")
        );
    }

    #[test]
    fn current_stored_versions_need_nothing() {
        assert_eq!(needed_migration(&crd("v2", &["v2"], None)), None);
    }

    #[test]
    fn the_opt_out_annotation_is_respected() {
        assert_eq!(needed_migration(&crd("v2", &["v1", "v2"], Some("false"))), None);
        assert!(needed_migration(&crd("v2", &["v1", "v2"], Some("true"))).is_some());
    }
}
