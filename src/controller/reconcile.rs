//! Deciding when a migration starts: never twice, at most one per resource (the oldest first), at
//! most `concurrency` at once. Terminal migrations are never run again.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{debug, instrument};

use super::Context;
use super::migration;
use super::status::Phase;
use crate::api::{GroupResource, StorageVersionMigration};

/// How soon a migration waiting for its turn is looked at again.
const WAIT_FOR_TURN: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a StorageVersionMigration has no name")]
    Unnamed,
}

#[instrument(skip_all, fields(migration = %migration.name_any()))]
pub(super) async fn reconcile(
    migration: Arc<StorageVersionMigration>,
    context: Arc<Context>,
) -> Result<Action, Error> {
    let name = migration.metadata.name.clone().ok_or(Error::Unnamed)?;
    if Phase::of(&migration).is_terminal() || context.stopping.is_cancelled() {
        return Ok(Action::await_change());
    }
    let resource = group_resource(&migration);
    {
        let mut running = context.running();
        if running.contains_key(&name) {
            return Ok(Action::await_change());
        }
        if running.values().any(|other| *other == resource) || older_waiting(&context, &migration) {
            debug!("waiting for an earlier migration of the same resource");
            return Ok(Action::requeue(WAIT_FOR_TURN));
        }
        let Ok(slot) = context.slots.clone().try_acquire_owned() else {
            debug!("waiting for a free migration slot");
            return Ok(Action::requeue(WAIT_FOR_TURN));
        };
        running.insert(name.clone(), resource);
        let task_context = context.clone();
        context.tasks.spawn(async move {
            migration::run(&task_context, migration).await;
            task_context.running().remove(&name);
            drop(slot);
        });
    }
    Ok(Action::await_change())
}

pub(super) fn error_policy(
    _migration: Arc<StorageVersionMigration>,
    _error: &Error,
    _context: Arc<Context>,
) -> Action {
    Action::requeue(WAIT_FOR_TURN)
}

fn group_resource(migration: &StorageVersionMigration) -> GroupResource {
    let target = &migration.spec.resource;
    GroupResource { group: target.group.clone(), resource: target.resource.clone() }
}

/// Whether an older, unfinished migration of the same resource is waiting: it goes first.
fn older_waiting(context: &Context, migration: &StorageVersionMigration) -> bool {
    let resource = group_resource(migration);
    let key = order_key(migration);
    context.store.state().iter().any(|other| {
        group_resource(other) == resource
            && !Phase::of(other).is_terminal()
            && other.metadata.deletion_timestamp.is_none()
            && order_key(other) < key
    })
}

/// Creation time, then name: a total order, oldest first.
fn order_key(migration: &StorageVersionMigration) -> (Option<i64>, String) {
    let created = migration.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second());
    (created, migration.name_any())
}
