//! The contenders, each started as it would run in a cluster and measured by [`Bench::measure`]:
//!
//! - the limit: the minimal conditional patch from a bare client loop, lists pipelined, 16 and 64
//!   writes in flight;
//! - `kube-svm controller` end to end, at its gentle default (alone, and with a burst of other
//!   load), at the fast pace, with the chart's API Priority and Fairness objects, steered by other
//!   budgets, and another build's defaults for a before and after in one run; always as the
//!   chart's ServiceAccount, so that APF applies to it as in a cluster (the bench's admin identity
//!   is exempt);
//! - kube-svm's engine (the library) at its defaults;
//! - the in-tree migrator: kube-controller-manager's storage-version-migrator-controller, through
//!   a `storagemigration.k8s.io/v1` object;
//! - a model of kube-storage-version-migrator's algorithm at its shipped settings (one worker,
//!   full-object lists of 500, a PUT of each listed object, GET and PUT again on conflict, client
//!   QPS 40 and burst 1000), reimplemented here: the project is not served by the module proxy.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube_svm::api::{
    GroupVersionResource, Pace, Phase, StorageVersionMigration, StorageVersionMigrationSpec,
};
use kube_svm::apiserver::fence::Fence;
use kube_svm::engine::{self, Engine, Finished, Job, Progress, RateLimiter, Resource, Settings};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::bench::{Bench, Ctx};
use crate::foreground::{BURST_AFTER, BURST_FOR, Foreground};
use crate::support::ControlPlane;
use crate::support::fixtures::{WidgetCrd, unique};
use crate::support::process::KubeSvm;

/// The controller's default `--storage-version-settle`: its encoding check starts when it sees
/// the storage switch, so a migration created this long after finds it done.
pub const SETTLE: Duration = Duration::from_secs(11);

/// kube-storage-version-migrator's shipped client settings (its manifests' flags).
const UPSTREAM_QPS: f64 = 40.0;
const UPSTREAM_BURST: u32 = 1000;
/// kube-storage-version-migrator's list page size.
const UPSTREAM_PAGE: u32 = 500;

/// The contenders that run the controller at its defaults (`bench-controller`).
const CONTROLLER_CONTENDERS: [&str; 6] = [
    "kube-svm-controller",
    "kube-svm-controller-burst",
    "kube-svm-controller-fast",
    "kube-svm-already-current",
    "kube-svm-controller-flowcontrol",
    "kube-svm-controller-fast-flowcontrol",
];

/// The limit, `contender`: a bare client with `in_flight` writes at once.
pub async fn limit(bench: &mut Bench, contender: &str, in_flight: usize, note: &str) {
    bench.measure(contender, note, true, Duration::ZERO, |ctx| bare_client(ctx, in_flight)).await;
}

/// The defaults of another build (`BENCH_BEFORE_BINARY`, say the commit before a change), alone
/// and with the burst, on the same apiserver in the same run, before this build's.
pub async fn before_build(bench: &mut Bench) {
    let selected =
        bench.config.selected("kube-svm-before") || bench.config.selected("kube-svm-before-burst");
    let Some(before) = bench.config.before_binary.clone().filter(|_| selected) else { return };
    let args = bench.config.controller_args(&bench.config.pace.budget);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    bench.stop_controller();
    let kubeconfig = bench.control_plane.controller_kubeconfig().await;
    let controller =
        KubeSvm::start_built(&bench.control_plane, &before, "bench-before", &args, kubeconfig);
    bench.controller = Some(controller);
    let what = format!("{}'s defaults, end to end", before.display());
    bench
        .measure("kube-svm-before", &what, true, SETTLE, |ctx| kube_svm_controller(ctx, None))
        .await;
    let config = bench.foreground.config.clone();
    let what = format!("{}'s defaults, the burst of kube-svm-controller-burst", before.display());
    let burst = |ctx| kube_svm_controller_with_burst(ctx, config);
    bench.measure("kube-svm-before-burst", &what, true, SETTLE, burst).await;
    bench.stop_controller();
}

/// Starts the controller at its defaults, its budget named (the test support's controllers
/// follow their own latency unless told), if a contender that needs it runs.
async fn start_default_controller(bench: &mut Bench) {
    if CONTROLLER_CONTENDERS.iter().any(|c| bench.config.selected(c)) {
        let args = bench.config.controller_args(&bench.config.pace.budget);
        bench.start_controller("bench-controller", &args).await;
    }
}

