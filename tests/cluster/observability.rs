//! The admin server of a real `kube-svm controller`: probes, and metrics that agree with the
//! migration's status, under the names kube-storage-version-migrator's dashboards use.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube_svm::api::{Phase, StorageVersionMigration};

use crate::support::fixtures::{WidgetCrd, install_kube_svm_crds};
use crate::support::migrations::{create_migration, is_terminal, phase_is, progress, wait_for};
use crate::support::process::KubeSvm;
use crate::support::webhook::{Answer, Webhook};
use crate::support::{ControlPlane, Scenario};

struct Admin {
    base: String,
    http: reqwest::Client,
}

impl Admin {
    /// A `kube-svm controller` without leader election, with `args` besides, and its admin
    /// server on a free local port.
    async fn controller(control_plane: &ControlPlane, args: &[&str]) -> (KubeSvm, Admin) {
        let port = TcpListener::bind("127.0.0.1:0")
            .expect("a free port")
            .local_addr()
            .expect("addr")
            .port();
        let address = format!("--metrics-bind-address=127.0.0.1:{port}");
        let all = [&["controller", "--leader-elect=false", &address][..], args].concat();
        let controller = KubeSvm::start(control_plane, "controller", &all).await;
        let base = format!("http://127.0.0.1:{port}");
        (controller, Admin { base, http: crate::support::http_client() })
    }

