//! CRDs that convert with a webhook: one that points at nothing fails a migration within seconds,
//! naming the webhook and writing nothing (the controller, `kube-svm migrate`, and `kube-svm
//! plan`, which says so beforehand); one that works lets the migration through.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kube_svm::api::Phase;
use kube_svm::api::conditions::reasons::CONVERSION_WEBHOOK_UNAVAILABLE;
use kube_svm::removal::plan::EXIT_NEEDS_MIGRATION;
use serde_json::Value;

use crate::migrate::{migrate, result_line, stored_versions};
use crate::support::conversion::{Converter, closed_port, missing_service};
use crate::support::fixtures::{WidgetCrd, unique};
use crate::support::migrations::{create_migration, has_event, phase_is, state, wait_for};
use crate::support::process::{KubeSvm, binary};
use crate::support::{ControlPlane, Etcd, Scenario};

/// What a message ending a migration at the preflight says of it: it gave up after its reads
/// (a second apart) failed for ten seconds, not after the engine's attempts at every object.
/// Judged by what the message and etcd say, not by the wall clock of a loaded machine (the time
/// is printed).
const GAVE_UP_AFTER_ITS_READS: &str = "failed every read of widgets through";

/// Every widget's etcd key and the revision of its last write.
async fn revisions(etcd: &Etcd, widgets: &WidgetCrd) -> BTreeMap<String, i64> {
    let keys = etcd.list(&widgets.etcd_prefix()).await.expect("etcd answers");
    keys.into_iter().map(|kv| (kv.key, kv.mod_revision)).collect()
}

