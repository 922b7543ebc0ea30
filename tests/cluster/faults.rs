//! The fault suite: real faults from the real thing, each scenario ending with the safety
//! invariant checked in etcd ([`invariant::check`]). Scenarios that do not disturb the control
//! plane share one, with one `kube-svm controller` (CRD trigger on) acting on all of them, as in a
//! cluster; the others (apiserver restarts, leader faults, the combined run) each start their own.
//!
//! `KUBE_SVM_FAULT_SCALE` multiplies the object counts (default 1, what CI runs).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kube_svm::api::{Phase, StorageVersionMigration};
use serde_json::json;
use tokio::sync::OnceCell;

use crate::engine::reject_updates_of_frozen;
use crate::support::Scenario;
use crate::support::admission;
use crate::support::fixtures::{
    KEY1, KEY2, WidgetCrd, create_namespace, encrypt_secrets, install_kube_svm_crds,
    secrets_under_key1, unique, vanish_namespace,
};
use crate::support::invariant::{self, Census, Outcome};
use crate::support::migrations::{
    self, is_terminal, processed_at_least, progress, state, wait_for, wait_for_triggered,
};
use crate::support::process::KubeSvm;
use crate::support::webhook::{Answer, Webhook};
use crate::support::{AuditEvent, CONTROLLER_NAMESPACE, ControlPlane};

/// How long any one migration of a scenario may take.
const FINISH: Duration = Duration::from_secs(180);

/// Object counts are multiplied by this (`KUBE_SVM_FAULT_SCALE`, default 1).
fn scale(count: usize) -> usize {
    let factor = std::env::var("KUBE_SVM_FAULT_SCALE").ok().and_then(|s| s.parse().ok());
    count * factor.unwrap_or(1usize).max(1)
}

/// The control plane the undisturbing scenarios share, and the controller acting on it. The
/// watch cache is off so that etcd compaction expires continue tokens.
struct FaultPlane {
    control_plane: ControlPlane,
    controller: KubeSvm,
}

static PLANE: OnceCell<FaultPlane> = OnceCell::const_new();

async fn plane() -> &'static FaultPlane {
    PLANE
        .get_or_init(|| async {
            let control_plane =
                ControlPlane::start(&["--watch-cache=false"]).await.expect("control plane");
            let client = control_plane.client().await;
            install_kube_svm_crds(&client).await;
            let controller = KubeSvm::start(
                &control_plane,
                "faults-controller",
                &[
                    "controller",
                    "--leader-elect=false",
                    "--crd-trigger=true",
                    "--concurrency=4",
                    "--page-size=50",
                    "--kube-api-qps=150",
                    "--kube-api-burst=10",
                    "--checkpoint-interval=0",
                    "--storage-version-settle=1",
                ],
            )
            .await;
            // Shared statics are never dropped: the watchdog stops the controller at exit.
            control_plane.adopt(controller.pid());
            FaultPlane { control_plane, controller }
        })
        .await
}

/// A fresh widget CRD holding `count` widgets stored at v1 (spread over `namespaces` when given,
/// which makes it namespaced).
async fn stale_widgets(
    client: &Client,
    test: &str,
    count: usize,
    namespaces: &[&str],
) -> WidgetCrd {
    let widgets = WidgetCrd::new(test, !namespaces.is_empty());
    widgets.create(client, "v1").await;
    if namespaces.is_empty() {
        widgets.seed(client, "v1", &[None], count).await;
    } else {
        for namespace in namespaces {
            create_namespace(client, namespace).await;
        }
        let spread: Vec<Option<&str>> = namespaces.iter().map(|n| Some(*n)).collect();
        widgets.seed(client, "v1", &spread, count / namespaces.len()).await;
    }
    widgets
}

/// Switches `widgets` to storage v2 and returns the name of the migration the trigger creates.
async fn switch_and_wait_for_migration(
    client: &Client,
    widgets: &WidgetCrd,
    controller: &KubeSvm,
) -> String {
    widgets.set_storage_version(client, "v2").await;
    wait_for_triggered(client, widgets, 1, controller).await.name_any()
}

/// Waits until the migration ends, then checks the invariant.
async fn finish(
    control_plane: &ControlPlane,
    client: &Client,
    widgets: &WidgetCrd,
    name: &str,
    count: usize,
    controllers: &[&KubeSvm],
) -> (StorageVersionMigration, Outcome) {
    let done = wait_for(client, name, FINISH, controllers, is_terminal).await;
    let outcome = invariant::check(client, &control_plane.etcd(), widgets, name, count).await;
    (done, outcome)
}

/// Each widget's resourceVersion and managedFields, by name.
async fn widget_states(
    client: &Client,
    widgets: &WidgetCrd,
) -> BTreeMap<String, (String, serde_json::Value)> {
    let listed =
        widgets.api(client, "v2", None).list(&ListParams::default()).await.expect("listed");
    listed
        .items
        .into_iter()
        .map(|w| {
            let fields = serde_json::to_value(&w.metadata.managed_fields).expect("serializable");
            (w.name_any(), (w.resource_version().unwrap_or_default(), fields))
        })
        .collect()
}

/// Waits until `process` has logged `line`.
async fn wait_for_log(process: &KubeSvm, line: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !process.logs().contains(line) {
        assert!(Instant::now() < deadline, "never logged {line:?}\n{}", process.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts a migration succeeded, pruned storedVersions to [v2], and left exactly `count`
/// widgets, all stored as v2.
fn assert_migrated_and_pruned(
    widgets: &WidgetCrd,
    done: &StorageVersionMigration,
    outcome: &Outcome,
    count: usize,
) {
    assert_eq!(outcome.phase, Phase::Succeeded, "{:?}", done.status);
    assert!(outcome.pruned, "{:?}", done.status);
    assert_eq!(outcome.stored_versions, ["v2"]);
    assert_eq!(outcome.census.total(), count, "{:?}", outcome.census);
    assert_eq!(outcome.census.count(&widgets.api_version("v2")), count);
    assert_eq!(progress(done).failed, 0);
}

/// The status of the CRD's `StorageMigrating` condition, if it has one.
async fn storage_migrating(client: &Client, widgets: &WidgetCrd) -> Option<String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get(&widgets.name())
        .await
        .expect("the CRD exists");
    let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
    conditions.into_iter().find(|c| c.type_ == "StorageMigrating").map(|c| c.status)
}

/// Waits until the CRD's `StorageMigrating` condition is `status`.
async fn wait_storage_migrating(client: &Client, widgets: &WidgetCrd, status: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while storage_migrating(client, widgets).await.as_deref() != Some(status) {
        assert!(Instant::now() < deadline, "StorageMigrating never became {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- Scenarios on the shared control plane -------------------------------------------------

/// Empty is normal: a CRD switched while it holds no object is migrated and pruned, and a
/// built-in resource with no object (the apiserver answers `"items": null`) succeeds.
#[tokio::test]
async fn an_empty_resource_succeeds_and_an_empty_crd_is_pruned() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let widgets = WidgetCrd::new("empty", false);
    widgets.create(&client, "v1").await;
    let name = switch_and_wait_for_migration(&client, &widgets, &plane.controller).await;
    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &name, 0, &[&plane.controller]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, 0);
    assert_eq!(progress(&done).processed, 0);

    let limitranges = unique("limitranges");
    migrations::create_migration(&client, &limitranges, "", "limitranges").await;
    let done = wait_for(&client, &limitranges, FINISH, &[&plane.controller], is_terminal).await;
    assert_eq!(Phase::of(&done), Phase::Succeeded, "{:?}", done.status);
    assert_eq!((progress(&done).listed, progress(&done).processed), (0, 0));
}

/// Every object deleted while the migration runs: it succeeds, and prunes. A webhook holds the
/// migration's first writes until every object is deleted, so the run meets them deleted
/// however fast it is.
#[tokio::test]
async fn a_crd_emptied_mid_run_succeeds_and_is_pruned() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let count = scale(600);
    let widgets = stale_widgets(&client, "emptied", count, &[]).await;
    let webhook = Webhook::on_widgets(&client, &widgets, 30).await;
    webhook.answer_all(Answer::Hold);
    let name = switch_and_wait_for_migration(&client, &widgets, &plane.controller).await;
    let deadline = Instant::now() + FINISH;
    while webhook.held() == 0 {
        assert!(Instant::now() < deadline, "no write reached the webhook");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    widgets
        .api(&client, "v1", None)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("every widget is deleted");
    webhook.release();

    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &name, 0, &[&plane.controller]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, 0);
    let counts = progress(&done);
    assert_eq!(counts.processed, counts.listed);
    assert!(counts.skipped > 0 && counts.listed < count as u64 + 1, "{counts:?}");
    webhook.remove().await;
}

/// Writers update a tenth of the objects, and others are deleted, while the migration runs:
/// every update is kept, every survivor ends in v2, and storedVersions is pruned.
#[tokio::test]
async fn writers_and_deletions_mid_run_lose_nothing() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let count = scale(800);
    let widgets = stale_widgets(&client, "writers", count, &[]).await;
    let name = switch_and_wait_for_migration(&client, &widgets, &plane.controller).await;
    wait_for(&client, &name, FINISH, &[&plane.controller], processed_at_least(50)).await;

    let api = widgets.api(&client, "v2", None);
    let updated: Vec<String> = (0..count).step_by(10).map(|i| format!("w-{i}")).collect();
    let deleted: Vec<String> =
        (0..count).filter(|i| i % 7 == 3 && i % 10 != 0).map(|i| format!("w-{i}")).collect();
    for round in 1..=3 {
        for name in &updated {
            let patch = json!({ "spec": { "round": round } });
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("updated");
        }
    }
    for name in &deleted {
        api.delete(name, &DeleteParams::default()).await.expect("deleted");
    }

    let (done, outcome) = finish(
        &plane.control_plane,
        &client,
        &widgets,
        &name,
        count - deleted.len(),
        &[&plane.controller],
    )
    .await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count - deleted.len());
    for name in &updated {
        let object = api.get(name).await.expect("exists");
        assert_eq!(object.data["spec"]["round"], json!(3), "{name} kept its last update");
    }
}

