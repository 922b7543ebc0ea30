//! The harness works, kube-svm's CRDs accept upstream objects, and the fact the whole tool rests
//! on holds: writing an object back unchanged re-encodes it in the current storage version, and
//! the apiserver skips the write when nothing would change.

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, ResourceExt};
use kube_svm::api::{StorageState, StorageVersionMigration};
use kube_svm::census::stored::Stored;
use serde_json::json;

use crate::support::Scenario;
use crate::support::fixtures::{WidgetCrd, create_namespace, unique};
use crate::support::{ControlPlane, shared};

#[tokio::test]
async fn harness_runs_a_real_apiserver_backed_by_etcd() {
    let control_plane = shared().await;
    let client = control_plane.client().await;

    let version = client.apiserver_version().await.expect("/version answers");
    assert_eq!(version.major, "1");

    // The apiserver's own namespace, read back from etcd as protobuf.
    let namespaces: Api<Namespace> = Api::all(client);
    let default = namespaces.get("default").await.expect("namespace default exists");
    let stored = control_plane
        .etcd()
        .get("/registry/namespaces/default")
        .await
        .expect("etcd answers")
        .expect("the key exists");
    assert_eq!(
        stored.stored(),
        Stored::Protobuf { api_version: "v1".into(), kind: "Namespace".into() }
    );
    assert_eq!(Some(stored.mod_revision.to_string()), default.resource_version());
}

/// A migration exactly as written for kube-storage-version-migrator (spec, and the status its
/// controller writes) survives a round trip through kube-svm's CRD.
#[tokio::test]
async fn upstream_objects_round_trip_through_the_crds() {
    let Scenario { client, .. } = Scenario::shared().await;

    let name = unique("upstream");
    let upstream_yaml = format!(
        r#"
apiVersion: migration.k8s.io/v1alpha1
kind: StorageVersionMigration
metadata:
  name: {name}
spec:
  continueToken: "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"
  resource:
    group: ""
    version: v1
    resource: secrets
"#
    );
    let object: DynamicObject = serde_yaml_ng::from_str(&upstream_yaml).expect("valid YAML");
    let gvk = GroupVersionKind::gvk("migration.k8s.io", "v1alpha1", "StorageVersionMigration");
    let dynamic: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
    dynamic.create(&PostParams::default(), &object).await.expect("the upstream object is accepted");

    let upstream_status = json!({ "status": { "conditions": [{
        "type": "Succeeded",
        "status": "True",
        "lastUpdateTime": "2026-01-02T03:04:05Z",
        "reason": "",
        "message": "",
    }]}});
    dynamic
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&upstream_status))
        .await
        .expect("the upstream status is accepted");

    let typed: Api<StorageVersionMigration> = Api::all(client.clone());
    let migration = typed.get(&name).await.expect("the migration reads as kube-svm's type");
    assert_eq!(migration.spec.resource.resource, "secrets");
    assert_eq!(migration.spec.resource.version, "v1");
    assert_eq!(migration.spec.resource.group, "");
    assert_eq!(migration.spec.continue_token.as_deref(), Some("eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"));
    let status = migration.status.expect("status was written");
    assert_eq!(status.conditions.len(), 1);
    assert_eq!(status.conditions[0].type_, "Succeeded");
    assert_eq!(status.conditions[0].status, "True");

    // Upstream tooling reads the raw object: its fields come back as written.
    let raw = dynamic.get(&name).await.expect("the object reads back");
    let raw = serde_json::to_value(raw).expect("serializable");
    assert_eq!(raw["spec"]["resource"]["resource"], "secrets");
    assert_eq!(raw["status"]["conditions"][0]["lastUpdateTime"], "2026-01-02T03:04:05Z");

    // spec.resource is immutable.
    let change = json!({ "spec": { "resource": { "resource": "configmaps" } } });
    let error = dynamic
        .patch(&name, &PatchParams::default(), &Patch::Merge(&change))
        .await
        .expect_err("spec.resource cannot change");
    match error {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422);
            assert!(status.message.contains("spec.resource is immutable"), "{}", status.message);
        }
        other => panic!("expected a validation error, got {other}"),
    }

    let state_name = unique("secrets");
    let state: StorageState = serde_json::from_value(json!({
        "apiVersion": "migration.k8s.io/v1alpha1",
        "kind": "StorageState",
        "metadata": { "name": state_name },
        "spec": { "resource": { "group": "", "resource": "secrets" } },
    }))
    .expect("valid StorageState");
    let states: Api<StorageState> = Api::all(client.clone());
    states.create(&PostParams::default(), &state).await.expect("the StorageState is created");
    let upstream_state_status = json!({ "status": {
        "persistedStorageVersionHashes": ["Unknown"],
        "currentStorageVersionHash": "S6u1pOWzb84=",
        "lastHeartbeatTime": "2026-01-02T03:04:05Z",
    }});
    states
        .patch_status(&state_name, &PatchParams::default(), &Patch::Merge(&upstream_state_status))
        .await
        .expect("the upstream status is accepted");
    let state = states.get(&state_name).await.expect("the state reads back");
    let status = state.status.expect("status was written");
    assert_eq!(status.persisted_storage_version_hashes, ["Unknown"]);
    assert_eq!(status.current_storage_version_hash.as_deref(), Some("S6u1pOWzb84="));
}

