//! The migration engine against a real apiserver: every object ends in the storage version (read
//! from etcd), counters add up, and faults from the real thing are survived.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_svm::api::{GroupVersionResource, Pace};
use kube_svm::engine::{
    Engine, Finished, Job, Progress, RateLimiter, ResolveError, Resource, Settings,
};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::support::admission::deny_updates;
use crate::support::fixtures::{
    KEY1, KEY2, WidgetCrd, create_namespace, encrypt_secrets, secrets_under_key1, unique,
    vanish_namespace,
};
use crate::support::invariant::{self, Census, Ending};
use crate::support::{ControlPlane, shared};

/// Where kube-apiserver keeps every Secret.
const SECRETS: &str = "/registry/secrets/";

/// Settings for tests: no client-side rate limit, so the apiserver sets the pace.
fn engine(config: kube::Config, settings: Settings) -> Engine {
    let metrics = Arc::new(kube_svm::ops::metrics::Metrics::new().expect("metrics register"));
    Engine::new(config, Arc::new(RateLimiter::new(0.0, 1)), settings, metrics).expect("an engine")
}

fn target(group: &str, resource: &str) -> GroupVersionResource {
    GroupVersionResource { group: group.into(), version: String::new(), resource: resource.into() }
}

/// Resolves and migrates `resource` to completion.
async fn migrate(engine: &Engine, client: &Client, group: &str, resource: &str) -> Progress {
    migrate_during(engine, client, &target(group, resource), |_| async {}).await
}

/// Migrates every widget with an engine of `settings`.
async fn migrate_widgets(
    control_plane: &ControlPlane,
    client: &Client,
    widgets: &WidgetCrd,
    settings: Settings,
) -> Progress {
    let engine = engine(control_plane.config().await, settings);
    migrate(&engine, client, &widgets.group, WidgetCrd::PLURAL).await
}

/// Migrates `target` while `during` runs alongside, watching the progress reports.
async fn migrate_during<F: Future<Output = ()>>(
    engine: &Engine,
    client: &Client,
    target: &GroupVersionResource,
    during: impl FnOnce(watch::Receiver<Progress>) -> F,
) -> Progress {
    let resource = Resource::resolve(client, target, false).await.expect("the resource resolves");
    let (report, updates) = watch::channel(Progress::default());
    let job = Job {
        resource,
        write_to_status: false,
        pace: None,
        resume: Progress::default(),
        fence: kube_svm::apiserver::fence::Fence::open(),
        clean_managed_fields: None,
        budget: None,
    };
    let cancel = CancellationToken::new();
    let (finished, ()) = tokio::join!(engine.run(job, &report, &cancel), during(updates));
    match finished.expect("the migration runs") {
        Finished::Completed(progress) => progress,
        Finished::Cancelled(_) => panic!("nothing cancelled the migration"),
    }
}