/// etcd compacted three times mid-run (continue tokens expire, HTTP 410): the migration goes on
/// from the apiserver's inconsistent token, succeeds, and prunes.
#[tokio::test]
async fn compaction_mid_run_is_survived() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let count = scale(800);
    let widgets = stale_widgets(&client, "compaction", count, &[]).await;
    let name = switch_and_wait_for_migration(&client, &widgets, &plane.controller).await;
    let etcd = plane.control_plane.etcd();
    for processed in [50, 250, 450] {
        wait_for(&client, &name, FINISH, &[&plane.controller], processed_at_least(processed)).await;
        etcd.compact(etcd.revision().await.expect("revision")).await.expect("compacted");
    }
    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &name, count, &[&plane.controller]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
    assert!(
        plane.controller.logs().contains("continue token expired"),
        "a compaction expired a continue token"
    );
}

/// A namespace vanishes mid-run while its objects stay in etcd: the apiserver still accepts
/// writes to them, so they are rewritten, and the whole resource ends in v2.
#[tokio::test]
async fn a_namespace_deleted_mid_run_strands_nothing() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let (kept, vanished) = (unique("kept"), unique("vanished"));
    let count = scale(600);
    let widgets = stale_widgets(&client, "namespace", count, &[&kept, &vanished]).await;
    let name = switch_and_wait_for_migration(&client, &widgets, &plane.controller).await;
    wait_for(&client, &name, FINISH, &[&plane.controller], processed_at_least(50)).await;
    vanish_namespace(&client, &vanished).await;

    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &name, count, &[&plane.controller]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
}

/// Admission rejects a few objects: the migration fails listing every one of them, and
/// storedVersions is kept. Once the rejection is lifted, a new migration succeeds and prunes.
#[tokio::test]
async fn rejected_objects_keep_stored_versions_until_a_new_migration_succeeds() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let count = scale(300);
    let widgets = stale_widgets(&client, "rejected", count, &[]).await;
    let api = widgets.api(&client, "v1", None);
    let frozen: Vec<String> = (0..5).map(|i| format!("w-{}", i * 50 + 7)).collect();
    let label = json!({ "metadata": { "labels": { "frozen": "true" } } });
    for name in &frozen {
        api.patch(name, &PatchParams::default(), &Patch::Merge(&label)).await.expect("labelled");
    }
    reject_updates_of_frozen(&client, &widgets.group).await;
    let name = switch_and_wait_for_migration(&client, &widgets, &plane.controller).await;

    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &name, count, &[&plane.controller]).await;
    assert_eq!(outcome.phase, Phase::Failed);
    assert_eq!(
        (outcome.pruned, outcome.pruned_reason.as_deref()),
        (false, Some("MigrationFailed"))
    );
    assert_eq!(outcome.stored_versions, ["v1", "v2"]);
    assert_eq!(outcome.census.count(&widgets.api_version("v1")), frozen.len());
    assert_eq!(outcome.census.count(&widgets.api_version("v2")), count - frozen.len());
    let status = done.status.clone().expect("status");
    let mut listed: Vec<String> = status.failed_objects.iter().map(|f| f.name.clone()).collect();
    listed.sort();
    let mut expected = frozen.clone();
    expected.sort();
    assert_eq!(listed, expected, "every rejected object is listed");
    assert!(status.failed_objects.iter().all(|f| f.code == 422 && f.reason == "Invalid"));
    assert_eq!(storage_migrating(&client, &widgets).await.as_deref(), Some("False"), "unmarked");

    admission::lift(&client, &format!("freeze-{}", widgets.group)).await;
    // The policy stops applying once the apiserver's informers see the binding go.
    let deadline = Instant::now() + Duration::from_secs(30);
    let touch = json!({ "metadata": { "annotations": { "touched": "yes" } } });
    while api.patch(&frozen[0], &PatchParams::default(), &Patch::Merge(&touch)).await.is_err() {
        assert!(Instant::now() < deadline, "the rejection never lifted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let retry = unique("retry");
    migrations::create_migration(&client, &retry, &widgets.group, "widgets").await;
    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &retry, count, &[&plane.controller]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
}

/// The version a migration writes through (a custom resource's storage version, whatever
/// version the migration names) stops being served mid-run: every write is answered 404 for the
/// resource, not for an object. That is not "all deleted": the migration fails, says why, and
/// prunes nothing.
#[tokio::test]
async fn a_version_unserved_mid_run_fails_the_migration_and_prunes_nothing() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let count = scale(1000);
    let widgets = stale_widgets(&client, "unserved", count, &[]).await;
    widgets.opt_out(&client).await;
    widgets.set_storage_version(&client, "v2").await;
    let name = unique("unserved");
    migrations::create(&client, &name, &widgets.group, "v1", "widgets", None).await;
    wait_for(&client, &name, FINISH, &[&plane.controller], processed_at_least(50)).await;
    widgets.set_served(&client, "v2", false).await;

    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &name, count, &[&plane.controller]).await;
    let (phase, reason, message) = state(&done);
    assert_eq!((phase.as_str(), reason.as_str()), ("Failed", "ResourceNotServed"), "{message}");
    assert!(message.contains("is no longer served at"), "{message}");
    assert!(!outcome.pruned);
    assert_eq!(outcome.pruned_reason.as_deref(), Some("MigrationFailed"));
    assert_eq!(outcome.stored_versions, ["v1", "v2"]);
    assert!(outcome.census.count(&widgets.api_version("v1")) > 0, "{:?}", outcome.census);
    assert!(progress(&done).processed < count as u64, "no object counted as deleted en masse");
}

