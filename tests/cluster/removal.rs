//! Removing a version from a CRD, the whole road: objects applied server-side at v1, storage
//! switched to v2, migrated, v1 no longer served, `managedFields` cleaned, `plan --drop v1`
//! saying yes, v1 removed, and server-side apply still working. Without the cleaning, the same
//! road ends with every apply failing.

use std::io::Write as _;
use std::process::{Command, Stdio};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use std::time::Duration;

use kube_svm::api::{
    CLEAN_MANAGED_FIELDS_ANNOTATION, GroupVersionResource, Phase, StorageVersionMigration,
    StorageVersionMigrationSpec,
};
use kube_svm::trigger::crd::REMOVE_VERSIONS_ANNOTATION;

use crate::support::fixtures::{WidgetCrd, update_crd};
use crate::support::invariant::{Census, check};
use crate::support::migrations::{is_terminal, phase_is, progress, wait_for, wait_for_triggered};
use crate::support::process::{KubeSvm, ReadersPath, binary};
use crate::support::webhook::Restorer;
use crate::support::{ControlPlane, Scenario, asset};

/// How long a migration of a few objects may take on a loaded machine.
const TIMEOUT: Duration = Duration::from_secs(120);

/// Widgets applied server-side at v1 in each CRD.
const APPLIED: usize = 12;

/// Runs the harness's kubectl with `input` on standard input; exit code and output.
fn kubectl(control_plane: &ControlPlane, args: &[&str], input: &str) -> (bool, String) {
    let kubectl = asset("kubectl").expect("kubectl (hack/control-plane.sh builds it)");
    let mut child = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(control_plane.kubeconfig())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("written");
    let output = child.wait_with_output().expect("kubectl ends");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("$ kubectl {}\n{text}", args.join(" "));
    (output.status.success(), text)
}

