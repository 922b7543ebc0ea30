//! Which lane a migration writes in, and waiting for its turn there: a migration created by
//! hand or for a storage switch goes first, the CRD trigger's catch-up after a start next, and
//! the discovery trigger's sweep has turns of its own, so it never holds back the others.

use std::time::Duration;

use super::Context;
use crate::api::{BACKLOG_ANNOTATION, StorageVersionMigration, Trigger};
use crate::lifecycle::turns::Turn;

/// How soon a migration waiting for its turn is looked at again.
pub(super) const WAIT_FOR_TURN: Duration = Duration::from_secs(2);

/// Which turns to write a migration takes, first lane first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Lane {
    /// Migrations created by hand, or by the CRD trigger for a switch it saw: the first of the
    /// `--concurrency` turns.
    Main,
    /// Migrations marked [`BACKLOG_ANNOTATION`] (the CRD trigger's catch-up after a start): the
    /// `--concurrency` turns no [`Lane::Main`] migration waits for.
    Backlog,
    /// The discovery trigger's sweep: [`super::SWEEP_SLOTS`] turns of its own.
    Sweep,
}

/// Whether the discovery trigger created `migration`. Pure.
pub(super) fn swept(migration: &StorageVersionMigration) -> bool {
    migration.made_by() == Some(Trigger::Discovery)
}

/// The lane `migration` asks for by itself: its trigger and its annotation. Pure.
fn own_lane(migration: &StorageVersionMigration) -> Lane {
    if swept(migration) {
        return Lane::Sweep;
    }
    let annotations = migration.metadata.annotations.as_ref();
    match annotations.and_then(|a| a.get(BACKLOG_ANNOTATION)).is_some_and(|v| v == "true") {
        true => Lane::Backlog,
        false => Lane::Main,
    }
}

/// The lane of `migration`: its own, unless another migration of the same resource in a lane
/// before it waits for it to end (at most one migration of a resource runs at a time): then
/// that lane, so the other is not held behind a later lane through it. Pure.
pub(super) fn lane<'a>(
    migration: &StorageVersionMigration,
    others: impl IntoIterator<Item = &'a StorageVersionMigration>,
) -> Lane {
    let own = own_lane(migration);
    let resource = migration.group_resource();
    let name = migration.metadata.name.as_deref();
    let waiting = others.into_iter().filter(|other| {
        other.metadata.name.as_deref() != name
            && other.is_of(&resource.group, &resource.resource)
            && other.is_unfinished_and_not_deleted()
    });
    waiting.map(own_lane).fold(own, Lane::min)
}

/// Waits for `migration`'s turn to write in its lane ([`lane`], looked at again while waiting:
/// a later lane may be lifted by a migration that comes to wait for it).
pub(super) async fn turn(context: &Context, migration: &StorageVersionMigration) -> Turn {
    let arrival = context.turns.arrival();
    loop {
        let state = context.store.state();
        let lane = lane(migration, state.iter().map(|m| m.as_ref()));
        let (turns, rank) = match lane {
            Lane::Main => (&context.turns, 0),
            Lane::Backlog => (&context.turns, 1),
            Lane::Sweep => (&context.sweep_turns, 0),
        };
        tokio::select! {
            turn = turns.take((rank, arrival)) => return turn,
            () = tokio::time::sleep(WAIT_FOR_TURN), if lane != Lane::Main => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TRIGGER_LABEL;

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

    #[test]
    fn the_catch_up_writes_after_switches_seen_since_and_lifts_what_it_waits_for() {
        let mut caught_up = migration("widgets-v2-1", "widgets", Some("crd"));
        caught_up.metadata.annotations =
            Some([(BACKLOG_ANNOTATION.to_owned(), "true".to_owned())].into());
        assert_eq!(lane(&caught_up, [&caught_up]), Lane::Backlog);
        let operator = migration("by-hand", "widgets", None);
        assert_eq!(lane(&caught_up, [&operator]), Lane::Main, "one by hand waits for it");
        assert_eq!(lane(&operator, [&caught_up]), Lane::Main);
        // A sweep that the catch-up of its resource waits for writes in the catch-up's lane.
        let swept = migration("widgets-abc", "widgets", Some("discovery"));
        assert_eq!(lane(&swept, [&caught_up]), Lane::Backlog);
        assert_eq!(lane(&swept, [&caught_up, &operator]), Lane::Main);
        assert!(Lane::Main < Lane::Backlog && Lane::Backlog < Lane::Sweep, "the order of turns");
    }
}
