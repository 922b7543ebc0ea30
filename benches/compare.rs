//! `make bench`: kube-svm next to the apiserver's own limit and its peers, on one local control
//! plane, in one run. `BENCH_OBJECTS` custom resources (default 10,000) of about
//! `BENCH_OBJECT_BYTES` (default 1,500) over 20 namespaces are moved one storage version further
//! by each contender in turn, and etcd is read after each to prove every object moved:
//!
//! - the limit: the minimal conditional patch from a bare client loop, lists pipelined, 16 and 64
//!   writes in flight;
//! - kube-svm's engine (the library) and `kube-svm controller` end to end, at their defaults;
//! - the in-tree migrator: kube-controller-manager's storage-version-migrator-controller, through
//!   a `storagemigration.k8s.io/v1` object;
//! - a model of kube-storage-version-migrator's algorithm at its shipped settings (one worker,
//!   full-object lists of 500, a PUT of each listed object, GET and PUT again on conflict, client
//!   QPS 40 and burst 1000), reimplemented here: the project is not served by the module proxy.
//!
//! Per contender: objects/s, requests per object (the apiserver's `apiserver_request_total`),
//! apiserver and etcd CPU seconds per 1,000 objects (from /proc, the idle rate subtracted), peak
//! RSS of the migrating process. Then a sweep of kube-svm's engine over its write window. The
//! table goes to `docs/bench.md`, the numbers to `docs/bench.json` (`hack/plot.py` draws
//! `docs/bench.png` from them). `BENCH_CONTENDERS` (comma-separated names) runs a subset;
//! `BENCH_SWEEP=0` skips the sweep; `BENCH_REPORT=/tmp/x` writes `/tmp/x.md` and `/tmp/x.json`
//! instead. Throughput drifts as etcd's history grows: the limit is
//! measured at the start and again at the end, and ratios are quoted against their mean.

// The integration tests' harness; the bench needs only part of it.
#[allow(dead_code, unused_imports)]
#[path = "../tests/cluster/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use kube_svm::api::{
    GroupVersionResource, Phase, StorageVersionMigration, StorageVersionMigrationSpec,
};
use kube_svm::engine::{self, Engine, Finished, Job, Progress, RateLimiter, Resource, Settings};
use kube_svm::fence::Fence;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use support::fixtures::{WidgetCrd, create_namespace, install_kube_svm_crds, unique};
use support::invariant::Census;
use support::process::KubeSvm;
use support::{ControlPlane, Etcd};

const NAMESPACES: usize = 20;

/// The controller's default `--storage-version-settle`: its encoding check starts when it sees
/// the storage switch, so a migration created this long after finds it done.
const SETTLE: Duration = Duration::from_secs(11);

/// kube-storage-version-migrator's shipped client settings (its manifests' flags).
const UPSTREAM_QPS: f64 = 40.0;
const UPSTREAM_BURST: u32 = 1000;
/// kube-storage-version-migrator's list page size.
const UPSTREAM_PAGE: u32 = 500;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn selected(contender: &str) -> bool {
    match std::env::var("BENCH_CONTENDERS") {
        Ok(list) if !list.trim().is_empty() => list.split(',').any(|c| c.trim() == contender),
        _ => true,
    }
}

/// What the bench measures around one contender.
struct Meter {
    client: Client,
    group: String,
    apiserver: u32,
    etcd: u32,
    ticks_per_second: f64,
    /// CPU seconds per second the apiserver and etcd burn while nothing migrates.
    idle: (f64, f64),
}

#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    apiserver_cpu: f64,
    etcd_cpu: f64,
    requests: f64,
}

impl Meter {
    fn cpu_seconds(&self, pid: u32) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc is readable");
        // Fields after the command name: state is the first, utime the 12th, stime the 13th.
        let after = stat.rsplit_once(") ").expect("a stat line").1;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks: f64 =
            fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
        ticks / self.ticks_per_second
    }

    /// Requests the apiserver has served for the bench's resource so far.
    async fn requests(&self) -> f64 {
        let request = http::Request::get("/metrics").body(Vec::new()).expect("a request");
        let text = self.client.request_text(request).await.expect("the apiserver's metrics");
        let group = format!("group=\"{}\"", self.group);
        text.lines()
            .filter(|l| l.starts_with("apiserver_request_total{") && l.contains(&group))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }

    async fn sample(&self) -> Sample {
        Sample {
            requests: self.requests().await,
            at: Instant::now(),
            apiserver_cpu: self.cpu_seconds(self.apiserver),
            etcd_cpu: self.cpu_seconds(self.etcd),
        }
    }
}