/// A namespaced and a cluster-scoped CRD with thousands of objects, stored at v1, storage
/// switched to v2: the engine rewrites every one, and a second pass rewrites nothing.
#[tokio::test]
async fn migrates_every_object_then_finds_nothing_left() {
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let etcd = control_plane.etcd();

    let namespaced = WidgetCrd::new("engine-ns", true);
    let cluster = WidgetCrd::new("engine-cluster", false);
    namespaced.create(&client, "v1").await;
    cluster.create(&client, "v1").await;
    let namespaces: Vec<String> = (0..4).map(|_| unique("engine")).collect();
    for namespace in &namespaces {
        create_namespace(&client, namespace).await;
    }
    let namespace_refs: Vec<Option<&str>> = namespaces.iter().map(|n| Some(n.as_str())).collect();
    namespaced.seed(&client, "v1", &namespace_refs, 600).await;
    cluster.seed(&client, "v1", &[None], 300).await;
    namespaced.set_storage_version(&client, "v2").await;
    cluster.set_storage_version(&client, "v2").await;
    namespaced.assert_all_stored_as(&etcd, "v1", 2400).await;

    let engine = engine(control_plane.config().await, Settings::default());
    let progress = migrate(&engine, &client, &namespaced.group, WidgetCrd::PLURAL).await;
    namespaced.assert_all_stored_as(&etcd, "v2", 2400).await;
    assert_eq!((progress.listed, progress.rewritten, progress.processed()), (2400, 2400, 2400));
    assert_eq!((progress.already_current, progress.skipped, progress.failed), (0, 0, 0));
    assert_eq!(progress.pages, 5, "500 objects a page");
    assert_eq!(progress.remaining, Some(0));
    assert_eq!(progress.continue_token, None);

    let progress = migrate(&engine, &client, &cluster.group, WidgetCrd::PLURAL).await;
    cluster.assert_all_stored_as(&etcd, "v2", 300).await;
    assert_eq!((progress.rewritten, progress.failed), (300, 0));

    // A second pass finds everything current and etcd is not written at all.
    let before = etcd.list(&namespaced.etcd_prefix()).await.expect("etcd");
    let again = migrate(&engine, &client, &namespaced.group, WidgetCrd::PLURAL).await;
    assert_eq!((again.already_current, again.rewritten, again.processed()), (2400, 0, 2400));
    let after = etcd.list(&namespaced.etcd_prefix()).await.expect("etcd");
    let revisions = |kvs: &[crate::support::KeyValue]| {
        kvs.iter().map(|kv| (kv.key.clone(), kv.mod_revision)).collect::<Vec<_>>()
    };
    assert_eq!(revisions(&before), revisions(&after), "no object was written again");
}

/// Writing through the status subresource re-encodes the whole object too.
#[tokio::test]
async fn migrates_through_the_status_subresource() {
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let widgets = WidgetCrd::stale(&client, "status", 100).await;
    let target = target(&widgets.group, WidgetCrd::PLURAL);
    let resource = Resource::resolve(&client, &target, true).await.expect("resolves with status");
    assert!(resource.patchable_status);
    let engine = engine(control_plane.config().await, Settings::default());
    let (report, _) = watch::channel(Progress::default());
    let job = Job {
        resource,
        write_to_status: true,
        pace: None,
        resume: Progress::default(),
        fence: kube_svm::apiserver::fence::Fence::open(),
        clean_managed_fields: None,
        budget: None,
    };
    let finished = engine.run(job, &report, &CancellationToken::new()).await.expect("runs");
    let Finished::Completed(progress) = finished else { panic!("not cancelled") };
    assert_eq!((progress.rewritten, progress.failed), (100, 0), "{:?}", progress.failures.first());
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 100).await;
}

/// Secrets written with key1 are re-encrypted with key2 once key2 is first in the configuration:
/// every Secret in etcd, counted exactly, ends under key2.
#[tokio::test]
async fn rotates_the_encryption_key_of_secrets() {
    let (control_plane, namespace) = secrets_under_key1(50).await;
    let etcd = control_plane.etcd();
    let under_key1 = Census::under(&etcd, SECRETS).await;
    assert_eq!(under_key1.count("aescbc:key1"), 50, "{under_key1:?}");

    control_plane
        .restart_apiserver(&[&encrypt_secrets(&control_plane, &[KEY2, KEY1])])
        .await
        .expect("restarts with key2 first");
    let client = control_plane.client().await;
    let progress =
        migrate(&engine(control_plane.config().await, Settings::default()), &client, "", "secrets")
            .await;
    assert_eq!((progress.failed, progress.rewritten), (0, 50), "{progress:?}");
    let ending = Ending { succeeded_as: Some("aescbc:key2".into()), stored_versions_only: None };
    if let Err(breach) = invariant::judge(&Census::under(&etcd, SECRETS).await, 50, &ending) {
        panic!("{breach}");
    }
    // The apiserver still reads them.
    let secrets: Api<Secret> = Api::namespaced(client, &namespace);
    assert!(secrets.get("s-7").await.expect("readable").data.is_some());
}