/// A migration taken over from kube-storage-version-migrator resumes at its continue token:
/// it succeeds, but objects before the token were never written by kube-svm, so storedVersions
/// is kept, and etcd shows why.
#[tokio::test]
async fn a_foreign_continue_token_is_resumed_but_never_pruned() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let count = scale(500);
    let widgets = stale_widgets(&client, "foreign", count, &[]).await;
    widgets.opt_out(&client).await;
    widgets.set_storage_version(&client, "v2").await;
    let first_page = widgets
        .api(&client, "v1", None)
        .list_metadata(&ListParams::default().limit(100))
        .await
        .expect("listed");
    let token = first_page.metadata.continue_.clone().expect("more pages");
    let name = unique("foreign");
    migrations::create(&client, &name, &widgets.group, "v1", "widgets", Some(token)).await;

    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &name, count, &[&plane.controller]).await;
    assert_eq!(outcome.phase, Phase::Succeeded, "{:?}", done.status);
    assert_eq!(done.status.as_ref().and_then(|s| s.listed_from_start), Some(false));
    assert_eq!((outcome.pruned, outcome.pruned_reason.as_deref()), (false, Some("PartialListing")));
    assert_eq!(outcome.stored_versions, ["v1", "v2"]);
    assert_eq!(outcome.census.count(&widgets.api_version("v1")), 100, "the first page was skipped");
    assert_eq!(outcome.census.count(&widgets.api_version("v2")), count - 100);
}

/// A migration deleted while it runs stops, and unmarks its CRD.
#[tokio::test]
async fn a_deleted_migration_unmarks_its_crd() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let widgets = stale_widgets(&client, "deleted-migration", scale(1000), &[]).await;
    widgets.opt_out(&client).await;
    widgets.set_storage_version(&client, "v2").await;
    let name = unique("deleted");
    migrations::create_migration(&client, &name, &widgets.group, "widgets").await;
    wait_for(&client, &name, FINISH, &[&plane.controller], processed_at_least(50)).await;
    assert_eq!(storage_migrating(&client, &widgets).await.as_deref(), Some("True"));
    Api::<StorageVersionMigration>::all(client.clone())
        .delete(&name, &DeleteParams::default())
        .await
        .expect("deleted");
    wait_storage_migrating(&client, &widgets, "False").await;
}

/// The status write that starts a migration is refused (an admission policy on the status
/// subresource): the migration is taken up again later, and once the refusal is lifted, it
/// runs and succeeds.
#[tokio::test]
async fn a_refused_status_write_is_retried() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let widgets = stale_widgets(&client, "refused", scale(100), &[]).await;
    widgets.opt_out(&client).await;
    widgets.set_storage_version(&client, "v2").await;
    let name = unique("refused");
    admission::deny_updates(
        &client,
        &name,
        "migration.k8s.io",
        &["storageversionmigrations/status"],
        &format!("object.metadata.name != '{name}'"),
        "status writes refused by a test",
        None,
    )
    .await;
    // Give the apiserver's informers time to see the policy: the controller's own log says when
    // a status write was refused.
    tokio::time::sleep(Duration::from_secs(2)).await;
    migrations::create_migration(&client, &name, &widgets.group, "widgets").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !plane.controller.logs().contains("status writes refused by a test") {
        assert!(Instant::now() < deadline, "the status write was never refused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    assert_eq!(api.get(&name).await.expect("exists").status, None, "nothing was recorded");
    admission::lift(&client, &name).await;

    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &name, scale(100), &[&plane.controller])
            .await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, scale(100));
}

/// A validating webhook answers some writes with its own 409 ("object is locked") and others
/// with a 404 that names the object: the apiserver passes both through, code, reason and
/// details. Neither is believed: those objects were not written by anyone else nor deleted, so
/// they failed, with the webhook's words; the migration fails and storedVersions is kept, as
/// etcd shows. Once the webhook goes, a new migration succeeds and prunes.
#[tokio::test]
async fn a_webhook_answering_409_or_404_is_not_believed() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let count = scale(300);
    let widgets = stale_widgets(&client, "lying", count, &[]).await;
    let webhook = Webhook::on_widgets(&client, &widgets, 5).await;
    let locked: Vec<String> = (0..30).map(|i| format!("w-{}", i * 7 + 2)).collect();
    let missing: Vec<String> = (0..10).map(|i| format!("w-{}", i * 7 + 5)).collect();
    webhook.answer(
        locked.clone(),
        Answer::Deny { code: 409, reason: "Conflict".into(), message: "object is locked".into() },
    );
    webhook.answer(missing.clone(), Answer::NotFound);
    let name = switch_and_wait_for_migration(&client, &widgets, &plane.controller).await;

    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &name, count, &[&plane.controller]).await;
    assert_eq!(outcome.phase, Phase::Failed, "{:?}", done.status);
    assert_eq!(outcome.stored_versions, ["v1", "v2"], "storedVersions kept");
    let refused = locked.len() + missing.len();
    assert_eq!(outcome.census.count(&widgets.api_version("v1")), refused, "{:?}", outcome.census);
    assert_eq!(outcome.census.count(&widgets.api_version("v2")), count - refused);
    let counts = progress(&done);
    assert_eq!((counts.failed, counts.skipped), (refused as u64, 0), "{counts:?}");
    let status = done.status.clone().expect("status");
    let conflict = status.failed_objects.iter().find(|f| f.code == 409).expect("a 409 listed");
    assert!(conflict.message.contains("object is locked"), "{conflict:?}");
    for failed in &status.failed_objects {
        let expected = match locked.contains(&failed.name) {
            true => (409, "Conflict"),
            false => (404, "NotFound"),
        };
        assert_eq!((failed.code, failed.reason.as_str()), expected, "{failed:?}");
        assert!(locked.contains(&failed.name) || missing.contains(&failed.name), "{failed:?}");
    }

    webhook.remove_from_widgets(&client, &widgets, &locked[0]).await;
    let again = unique("unlocked");
    migrations::create_migration(&client, &again, &widgets.group, "widgets").await;
    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &again, count, &[&plane.controller]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
}

/// A webhook whose backend accepts connections and never answers (every write gets a 500 after
/// the webhook's 2 s timeout): the migration does not hold its slot for hours spending five
/// attempts on each object; it ends Failed, WritesFailing, saying what the apiserver answered,
/// and prunes nothing.
#[tokio::test]
async fn a_webhook_that_never_answers_ends_the_migration_early() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let count = scale(400);
    let widgets = stale_widgets(&client, "hanging", count, &[]).await;
    let webhook = Webhook::on_widgets(&client, &widgets, 2).await;
    webhook.answer_all(Answer::Hang);
    let name = switch_and_wait_for_migration(&client, &widgets, &plane.controller).await;

    // Before, after twelve minutes it had processed none of 400 objects; now a few minutes.
    let done =
        wait_for(&client, &name, Duration::from_secs(360), &[&plane.controller], is_terminal).await;
    let outcome =
        invariant::check(&client, &plane.control_plane.etcd(), &widgets, &name, count).await;
    let (phase, reason, message) = state(&done);
    assert_eq!((phase.as_str(), reason.as_str()), ("Failed", "WritesFailing"), "{message}");
    assert!(message.contains("keep failing") && message.contains("500"), "{message}");
    assert_eq!(outcome.stored_versions, ["v1", "v2"]);
    assert_eq!(outcome.census.count(&widgets.api_version("v1")), count, "nothing was written");
    webhook.remove().await;
}