/// `kube-svm controller` at its defaults, alone and with a burst of other load from
/// [`BURST_AFTER`] into the migration.
pub async fn controller_defaults(bench: &mut Bench) {
    start_default_controller(bench).await;
    bench
        .measure(
            "kube-svm-controller",
            "defaults (gentle, steered by its probe at 2x), end to end, created once the encoding check's 10 s settle has passed",
            true,
            SETTLE,
            |ctx| kube_svm_controller(ctx, None),
        )
        .await;
    let config = bench.foreground.config.clone();
    let burst = |ctx| kube_svm_controller_with_burst(ctx, config);
    let note = format!(
        "defaults, a burst of extra foreground load from {} s in, for {} s (burst-alone)",
        BURST_AFTER.as_secs(),
        BURST_FOR.as_secs()
    );
    bench.measure("kube-svm-controller-burst", &note, true, SETTLE, burst).await;
}

/// The in-tree migrator, and a controller of its own per budget of `BENCH_FOREGROUND_BUDGETS`
/// (`kube-svm-controller-probe <budget>`). `in-tree` is the in-tree migrator's foreground p99 in
/// this run, in ms; `in-tree-relative` the same p99 as a multiple of the foreground's idle p99
/// (the same harm, judged on the probe's own idle tail, which is not the foreground client's);
/// either runs the in-tree migrator first. `off` is the pace by kube-svm's own write latency.
/// Then one per entry of `BENCH_PACE_VARIANTS`, at `BENCH_PACE`'s budget with its parameters.
/// The controller at its defaults comes back after them.
pub async fn in_tree_and_budgets(bench: &mut Bench) {
    let budgets = bench.config.foreground_budgets.clone();
    let in_tree_first = bench.config.selected("in-tree")
        && budgets.iter().any(|budget| budget.starts_with("in-tree"));
    if in_tree_first {
        in_tree_contender(bench).await;
    }
    if bench.config.selected("kube-svm-controller-probe") {
        bench.stop_controller();
        // This round's row of `contender`, or the row of a phase measured once.
        let p99_of = |bench: &Bench, contender: &str| {
            let name = bench.in_round(contender);
            let row =
                bench.rows.iter().rev().find(|r| r.contender == name || r.contender == contender);
            let p99 = row.and_then(|r| r.foreground.as_ref()).map(|f| f.p99_ms);
            p99.unwrap_or_else(|| panic!("the foreground p99 of {contender}, measured first"))
        };
        for budget in &budgets {
            let budget = match budget.as_str() {
                "in-tree" => format!("{:.0}ms", p99_of(&*bench, "in-tree").ceil()),
                "in-tree-relative" => {
                    let times = p99_of(&*bench, "in-tree") / p99_of(&*bench, "idle-before");
                    format!("{:.2}x", times.max(1.01))
                }
                budget => budget.to_owned(),
            };
            let flag = format!("--foreground-budget={budget}");
            let args = bench.config.controller_args(&budget);
            bench.start_controller("bench-probe", &args).await;
            let note = match budget.as_str() {
                "off" => format!("gentle, by its own write latency: {flag}, end to end"),
                _ => format!("gentle, steered by its probe: {flag}, end to end"),
            };
            let contender = format!("kube-svm-controller-probe {budget}");
            bench
                .measure(&contender, &note, true, SETTLE, |ctx| kube_svm_controller(ctx, None))
                .await;
            bench.stop_controller();
        }
        let budget = bench.config.pace.budget.clone();
        for variant in bench.config.pace_variants.clone() {
            let args = bench.config.variant_args(&budget, Some(&variant));
            bench.start_controller("bench-probe", &args).await;
            let note = format!("gentle at --foreground-budget={budget}, --pace-params={variant}");
            let contender = format!("kube-svm-controller-probe {budget} {variant}");
            bench
                .measure(&contender, &note, true, SETTLE, |ctx| kube_svm_controller(ctx, None))
                .await;
            bench.stop_controller();
        }
        start_default_controller(bench).await;
    }
    if bench.config.selected("in-tree") && !in_tree_first {
        in_tree_contender(bench).await;
    }
}

