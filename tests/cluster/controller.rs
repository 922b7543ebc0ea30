//! `kube-svm controller` as a real process against a real control plane: upstream migrations
//! succeed, kills and signals lose nothing, deletion stops work, one leader at a time, parallel
//! and serial scheduling, and malformed migrations fail fast.
//!
//! Each test runs its own control plane: a controller acts on every migration it can see.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::{Api, Client};
use kube_svm::api::Phase;
use kube_svm::api::{
    GroupVersionResource, StorageVersionMigration, StorageVersionMigrationSpec,
    WRITE_TO_STATUS_ANNOTATION,
};
use serde_json::json;

use crate::engine::reject_updates_of_frozen;
use crate::support::Scenario;
use crate::support::fixtures::WidgetCrd;
use crate::support::invariant::Census;
use crate::support::migrations::{
    create_migration, has_event, phase_is, processed_at_least, progress, wait_for,
};
use crate::support::process::KubeSvm;
use crate::support::{CONTROLLER_NAMESPACE, ControlPlane};

/// A private control plane with kube-svm's CRDs and `count` widgets stored at v1, storage v2.
async fn setup(count: usize) -> (ControlPlane, Client, WidgetCrd) {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::stale(&client, "ctl", count).await;
    (control_plane, client, widgets)
}

/// A migration written exactly as for kube-storage-version-migrator succeeds.
#[tokio::test]
async fn an_upstream_migration_succeeds() {
    let (control_plane, client, widgets) = setup(300).await;
    let controller =
        KubeSvm::start(&control_plane, "controller", &["controller", "--leader-elect=false"]).await;
    let yaml = format!(
        "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageVersionMigration\nmetadata:\n  name: upstream\nspec:\n  resource:\n    group: {}\n    version: v1\n    resource: widgets\n",
        widgets.group
    );
    let migration: StorageVersionMigration = serde_yaml_ng::from_str(&yaml).expect("valid");
    Api::<StorageVersionMigration>::all(client.clone())
        .create(&PostParams::default(), &migration)
        .await
        .expect("created");

    let done = wait_for(
        &client,
        "upstream",
        Duration::from_secs(60),
        &[&controller],
        phase_is(Phase::Succeeded),
    )
    .await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.conditions[0].type_, "Succeeded");
    assert_eq!(
        status
            .conditions
            .iter()
            .filter(|c| ["Running", "Succeeded", "Failed"].contains(&c.type_.as_str()))
            .count(),
        1
    );
    let counts = progress(&done);
    assert_eq!(
        (counts.processed, counts.rewritten, counts.failed, counts.remaining),
        (300, 300, 0, Some(0))
    );
    assert!(status.start_time.is_some() && status.completion_time.is_some());
    assert_eq!(
        status.target.and_then(|t| t.storage_version_hash),
        Some(kube_svm::rules::storage_hash::storage_version_hash(&widgets.group, "v2", "Widget"))
    );
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 300).await;
    for reason in ["Started", "Succeeded"] {
        assert!(has_event(&client, "upstream", reason).await, "{reason}");
    }
}

/// SIGKILL mid-migration, then a new controller: it resumes from the checkpoint, so at most one
/// page is written twice, and the counts stay exact.
#[tokio::test]
async fn a_killed_controller_resumes_from_its_checkpoint() {
    let (control_plane, client, widgets) = setup(600).await;
    let slow = [
        "controller",
        "--leader-elect=false",
        "--page-size=20",
        "--writes-in-flight=1",
        "--kube-api-qps=150",
        "--checkpoint-interval=0",
    ];
    let mut first = KubeSvm::start(&control_plane, "first", &slow).await;
    create_migration(&client, "killed", &widgets.group, "widgets").await;
    wait_for(&client, "killed", Duration::from_secs(60), &[&first], processed_at_least(200)).await;
    first.signal("KILL");
    first.wait(Duration::from_secs(5)).expect("killed");
    let checkpointed = wait_for(&client, "killed", Duration::from_secs(1), &[], |_| true).await;
    assert_eq!(Phase::of(&checkpointed), Phase::Running);
    assert!(progress(&checkpointed).processed < 600, "killed before the end");

    let second = KubeSvm::start(&control_plane, "second", &slow).await;
    let done = wait_for(
        &client,
        "killed",
        Duration::from_secs(90),
        &[&second],
        phase_is(Phase::Succeeded),
    )
    .await;
    let counts = progress(&done);
    assert_eq!((counts.processed, counts.failed), (600, 0), "{counts:?}");
    // Objects rewritten after the last checkpoint are found current on the second pass.
    assert!(counts.already_current <= 20, "at most one page redone: {counts:?}");
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 600).await;
    assert!(has_event(&client, "killed", "Resumed").await);
}