/// `kube-svm <args>`: exit code and output.
fn kube_svm(control_plane: &ControlPlane, args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(binary())
        .args(args)
        .arg("--kubeconfig")
        .arg(control_plane.kubeconfig())
        .output()
        .expect("kube-svm runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("$ kube-svm {}  # exit {:?}\n{text}", args.join(" "), output.status.code());
    (output.status.code(), text)
}

/// The widgets `w-0` to `w-{count-1}` at `version`, as YAML for `kubectl apply`.
fn manifests(widgets: &WidgetCrd, version: &str, count: usize, color: &str) -> String {
    (0..count)
        .map(|i| {
            format!(
                "apiVersion: {}\nkind: Widget\nmetadata:\n  name: w-{i}\nspec:\n  size: {i}\n  color: {color}\n---\n",
                widgets.api_version(version)
            )
        })
        .collect()
}

/// Applies `count` widgets server-side at `version` as field manager `manager`.
fn apply(
    control_plane: &ControlPlane,
    widgets: &WidgetCrd,
    version: &str,
    count: usize,
    manager: &str,
    color: &str,
) -> (bool, String) {
    let manager = format!("--field-manager={manager}");
    let args = ["apply", "--server-side", "--force-conflicts", &manager, "-f", "-"];
    kubectl(control_plane, &args, &manifests(widgets, version, count, color))
}

/// A CRD whose widgets were applied server-side at v1 (half of them applied again at v2 by a
/// second manager), stored at v2, migrated, with v1 no longer served.
async fn migrated_with_v1_unserved(
    control_plane: &ControlPlane,
    client: &Client,
    test: &str,
) -> WidgetCrd {
    let widgets = stale_with_v1_unserved(control_plane, client, test).await;
    let (code, out) =
        kube_svm(control_plane, &["migrate", &widgets.name(), "--storage-version-settle=0"]);
    assert_eq!(code, Some(0), "{out}");
    widgets
}

/// A CRD whose widgets were applied server-side at v1 (half of them applied again at v2 by a
/// second manager), with its storage switched to v2 and v1 no longer served, not migrated:
/// etcd still holds the widgets as v1.
async fn stale_with_v1_unserved(
    control_plane: &ControlPlane,
    client: &Client,
    test: &str,
) -> WidgetCrd {
    let widgets = WidgetCrd::new(test, false);
    widgets.create(client, "v1").await;
    let (applied, out) = apply(control_plane, &widgets, "v1", APPLIED, "deployer", "red");
    assert!(applied, "{out}");
    let (applied, out) = apply(control_plane, &widgets, "v2", APPLIED / 2, "tuner", "red");
    assert!(applied, "{out}");
    widgets.set_storage_version(client, "v2").await;
    widgets.set_served(client, "v1", false).await;
    widgets
}

/// Asserts that the `managedFields` of every widget, read back through the API, name v2 only:
/// the second manager's v2 entry where it applied, a seed for the first manager elsewhere.
async fn assert_cleaned(client: &Client, widgets: &WidgetCrd) {
    let v2 = widgets.api_version("v2");
    for i in 0..APPLIED {
        let named = managers(client, widgets, &format!("w-{i}")).await;
        assert!(named.iter().all(|(_, version)| *version == v2), "w-{i} not clean: {named:?}");
        let expected = match i < APPLIED / 2 {
            // The second manager's v2 entry is kept as it was.
            true => vec![("tuner".to_owned(), v2.clone())],
            // A seed for the latest manager, so the next apply invents no co-owner.
            false => vec![("deployer".to_owned(), v2.clone())],
        };
        assert_eq!(named, expected, "w-{i}");
    }
}

/// The apiVersions the `managedFields` of widget `name` name, by manager.
async fn managers(client: &Client, widgets: &WidgetCrd, name: &str) -> Vec<(String, String)> {
    let widget = widgets.api(client, "v2", None).get(name).await.expect("the widget");
    let entries = widget.metadata.managed_fields.unwrap_or_default();
    let mut named: Vec<(String, String)> = entries
        .into_iter()
        .map(|entry| (entry.manager.unwrap_or_default(), entry.api_version.unwrap_or_default()))
        .collect();
    named.sort();
    named
}

/// `kube-svm plan --drop v1 <widgets> -o json <args>`: its exit code and its verdict.
fn drop_plan(
    control_plane: &ControlPlane,
    widgets: &WidgetCrd,
    args: &[&str],
) -> (Option<i32>, Value) {
    let name = widgets.name();
    let args: Vec<&str> =
        ["plan", "--drop", "v1", &name, "-o", "json"].iter().chain(args).copied().collect();
    let (code, out) = kube_svm(control_plane, &args);
    let verdict = serde_json::from_str(&out).unwrap_or_else(|_| panic!("JSON: {out}"));
    (code, verdict)
}

async fn remove_version(client: &Client, widgets: &WidgetCrd, version: &str) {
    update_crd(client, &widgets.name(), |crd| crd.spec.versions.retain(|v| v.name != version))
        .await;
}

async fn spec(client: &Client, widgets: &WidgetCrd, name: &str) -> Value {
    let widget = widgets.api(client, "v2", None).get(name).await.expect("the widget");
    widget.data["spec"].clone()
}

#[tokio::test]
async fn a_version_is_removed_without_breaking_server_side_apply_once_managed_fields_are_cleaned() {
    let control_plane = ControlPlane::start(&[]).await.expect("a private control plane starts");
    let (client, etcd) = (control_plane.client().await, control_plane.etcd());

    // Without the cleaning: `plan --drop` says what blocks the removal. Removed anyway, every
    // apply of an object whose managedFields name v1 fails.
    let uncleaned = migrated_with_v1_unserved(&control_plane, &client, "removal-kept").await;
    let (code, verdict) = drop_plan(&control_plane, &uncleaned, &[]);
    assert_eq!(code, Some(3), "{verdict:#}");
    assert_eq!(verdict["removable"], false);
    let blockers = &verdict["blockers"];
    assert_eq!(blockers.as_array().map(Vec::len), Some(1), "{verdict:#}");
    assert_eq!(blockers[0]["blocker"], "ManagedFields");
    assert_eq!(blockers[0]["count"], APPLIED);
    assert!(verdict["requests"]["served"].as_u64() > Some(0), "the applies at v1: {verdict:#}");
    let (code, table) = kube_svm(&control_plane, &["plan", "--drop", "v1", &uncleaned.name()]);
    assert_eq!(code, Some(3), "{table}");
    assert!(table.contains("yet: 1 blocker.\n\n1. ManagedFields: 12 of 12 objects"), "{table}");
    remove_version(&client, &uncleaned, "v1").await;
    let (applied, out) = apply(&control_plane, &uncleaned, "v2", 1, "deployer", "blue");
    assert!(!applied, "the apply fails while managedFields name v1: {out}");
    assert!(out.contains("request to convert CR to an invalid group/version"), "{out}");

    // With it: only the entries naming v1 go, the rest of every object stays as it was.
    let widgets = migrated_with_v1_unserved(&control_plane, &client, "removal-cleaned").await;
    let name = widgets.name();
    let v1 = widgets.api_version("v1");
    let v2 = widgets.api_version("v2");
    assert!(managers(&client, &widgets, "w-0").await.contains(&("deployer".into(), v1.clone())));
    let before = spec(&client, &widgets, "w-0").await;
    let (code, out) = kube_svm(
        &control_plane,
        &["migrate", &name, "--clean-managed-fields", "--storage-version-settle=0"],
    );
    assert_eq!(code, Some(0), "{out}");
    let cleaned = format!("{APPLIED} with managedFields cleaned");
    assert!(out.contains(&cleaned), "{out}");
    assert_cleaned(&client, &widgets).await;
    assert_eq!(spec(&client, &widgets, "w-0").await, before, "the cleaning changes no field");
    let census = Census::of(&etcd, &widgets).await;
    assert_eq!(census.count(&v2), APPLIED, "all stored in v2: {census:?}");

    // Nothing blocks the removal now, etcd's census included.
    let etcd_endpoints = format!("--etcd-endpoints={}", etcd.url());
    let (code, verdict) = drop_plan(&control_plane, &widgets, &[&etcd_endpoints]);
    assert_eq!(code, Some(0), "{verdict:#}");
    assert_eq!(
        (verdict["removable"].clone(), verdict["blockers"].clone()),
        (json!(true), json!([]))
    );
    let (code, table) = kube_svm(&control_plane, &["plan", "--drop", "v1", &name]);
    assert_eq!(code, Some(0), "{table}");
    assert!(table.starts_with(&format!("v1 can be removed from {name}: nothing blocks it.")));

    // A second run has nothing left to clean.
    let (code, out) = kube_svm(
        &control_plane,
        &["migrate", &name, "--clean-managed-fields", "--storage-version-settle=0"],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("managedFields cleaned"), "{out}");

    remove_version(&client, &widgets, "v1").await;
    let (applied, out) = apply(&control_plane, &widgets, "v2", APPLIED, "deployer", "blue");
    assert!(applied, "the apply works once v1 is removed: {out}");
    assert_eq!(spec(&client, &widgets, "w-7").await["color"], "blue");
}

#[tokio::test]
async fn the_crd_trigger_cleans_managed_fields_of_an_unserved_version_only_once_it_is_being_removed()
 {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::new("removal-trigger", false);
    widgets.create(&client, "v1").await;
    let (applied, out) = apply(&control_plane, &widgets, "v1", APPLIED, "deployer", "red");
    assert!(applied, "{out}");
    let args =
        ["controller", "--leader-elect=false", "--crd-trigger=true", "--clean-managed-fields"];
    let controller = KubeSvm::start(&control_plane, "controller", &args).await;

    // The storage switch: a migration that rewrites, cleaning nothing (every version served).
    widgets.set_storage_version(&client, "v2").await;
    let switched = wait_for_triggered(&client, &widgets, 1, &controller).await;
    let name = switched.metadata.name.clone().expect("named");
    let done = wait_for(&client, &name, TIMEOUT, &[&controller], phase_is(Phase::Succeeded)).await;
    assert_eq!((progress(&done).rewritten, progress(&done).cleaned), (APPLIED as u64, 0));

    // v1 no longer served: the step that can be undone, so nothing is cleaned within the grace
    // (a day by default); the trigger says so once it has seen it.
    widgets.set_served(&client, "v1", false).await;
    controller.wait_for_log("versions no longer served", TIMEOUT).await;
    let found = crate::support::migrations::triggered(&client, &widgets, "crd").await;
    assert_eq!(found.len(), 1, "a migration within the grace: {found:?}");

    // Named for removal: a second migration, cleaning every object of its v1 entries.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let intent = json!({ "metadata": { "annotations": { REMOVE_VERSIONS_ANNOTATION: "v1" } } });
    crds.patch(&widgets.name(), &PatchParams::default(), &Patch::Merge(&intent))
        .await
        .expect("annotated");
    let unserved = wait_for_triggered(&client, &widgets, 2, &controller).await;
    assert!(unserved.cleans_managed_fields(), "{:?}", unserved.metadata.annotations);
    let name = unserved.metadata.name.clone().expect("named");
    let done = wait_for(&client, &name, TIMEOUT, &[&controller], phase_is(Phase::Succeeded)).await;
    assert_eq!(progress(&done).cleaned, APPLIED as u64, "{:?}", done.status);
    let v2 = widgets.api_version("v2");
    for i in 0..APPLIED {
        let named = managers(&client, &widgets, &format!("w-{i}")).await;
        assert_eq!(named, [("deployer".to_owned(), v2.clone())], "w-{i}");
    }
    let (code, verdict) = drop_plan(&control_plane, &widgets, &[]);
    assert_eq!(code, Some(0), "{verdict:#}");
}

#[tokio::test]
async fn the_road_on_this_page_works_as_written() {
    let control_plane = ControlPlane::start(&[]).await.expect("a private control plane starts");
    let client = control_plane.client().await;
    let widgets = WidgetCrd { group: "example.com".into(), namespaced: false };
    widgets.create(&client, "v1").await;
    let (applied, out) = apply(&control_plane, &widgets, "v1", APPLIED, "deployer", "red");
    assert!(applied, "{out}");

    let script = crate::support::docs::sh_script("removing-a-version.md");
    let readers = ReadersPath::new();
    let state = tempfile::tempdir().expect("a directory");
    let output = Command::new("bash")
        .args(["-euo", "pipefail", "-x", "-c"])
        .arg(format!("exec 2>&1\n{script}"))
        .env("PATH", &readers.path)
        .env("KUBECONFIG", control_plane.kubeconfig())
        .env("XDG_STATE_HOME", state.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("bash runs");
    let out = String::from_utf8_lossy(&output.stdout);
    println!("{out}");
    assert!(output.status.success(), "the page's commands fail: {out}");
    for step in [
        r#"storedVersions set to ["v2"] (was ["v1", "v2"])"#,
        &format!("{APPLIED} with managedFields cleaned"),
        "v1 can be removed from widgets.example.com: nothing blocks it.",
        "widget.example.com/w-1 serverside-applied",
    ] {
        assert!(out.contains(step), "{step:?} not in {out}");
    }
    let crd = update_crd(&client, &widgets.name(), |_| {}).await;
    let versions: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(versions, ["v2", "v3"]);
    assert_eq!(spec(&client, &widgets, "w-1").await["size"], 7);
}

/// A ConfigMap whose `ownerReferences` name a widget at v1 keeps v1 in the CRD: once v1 is gone
/// the garbage collector cannot resolve that owner and never deletes the ConfigMap. `plan --drop
/// v1` says so, with the object, and exits non-zero, though every widget is migrated and
/// `storedVersions` pruned; once the reference names v2, nothing blocks the removal.
#[tokio::test]
async fn owner_references_naming_the_version_block_its_removal() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::new("owned", false);
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 3).await;
    widgets.set_storage_version(&client, "v2").await;
    let (code, out) =
        kube_svm(&control_plane, &["migrate", &widgets.name(), "--storage-version-settle=0"]);
    assert_eq!(code, Some(0), "{out}");
    widgets.set_served(&client, "v1", false).await;
    let clean =
        ["migrate", &widgets.name(), "--clean-managed-fields", "--storage-version-settle=0"];
    let (code, out) = kube_svm(&control_plane, &clean);
    assert_eq!(code, Some(0), "{out}");
    let owner = widgets.api(&client, "v2", None).get("w-0").await.expect("the owner");
    let reference = |version: &str| {
        json!([{
            "apiVersion": widgets.api_version(version), "kind": WidgetCrd::KIND,
            "name": "w-0", "uid": owner.metadata.uid.clone().unwrap_or_default(),
        }])
    };
    let config_maps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "default");
    let dependent: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "owned-by-w-0", "ownerReferences": reference("v1") },
    }))
    .expect("a ConfigMap");
    config_maps.create(&Default::default(), &dependent).await.expect("created");

    let (code, verdict) = drop_plan(&control_plane, &widgets, &[]);
    assert_eq!(code, Some(3), "{verdict:#}");
    assert_eq!(verdict["removable"], json!(false), "{verdict:#}");
    let blockers = verdict["blockers"].as_array().expect("blockers");
    assert_eq!(blockers.len(), 1, "{verdict:#}");
    let owned = &blockers[0];
    assert_eq!(owned["blocker"], "OwnerReferences", "{verdict:#}");
    assert_eq!(owned["count"], json!(1), "{verdict:#}");
    assert!(
        owned["message"].as_str().is_some_and(|m| m.contains("configmaps default/owned-by-w-0"))
    );

    let patch = json!({ "metadata": { "ownerReferences": reference("v2") } });
    let merge = kube::api::Patch::Merge(&patch);
    config_maps.patch("owned-by-w-0", &Default::default(), &merge).await.expect("patched");
    let (code, verdict) = drop_plan(&control_plane, &widgets, &[]);
    assert_eq!((code, verdict["removable"].clone()), (Some(0), json!(true)), "{verdict:#}");
}

