//! `kube-svm migrate` run as a process on private control planes without the controller: what
//! it rewrites (read back from etcd), when it prunes `storedVersions`, its exit codes, what it
//! refuses, and SIGINT followed by a run that resumes from the checkpoint.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::engine::reject_updates_of_frozen;
use crate::support::admission::lift;
use crate::support::fixtures::{
    KEY1, KEY2, KEY3, WidgetCrd, encrypt_secrets, install_kube_svm_crds, secrets_under_key1,
};
use crate::support::invariant::{self, Census, Ending};
use crate::support::migrations::create_migration;
use crate::support::process::binary;
use crate::support::{ControlPlane, Etcd};

/// `kube-svm migrate <args>` with plain progress lines and the discovery hash trusted at once
/// (one apiserver: nothing to settle).
fn command(kubeconfig: &Path, state: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command
        .arg("migrate")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--checkpoint-dir")
        .arg(state)
        .args(["--storage-version-settle=0", "--progress=lines"]);
    command
}

/// Runs `kube-svm migrate <args>` to the end; its exit code and what it printed, standard output
/// and standard error interleaved as on a terminal (also printed, for `--nocapture`).
pub(crate) fn migrate(kubeconfig: &Path, state: &Path, args: &[&str]) -> (Option<i32>, String) {
    let log = tempfile::NamedTempFile::new().expect("a log file");
    let out = log.reopen().expect("the log file");
    let status = command(kubeconfig, state, args)
        .stdout(out.try_clone().expect("the log file"))
        .stderr(out)
        .status()
        .expect("kube-svm runs");
    let text = std::fs::read_to_string(log.path()).unwrap_or_default();
    println!("$ kube-svm migrate {}  # exit {:?}\n{text}", args.join(" "), status.code());
    (status.code(), text)
}

/// The line of `out` that says how the migration of `resource` ended.
pub(crate) fn result_line<'a>(out: &'a str, resource: &str) -> &'a str {
    let ended = [format!("{resource}: Succeeded"), format!("{resource}: FAILED")];
    let line = out.lines().find(|l| ended.iter().any(|e| l.starts_with(e.as_str())));
    line.unwrap_or_else(|| panic!("no result for {resource} in {out}"))
}

pub(crate) async fn stored_versions(client: &Client, widgets: &WidgetCrd) -> Vec<String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get(&widgets.name()).await.expect("the CRD");
    crd.status.and_then(|s| s.stored_versions).unwrap_or_default()
}

/// A private control plane (its own etcd: tests count keys), and a directory for checkpoints.
async fn private() -> (ControlPlane, tempfile::TempDir) {
    let control_plane = ControlPlane::start(&[]).await.expect("a private control plane starts");
    (control_plane, tempfile::tempdir().expect("a directory"))
}