/// SIGTERM: the controller checkpoints, releases its Lease and exits 0 within seconds.
#[tokio::test]
async fn sigterm_checkpoints_releases_the_lease_and_exits() {
    let (control_plane, client, widgets) = setup(600).await;
    let mut controller = KubeSvm::start(
        &control_plane,
        "controller",
        &[
            "controller",
            "--leader-elect=true",
            "--identity=only",
            "--page-size=20",
            "--writes-in-flight=1",
            "--kube-api-qps=50",
            "--kube-api-burst=1",
            "--checkpoint-interval=60",
        ],
    )
    .await;
    create_migration(&client, "terminated", &widgets.group, "widgets").await;
    wait_for(
        &client,
        "terminated",
        Duration::from_secs(60),
        &[&controller],
        phase_is(Phase::Running),
    )
    .await;
    // A few pages in, as etcd shows; no progress is written before the end (the interval is a
    // minute). One write at a time, through a fair window, finishes objects in list order: with
    // 60 rewritten, at least the first two pages of 20 are done whatever a stop drops in flight.
    let etcd = control_plane.etcd();
    let rewritten = widgets.api_version("v2");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Census::of(&etcd, &widgets).await.count(&rewritten) < 60 {
        assert!(Instant::now() < deadline, "60 widgets rewritten within a minute");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), CONTROLLER_NAMESPACE);
    let holder = |lease: Lease| lease.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder(leases.get("kube-svm").await.expect("lease")), Some("only".into()));

    controller.signal("TERM");
    let exit = controller.wait(Duration::from_secs(10)).expect("exits within seconds");
    assert!(exit.success(), "exit status {exit}: {}", controller.logs());
    let stopped = wait_for(&client, "terminated", Duration::from_secs(1), &[], |_| true).await;
    assert_eq!(Phase::of(&stopped), Phase::Running, "left for the next leader");
    let status = stopped.status.expect("status");
    let checkpoint = status.checkpoint.expect("a checkpoint");
    assert!(!checkpoint.continue_token.is_empty(), "the checkpoint says where to resume");
    // The checkpoint interval is a minute: this progress was written on the way out.
    assert!(status.progress.expect("progress").processed >= 40);
    assert_eq!(
        holder(leases.get("kube-svm").await.expect("lease")),
        None,
        "the lease was released"
    );
}