/// A webhook restarting for eight seconds (every write refused at once with 500, as the
/// apiserver answers when it cannot call a webhook whose failure policy is Fail) is a blip, not
/// writes that keep failing: objects refused for seconds neither end the run nor fail; it waits
/// the blip out, each object retried, and succeeds, every widget in v2 in etcd.
#[tokio::test]
async fn a_webhook_restarting_for_a_few_seconds_is_waited_out() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let count = scale(600);
    let widgets = stale_widgets(&client, "blip", count, &[]).await;
    let webhook = Webhook::on_widgets(&client, &widgets, 5).await;
    let name = switch_and_wait_for_migration(&client, &widgets, &plane.controller).await;
    let controllers = [&plane.controller];
    wait_for(&client, &name, FINISH, &controllers, processed_at_least(50)).await;
    let (reason, message) = ("InternalError".into(), "failed calling webhook: restarting".into());
    let before = webhook.reviews();
    webhook.answer_all(Answer::Deny { code: 500, reason, message });
    // Refused for eight seconds from the first refusal (a webhook's pod restarting), and until a
    // hundred writes were (what ended a run at once), or until the run ended.
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut first_refusal: Option<Instant> = None;
    loop {
        let refused = webhook.reviews() - before;
        if refused > 0 && first_refusal.is_none() {
            first_refusal = Some(Instant::now());
        }
        let held = first_refusal.is_some_and(|since| since.elapsed() >= Duration::from_secs(8));
        if held && refused >= 100 {
            break;
        }
        let now = migrations.get(&name).await.expect("the migration");
        if is_terminal(&now) {
            break;
        }
        assert!(Instant::now() < deadline, "{refused} writes refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    webhook.allow_all();
    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &name, count, &controllers).await;
    webhook.remove().await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
}

/// Webhook answers can be kilobytes: refusals with 100 KB messages for 25 objects must not make
/// the migration's status outgrow what the apiserver stores (it would stay Running forever).
/// Every message kept is cut, the migration ends Failed, and the status stays small.
#[tokio::test]
async fn huge_refusals_keep_the_status_small() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let count = scale(100);
    let widgets = stale_widgets(&client, "huge", count, &[]).await;
    let webhook = Webhook::on_widgets(&client, &widgets, 5).await;
    let refused: Vec<String> = (0..25).map(|i| format!("w-{}", i * 4)).collect();
    let message = format!("refused: {}", "a very long explanation ".repeat(4_400));
    webhook.answer(refused.clone(), Answer::Deny { code: 422, reason: "Invalid".into(), message });
    let name = switch_and_wait_for_migration(&client, &widgets, &plane.controller).await;

    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &name, count, &[&plane.controller]).await;
    assert_eq!(outcome.phase, Phase::Failed, "{:?}", done.status);
    assert_eq!(progress(&done).failed, refused.len() as u64);
    assert_eq!(outcome.census.count(&widgets.api_version("v1")), refused.len());
    let status = done.status.clone().expect("status");
    assert!(!status.failed_objects.is_empty());
    for failed in &status.failed_objects {
        assert!(failed.message.len() <= 512, "{} bytes kept", failed.message.len());
        assert!(failed.message.contains("refused: a very long"), "{}", failed.message);
    }
    let size = serde_json::to_vec(&status).expect("serializes").len();
    assert!(size < 32 * 1024, "the status takes {size} bytes");
    webhook.remove().await;
}

/// The storage version switched back and forth while a migration runs (v2 -> v1 -> v2): the
/// objects it handled while the apiserver encoded v1 were left in v1 (their writes were elided
/// as already current). Each switch voids the writes so far: the run starts over from the first
/// object, so it ends Succeeded with every object in v2, as etcd shows, and prunes.
#[tokio::test]
async fn a_storage_switch_there_and_back_mid_run_starts_over() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let count = scale(2000);
    let widgets = stale_widgets(&client, "flip", count, &[]).await;
    let name = switch_and_wait_for_migration(&client, &widgets, &plane.controller).await;
    let controllers = [&plane.controller];
    let before = wait_for(&client, &name, FINISH, &controllers, processed_at_least(100)).await;
    let processed = progress(&before).processed;

    widgets.set_storage_version(&client, "v1").await;
    // Objects handled while v1 is the storage version are encoded in v1 (or a restart said so).
    let restarted_or_went_on = move |m: &StorageVersionMigration| {
        let status = m.status.as_ref();
        status.and_then(|s| s.restarts).is_some_and(|n| n > 0)
            || status
                .and_then(|s| s.progress.as_ref())
                .is_some_and(|p| p.processed >= processed + 100)
    };
    wait_for(&client, &name, FINISH, &controllers, restarted_or_went_on).await;
    widgets.set_storage_version(&client, "v2").await;

    let (done, outcome) =
        finish(&plane.control_plane, &client, &widgets, &name, count, &controllers).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
    let restarts = done.status.as_ref().and_then(|s| s.restarts).unwrap_or(0);
    assert!(restarts >= 1, "the run started over: {:?}", done.status);
    assert!(migrations::has_event(&client, &name, "Restarted").await);
}

/// A migration changes nothing but the encoding: objects created and given a status with
/// server-side apply at v1 (so `managedFields` name v1), with labels and annotations, then
/// migrated to storage v2 through the resource at the preferred version (v3, not the storage
/// version), through the `status` subresource, and through v1 named in the migration. Each
/// object read back is the same as before, every field and `managedFields` entry, save its
/// resourceVersion; etcd holds all of them in v2.
#[tokio::test]
async fn a_migration_changes_nothing_but_the_encoding() {
    let plane = plane().await;
    let client = plane.control_plane.client().await;
    let count = scale(30);
    for (path, version, to_status) in
        [("preferred", "", false), ("status", "", true), ("v1", "v1", false)]
    {
        let widgets = WidgetCrd::new(&format!("content-{path}"), false);
        widgets.create(&client, "v1").await;
        widgets.opt_out(&client).await;
        let api = widgets.api(&client, "v1", None);
        for i in 0..count {
            let name = format!("w-{i}");
            let object = json!({
                "apiVersion": widgets.api_version("v1"), "kind": WidgetCrd::KIND,
                "metadata": {
                    "name": name, "labels": { "tier": "gold" },
                    "annotations": { "note": format!("object {i}") },
                },
                "spec": { "size": i, "owner": "applier" },
            });
            let apply = PatchParams::apply("test-applier");
            api.patch(&name, &apply, &Patch::Apply(&object)).await.expect("applied");
            let status = json!({
                "apiVersion": widgets.api_version("v1"), "kind": WidgetCrd::KIND,
                "metadata": { "name": name }, "status": { "phase": "Ready", "seen": i },
            });
            let apply = PatchParams::apply("status-writer");
            api.patch_status(&name, &apply, &Patch::Apply(&status)).await.expect("status applied");
        }
        widgets.set_storage_version(&client, "v2").await;
        let read = widgets.api(&client, "v2", None);
        let snapshot = |list: kube::core::ObjectList<kube::core::DynamicObject>| {
            list.items
                .into_iter()
                .map(|mut object| {
                    object.metadata.resource_version = None;
                    (
                        object.metadata.name.clone().unwrap_or_default(),
                        serde_json::to_value(object).expect("JSON"),
                    )
                })
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let before = snapshot(read.list(&ListParams::default()).await.expect("listed"));
        assert_eq!(before.len(), count);
        assert!(
            before
                .values()
                .all(|o| o["metadata"]["managedFields"].as_array().is_some_and(|m| m.len() == 2)),
            "two managers, for the spec and the status: {before:?}"
        );

        let name = unique(&format!("content-{path}"));
        let mut migration = kube_svm::api::StorageVersionMigration::new(
            &name,
            kube_svm::api::StorageVersionMigrationSpec {
                resource: kube_svm::api::GroupVersionResource {
                    group: widgets.group.clone(),
                    version: version.into(),
                    resource: "widgets".into(),
                },
                continue_token: None,
            },
        );
        if to_status {
            migration.metadata.annotations = Some(
                [(kube_svm::api::WRITE_TO_STATUS_ANNOTATION.to_owned(), "true".to_owned())].into(),
            );
        }
        Api::<StorageVersionMigration>::all(client.clone())
            .create(&PostParams::default(), &migration)
            .await
            .expect("created");
        let (done, outcome) =
            finish(&plane.control_plane, &client, &widgets, &name, count, &[&plane.controller])
                .await;
        assert_migrated_and_pruned(&widgets, &done, &outcome, count);
        assert_eq!(progress(&done).rewritten, count as u64, "{path}: every object rewritten");

        let after = snapshot(read.list(&ListParams::default()).await.expect("listed"));
        for (name, was) in &before {
            assert_eq!(after.get(name), Some(was), "{path}: {name} changed beyond its encoding");
        }
    }
}

// ---- Scenarios with a control plane of their own ----------------------------------------

/// Secrets after an encryption key rotation, re-encrypted by the controller while some are
/// deleted and others created: the migration succeeds, and the invariant holds for a built-in
/// resource as for a custom one: every Secret in etcd, counted exactly, is under the new key.
#[tokio::test]
async fn a_key_rotation_leaves_every_secret_under_the_new_key() {
    let count = scale(300);
    let (control_plane, namespace) = secrets_under_key1(count).await;
    control_plane
        .restart_apiserver(&[&encrypt_secrets(&control_plane, &[KEY2, KEY1])])
        .await
        .expect("restarts with key2 first");
    let client = control_plane.client().await;
    install_kube_svm_crds(&client).await;
    let controller = KubeSvm::start(
        &control_plane,
        "controller",
        &["controller", "--leader-elect=false", "--page-size=20", "--kube-api-qps=60"],
    )
    .await;
    let name = unique("rotation");
    migrations::create_migration(&client, &name, "", "secrets").await;
    wait_for(&client, &name, FINISH, &[&controller], processed_at_least(50)).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let deleted: Vec<String> =
        (0..count).filter(|i| i % 10 == 3).map(|i| format!("s-{i}")).collect();
    for secret in &deleted {
        secrets.delete(secret, &DeleteParams::default()).await.expect("deleted");
    }
    let added = 5;
    for i in 0..added {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": format!("n-{i}") }, "stringData": { "token": "new" },
        }))
        .expect("valid");
        secrets.create(&PostParams::default(), &secret).await.expect("created");
    }

    let done = wait_for(&client, &name, FINISH, &[&controller], is_terminal).await;
    let left = count - deleted.len() + added;
    let etcd = control_plane.etcd();
    let (phase, census) =
        invariant::check_built_in(&client, &etcd, "/registry/secrets/", &name, left, "aescbc:key2")
            .await;
    assert_eq!(phase, Phase::Succeeded, "{:?}", done.status);
    assert_eq!(census.count("aescbc:key2"), left, "{census:?}");
    assert_eq!(progress(&done).failed, 0);
}