/// A concurrent writer keeps updating objects while the engine runs with small pages: none of
/// its updates are lost, and every object ends in v2.
#[tokio::test]
async fn concurrent_writes_are_never_lost() {
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let widgets = WidgetCrd::stale(&client, "concurrent", 400).await;

    let stop = CancellationToken::new();
    let writer = {
        let (api, stop) = (widgets.api(&client, "v1", None), stop.clone());
        tokio::spawn(async move {
            let mut written = std::collections::BTreeMap::new();
            let mut round = 0u64;
            while !stop.is_cancelled() {
                round += 1;
                let name = format!("w-{}", (round * 37) % 400);
                let patch = json!({ "spec": { "round": round } });
                if api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_ok() {
                    written.insert(name, round);
                }
            }
            written
        })
    };
    let settings = Settings { page_size: 20, writes_in_flight: 4, ..Settings::default() };
    let progress = migrate_widgets(control_plane, &client, &widgets, settings).await;
    stop.cancel();
    let written = writer.await.expect("the writer ran");

    assert!(written.len() > 10, "the writer raced the migration: {} updates", written.len());
    assert_eq!(progress.failed, 0);
    assert_eq!(progress.processed(), 400);
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 400).await;
    let api = widgets.api(&client, "v2", None);
    for (name, round) in written {
        let object = api.get(&name).await.expect("exists");
        assert_eq!(object.data["spec"]["round"], json!(round), "{name} kept its last update");
    }
}

/// Objects deleted while the engine runs are skipped, not failed.
#[tokio::test]
async fn objects_deleted_mid_run_are_not_failures() {
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let widgets = WidgetCrd::stale(&client, "deleted", 300).await;

    let settings = Settings { page_size: 50, writes_in_flight: 2, ..Settings::default() };
    let engine = engine(control_plane.config().await, settings);
    let api = widgets.api(&client, "v1", None);
    let progress = migrate_during(
        &engine,
        &client,
        &target(&widgets.group, WidgetCrd::PLURAL),
        |mut updates| async move {
            // After the first page, delete objects that later pages hold.
            updates.changed().await.expect("a page is reported");
            for i in (150..300).step_by(3) {
                api.delete(&format!("w-{i}"), &Default::default()).await.expect("deleted");
            }
        },
    )
    .await;
    assert_eq!(progress.failed, 0, "{:?}", progress.failures);
    assert_eq!(progress.processed(), progress.listed);
    // Each of the 250 survivors was rewritten once; a deleted object was never listed, listed
    // and then skipped, or (the engine reaching it before its deletion) rewritten just before.
    assert!((250..300).contains(&progress.rewritten), "{progress:?}");
    assert_eq!(progress.rewritten + progress.skipped, progress.listed, "{progress:?}");
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 250).await;
}

/// etcd compaction expires the continue token mid-run (410): the engine goes on and completes.
#[tokio::test]
async fn survives_compaction_mid_run() {
    let control_plane = ControlPlane::start(&["--watch-cache=false"]).await.expect("starts");
    let client = control_plane.client().await;
    let widgets = WidgetCrd::stale(&client, "compaction", 200).await;

    // One write at a time and one page of 10: the run spans many pages and revisions.
    let settings = Settings { page_size: 10, writes_in_flight: 1, ..Settings::default() };
    let engine = engine(control_plane.config().await, settings);
    let etcd = control_plane.etcd();
    let progress = migrate_during(
        &engine,
        &client,
        &target(&widgets.group, WidgetCrd::PLURAL),
        |mut updates| {
            // Borrowed, not moved: the control plane must outlive the closure.
            let etcd = &etcd;
            async move {
                for _ in 0..3 {
                    updates.changed().await.expect("a page is reported");
                    etcd.compact(etcd.revision().await.expect("revision"))
                        .await
                        .expect("compacted");
                }
            }
        },
    )
    .await;
    assert_eq!(progress.failed, 0);
    widgets.assert_all_stored_as(&etcd, "v2", 200).await;
    assert_eq!(progress.rewritten, 200, "{progress:?}");
    assert!(progress.expired_tokens >= 1, "the compaction expired a continue token: {progress:?}");
}