/// Deleting a running migration stops its writes.
#[tokio::test]
async fn deleting_a_migration_stops_its_writes() {
    let (control_plane, client, widgets) = setup(600).await;
    let controller = KubeSvm::start(
        &control_plane,
        "controller",
        &[
            "controller",
            "--leader-elect=false",
            "--page-size=20",
            "--writes-in-flight=1",
            "--kube-api-qps=100",
            "--kube-api-burst=1",
        ],
    )
    .await;
    create_migration(&client, "deleted", &widgets.group, "widgets").await;
    wait_for(&client, "deleted", Duration::from_secs(60), &[&controller], processed_at_least(100))
        .await;
    Api::<StorageVersionMigration>::all(client.clone())
        .delete("deleted", &Default::default())
        .await
        .expect("deleted");

    // First the controller says it stopped; only then is "nothing more happens" meaningful.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !controller.logs().contains("migration deleted; stopped") {
        assert!(Instant::now() < deadline, "the task never stopped\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let etcd = control_plane.etcd();
    let census = || async { Census::of(&etcd, &widgets).await };
    let stopped = census().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(census().await, stopped, "no writes after the task stopped");
    let migrated = stopped.count(&widgets.api_version("v2"));
    assert!((100..600).contains(&migrated), "stopped before the end: {stopped:?}");
}

/// Different resources run in parallel, the same resource one after another, and a migration
/// that fails (admission rejections) does not hold up the others.
#[tokio::test]
async fn migrations_are_scheduled_per_resource() {
    let (control_plane, client, slow) = setup(600).await;
    let quick = WidgetCrd::stale(&client, "quick", 50).await;
    let frozen = WidgetCrd::new("frozen", false);
    frozen.create(&client, "v1").await;
    frozen.seed(&client, "v1", &[None], 20).await;
    let label = serde_json::json!({ "metadata": { "labels": { "frozen": "true" } } });
    frozen
        .api(&client, "v1", None)
        .patch("w-3", &Default::default(), &kube::api::Patch::Merge(&label))
        .await
        .expect("labelled");
    reject_updates_of_frozen(&client, &frozen.group).await;
    frozen.set_storage_version(&client, "v2").await;

    let controller = KubeSvm::start(
        &control_plane,
        "controller",
        &[
            "controller",
            "--leader-elect=false",
            "--concurrency=2",
            "--page-size=50",
            "--kube-api-qps=150",
        ],
    )
    .await;
    create_migration(&client, "slow-1", &slow.group, "widgets").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    create_migration(&client, "slow-2", &slow.group, "widgets").await;
    create_migration(&client, "quick", &quick.group, "widgets").await;
    create_migration(&client, "frozen", &frozen.group, "widgets").await;

    let timeout = Duration::from_secs(90);
    let failed =
        wait_for(&client, "frozen", timeout, &[&controller], phase_is(Phase::Failed)).await;
    let message =
        failed.status.as_ref().and_then(|s| s.conditions[0].message.clone()).unwrap_or_default();
    assert!(message.starts_with("1 of 20 objects could not be migrated"), "{message}");
    assert!(message.contains("frozen objects cannot be updated"), "{message}");
    let quick_done =
        wait_for(&client, "quick", timeout, &[&controller], phase_is(Phase::Succeeded)).await;
    let first =
        wait_for(&client, "slow-1", timeout, &[&controller], phase_is(Phase::Succeeded)).await;
    let second =
        wait_for(&client, "slow-2", timeout, &[&controller], phase_is(Phase::Succeeded)).await;

    let time = |m: &StorageVersionMigration, completion: bool| {
        let status = m.status.as_ref().expect("status");
        let time = if completion { &status.completion_time } else { &status.start_time };
        time.as_ref().expect("recorded").0
    };
    assert!(time(&second, false) >= time(&first, true), "the same resource runs one after another");
    assert!(time(&quick_done, false) < time(&first, true), "another resource runs alongside");
    assert_eq!(progress(&second).already_current, 600, "the second found nothing left to do");
}

/// Malformed migrations end Failed within seconds, saying what is wrong.
#[tokio::test]
async fn malformed_migrations_fail_fast_with_the_reason() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let controller = KubeSvm::start(
        &control_plane,
        "controller",
        &["controller", "--leader-elect=false", "--concurrency=4"],
    )
    .await;
    let cases = [
        ("empty", "", "", "no resource named: spec.resource.resource is empty"),
        ("unknown", "", "nosuchthings", "the apiserver serves no resource \"nosuchthings\" in v1"),
        (
            "subresource",
            "",
            "pods/status",
            "\"pods/status\" is a subresource; name the resource itself",
        ),
        (
            "no-patch",
            "",
            "bindings",
            "bindings does not support the verbs [\"list\", \"patch\"], which migration needs",
        ),
        (
            "no-group",
            "no.such.group",
            "widgets",
            "the apiserver does not serve API group \"no.such.group\"",
        ),
    ];
    for (name, group, resource, _) in cases {
        create_migration(&client, name, group, resource).await;
    }
    for (name, _, _, expected) in cases {
        let failed = wait_for(
            &client,
            name,
            Duration::from_secs(15),
            &[&controller],
            phase_is(Phase::Failed),
        )
        .await;
        let condition = &failed.status.expect("status").conditions[0];
        assert_eq!(condition.reason.as_deref(), Some("InvalidResource"));
        assert_eq!(condition.message.as_deref(), Some(expected), "{name}");
    }
}

