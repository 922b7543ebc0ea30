//! `kube-svm plan` run as a process on a private control plane: what it lists, why, how many
//! objects, and its exit codes.

use std::process::{Command, Output};

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube_svm::api::{GroupResource, StorageState, StorageStateSpec};
use kube_svm::removal::plan::EXIT_NEEDS_MIGRATION;
use kube_svm::rules::storage_hash::storage_version_hash;
use serde_json::{Value, json};

use crate::support::ControlPlane;
use crate::support::Scenario;
use crate::support::fixtures::WidgetCrd;
use crate::support::migrations::create_migration;
use crate::support::process::binary;

fn plan(control_plane: &ControlPlane, args: &[&str]) -> Output {
    Command::new(binary())
        .arg("plan")
        .arg("--kubeconfig")
        .arg(control_plane.kubeconfig())
        .args(args)
        .output()
        .expect("kube-svm runs")
}

/// The JSON plan and the exit code.
fn json_plan(control_plane: &ControlPlane, args: &[&str]) -> (Value, Option<i32>) {
    let args: Vec<&str> = args.iter().copied().chain(["-o", "json"]).collect();
    let output = plan(control_plane, &args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let plan = serde_json::from_slice(&output.stdout).unwrap_or_else(|_| panic!("{stderr}"));
    (plan, output.status.code())
}

fn entry<'a>(plan: &'a Value, resource: &str, group: &str) -> Option<&'a Value> {
    let resources = plan["resources"].as_array().expect("resources");
    resources.iter().find(|e| e["resource"] == resource && e["group"] == group)
}