/// `/status` keeps the live `managedFields` whatever a write sends, so a cleaning written there
/// would change nothing of them while re-encoding the object. With `--write-to-status`, the
/// objects to clean are written through the resource itself, and each one counts as cleaned
/// only once its `managedFields` read back clean: whether etcd still held it in v1, or it was
/// already current.
#[tokio::test]
async fn cleaning_with_write_to_status_cleans_for_real() {
    let control_plane = ControlPlane::start(&[]).await.expect("a private control plane starts");
    let (client, etcd) = (control_plane.client().await, control_plane.etcd());
    let clean = ["--clean-managed-fields", "--write-to-status", "--storage-version-settle=0"];

    // Stored in v1 still: every write re-encodes, and moves the resourceVersion.
    let stale = stale_with_v1_unserved(&control_plane, &client, "removal-status-stale").await;
    let before = spec(&client, &stale, "w-0").await;
    let name = stale.name();
    let args: Vec<&str> = ["migrate", name.as_str()].iter().chain(&clean).copied().collect();
    let (code, out) = kube_svm(&control_plane, &args);
    assert_eq!(code, Some(0), "{out}");
    assert_cleaned(&client, &stale).await;
    assert!(out.contains(&format!("{APPLIED} with managedFields cleaned")), "{out}");
    assert_eq!(spec(&client, &stale, "w-0").await, before, "the cleaning changes no field");
    let census = Census::of(&etcd, &stale).await;
    assert_eq!(census.count(&stale.api_version("v2")), APPLIED, "all stored in v2: {census:?}");
    assert_eq!(census.total(), APPLIED, "{census:?}");

    // Already current: only the cleaning makes a write.
    let current =
        migrated_with_v1_unserved(&control_plane, &client, "removal-status-current").await;
    let name = current.name();
    let args: Vec<&str> = ["migrate", name.as_str()].iter().chain(&clean).copied().collect();
    let (code, out) = kube_svm(&control_plane, &args);
    assert_eq!(code, Some(0), "{out}");
    assert_cleaned(&client, &current).await;
    assert!(out.contains(&format!("{APPLIED} with managedFields cleaned")), "{out}");
    let census = Census::of(&etcd, &current).await;
    assert_eq!(census.count(&current.api_version("v2")), APPLIED, "all stored in v2: {census:?}");
}