/// Writing through the status subresource gets past a policy that guards the resource itself:
/// `--write-to-status` uses it wherever a resource has one and writes the others directly; the
/// annotation insists on it and fails a migration whose resource has none.
#[tokio::test]
async fn writes_can_go_through_the_status_subresource() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::new("status", false);
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 50).await;
    // Frozen while still stored at v1: labelling is itself a write.
    let api = widgets.api(&client, "v1", None);
    let freeze = serde_json::json!({ "metadata": { "labels": { "frozen": "true" } } });
    for i in 0..10 {
        let name = format!("w-{i}");
        api.patch(&name, &Default::default(), &Patch::Merge(&freeze)).await.expect("frozen");
    }
    widgets.set_storage_version(&client, "v2").await;
    reject_updates_of_frozen(&client, &widgets.group).await;
    let controller = KubeSvm::start(
        &control_plane,
        "controller",
        &["controller", "--leader-elect=false", "--write-to-status"],
    )
    .await;

    create_migration(&client, "widgets", &widgets.group, "widgets").await;
    create_migration(&client, "configmaps", "", "configmaps").await;
    let mut strict = StorageVersionMigration::new(
        "strict-configmaps",
        StorageVersionMigrationSpec {
            resource: GroupVersionResource {
                group: String::new(),
                version: "v1".into(),
                resource: "configmaps".into(),
            },
            continue_token: None,
        },
    );
    strict.metadata.annotations =
        Some([(WRITE_TO_STATUS_ANNOTATION.to_owned(), "true".to_owned())].into());
    Api::<StorageVersionMigration>::all(client.clone())
        .create(&PostParams::default(), &strict)
        .await
        .expect("created");

    let timeout = Duration::from_secs(60);
    let done =
        wait_for(&client, "widgets", timeout, &[&controller], phase_is(Phase::Succeeded)).await;
    let counts = progress(&done);
    assert_eq!((counts.rewritten, counts.failed), (50, 0), "the frozen widgets too");
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 50).await;
    wait_for(&client, "configmaps", timeout, &[&controller], phase_is(Phase::Succeeded)).await;
    let failed =
        wait_for(&client, "strict-configmaps", timeout, &[&controller], phase_is(Phase::Failed))
            .await;
    let message = failed.status.and_then(|s| s.conditions[0].message.clone());
    assert_eq!(message.as_deref(), Some("configmaps has no status subresource to write through"));
}

