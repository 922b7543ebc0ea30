//! `kube-svm status` run as a process on a private control plane: a running and a finished
//! migration, the in-tree migrator's, JSON and --watch.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube_svm::api::Phase;
use serde_json::{Value, json};

use crate::support::ControlPlane;
use crate::support::Scenario;
use crate::support::fixtures::WidgetCrd;
use crate::support::migrations::{create_migration, phase_is, processed_at_least, wait_for};
use crate::support::process::{KubeSvm, binary};

fn status(control_plane: &ControlPlane, args: &[&str]) -> Output {
    Command::new(binary())
        .arg("status")
        .arg("--kubeconfig")
        .arg(control_plane.kubeconfig())
        .args(args)
        .output()
        .expect("kube-svm runs")
}

fn rows(control_plane: &ControlPlane) -> Vec<Value> {
    let output = status(control_plane, &["-o", "json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("a JSON array")
}

fn named<'a>(rows: &'a [Value], name: &str) -> &'a Value {
    rows.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("no {name} in {rows:#?}"))
}

#[tokio::test]
async fn shows_running_finished_and_in_tree_migrations() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let table = status(&control_plane, &[]);
    assert_eq!(String::from_utf8_lossy(&table.stdout), "No migrations.\n");

    let widgets = WidgetCrd::stale(&client, "status", 600).await;
    let slow = [
        "controller",
        "--leader-elect=false",
        "--crd-trigger=false",
        "--page-size=20",
        "--writes-in-flight=1",
        "--kube-api-qps=60",
        "--kube-api-burst=1",
    ];
    let controller = KubeSvm::start(&control_plane, "controller", &slow).await;
    create_migration(&client, "watched", &widgets.group, "widgets").await;
    let timeout = Duration::from_secs(120);
    wait_for(&client, "watched", timeout, &[&controller], processed_at_least(100)).await;
    let running = rows(&control_plane);
    let row = named(&running, "watched");
    assert_eq!(
        (row["phase"].clone(), row["migrator"].clone()),
        (json!("Running"), json!("kube-svm"))
    );
    assert_eq!(row["resource"], widgets.name());
    let percent = row["progressPercent"].as_u64().expect("a known total");
    assert!((1..100).contains(&percent), "{row}");
    assert!(row["objectsPerSecond"].as_f64().is_some_and(|r| r > 0.0), "{row}");
    assert!(row["etaSeconds"].as_u64().is_some(), "{row}");
    // One write in flight at most: the window is at its maximum, so only the gentle pace's
    // pauses between writes can hold it back, and they are latency's doing.
    assert_eq!((&row["pace"], &row["window"]), (&json!("gentle"), &json!(1)), "{row}");
    assert!(row.get("holdingBack").is_none_or(|why| why == "latency"), "{row}");

    // The in-tree migrator's API is served on 1.37; nothing runs it here.
    let gvk = GroupVersionKind::gvk("storagemigration.k8s.io", "v1", "StorageVersionMigration");
    let in_tree = ApiResource::from_gvk_with_plural(&gvk, "storageversionmigrations");
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "storagemigration.k8s.io/v1",
        "kind": "StorageVersionMigration",
        "metadata": { "name": "in-tree-configmaps" },
        "spec": { "resource": { "group": "", "resource": "configmaps" } },
    }))
    .expect("a valid object");
    Api::<DynamicObject>::all_with(client.clone(), &in_tree)
        .create(&PostParams::default(), &object)
        .await
        .expect("created");

    wait_for(&client, "watched", timeout, &[&controller], phase_is(Phase::Succeeded)).await;
    let finished = rows(&control_plane);
    let row = named(&finished, "watched");
    assert_eq!(
        (row["phase"].clone(), row["progressPercent"].clone()),
        (json!("Succeeded"), json!(100))
    );
    assert_eq!((row["processed"].clone(), row["failed"].clone()), (json!(600), json!(0)));
    assert_eq!(row["pace"], "gentle", "an ended migration keeps its pace: {row}");
    assert!(row.get("window").is_none(), "and has no window: {row}");
    let other = named(&finished, "in-tree-configmaps");
    assert_eq!(
        (other["migrator"].clone(), other["resource"].clone()),
        (json!("in-tree"), json!("configmaps"))
    );

    let table = status(&control_plane, &[]);
    let text = String::from_utf8_lossy(&table.stdout);
    let line = text.lines().find(|l| l.starts_with("watched ")).expect("a row");
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        cells[..5],
        ["watched", "kube-svm", widgets.name().as_str(), "Succeeded", "100%"],
        "{text}"
    );

    let watching = Command::new(binary())
        .args(["status", "--watch", "--interval", "0.5", "--kubeconfig"])
        .arg(control_plane.kubeconfig())
        .stdout(Stdio::piped())
        .spawn()
        .expect("kube-svm runs");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _ = Command::new("kill").arg("-INT").arg(watching.id().to_string()).status();
    let output = watching.wait_with_output().expect("exits");
    assert!(output.status.success(), "SIGINT ends --watch cleanly: {:?}", output.status);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.matches("NAME ").count() >= 2, "{text}");
}