/// One contender's result.
#[derive(Clone, Debug, serde::Serialize)]
struct Row {
    contender: String,
    note: String,
    objects: usize,
    seconds: f64,
    objects_per_second: f64,
    requests_per_object: f64,
    apiserver_cpu_per_1000: f64,
    etcd_cpu_per_1000: f64,
    peak_rss_mib: Option<f64>,
}

/// A process's peak resident memory (`VmHWM`), in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc is readable");
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM is reported");
    kib / 1024.0
}

struct Bench {
    control_plane: ControlPlane,
    client: Client,
    config: kube::Config,
    widgets: WidgetCrd,
    objects: usize,
    /// The version the objects are stored in now.
    stored: &'static str,
    meter: Meter,
    rows: Vec<Row>,
    controller: Option<KubeSvm>,
    controller_manager: Option<Process>,
}

impl Bench {
    fn etcd(&self) -> Etcd {
        self.control_plane.etcd()
    }

    /// Switches storage to the other version; returns it.
    async fn switch(&mut self) -> &'static str {
        let next = if self.stored == "v1" { "v2" } else { "v1" };
        self.widgets.set_storage_version(&self.client, next).await;
        next
    }

    /// Runs `migrate` (which moves every object to `target`), measures it, checks etcd. With
    /// `switch`, the storage version is switched first, and `pause` waited before measuring.
    async fn measure<F, Fut>(
        &mut self,
        contender: &str,
        note: &str,
        switch: bool,
        pause: Duration,
        migrate: F,
    ) where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = Option<u32>>,
    {
        if !selected(contender) {
            return;
        }
        let target = if switch { self.switch().await } else { self.stored };
        tokio::time::sleep(pause).await;
        let before = self.meter.sample().await;
        let ctx = Ctx {
            client: self.client.clone(),
            config: self.config.clone(),
            widgets: WidgetCrd { group: self.widgets.group.clone(), namespaced: true },
            target,
            controller: self.controller.as_ref().map(|c| c.pid()),
        };
        let pid = migrate(ctx).await;
        let after = self.meter.sample().await;
        let census = Census::of(&self.etcd(), &self.widgets).await;
        let expected = self.widgets.api_version(target);
        assert_eq!(census.count(&expected), self.objects, "{contender}: etcd holds {:?}", census.0);
        self.stored = target;
        let seconds = after.at.duration_since(before.at).as_secs_f64();
        let per_1000 =
            |used: f64, idle: f64| (used - idle * seconds).max(0.0) * 1000.0 / self.objects as f64;
        let row = Row {
            contender: contender.to_owned(),
            note: note.to_owned(),
            objects: self.objects,
            seconds,
            objects_per_second: self.objects as f64 / seconds,
            requests_per_object: (after.requests - before.requests) / self.objects as f64,
            apiserver_cpu_per_1000: per_1000(
                after.apiserver_cpu - before.apiserver_cpu,
                self.meter.idle.0,
            ),
            etcd_cpu_per_1000: per_1000(after.etcd_cpu - before.etcd_cpu, self.meter.idle.1),
            peak_rss_mib: pid.map(peak_rss_mib),
        };
        println!(
            "{:<34} {:>8.1} objects/s  {:>6.3} requests/object  apiserver {:>5.2} s, etcd {:>5.2} s CPU per 1,000{}",
            row.contender,
            row.objects_per_second,
            row.requests_per_object,
            row.apiserver_cpu_per_1000,
            row.etcd_cpu_per_1000,
            row.peak_rss_mib.map(|m| format!("  peak RSS {m:.1} MiB")).unwrap_or_default()
        );
        self.rows.push(row);
    }
}

/// What a contender needs.
struct Ctx {
    client: Client,
    config: kube::Config,
    widgets: WidgetCrd,
    target: &'static str,
    controller: Option<u32>,
}

impl Ctx {
    fn api(&self, namespace: Option<&str>) -> Api<DynamicObject> {
        self.widgets.api(&self.client, self.target, namespace)
    }
}