/// A migration left Running with a checkpoint taken under another storage version starts over
/// from the first object, and its old continue token is gone from status at once: a controller
/// stopped right after must not resume past objects this run has not written.
#[tokio::test]
async fn a_checkpoint_of_another_storage_version_is_forgotten() {
    let (control_plane, client, widgets) = setup(400).await;
    let page = widgets
        .api(&client, "v1", None)
        .list_metadata(&kube::api::ListParams::default().limit(100))
        .await
        .expect("listed");
    let old_token = page.metadata.continue_.clone().expect("more pages");
    create_migration(&client, "stale-checkpoint", &widgets.group, "widgets").await;
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    let mut migration = api.get("stale-checkpoint").await.expect("exists");
    migration.status = Some(
        serde_json::from_value(serde_json::json!({
            "conditions": [{ "type": "Running", "status": "True", "reason": "Migrating" }],
            "checkpoint": { "continueToken": old_token },
            "progress": { "listed": 100, "processed": 100, "rewritten": 100 },
            "target": { "storageVersionHash": "an-older-hash" },
            "listedFromStart": true,
        }))
        .expect("a valid status"),
    );
    api.replace_status("stale-checkpoint", &PostParams::default(), &migration)
        .await
        .expect("the status is written");

    let controller = KubeSvm::start(
        &control_plane,
        "controller",
        &[
            "controller",
            "--leader-elect=false",
            "--page-size=20",
            "--kube-api-qps=40",
            "--kube-api-burst=1",
            "--checkpoint-interval=600",
        ],
    )
    .await;
    let restarted =
        wait_for(&client, "stale-checkpoint", Duration::from_secs(60), &[&controller], |m| {
            m.status
                .as_ref()
                .and_then(|s| s.target.as_ref())
                .and_then(|t| t.crd_generation)
                .is_some()
        })
        .await;
    let status = restarted.status.clone().expect("status");
    let token = status.checkpoint.map(|c| c.continue_token).unwrap_or_default();
    assert_ne!(token, old_token, "the old run's continue token survived");
    assert_eq!(status.progress.map(|p| p.processed), Some(0), "counts start over");
    assert!(has_event(&client, "stale-checkpoint", "Restarted").await);

    let done = wait_for(
        &client,
        "stale-checkpoint",
        Duration::from_secs(90),
        &[&controller],
        phase_is(Phase::Succeeded),
    )
    .await;
    assert_eq!((progress(&done).processed, progress(&done).rewritten), (400, 400));
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 400).await;
}

/// At most one migration per resource, whoever runs it: while the in-tree migrator (nothing runs
/// it here; its object's status says Running) migrates the same resource, kube-svm's migration
/// waits, says why in an Event, and writes nothing; once the in-tree one ends, it runs.
#[tokio::test]
async fn waits_while_the_in_tree_migrator_migrates_the_same_resource() {
    let (control_plane, client, widgets) = setup(20).await;
    let in_tree: Api<DynamicObject> =
        Api::all_with(client.clone(), &kube_svm::apiserver::in_tree::api_resource());
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "storagemigration.k8s.io/v1",
        "kind": "StorageVersionMigration",
        "metadata": { "name": "in-tree-widgets" },
        "spec": { "resource": { "group": widgets.group, "resource": "widgets" } },
    }))
    .expect("a valid object");
    in_tree.create(&PostParams::default(), &object).await.expect("created");
    let conditions = |running: &str, succeeded: &str| {
        let condition = |type_: &str, status: &str| {
            json!({
                "type": type_, "status": status, "reason": type_, "message": "set by a test",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            })
        };
        json!({ "status": { "conditions": [
            condition("Running", running), condition("Succeeded", succeeded),
        ]}})
    };
    let params = PatchParams::default();
    in_tree
        .patch_status("in-tree-widgets", &params, &Patch::Merge(&conditions("True", "False")))
        .await
        .expect("status written");

    let controller = KubeSvm::start(&control_plane, "controller", &["controller"]).await;
    create_migration(&client, "after-in-tree", &widgets.group, "widgets").await;
    assert!(
        has_event(&client, "after-in-tree", "WaitingForInTreeMigrator").await,
        "{}",
        controller.logs()
    );
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    let waiting = api.get("after-in-tree").await.expect("the migration");
    assert_eq!(Phase::of(&waiting), Phase::New);
    let etcd = control_plane.etcd();
    assert_eq!(Census::of(&etcd, &widgets).await.count(&widgets.api_version("v1")), 20);

    in_tree
        .patch_status("in-tree-widgets", &params, &Patch::Merge(&conditions("False", "True")))
        .await
        .expect("status written");
    let timeout = Duration::from_secs(60);
    wait_for(&client, "after-in-tree", timeout, &[&controller], phase_is(Phase::Succeeded)).await;
    widgets.assert_all_stored_as(&etcd, "v2", 20).await;
}
