//! The CRD story end to end, with `kube-svm controller` as a process: a storage version switch
//! triggers a migration, and `storedVersions` is pruned only when that is proven safe.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client, ResourceExt};
use kube_svm::api::{BACKLOG_ANNOTATION, Phase, StorageVersionMigration};
use kube_svm::apiserver::requests::Requests;
use kube_svm::evidence::encoding;
use kube_svm::rules::encoding::Encoding;
use kube_svm::trigger::crd::OPT_OUT_ANNOTATION;

use crate::engine::reject_updates_of_frozen;
use crate::support::ControlPlane;
use crate::support::Scenario;
use crate::support::fixtures::{WidgetCrd, update_crd};
use crate::support::migrations::{triggered, wait_for_triggered};
use crate::support::process::KubeSvm;

/// A private control plane with kube-svm's CRDs and a widget CRD stored at v1 with `count`
/// objects, and a controller with the CRD trigger on.
async fn setup(
    apiserver_flags: &[&str],
    count: usize,
    controller_flags: &[&str],
) -> (ControlPlane, Client, WidgetCrd, KubeSvm) {
    let Scenario { control_plane, client } = Scenario::own(apiserver_flags).await;
    let widgets = WidgetCrd::new("stored", false);
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], count).await;
    let mut args = vec![
        "controller",
        "--leader-elect=false",
        "--crd-trigger=true",
        "--storage-version-settle=1",
    ];
    args.extend_from_slice(controller_flags);
    let controller = KubeSvm::start(&control_plane, "controller", &args).await;
    (control_plane, client, widgets, controller)
}