/// The limit: a bare client sending the minimal conditional patch, `in_flight` at once, pages
/// listed ahead.
async fn bare_client(ctx: Ctx, in_flight: usize) -> Option<u32> {
    let (pages_tx, pages) = mpsc::channel::<Vec<(String, String, String)>>(2);
    let lister = {
        let api = ctx.api(None);
        async move {
            let mut token: Option<String> = None;
            loop {
                let mut params = ListParams::default().limit(500);
                if let Some(token) = &token {
                    params = params.continue_token(token);
                }
                let page = api.list_metadata(&params).await.expect("a page");
                let items = page
                    .items
                    .into_iter()
                    .map(|o| {
                        (
                            o.metadata.namespace.unwrap_or_default(),
                            o.metadata.name.unwrap_or_default(),
                            o.metadata.resource_version.unwrap_or_default(),
                        )
                    })
                    .collect();
                if pages_tx.send(items).await.is_err() {
                    return;
                }
                match page.metadata.continue_ {
                    Some(next) if !next.is_empty() => token = Some(next),
                    _ => return,
                }
            }
        }
    };
    let api_version = ctx.widgets.api_version(ctx.target);
    let writes = futures::stream::unfold(pages, |mut pages| async move {
        pages.recv().await.map(|page| (futures::stream::iter(page), pages))
    })
    .flatten()
    .map(|(namespace, name, resource_version)| {
        let api = ctx.api(Some(&namespace));
        let body = json!({
            "apiVersion": api_version,
            "kind": WidgetCrd::KIND,
            "metadata": { "name": name, "namespace": namespace, "resourceVersion": resource_version },
        });
        async move {
            match api.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&body)).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(error) => panic!("the bare client's patch failed: {error}"),
            }
        }
    })
    .buffer_unordered(in_flight)
    .collect::<Vec<()>>();
    tokio::join!(lister, writes);
    None
}

/// kube-svm's engine, as a library, at the controller's defaults.
async fn kube_svm_engine(ctx: Ctx) -> Option<u32> {
    let target = GroupVersionResource {
        group: ctx.widgets.group.clone(),
        version: String::new(),
        resource: WidgetCrd::PLURAL.into(),
    };
    let resource = Resource::resolve(&ctx.client, &target, false).await.expect("resolves");
    let limiter = Arc::new(RateLimiter::new(
        engine::rate_limit::DEFAULT_QPS,
        engine::rate_limit::DEFAULT_BURST,
    ));
    let metrics = Arc::new(kube_svm::metrics::Metrics::new().expect("metrics"));
    let engine =
        Engine::new(ctx.config.clone(), limiter, Settings::default(), metrics).expect("an engine");
    run_engine(&engine, resource).await;
    None
}

async fn run_engine(engine: &Engine, resource: Resource) -> Progress {
    let (report, _) = watch::channel(Progress::default());
    let job = Job {
        resource,
        write_to_status: false,
        pace: None,
        resume: Progress::default(),
        fence: Fence::open(),
    };
    match engine.run(job, &report, &CancellationToken::new()).await {
        Ok(Finished::Completed(progress)) if progress.failed == 0 => progress,
        other => panic!("the migration did not complete: {other:?}"),
    }
}