/// The controller at its defaults, the migration annotated `kube-svm.io/pace: fast`.
pub async fn controller_fast(bench: &mut Bench) {
    let note = "annotated kube-svm.io/pace: fast, end to end";
    let fast = |ctx| kube_svm_controller(ctx, Some(Pace::Fast));
    bench.measure("kube-svm-controller-fast", note, true, SETTLE, fast).await;
}

/// The same migration again, every object already in the current encoding.
pub async fn already_current(bench: &mut Bench) {
    let note = "the same migration again, defaults";
    let again = |ctx| kube_svm_controller(ctx, None);
    bench.measure("kube-svm-already-current", note, false, Duration::ZERO, again).await;
}

/// The controller at its defaults and at the fast pace, with the chart's `flowControl.enabled`.
pub async fn flow_control(bench: &mut Bench) {
    let contenders = ["kube-svm-controller-flowcontrol", "kube-svm-controller-fast-flowcontrol"];
    if !contenders.iter().any(|c| bench.config.selected(c)) {
        return;
    }
    bench.flow_control(true).await;
    bench
        .measure(
            "kube-svm-controller-flowcontrol",
            "defaults, with the chart's flowControl.enabled (a priority level of 3 seats)",
            true,
            SETTLE,
            |ctx| kube_svm_controller(ctx, None),
        )
        .await;
    bench
        .measure(
            "kube-svm-controller-fast-flowcontrol",
            "fast, with the chart's flowControl.enabled",
            true,
            SETTLE,
            |ctx| kube_svm_controller(ctx, Some(Pace::Fast)),
        )
        .await;
    bench.flow_control(false).await;
}

/// kube-svm's engine, as a library, at the controller's defaults (gentle, by its own latency
/// band), but for what `BENCH_PACE` sets.
pub async fn engine(bench: &mut Bench) {
    let pace = &bench.config.pace;
    let defaults = Settings::default();
    let settings = Settings {
        writes_in_flight: pace.writes_in_flight.unwrap_or(defaults.writes_in_flight),
        gentle_band: pace.band,
        ..defaults
    };
    let note = "the library at the controller's defaults (gentle)";
    let engine = |ctx| kube_svm_engine(ctx, settings);
    bench.measure("kube-svm-engine", note, true, Duration::ZERO, engine).await;
}

/// A model of kube-storage-version-migrator's algorithm.
pub async fn upstream_model(bench: &mut Bench) {
    let note = "kube-storage-version-migrator's algorithm, QPS 40 (a model)";
    bench.measure("upstream-model", note, true, Duration::ZERO, upstream).await;
}

/// The in-tree migrator (kube-controller-manager's, `storagemigration.k8s.io/v1`), stopped right
/// after: its garbage collector's informers would load the apiserver during every later
/// contender.
async fn in_tree_contender(bench: &mut Bench) {
    let process = Process::start(
        &bench.control_plane,
        "kube-controller-manager",
        &[
            format!("--kubeconfig={}", bench.control_plane.kubeconfig().display()),
            "--controllers=garbage-collector-controller,storage-version-migrator-controller".into(),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ],
    );
    let pid = process.pid();
    // In a cluster kube-controller-manager is running long before a migration: its start (the
    // garbage collector's discovery and informers) is not the migration's cost.
    tokio::time::sleep(SETTLE).await;
    bench
        .measure(
            "in-tree",
            "kube-controller-manager 1.37, storagemigration.k8s.io/v1",
            true,
            SETTLE,
            |ctx| in_tree(ctx, pid),
        )
        .await;
    drop(process);
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

/// kube-svm's engine, as a library, with `settings`, as the chart's ServiceAccount.
async fn kube_svm_engine(ctx: Ctx, settings: Settings) -> Option<u32> {
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
    let metrics = Arc::new(kube_svm::ops::metrics::Metrics::new().expect("metrics"));
    let engine = Engine::new(ctx.account.clone(), limiter, settings, metrics).expect("an engine");
    run_engine(&engine, resource).await;
    None
}

/// Runs `engine` over `resource` for `at_most`, or to its end when that comes first (or when
/// `None`); a run cut short is not checked in etcd, its objects are rewritten by the next.
pub async fn run_engine_for(engine: &Engine, resource: Resource, at_most: Option<Duration>) {
    let stop = CancellationToken::new();
    let timer = at_most.map(|at_most| {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(at_most).await;
            stop.cancel();
        })
    });
    run_engine_until(engine, resource, &stop).await;
    if let Some(timer) = timer {
        timer.abort();
    }
}

