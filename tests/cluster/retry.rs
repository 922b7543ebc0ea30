//! A Failed migration run again in place: `kube-svm retry` (the real binary) against a real
//! controller, each retry token acted on once, whatever restarts follow; and the CRD trigger
//! retrying its own failed migration once the cause is gone. Each failure comes from a real
//! validating webhook that denies every write of the widgets.
//!
//! Each test runs its own control plane: a controller acts on every migration it can see.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams};
use kube_svm::api::{Phase, StorageVersionMigration};

use crate::support::fixtures::WidgetCrd;
use crate::support::invariant;
use crate::support::migrations::{
    create_migration, phase_is, state, triggered, wait_for, wait_for_triggered,
};
use crate::support::process::{KubeSvm, binary};
use crate::support::webhook::{Answer, Webhook};
use crate::support::{ControlPlane, Scenario};

/// How long one migration of a few dozen widgets may take on two loaded cores.
const FINISH: Duration = Duration::from_secs(180);

/// Denies every update of the widgets, as an admission webhook that freezes them would.
fn frozen() -> Answer {
    Answer::Deny { code: 422, reason: "Invalid".into(), message: "frozen by a test".into() }
}

/// Runs `kube-svm retry <names>` as an operator would; returns its exit code, standard output
/// and standard error.
async fn kube_svm_retry(
    control_plane: &ControlPlane,
    names: &[&str],
) -> (Option<i32>, String, String) {
    let mut command = Command::new(binary());
    command.arg("retry").args(names).arg("--kubeconfig").arg(control_plane.kubeconfig());
    command.env_remove("RUST_LOG");
    let output = tokio::task::spawn_blocking(move || command.output().expect("kube-svm runs"))
        .await
        .expect("kube-svm ran");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

fn retries(migration: &StorageVersionMigration) -> u32 {
    migration.status.as_ref().and_then(|s| s.retries).unwrap_or(0)
}

/// Failed, after at least `n` retries.
fn failed_after(n: u32) -> impl Fn(&StorageVersionMigration) -> bool {
    move |m| Phase::of(m) == Phase::Failed && retries(m) >= n
}

/// The notes of the `Retried` Events on migration `name`.
async fn retried_notes(client: &Client, name: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let selector = format!("involvedObject.name={name}");
    let list = events.list(&ListParams::default().fields(&selector)).await.expect("events");
    let retried = list.items.into_iter().filter(|e| e.reason.as_deref() == Some("Retried"));
    retried.map(|e| e.message.unwrap_or_default()).collect()
}

/// Waits up to a minute for `n` `Retried` Events on migration `name` (an Event follows the
/// status write it explains); returns their notes.
async fn wait_for_retried_notes(client: &Client, name: &str, n: usize) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let notes = retried_notes(client, name).await;
        if notes.len() >= n || tokio::time::Instant::now() > deadline {
            return notes;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A migration that a webhook fails is retried with `kube-svm retry`: while the webhook still
/// denies, it fails again, and a restarted controller does not run it a third time for the token
/// it already acted on; once the webhook is gone, a second retry succeeds, prunes storedVersions
/// and leaves every widget stored as v2 in etcd. The Events keep each outcome a retry cleared, and
/// the command refuses, exiting 1, a migration that does not exist or did not fail.
#[tokio::test]
async fn a_failed_migration_is_retried_in_place_once_per_token() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let count = 30;
    let widgets = WidgetCrd::stale(&client, "retry", count).await;
    let webhook = Webhook::on_widgets(&client, &widgets, 5).await;
    webhook.answer_all(frozen());
    let mut first =
        KubeSvm::start(&control_plane, "first", &["controller", "--leader-elect=false"]).await;
    create_migration(&client, "retried", &widgets.group, "widgets").await;
    let failed = wait_for(&client, "retried", FINISH, &[&first], phase_is(Phase::Failed)).await;
    assert_eq!(retries(&failed), 0);

    let (code, out, err) = kube_svm_retry(&control_plane, &["retried"]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(
            "storageversionmigration.migration.k8s.io/retried retry requested (kube-svm.io/retry="
        ),
        "{out}"
    );
    let again = wait_for(&client, "retried", FINISH, &[&first], failed_after(1)).await;
    let status = again.status.clone().expect("status");
    let annotations = again.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(status.retry_token.as_ref(), annotations.get("kube-svm.io/retry"), "acted on");
    assert_eq!(status.listed_from_start, Some(true), "the retry listed from the first object");
    let (_, reason, message) = state(&again);
    assert!(message.contains("frozen by a test"), "{reason}: {message}");
    let notes = wait_for_retried_notes(&client, "retried", 1).await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    let failed_reason = state(&failed).1;
    assert!(
        notes[0].starts_with("retry 1 (kube-svm.io/retry=")
            && notes[0].contains(&format!("the previous run ended Failed ({failed_reason}) after"))
            && notes[0].contains("frozen by a test"),
        "{notes:?}"
    );

    // A new controller finds the token acted on: it leaves the migration as it is. That it has
    // looked at every migration shows in a probe migration it runs to its end.
    first.signal("TERM");
    first.wait(Duration::from_secs(30)).expect("the first controller exits");
    let second =
        KubeSvm::start(&control_plane, "second", &["controller", "--leader-elect=false"]).await;
    create_migration(&client, "probe", "", "configmaps").await;
    wait_for(&client, "probe", FINISH, &[&second], phase_is(Phase::Succeeded)).await;
    let unchanged = wait_for(&client, "retried", FINISH, &[&second], |_| true).await;
    assert_eq!(
        unchanged.metadata.resource_version, again.metadata.resource_version,
        "not run again"
    );
    assert_eq!(retried_notes(&client, "retried").await.len(), 1);

    webhook.remove_from_widgets(&client, &widgets, "w-2").await;
    let (code, out, err) = kube_svm_retry(&control_plane, &["retried"]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    let done = wait_for(&client, "retried", FINISH, &[&second], phase_is(Phase::Succeeded)).await;
    assert_eq!(retries(&done), 2);
    let outcome =
        invariant::check(&client, &control_plane.etcd(), &widgets, "retried", count).await;
    assert!(outcome.pruned, "{:?}", done.status);
    assert_eq!(outcome.stored_versions, ["v2"]);
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", count).await;
    let notes = wait_for_retried_notes(&client, "retried", 2).await;
    assert!(
        notes.iter().any(|n| n.starts_with("retry 2 (") && n.contains("ended Failed")),
        "{notes:?}"
    );

    // Refused, each saying why, and the command exits 1.
    let (code, out, err) = kube_svm_retry(&control_plane, &["nowhere", "retried"]).await;
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("storageversionmigration nowhere does not exist"), "{err}");
    assert!(err.contains("storageversionmigration retried is Succeeded, not Failed"), "{err}");
    let after = wait_for(&client, "retried", FINISH, &[&second], |_| true).await;
    assert_eq!(retries(&after), 2, "a refused retry changes nothing");
}

/// The CRD trigger's own migration fails while a webhook denies every write; the trigger runs
/// it again in place, with a short first wait, while the cause lasts and after it is gone, until
/// it succeeds and prunes: the same migration, never a second one.
#[tokio::test]
async fn the_crd_trigger_retries_its_own_failed_migration() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let count = 20;
    let widgets = WidgetCrd::new("trigger-retry", false);
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], count).await;
    let webhook = Webhook::on_widgets(&client, &widgets, 5).await;
    webhook.answer_all(frozen());
    let args =
        ["controller", "--leader-elect=false", "--crd-trigger=true", "--crd-trigger-retry-delay=1"];
    let controller = KubeSvm::start(&control_plane, "controller", &args).await;
    widgets.set_storage_version(&client, "v2").await;
    let name = wait_for_triggered(&client, &widgets, 1, &controller).await.metadata.name;
    let name = name.expect("a name");

    // Retried while the webhook still denies: it fails again.
    wait_for(&client, &name, FINISH, &[&controller], failed_after(1)).await;
    webhook.remove_from_widgets(&client, &widgets, "w-2").await;
    let done = wait_for(&client, &name, FINISH, &[&controller], phase_is(Phase::Succeeded)).await;
    assert!(retries(&done) >= 2, "{:?}", done.status);
    let outcome = invariant::check(&client, &control_plane.etcd(), &widgets, &name, count).await;
    assert!(outcome.pruned, "{:?}", done.status);
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", count).await;
    assert_eq!(triggered(&client, &widgets, "crd").await.len(), 1, "retried in place");
    let notes = wait_for_retried_notes(&client, &name, 2).await;
    assert!(notes.len() >= 2 && notes.iter().all(|n| n.contains("ended Failed")), "{notes:?}");
}
