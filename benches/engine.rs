//! Engine throughput against the real control plane, for a few thousand objects: objects per
//! second and requests per object at several write windows, and the same migration end to end
//! through `kube-svm controller` (a real process) against the bare engine. Run with
//! `make bench-engine`; compare numbers within one run, the machine is shared and noisy.

// The integration tests' harness; the bench needs only part of it.
#[allow(dead_code, unused_imports)]
#[path = "../tests/cluster/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Instant;

use kube::Client;
use kube_svm::api::GroupVersionResource;
use kube_svm::engine::{Engine, Finished, Job, Progress, RateLimiter, Resource, Settings};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use support::fixtures::{WidgetCrd, create_namespace, install_kube_svm_crds, unique};
use support::process::KubeSvm;

const OBJECTS_PER_NAMESPACE: usize = 500;
const NAMESPACES: usize = 4;

async fn run(
    config: &kube::Config,
    client: &Client,
    widgets: &WidgetCrd,
    settings: Settings,
) -> (Progress, f64) {
    let target = GroupVersionResource {
        group: widgets.group.clone(),
        version: String::new(),
        resource: WidgetCrd::PLURAL.into(),
    };
    let resource = Resource::resolve(client, &target, false).await.expect("resolves");
    let engine = Engine::new(
        config.clone(),
        Arc::new(RateLimiter::new(0.0, 1)),
        settings,
        Arc::new(kube_svm::metrics::Metrics::new().expect("metrics")),
    )
    .expect("an engine");
    let (report, _) = watch::channel(Progress::default());
    let started = Instant::now();
    let job = Job {
        resource,
        write_to_status: false,
        resume: Progress::default(),
        fence: kube_svm::fence::Fence::open(),
    };
    let Ok(Finished::Completed(progress)) =
        engine.run(job, &report, &CancellationToken::new()).await
    else {
        panic!("the migration completes")
    };
    (progress, started.elapsed().as_secs_f64())
}

/// A fresh CRD with the bench's objects stored at v1 and storage switched to v2.
async fn seeded(client: &Client, per_namespace: usize) -> WidgetCrd {
    let widgets = WidgetCrd::new("bench", true);
    widgets.create(client, "v1").await;
    let namespaces: Vec<String> = (0..NAMESPACES).map(|_| unique("bench")).collect();
    for namespace in &namespaces {
        create_namespace(client, namespace).await;
    }
    let refs: Vec<Option<&str>> = namespaces.iter().map(|n| Some(n.as_str())).collect();
    widgets.seed(client, "v1", &refs, per_namespace).await;
    widgets.set_storage_version(client, "v2").await;
    widgets
}

/// Seconds from creating a StorageVersionMigration to seeing it Succeeded, through a running
/// `kube-svm controller`.
async fn through_controller(client: &Client, widgets: &WidgetCrd) -> f64 {
    use kube::api::PostParams;
    use kube_svm::api::Phase;
    use kube_svm::api::{StorageVersionMigration, StorageVersionMigrationSpec};
    let api: kube::Api<StorageVersionMigration> = kube::Api::all(client.clone());
    let spec = StorageVersionMigrationSpec {
        resource: GroupVersionResource {
            group: widgets.group.clone(),
            version: String::new(),
            resource: WidgetCrd::PLURAL.into(),
        },
        continue_token: None,
    };
    let name = unique("bench");
    let started = Instant::now();
    api.create(&PostParams::default(), &StorageVersionMigration::new(&name, spec))
        .await
        .expect("created");
    loop {
        let migration = api.get(&name).await.expect("exists");
        match Phase::of(&migration) {
            Phase::Succeeded => return started.elapsed().as_secs_f64(),
            Phase::Failed => panic!("the migration failed: {:?}", migration.status),
            _ => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
}

/// A process's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc is readable");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM is reported")
}

#[tokio::main]
async fn main() {
    let control_plane = support::ControlPlane::start(&[]).await.expect("control plane");
    let client = control_plane.client().await;
    let config = control_plane.config().await;
    let total = (OBJECTS_PER_NAMESPACE * NAMESPACES) as f64;
    println!("objects: {total}");
    for in_flight in [1, 4, 16] {
        let widgets = seeded(&client, OBJECTS_PER_NAMESPACE).await;
        let settings = Settings { writes_in_flight: in_flight, ..Settings::default() };
        let (progress, secs) = run(&config, &client, &widgets, settings.clone()).await;
        assert_eq!(progress.rewritten as f64, total);
        let (again, again_secs) = run(&config, &client, &widgets, settings).await;
        assert_eq!(again.already_current as f64, total);
        let requests = progress.requests;
        println!(
            "writes in flight {in_flight:>3}: rewrite {:>7.0} objects/s, already current {:>7.0} objects/s, {:.3} requests/object",
            total / secs,
            total / again_secs,
            requests as f64 / total
        );
    }

    // The same migration through the controller, against the bare engine, in this run.
    install_kube_svm_crds(&client).await;
    let controller = KubeSvm::start(
        &control_plane,
        "controller",
        &["controller", "--leader-elect=false", "--kube-api-qps=0", "--writes-in-flight=16"],
    )
    .await;
    let widgets = seeded(&client, OBJECTS_PER_NAMESPACE).await;
    let controller_secs = through_controller(&client, &widgets).await;
    let peak_small = peak_rss_kib(controller.pid());
    let widgets = seeded(&client, OBJECTS_PER_NAMESPACE).await;
    let settings = Settings { writes_in_flight: 16, ..Settings::default() };
    let (_, engine_secs) = run(&config, &client, &widgets, settings).await;
    // Memory does not grow with the resource: four times the objects, same peak.
    let large = seeded(&client, OBJECTS_PER_NAMESPACE * 4).await;
    through_controller(&client, &large).await;
    let peak_large = peak_rss_kib(controller.pid());
    println!(
        "controller peak RSS: {peak_small} KiB after {} objects, {peak_large} KiB after {} more",
        OBJECTS_PER_NAMESPACE * NAMESPACES,
        OBJECTS_PER_NAMESPACE * NAMESPACES * 4
    );
    println!(
        "end to end through the controller: {controller_secs:.2} s; bare engine: {engine_secs:.2} s; ratio {:.2}",
        controller_secs / engine_secs
    );
}