/// A ValidatingAdmissionPolicy rejects updates of labelled objects: exactly those are reported
/// failed with the apiserver's code and message, the rest are migrated, and the run ends.
#[tokio::test]
async fn admission_rejections_fail_only_the_rejected_objects() {
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let widgets = WidgetCrd::new("admission", false);
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 100).await;
    let api = widgets.api(&client, "v1", None);
    let rejected: Vec<String> = (0..100).step_by(10).map(|i| format!("w-{i}")).collect();
    for name in &rejected {
        let label = json!({ "metadata": { "labels": { "frozen": "true" } } });
        api.patch(name, &PatchParams::default(), &Patch::Merge(&label)).await.expect("labelled");
    }
    reject_updates_of_frozen(&client, &widgets.group).await;
    widgets.set_storage_version(&client, "v2").await;

    let started = Instant::now();
    let settings = Settings { write_attempts: 3, ..Settings::default() };
    let progress = migrate_widgets(control_plane, &client, &widgets, settings).await;
    assert!(started.elapsed() < Duration::from_secs(60), "rejections are not retried for long");
    assert_eq!((progress.failed, progress.rewritten), (10, 90));
    let mut failed: Vec<_> = progress.failures.iter().map(|f| f.name.clone()).collect();
    failed.sort();
    let mut expected = rejected.clone();
    expected.sort();
    assert_eq!(failed, expected);
    for failure in &progress.failures {
        assert_eq!(failure.code, 422, "{failure:?}");
        assert_eq!(failure.reason, "Invalid");
        assert!(
            failure.message.contains("frozen objects cannot be updated"),
            "{}",
            failure.message
        );
    }
    let etcd = control_plane.etcd();
    for kv in etcd.list(&widgets.etcd_prefix()).await.expect("etcd") {
        let frozen = rejected.iter().any(|name| kv.key.ends_with(&format!("/{name}")));
        let expected = widgets.api_version(if frozen { "v1" } else { "v2" });
        assert_eq!(kv.api_version(), expected, "{}", kv.key);
    }
}

/// Installs a policy denying updates of widgets labelled `frozen`, and waits until it applies.
pub(crate) async fn reject_updates_of_frozen(client: &Client, group: &str) {
    // Policies apply once the apiserver's informers see them: probe with a throwaway object,
    // labelled before the policy exists (the label itself would be refused once it applies).
    let widgets = WidgetCrd { group: group.to_owned(), namespaced: false };
    let probe = widgets.create_widget(client, "v1", None, "probe").await;
    let api = widgets.api(client, "v1", None);
    let freeze = json!({ "metadata": { "labels": { "frozen": "true" } } });
    api.patch("probe", &PatchParams::default(), &Patch::Merge(&freeze)).await.expect("labelled");
    deny_updates(
        client,
        &format!("freeze-{group}"),
        group,
        &["widgets"],
        "!has(object.metadata.labels) || !('frozen' in object.metadata.labels)",
        "frozen objects cannot be updated",
        Some("Invalid"),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let touch =
            json!({ "spec": { "touched": Instant::now().elapsed().as_nanos().to_string() } });
        if api.patch("probe", &PatchParams::default(), &Patch::Merge(&touch)).await.is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "the policy never applied");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(probe);
    api.delete("probe", &Default::default()).await.expect("the probe is deleted");
}