/// The apiservers cannot be shown to encode the new storage version (here the StorageVersion
/// API says they still encode v1): the migration runs but keeps storedVersions, and says why.
/// An operator who has checked can vouch for the encoding with an annotation on a new
/// migration: that one prunes, and says on whose word.
#[tokio::test]
async fn an_unconfirmed_encoding_keeps_stored_versions_unless_an_operator_vouches() {
    use k8s_openapi::api::apiserverinternal::v1alpha1::StorageVersion;
    let Scenario { control_plane, client } = Scenario::own(&[
        "--feature-gates=StorageVersionAPI=true,APIServerIdentity=true",
        "--runtime-config=internal.apiserver.k8s.io/v1alpha1=true",
    ])
    .await;
    let count = scale(100);
    let widgets = stale_widgets(&client, "unconfirmed", count, &[]).await;
    widgets.opt_out(&client).await;
    widgets.set_storage_version(&client, "v2").await;
    // kube-apiserver publishes StorageVersions for built-in resources only: this one, written
    // here, says the apiservers all still encode v1.
    let api: Api<StorageVersion> = Api::all(client.clone());
    let entry = format!("{}.widgets", widgets.group);
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": entry } })).expect("valid"),
        )
        .await
        .expect("created");
    let mut stale = created.clone();
    stale.status = Some(serde_json::from_value(json!({
        "storageVersions": [{ "apiServerID": "kube-apiserver-test", "encodingVersion": widgets.api_version("v1"),
                              "decodableVersions": [widgets.api_version("v1"), widgets.api_version("v2")] }],
        "commonEncodingVersion": widgets.api_version("v1"),
        "conditions": [{ "type": "AllEncodingVersionsEqual", "status": "True", "reason": "Test",
                         "lastTransitionTime": "2026-01-01T00:00:00Z", "message": "test" }],
    })).expect("a valid status"));
    api.replace_status(&entry, &PostParams::default(), &stale)
        .await
        .expect("the status is written");
    let controller = KubeSvm::start(
        &control_plane,
        "controller",
        &["controller", "--leader-elect=false", "--storage-version-wait=3"],
    )
    .await;

    let name = unique("unconfirmed");
    migrations::create_migration(&client, &name, &widgets.group, "widgets").await;
    let (done, outcome) =
        finish(&control_plane, &client, &widgets, &name, count, &[&controller]).await;
    assert_eq!(outcome.phase, Phase::Succeeded, "{:?}", done.status);
    assert_eq!(
        (outcome.pruned, outcome.pruned_reason.as_deref()),
        (false, Some("EncodingUnconfirmed"))
    );
    assert_eq!(outcome.stored_versions, ["v1", "v2"]);
    let evidence =
        done.status.as_ref().and_then(|s| s.target.clone()).and_then(|t| t.encoding_evidence);
    let evidence = evidence.expect("evidence recorded");
    assert!(
        evidence.contains("common encoding version")
            && evidence.contains("kube-svm.io/encoding-confirmed"),
        "{evidence}"
    );
    assert!(migrations::has_event(&client, &name, "EncodingUnconfirmed").await);

    let vouched = unique("vouched");
    let mut migration = StorageVersionMigration::new(&vouched, done.spec.clone());
    migration.metadata.annotations =
        Some([(kube_svm::api::ENCODING_CONFIRMED_ANNOTATION.to_owned(), "true".to_owned())].into());
    Api::<StorageVersionMigration>::all(client.clone())
        .create(&PostParams::default(), &migration)
        .await
        .expect("created");
    let (done, outcome) =
        finish(&control_plane, &client, &widgets, &vouched, count, &[&controller]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
    let evidence =
        done.status.as_ref().and_then(|s| s.target.clone()).and_then(|t| t.encoding_evidence);
    assert!(evidence.is_some_and(|e| e.contains("the operator")), "{:?}", done.status);
    assert!(migrations::has_event(&client, &vouched, "EncodingOverridden").await);
}

/// An aggregated API whose backend is missing answers discovery with 503: its migrations are
/// retried a few times without holding a slot, then fail with the reason, while two good
/// migrations created after them run and succeed.
#[tokio::test]
async fn an_unavailable_aggregated_api_fails_its_migrations_without_blocking_others() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let good: Vec<WidgetCrd> = vec![
        WidgetCrd::stale(&client, "good", scale(200)).await,
        WidgetCrd::stale(&client, "good", scale(200)).await,
    ];
    crate::support::fixtures::missing_aggregated_api(&client, "missing.svm.example.com").await;
    let controller = KubeSvm::start(
        &control_plane,
        "controller",
        &["controller", "--leader-elect=false", "--concurrency=2", "--discovery-attempts=3"],
    )
    .await;
    for bad in ["bad-1", "bad-2"] {
        migrations::create(&client, bad, "missing.svm.example.com", "v1", "things", None).await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for (i, widgets) in good.iter().enumerate() {
        migrations::create_migration(&client, &format!("good-{i}"), &widgets.group, "widgets")
            .await;
    }

    let mut good_done = Vec::new();
    for (i, widgets) in good.iter().enumerate() {
        let name = format!("good-{i}");
        let done = wait_for(&client, &name, FINISH, &[&controller], is_terminal).await;
        assert_eq!(Phase::of(&done), Phase::Succeeded, "{:?}", done.status);
        widgets.assert_all_stored_as(&control_plane.etcd(), "v2", scale(200)).await;
        good_done.push(done);
    }
    for bad in ["bad-1", "bad-2"] {
        let failed = wait_for(&client, bad, FINISH, &[&controller], is_terminal).await;
        let (phase, reason, message) = state(&failed);
        assert_eq!((phase.as_str(), reason.as_str()), ("Failed", "DiscoveryFailed"), "{message}");
        assert!(message.contains("503") && message.contains("3 tries"), "{message}");
        let failed_at =
            failed.status.as_ref().and_then(|s| s.completion_time.clone()).expect("time");
        for done in &good_done {
            let finished =
                done.status.as_ref().and_then(|s| s.completion_time.clone()).expect("time");
            assert!(finished.0 <= failed_at.0, "the good migrations did not wait for the bad ones");
        }
        let reasons = migrations::event_reasons(&client, bad).await;
        assert!(reasons.contains(&"DiscoveryRetry".to_owned()), "{reasons:?}");
    }
}

