//! `kube-svm controller` starting on clusters whose CRDs are missing or someone else's
//! (kube-storage-version-migrator's), taken over in place, and stopped by a signal in every
//! state of its start-up.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_svm::api::{
    GroupResource, Phase, StorageState, StorageStateSpec, StorageVersionMigration,
};
use serde_json::json;

use crate::support::fixtures::{WidgetCrd, install_kube_svm_crds};
use crate::support::migrations::{
    create_migration, event_reasons, phase_is, triggered, wait_for, wait_for_triggered,
};
use crate::support::process::KubeSvm;
use crate::support::upstream::{CRDS, install_upstream_crds, take_over_as_the_readme_says};
use crate::support::{CONTROLLER_NAMESPACE, ControlPlane, http_client};

/// How long a stopped controller may take to exit: "promptly", on a loaded machine.
const EXIT_WITHIN: Duration = Duration::from_secs(5);

/// `/readyz` of `controller`: (code, body).
async fn readyz(controller: &KubeSvm) -> (u16, String) {
    let url = format!("{}/readyz", controller.admin_url().await);
    match http_client().get(url).send().await {
        Ok(response) => (response.status().as_u16(), response.text().await.unwrap_or_default()),
        Err(error) => (0, error.to_string()),
    }
}

/// Polls `/readyz` until `done` holds for (code, body).
async fn wait_readyz(controller: &KubeSvm, done: impl Fn(u16, &str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, body) = readyz(controller).await;
        if done(code, &body) {
            return body;
        }
        assert!(Instant::now() < deadline, "/readyz: {code} {body}\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends `signal` and checks the process exits 0 within [`EXIT_WITHIN`].
fn stop(controller: &mut KubeSvm, signal: &str) {
    controller.signal(signal);
    let exit = controller.wait(EXIT_WITHIN);
    let exit =
        exit.unwrap_or_else(|| panic!("still running after SIG{signal}\n{}", controller.logs()));
    assert!(exit.success(), "exit status {exit}\n{}", controller.logs());
}

/// On a cluster without kube-svm's CRDs the controller says once that they are not installed
/// and how to install them, starts no watch (whose 404s would say "page not found" every few
/// seconds), is not ready, and SIGTERM ends it at once. A signal ends it as promptly while it
/// waits for leadership, and while it runs after its CRDs were deleted.
#[tokio::test]
async fn without_its_crds_the_controller_says_how_to_install_them_and_stops_at_once() {
    let control_plane = ControlPlane::start(&[]).await.expect("a private control plane starts");
    let mut controller = KubeSvm::start(
        &control_plane,
        "no-crds",
        &["controller", "--leader-elect=true", "--crd-trigger=true", "--discovery-trigger"],
    )
    .await;
    let logs =
        controller.wait_for_log("kube-svm's CRDs are not installed", Duration::from_secs(60)).await;
    assert!(logs.contains("kube-svm crds | kubectl apply --server-side"), "{logs}");
    assert!(logs.contains("ERROR"), "said as an error: {logs}");
    let body =
        wait_readyz(&controller, |code, body| code == 503 && body.contains("not installed")).await;
    assert!(body.contains("storageversionmigrations.migration.k8s.io"), "{body}");
    // A few more checks go by (one every 2 s): still said once, and nothing watched.
    let checks_later = Instant::now() + Duration::from_secs(5);
    while Instant::now() < checks_later {
        assert_eq!(readyz(&controller).await.0, 503);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop(&mut controller, "TERM");
    let logs = controller.logs();
    assert_eq!(logs.matches("kube-svm's CRDs are not installed").count(), 1, "{logs}");
    assert!(!logs.contains("page not found") && !logs.contains("Failed to parse"), "{logs}");
    assert!(!logs.contains("waiting for leadership"), "no election before the CRDs: {logs}");

    // With the CRDs, while another replica holds the Lease for a long time.
    let client = control_plane.client().await;
    install_kube_svm_crds(&client).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), CONTROLLER_NAMESPACE);
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": "kube-svm" },
        "spec": {
            "holderIdentity": "another-replica",
            "leaseDurationSeconds": 3600,
            "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(Timestamp::now()),
            "acquireTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(Timestamp::now()),
        },
    }))
    .expect("a valid Lease");
    leases.create(&PostParams::default(), &lease).await.expect("the Lease is created");
    let mut standby =
        KubeSvm::start(&control_plane, "standby", &["controller", "--leader-elect=true"]).await;
    standby.wait_for_log("waiting for leadership", Duration::from_secs(60)).await;
    stop(&mut standby, "INT");

    // Running with its watches refused (RBAC that lets it read the CRDs but not list the
    // migrations): they never sync, and kube-runtime's graceful shutdown waits for that.
    let kubeconfig = may_only_read_crds(&control_plane, &client).await;
    let mut refused = KubeSvm::start_as(
        &control_plane,
        "refused",
        &["controller", "--leader-elect=false"],
        &kubeconfig,
    );
    refused.wait_for_log("controller started", Duration::from_secs(60)).await;
    refused.wait_for_log("forbidden", Duration::from_secs(60)).await;
    stop(&mut refused, "TERM");

    // Running, when the CRDs are deleted under it: its watches cannot list any more.
    let mut running =
        KubeSvm::start(&control_plane, "running", &["controller", "--leader-elect=false"]).await;
    wait_readyz(&running, |code, _| code == 200).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in CRDS {
        crds.delete(name, &Default::default()).await.expect("deleted");
    }
    running.wait_for_log("404", Duration::from_secs(60)).await;
    stop(&mut running, "TERM");
}