/// Admission that changes what a write sends (a MutatingAdmissionPolicy setting a spec field on
/// every update): the write moved each object's generation, so each object fails, saying why,
/// instead of counting as rewritten: a migration must change nothing but the encoding.
#[tokio::test]
async fn a_write_that_admission_changes_fails_its_object() {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
    };
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let widgets = WidgetCrd::stale(&client, "mutated", 20).await;
    let name = format!("mutate-{}", widgets.group);
    let policy: MutatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "matchConstraints": { "resourceRules": [{
                "apiGroups": [widgets.group], "apiVersions": ["*"],
                "operations": ["UPDATE"], "resources": ["widgets"],
            }]},
            "mutations": [{
                "patchType": "ApplyConfiguration",
                "applyConfiguration": {
                    "expression": "Object{spec: Object.spec{mutated: \"yes\"}}",
                },
            }],
            "reinvocationPolicy": "Never",
            "failurePolicy": "Fail",
        },
    }))
    .expect("a valid policy");
    let binding: MutatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "policyName": name },
    }))
    .expect("a valid binding");
    Api::<MutatingAdmissionPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("the policy is created");
    Api::<MutatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("the binding is created");
    // The policy applies once the apiserver's informers see it: probe with a throwaway widget.
    widgets.create_widget(&client, "v2", None, "probe").await;
    let api = widgets.api(&client, "v2", None);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let touch = json!({ "metadata": { "annotations": { "touched": "yes" } } });
        let touched =
            api.patch("probe", &PatchParams::default(), &Patch::Merge(&touch)).await.expect("ok");
        if touched.data["spec"]["mutated"] == json!("yes") {
            break;
        }
        assert!(Instant::now() < deadline, "the policy never applied");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    api.delete("probe", &Default::default()).await.expect("the probe is deleted");

    let progress = migrate_widgets(control_plane, &client, &widgets, Settings::default()).await;
    assert_eq!((progress.failed, progress.rewritten), (20, 0), "{progress:?}");
    for failure in &progress.failures {
        assert_eq!(failure.reason, "ContentChanged", "{failure:?}");
        assert!(failure.message.contains("generation"), "{failure:?}");
    }
    Api::<MutatingAdmissionPolicyBinding>::all(client.clone())
        .delete(&name, &Default::default())
        .await
        .expect("the binding is deleted");
}

