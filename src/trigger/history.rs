//! Forgetting the triggers' old migrations. The discovery trigger creates one migration per
//! resource at every storage change, and again after each failure (backing off to one per
//! `--discovery-interval`), so a resource that cannot succeed would leave a new one for ever:
//! thousands of objects the controller lists and watches. The CRD trigger creates one per
//! storage switch of a CRD. Only the newest few finished ones of each resource are kept: enough
//! for the back-off to reach its longest wait (it counts the failures in a row among them) and
//! for an operator to see what happened; older ones are deleted (`--discovery-keep-finished`).
//! Migrations of other creators, and any not finished, are never touched.

use std::collections::BTreeMap;

use kube::Api;
use kube::api::{DeleteParams, Preconditions};
use tracing::{debug, info};

use crate::api::{StorageVersionMigration, Trigger};
use crate::apiserver::requests::Requests;

/// Finished migrations of the discovery trigger kept per resource by default, newest first: ten
/// failures in a row double the first wait (a settle period) past any `--discovery-interval` a
/// cluster uses, so the back-off is the same as with every one kept.
pub const KEPT_PER_RESOURCE: usize = 10;

/// The finished migrations of the trigger `by` beyond the newest `kept` of their resource:
/// (name, uid), oldest first. Pure.
pub fn forgotten(
    migrations: &[StorageVersionMigration],
    by: Trigger,
    kept: usize,
) -> Vec<(String, String)> {
    let mut by_resource: BTreeMap<(String, String), Vec<&StorageVersionMigration>> =
        BTreeMap::new();
    for migration in migrations {
        if migration.made_by() != Some(by) || migration.is_unfinished() {
            continue;
        }
        let resource = &migration.spec.resource;
        let key = (resource.group.clone(), resource.resource.clone());
        by_resource.entry(key).or_default().push(migration);
    }
    let mut forgotten = Vec::new();
    for finished in by_resource.values_mut() {
        // Newest first: by creation time, then name (a total order).
        finished.sort_by(|a, b| {
            let at = |m: &StorageVersionMigration| {
                (m.metadata.creation_timestamp.as_ref().map(|t| t.0), m.metadata.name.clone())
            };
            at(b).cmp(&at(a))
        });
        for old in finished.iter().skip(kept).rev() {
            let name = old.metadata.name.clone().unwrap_or_default();
            forgotten.push((name, old.metadata.uid.clone().unwrap_or_default()));
        }
    }
    forgotten
}

/// Deletes what [`forgotten`] names of `migrations`, each only while it is the one read (its uid
/// as a precondition). A deletion that fails is tried again at the next look.
pub async fn forget(
    requests: &Requests,
    api: &Api<StorageVersionMigration>,
    migrations: &[StorageVersionMigration],
    by: Trigger,
    kept: usize,
) {
    delete(requests, api, &forgotten(migrations, by, kept), by, kept).await;
}

/// Deletes `old`, (name, uid) pairs of the trigger `by` that [`forgotten`] named with `kept`,
/// each only while it is the one read (its uid as a precondition). A deletion that fails is
/// tried again at the next look.
pub async fn delete(
    requests: &Requests,
    api: &Api<StorageVersionMigration>,
    old: &[(String, String)],
    by: Trigger,
    kept: usize,
) {
    if old.is_empty() {
        return;
    }
    let mut deleted = 0;
    for (name, uid) in old {
        let params = DeleteParams {
            preconditions: Some(Preconditions { uid: Some(uid.clone()), ..Default::default() }),
            ..DeleteParams::default()
        };
        match requests.send(api.delete(name, &params)).await {
            Ok(_) => deleted += 1,
            Err(error) => {
                debug!(migration = name, error = %crate::error_chain(&error), "not deleted; trying again at the next poll")
            }
        }
    }
    info!(
        deleted,
        kept_per_resource = kept,
        trigger = by.label(),
        "deleted a trigger's oldest finished migrations"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TRIGGER_LABEL;
    use crate::api::conditions::{FAILED, RUNNING, STATUS_TRUE};
    use crate::api::{GroupVersionResource, MigrationCondition, StorageVersionMigrationSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn migration(
        name: &str,
        resource: &str,
        trigger: &str,
        state: &str,
        minute: u32,
    ) -> StorageVersionMigration {
        let spec = StorageVersionMigrationSpec {
            resource: GroupVersionResource {
                group: "apps".into(),
                version: "v1".into(),
                resource: resource.into(),
            },
            continue_token: None,
        };
        let mut m = StorageVersionMigration::new(name, spec);
        m.metadata.uid = Some(format!("uid-{name}"));
        m.metadata.labels = Some([(TRIGGER_LABEL.to_owned(), trigger.to_owned())].into());
        let at = format!("2026-01-01T{:02}:{:02}:00Z", minute / 60, minute % 60);
        m.metadata.creation_timestamp = Some(Time(at.parse().expect("a time")));
        m.status = Some(crate::api::StorageVersionMigrationStatus {
            conditions: vec![MigrationCondition {
                type_: state.into(),
                status: STATUS_TRUE.into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        m
    }

    #[test]
    fn only_the_newest_finished_ones_of_each_resource_are_kept() {
        let mut all: Vec<StorageVersionMigration> = (0..14)
            .map(|i| migration(&format!("deployments-{i}"), "deployments", "discovery", FAILED, i))
            .collect();
        all.push(migration("deployments-running", "deployments", "discovery", RUNNING, 99));
        all.push(migration("deployments-crd", "deployments", "crd", FAILED, 0));
        all.push(migration("statefulsets-0", "statefulsets", "discovery", FAILED, 0));
        let names: Vec<String> = forgotten(&all, Trigger::Discovery, KEPT_PER_RESOURCE)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(names, ["deployments-0", "deployments-1", "deployments-2", "deployments-3"]);
    }
}
