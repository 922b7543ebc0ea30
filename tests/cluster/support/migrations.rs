//! Creating StorageVersionMigrations and waiting for what kube-svm does with them.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use kube_svm::api::{
    GroupVersionResource, MigrationProgress, Phase, StorageVersionMigration,
    StorageVersionMigrationSpec,
};
use kube_svm::trigger::crd::TRIGGER_LABEL;

use super::fixtures::WidgetCrd;
use super::process::KubeSvm;

/// Creates a migration of `resource` in `group` at the group's preferred version.
pub async fn create_migration(client: &Client, name: &str, group: &str, resource: &str) {
    create(client, name, group, "", resource, None).await;
}

/// Creates a migration with every field of its spec given.
pub async fn create(
    client: &Client,
    name: &str,
    group: &str,
    version: &str,
    resource: &str,
    continue_token: Option<String>,
) -> StorageVersionMigration {
    let spec = StorageVersionMigrationSpec {
        resource: GroupVersionResource {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
        },
        continue_token,
    };
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    api.create(&PostParams::default(), &StorageVersionMigration::new(name, spec))
        .await
        .expect("the migration is created")
}

/// Polls the migration until `done` holds, failing after `timeout` with the controllers' logs.
pub async fn wait_for(
    client: &Client,
    name: &str,
    timeout: Duration,
    controllers: &[&KubeSvm],
    done: impl Fn(&StorageVersionMigration) -> bool,
) -> StorageVersionMigration {
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        // The apiserver may be restarting under a fault test: keep asking until the deadline.
        if let Ok(migration) = api.get(name).await {
            if done(&migration) {
                return migration;
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = controllers.iter().map(|c| c.logs()).collect();
                panic!(
                    "timed out waiting for {name}: {:?}\n{}",
                    migration.status,
                    logs.join("\n----\n")
                );
            }
        }
        assert!(Instant::now() < deadline + Duration::from_secs(60), "{name} cannot be read");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn phase_is(phase: Phase) -> impl Fn(&StorageVersionMigration) -> bool {
    move |m| Phase::of(m) == phase
}

pub fn is_terminal(migration: &StorageVersionMigration) -> bool {
    Phase::of(migration).is_terminal()
}

pub fn processed_at_least(n: u64) -> impl Fn(&StorageVersionMigration) -> bool {
    move |m| m.status.as_ref().and_then(|s| s.progress.as_ref()).is_some_and(|p| p.processed >= n)
}

pub fn progress(migration: &StorageVersionMigration) -> MigrationProgress {
    migration.status.as_ref().and_then(|s| s.progress.clone()).expect("progress is reported")
}

/// The first condition's (type, reason, message).
pub fn state(migration: &StorageVersionMigration) -> (String, String, String) {
    let status = migration.status.as_ref().expect("status");
    let first = status.conditions.first().expect("a condition");
    (
        first.type_.clone(),
        first.reason.clone().unwrap_or_default(),
        first.message.clone().unwrap_or_default(),
    )
}

/// The reasons of the Events on migration `name`.
pub async fn event_reasons(client: &Client, name: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let selector = format!("involvedObject.name={name}");
    let list = events.list(&ListParams::default().fields(&selector)).await.expect("events");
    list.items.into_iter().filter_map(|e| e.reason).collect()
}

/// Waits up to ten seconds for an Event with `reason` on migration `name` whose note holds
/// `words`.
pub async fn has_event_saying(client: &Client, name: &str, reason: &str, words: &str) -> bool {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let selector = format!("involvedObject.name={name}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let list = events.list(&ListParams::default().fields(&selector)).await.expect("events");
        let found = list.items.iter().any(|e| {
            e.reason.as_deref() == Some(reason)
                && e.message.as_deref().unwrap_or_default().contains(words)
        });
        if found {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits up to ten seconds for an Event with `reason` on migration `name`: kube-svm records an
/// Event after the status write it explains, so a test that saw the status may be early.
pub async fn has_event(client: &Client, name: &str, reason: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if event_reasons(client, name).await.iter().any(|r| r == reason) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The migrations a trigger (`crd` or `discovery`) created for `widgets`, oldest first.
pub async fn triggered(
    client: &Client,
    widgets: &WidgetCrd,
    by: &str,
) -> Vec<StorageVersionMigration> {
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    let mut found: Vec<_> = api
        .list(&ListParams::default().labels(&format!("{TRIGGER_LABEL}={by}")))
        .await
        .expect("listed")
        .items
        .into_iter()
        .filter(|m| m.spec.resource.group == widgets.group)
        .collect();
    found.sort_by_key(|m| m.metadata.creation_timestamp.as_ref().map(|t| t.0));
    found
}

/// Waits until the trigger has created `n` migrations for `widgets`; returns the newest.
pub async fn wait_for_triggered(
    client: &Client,
    widgets: &WidgetCrd,
    n: usize,
    controller: &KubeSvm,
) -> StorageVersionMigration {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut found = triggered(client, widgets, "crd").await;
        if found.len() >= n {
            return found.swap_remove(n - 1);
        }
        assert!(
            Instant::now() < deadline,
            "the trigger created {} migrations, not {n}\n{}",
            found.len(),
            controller.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the discovery trigger has polled `polls` more times, as the heartbeat of the
/// StorageState `state` shows: each poll writes it once it is half an interval old.
pub async fn wait_for_polls(client: &Client, state: &str, polls: usize, controller: &KubeSvm) {
    let states: Api<kube_svm::api::StorageState> = Api::all(client.clone());
    let heartbeat = || async {
        let read = states.get(state).await.expect("the StorageState reads");
        read.status.and_then(|s| s.last_heartbeat_time).map(|t| t.0)
    };
    for _ in 0..polls {
        let before = heartbeat().await;
        let deadline = Instant::now() + Duration::from_secs(60);
        while heartbeat().await == before {
            assert!(Instant::now() < deadline, "no poll\n{}", controller.logs());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