/// Unknown resources, subresources and resources without list/patch fail at once, by name.
#[tokio::test]
async fn unmigratable_resources_are_refused_with_the_reason() {
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let resolve = |group: &'static str, resource: &'static str| {
        let client = client.clone();
        async move { Resource::resolve(&client, &target(group, resource), false).await }
    };
    let started = Instant::now();

    let error = resolve("", "nosuchthings").await.expect_err("unknown");
    assert!(matches!(error, ResolveError::UnknownResource { .. }), "{error}");
    assert_eq!(error.to_string(), "the apiserver serves no resource \"nosuchthings\" in v1");

    let error = resolve("no.such.group", "widgets").await.expect_err("unknown group");
    assert!(matches!(error, ResolveError::UnknownGroup(_)), "{error}");

    let error = resolve("", "pods/status").await.expect_err("subresource");
    assert!(matches!(error, ResolveError::Subresource(_)), "{error}");

    let error = resolve("", "bindings").await.expect_err("create-only");
    assert_eq!(
        error.to_string(),
        "bindings does not support the verbs [\"list\", \"patch\"], which migration needs"
    );

    let error =
        Resource::resolve(&client, &target("", "configmaps"), true).await.expect_err("no status");
    assert!(matches!(error, ResolveError::NoStatusSubresource(_)), "{error}");

    let explicit = GroupVersionResource {
        group: "apps".into(),
        version: "v9".into(),
        resource: "deployments".into(),
    };
    let error = Resource::resolve(&client, &explicit, false).await.expect_err("unknown version");
    assert_eq!(error.to_string(), "the apiserver does not serve apps/v9");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// API Priority and Fairness rejects the engine's user beyond a few seats (429 with Retry-After):
/// the migration still completes, and the throttling is counted.
#[tokio::test]
async fn completes_under_priority_and_fairness_throttling() {
    // 15 seats in all, so the test user's priority level gets one.
    let control_plane =
        ControlPlane::start(&["--max-requests-inflight=10", "--max-mutating-requests-inflight=5"])
            .await
            .expect("starts");
    let admin = control_plane.client().await;
    let widgets = WidgetCrd::stale(&admin, "throttled", 200).await;

    let user = unique("throttled-migrator");
    // 1 share of 246: one of the apiserver's 15 seats.
    let flow_schema_uid = throttle_user(&admin, &user, 1).await;
    let mut config = control_plane.config().await;
    config.auth_info.impersonate = Some(user.clone());
    let client = Client::try_from(config.clone()).expect("client");
    wait_for_flow_schema(&client, &flow_schema_uid).await;

    // Other clients of the same priority level keep its seat busy now and then.
    let stop = CancellationToken::new();
    let noise: Vec<_> = (0..4)
        .map(|_| {
            let (api, stop) = (widgets.api(&client, "v1", None), stop.clone());
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let _ = api.get_metadata("w-1").await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect();
    // The fast pace, which presses on until the apiserver throttles it.
    let settings = Settings { writes_in_flight: 32, pace: Pace::Fast, ..Settings::default() };
    let progress =
        migrate(&engine(config, settings), &client, &widgets.group, WidgetCrd::PLURAL).await;
    stop.cancel();
    for task in noise {
        task.await.expect("the noise stops");
    }
    assert!(progress.throttled > 0, "APF throttled the migration: {progress:?}");
    assert_eq!(
        progress.requests,
        1 + 200 + progress.throttled,
        "one list, one write an object, and a retry for each throttled request"
    );
    assert_eq!((progress.rewritten, progress.failed), (200, 0), "{:?}", progress.failures.first());
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 200).await;
}

/// Gives `user` cluster-admin and a priority level of its own, of `shares` nominal concurrency
/// shares, that rejects what exceeds its seats; returns the FlowSchema's UID.
async fn throttle_user(admin: &Client, user: &str, shares: i32) -> String {
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": { "name": user },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
    }))
    .expect("valid binding");
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("bound");
    let level: PriorityLevelConfiguration = serde_json::from_value(json!({
        "metadata": { "name": user },
        "spec": { "type": "Limited", "limited": {
            // Of the default levels' 245 shares and this one's, a share of the apiserver's seats;
            // what comes on top is rejected.
            "nominalConcurrencyShares": shares,
            "lendablePercent": 0,
            "borrowingLimitPercent": 0,
            "limitResponse": { "type": "Reject" },
        }},
    }))
    .expect("valid priority level");
    Api::<PriorityLevelConfiguration>::all(admin.clone())
        .create(&PostParams::default(), &level)
        .await
        .expect("level");
    let schema: FlowSchema = serde_json::from_value(json!({
        "metadata": { "name": user },
        "spec": {
            "priorityLevelConfiguration": { "name": user },
            "matchingPrecedence": 100,
            "distinguisherMethod": { "type": "ByUser" },
            "rules": [{
                "subjects": [{ "kind": "User", "user": { "name": user } }],
                "resourceRules": [{
                    "verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                    "clusterScope": true, "namespaces": ["*"],
                }],
                "nonResourceRules": [{ "verbs": ["*"], "nonResourceURLs": ["*"] }],
            }],
        },
    }))
    .expect("valid flow schema");
    let schema = Api::<FlowSchema>::all(admin.clone())
        .create(&PostParams::default(), &schema)
        .await
        .expect("schema");
    schema.metadata.uid.expect("created objects have a UID")
}

/// Waits until the apiserver classifies `client`'s requests into the FlowSchema `uid`.
async fn wait_for_flow_schema(client: &Client, uid: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let request = http::Request::get("/api/v1/namespaces/default")
            .body(kube::client::Body::empty())
            .expect("request");
        if let Ok(response) = client.send(request).await
            && response.headers().get("X-Kubernetes-PF-FlowSchema-UID").is_some_and(|v| v == uid)
        {
            return;
        }
        assert!(Instant::now() < deadline, "the FlowSchema never applied");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Objects still stored under a namespace that no longer exists are listed, and kube-apiserver
/// 1.37 still accepts writes to them: they are really rewritten, so counting them is right. (Were
/// a write answered 404 while the namespace is gone, the object would be reported failed with
/// reason NamespaceGone, never counted.)
#[tokio::test]
async fn objects_in_a_vanished_namespace_are_really_rewritten() {
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let widgets = WidgetCrd::new("vanished", true);
    widgets.create(&client, "v1").await;
    let (kept, vanished) = (unique("kept"), unique("vanished"));
    create_namespace(&client, &kept).await;
    create_namespace(&client, &vanished).await;
    widgets.seed(&client, "v1", &[Some(&kept), Some(&vanished)], 5).await;

    vanish_namespace(&client, &vanished).await;
    widgets.set_storage_version(&client, "v2").await;

    let progress = migrate_widgets(control_plane, &client, &widgets, Settings::default()).await;
    assert_eq!((progress.listed, progress.rewritten, progress.failed), (10, 10, 0), "{progress:?}");
    let stranded = control_plane
        .etcd()
        .list(&format!("{}{vanished}/", widgets.etcd_prefix()))
        .await
        .expect("etcd");
    assert_eq!(stranded.len(), 5, "the objects outlived their namespace");
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 10).await;
}

