//! Which lane a migration writes in, and waiting for its turn there: the discovery trigger's
//! sweep has turns of its own, so it never holds back the other migrations.

use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use super::Context;
use crate::api::{GroupResource, Phase, StorageVersionMigration};
use crate::trigger::TRIGGER_LABEL;

/// How soon a migration waiting for its turn is looked at again.
pub(super) const WAIT_FOR_TURN: Duration = Duration::from_secs(2);

/// Which turns to write a migration takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lane {
    /// Every migration but the sweep's: `--concurrency` turns.
    Main,
    /// The discovery trigger's sweep: [`super::SWEEP_SLOTS`] turns of its own.
    Sweep,
}

/// The lane of `migration`: the discovery trigger's take the sweep's, unless another migration
/// of the same resource (an operator's, the CRD trigger's) waits for it to end: then it takes
/// the main lane, so that migration is not held behind the sweep either. Pure.
pub(super) fn lane<'a>(
    migration: &StorageVersionMigration,
    others: impl IntoIterator<Item = &'a StorageVersionMigration>,
) -> Lane {
    let swept = |m: &StorageVersionMigration| {
        let labels = m.metadata.labels.as_ref();
        labels.and_then(|l| l.get(TRIGGER_LABEL)).is_some_and(|v| v == "discovery")
    };
    if !swept(migration) {
        return Lane::Main;
    }
    let resource = group_resource(migration);
    let name = migration.metadata.name.as_deref();
    let waiting = others.into_iter().any(|other| {
        other.metadata.name.as_deref() != name
            && group_resource(other) == resource
            && !swept(other)
            && !Phase::of(other).is_terminal()
            && other.metadata.deletion_timestamp.is_none()
    });
    if waiting { Lane::Main } else { Lane::Sweep }
}

/// Waits for `migration`'s turn to write in its lane ([`lane`], looked at again while waiting).
pub(super) async fn turn(
    context: &Context,
    migration: &StorageVersionMigration,
) -> OwnedSemaphorePermit {
    loop {
        let state = context.store.state();
        let lane = lane(migration, state.iter().map(|m| m.as_ref()));
        let slots = match lane {
            Lane::Main => context.slots.clone(),
            Lane::Sweep => context.sweep_slots.clone(),
        };
        tokio::select! {
            permit = slots.acquire_owned() => match permit {
                Ok(permit) => return permit,
                // Never closed; should it be, wait rather than spin.
                Err(_) => tokio::time::sleep(WAIT_FOR_TURN).await,
            },
            () = tokio::time::sleep(WAIT_FOR_TURN), if lane == Lane::Sweep => {}
        }
    }
}

/// The resource `migration` migrates.
pub(super) fn group_resource(migration: &StorageVersionMigration) -> GroupResource {
    let target = &migration.spec.resource;
    GroupResource { group: target.group.clone(), resource: target.resource.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn migration(name: &str, resource: &str, trigger: Option<&str>) -> StorageVersionMigration {
        let spec = crate::api::StorageVersionMigrationSpec {
            resource: crate::api::GroupVersionResource {
                group: "example.com".into(),
                version: "v1".into(),
                resource: resource.into(),
            },
            continue_token: None,
        };
        let mut migration = StorageVersionMigration::new(name, spec);
        migration.metadata.labels =
            trigger.map(|t| [(TRIGGER_LABEL.to_owned(), t.to_owned())].into());
        migration
    }

    #[test]
    fn the_sweep_has_a_lane_of_its_own_unless_another_migration_waits_for_it() {
        let swept = migration("widgets-abc", "widgets", Some("discovery"));
        assert_eq!(lane(&swept, [&swept]), Lane::Sweep);
        let other_resource = migration("gadgets-1", "gadgets", Some("crd"));
        assert_eq!(lane(&swept, [&swept, &other_resource]), Lane::Sweep);
        // The CRD trigger's migration of the same resource waits for the sweep's to end.
        let switched = migration("widgets-v2-1", "widgets", Some("crd"));
        assert_eq!(lane(&swept, [&swept, &switched]), Lane::Main);
        let operator = migration("by-hand", "widgets", None);
        assert_eq!(lane(&swept, [&operator]), Lane::Main);
        assert_eq!(lane(&operator, [&swept]), Lane::Main, "only the sweep's own take its lane");
        // One that has ended waits for nothing.
        let mut ended = migration("by-hand", "widgets", None);
        ended.status = Some(crate::api::StorageVersionMigrationStatus {
            conditions: vec![crate::api::MigrationCondition {
                type_: crate::api::conditions::SUCCEEDED.into(),
                status: crate::api::conditions::STATUS_TRUE.into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        assert_eq!(lane(&swept, [&ended]), Lane::Sweep);
    }
}