/// An object counts as cleaned only once its `managedFields` read back clean, not because its
/// resourceVersion moved: a mutating webhook that puts back the `managedFields` of `w-0` lets
/// the write through (re-encoding it) while the v1 entries stay. The migration fails on that
/// object, names it, and keeps `storedVersions`; once the webhook is gone, a second migration
/// cleans it and prunes.
#[tokio::test]
async fn a_cleaning_the_apiserver_did_not_store_is_not_counted() {
    let Scenario { control_plane, client } = Scenario::shared().await;
    let etcd = control_plane.etcd();
    let widgets = stale_with_v1_unserved(control_plane, &client, "removal-restored").await;
    widgets.create_widget(&client, "v2", None, "probe").await;
    let restorer = Restorer::install(&client, &widgets, "w-0", "probe").await;
    let args = ["controller", "--leader-elect=false", "--storage-version-settle=0"];
    let controller = KubeSvm::start(control_plane, "controller", &args).await;

    let first = format!("{}-clean", widgets.group);
    create_cleaning(&client, &first, &widgets).await;
    let done = wait_for(&client, &first, TIMEOUT, &[&controller], is_terminal).await;
    let progress = progress(&done);
    assert_eq!(Phase::of(&done), Phase::Failed, "{:?}", done.status);
    assert_eq!((progress.cleaned, progress.failed), (APPLIED as u64 - 1, 1), "{progress:?}");
    let failed = &done.status.as_ref().expect("a status").failed_objects;
    assert!(
        failed
            .iter()
            .any(|object| object.name == "w-0" && object.reason == "ManagedFieldsNotCleaned"),
        "{failed:?}"
    );
    let named = managers(&client, &widgets, "w-0").await;
    assert!(named.iter().any(|(_, version)| *version == widgets.api_version("v1")), "{named:?}");
    let outcome = check(&client, &etcd, &widgets, &first, APPLIED + 1).await;
    assert!(!outcome.pruned, "{outcome:?}");
    assert_eq!(outcome.stored_versions, ["v1", "v2"], "{outcome:?}");

    restorer.remove(&widgets, "probe").await;
    let second = format!("{}-again", widgets.group);
    create_cleaning(&client, &second, &widgets).await;
    let done = wait_for(&client, &second, TIMEOUT, &[&controller], is_terminal).await;
    assert_eq!(Phase::of(&done), Phase::Succeeded, "{:?}", done.status);
    assert_cleaned(&client, &widgets).await;
    let outcome = check(&client, &etcd, &widgets, &second, APPLIED + 1).await;
    assert!(outcome.pruned, "{outcome:?}");
}

/// Creates migration `name` of the widgets, cleaning `managedFields`.
async fn create_cleaning(client: &Client, name: &str, widgets: &WidgetCrd) {
    let resource = GroupVersionResource {
        group: widgets.group.clone(),
        version: String::new(),
        resource: "widgets".into(),
    };
    let mut migration = StorageVersionMigration::new(
        name,
        StorageVersionMigrationSpec { resource, continue_token: None },
    );
    migration.metadata.annotations =
        Some([(CLEAN_MANAGED_FIELDS_ANNOTATION.to_owned(), "true".to_owned())].into());
    Api::<StorageVersionMigration>::all(client.clone())
        .create(&PostParams::default(), &migration)
        .await
        .expect("the migration is created");
}