async fn run_engine(engine: &Engine, resource: Resource) -> Progress {
    match run_engine_until(engine, resource, &CancellationToken::new()).await {
        Finished::Completed(progress) => progress,
        Finished::Cancelled(progress) => panic!("the migration did not complete: {progress:?}"),
    }
}

/// Runs `engine` over `resource` until it ends or `stop` fires; no object may fail.
async fn run_engine_until(
    engine: &Engine,
    resource: Resource,
    stop: &CancellationToken,
) -> Finished {
    let (report, _) = watch::channel(Progress::default());
    let job = Job {
        resource,
        write_to_status: false,
        pace: None,
        resume: Progress::default(),
        fence: Fence::open(),
        clean_managed_fields: None,
        budget: None,
    };
    match engine.run(job, &report, stop).await {
        Ok(Finished::Completed(progress)) if progress.failed == 0 => Finished::Completed(progress),
        Ok(Finished::Cancelled(progress)) if progress.failed == 0 => Finished::Cancelled(progress),
        other => panic!("the migration did not complete: {other:?}"),
    }
}

/// `kube-svm controller`, end to end: from creating the migration (annotated with `pace`, if
/// any) to seeing it Succeeded.
async fn kube_svm_controller(ctx: Ctx, pace: Option<Pace>) -> Option<u32> {
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
    let mut migration = StorageVersionMigration::new(&name, spec);
    if let Some(pace) = pace {
        migration.metadata.annotations =
            Some([(kube_svm::api::PACE_ANNOTATION.to_owned(), pace.name().to_owned())].into());
    }
    api.create(&PostParams::default(), &migration).await.expect("created");
    let ended = |m: Option<&StorageVersionMigration>| {
        m.is_some_and(|m| matches!(Phase::of(m), Phase::Succeeded | Phase::Failed))
    };
    let migration = finished(api, &name, ended).await;
    match Phase::of(&migration) {
        Phase::Succeeded => ctx.controller,
        _ => panic!("the migration failed: {:?}", migration.status),
    }
}

/// The object `name` once `ended` holds of it. Watched, not polled: a poll's reads load the
/// apiserver the foreground and the contender share (a read every 20 ms cost the apiserver more
/// than kube-svm's probe), and a poll's period is added to the time measured. A watch that fails
/// is started again. No deadline: the gentle pace at its slowest (2 objects/s) takes 14 hours
/// over 100,000 objects.
async fn finished<K>(api: Api<K>, name: &str, ended: impl Fn(Option<&K>) -> bool) -> K
where
    K: Clone + std::fmt::Debug + Send + serde::de::DeserializeOwned + kube::Resource + 'static,
{
    loop {
        match kube::runtime::wait::await_condition(api.clone(), name, &ended).await {
            Ok(Some(object)) => return object,
            Ok(None) => panic!("the migration {name} was deleted"),
            Err(error) => {
                println!("watching migration {name} failed ({error}); watching again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// [`kube_svm_controller`] at its defaults, with a burst of extra foreground load as `config`
/// from [`BURST_AFTER`] into the migration.
async fn kube_svm_controller_with_burst(ctx: Ctx, config: kube::Config) -> Option<u32> {
    let burst = Foreground::burst(config, BURST_AFTER);
    let pid = kube_svm_controller(ctx, None).await;
    burst.abort();
    pid
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
    let holds = |migration: &DynamicObject, kind: &str| {
        let conditions = migration.data["status"]["conditions"].as_array();
        conditions.into_iter().flatten().any(|c| c["type"] == kind && c["status"] == "True")
    };
    let ended =
        |m: Option<&DynamicObject>| m.is_some_and(|m| holds(m, "Succeeded") || holds(m, "Failed"));
    let migration = finished(api, &name, ended).await;
    let status = &migration.data["status"];
    assert!(holds(&migration, "Succeeded"), "the in-tree migration failed: {status}");
    Some(controller_manager)
}

/// A model of kube-storage-version-migrator's core migrator: one worker, full-object lists of
/// 500, a PUT of each listed object, GET and PUT again on a conflict, every request through a
/// client-side limit of QPS 40 and burst 1000.
async fn upstream(ctx: Ctx) -> Option<u32> {
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