/// Waits until the controller's `/readyz` answers 200: it takes migrations from then on.
async fn wait_ready(controller: &KubeSvm) {
    let url = format!("{}/readyz", controller.admin_url().await);
    let http = crate::support::http_client();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = http.get(&url).send().await.is_ok_and(|r| r.status().is_success());
        if ready {
            return;
        }
        assert!(Instant::now() < deadline, "never ready\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `kube-svm <args>` against `control_plane`, run off the test's runtime; its exit code, standard
/// output and standard error.
async fn run(control_plane: &ControlPlane, args: &[&str]) -> (Option<i32>, String, String) {
    let (kubeconfig, args) = (control_plane.kubeconfig().to_owned(), args.join(" "));
    let output = tokio::task::spawn_blocking(move || {
        Command::new(binary()).args(args.split(' ')).arg("--kubeconfig").arg(kubeconfig).output()
    })
    .await
    .expect("joined")
    .expect("kube-svm runs");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

/// `kube-svm migrate` of `widgets`, run off the test's runtime (which serves the webhook).
async fn migrate_off_runtime(kubeconfig: &Path, widgets: &WidgetCrd) -> (Option<i32>, String) {
    let (kubeconfig, name) = (kubeconfig.to_owned(), widgets.name());
    tokio::task::spawn_blocking(move || {
        let state = tempfile::tempdir().expect("a directory");
        migrate(&kubeconfig, state.path(), &[&name])
    })
    .await
    .expect("joined")
}

#[tokio::test]
async fn a_conversion_webhook_that_points_at_nothing_fails_the_migration_within_seconds() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let etcd = control_plane.etcd();

    // The controller: the webhook's Service does not exist.
    let widgets = WidgetCrd::stale(&client, "conversion-service", 20).await;
    let service = unique("no-converter");
    widgets.convert_with(&client, missing_service(&service)).await;
    let before = revisions(&etcd, &widgets).await;
    let controller =
        KubeSvm::start(&control_plane, "controller", &["controller", "--leader-elect=false"]).await;
    wait_ready(&controller).await;
    let started = Instant::now();
    create_migration(&client, "dead-webhook", &widgets.group, "widgets").await;
    let failed = wait_for(
        &client,
        "dead-webhook",
        Duration::from_secs(120),
        &[&controller],
        phase_is(Phase::Failed),
    )
    .await;
    let took = started.elapsed();
    let (_, reason, message) = state(&failed);
    assert_eq!(reason, CONVERSION_WEBHOOK_UNAVAILABLE, "{message}");
    println!("the controller's migration failed {took:?} after it was created");
    assert!(message.contains(GAVE_UP_AFTER_ITS_READS), "{message}");
    let webhook = format!("service default/{service} port 8443 path /convert");
    assert!(message.contains(&webhook), "{message}");
    assert!(message.contains(&format!("service \"{service}\" not found")), "{message}");
    assert!(has_event(&client, "dead-webhook", "Failed").await);
    assert_eq!(stored_versions(&client, &widgets).await, ["v1", "v2"]);
    assert_eq!(revisions(&etcd, &widgets).await, before, "an object was written");
    drop(controller);

    // `kube-svm migrate`: the webhook's URL is a closed port.
    let refused = WidgetCrd::stale(&client, "conversion-url", 20).await;
    let config = closed_port();
    let url = config["url"].as_str().expect("a URL").to_owned();
    refused.convert_with(&client, config).await;
    let before = revisions(&etcd, &refused).await;
    let started = Instant::now();
    let (code, out) = migrate_off_runtime(control_plane.kubeconfig(), &refused).await;
    let took = started.elapsed();
    assert_eq!(code, Some(1), "{out}");
    println!("kube-svm migrate ended {took:?} after it started");
    assert!(out.contains(GAVE_UP_AFTER_ITS_READS), "{out}");
    let line = result_line(&out, &refused.name());
    assert!(line.contains(&format!("the conversion webhook of {} (URL {url})", refused.name())));
    assert!(line.contains("connection refused"), "{line}");
    assert_eq!(stored_versions(&client, &refused).await, ["v1", "v2"]);
    assert_eq!(revisions(&etcd, &refused).await, before, "an object was written");

    // No object, nothing to convert: the same webhook stands in no migration's way.
    let empty = WidgetCrd::new("conversion-empty", false);
    empty.create(&client, "v1").await;
    empty.set_storage_version(&client, "v2").await;
    empty.convert_with(&client, closed_port()).await;
    let (code, out) = migrate_off_runtime(control_plane.kubeconfig(), &empty).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(result_line(&out, &empty.name()).contains("Succeeded: 0 objects"), "{out}");

    // `kube-svm plan` says so beforehand, in the table and in JSON.
    let (code, table, errors) = run(&control_plane, &["plan"]).await;
    println!("$ kube-svm plan\n{table}");
    assert_eq!(code, Some(i32::from(EXIT_NEEDS_MIGRATION)), "{table}{errors}");
    assert!(table.contains("\nProblems (a migration would fail before writing):\n"), "{table}");
    let problem =
        format!("  {}: the conversion webhook of {} (URL {url})", refused.name(), refused.name());
    assert!(table.contains(&problem), "{table}");
    let (_, json, errors) = run(&control_plane, &["plan", "-o", "json"]).await;
    let plan: Value = serde_json::from_str(&json).unwrap_or_else(|_| panic!("{errors}"));
    let entries = plan["resources"].as_array().expect("resources");
    let entry = |group: &str| entries.iter().find(|e| e["group"] == group).expect("listed");
    let problems = entry(&widgets.group)["problems"][0].as_str().expect("a problem").to_owned();
    assert!(problems.contains(&webhook), "{problems}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_working_conversion_webhook_lets_the_migration_through() {
    let Scenario { control_plane, client } = Scenario::shared().await;
    let etcd = control_plane.etcd();
    let converter = Converter::serve().await;
    let widgets = WidgetCrd::stale(&client, "conversion-works", 30).await;
    widgets.convert_with(&client, converter.client_config()).await;

    let (code, table, errors) = run(control_plane, &["plan"]).await;
    assert!(!table.contains("Problems"), "{table}{errors}");
    assert_eq!(code, Some(i32::from(EXIT_NEEDS_MIGRATION)), "{table}{errors}");

    let (code, out) = migrate_off_runtime(control_plane.kubeconfig(), &widgets).await;
    assert_eq!(code, Some(0), "{out}");
    let line = result_line(&out, &widgets.name());
    assert!(line.contains("Succeeded: 30 objects (30 rewritten"), "{out}");
    widgets.assert_all_stored_as(&etcd, "v2", 30).await;
    assert_eq!(stored_versions(&client, &widgets).await, ["v2"]);
    assert!(converter.reviews() > 0, "the webhook was never called");
    widgets.convert_without_webhook(&client).await;
}