#[tokio::test]
async fn plans_stale_crds_storage_states_and_named_resources() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let clean = WidgetCrd::new("plan-clean", false);
    clean.create(&client, "v1").await;
    clean.seed(&client, "v1", &[None], 5).await;

    let (found, code) = json_plan(&control_plane, &[]);
    assert_eq!((found["resources"].clone(), code), (json!([]), Some(0)), "{found:#}");
    let table = plan(&control_plane, &[]);
    assert_eq!(String::from_utf8_lossy(&table.stdout), "Nothing needs migrating.\n");

    let stale = WidgetCrd::stale(&client, "plan-stale", 20).await;
    let current = storage_version_hash("", "v1", "ConfigMap");
    for (resource, persisted) in [("configmaps", "Unknown"), ("secrets", "")] {
        let api: Api<StorageState> = Api::all(client.clone());
        let spec = StorageStateSpec {
            resource: GroupResource { group: String::new(), resource: resource.into() },
        };
        api.create(&PostParams::default(), &StorageState::new(resource, spec))
            .await
            .expect("created");
        let hash = match persisted {
            "" => storage_version_hash("", "v1", "Secret"),
            unknown => unknown.to_owned(),
        };
        let status = json!({ "status": { "persistedStorageVersionHashes": [hash] } });
        api.patch_status(resource, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("status written");
    }

    let (found, code) = json_plan(&control_plane, &[]);
    assert_eq!(code, Some(i32::from(EXIT_NEEDS_MIGRATION)), "{found:#}");
    assert!(entry(&found, "widgets", &clean.group).is_none(), "a clean CRD is listed: {found:#}");
    assert!(entry(&found, "secrets", "").is_none(), "a current StorageState is listed: {found:#}");
    let widgets = entry(&found, "widgets", &stale.group).expect("the stale CRD is listed");
    assert_eq!(
        widgets["reasons"],
        json!([r#"status.storedVersions is ["v1", "v2"], the storage version is v2"#])
    );
    assert_eq!(
        (widgets["objects"].clone(), widgets["objectsExact"].clone()),
        (json!(20), json!(false))
    );
    let afterwards = widgets["afterwards"].as_str().expect("afterwards");
    assert!(afterwards.contains(r#"to ["v2"]"#), "{afterwards}");
    assert!(widgets.get("migration").is_none());
    let configmaps = entry(&found, "configmaps", "").expect("an Unknown StorageState is listed");
    let reason = configmaps["reasons"][0].as_str().expect("a reason");
    assert!(reason.contains("Unknown") && reason.contains(&current), "{reason}");
    assert_eq!(found["resources"].as_array().map(Vec::len), Some(2), "{found:#}");

    // Named resources, a migration that exists, and exact counts from etcd.
    create_migration(&client, "widgets-plan", &stale.group, "widgets").await;
    let touch = json!({ "metadata": { "labels": { "touched": "yes" } } });
    for i in 0..5 {
        stale
            .api(&client, "v2", None)
            .patch(&format!("w-{i}"), &PatchParams::default(), &Patch::Merge(&touch))
            .await
            .expect("rewritten at v2");
    }
    let etcd = control_plane.etcd();
    let (found, _) = json_plan(&control_plane, &["secrets", "--etcd-endpoints", etcd.url()]);
    let widgets = entry(&found, "widgets", &stale.group).expect("listed");
    assert_eq!(widgets["migration"], json!({ "name": "widgets-plan", "phase": "New" }));
    assert_eq!(
        (
            widgets["objects"].clone(),
            widgets["objectsExact"].clone(),
            widgets["staleObjects"].clone()
        ),
        (json!(20), json!(true), json!(15))
    );
    let secrets = entry(&found, "secrets", "").expect("a named resource is listed");
    assert_eq!(secrets["reasons"], json!(["named on the command line"]));
    let configmaps = entry(&found, "configmaps", "").expect("listed");
    assert_eq!(configmaps["staleObjects"], 0, "{configmaps:#}");

    // The README's command, whose output it shows (`--nocapture`).
    let with_etcd = plan(&control_plane, &["secrets", "--etcd-endpoints", etcd.url()]);
    let text = String::from_utf8_lossy(&with_etcd.stdout);
    println!("$ kube-svm plan secrets --etcd-endpoints {}\n{text}", etcd.url());
    assert!(text.contains("widgets-plan (New)") && text.contains("\nAfterwards:\n"), "{text}");
    let table = plan(&control_plane, &["secrets"]);
    let text = String::from_utf8_lossy(&table.stdout);
    let line = text.lines().find(|l| l.starts_with(&stale.name())).expect("a row");
    assert!(line.contains("~20") && line.contains("widgets-plan (New)"), "{text}");
    assert!(text.contains("\nAfterwards:\n"), "{text}");

    let unknown = plan(&control_plane, &["nosuchthings"]);
    assert_eq!(unknown.status.code(), Some(1));
    let message = String::from_utf8_lossy(&unknown.stderr);
    assert!(message.contains("cannot plan nosuchthings"), "{message}");
}

/// Linked as `kubectl-svm` (how kubectl finds plugins), the binary is `kubectl svm`: the same
/// subcommands, and help that names it so.
#[tokio::test]
async fn the_binary_answers_as_a_kubectl_plugin() {
    let control_plane = crate::support::shared().await;
    let dir = tempfile::tempdir().expect("a directory");
    let plugin = dir.path().join(kube_svm::cli::PLUGIN_BINARY);
    std::os::unix::fs::symlink(binary(), &plugin).expect("linked");
    let help = Command::new(&plugin).arg("--help").output().expect("runs");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("Usage: kubectl svm [OPTIONS] <COMMAND>"), "{help}");
    let planned = Command::new(&plugin)
        .args(["plan", "-o", "json", "--kubeconfig"])
        .arg(control_plane.kubeconfig())
        .output()
        .expect("runs");
    let code = planned.status.code();
    assert!(code == Some(0) || code == Some(i32::from(EXIT_NEEDS_MIGRATION)), "{planned:?}");
    let plan: Value = serde_json::from_slice(&planned.stdout).expect("a JSON plan");
    assert!(plan["resources"].is_array(), "{plan}");
}