/// A control plane of the test's own for a scenario that disturbs it, `count` widgets of `test`
/// stored at v1, and a controller with the CRD trigger that records every page, pressing the
/// apiserver as `pace` says.
async fn own_plane(
    test: &str,
    count: usize,
    pace: &[&str],
) -> (ControlPlane, Client, WidgetCrd, KubeSvm) {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = stale_widgets(&client, test, count, &[]).await;
    let mut args = vec![
        "controller",
        "--leader-elect=false",
        "--crd-trigger=true",
        "--kube-api-burst=10",
        "--checkpoint-interval=0",
    ];
    args.extend_from_slice(pace);
    let controller = KubeSvm::start(&control_plane, "controller", &args).await;
    (control_plane, client, widgets, controller)
}

/// kube-apiserver is killed and restarted three times during a migration: the controller waits
/// for it each time instead of failing objects, and the migration succeeds and prunes.
#[tokio::test]
async fn apiserver_restarts_mid_run_fail_no_object() {
    let count = scale(3000);
    let pace = ["--page-size=50", "--kube-api-qps=50"];
    let (control_plane, client, widgets, controller) = own_plane("restarts", count, &pace).await;
    let name = switch_and_wait_for_migration(&client, &widgets, &controller).await;
    // A restart whenever the run has moved on a little since the last one, while it runs: on a
    // loaded machine a restart takes long enough for much of the run to happen meanwhile.
    let (mut kills, mut last) = (0, 0);
    while kills < 3 {
        let moved_on =
            move |m: &StorageVersionMigration| is_terminal(m) || processed_at_least(last + 100)(m);
        let now = wait_for(&client, &name, FINISH, &[&controller], moved_on).await;
        if is_terminal(&now) {
            break;
        }
        last = progress(&now).processed;
        let (before, _) = control_plane.pids();
        control_plane.kill_and_restart_apiserver().await.expect("the apiserver restarts");
        assert_ne!(control_plane.pids().0, before, "a new kube-apiserver process serves");
        kills += 1;
    }
    let (done, outcome) =
        finish(&control_plane, &client, &widgets, &name, count, &[&controller]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
    assert!(kills >= 2, "the run outlasted at least two restarts ({kills})");
    let pauses = controller.logs().matches("the apiserver is not ready; pausing requests").count();
    assert!(
        pauses >= kills,
        "the controller waited out each restart ({pauses} pauses, {kills} kills)"
    );
}

/// etcd restored from a backup mid-run (a snapshot taken after 500 of 3,000 objects, restored
/// the documented way at 2,000, the controller left running): the objects written after the
/// snapshot are back in v1, and the migration's status is back where it was. The run must not
/// end Succeeded, nor prune, on writes the restore undid: it is done again, and etcd agrees.
#[tokio::test]
async fn an_etcd_restore_mid_run_is_never_taken_for_success() {
    let count = scale(3000);
    let pace = ["--pace=fast", "--page-size=100", "--kube-api-qps=60"];
    let (control_plane, client, widgets, controller) = own_plane("restored", count, &pace).await;
    let name = switch_and_wait_for_migration(&client, &widgets, &controller).await;
    wait_for(&client, &name, FINISH, &[&controller], processed_at_least(count as u64 / 6)).await;
    let snapshot = control_plane.snapshot_etcd("backup.db").expect("a snapshot is saved");
    let at_restore =
        wait_for(&client, &name, FINISH, &[&controller], processed_at_least(count as u64 * 2 / 3))
            .await;
    assert!(!is_terminal(&at_restore), "the run ended before the restore: {:?}", at_restore.status);
    control_plane.restore_etcd(&snapshot).await.expect("etcd is restored");
    let restored = Census::of(&control_plane.etcd(), &widgets).await;
    assert!(
        restored.count(&widgets.api_version("v1")) > 0,
        "the restore brought objects back in v1: {restored:?}"
    );

    let (done, outcome) =
        finish(&control_plane, &client, &widgets, &name, count, &[&controller]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
    let logs = controller.logs();
    assert!(logs.contains("the cluster changed mid-run; starting over"), "{logs}");
}

/// Two controllers; the leader is killed mid-page: the standby takes over, resumes from the
/// checkpoint and finishes, and storedVersions is pruned.
#[tokio::test]
async fn a_killed_leader_is_replaced_by_its_standby() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let count = scale(800);
    let widgets = stale_widgets(&client, "failover", count, &[]).await;
    let extra = ["--page-size=20", "--kube-api-qps=100"];
    let (mut leader, standby) =
        leader_and_standby(&control_plane, &client, ["leader", "standby"], 4, &extra).await;
    let name = switch_and_wait_for_migration(&client, &widgets, &leader).await;
    wait_for(&client, &name, FINISH, &[&leader], processed_at_least(100)).await;
    assert!(!standby.logs().contains("became the leader"), "the standby waits");

    leader.signal("KILL");
    leader.wait(Duration::from_secs(5)).expect("killed");
    let (done, outcome) =
        finish(&control_plane, &client, &widgets, &name, count, &[&standby]).await;
    assert_eq!(lease_holder(&client).await.as_deref(), Some("standby"));
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
    assert_eq!(progress(&done).processed, count as u64);
}

/// The leader is frozen (SIGSTOP) for longer than its lease: the standby takes over and
/// finishes. When the old leader wakes up, its term is long over: nothing it does takes effect,
/// though its code had been mid-migration. Judged by what took effect, not by the answers the
/// apiserver gave: every widget's resourceVersion as the standby left it, the finished migration
/// untouched, every widget's managedFields as seeded. A request the old leader was already sending
/// when it froze may still reach the apiserver after the takeover (no client can take back bytes it
/// is writing), and under load its answer need not be a refusal (a 504 was seen), so answers are
/// not evidence; the audit log bounds how many such requests arrived.
#[tokio::test]
async fn a_paused_leader_writes_nothing_after_its_standby_took_over() {
    let Scenario { control_plane, client } = Scenario::audited(&[]).await;
    let count = scale(800);
    let widgets = stale_widgets(&client, "paused", count, &[]).await;
    let seeded = widget_states(&client, &widgets).await;
    // Two releases of the chart: two ServiceAccounts, so the audit log tells them apart.
    let first =
        control_plane.impersonating_kubeconfig("svm-first", CONTROLLER_NAMESPACE, &[]).await;
    let second =
        control_plane.impersonating_kubeconfig("svm-second", CONTROLLER_NAMESPACE, &[]).await;
    let args = |identity: &str| elected(identity, 4, &["--page-size=20", "--kube-api-qps=60"]);
    let leader = KubeSvm::start_as(&control_plane, "first", &strs(&args("first")), &first);
    wait_for_holder(&client, "first").await;
    let standby = KubeSvm::start_as(&control_plane, "second", &strs(&args("second")), &second);
    let name = switch_and_wait_for_migration(&client, &widgets, &leader).await;
    wait_for(&client, &name, FINISH, &[&leader], processed_at_least(100)).await;

    leader.signal("STOP");
    wait_for_holder(&client, "second").await;
    let (done, outcome) =
        finish(&control_plane, &client, &widgets, &name, count, &[&standby]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
    let acquired = lease(&client).await.spec.and_then(|s| s.acquire_time).expect("acquired").0;
    let finished = widget_states(&client, &widgets).await;

    leader.signal("CONT");
    // Positive signals that the old leader ran again and stopped: every task of its controller
    // ended (it says so once they have), and the apiserver answered every request of its.
    wait_for_log(&leader, "lost leadership: every write stopped").await;
    let first_user = "system:serviceaccount:kube-svm:svm-first-kube-svm";
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let unanswered = control_plane.audit_unanswered();
        if !unanswered.iter().any(|e| e.sender() == first_user) {
            break;
        }
        assert!(Instant::now() < deadline, "requests never answered: {unanswered:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let after =
        Api::<StorageVersionMigration>::all(client.clone()).get(&name).await.expect("exists");
    assert_eq!(
        after.resource_version(),
        done.resource_version(),
        "the finished migration is untouched"
    );
    let now = widget_states(&client, &widgets).await;
    let changed: Vec<&String> = now.keys().filter(|w| now.get(*w) != finished.get(*w)).collect();
    assert!(
        changed.is_empty() && now.len() == count,
        "written after the standby finished: {changed:?}"
    );
    let rewritten: Vec<&String> = now
        .iter()
        .filter(|(w, (_, fields))| seeded.get(*w).map(|s| &s.1) != Some(fields))
        .map(|(w, _)| w)
        .collect();
    assert!(rewritten.is_empty(), "managedFields changed: {rewritten:?}");

    let events = control_plane.audit_events();
    assert!(
        events.iter().any(|e| e.sender() == first_user && e.received() < acquired),
        "the old leader's writes are in the audit log"
    );
    let late: Vec<_> = events
        .iter()
        .filter(|e| e.sender() == first_user && e.writes() && e.received() > acquired)
        .filter(|e| e.object_ref.as_ref().is_none_or(|o| o.resource != "leases"))
        .collect();
    // At most what it had in flight when it froze: its write window (64 by default) and one
    // status write.
    let codes: Vec<Option<u16>> = late.iter().map(|e| e.code()).collect();
    assert!(late.len() <= 64 + 1, "the old leader kept sending after the takeover: {codes:?}");
}

/// The Lease is deleted while the leader is mid-migration (an operator cleaning up, a namespace
/// recreated): the standby creates a new one at once, but the old leader's term may still be
/// open (it stops only at its renew deadline), so the new leader holds the lease, renewing it,
/// for a whole lease duration before its first write. The audit log says who wrote what, when:
/// the new leader's first write comes a lease duration after it created the Lease, after the old
/// leader's last; and the migration, resumed, succeeds.
#[tokio::test]
async fn a_leader_that_creates_the_lease_waits_a_lease_duration_before_writing() {
    /// Long enough that a straggling write of the old leader cannot pass for the new leader's
    /// (the old one stops at its renew deadline, two thirds of this).
    const LEASE: u32 = 12;
    let Scenario { control_plane, client } = Scenario::audited(&[]).await;
    let count = scale(800);
    let widgets = stale_widgets(&client, "deleted-lease", count, &[]).await;
    let first =
        control_plane.impersonating_kubeconfig("svm-first", CONTROLLER_NAMESPACE, &[]).await;
    let second =
        control_plane.impersonating_kubeconfig("svm-second", CONTROLLER_NAMESPACE, &[]).await;
    let args = |identity: &str| elected(identity, LEASE, &["--page-size=20", "--kube-api-qps=40"]);
    let leader = KubeSvm::start_as(&control_plane, "first", &strs(&args("first")), &first);
    wait_for_holder(&client, "first").await;
    let standby = KubeSvm::start_as(&control_plane, "second", &strs(&args("second")), &second);
    let name = switch_and_wait_for_migration(&client, &widgets, &leader).await;
    wait_for(&client, &name, FINISH, &[&leader], processed_at_least(100)).await;

    Api::<Lease>::namespaced(client.clone(), CONTROLLER_NAMESPACE)
        .delete("kube-svm", &DeleteParams::default())
        .await
        .expect("the lease is deleted");
    wait_for_holder(&client, "second").await;
    let (done, outcome) =
        finish(&control_plane, &client, &widgets, &name, count, &[&leader, &standby]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
    wait_for_log(&leader, "no longer the leader").await;

    let users = |name: &str| format!("system:serviceaccount:kube-svm:svm-{name}-kube-svm");
    let (old, new) = (users("first"), users("second"));
    let events = control_plane.audit_events();
    let is_lease = |e: &&AuditEvent| e.object_ref.as_ref().is_some_and(|o| o.resource == "leases");
    let created = events
        .iter()
        .filter(|e| e.sender() == new && e.verb == "create" && is_lease(e))
        .map(AuditEvent::received)
        .min()
        .expect("the standby created the lease");
    let writes = |user: &str| -> Vec<k8s_openapi::jiff::Timestamp> {
        let mut times: Vec<_> = events
            .iter()
            .filter(|e| e.sender() == user && e.writes() && !is_lease(e))
            .map(AuditEvent::received)
            .collect();
        times.sort();
        times
    };
    let new_first = *writes(&new).first().expect("the new leader wrote");
    let waited = new_first.duration_since(created);
    assert!(
        waited >= k8s_openapi::jiff::SignedDuration::from_secs(LEASE.into()),
        "the new leader wrote {waited:?} after creating the lease, before its old term could be over"
    );
    let old_last = *writes(&old).last().expect("the old leader wrote");
    assert!(old_last > created, "the old leader was still writing when the lease was recreated");
    assert!(old_last < new_first, "the old leader wrote after the new leader began");
}

/// kube-apiserver freezes (SIGSTOP) for longer than the lease: the leader's renewal hangs, and
/// it gives up leading, closing its fence, within its renew deadline, while the apiserver is
/// still frozen, so before anyone else could take the lease. Once the apiserver is back, one
/// leader finishes the migration and storedVersions is pruned.
#[tokio::test]
async fn a_leader_whose_apiserver_hangs_stops_before_the_lease_can_pass() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let count = scale(800);
    let widgets = stale_widgets(&client, "hung", count, &[]).await;
    let extra = ["--page-size=20", "--kube-api-qps=60"];
    let (leader, standby) =
        leader_and_standby(&control_plane, &client, ["leader", "standby"], 6, &extra).await;
    let name = switch_and_wait_for_migration(&client, &widgets, &leader).await;
    wait_for(&client, &name, FINISH, &[&leader], processed_at_least(100)).await;

    let frozen = Timestamp::now();
    control_plane.signal_apiserver("STOP");
    // Longer than the lease (6 s): by then the leader must have given up on its own.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let gave_up = leader.logs().contains("could not renew the lease in time: no longer the leader");
    control_plane.signal_apiserver("CONT");
    let thawed = Timestamp::now();
    assert!(gave_up, "the leader kept leading with a frozen apiserver\n{}", leader.logs());
    let line = leader
        .logs()
        .lines()
        .find(|l| l.contains("could not renew the lease in time"))
        .map(str::to_owned)
        .expect("logged");
    let at: Timestamp =
        line.split_whitespace().next().expect("a timestamp").parse().expect("RFC 3339");
    assert!(at > frozen && at < thawed, "gave up while the apiserver was frozen: {line}");

    let (done, outcome) =
        finish(&control_plane, &client, &widgets, &name, count, &[&leader, &standby]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
}

/// Everything at once: two controllers with leader election and the CRD trigger, three CRDs
/// (one namespaced, one with objects admission rejects), writers, deletions, compaction, an
/// apiserver killed and restarted, and the leader killed.
#[tokio::test]
async fn the_combined_run_keeps_the_invariant() {
    let Scenario { control_plane, client } = Scenario::own(&["--watch-cache=false"]).await;
    let count = scale(1200);
    let written = stale_widgets(&client, "combined-written", count, &[]).await;
    let namespaces = [unique("combined"), unique("combined"), unique("combined")];
    let namespace_refs: Vec<&str> = namespaces.iter().map(String::as_str).collect();
    let deleted = stale_widgets(&client, "combined-deleted", count, &namespace_refs).await;
    let rejected = stale_widgets(&client, "combined-rejected", scale(300), &[]).await;
    let label = json!({ "metadata": { "labels": { "frozen": "true" } } });
    for i in [11, 111, 211] {
        rejected
            .api(&client, "v1", None)
            .patch(&format!("w-{i}"), &PatchParams::default(), &Patch::Merge(&label))
            .await
            .expect("labelled");
    }
    reject_updates_of_frozen(&client, &rejected.group).await;
    let extra = ["--concurrency=3", "--page-size=50", "--kube-api-qps=150"];
    let (mut first, second) =
        leader_and_standby(&control_plane, &client, ["first", "second"], 4, &extra).await;
    let controllers = [&first, &second];
    let mut names = Vec::new();
    for widgets in [&written, &deleted, &rejected] {
        names.push(switch_and_wait_for_migration(&client, widgets, &first).await);
    }
    let etcd = control_plane.etcd();
    wait_for(&client, &names[0], FINISH, &controllers, processed_at_least(100)).await;

    // Writers and deletions, while etcd is compacted, the apiserver restarted and the leader
    // killed.
    let api = written.api(&client, "v2", None);
    let updated: Vec<String> = (0..count).step_by(10).map(|i| format!("w-{i}")).collect();
    let writers = async {
        for round in 1..=2 {
            for name in &updated {
                let patch = json!({ "spec": { "round": round } });
                // The apiserver restarts meanwhile: a writer retries like any client.
                while api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_err()
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    };
    let mut removed = 0;
    let deletions = async {
        let per_namespace = count / namespaces.len();
        for namespace in &namespaces {
            let api = deleted.api(&client, "v2", Some(namespace));
            for i in (0..per_namespace).filter(|i| i % 9 == 4) {
                loop {
                    match api.delete(&format!("w-{i}"), &DeleteParams::default()).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(status)) if status.code == 404 => break,
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
                removed += 1;
            }
        }
    };
    let disruptions = async {
        etcd.compact(etcd.revision().await.expect("revision")).await.expect("compacted");
        control_plane.kill_and_restart_apiserver().await.expect("the apiserver restarts");
        etcd.compact(etcd.revision().await.expect("revision")).await.expect("compacted");
        first.signal("KILL");
        first.wait(Duration::from_secs(5)).expect("killed");
    };
    tokio::join!(writers, deletions, disruptions);

    let mut outcomes = Vec::new();
    let left = [count, count - removed, scale(300)];
    for ((widgets, name), left) in [&written, &deleted, &rejected].into_iter().zip(&names).zip(left)
    {
        outcomes.push(finish(&control_plane, &client, widgets, name, left, &[&second]).await);
    }
    assert_migrated_and_pruned(&written, &outcomes[0].0, &outcomes[0].1, count);
    assert_migrated_and_pruned(&deleted, &outcomes[1].0, &outcomes[1].1, count - removed);
    let (rejected_done, rejected_outcome) = &outcomes[2];
    assert_eq!(rejected_outcome.phase, Phase::Failed, "{:?}", rejected_done.status);
    assert_eq!(rejected_outcome.stored_versions, ["v1", "v2"]);
    assert_eq!(rejected_outcome.census.count(&rejected.api_version("v1")), 3);
    assert_eq!(progress(rejected_done).failed, 3);
    for name in &updated {
        let object = api.get(name).await.expect("exists");
        assert_eq!(object.data["spec"]["round"], json!(2), "{name} kept its last update");
    }
    assert_eq!(Census::of(&etcd, &written).await.total(), count);
}

/// Arguments of an elected `kube-svm controller` replica named `identity`: a lease of `lease`
/// seconds, the CRD trigger on, progress checkpointed after every page; then `extra`.
fn elected(identity: &str, lease: u32, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> =
        ["controller", "--leader-elect=true", "--crd-trigger=true", "--checkpoint-interval=0"]
            .map(str::to_owned)
            .to_vec();
    args.push(format!("--lease-duration={lease}"));
    args.push(format!("--identity={identity}"));
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Starts the elected replica `names[0]`, waits until it leads, then starts `names[1]`.
async fn leader_and_standby(
    control_plane: &ControlPlane,
    client: &Client,
    names: [&str; 2],
    lease: u32,
    extra: &[&str],
) -> (KubeSvm, KubeSvm) {
    let [leader, standby] = names;
    let leading =
        KubeSvm::start(control_plane, leader, &strs(&elected(leader, lease, extra))).await;
    wait_for_holder(client, leader).await;
    let waiting =
        KubeSvm::start(control_plane, standby, &strs(&elected(standby, lease, extra))).await;
    (leading, waiting)
}

async fn lease(client: &Client) -> Lease {
    Api::<Lease>::namespaced(client.clone(), CONTROLLER_NAMESPACE)
        .get("kube-svm")
        .await
        .expect("the lease exists")
}

async fn lease_holder(client: &Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), CONTROLLER_NAMESPACE)
        .get_opt("kube-svm")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

/// Waits until `identity` holds the controllers' lease.
async fn wait_for_holder(client: &Client, identity: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while lease_holder(client).await.as_deref() != Some(identity) {
        assert!(Instant::now() < deadline, "{identity} never led");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The controller is down while the storage version is switched there and back (v2 -> v1 ->
/// v2) and objects it had already migrated are written meanwhile (so stored in v1 again). The
/// checkpoint names the same storage version hash, but the CRD's generation moved: the
/// migration starts over instead of resuming, ends Succeeded with every object in v2, and
/// prunes.
#[tokio::test]
async fn a_checkpoint_is_not_resumed_after_the_crd_changed() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let count = scale(600);
    let widgets = stale_widgets(&client, "resumed", count, &[]).await;
    widgets.opt_out(&client).await;
    widgets.set_storage_version(&client, "v2").await;
    let args = [
        "controller",
        "--leader-elect=false",
        "--page-size=50",
        "--kube-api-qps=100",
        "--checkpoint-interval=0",
        "--storage-version-settle=1",
    ];
    let mut first = KubeSvm::start(&control_plane, "first", &args).await;
    let name = unique("resumed");
    migrations::create_migration(&client, &name, &widgets.group, "widgets").await;
    wait_for(&client, &name, FINISH, &[&first], processed_at_least(200)).await;
    first.signal("KILL");
    first.wait(Duration::from_secs(30)).expect("the controller exits");
    let checkpointed = Api::<StorageVersionMigration>::all(client.clone()).get(&name).await;
    let checkpointed = checkpointed.expect("exists");
    let processed = progress(&checkpointed).processed;
    assert!(processed >= 200 && processed < count as u64, "{processed}");

    // Objects the checkpoint says are done, written again while v1 is the storage version.
    widgets.set_storage_version(&client, "v1").await;
    let api = widgets.api(&client, "v1", None);
    let listed = api.list_metadata(&ListParams::default().limit(50)).await.expect("listed");
    let touch = json!({ "metadata": { "annotations": { "touched": "while v1" } } });
    for object in &listed.items {
        let name = object.metadata.name.as_deref().expect("a name");
        api.patch(name, &PatchParams::default(), &Patch::Merge(&touch)).await.expect("patched");
    }
    widgets.set_storage_version(&client, "v2").await;
    let census = Census::of(&control_plane.etcd(), &widgets).await;
    assert!(census.count(&widgets.api_version("v1")) >= 50, "{census:?}");

    let second = KubeSvm::start(&control_plane, "second", &args).await;
    let (done, outcome) = finish(&control_plane, &client, &widgets, &name, count, &[&second]).await;
    assert_migrated_and_pruned(&widgets, &done, &outcome, count);
    let said = "the CRD changed since the checkpoint";
    assert!(migrations::has_event_saying(&client, &name, "Restarted", said).await);
}