/// No page barrier: one object denied again and again (a policy answering 403, retried with a
/// growing backoff) holds back only the checkpoint; objects of later pages are written while it
/// waits, and the run still ends with that one object failed and the rest migrated.
#[tokio::test]
async fn an_object_in_backoff_does_not_hold_back_later_pages() {
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let widgets = WidgetCrd::new("barrier", false);
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 600).await;
    let label = json!({ "metadata": { "labels": { "frozen": "true" } } });
    let api = widgets.api(&client, "v1", None);
    // Listed first: names sort as w-0, w-1, w-10, w-100, ...
    api.patch("w-0", &PatchParams::default(), &Patch::Merge(&label)).await.expect("labelled");
    deny_updates(
        &client,
        &format!("freeze-{}", widgets.group),
        &widgets.group,
        &["widgets"],
        "!has(object.metadata.labels) || !('frozen' in object.metadata.labels)",
        "frozen objects cannot be updated",
        Some("Forbidden"),
    )
    .await;
    // The policy applies once the apiserver sees it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let touch = json!({ "metadata": { "annotations": { "touched": "yes" } } });
    while api.patch("w-0", &PatchParams::default(), &Patch::Merge(&touch)).await.is_ok() {
        assert!(Instant::now() < deadline, "the policy never applied");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    widgets.set_storage_version(&client, "v2").await;

    // Eight attempts: about 20 s of backoff for the denied object.
    let settings = Settings { page_size: 50, write_attempts: 8, ..Settings::default() };
    let engine = engine(control_plane.config().await, settings);
    let etcd = control_plane.etcd();
    let last_page_key = widgets.etcd_key(None, "w-99");
    let progress =
        migrate_during(&engine, &client, &target(&widgets.group, WidgetCrd::PLURAL), |updates| {
            let (etcd, widgets, last_page_key) = (&etcd, &widgets, &last_page_key);
            async move {
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let stored = etcd.get(last_page_key).await.expect("etcd").expect("exists");
                    if stored.api_version() == widgets.api_version("v2") {
                        break;
                    }
                    assert!(Instant::now() < deadline, "the last page was never written");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                assert_eq!(
                    updates.borrow().pages,
                    0,
                    "the last page was written while the first was still waiting on one object"
                );
            }
        })
        .await;
    assert_eq!((progress.failed, progress.rewritten, progress.listed), (1, 599, 600));
    assert_eq!(progress.failures[0].name, "w-0");
    assert_eq!(progress.failures[0].code, 403);
    let census = Census::of(&etcd, &widgets).await;
    assert_eq!(
        (census.count(&widgets.api_version("v1")), census.count(&widgets.api_version("v2"))),
        (1, 599)
    );
}