/// `kube-svm controller`, end to end: from creating the migration to seeing it Succeeded.
async fn kube_svm_controller(ctx: Ctx) -> Option<u32> {
    let api: Api<StorageVersionMigration> = Api::all(ctx.client.clone());
    let spec = StorageVersionMigrationSpec {
        resource: GroupVersionResource {
            group: ctx.widgets.group.clone(),
            version: String::new(),
            resource: WidgetCrd::PLURAL.into(),
        },
        continue_token: None,
    };
    let name = unique("bench");
    api.create(&PostParams::default(), &StorageVersionMigration::new(&name, spec))
        .await
        .expect("created");
    loop {
        let migration = api.get(&name).await.expect("exists");
        match Phase::of(&migration) {
            Phase::Succeeded => return ctx.controller,
            Phase::Failed => panic!("the migration failed: {:?}", migration.status),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// The in-tree migrator: a `storagemigration.k8s.io/v1` StorageVersionMigration, carried out by
/// kube-controller-manager.
async fn in_tree(ctx: Ctx, controller_manager: u32) -> Option<u32> {
    let gvk = GroupVersionKind::gvk("storagemigration.k8s.io", "v1", "StorageVersionMigration");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "storageversionmigrations");
    let api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &resource);
    let name = unique("in-tree");
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "storagemigration.k8s.io/v1",
        "kind": "StorageVersionMigration",
        "metadata": { "name": name },
        "spec": { "resource": { "group": ctx.widgets.group, "resource": WidgetCrd::PLURAL } },
    }))
    .expect("a valid object");
    api.create(&PostParams::default(), &object).await.expect("created");
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let migration = api.get(&name).await.expect("exists");
        let conditions =
            migration.data["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let holds =
            |kind: &str| conditions.iter().any(|c| c["type"] == kind && c["status"] == "True");
        if holds("Succeeded") {
            return Some(controller_manager);
        }
        assert!(!holds("Failed"), "the in-tree migration failed: {conditions:?}");
        assert!(Instant::now() < deadline, "the in-tree migration never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A model of kube-storage-version-migrator's core migrator: one worker, full-object lists of
/// 500, a PUT of each listed object, GET and PUT again on a conflict, every request through a
/// client-side limit of QPS 40 and burst 1000.
async fn upstream_model(ctx: Ctx) -> Option<u32> {
    let limiter = RateLimiter::new(UPSTREAM_QPS, UPSTREAM_BURST);
    let all = ctx.api(None);
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(UPSTREAM_PAGE);
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        limiter.acquire().await;
        let page = all.list(&params).await.expect("a page");
        for object in page.items {
            let namespace = object.metadata.namespace.clone().unwrap_or_default();
            let name = object.metadata.name.clone().unwrap_or_default();
            let api = ctx.api(Some(&namespace));
            limiter.acquire().await;
            match api.replace(&name, &PostParams::default(), &object).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    limiter.acquire().await;
                    let fresh = api.get(&name).await.expect("the object is read again");
                    limiter.acquire().await;
                    api.replace(&name, &PostParams::default(), &fresh).await.expect("written");
                }
                Err(error) => panic!("the upstream model's PUT failed: {error}"),
            }
        }
        match page.metadata.continue_ {
            Some(next) if !next.is_empty() => token = Some(next),
            _ => return None,
        }
    }
}

/// kube-controller-manager, run beside the control plane, stopped when dropped.
struct Process(std::process::Child);