/// Changing a CRD's storage version leaves stored objects alone; writing an object back unchanged
/// re-encodes it (its mod_revision grows), and writing it back again is elided by the apiserver.
#[tokio::test]
async fn writing_back_unchanged_reencodes_once_then_is_elided() {
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let etcd = control_plane.etcd();
    let widgets = WidgetCrd::new("reencode", true);
    let namespace = unique("reencode");
    create_namespace(&client, &namespace).await;
    widgets.create(&client, "v1").await;

    let names = ["alpha", "beta", "gamma"];
    for name in names {
        widgets.create_widget(&client, "v1", Some(&namespace), name).await;
    }
    widgets.set_storage_version(&client, "v2").await;

    let stored = etcd.list(&widgets.etcd_prefix()).await.expect("etcd answers");
    assert_eq!(stored.len(), names.len());
    for kv in &stored {
        assert_eq!(kv.api_version(), widgets.api_version("v1"), "{} is still stored as v1", kv.key);
    }

    // The write a migrator sends: only type, identity and the resourceVersion precondition.
    let api = widgets.api(&client, "v2", Some(&namespace));
    let key = widgets.etcd_key(Some(&namespace), "beta");
    let before = etcd.get(&key).await.expect("etcd answers").expect("beta is stored");
    let write_back = |resource_version: String| {
        json!({
            "apiVersion": widgets.api_version("v2"),
            "kind": WidgetCrd::KIND,
            "metadata": { "name": "beta", "namespace": namespace, "resourceVersion": resource_version },
        })
    };

    let written = api
        .patch(
            "beta",
            &PatchParams::default(),
            &Patch::Merge(write_back(before.mod_revision.to_string())),
        )
        .await
        .expect("the write-back succeeds");
    let after = etcd.get(&key).await.expect("etcd answers").expect("beta is stored");
    assert_eq!(after.api_version(), widgets.api_version("v2"));
    assert!(after.mod_revision > before.mod_revision, "the object was rewritten");
    assert_eq!(written.resource_version(), Some(after.mod_revision.to_string()));
    assert_eq!(written.data["spec"]["note"], "created by a test", "the content is unchanged");

    let rewritten_again = api
        .patch(
            "beta",
            &PatchParams::default(),
            &Patch::Merge(write_back(after.mod_revision.to_string())),
        )
        .await
        .expect("the second write-back succeeds");
    let again = etcd.get(&key).await.expect("etcd answers").expect("beta is stored");
    assert_eq!(again.mod_revision, after.mod_revision, "an identical write is elided");
    assert_eq!(rewritten_again.resource_version(), Some(after.mod_revision.to_string()));

    // The other objects were not touched.
    for name in ["alpha", "gamma"] {
        let kv = etcd
            .get(&widgets.etcd_key(Some(&namespace), name))
            .await
            .expect("etcd")
            .expect("stored");
        assert_eq!(kv.api_version(), widgets.api_version("v1"));
    }

    // A stale resourceVersion makes the write conditional: 409, nothing written.
    let stale = api
        .patch("alpha", &PatchParams::default(), &Patch::Merge(json!({
            "apiVersion": widgets.api_version("v2"),
            "kind": WidgetCrd::KIND,
            "metadata": { "name": "alpha", "namespace": namespace, "resourceVersion": before.mod_revision.to_string() },
        })))
        .await
        .expect_err("a stale resourceVersion conflicts");
    assert!(matches!(stale, kube::Error::Api(ref status) if status.code == 409), "{stale}");
}