/// A priority level that admits only 4 requests at once and rejects the rest: even at the fast
/// pace, which presses on until the apiserver throttles it, kube-svm finishes with no object
/// failed and no more than one request in 20 rejected, because its window remembers where it was
/// throttled.
#[tokio::test]
async fn four_seats_of_priority_and_fairness_are_enough() {
    // 60 seats in all; 15 shares of 260 make 4 of them this level's.
    let control_plane =
        ControlPlane::start(&["--max-requests-inflight=40", "--max-mutating-requests-inflight=20"])
            .await
            .expect("starts");
    let admin = control_plane.client().await;
    let widgets = WidgetCrd::stale(&admin, "four-seats", 1000).await;
    let user = unique("four-seat-migrator");
    let flow_schema_uid = throttle_user(&admin, &user, 15).await;
    let mut config = control_plane.config().await;
    config.auth_info.impersonate = Some(user.clone());
    let client = Client::try_from(config.clone()).expect("client");
    wait_for_flow_schema(&client, &flow_schema_uid).await;

    let settings = Settings { pace: Pace::Fast, ..Settings::default() };
    let progress =
        migrate(&engine(config, settings), &client, &widgets.group, WidgetCrd::PLURAL).await;
    assert_eq!((progress.rewritten, progress.failed), (1000, 0), "{:?}", progress.failures.first());
    assert!(progress.throttled > 0, "the level did hold the migration back: {progress:?}");
    eprintln!("four seats: {} of {} requests rejected", progress.throttled, progress.requests);
    assert!(
        progress.throttled * 20 <= progress.requests,
        "{} of {} requests rejected",
        progress.throttled,
        progress.requests
    );
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 1000).await;
}

/// Objects listed, then deleted with their namespace before their turn to be written (as the
/// namespace controller does: the objects first, then the namespace) are gone: the write's 404
/// is checked by reading them again, which finds nothing, so they count as deleted, not failed,
/// whether or not their namespace still exists. The rest are rewritten; etcd holds exactly
/// them, all in v2.
#[tokio::test]
async fn objects_deleted_with_their_namespace_mid_run_are_deleted_not_failed() {
    use crate::support::webhook::{Answer, Webhook};
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let widgets = WidgetCrd::new("namespace-gone", true);
    widgets.create(&client, "v1").await;
    // Listed in key order: the kept namespace first, the one deleted last.
    let (kept, gone) = (unique("a-kept"), unique("z-gone"));
    create_namespace(&client, &kept).await;
    create_namespace(&client, &gone).await;
    widgets.seed(&client, "v1", &[Some(&kept), Some(&gone)], 100).await;
    // The first write (of the kept namespace's w-0) waits until the other namespace is gone:
    // by then the one page of 200 was listed, and one write at a time keeps the rest behind it.
    let name = format!("hook-{}", widgets.group);
    let webhook = Webhook::install(&client, &name, &widgets.group, &["widgets"], 30).await;
    let probed = widgets.api(&client, "v1", Some(&kept));
    let touch =
        kube::api::Patch::Merge(json!({ "metadata": { "annotations": { "probe": "yes" } } }));
    let deadline = Instant::now() + Duration::from_secs(30);
    while webhook.reviews() == 0 {
        assert!(Instant::now() < deadline, "the apiserver never called the webhook");
        let _ = probed.patch("w-1", &Default::default(), &touch).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    webhook.answer(["w-0".to_owned()], Answer::Hold);
    widgets.set_storage_version(&client, "v2").await;
    let settings = Settings { page_size: 500, writes_in_flight: 1, ..Settings::default() };
    let engine = engine(control_plane.config().await, settings);
    let target = target(&widgets.group, WidgetCrd::PLURAL);
    let progress = migrate_during(&engine, &client, &target, |_| {
        let (client, widgets, gone, webhook) = (client.clone(), &widgets, gone.clone(), &webhook);
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while webhook.held() == 0 {
                assert!(Instant::now() < deadline, "the first write never came");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let api = widgets.api(&client, "v2", Some(&gone));
            api.delete_collection(&Default::default(), &Default::default()).await.expect("deleted");
            vanish_namespace(&client, &gone).await;
            webhook.release();
        }
    })
    .await;
    webhook.remove().await;
    assert_eq!(
        (progress.listed, progress.rewritten, progress.failed),
        (200, 100, 0),
        "{progress:?}"
    );
    let ending =
        Ending { succeeded_as: Some(widgets.api_version("v2")), stored_versions_only: None };
    let census = Census::of(&control_plane.etcd(), &widgets).await;
    if let Err(breach) = invariant::judge(&census, 100, &ending) {
        panic!("{breach}");
    }
}