async fn wait_terminal(
    client: &Client,
    name: &str,
    controller: &KubeSvm,
) -> StorageVersionMigration {
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let migration = api.get(name).await.expect("exists");
        if Phase::of(&migration).is_terminal() {
            return migration;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never finished: {:?}\n{}",
            migration.status,
            controller.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_running(client: &Client, name: &str) {
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while Phase::of(&api.get(name).await.expect("exists")) != Phase::Running {
        assert!(Instant::now() < deadline, "{name} never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The StoredVersionsPruned condition: (status, reason, message).
fn pruned(migration: &StorageVersionMigration) -> (String, String, String) {
    let status = migration.status.as_ref().expect("status");
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "StoredVersionsPruned")
        .unwrap_or_else(|| panic!("no StoredVersionsPruned condition: {status:?}"));
    (
        condition.status.clone(),
        condition.reason.clone().unwrap_or_default(),
        condition.message.clone().unwrap_or_default(),
    )
}

async fn stored_versions(client: &Client, widgets: &WidgetCrd) -> Vec<String> {
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get(&widgets.name())
        .await
        .expect("the CRD");
    crd.status.and_then(|s| s.stored_versions).unwrap_or_default()
}

/// The user story: switch storage to v2, kube-svm migrates on its own, prunes storedVersions to
/// [v2], and v1 can then be removed from the CRD.
async fn storage_switch_ends_with_v1_removable(
    apiserver_flags: &[&str],
    evidence: &str,
) -> (ControlPlane, Client) {
    let (control_plane, client, widgets, controller) = setup(apiserver_flags, 200, &[]).await;
    let switched = Instant::now();
    widgets.set_storage_version(&client, "v2").await;
    let migration = wait_for_triggered(&client, &widgets, 1, &controller).await;
    eprintln!("migration created {:?} after the storage switch", switched.elapsed());

    let done = wait_terminal(&client, &migration.name_any(), &controller).await;
    assert_eq!(Phase::of(&done), Phase::Succeeded, "{:?}", done.status);
    let target = done.status.as_ref().and_then(|s| s.target.clone()).expect("target recorded");
    assert_eq!(target.storage_version.as_deref(), Some("v2"));
    assert_eq!(target.encoding_confirmed, Some(true), "{target:?}");
    assert!(
        target.encoding_evidence.as_deref().is_some_and(|e| e.contains(evidence)),
        "{target:?}"
    );
    assert_eq!(pruned(&done).0, "True", "{:?}", pruned(&done));
    assert_eq!(stored_versions(&client, &widgets).await, ["v2"]);
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 200).await;

    // With storedVersions pruned, the apiserver lets v1 go.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    update_crd(&client, &widgets.name(), |crd| crd.spec.versions.retain(|v| v.name != "v1")).await;
    let status = crds.get(&widgets.name()).await.expect("the CRD").status.expect("status");
    let migrating =
        status.conditions.unwrap_or_default().into_iter().find(|c| c.type_ == "StorageMigrating");
    assert_eq!(
        migrating.map(|c| c.status).as_deref(),
        Some("False"),
        "the CRD says the migration ended"
    );
    (control_plane, client)
}

#[tokio::test]
async fn storage_switch_is_migrated_and_pruned_by_the_discovery_hash() {
    storage_switch_ends_with_v1_removable(&[], "confirmed by discovery").await;
}

#[tokio::test]
async fn storage_switch_is_migrated_and_pruned_by_the_storage_version_api() {
    let flags = [
        "--feature-gates=StorageVersionAPI=true,APIServerIdentity=true",
        "--runtime-config=internal.apiserver.k8s.io/v1alpha1=true",
    ];
    // kube-apiserver publishes StorageVersions for built-in resources only: for the CRD the
    // evidence comes from discovery, and says why.
    let (control_plane, _) =
        storage_switch_ends_with_v1_removable(&flags, "the StorageVersion API has no entry").await;

    // For a built-in resource the StorageVersion API answers.
    let config = control_plane.config().await;
    let requests = Requests::new(config, Duration::from_secs(30)).expect("a client");
    let confirm = |version: &'static str| {
        let requests = requests.clone();
        async move {
            let check = encoding::Check {
                group: "apps".into(),
                plural: "deployments".into(),
                kind: "Deployment".into(),
                expected: encoding::Expected::StorageVersion(version.into()),
                generation: 1,
                policy: encoding::EncodingPolicy::AT_ONCE,
            };
            encoding::confirm(&requests, &check).await
        }
    };
    let by_the_api = Encoding::Confirmed {
        by: "the StorageVersion API: every apiserver encodes apps/v1".into(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while confirm("v1").await != by_the_api {
        assert!(Instant::now() < deadline, "{:?}", confirm("v1").await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let Encoding::Unconfirmed(seen) = confirm("v1beta2").await else {
        panic!("v1beta2 is not encoded")
    };
    assert!(
        seen.contains("the StorageVersion API reports common encoding version apps/v1"),
        "{seen}"
    );
}

/// Storage switched again (v2 to v3) while the migration runs: objects written before the switch
/// are stored as v2, so the migration starts over from the first object with v3 as its target,
/// and ends Succeeded with every object in v3 and storedVersions pruned to [v3].
#[tokio::test]
async fn a_storage_switch_during_a_migration_starts_it_over() {
    let slow = ["--page-size=20", "--kube-api-qps=30", "--kube-api-burst=1"];
    let (control_plane, client, widgets, controller) = setup(&[], 300, &slow).await;
    widgets.set_storage_version(&client, "v2").await;
    let first = wait_for_triggered(&client, &widgets, 1, &controller).await;
    wait_running(&client, &first.name_any()).await;
    widgets.set_storage_version(&client, "v3").await;

    let first = wait_terminal(&client, &first.name_any(), &controller).await;
    assert_eq!(Phase::of(&first), Phase::Succeeded, "{:?}", first.status);
    let status = first.status.clone().expect("status");
    assert!(status.restarts.is_some_and(|n| n >= 1), "{status:?}");
    let target = status.target.clone().expect("a target");
    assert_eq!(target.storage_version.as_deref(), Some("v3"), "retargeted");
    assert_eq!(pruned(&first).0, "True", "{:?}", pruned(&first));
    assert_eq!(stored_versions(&client, &widgets).await, ["v3"]);
    widgets.assert_all_stored_as(&control_plane.etcd(), "v3", 300).await;
}

/// The CRD's spec churns all through a migration without touching its storage version (as a
/// caBundle injected again and again, or a schema's description): the run follows every change
/// through a watch, goes on without starting over, and prunes.
#[tokio::test]
async fn crd_churn_that_leaves_storage_alone_neither_restarts_nor_blocks_a_migration() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let slow = ["--page-size=20", "--kube-api-qps=30", "--kube-api-burst=1"];
    let (control_plane, client, widgets, controller) = setup(&[], 300, &slow).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let switched = crds.get(&widgets.name()).await.expect("the CRD").metadata.generation;

    // Churn from the switch on: the encoding check, the run and the prune all see it.
    let (changes, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    widgets.set_storage_version(&client, "v2").await;
    let churn = tokio::spawn({
        let (client, name) = (client.clone(), widgets.name());
        let (changes, stop) = (changes.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::SeqCst) {
                let n = changes.load(Ordering::SeqCst);
                update_crd(&client, &name, |crd| {
                    for version in &mut crd.spec.versions {
                        let schema = version.schema.as_mut();
                        if let Some(schema) = schema.and_then(|s| s.open_api_v3_schema.as_mut()) {
                            schema.description = Some(format!("a widget, take {n}"));
                        }
                    }
                })
                .await;
                changes.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });
    let first = wait_for_triggered(&client, &widgets, 1, &controller).await;
    wait_running(&client, &first.name_any()).await;
    let at_start = changes.load(Ordering::SeqCst);
    let first = wait_terminal(&client, &first.name_any(), &controller).await;
    let during = changes.load(Ordering::SeqCst) - at_start;
    stop.store(true, Ordering::SeqCst);
    churn.await.expect("the churn ends");

    assert!(during >= 3, "the CRD changed {during} times while the migration ran");
    assert_eq!(Phase::of(&first), Phase::Succeeded, "{:?}\n{}", first.status, controller.logs());
    let status = first.status.clone().expect("status");
    assert!(status.restarts.unwrap_or(0) == 0, "started over: {status:?}");
    let (pruned_status, reason, message) = pruned(&first);
    assert_eq!((pruned_status.as_str(), reason.as_str()), ("True", "Pruned"), "{message}");
    let followed = status.target.and_then(|t| t.crd_generation).unwrap_or_default();
    assert!(followed > switched.unwrap_or_default() + 1, "followed to generation {followed}");
    assert_eq!(stored_versions(&client, &widgets).await, ["v2"]);
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 300).await;
}

/// Objects rejected by admission: the migration fails and storedVersions stays as it was; the
/// CRD's spec changing since makes no new migration.
#[tokio::test]
async fn failed_objects_prevent_pruning() {
    let (_control_plane, client, widgets, controller) = setup(&[], 50, &[]).await;
    let label = serde_json::json!({ "metadata": { "labels": { "frozen": "true" } } });
    widgets
        .api(&client, "v1", None)
        .patch("w-7", &Default::default(), &kube::api::Patch::Merge(&label))
        .await
        .expect("labelled");
    reject_updates_of_frozen(&client, &widgets.group).await;
    widgets.set_storage_version(&client, "v2").await;

    let migration = wait_for_triggered(&client, &widgets, 1, &controller).await;
    let done = wait_terminal(&client, &migration.name_any(), &controller).await;
    assert_eq!(Phase::of(&done), Phase::Failed);
    let (status, reason, message) = pruned(&done);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "MigrationFailed"), "{message}");
    assert_eq!(stored_versions(&client, &widgets).await, ["v1", "v2"]);
    // No second migration: the trigger looks at the CRD again once the migration has failed,
    // finds its migration there, and schedules its retry in place (a minute later by default).
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen =
        format!("the migration failed; retrying it later migration=\"{}\"", migration.name_any());
    while !controller.logs().contains(&seen) {
        assert!(Instant::now() < deadline, "the trigger never looked again\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(triggered(&client, &widgets, "crd").await.len(), 1);

    // Its spec churns (a CA bundle injected again and again): each change is looked at, and the
    // failed migration still stands for the state, to be retried in place, not one per change.
    for take in 0..3 {
        let looked = controller.logs().matches(&seen).count();
        update_crd(&client, &widgets.name(), |crd| {
            for version in &mut crd.spec.versions {
                let schema = version.schema.as_mut();
                if let Some(schema) = schema.and_then(|s| s.open_api_v3_schema.as_mut()) {
                    schema.description = Some(format!("a widget, take {take}"));
                }
            }
        })
        .await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while controller.logs().matches(&seen).count() == looked {
            assert!(
                Instant::now() < deadline,
                "the change was never looked at\n{}",
                controller.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(triggered(&client, &widgets, "crd").await.len(), 1, "{}", controller.logs());
}

/// A CRD annotated `kube-svm.io/auto-migrate: "false"` is left to the operator.
#[tokio::test]
async fn the_opt_out_annotation_is_respected() {
    let (_control_plane, client, watched, controller) = setup(&[], 10, &[]).await;
    let opted_out = WidgetCrd::new("optout", false);
    opted_out.create(&client, "v1").await;
    opted_out.seed(&client, "v1", &[None], 10).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let annotate =
        serde_json::json!({ "metadata": { "annotations": { OPT_OUT_ANNOTATION: "false" } } });
    crds.patch(&opted_out.name(), &Default::default(), &kube::api::Patch::Merge(&annotate))
        .await
        .expect("annotated");

    opted_out.set_storage_version(&client, "v2").await;
    watched.set_storage_version(&client, "v2").await;
    // The trigger is alive: the other CRD gets its migration.
    wait_for_triggered(&client, &watched, 1, &controller).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        triggered(&client, &opted_out, "crd").await.is_empty(),
        "no migration for the opted-out CRD"
    );
    assert_eq!(stored_versions(&client, &opted_out).await, ["v1", "v2"]);
}

/// The encoding check starts when the storage switch is seen, not when a migration starts: a
/// migration created after the settle period has passed finds it done (its evidence says the
/// check began before the migration existed), and succeeds and prunes.
#[tokio::test]
async fn the_encoding_check_starts_at_the_storage_switch() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::new("early", false);
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 50).await;
    let controller = KubeSvm::start(
        &control_plane,
        "controller",
        &[
            "controller",
            "--leader-elect=false",
            "--crd-trigger=false",
            "--storage-version-settle=4",
        ],
    )
    .await;
    widgets.set_storage_version(&client, "v2").await;
    // Longer than the settle period, before any migration exists.
    tokio::time::sleep(Duration::from_secs(6)).await;
    crate::support::migrations::create_migration(&client, "late", &widgets.group, "widgets").await;
    let done = wait_terminal(&client, "late", &controller).await;
    assert_eq!(Phase::of(&done), Phase::Succeeded, "{:?}", done.status);
    assert_eq!(pruned(&done).0, "True", "{:?}", pruned(&done));
    let evidence =
        done.status.as_ref().and_then(|s| s.target.clone()).and_then(|t| t.encoding_evidence);
    let evidence = evidence.expect("evidence recorded");
    let began: k8s_openapi::jiff::Timestamp = evidence
        .split("checked from ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no start in {evidence}"));
    let created = done.metadata.creation_timestamp.clone().expect("created").0;
    assert!(began < created, "the check began at {began}, the migration was created at {created}");
}

/// A CRD deleted and created again through the same history (created at v1, switched to v2)
/// needs a migration of the same state as the one the CRD trigger made for the CRD deleted,
/// which still exists, Succeeded. That one was for the other CRD: the trigger creates another
/// for this one, and its objects end in v2, in etcd, with `storedVersions` pruned.
#[tokio::test]
async fn a_crd_created_again_through_the_same_history_is_migrated_again() {
    let (control_plane, client, widgets, controller) = setup(&[], 20, &[]).await;
    widgets.set_storage_version(&client, "v2").await;
    let first = wait_for_triggered(&client, &widgets, 1, &controller).await;
    let done = wait_terminal(&client, &first.name_any(), &controller).await;
    assert_eq!(Phase::of(&done), Phase::Succeeded, "{:?}", done.status);

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(&widgets.name(), &Default::default()).await.expect("the CRD is deleted");
    let deadline = Instant::now() + Duration::from_secs(60);
    while crds.get_opt(&widgets.name()).await.expect("read").is_some() {
        assert!(Instant::now() < deadline, "the CRD was never deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 30).await;
    widgets.set_storage_version(&client, "v2").await;

    let second = wait_for_triggered(&client, &widgets, 2, &controller).await;
    assert_ne!(second.name_any(), first.name_any());
    let done = wait_terminal(&client, &second.name_any(), &controller).await;
    assert_eq!(Phase::of(&done), Phase::Succeeded, "{:?}", done.status);
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 30).await;
    assert_eq!(stored_versions(&client, &widgets).await, ["v2"]);
}

/// A storage switch made while the controller works through the CRDs it found switched when it
/// started (the catch-up, annotated `kube-svm.io/backlog`) takes the next turn to write: it is
/// pruned while the catch-up still runs, not after all of it.
#[tokio::test]
async fn a_switch_made_during_the_catch_up_writes_before_it() {
    const FOUND: usize = 4;
    const OBJECTS: usize = 400;
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let found: Vec<WidgetCrd> =
        (0..FOUND).map(|i| WidgetCrd::new(&format!("found{i}"), false)).collect();
    for widgets in &found {
        widgets.create(&client, "v1").await;
        widgets.seed(&client, "v1", &[None], OBJECTS).await;
        widgets.set_storage_version(&client, "v2").await;
    }
    let late = WidgetCrd::new("late", false);
    late.create(&client, "v1").await;
    late.seed(&client, "v1", &[None], 20).await;
    // One turn to write, so that the order of the turns shows.
    let args = [
        "controller",
        "--leader-elect=false",
        "--crd-trigger=true",
        "--storage-version-settle=1",
        "--concurrency=1",
    ];
    let controller = KubeSvm::start(&control_plane, "controller", &args).await;
    let mut caught_up = Vec::new();
    for widgets in &found {
        caught_up.push(wait_for_triggered(&client, widgets, 1, &controller).await.name_any());
    }
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    let terminal = || async {
        let mut terminal = 0;
        for name in &caught_up {
            let migration = api.get(name).await.expect("exists");
            terminal += usize::from(Phase::of(&migration).is_terminal());
        }
        terminal
    };
    // The catch-up is under way: one of it has ended.
    let deadline = Instant::now() + Duration::from_secs(120);
    while terminal().await == 0 {
        assert!(Instant::now() < deadline, "the catch-up never began\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    late.set_storage_version(&client, "v2").await;
    let switched = wait_for_triggered(&client, &late, 1, &controller).await;
    let done = wait_terminal(&client, &switched.name_any(), &controller).await;
    let behind = FOUND - terminal().await;
    assert_eq!(Phase::of(&done), Phase::Succeeded, "{:?}", done.status);
    assert_eq!(stored_versions(&client, &late).await, ["v2"]);
    late.assert_all_stored_as(&control_plane.etcd(), "v2", 20).await;
    assert!(behind > 0, "the switch waited for all of the catch-up\n{}", controller.logs());

    // Only the catch-up is marked, and it all ends pruned too.
    let backlog = |m: &StorageVersionMigration| {
        m.annotations().get(BACKLOG_ANNOTATION).map(String::as_str) == Some("true")
    };
    assert!(!backlog(&done), "{:?}", done.metadata.annotations);
    for (widgets, name) in found.iter().zip(&caught_up) {
        let done = wait_terminal(&client, name, &controller).await;
        assert!(backlog(&done), "{:?}", done.metadata.annotations);
        assert_eq!(Phase::of(&done), Phase::Succeeded, "{:?}", done.status);
        assert_eq!(stored_versions(&client, widgets).await, ["v2"]);
        widgets.assert_all_stored_as(&control_plane.etcd(), "v2", OBJECTS).await;
    }
}