/// A kubeconfig for a user who may read CRDs and nothing else.
async fn may_only_read_crds(control_plane: &ControlPlane, client: &Client) -> std::path::PathBuf {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let user = "crd-reader";
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": { "name": user },
        "rules": [{
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["get"],
        }],
    }))
    .expect("valid");
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("created");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": user },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
    }))
    .expect("valid");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("created");
    let admin = std::fs::read_to_string(control_plane.kubeconfig()).expect("the kubeconfig");
    let (before, after) = admin.split_once("    token: ").expect("a token user");
    let (token, rest) = after.split_once('\n').expect("a line");
    let path = control_plane.path("kubeconfig-crd-reader");
    std::fs::write(&path, format!("{before}    token: {token}\n    as: {user}\n{rest}"))
        .expect("written");
    path
}

/// kube-storage-version-migrator's CRDs, whose status schema holds only `conditions`: the
/// controller refuses to migrate, naming the fields they would drop, in its log, `/readyz` and
/// a Warning Event on the CRD. The README's command takes them over in place: every object
/// upstream left survives, the waiting controller starts, and a CRD switched to a new storage
/// version is migrated and its `storedVersions` pruned.
#[tokio::test]
async fn upstream_crds_are_refused_until_taken_over_in_place() {
    let control_plane = ControlPlane::start(&[]).await.expect("a private control plane starts");
    let client = control_plane.client().await;
    install_upstream_crds(&control_plane).await;
    let (migration_uid, state_uid) = upstream_leftovers(&client).await;
    let widgets = WidgetCrd::stale(&client, "takeover", 50).await;

    let controller = KubeSvm::start(
        &control_plane,
        "controller",
        &["controller", "--leader-elect=false", "--crd-trigger=true"],
    )
    .await;
    let logs = controller.wait_for_log("schema would drop", Duration::from_secs(60)).await;
    println!("{logs}");
    for field in
        [".status.listedFromStart", ".status.target", ".status.checkpoint", ".status.progress"]
    {
        assert!(logs.contains(field), "{field} named: {logs}");
    }
    assert!(
        logs.contains("kube-svm crds | kubectl apply --server-side --force-conflicts -f -"),
        "{logs}"
    );
    let body =
        wait_readyz(&controller, |code, body| code == 503 && body.contains("would drop")).await;
    assert!(
        body.contains(".status.listedFromStart") && body.contains("--force-conflicts"),
        "{body}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !event_reasons(&client, CRDS[0]).await.iter().any(|r| r == "IncompatibleSchema") {
        assert!(Instant::now() < deadline, "no Warning Event on the CRD\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Upstream's StorageState schema keeps every field kube-svm writes: no Event on it.
    assert!(event_reasons(&client, CRDS[1]).await.is_empty());
    assert!(triggered(&client, &widgets, "crd").await.is_empty(), "nothing migrated meanwhile");

    take_over_as_the_readme_says(&control_plane);

    // Every object upstream left is still there, the same object with the same status.
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    let left = migrations.get("left-by-upstream").await.expect("kept");
    assert_eq!(left.metadata.uid.as_deref(), Some(migration_uid.as_str()));
    assert_eq!(Phase::of(&left), Phase::Succeeded);
    let state = Api::<StorageState>::all(client.clone()).get("secrets").await.expect("kept");
    assert_eq!(state.metadata.uid.as_deref(), Some(state_uid.as_str()));
    let hashes = state.status.map(|s| s.persisted_storage_version_hashes).unwrap_or_default();
    assert_eq!(hashes, ["Unknown", "abc"]);
    // The schemas are kube-svm's now.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for ours in kube_svm::api::crds() {
        let installed = crds.get(ours.metadata.name.as_deref().unwrap_or_default()).await;
        let installed = installed.expect("the CRD is there");
        assert_eq!(kube_svm::api::installed::check(&ours, Some(&installed)), Ok(()));
    }

    // The waiting controller starts on its own and migrates the switched CRD, with every
    // status field kept, and prunes its storedVersions.
    wait_readyz(&controller, |code, _| code == 200).await;
    let created = wait_for_triggered(&client, &widgets, 1, &controller).await;
    let name = created.metadata.name.clone().expect("named");
    let done = wait_for(
        &client,
        &name,
        Duration::from_secs(90),
        &[&controller],
        phase_is(Phase::Succeeded),
    )
    .await;
    let status = done.status.expect("a status");
    assert_eq!(status.listed_from_start, Some(true));
    assert!(status.target.is_some() && status.progress.is_some(), "status fields kept");
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 50).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let crd = crds.get(&widgets.name()).await.expect("the CRD");
        let stored = crd.status.and_then(|s| s.stored_versions).unwrap_or_default();
        if stored == ["v2"] {
            break;
        }
        assert!(Instant::now() < deadline, "storedVersions {stored:?}\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A migration created by hand runs too.
    create_migration(&client, "after-takeover", "", "configmaps").await;
    wait_for(
        &client,
        "after-takeover",
        Duration::from_secs(60),
        &[&controller],
        phase_is(Phase::Succeeded),
    )
    .await;
}

/// What kube-storage-version-migrator leaves behind: a finished migration and a StorageState.
/// Returns their UIDs.
async fn upstream_leftovers(client: &Client) -> (String, String) {
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    let migration: StorageVersionMigration = serde_json::from_value(json!({
        "apiVersion": "migration.k8s.io/v1alpha1",
        "kind": "StorageVersionMigration",
        "metadata": { "name": "left-by-upstream" },
        "spec": { "resource": { "group": "", "version": "v1", "resource": "secrets" } },
    }))
    .expect("valid");
    let created = migrations.create(&PostParams::default(), &migration).await.expect("created");
    let status = json!({ "status": { "conditions": [{
        "type": "Succeeded", "status": "True", "lastUpdateTime": Time(Timestamp::now()),
    }]}});
    migrations
        .patch_status("left-by-upstream", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status written");
    let states: Api<StorageState> = Api::all(client.clone());
    let spec = StorageStateSpec {
        resource: GroupResource { group: String::new(), resource: "secrets".into() },
    };
    let state = states
        .create(&PostParams::default(), &StorageState::new("secrets", spec))
        .await
        .expect("created");
    let status = json!({ "status": {
        "persistedStorageVersionHashes": ["Unknown", "abc"],
        "currentStorageVersionHash": "abc",
        "lastHeartbeatTime": Time(Timestamp::now()),
    }});
    states
        .patch_status("secrets", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status written");
    (created.metadata.uid.unwrap_or_default(), state.metadata.uid.unwrap_or_default())
}