    async fn get(&self, path: &str) -> (u16, String) {
        match self.http.get(format!("{}{path}", self.base)).send().await {
            Ok(response) => (response.status().as_u16(), response.text().await.unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    /// Polls `path` until it answers `code`.
    async fn wait_for(&self, path: &str, code: u16, controller: &KubeSvm) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, body) = self.get(path).await;
            if status == code {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "{path} never answered {code} (last {status} {body})\n{}",
                controller.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The value of one series, by its exact name and labels; `None` when absent.
    async fn find(&self, series: &str) -> Option<f64> {
        let (_, text) = self.get("/metrics").await;
        text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// The value of one series, by its exact name and labels; fails when it is absent, so a
    /// renamed series or label cannot read as zero.
    async fn value(&self, series: &str) -> f64 {
        let found = self.find(series).await;
        found.unwrap_or_else(|| panic!("no series {series} in /metrics"))
    }
}

#[tokio::test]
async fn probes_and_metrics_follow_a_real_migration() {
    let control_plane = ControlPlane::start(&[]).await.expect("control plane");
    let client = control_plane.client().await;
    let args = ["--page-size=50", "--kube-api-qps=60", "--kube-api-burst=1"];
    let (controller, admin) = Admin::controller(&control_plane, &args).await;

    admin.wait_for("/healthz", 200, &controller).await;
    // Not ready before kube-svm's CRDs exist, and it says so once it has looked.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = admin.get("/readyz").await;
        assert_eq!(code, 503, "{body}");
        if body.contains("kube-svm's CRDs are not installed") {
            break;
        }
        assert!(Instant::now() < deadline, "{body}\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    install_kube_svm_crds(&client).await;
    admin.wait_for("/readyz", 200, &controller).await;

    let widgets = WidgetCrd::stale(&client, "metrics", 300).await;
    let migration: StorageVersionMigration = serde_json::from_value(serde_json::json!({
        "apiVersion": "migration.k8s.io/v1alpha1",
        "kind": "StorageVersionMigration",
        "metadata": { "name": "observed" },
        "spec": { "resource": { "group": widgets.group, "version": "v1", "resource": "widgets" } },
    }))
    .expect("valid");
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    api.create(&Default::default(), &migration).await.expect("created");

    // Labelled by the version written through: the CRD's storage version, v2, though the
    // migration names v1.
    let resource = format!("resource=\"{}/v2, Resource=widgets\"", widgets.group);
    let remaining = format!("storage_migrator_core_migrator_remaining_objects{{{resource}}}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen_remaining = 0.0;
    while seen_remaining == 0.0 {
        assert!(Instant::now() < deadline, "remaining_objects never rose\n{}", controller.logs());
        seen_remaining = admin.find(&remaining).await.unwrap_or(0.0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen_remaining > 0.0 && seen_remaining < 300.0, "{seen_remaining}");

    let deadline = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let migration = api.get("observed").await.expect("exists");
        if kube_svm::api::Phase::of(&migration).is_terminal() {
            break migration;
        }
        assert!(Instant::now() < deadline, "the migration never finished\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let progress = done.status.and_then(|s| s.progress).expect("progress");
    assert_eq!((progress.rewritten, progress.failed), (300, 0));

    assert_eq!(admin.value(&remaining).await, 0.0);
    assert_eq!(
        admin
            .value(&format!("storage_migrator_core_migrator_migrated_objects{{{resource}}}"))
            .await,
        300.0
    );
    assert_eq!(
        admin
            .value(&format!(
                "storage_migrator_core_migrator_migrations{{{resource},status=\"Succeeded\"}}"
            ))
            .await,
        1.0
    );
    assert_eq!(
        admin.value(&format!("kube_svm_objects_total{{{resource},result=\"rewritten\"}}")).await,
        progress.rewritten as f64
    );
    assert_eq!(
        admin.value("kube_svm_api_requests_total{code=\"2xx\",verb=\"patch\"}").await,
        300.0
    );
    assert_eq!(
        admin.value("kube_svm_api_requests_total{code=\"2xx\",verb=\"list\"}").await,
        6.0,
        "300 objects, 50 a page"
    );
    assert_eq!(
        admin.value("kube_svm_api_request_duration_seconds_count{verb=\"patch\"}").await,
        300.0
    );
    assert_eq!(
        admin.value("kube_svm_migration_duration_seconds_count{status=\"Succeeded\"}").await,
        1.0
    );
    assert_eq!(admin.value("kube_svm_leader").await, 1.0);
    // The run ends after its status says Succeeded (its last records follow): wait for it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin.value("kube_svm_migrations_running").await != 0.0 {
        assert!(Instant::now() < deadline, "the run never ended\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(admin.value("kube_svm_writes_in_flight").await, 0.0);
    assert!(admin.value("process_resident_memory_bytes").await > 0.0);
    let (_, text) = admin.get("/metrics").await;
    assert!(!text.contains("w-1"), "no object names in labels");
    // Every series the Grafana dashboard queries exists.
    for name in crate::chart::dashboard_metrics() {
        assert!(
            text.contains(&format!("\n{name}")),
            "the dashboard queries {name}, not in /metrics"
        );
    }

    // A migration of a resource that does not exist fails; what the user typed never becomes a
    // label value.
    let typo: StorageVersionMigration = serde_json::from_value(serde_json::json!({
        "apiVersion": "migration.k8s.io/v1alpha1",
        "kind": "StorageVersionMigration",
        "metadata": { "name": "typo" },
        "spec": { "resource": { "group": "", "version": "v1", "resource": "sekrets-typed-by-hand" } },
    }))
    .expect("valid");
    api.create(&Default::default(), &typo).await.expect("created");
    let failed =
        "storage_migrator_core_migrator_migrations{resource=\"unresolved\",status=\"Failed\"}";
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin.find(failed).await != Some(1.0) {
        assert!(Instant::now() < deadline, "the failure was never counted\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, text) = admin.get("/metrics").await;
    assert!(!text.contains("sekrets-typed-by-hand"), "no user input in labels");
}

/// An apiserver outage, as the log tells it: the controller says once that the apiserver is
/// unreachable and once that it is back, instead of a line a second from every loop; kube's
/// client lines stay out (they say nothing kube-svm does not), and no error chain repeats
/// itself.
#[tokio::test]
async fn an_outage_is_said_once_and_its_end_once() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let args =
        ["controller", "--leader-elect=false", "--discovery-trigger", "--discovery-interval=2"];
    let controller = KubeSvm::start(&control_plane, "outage", &args).await;
    // The trigger has polled (a StorageState exists) before the outage.
    let states: Api<kube_svm::api::StorageState> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while states.list(&Default::default()).await.expect("listed").items.is_empty() {
        assert!(Instant::now() < deadline, "the trigger never polled\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    control_plane.kill_apiserver(0).expect("killed");
    // The outage is noticed, then lasts several polls of the trigger and several watch retries
    // more, each of which must stay silent.
    controller.wait_for_log("the apiserver is unreachable", Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    control_plane.revive_apiserver(0).await.expect("the apiserver starts again");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !controller.logs().contains("the apiserver is reachable again") {
        assert!(Instant::now() < deadline, "never said it is back\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let logs = controller.logs();
    let said = logs.matches("the apiserver is unreachable").count();
    assert!((1..=2).contains(&said), "the outage was said {said} times\n{logs}");
    assert!(!logs.contains("kube_client::client::builder"), "{logs}");
    assert!(!logs.contains(" ERROR "), "{logs}");
    for line in logs.lines().filter(|l| l.contains("client error (Connect)")) {
        assert_eq!(line.matches("client error (Connect)").count(), 1, "repeated: {line}");
    }
}

/// With `--foreground-budget`, the gentle pace steers by a probe sent as another client would:
/// a running migration says what the probe sees against its budget and the rate it allows, the
/// probe's latency and the rate are exported, and every object is migrated (in etcd) all the
/// same. Once the migration has ended, the status no longer speaks of the probe.
#[tokio::test]
async fn a_gentle_pace_steered_by_its_probe_says_what_it_sees() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    // The law itself, as beside other clients: alone, the writes would not wait for it.
    let args = [
        "--foreground-budget=3x",
        "--pace-params=alone_below=0",
        "--checkpoint-interval=0",
        "--page-size=50",
    ];
    let (controller, admin) = Admin::controller(&control_plane, &args).await;
    admin.wait_for("/readyz", 200, &controller).await;

    let widgets = WidgetCrd::stale(&client, "probe", 300).await;
    create_migration(&client, "steered", &widgets.group, "widgets").await;
    let speaks = |m: &StorageVersionMigration| {
        let progress = m.status.as_ref().and_then(|s| s.progress.as_ref());
        let foreground = progress.and_then(|p| p.foreground.clone()).unwrap_or_default();
        foreground.contains("probe p99 ") && foreground.contains("objects/s (")
    };
    let timeout = Duration::from_secs(180);
    let running =
        wait_for(&client, "steered", timeout, &[&controller], |m| speaks(m) || is_terminal(m))
            .await;
    assert!(speaks(&running), "a running gentle migration says what it steers by: {running:?}");
    let done =
        wait_for(&client, "steered", timeout, &[&controller], phase_is(Phase::Succeeded)).await;
    assert_eq!(progress(&done).foreground, None, "an ended migration: {:?}", done.status);
    assert_eq!(progress(&done).rewritten, 300, "{:?}", done.status);
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 300).await;
    assert!(admin.value("kube_svm_probe_latency_seconds_count").await > 0.0);
    assert!(admin.value("kube_svm_gentle_rate_objects_per_second").await >= 2.0);
    // The probe wrote too (its count, on the chart's ConfigMap in kube-svm's namespace): a probe
    // that only reads feels nothing of what writes wait for.
    let probes: Api<ConfigMap> =
        Api::namespaced(client.clone(), crate::support::CONTROLLER_NAMESPACE);
    let probe = probes.get(kube_svm::engine::PROBE_OBJECT).await.expect("the chart's ConfigMap");
    let annotations = probe.metadata.annotations.unwrap_or_default();
    let count = annotations.get(kube_svm::engine::PROBE_ANNOTATION);
    assert!(count.is_some_and(|n| n.parse::<u64>().is_ok()), "the probe wrote: {annotations:?}");
}

/// Alone on its apiserver (no other client writes), a gentle migration goes as its write window
/// allows, and says so; a client that starts writing is felt within seconds, and the probe's
/// rate steers again. Every object is migrated (in etcd) all the same.
#[tokio::test]
async fn alone_a_gentle_migration_goes_as_fast_as_it_may_until_a_client_writes() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    // A client-side limit of 50 writes a second, so that the run lasts while a client comes.
    let args = [
        "--foreground-budget=3x",
        "--kube-api-qps=50",
        "--kube-api-burst=50",
        "--checkpoint-interval=0",
    ];
    let (controller, admin) = Admin::controller(&control_plane, &args).await;
    admin.wait_for("/readyz", 200, &controller).await;
    let widgets = WidgetCrd::stale(&client, "alone", 2000).await;
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let settings: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "another-client" }, "data": { "n": "0" }
    }))
    .expect("a ConfigMap");
    other.create(&PostParams::default(), &settings).await.expect("created");

    create_migration(&client, "alone", &widgets.group, "widgets").await;
    let gauge = "kube_svm_gentle_alone";
    let deadline = Instant::now() + Duration::from_secs(60);
    while admin.find(gauge).await != Some(1.0) {
        let done = has_ended(&client, "alone").await;
        assert!(Instant::now() < deadline && !done, "never alone:\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Another client writes, 50 times a second.
    let writer = tokio::spawn(async move {
        for n in 1u64.. {
            let patch = serde_json::json!({ "data": { "n": n.to_string() } });
            let _ =
                other.patch("another-client", &PatchParams::default(), &Patch::Merge(&patch)).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin.find(gauge).await != Some(0.0) {
        let done = has_ended(&client, "alone").await;
        assert!(
            Instant::now() < deadline && !done,
            "the client was not felt:\n{}",
            controller.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    writer.abort();
    let done =
        wait_for(&client, "alone", Duration::from_secs(180), &[&controller], is_terminal).await;
    assert!(phase_is(Phase::Succeeded)(&done), "{:?}\n{}", done.status, controller.logs());
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 2000).await;
    let logs = controller.logs();
    assert!(
        logs.contains("gentle writes alone") && logs.contains("gentle writes in company"),
        "{logs}"
    );
}

/// Whether migration `name` has ended.
async fn has_ended(client: &kube::Client, name: &str) -> bool {
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    migrations.get_opt(name).await.ok().flatten().is_some_and(|m| is_terminal(&m))
}

/// Latency the run does not cause never parks it at its floor: a webhook slows the probe's
/// writes (as another client's load would) from its first on, the rate is cut, the probe is no
/// faster for it, and the cut is undone. The rate stays above its floor, and every object is
/// migrated (in etcd) while the probe's writes are still slowed.
#[tokio::test]
async fn a_cut_that_does_not_make_the_probe_faster_is_undone() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    // A slow start, so that the run lasts past a cut and its judgment; the law itself, as
    // beside other clients (alone, the writes would not wait for it).
    let args = [
        "--foreground-budget=25ms",
        "--pace-params=start_rate=10,alone_below=0",
        "--checkpoint-interval=0",
        "--page-size=50",
    ];
    let webhook = Webhook::install(&client, "slow-the-probe", "", &["configmaps"], 10).await;
    let slow = Answer::Delay(Duration::from_millis(100));
    webhook.answer([kube_svm::engine::PROBE_OBJECT.to_owned()], slow);
    let touched: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let touch: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "touched" }, "data": { "n": "0" }
    }))
    .expect("a ConfigMap");
    touched.create(&PostParams::default(), &touch).await.expect("created");
    let mut n: u64 = 0;
    webhook
        .wait_until_called(async || {
            n += 1;
            let patch = serde_json::json!({ "data": { "n": n.to_string() } });
            let _ = touched.patch("touched", &PatchParams::default(), &Patch::Merge(&patch)).await;
        })
        .await;
    let (controller, admin) = Admin::controller(&control_plane, &args).await;
    admin.wait_for("/readyz", 200, &controller).await;

    let widgets = WidgetCrd::stale(&client, "undone", 600).await;
    create_migration(&client, "undone", &widgets.group, "widgets").await;
    let deadline = Instant::now() + Duration::from_secs(180);
    let undone = "kube_svm_gentle_rate_changes_total{change=\"undone\"}";
    while admin.find(undone).await.is_none_or(|n| n < 1.0) {
        if Instant::now() >= deadline {
            let (_, text) = admin.get("/metrics").await;
            let pace: Vec<&str> =
                text.lines().filter(|line| line.starts_with("kube_svm_gentle")).collect();
            panic!("no cut was undone:\n{}\n{}", pace.join("\n"), controller.logs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let done =
        wait_for(&client, "undone", Duration::from_secs(180), &[&controller], is_terminal).await;
    assert!(phase_is(Phase::Succeeded)(&done), "{:?}\n{}", done.status, controller.logs());
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 600).await;
    assert!(webhook.delayed() > 0, "the probe's own writes were slowed");
    let rate = admin.value("kube_svm_gentle_rate_objects_per_second").await;
    assert!(rate > 2.0, "not parked at its floor by latency it does not cause: {rate}");
    assert!(controller.logs().contains("gentle rate cut undone"), "{}", controller.logs());
    webhook.remove().await;
}