impl Process {
    /// Starts `name`, found the envtest way (`TEST_ASSET_<NAME>`, `$KUBEBUILDER_ASSETS/<name>`;
    /// `make bench` builds it), logging into the control plane's directory.
    fn start(control_plane: &ControlPlane, name: &str, args: &[String]) -> Process {
        let variable = format!("TEST_ASSET_{}", name.to_uppercase().replace('-', "_"));
        let binary = std::env::var_os(&variable)
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("KUBEBUILDER_ASSETS").map(|d| std::path::Path::new(&d).join(name))
            })
            .unwrap_or_else(|| {
                panic!("no {name}: set {variable} or KUBEBUILDER_ASSETS (`make bench`)")
            });
        let log =
            std::fs::File::create(control_plane.path(&format!("{name}.log"))).expect("a log file");
        let child = std::process::Command::new(&binary)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("a log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| panic!("{} starts: {error}", binary.display()));
        control_plane.adopt(child.id());
        Process(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Creates `count` widgets of about `bytes` each, spread over `namespaces`, stored at v1.
async fn seed(
    client: &Client,
    widgets: &WidgetCrd,
    namespaces: &[String],
    count: usize,
    bytes: usize,
) {
    let padding = "x".repeat(bytes.saturating_sub(300));
    let per_namespace = count / namespaces.len();
    let creates = namespaces.iter().flat_map(|namespace| {
        let padding = &padding;
        (0..per_namespace).map(move |i| async move {
            let object: DynamicObject = serde_json::from_value(json!({
                "apiVersion": widgets.api_version("v1"),
                "kind": WidgetCrd::KIND,
                "metadata": { "name": format!("w-{i}"), "namespace": namespace },
                "spec": { "index": i, "padding": padding },
            }))
            .expect("a valid widget");
            widgets
                .api(client, "v1", Some(namespace))
                .create(&PostParams::default(), &object)
                .await
                .map(|_| ())
        })
    });
    futures::stream::iter(creates)
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .expect("seeded");
}

#[tokio::main]
async fn main() {
    let objects = env_number("BENCH_OBJECTS", 10_000) / NAMESPACES * NAMESPACES;
    let bytes = env_number("BENCH_OBJECT_BYTES", 1500);
    let control_plane = ControlPlane::start(&[]).await.expect("control plane");
    let client = control_plane.client().await;
    let config = control_plane.config().await;
    install_kube_svm_crds(&client).await;

    let widgets = WidgetCrd::new("bench", true);
    widgets.create(&client, "v1").await;
    let namespaces: Vec<String> = (0..NAMESPACES).map(|_| unique("bench")).collect();
    for namespace in &namespaces {
        create_namespace(&client, namespace).await;
    }
    let seeding = Instant::now();
    seed(&client, &widgets, &namespaces, objects, bytes).await;
    println!(
        "seeded {objects} widgets of about {bytes} bytes in {:.0} s",
        seeding.elapsed().as_secs_f64()
    );

    let (apiserver, etcd) = control_plane.pids();
    let ticks = std::process::Command::new("getconf").arg("CLK_TCK").output().ok();
    let ticks_per_second = ticks
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0);
    let mut meter = Meter {
        client: client.clone(),
        group: widgets.group.clone(),
        apiserver,
        etcd,
        ticks_per_second,
        idle: (0.0, 0.0),
    };
    let idle_from = meter.sample().await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_to = meter.sample().await;
    let idle_seconds = idle_to.at.duration_since(idle_from.at).as_secs_f64();
    meter.idle = (
        (idle_to.apiserver_cpu - idle_from.apiserver_cpu) / idle_seconds,
        (idle_to.etcd_cpu - idle_from.etcd_cpu) / idle_seconds,
    );
    println!("idle CPU: apiserver {:.3} s/s, etcd {:.3} s/s", meter.idle.0, meter.idle.1);

    let mut bench = Bench {
        control_plane,
        client: client.clone(),
        config,
        widgets,
        objects,
        stored: "v1",
        meter,
        rows: Vec::new(),
        controller: None,
        controller_manager: None,
    };

    bench
        .measure(
            "limit-64",
            "bare client, minimal patch, 64 in flight",
            true,
            Duration::ZERO,
            |ctx| bare_client(ctx, 64),
        )
        .await;
    if selected("kube-svm-controller") || selected("kube-svm-already-current") {
        let controller = KubeSvm::start(
            &bench.control_plane,
            "bench-controller",
            &["controller", "--leader-elect=false", "--crd-trigger=false"],
        )
        .await;
        bench.controller = Some(controller);
    }
    bench
        .measure(
            "kube-svm-controller",
            "defaults, end to end, created once the encoding check's 10 s settle has passed",
            true,
            SETTLE,
            kube_svm_controller,
        )
        .await;
    bench
        .measure(
            "kube-svm-already-current",
            "the same migration again",
            false,
            Duration::ZERO,
            kube_svm_controller,
        )
        .await;
    bench
        .measure(
            "limit-16",
            "bare client, minimal patch, 16 in flight",
            true,
            Duration::ZERO,
            |ctx| bare_client(ctx, 16),
        )
        .await;
    bench
        .measure(
            "kube-svm-engine",
            "the library at the controller's defaults",
            true,
            Duration::ZERO,
            kube_svm_engine,
        )
        .await;
    if selected("in-tree") {
        let process = Process::start(
            &bench.control_plane,
            "kube-controller-manager",
            &[
                format!("--kubeconfig={}", bench.control_plane.kubeconfig().display()),
                "--controllers=garbage-collector-controller,storage-version-migrator-controller"
                    .into(),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
            ],
        );
        let pid = process.pid();
        bench.controller_manager = Some(process);
        bench
            .measure(
                "in-tree",
                "kube-controller-manager 1.37, storagemigration.k8s.io/v1",
                true,
                Duration::ZERO,
                |ctx| in_tree(ctx, pid),
            )
            .await;
    }
    bench
        .measure(
            "upstream-model",
            "kube-storage-version-migrator's algorithm, QPS 40 (a model)",
            true,
            Duration::ZERO,
            upstream_model,
        )
        .await;
    bench
        .measure(
            "limit-64-again",
            "bare client, 64 in flight, at the end",
            true,
            Duration::ZERO,
            |ctx| bare_client(ctx, 64),
        )
        .await;

    // The write window, swept: objects/s against writes in flight.
    let mut sweep = BTreeMap::new();
    if env_number("BENCH_SWEEP", 1) != 0 {
        for in_flight in [1usize, 2, 4, 8, 16, 32, 64] {
            bench.switch().await;
            let target = GroupVersionResource {
                group: bench.widgets.group.clone(),
                version: String::new(),
                resource: WidgetCrd::PLURAL.into(),
            };
            let resource =
                Resource::resolve(&bench.client, &target, false).await.expect("resolves");
            let settings = Settings { writes_in_flight: in_flight, ..Settings::default() };
            let metrics = Arc::new(kube_svm::metrics::Metrics::new().expect("metrics"));
            let engine = Engine::new(
                bench.config.clone(),
                Arc::new(RateLimiter::new(0.0, 1)),
                settings,
                metrics.clone(),
            )
            .expect("an engine");
            let started = Instant::now();
            run_engine(&engine, resource).await;
            let patches = metrics.request_duration.with_label_values(&["patch"]);
            let latency = patches.get_sample_sum() / patches.get_sample_count().max(1) as f64;
            let rate = bench.objects as f64 / started.elapsed().as_secs_f64();
            bench.stored = if bench.stored == "v1" { "v2" } else { "v1" };
            println!(
                "sweep: at most {in_flight:>2} writes in flight: {rate:>7.1} objects/s, mean write latency {:.1} ms",
                latency * 1000.0
            );
            sweep.insert(in_flight, rate);
        }
    }
    write_report(&bench, &sweep, bytes);
}

/// Writes `docs/bench.md` and `docs/bench.json`.
fn write_report(bench: &Bench, sweep: &BTreeMap<usize, f64>, bytes: usize) {
    let limit: Vec<f64> = bench
        .rows
        .iter()
        .filter(|r| r.contender.starts_with("limit-64"))
        .map(|r| r.objects_per_second)
        .collect();
    let limit = limit.iter().sum::<f64>() / limit.len().max(1) as f64;
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{} custom resources of about {bytes} bytes over {NAMESPACES} namespaces, one local control plane (2 cores shared by etcd, kube-apiserver and the contender), one run. Ratios against the mean of the two 64-in-flight bare-client runs ({limit:.0} objects/s).\n",
        bench.objects
    );
    table.push_str("| contender | objects/s | × limit | requests/object | apiserver CPU s / 1,000 | etcd CPU s / 1,000 | peak RSS | note |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for row in &bench.rows {
        let _ = writeln!(
            table,
            "| {} | {:.0} | {} | {:.3} | {:.2} | {:.2} | {} | {} |",
            row.contender,
            row.objects_per_second,
            match limit > 0.0 {
                true => format!("{:.2}", row.objects_per_second / limit),
                false => "-".to_owned(),
            },
            row.requests_per_object,
            row.apiserver_cpu_per_1000,
            row.etcd_cpu_per_1000,
            row.peak_rss_mib.map(|m| format!("{m:.1} MiB")).unwrap_or_else(|| "-".into()),
            row.note
        );
    }
    if !sweep.is_empty() {
        table.push_str("\nkube-svm's engine, at most N writes in flight (no client-side rate limit):\n\n| writes in flight | objects/s |\n| --- | --- |\n");
        for (in_flight, rate) in sweep {
            let _ = writeln!(table, "| {in_flight} | {rate:.0} |");
        }
    }
    println!("\n{table}");
    // `BENCH_REPORT` moves the report elsewhere, for runs of a subset (the 100,000-object one).
    let stem = std::env::var("BENCH_REPORT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/bench"));
    if let Some(dir) = stem.parent() {
        std::fs::create_dir_all(dir).expect("the report's directory is created");
    }
    std::fs::write(stem.with_extension("md"), &table).expect("the table is written");
    let json = json!({ "objects": bench.objects, "bytes": bytes, "limit": limit, "rows": bench.rows, "sweep": sweep });
    std::fs::write(
        stem.with_extension("json"),
        serde_json::to_string_pretty(&json).expect("serializes"),
    )
    .expect("the numbers are written");
}