#[tokio::test]
async fn migrates_and_prunes_without_the_controller_and_says_what_failed() {
    let (control_plane, state) = private().await;
    let (client, etcd) = (control_plane.client().await, control_plane.etcd());
    let (state, admin) = (state.path(), control_plane.kubeconfig());

    // Success: every object rewritten in etcd, storedVersions pruned, exit 0.
    let widgets = WidgetCrd::stale(&client, "migrate-ok", 120).await;
    let name = widgets.name();
    let (code, out) = migrate(admin, state, &[&name]);
    assert_eq!(code, Some(0), "{out}");
    let line = result_line(&out, &name);
    assert!(line.contains("Succeeded: 120 objects (120 rewritten"), "{out}");
    assert!(line.contains(r#"storedVersions set to ["v2"] (was ["v1", "v2"])"#), "{out}");
    widgets.assert_all_stored_as(&etcd, "v2", 120).await;
    assert_eq!(stored_versions(&client, &widgets).await, ["v2"]);
    assert!(std::fs::read_dir(state).expect("the state directory").next().is_none());

    // A rejected object: the run fails, says which object and why, and keeps storedVersions.
    let guarded = WidgetCrd::new("migrate-rejected", false);
    guarded.create(&client, "v1").await;
    guarded.seed(&client, "v1", &[None], 30).await;
    let freeze = json!({ "metadata": { "labels": { "frozen": "true" } } });
    let api = guarded.api(&client, "v1", None);
    api.patch("w-7", &PatchParams::default(), &Patch::Merge(&freeze)).await.expect("labelled");
    guarded.set_storage_version(&client, "v2").await;
    reject_updates_of_frozen(&client, &guarded.group).await;
    let (policy, message) =
        (format!("freeze-{}", guarded.group), "frozen objects cannot be updated");
    let rejected = guarded.name();
    let (code, out) = migrate(admin, state, &[&rejected, "nosuchthings"]);
    assert_eq!(code, Some(1), "{out}");
    let line = result_line(&out, &rejected);
    assert!(line.contains("FAILED: 1 of 30 objects could not be migrated"), "{out}");
    assert!(line.contains("w-7") && line.contains(message), "{out}");
    assert!(
        out.contains("nosuchthings: FAILED: the apiserver serves no resource \"nosuchthings\""),
        "{out}"
    );
    assert!(out.contains(&format!("2 of 2 resources did not succeed: {rejected}, nosuchthings")));
    assert_eq!(stored_versions(&client, &guarded).await, ["v1", "v2"]);
    assert_eq!(stored_as(&etcd, &guarded, "v1").await, 1);

    // --all-stale finds the CRD still stale, and finishes it once the policy is lifted; as the
    // Helm chart's ServiceAccount, which the hook Job runs as, with only the chart's RBAC.
    lift(&client, &policy).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let chart_account = control_plane.controller_kubeconfig().await;
    let (code, out) = migrate(chart_account, state, &["--all-stale"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("{rejected}: Succeeded: 30 objects")), "{out}");
    assert!(!out.contains(&format!("{name}: ")), "a pruned CRD was migrated again: {out}");
    guarded.assert_all_stored_as(&etcd, "v2", 30).await;
    assert_eq!(stored_versions(&client, &guarded).await, ["v2"]);
    let (code, out) = migrate(admin, state, &["--all-stale"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("Nothing to migrate"), "{out}");

    // Usage without a resource is an error that says what to pass.
    let (code, out) = migrate(admin, state, &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("name the resources to migrate"), "{out}");

    // A resource kube-svm's controller is migrating now is refused, and left alone.
    install_kube_svm_crds(&client).await;
    let busy = WidgetCrd::stale(&client, "migrate-busy", 10).await;
    create_migration(&client, "busy-widgets", &busy.group, "widgets").await;
    let running = json!({ "status": { "conditions": [{
        "type": "Running", "status": "True", "lastUpdateTime": "2026-01-01T00:00:00Z",
    }]}});
    Api::<kube_svm::api::StorageVersionMigration>::all(client.clone())
        .patch_status("busy-widgets", &PatchParams::default(), &Patch::Merge(&running))
        .await
        .expect("status written");
    let (code, out) = migrate(admin, state, &[&busy.name()]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("refused: the kube-svm migration busy-widgets is migrating it now"),
        "{out}"
    );
    assert_eq!(stored_as(&etcd, &busy, "v1").await, 10);

    // With --wait-for-others it waits for that migration to end, then migrates.
    let log = control_plane.path("migrate-waiting.log");
    let out = std::fs::File::create(&log).expect("a log file");
    let mut waiting = command(admin, state, &[&busy.name(), "--wait-for-others"])
        .stdout(out.try_clone().expect("a log file"))
        .stderr(out)
        .spawn()
        .expect("kube-svm starts");
    let said = format!("{}: waiting for the kube-svm migration busy-widgets to end", busy.name());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains(&said) {
        assert!(Instant::now() < deadline, "it never said it waits");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(waiting.try_wait().expect("try_wait").is_none(), "it did not wait");
    assert_eq!(stored_as(&etcd, &busy, "v1").await, 10, "it migrated while waiting");
    let ended = json!({ "status": { "conditions": [{
        "type": "Failed", "status": "True", "lastUpdateTime": "2026-01-01T00:00:01Z",
    }]}});
    Api::<kube_svm::api::StorageVersionMigration>::all(client.clone())
        .patch_status("busy-widgets", &PatchParams::default(), &Patch::Merge(&ended))
        .await
        .expect("status written");
    let status = tokio::task::spawn_blocking(move || waiting.wait()).await.expect("joined");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.expect("exited").code(), Some(0), "{text}");
    busy.assert_all_stored_as(&etcd, "v2", 10).await;
}

/// Names may hold any character a path segment allows: ClusterRoles `x#y`, `a b` and `q?z` are
/// written to their own paths (escaped), not to `x` or an invalid URL, so the run succeeds; etcd
/// shows each re-encrypted with the new key.
#[tokio::test]
async fn names_that_need_escaping_are_migrated() {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    use kube::api::PostParams;

    use crate::support::fixtures::{KEY1, KEY2, encrypt};
    let (control_plane, state) = private().await;
    let clusterroles = ["clusterroles.rbac.authorization.k8s.io"];
    control_plane
        .restart_apiserver(&[&encrypt(&control_plane, &clusterroles, &[KEY1])])
        .await
        .expect("restarts with key1");
    let client = control_plane.client().await;
    let names = ["x#y", "a b", "q?z", "k=v,w", "back\\slash", "plain"];
    let api: Api<ClusterRole> = Api::all(client.clone());
    for name in names {
        let role: ClusterRole = serde_json::from_value(json!({ "metadata": { "name": name } }))
            .expect("a valid ClusterRole");
        api.create(&PostParams::default(), &role).await.expect("created");
    }
    control_plane
        .restart_apiserver(&[&encrypt(&control_plane, &clusterroles, &[KEY2, KEY1])])
        .await
        .expect("restarts with key2 first");

    let (code, out) = migrate(control_plane.kubeconfig(), state.path(), &[clusterroles[0]]);
    assert_eq!(code, Some(0), "{out}");
    let succeeded = format!("{}: Succeeded", clusterroles[0]);
    assert!(result_line(&out, clusterroles[0]).starts_with(&succeeded), "{out}");
    let etcd = control_plane.etcd();
    for name in names {
        let stored = etcd.get(&format!("/registry/clusterroles/{name}")).await.expect("etcd");
        let stored = stored.unwrap_or_else(|| panic!("{name} is in etcd")).stored();
        let key2 = kube_svm::census::stored::Stored::Encrypted {
            provider: "aescbc".into(),
            key_name: "key2".into(),
        };
        assert_eq!(stored, key2, "{name} is re-encrypted with key2");
    }
}

#[tokio::test]
async fn sigint_stops_cleanly_and_the_next_run_resumes_from_the_checkpoint() {
    let (control_plane, state) = private().await;
    let (client, etcd) = (control_plane.client().await, control_plane.etcd());
    let (state, admin) = (state.path(), control_plane.kubeconfig());
    let widgets = WidgetCrd::stale(&client, "migrate-resume", 1500).await;
    let name = widgets.name();

    let slow = [name.as_str(), "--page-size=20", "--writes-in-flight=1", "--kube-api-qps=100"];
    let (status, text, checkpoint) = interrupted(&control_plane, state, &slow, 200);
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(text.contains(&format!("{name}: interrupted: ")), "{text}");
    assert!(text.contains("To resume, run the same command again"), "{text}");
    let saved: Value =
        serde_json::from_slice(&std::fs::read(&checkpoint).expect("kept")).expect("a checkpoint");
    let processed = saved["status"]["progress"]["processed"].as_u64().expect("a count");
    assert!((200..1500).contains(&processed), "{saved:#}");
    assert!(saved["status"]["checkpoint"]["continueToken"].is_string(), "{saved:#}");
    assert_eq!(stored_versions(&client, &widgets).await, ["v1", "v2"]);

    let (code, out) = migrate(admin, state, &[&name]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("{name}: resuming from the checkpoint after {processed}")));
    assert!(out.contains(&format!("{name}: Succeeded: 1500 objects")), "{out}");
    assert!(out.contains(r#"storedVersions set to ["v2"]"#), "{out}");
    widgets.assert_all_stored_as(&etcd, "v2", 1500).await;
    assert_eq!(stored_versions(&client, &widgets).await, ["v2"]);
    assert!(!checkpoint.exists(), "the checkpoint outlived the migration");
}

/// A CRD deleted and created again under its name (same versions, same generation, same storage
/// version hash) while a run was interrupted is another CRD: the checkpoint is not resumed (its
/// pages were of the old CRD's objects); the run starts over from the first object of the new
/// one, so it rewrites every one of them before storedVersions is pruned.
#[tokio::test]
async fn a_crd_created_again_under_its_name_is_not_the_one_a_checkpoint_was_for() {
    let (control_plane, state) = private().await;
    let (client, etcd) = (control_plane.client().await, control_plane.etcd());
    let (state, admin) = (state.path(), control_plane.kubeconfig());
    let widgets = WidgetCrd::stale(&client, "migrate-replaced", 600).await;
    let name = widgets.name();
    let slow = [name.as_str(), "--page-size=20", "--writes-in-flight=1", "--kube-api-qps=100"];
    let (status, text, _) = interrupted(&control_plane, state, &slow, 100);
    assert_eq!(status.code(), Some(130), "{text}");

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(&name, &Default::default()).await.expect("the CRD is deleted");
    let deadline = Instant::now() + Duration::from_secs(60);
    while crds.get_opt(&name).await.expect("read").is_some() {
        assert!(Instant::now() < deadline, "the CRD was never deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 50).await;
    widgets.set_storage_version(&client, "v2").await;

    let (code, out) = migrate(admin, state, &[&name]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("the CRD changed since the checkpoint"), "{out}");
    assert!(result_line(&out, &name).contains("Succeeded: 50 objects (50 rewritten"), "{out}");
    assert_eq!(stored_versions(&client, &widgets).await, ["v2"]);
    widgets.assert_all_stored_as(&etcd, "v2", 50).await;
}

/// A checkpoint taken before the apiserver restarted with another encryption key describes a
/// cluster that is gone: the Secrets written before it are under the key of then, and the
/// storage version hash never changes with a key. The next run does not resume it: it says why,
/// starts over, and every Secret in etcd, counted exactly, ends under the new key.
#[tokio::test]
async fn a_checkpoint_from_before_a_key_rotation_is_not_resumed() {
    let count = 600;
    let (control_plane, _) = secrets_under_key1(count).await;
    let rotate = |keys: &[(&str, &str)]| encrypt_secrets(&control_plane, keys);
    let key2 = rotate(&[KEY2, KEY1]);
    control_plane.restart_apiserver(&[&key2]).await.expect("restarts with key2 first");
    let (state, etcd) = (tempfile::tempdir().expect("a directory"), control_plane.etcd());
    let slow = ["secrets", "--page-size=20", "--writes-in-flight=1", "--kube-api-qps=100"];
    let (status, text, _) = interrupted(&control_plane, state.path(), &slow, 100);
    assert_eq!(status.code(), Some(130), "{text}");
    let partly = Census::under(&etcd, SECRETS).await;
    assert!((100..count).contains(&partly.count("aescbc:key2")), "{partly:?}");

    let key3 = rotate(&[KEY3, KEY2, KEY1]);
    control_plane.restart_apiserver(&[&key3]).await.expect("restarts with key3 first");
    let (code, out) = migrate(control_plane.kubeconfig(), state.path(), &["secrets"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(result_line(&out, "secrets").contains(&format!("Succeeded: {count} objects")), "{out}");
    let ending = Ending { succeeded_as: Some("aescbc:key3".into()), stored_versions_only: None };
    if let Err(breach) = invariant::judge(&Census::under(&etcd, SECRETS).await, count, &ending) {
        panic!("{breach}\n{out}");
    }
    assert!(
        out.contains("the checkpoint no longer describes this cluster: the apiservers restarted"),
        "{out}"
    );
}

/// Where the apiserver stores Secrets in etcd.
const SECRETS: &str = "/registry/secrets/";

/// Runs `kube-svm migrate <args>` and sends it SIGINT once its checkpoint records `processed`
/// objects; its exit status, what it printed, and the checkpoint file.
fn interrupted(
    control_plane: &ControlPlane,
    state: &Path,
    args: &[&str],
    processed: u64,
) -> (std::process::ExitStatus, String, std::path::PathBuf) {
    let log = control_plane.path("migrate-interrupted.log");
    let out = std::fs::File::create(&log).expect("a log file");
    let mut child = command(control_plane.kubeconfig(), state, args)
        .stdout(out.try_clone().expect("a log file"))
        .stderr(out)
        .stdin(Stdio::null())
        .spawn()
        .expect("kube-svm starts");
    let checkpoint = wait_for_checkpoint(state, processed, Duration::from_secs(60));
    let signal = Command::new("kill").arg("-INT").arg(child.id().to_string()).status();
    assert!(signal.is_ok_and(|s| s.success()));
    let exited = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        assert!(exited.elapsed() < Duration::from_secs(20), "no exit after SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    println!("$ kube-svm migrate {}  # SIGINT, exit {:?}\n{text}", args.join(" "), status.code());
    (status, text, checkpoint)
}

/// Waits for a checkpoint file in `state` recording at least `processed` objects.
fn wait_for_checkpoint(state: &Path, processed: u64, timeout: Duration) -> std::path::PathBuf {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        for entry in std::fs::read_dir(state).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let Ok(saved) =
                serde_json::from_slice::<Value>(&std::fs::read(&path).unwrap_or_default())
            else {
                continue;
            };
            if saved["status"]["progress"]["processed"].as_u64().unwrap_or(0) >= processed {
                return path;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no checkpoint with {processed} objects within {timeout:?}");
}

/// Widgets stored in etcd as `version`.
async fn stored_as(etcd: &Etcd, widgets: &WidgetCrd, version: &str) -> usize {
    Census::of(etcd, widgets).await.count(&widgets.api_version(version))
}