/// A test can run its own control plane and restart its apiserver with other flags; here, an
/// encryption configuration, which the stored bytes then show.
#[tokio::test]
async fn a_private_control_plane_restarts_with_new_flags() {
    let control_plane = ControlPlane::start(&[]).await.expect("a private control plane starts");
    let client = control_plane.client().await;
    let secrets: Api<Secret> = Api::namespaced(client, "default");
    let plain: Secret = serde_json::from_value(json!({
        "metadata": { "name": "plain" }, "stringData": { "password": "hunter2" },
    }))
    .expect("valid secret");
    secrets.create(&PostParams::default(), &plain).await.expect("the secret is created");
    let key = "/registry/secrets/default/plain";
    let stored = control_plane.etcd().get(key).await.expect("etcd").expect("stored");
    assert_eq!(
        stored.stored(),
        Stored::Protobuf { api_version: "v1".into(), kind: "Secret".into() }
    );

    let config = control_plane.path("encryption.yaml");
    std::fs::write(
        &config,
        "apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [secrets]
  providers:
  - aescbc:
      keys:
      - name: key1
        secret: c2VjcmV0IGlzIHNlY3VyZSwgaSBwcm9taXNlIHRoaXM=
  - identity: {}
",
    )
    .expect("the encryption configuration is written");
    let flag = format!("--encryption-provider-config={}", config.display());
    control_plane.restart_apiserver(&[&flag]).await.expect("the apiserver restarts");

    let secrets: Api<Secret> = Api::namespaced(control_plane.client().await, "default");
    let encrypted: Secret = serde_json::from_value(json!({
        "metadata": { "name": "encrypted" }, "stringData": { "password": "hunter2" },
    }))
    .expect("valid secret");
    secrets.create(&PostParams::default(), &encrypted).await.expect("the secret is created");
    let stored = control_plane
        .etcd()
        .get("/registry/secrets/default/encrypted")
        .await
        .expect("etcd")
        .expect("stored");
    assert_eq!(
        stored.stored(),
        Stored::Encrypted { provider: "aescbc".into(), key_name: "key1".into() }
    );
    assert!(!String::from_utf8_lossy(&stored.value).contains("hunter2"));
    // Written before the restart, still in clear, still readable.
    let stored = control_plane.etcd().get(key).await.expect("etcd").expect("stored");
    assert!(matches!(stored.stored(), Stored::Protobuf { .. }));
    assert!(secrets.get("plain").await.is_ok());
}

/// Compacting etcd expires continue tokens: the apiserver answers 410 Gone. With the watch cache
/// on, kube-apiserver serves later pages from its own snapshots and rarely sees the compaction,
/// so fault tests that need the 410 turn the cache off.
#[tokio::test]
async fn compaction_expires_continue_tokens() {
    let control_plane = ControlPlane::start(&["--watch-cache=false"]).await.expect("starts");
    let client = control_plane.client().await;
    let widgets = WidgetCrd::new("compaction", false);
    widgets.create(&client, "v1").await;
    for name in ["one", "two", "three"] {
        widgets.create_widget(&client, "v1", None, name).await;
    }
    let api = widgets.api(&client, "v1", None);
    let first = api.list_metadata(&ListParams::default().limit(1)).await.expect("first page");
    let token = first.metadata.continue_.expect("more pages");

    // Compaction keeps the revision it compacts at: write once more so the token's is gone.
    widgets.create_widget(&client, "v1", None, "four").await;
    let etcd = control_plane.etcd();
    etcd.compact(etcd.revision().await.expect("revision")).await.expect("compaction");

    let error = api
        .list_metadata(&ListParams::default().limit(1).continue_token(&token))
        .await
        .expect_err("the token has expired");
    match error {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected 410 Gone, got {other}"),
    }
}

/// `kubectl get svm` and `kubectl get kube-svm` reach kube-svm's objects: no resource the
/// apiserver serves shares those names, while the in-tree migrator's API does share the plural
/// `storageversionmigrations` (the reason the short name exists).
#[tokio::test]
async fn short_names_and_category_belong_to_kube_svm_alone() {
    let Scenario { client, .. } = Scenario::shared().await;
    let mut lists =
        vec![("v1".to_owned(), client.list_core_api_resources("v1").await.expect("core"))];
    for group in client.list_api_groups().await.expect("groups").groups {
        for version in group.versions {
            // A missing aggregated API of another test may not answer; it serves neither name.
            if let Ok(list) = client.list_api_group_resources(&version.group_version).await {
                lists.push((version.group_version, list));
            }
        }
    }
    let mut ours = Vec::new();
    let mut others_named = Vec::new();
    for (group_version, list) in &lists {
        for resource in &list.resources {
            let short_names = resource.short_names.clone().unwrap_or_default();
            let categories = resource.categories.clone().unwrap_or_default();
            let named = |name: &str| short_names.iter().any(|s| s == name) || resource.name == name;
            if group_version.starts_with("migration.k8s.io/") {
                ours.push((resource.name.clone(), short_names.clone(), categories.clone()));
                continue;
            }
            for name in ["svm", "svmstate", "kube-svm"] {
                assert!(
                    !named(name) && !categories.iter().any(|c| c == name),
                    "{group_version} {} also answers to {name}",
                    resource.name
                );
            }
            if resource.name == "storageversionmigrations" {
                others_named.push(group_version.clone());
            }
        }
    }
    let svm = ours.iter().find(|(name, ..)| name == "storageversionmigrations").expect("served");
    assert_eq!(
        (svm.1.clone(), svm.2.clone()),
        (vec!["svm".to_owned()], vec!["kube-svm".to_owned()])
    );
    let states = ours.iter().find(|(name, ..)| name == "storagestates").expect("served");
    assert_eq!(states.1, ["svmstate"]);
    assert!(
        others_named.iter().any(|gv| gv.starts_with("storagemigration.k8s.io/")),
        "1.37 serves the in-tree migrator's storageversionmigrations: {others_named:?}"
    );
}
