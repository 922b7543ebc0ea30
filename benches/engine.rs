//! Engine throughput against the real control plane: objects per second, requests per object,
//! and memory per run, for a few thousand objects. Run with `make bench-engine`; numbers are
//! ratios within one run, the machine is shared and noisy.

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

use support::fixtures::{WidgetCrd, create_namespace, unique};

const OBJECTS_PER_NAMESPACE: usize = 1000;
const NAMESPACES: usize = 3;

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
    let engine = Engine::new(config.clone(), Arc::new(RateLimiter::new(0.0, 1)), settings)
        .expect("an engine");
    let (report, _) = watch::channel(Progress::default());
    let started = Instant::now();
    let job = Job { resource, write_to_status: false, resume: Progress::default() };
    let Ok(Finished::Completed(progress)) =
        engine.run(job, &report, &CancellationToken::new()).await
    else {
        panic!("the migration completes")
    };
    (progress, started.elapsed().as_secs_f64())
}

#[tokio::main]
async fn main() {
    let control_plane = support::ControlPlane::start(&[]).await.expect("control plane");
    let client = control_plane.client().await;
    let config = control_plane.config().await;
    let total = (OBJECTS_PER_NAMESPACE * NAMESPACES) as f64;
    println!("objects: {total}");
    for in_flight in [1, 4, 16, 64] {
        let widgets = WidgetCrd::new("bench", true);
        widgets.create(&client, "v1").await;
        let namespaces: Vec<String> = (0..NAMESPACES).map(|_| unique("bench")).collect();
        for namespace in &namespaces {
            create_namespace(&client, namespace).await;
        }
        let refs: Vec<Option<&str>> = namespaces.iter().map(|n| Some(n.as_str())).collect();
        widgets.seed(&client, "v1", &refs, OBJECTS_PER_NAMESPACE).await;
        widgets.set_storage_version(&client, "v2").await;
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
}
