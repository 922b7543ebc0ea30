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
//! kube-svm runs at its gentle default and at its fast pace, with and without the chart's API
//! Priority and Fairness objects (`flowControl.enabled`), always as the chart's ServiceAccount so
//! that APF applies to it as in a cluster (the bench's admin identity is exempt).
//!
//! Beside every contender, and on the idle apiserver before and after them, a foreground client
//! (a ServiceAccount of its own, as any controller of the cluster) sends one GET and one merge
//! PATCH of a ConfigMap every 50 ms: the p50, p99 and max of its requests while a contender runs
//! are what the cluster's own traffic feels of it.
//!
//! Per contender: objects/s, the foreground's latency, requests per object (the apiserver's
//! `apiserver_request_total`), apiserver and etcd CPU seconds per 1,000 objects (from /proc, the
//! idle rate subtracted), peak RSS of the migrating process, and the kinds of request the
//! apiserver spent its time on meanwhile (`apiserver_request_duration_seconds_sum`, every
//! client's). Then a sweep of kube-svm's engine
//! over its write window, its gentle latency band and fixed rates (each rate for 90 s at most;
//! one of them 1.2 times the in-tree migrator's objects/s, where it ran: `BENCH_SWEEP=in-tree`):
//! the curve of objects/s against the foreground's p99. The table goes to `docs/bench.md`, the numbers to `docs/bench.json`
//! (`hack/plot.py` draws `docs/bench.png` from them). `BENCH_CONTENDERS` (comma-separated names)
//! runs a subset (`kube-svm-controller-probe` runs once per budget of `BENCH_FOREGROUND_BUDGETS`,
//! default `in-tree,off`; the budget `in-tree` is the in-tree migrator's foreground p99 in the
//! same run, `in-tree-relative` that p99 as a multiple of the idle one, and the in-tree
//! migrator then runs before it); `BENCH_SWEEP=0` skips the sweep, `BENCH_SWEEP=windows`, `bands` or `rates` runs a
//! third of it, any other text the settings whose name contains it; `BENCH_REPORT=/tmp/x` writes `/tmp/x.md` and `/tmp/x.json` instead; `BENCH_IDLE_SECONDS`
//! sets the idle phases' length (20 s); `BENCH_APISERVER_FLAGS` adds flags to kube-apiserver's
//! (whitespace-separated); `BENCH_BEFORE_BINARY=PATH` runs that kube-svm build's
//! defaults first, alone and with the burst (`kube-svm-before`, `kube-svm-before-burst`), for a
//! before and after in one run. The foreground's p50 / p99 / max of each minute is printed to
//! stderr as the minute ends, with the time of day, so that a run stopped early still tells it.
//! `BENCH_TRACE_MS=N` prints each foreground request that took N ms or more, and each check of
//! the widgets' watch caches against etcd (read once a second), with the time to the millisecond.
//! Throughput drifts as
//! etcd's history grows: the limit is measured at the start and again at the end, and ratios are
//! quoted against their mean.

// The integration tests' harness; the bench needs only part of it.
#[allow(dead_code, unused_imports)]
#[path = "../tests/cluster/support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use kube_svm::api::{
    Budget, GroupVersionResource, Pace, Phase, StorageVersionMigration, StorageVersionMigrationSpec,
};
use kube_svm::apiserver::fence::Fence;
use kube_svm::engine::{
    self, Band, Engine, Finished, Job, Progress, RateLimiter, Resource, Settings,
};
use prometheus::core::Collector as _;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use support::chart;
use support::fixtures::{WidgetCrd, create_namespace, install_kube_svm_crds, unique};
use support::invariant::Census;
use support::process::KubeSvm;
use support::{CONTROLLER_NAMESPACE, ControlPlane, Etcd};

const NAMESPACES: usize = 20;

/// The foreground client's period: one GET and one PATCH every 50 ms, a busy controller's pace.
const FOREGROUND_PERIOD: Duration = Duration::from_millis(50);

/// Where the foreground client's ServiceAccount and ConfigMap live.
const FOREGROUND_NAMESPACE: &str = "bench-foreground";
const FOREGROUND: &str = "foreground";

/// The burst: a second client of the foreground's identity, a GET and a PATCH every
/// `BURST_PERIOD` (200 requests a second, ten times the foreground) for `BURST_FOR`, on the
/// ConfigMap `BURST`, in the middle of a migration: the gentle pace must give way while it lasts.
const BURST: &str = "burst";
const BURST_PERIOD: Duration = Duration::from_millis(10);
const BURST_FOR: Duration = Duration::from_secs(60);
/// When the burst starts, from the start of the migration it falls in.
const BURST_AFTER: Duration = Duration::from_secs(45);

/// How long kube-svm's probe runs alone, nothing written, to show its own cost.
const PROBE_ALONE: Duration = Duration::from_secs(60);

/// How long the idle apiserver is measured, before the contenders and after them: 800 foreground
/// requests, so that the p99 is the eighth slowest. `BENCH_IDLE_SECONDS` sets it: a large
/// apiserver's collector slows every client a few times a minute, which 20 s may miss.
fn idle_for() -> Duration {
    let seconds = std::env::var("BENCH_IDLE_SECONDS").ok().map(|s| {
        s.parse::<u64>().unwrap_or_else(|_| panic!("BENCH_IDLE_SECONDS={s}: a number of seconds"))
    });
    Duration::from_secs(seconds.unwrap_or(20))
}

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

/// Whether `contender` runs: a row named `<contender> <setting>` runs with its contender.
fn selected(contender: &str) -> bool {
    let contender = contender.split(' ').next().unwrap_or(contender);
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

#[derive(Clone)]
struct Sample {
    at: Instant,
    apiserver_cpu: f64,
    etcd_cpu: f64,
    served: Served,
}

/// What the apiserver has served so far, by group, resource (with its subresource) and verb:
/// requests (`apiserver_request_total`) and the seconds they took
/// (`apiserver_request_duration_seconds_sum`).
#[derive(Clone, Default)]
struct Served(std::collections::BTreeMap<(String, String, String), (f64, f64)>);

impl Served {
    /// From the apiserver's metrics text.
    fn parse(text: &str) -> Served {
        let mut served = Served::default();
        for line in text.lines() {
            let (total, rest) = match line.strip_prefix("apiserver_request_total{") {
                Some(rest) => (true, rest),
                None => match line.strip_prefix("apiserver_request_duration_seconds_sum{") {
                    Some(rest) => (false, rest),
                    None => continue,
                },
            };
            let Some((labels, value)) = rest.rsplit_once('}') else { continue };
            let Ok(value) = value.trim().parse::<f64>() else { continue };
            let label = |name| kube_svm::removal::label_value(labels, name).unwrap_or_default();
            let resource = match label("subresource") {
                sub if sub.is_empty() => label("resource"),
                sub => format!("{}/{sub}", label("resource")),
            };
            let key = (label("group"), resource, label("verb"));
            let entry = served.0.entry(key).or_default();
            if total { entry.0 += value } else { entry.1 += value }
        }
        served
    }

    /// Requests served for `group`.
    fn requests_of(&self, group: &str) -> f64 {
        self.0.iter().filter(|((g, _, _), _)| g == group).map(|(_, (n, _))| n).sum()
    }

    /// The kinds of request the apiserver spent the most time on since `before`, busiest first,
    /// over `seconds` (watches aside: their time is how long they stayed open).
    fn busiest_since(&self, before: &Served, seconds: f64) -> Vec<Busy> {
        let mut busy: Vec<Busy> = self
            .0
            .iter()
            .filter(|((_, _, verb), _)| verb != "WATCH" && verb != "CONNECT")
            .map(|(key @ (group, resource, verb), (n, took))| {
                let (n0, took0) = before.0.get(key).copied().unwrap_or_default();
                let group = if group.is_empty() { "core" } else { group };
                Busy {
                    request: format!("{verb} {group}/{resource}"),
                    per_second: (n - n0) / seconds,
                    busy_per_second: (took - took0) / seconds,
                }
            })
            .filter(|b| b.per_second > 0.0)
            .collect();
        busy.sort_by(|a, b| b.busy_per_second.total_cmp(&a.busy_per_second));
        busy.truncate(BUSIEST);
        busy
    }
}

/// Prints what the apiserver was busiest with, one kind of request a line.
fn print_busiest(busiest: &[Busy]) {
    for busy in busiest {
        println!(
            "    {:<52} {:>7.1} /s  {:>6.3} s/s",
            busy.request, busy.per_second, busy.busy_per_second
        );
    }
}

/// The kinds of request a row names.
const BUSIEST: usize = 8;

/// One kind of request while a contender ran: how many a second, and the seconds of the
/// apiserver's time they took each second (summed latencies: a request in flight for a second
/// counts a second, whether it worked or waited).
#[derive(Clone, Debug, serde::Serialize)]
struct Busy {
    request: String,
    per_second: f64,
    busy_per_second: f64,
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

    /// What the apiserver has served so far.
    async fn served(&self) -> Served {
        let request = http::Request::get("/metrics").body(Vec::new()).expect("a request");
        let text = self.client.request_text(request).await.expect("the apiserver's metrics");
        Served::parse(&text)
    }

    async fn sample(&self) -> Sample {
        Sample {
            served: self.served().await,
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
    /// The foreground client's requests while the contender ran.
    foreground: Option<Latencies>,
    /// What the apiserver spent its time on meanwhile, every client's requests together.
    busiest: Vec<Busy>,
}

/// Latencies of the foreground client's requests over some time.
#[derive(Clone, Debug, serde::Serialize)]
struct Latencies {
    requests: usize,
    /// Requests that failed (they count in the latencies too).
    failed: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    /// The p99 of each whole minute, and of the last part if it lasted half a minute or more.
    per_minute_p99_ms: Vec<f64>,
}

impl Latencies {
    /// `4.2 / 18.0 / 40.1`
    fn cells(&self) -> String {
        format!("{:.1} / {:.1} / {:.0}", self.p50_ms, self.p99_ms, self.max_ms)
    }
}

/// One foreground request: when it was sent, how long it took, whether it succeeded.
#[derive(Clone, Copy)]
struct Request {
    sent: Instant,
    took: Duration,
    ok: bool,
}

/// The foreground client: a ServiceAccount of its own (so API Priority and Fairness classifies it
/// as it would any controller's), one GET and one merge PATCH of a ConfigMap every
/// [`FOREGROUND_PERIOD`], on a thread and runtime of its own so that a contender running in the
/// bench's process does not delay it.
struct Foreground {
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The client configuration it runs as, for a burst of the same identity.
    config: kube::Config,
}

impl Foreground {
    async fn start(control_plane: &ControlPlane) -> Foreground {
        let admin = control_plane.client().await;
        create_namespace(&admin, FOREGROUND_NAMESPACE).await;
        let objects: Vec<DynamicObject> = [
            json!({ "apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": { "name": FOREGROUND, "namespace": FOREGROUND_NAMESPACE } }),
            json!({ "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": { "name": FOREGROUND, "namespace": FOREGROUND_NAMESPACE },
                    "data": { "tick": "0" } }),
            json!({ "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": { "name": BURST, "namespace": FOREGROUND_NAMESPACE },
                    "data": { "tick": "0" } }),
            json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                    "metadata": { "name": FOREGROUND, "namespace": FOREGROUND_NAMESPACE },
                    "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"] }] }),
            json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": { "name": FOREGROUND, "namespace": FOREGROUND_NAMESPACE },
                    "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": FOREGROUND },
                    "subjects": [{ "kind": "ServiceAccount", "name": FOREGROUND, "namespace": FOREGROUND_NAMESPACE }] }),
        ]
        .into_iter()
        .map(|value| serde_json::from_value(value).expect("a valid object"))
        .collect();
        chart::apply(&admin, &objects, false).await.expect("the foreground's objects apply");
        let mut config = control_plane.config().await;
        config.auth_info.impersonate =
            Some(format!("system:serviceaccount:{FOREGROUND_NAMESPACE}:{FOREGROUND}"));
        Foreground::spawn(config, FOREGROUND, FOREGROUND_PERIOD)
    }

    /// A client sending one GET and one merge PATCH of the ConfigMap `name` every `period`.
    fn spawn(config: kube::Config, name: &'static str, period: Duration) -> Foreground {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (config, requests, stop) = (config.clone(), requests.clone(), stop.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(foreground_loop(config, name, period, requests, stop));
            })
        };
        Foreground { requests, stop, thread: Some(thread), config }
    }

    /// A burst of extra foreground load: from `after` on, for [`BURST_FOR`], the foreground's
    /// identity (`config`) sends a GET and a PATCH every [`BURST_PERIOD`] on a ConfigMap of its
    /// own, as a busy client of the cluster would. It stops when its task ends or is aborted.
    fn burst(config: kube::Config, after: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let burst = Foreground::spawn(config, BURST, BURST_PERIOD);
            tokio::time::sleep(BURST_FOR).await;
            drop(burst);
        })
    }

    /// The latencies of the requests sent from `from` to `to`.
    fn between(&self, from: Instant, to: Instant) -> Option<Latencies> {
        let requests = self.requests.lock().expect("not poisoned");
        let within = |from: Instant, to: Instant| -> Vec<Request> {
            requests.iter().filter(|r| r.sent >= from && r.sent + r.took <= to).copied().collect()
        };
        let all = within(from, to);
        let mut millis = sorted_millis(&all);
        if millis.is_empty() {
            return None;
        }
        let mut per_minute_p99_ms = Vec::new();
        let mut start = from;
        while to.saturating_duration_since(start) >= Duration::from_secs(30) {
            let end = (start + Duration::from_secs(60)).min(to);
            let minute = sorted_millis(&within(start, end));
            if !minute.is_empty() {
                per_minute_p99_ms.push(nearest_rank(&minute, 0.99));
            }
            start = end;
        }
        millis.sort_by(f64::total_cmp);
        Some(Latencies {
            requests: millis.len(),
            failed: all.iter().filter(|r| !r.ok).count(),
            p50_ms: nearest_rank(&millis, 0.50),
            p99_ms: nearest_rank(&millis, 0.99),
            max_ms: millis[millis.len() - 1],
            per_minute_p99_ms,
        })
    }
}

/// The requests' latencies in milliseconds, sorted.
fn sorted_millis(requests: &[Request]) -> Vec<f64> {
    let mut millis: Vec<f64> = requests.iter().map(|r| r.took.as_secs_f64() * 1000.0).collect();
    millis.sort_by(f64::total_cmp);
    millis
}

/// The `p` quantile of `sorted` (not empty), nearest rank.
fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

impl Drop for Foreground {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn foreground_loop(
    config: kube::Config,
    name: &str,
    period: Duration,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
) {
    // The apiserver's own account of itself, read as the bench's admin.
    let mut admin = config.clone();
    admin.auth_info.impersonate = None;
    let admin = Client::try_from(admin).expect("a client");
    let client = Client::try_from(config).expect("a client");
    let api: Api<ConfigMap> = Api::namespaced(client, FOREGROUND_NAMESPACE);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The foreground's own minutes are printed as they end; a burst's are not.
    let mut minutes = (name == FOREGROUND).then(Minutes::new);
    let mut before: Option<ApiserverAccount> = None;
    let mut n: u64 = 0;
    let trace = trace_ms().filter(|_| name == FOREGROUND);
    if trace.is_some() {
        // Ends with `stop`, or with this thread's runtime.
        tokio::spawn(trace_checks(admin.clone(), stop.clone()));
    }
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let sent = Instant::now();
        let ok = api.get(name).await.is_ok();
        let got = Request { sent, took: sent.elapsed(), ok };
        n += 1;
        let patch = json!({ "data": { "tick": n.to_string() } });
        let sent = Instant::now();
        let ok = api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_ok();
        let patched = Request { sent, took: sent.elapsed(), ok };
        requests.lock().expect("not poisoned").extend([got, patched]);
        if let Some(slow) = trace {
            for (verb, request) in [("GET", got), ("PATCH", patched)] {
                let millis = request.took.as_secs_f64() * 1000.0;
                if millis >= slow {
                    eprintln!("foreground {verb} sent {} took {millis:.1} ms", clock(request.sent));
                }
            }
        }
        let Some(minutes) = minutes.as_mut() else { continue };
        let ended = minutes.record(got.took);
        if let Some(line) = minutes.record(patched.took).or(ended) {
            let account = apiserver_account(&admin).await;
            let collected = match (account, before) {
                (Some(now), Some(before)) => format!(
                    "; the apiserver collected its heap {} times, {:.2} GiB in use, \
                     checked its watch cache of widgets against etcd {} times",
                    now.collections - before.collections,
                    now.inuse / f64::from(1 << 30),
                    now.checks - before.checks,
                ),
                _ => String::new(),
            };
            before = account;
            eprintln!("{line}{collected}");
        }
    }
}

/// `BENCH_TRACE_MS`: the latency from which each foreground request is printed.
fn trace_ms() -> Option<f64> {
    let value = std::env::var("BENCH_TRACE_MS").ok()?;
    Some(value.parse().unwrap_or_else(|_| panic!("BENCH_TRACE_MS={value}: a number of ms")))
}

/// The time of day (UTC) at `at`, to the millisecond.
fn clock(at: Instant) -> String {
    let now = std::time::SystemTime::now();
    let then = now.checked_sub(at.elapsed()).unwrap_or(now);
    let millis = then.duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis());
    let seconds = millis / 1000 % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        millis % 1000
    )
}

/// Prints when the apiserver's count of its checks of the widgets' watch caches grows, read
/// once a second, until `stop`.
async fn trace_checks(admin: Client, stop: Arc<AtomicBool>) {
    let mut seen: Option<f64> = None;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(account) = apiserver_account(&admin).await else { continue };
        if let Some(before) = seen
            && account.checks > before
        {
            eprintln!(
                "the apiserver ended {} check(s) of the widgets' watch caches by {}",
                account.checks - before,
                clock(Instant::now()),
            );
        }
        seen = Some(account.checks);
    }
}

/// What the apiserver says of itself at the end of a minute, by its own `/metrics`.
#[derive(Clone, Copy)]
struct ApiserverAccount {
    /// Its garbage collections so far.
    collections: f64,
    /// The bytes of its heap in use.
    inuse: f64,
    /// Its watch cache's consistency checks of widgets so far: each lists every widget from
    /// etcd (every 5 to 7.5 minutes, `DetectCacheInconsistency`, on by default).
    checks: f64,
}

/// The apiserver's account of its heap and its checks of the widgets (filtered by name, a few
/// KiB); `None` when it does not say.
async fn apiserver_account(admin: &Client) -> Option<ApiserverAccount> {
    let path = "/metrics?name[]=go_gc_duration_seconds&name[]=go_memstats_heap_inuse_bytes\
                &name[]=apiserver_storage_consistency_checks_total";
    let request = http::Request::get(path).body(Vec::new()).ok()?;
    let text = admin.request_text(request).await.ok()?;
    let value = |name: &str| {
        text.lines().find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
    };
    let widgets = format!("resource=\"{}\"", WidgetCrd::PLURAL);
    let checks = text
        .lines()
        .filter(|line| {
            line.starts_with("apiserver_storage_consistency_checks_total{")
                && line.contains(&widgets)
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    Some(ApiserverAccount {
        collections: value("go_gc_duration_seconds_count ")?,
        inuse: value("go_memstats_heap_inuse_bytes ")?,
        checks,
    })
}

/// The foreground's latencies of each minute, printed when it ends with the time of day (UTC) and
/// how often the apiserver collected its heap meanwhile, so that a run stopped before its end (a
/// long one) still tells what the foreground felt, minute by minute, beside the controller's log.
struct Minutes {
    from: Instant,
    millis: Vec<f64>,
}

impl Minutes {
    fn new() -> Minutes {
        Minutes { from: Instant::now(), millis: Vec::new() }
    }

    /// Records one latency; the minute's line once it ends.
    fn record(&mut self, took: Duration) -> Option<String> {
        self.millis.push(took.as_secs_f64() * 1000.0);
        if self.from.elapsed() < Duration::from_secs(60) {
            return None;
        }
        self.millis.sort_by(f64::total_cmp);
        let line = format!(
            "foreground minute to {} UTC: p50 / p99 / max {:.1} / {:.1} / {:.0} ms over {} requests",
            &clock(Instant::now())[..8],
            nearest_rank(&self.millis, 0.50),
            nearest_rank(&self.millis, 0.99),
            self.millis[self.millis.len() - 1],
            self.millis.len(),
        );
        *self = Minutes::new();
        Some(line)
    }
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
    widgets: WidgetCrd,
    objects: usize,
    /// The version the objects are stored in now.
    stored: &'static str,
    meter: Meter,
    rows: Vec<Row>,
    controller: Option<KubeSvm>,
    foreground: Foreground,
    /// The chart's ServiceAccount's client configuration: kube-svm runs as it.
    account: kube::Config,
}

impl Bench {
    fn etcd(&self) -> Etcd {
        self.control_plane.etcd()
    }

    /// Switches storage to the other version, and asks for a widget through the new storage;
    /// returns the version.
    ///
    /// The apiserver builds a custom resource's storage for a new storage version on the first
    /// request to it, its watch cache included, which reads every object from etcd. In a cluster
    /// that request comes at once (the resource's controllers watch it); here it would be the
    /// first migrator's, and the rebuild would count as the migrator's cost.
    async fn switch(&mut self) -> &'static str {
        let next = if self.stored == "v1" { "v2" } else { "v1" };
        self.widgets.set_storage_version(&self.client, next).await;
        self.widgets
            .api(&self.client, next, None)
            .list_metadata(&ListParams::default().limit(1))
            .await
            .expect("widgets list after the switch");
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
        // Where this measure's lines of the controller's log begin, read before the measure.
        let logged = self.controller.as_ref().map_or(0, |c| c.logs().len());
        let before = self.meter.sample().await;
        let ctx = Ctx {
            client: self.client.clone(),
            widgets: WidgetCrd { group: self.widgets.group.clone(), namespaced: true },
            target,
            controller: self.controller.as_ref().map(|c| c.pid()),
            account: self.account.clone(),
        };
        let pid = migrate(ctx).await;
        let after = self.meter.sample().await;
        let foreground = self.foreground.between(before.at, after.at);
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
            requests_per_object: (after.served.requests_of(&self.meter.group)
                - before.served.requests_of(&self.meter.group))
                / self.objects as f64,
            apiserver_cpu_per_1000: per_1000(
                after.apiserver_cpu - before.apiserver_cpu,
                self.meter.idle.0,
            ),
            etcd_cpu_per_1000: per_1000(after.etcd_cpu - before.etcd_cpu, self.meter.idle.1),
            peak_rss_mib: pid.map(peak_rss_mib),
            foreground,
            busiest: after.served.busiest_since(&before.served, seconds),
        };
        println!(
            "{:<38} {:>8.1} objects/s  foreground {}  {:>6.3} requests/object  apiserver {:>5.2} s, etcd {:>5.2} s CPU per 1,000{}",
            row.contender,
            row.objects_per_second,
            row.foreground.as_ref().map(|f| f.cells()).unwrap_or_default(),
            row.requests_per_object,
            row.apiserver_cpu_per_1000,
            row.etcd_cpu_per_1000,
            row.peak_rss_mib.map(|m| format!("  peak RSS {m:.1} MiB")).unwrap_or_default()
        );
        print_busiest(&row.busiest);
        // How the gentle rate moved, for whoever tunes the law.
        if let Some(controller) = &self.controller {
            let logs = controller.logs();
            let since = logs.get(logged..).unwrap_or_default();
            let steering = |l: &&str| l.contains("gentle rate") || l.contains("gentle writes wait");
            for line in since.lines().filter(steering) {
                println!("  {line}");
            }
        }
        self.rows.push(row);
    }

    /// Measures the foreground client alone for [`idle_for`].
    async fn idle(&mut self, contender: &str, note: &str) {
        let from = Instant::now();
        tokio::time::sleep(idle_for()).await;
        self.phase(contender, note, from);
    }

    /// kube-svm's probe alone for [`PROBE_ALONE`], nothing written: what it costs the
    /// foreground and the apiserver's CPU, and what it reads on this apiserver (its p99 against
    /// its quiet baseline).
    async fn probe_alone(&mut self) {
        if !selected("probe-alone") {
            return;
        }
        let from = Instant::now();
        let cpu_from = self.meter.cpu_seconds(self.meter.apiserver);
        let probe = Probe::start(&self.account);
        tokio::time::sleep(PROBE_ALONE).await;
        let seen = probe.stop();
        // The apiserver's CPU the probe costs, the idle rate (the foreground's) subtracted.
        let cpu = self.meter.cpu_seconds(self.meter.apiserver) - cpu_from;
        let cpu = cpu / from.elapsed().as_secs_f64() - self.meter.idle.0;
        let note = format!(
            "kube-svm's probe alone, nothing written: {seen}; apiserver CPU {cpu:+.3} s/s over idle"
        );
        self.phase("probe-alone", &note, from);
    }

    /// The burst alone ([`Foreground::burst`]): what it costs the foreground by itself.
    async fn burst_alone(&mut self) {
        if !selected("burst-alone") {
            return;
        }
        let from = Instant::now();
        let config = self.foreground.config.clone();
        Foreground::burst(config, Duration::ZERO).await.expect("the burst ran");
        let note = format!(
            "a second client of the foreground's identity, a GET and a PATCH every {} ms",
            BURST_PERIOD.as_millis()
        );
        self.phase("burst-alone", &note, from);
    }

    /// Records what the foreground felt from `from` to now, nothing migrated.
    fn phase(&mut self, contender: &str, note: &str, from: Instant) {
        let seconds = from.elapsed().as_secs_f64();
        let foreground = self.foreground.between(from, Instant::now());
        println!(
            "{contender:<38} foreground {}  {note}",
            foreground.as_ref().map(|f| f.cells()).unwrap_or_default()
        );
        self.rows.push(Row {
            contender: contender.to_owned(),
            note: note.to_owned(),
            objects: 0,
            seconds,
            objects_per_second: 0.0,
            requests_per_object: 0.0,
            apiserver_cpu_per_1000: 0.0,
            etcd_cpu_per_1000: 0.0,
            peak_rss_mib: None,
            foreground,
            busiest: Vec::new(),
        });
    }

    /// Installs (or removes) the chart's API Priority and Fairness objects for the controller's
    /// ServiceAccount, and waits until the apiserver classifies its requests accordingly.
    async fn flow_control(&self, on: bool) {
        let args =
            ["--set", "flowControl.enabled=true", "--show-only", "templates/flowcontrol.yaml"];
        let objects = chart::objects(&chart::render("kube-svm", CONTROLLER_NAMESPACE, &args));
        let level = objects
            .iter()
            .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "PriorityLevelConfiguration"))
            .and_then(|o| o.metadata.name.clone())
            .expect("the chart renders a priority level");
        if on {
            chart::apply(&self.client, &objects, false).await.expect("the flow control applies");
        } else {
            for object in &objects {
                let types = object.types.as_ref().expect("typed");
                let gvk = GroupVersionKind::try_from(types).expect("a kind");
                let (resource, _) =
                    kube::discovery::pinned_kind(&self.client, &gvk).await.expect("served");
                let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
                let name = object.metadata.name.clone().expect("named");
                api.delete(&name, &DeleteParams::default()).await.expect("deleted");
            }
        }
        // The UID of the level the account's requests go to, from the apiserver's answer.
        let account = Client::try_from(self.account.clone()).expect("a client");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let levels: Api<DynamicObject> = Api::all_with(
                self.client.clone(),
                &ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk(
                        "flowcontrol.apiserver.k8s.io",
                        "v1",
                        "PriorityLevelConfiguration",
                    ),
                    "prioritylevelconfigurations",
                ),
            );
            let own = levels.get_opt(&level).await.expect("levels are readable");
            let own = own.and_then(|l| l.metadata.uid);
            let request =
                http::Request::get("/apis/migration.k8s.io/v1alpha1/storageversionmigrations")
                    .body(kube::client::Body::empty())
                    .expect("a request");
            let response = account.send(request).await.expect("an answer");
            let classified = response
                .headers()
                .get("X-Kubernetes-PF-PriorityLevel-UID")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            if (classified.is_some() && classified == own) == on {
                return;
            }
            assert!(Instant::now() < deadline, "the flow control never took effect");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// kube-svm's probe, as the controller's gentle pace runs it (quiet windows included), sent
/// while the bench measures something else: what it reads there. A write is admitted every
/// second and none is sent, too seldom to wait on the rate: the rate stays, and the probe's p99
/// is that of the last minute.
struct Probe {
    gate: Arc<engine::Foreground>,
    admitting: tokio::task::JoinHandle<()>,
}

impl Probe {
    /// Starts the probe as the controller's ServiceAccount (`account`), on the chart's ConfigMap.
    fn start(account: &kube::Config) -> Probe {
        let metrics = Arc::new(kube_svm::ops::metrics::Metrics::new().expect("metrics"));
        let gate = Arc::new(engine::Foreground::new(
            account.clone(),
            Some(CONTROLLER_NAMESPACE),
            Budget::default(),
            metrics,
        ));
        let admitting = {
            let gate = gate.clone();
            tokio::spawn(async move {
                loop {
                    drop(gate.admit(None).await);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            })
        };
        Probe { gate, admitting }
    }

    /// Stops the probe; what it saw.
    fn stop(self) -> engine::Steered {
        self.admitting.abort();
        self.gate.seen()
    }
}

/// What a contender needs.
struct Ctx {
    client: Client,
    widgets: WidgetCrd,
    target: &'static str,
    controller: Option<u32>,
    /// The chart's ServiceAccount's client configuration.
    account: kube::Config,
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

/// kube-svm's engine, as a library, at the controller's defaults, as the chart's ServiceAccount.
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
    let metrics = Arc::new(kube_svm::ops::metrics::Metrics::new().expect("metrics"));
    let engine =
        Engine::new(ctx.account.clone(), limiter, Settings::default(), metrics).expect("an engine");
    run_engine(&engine, resource).await;
    None
}

/// Runs `engine` over `resource` for `at_most`, or to its end when that comes first (or when
/// `None`); a run cut short is not checked in etcd, its objects are rewritten by the next.
async fn run_engine_for(engine: &Engine, resource: Resource, at_most: Option<Duration>) {
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

/// One setting of the sweep.
struct Setting {
    name: String,
    pace: Pace,
    writes_in_flight: usize,
    gentle_band: Band,
    /// Requests per second the engine may send (its client-side limit); 0 for none.
    qps: f64,
    /// How long the setting runs at most: a fixed rate's point needs a minute or two, not every
    /// object at 10 a second.
    for_at_most: Option<Duration>,
}

/// The fixed rates of the sweep, objects per second: the curve of the foreground's p99 against
/// the rate alone, which any pace's point can be read against.
const SWEEP_RATES: [f64; 7] = [10.0, 20.0, 40.0, 80.0, 160.0, 240.0, 320.0];

/// The in-tree migrator's objects/s times this is one more fixed rate: what its foreground costs
/// says whether any pace can move that much at the in-tree migrator's harm.
const IN_TREE_TIMES: f64 = 1.2;

/// How long each fixed rate runs: a minute and a half, enough for 1,800 foreground requests.
const RATE_STEP: Duration = Duration::from_secs(90);

/// The settings the sweep tries (`BENCH_SWEEP`: `0` none, `windows`, `bands`, `rates`, unset
/// all, any other text those whose name contains it): fixed windows at the fast pace, where the
/// window grows to its maximum; gentle bands of several widths and spacings with the maximum of
/// 64; and fixed rates ([`SWEEP_RATES`], each for [`RATE_STEP`] at most) at the fast pace held
/// to the rate by the client-side limit alone, and, where the in-tree migrator ran, at
/// [`IN_TREE_TIMES`] its objects/s (`in_tree`).
fn sweep_settings(in_tree: Option<f64>) -> Vec<Setting> {
    let which = std::env::var("BENCH_SWEEP").unwrap_or_default();
    let mut settings = Vec::new();
    if which == "0" {
        return settings;
    }
    // Any other text than a group's name filters every setting by name.
    let all = !matches!(which.as_str(), "windows" | "bands" | "rates");
    if all || which == "windows" {
        for in_flight in [1usize, 2, 4, 8, 16, 64] {
            settings.push(Setting {
                name: format!("window {in_flight}"),
                pace: Pace::Fast,
                writes_in_flight: in_flight,
                gentle_band: Band::GENTLE,
                qps: 0.0,
                for_at_most: None,
            });
        }
    }
    if all || which == "bands" {
        for (grow_below, shrink_above, max_spacing) in [
            (1.5, 3.0, 0.0),
            (1.5, 3.0, 1.0),
            (1.5, 3.0, 2.0),
            (1.5, 3.0, 4.0),
            (1.25, 2.5, 2.0),
            (2.0, 4.0, 0.0),
            (5.0, 10.0, 0.0),
        ] {
            let spacing = if max_spacing > 0.0 {
                format!(", spaced up to {max_spacing}x")
            } else {
                ", unspaced".to_owned()
            };
            settings.push(Setting {
                name: format!("gentle band {grow_below}x-{shrink_above}x{spacing}"),
                pace: Pace::Gentle,
                writes_in_flight: 64,
                gentle_band: Band { grow_below, shrink_above, max_spacing, ..Band::GENTLE },
                qps: 0.0,
                for_at_most: None,
            });
        }
    }
    if all || which == "rates" {
        let named = SWEEP_RATES.map(|rate| (format!("rate {rate:.0}/s"), rate));
        let in_tree = in_tree.map(|rate| {
            let rate = rate * IN_TREE_TIMES;
            (format!("rate {IN_TREE_TIMES}x in-tree ({rate:.0}/s)"), rate)
        });
        for (name, rate) in named.into_iter().chain(in_tree) {
            settings.push(Setting {
                name,
                pace: Pace::Fast,
                writes_in_flight: 64,
                gentle_band: Band::GENTLE,
                qps: rate,
                for_at_most: Some(RATE_STEP),
            });
        }
    }
    if !matches!(which.as_str(), "" | "windows" | "bands" | "rates") {
        settings.retain(|setting| setting.name.contains(&which));
    }
    settings
}

/// One point of the sweep's curve.
#[derive(Clone, Debug, serde::Serialize)]
struct Point {
    setting: String,
    pace: &'static str,
    writes_in_flight: usize,
    grow_below: Option<f64>,
    shrink_above: Option<f64>,
    max_spacing: Option<f64>,
    /// The client-side limit, requests per second, at a fixed rate's point.
    qps: Option<f64>,
    objects_per_second: f64,
    mean_write_ms: f64,
    /// The window's mean size over the run, sampled every 100 ms.
    mean_window: f64,
    /// Writes in flight on average (Little's law: the writes' summed latency over the run's
    /// duration); below 1 when writes are spaced.
    mean_in_flight: f64,
    foreground: Option<Latencies>,
    /// What kube-svm's probe, sent alongside ([`Probe`]), read: its p99 over the last minute.
    /// (Its quiet windows hold no write of the sweep's engine: it has no baseline here.)
    probe_p99_ms: Option<f64>,
}

#[tokio::main]
async fn main() {
    let objects = env_number("BENCH_OBJECTS", 10_000) / NAMESPACES * NAMESPACES;
    let bytes = env_number("BENCH_OBJECT_BYTES", 1500);
    let apiserver_flags = std::env::var("BENCH_APISERVER_FLAGS").unwrap_or_default();
    let apiserver_flags: Vec<&str> = apiserver_flags.split_whitespace().collect();
    let control_plane = ControlPlane::start(&apiserver_flags).await.expect("control plane");
    let client = control_plane.client().await;
    install_kube_svm_crds(&client).await;
    let account = {
        let path = control_plane.controller_kubeconfig().await;
        let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("readable");
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("the controller's kubeconfig is valid")
    };

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
    let foreground = Foreground::start(&control_plane).await;

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
    // Idle CPU, and the foreground client on an idle apiserver.
    let idle_from = meter.sample().await;
    tokio::time::sleep(idle_for()).await;
    let idle_to = meter.sample().await;
    let idle_seconds = idle_to.at.duration_since(idle_from.at).as_secs_f64();
    meter.idle = (
        (idle_to.apiserver_cpu - idle_from.apiserver_cpu) / idle_seconds,
        (idle_to.etcd_cpu - idle_from.etcd_cpu) / idle_seconds,
    );
    println!("idle CPU: apiserver {:.3} s/s, etcd {:.3} s/s", meter.idle.0, meter.idle.1);
    let idle_busiest = idle_to.served.busiest_since(&idle_from.served, idle_seconds);
    print_busiest(&idle_busiest);
    let idle_before = foreground.between(idle_from.at, idle_to.at);

    let mut bench = Bench {
        control_plane,
        client: client.clone(),
        widgets,
        objects,
        stored: "v1",
        meter,
        rows: Vec::new(),
        controller: None,
        foreground,
        account,
    };
    bench.rows.push(Row {
        contender: "idle-before".into(),
        note: "nothing runs but the foreground client".into(),
        objects: 0,
        seconds: idle_seconds,
        objects_per_second: 0.0,
        requests_per_object: 0.0,
        apiserver_cpu_per_1000: 0.0,
        etcd_cpu_per_1000: 0.0,
        peak_rss_mib: None,
        foreground: idle_before.clone(),
        busiest: idle_busiest,
    });
    println!(
        "{:<38} foreground {}",
        "idle-before",
        idle_before.map(|f| f.cells()).unwrap_or_default()
    );

    bench.probe_alone().await;
    bench.burst_alone().await;
    bench
        .measure(
            "limit-64",
            "bare client, minimal patch, 64 in flight",
            true,
            Duration::ZERO,
            |ctx| bare_client(ctx, 64),
        )
        .await;
    let controller_contenders = [
        "kube-svm-controller",
        "kube-svm-controller-burst",
        "kube-svm-controller-fast",
        "kube-svm-already-current",
        "kube-svm-controller-flowcontrol",
        "kube-svm-controller-fast-flowcontrol",
    ];
    // The controller's defaults, its budget named: the test support's controllers follow
    // their own latency unless told.
    let args = ["controller", "--leader-elect=false", "--crd-trigger=false"];
    let default_args: Vec<&str> = args.iter().copied().chain(["--foreground-budget=3x"]).collect();
    // The defaults of another build (`BENCH_BEFORE_BINARY`, say the commit before a change),
    // alone and with the burst, on the same apiserver in the same run, before this build's.
    let before = std::env::var_os("BENCH_BEFORE_BINARY").map(std::path::PathBuf::from);
    let before_selected = selected("kube-svm-before") || selected("kube-svm-before-burst");
    if let Some(before) = before.filter(|_| before_selected) {
        let kubeconfig = bench.control_plane.controller_kubeconfig().await;
        let controller = KubeSvm::start_built(
            &bench.control_plane,
            &before,
            "bench-before",
            &default_args,
            kubeconfig,
        );
        bench.controller = Some(controller);
        let what = format!("{}'s defaults, end to end", before.display());
        bench
            .measure("kube-svm-before", &what, true, SETTLE, |ctx| kube_svm_controller(ctx, None))
            .await;
        let config = bench.foreground.config.clone();
        let what =
            format!("{}'s defaults, the burst of kube-svm-controller-burst", before.display());
        let burst = |ctx| kube_svm_controller_with_burst(ctx, config);
        bench.measure("kube-svm-before-burst", &what, true, SETTLE, burst).await;
        bench.controller = None;
    }
    if controller_contenders.iter().any(|c| selected(c)) {
        let controller =
            KubeSvm::start(&bench.control_plane, "bench-controller", &default_args).await;
        bench.controller = Some(controller);
    }
    bench
        .measure(
            "kube-svm-controller",
            "defaults (gentle, steered by its probe at 3x), end to end, created once the encoding check's 10 s settle has passed",
            true,
            SETTLE,
            |ctx| kube_svm_controller(ctx, None),
        )
        .await;
    let config = bench.foreground.config.clone();
    let burst = |ctx| kube_svm_controller_with_burst(ctx, config);
    bench
        .measure(
            "kube-svm-controller-burst",
            &format!(
                "defaults, a burst of extra foreground load from {} s in, for {} s (burst-alone)",
                BURST_AFTER.as_secs(),
                BURST_FOR.as_secs()
            ),
            true,
            SETTLE,
            burst,
        )
        .await;
    // A controller of its own per budget (`BENCH_FOREGROUND_BUDGETS`, comma-separated, default
    // `in-tree,off`), its gentle pace steered by the probe. `in-tree` is the in-tree migrator's
    // foreground p99 in this run, in ms; `in-tree-relative` the same p99 as a multiple of the
    // foreground's idle p99 (the same harm, judged on the probe's own idle tail, which is not
    // the foreground client's); either runs the in-tree migrator first. `off` is the pace by
    // kube-svm's own write latency.
    let budgets =
        std::env::var("BENCH_FOREGROUND_BUDGETS").unwrap_or_else(|_| "in-tree,off".into());
    let budgets: Vec<&str> = budgets.split(',').map(str::trim).filter(|b| !b.is_empty()).collect();
    let in_tree_first =
        selected("in-tree") && budgets.iter().any(|budget| budget.starts_with("in-tree"));
    if in_tree_first {
        in_tree_contender(&mut bench).await;
    }
    if selected("kube-svm-controller-probe") {
        // The default controller comes back after them.
        bench.controller = None;
        let p99_of = |bench: &Bench, contender: &str| {
            let row = bench.rows.iter().find(|r| r.contender == contender);
            let p99 = row.and_then(|r| r.foreground.as_ref()).map(|f| f.p99_ms);
            p99.unwrap_or_else(|| panic!("the foreground p99 of {contender}, measured first"))
        };
        for budget in &budgets {
            let budget = match *budget {
                "in-tree" => format!("{:.0}ms", p99_of(&bench, "in-tree").ceil()),
                "in-tree-relative" => {
                    let times = p99_of(&bench, "in-tree") / p99_of(&bench, "idle-before");
                    format!("{:.2}x", times.max(1.01))
                }
                budget => budget.to_owned(),
            };
            let flag = format!("--foreground-budget={budget}");
            let probe_args: Vec<&str> = args.iter().copied().chain([flag.as_str()]).collect();
            let controller = KubeSvm::start(&bench.control_plane, "bench-probe", &probe_args).await;
            bench.controller = Some(controller);
            bench
                .measure(
                    &format!("kube-svm-controller-probe {budget}"),
                    &match budget.as_str() {
                        "off" => format!("gentle, by its own write latency: {flag}, end to end"),
                        _ => format!("gentle, steered by its probe: {flag}, end to end"),
                    },
                    true,
                    SETTLE,
                    |ctx| kube_svm_controller(ctx, None),
                )
                .await;
            bench.controller = None;
        }
        if controller_contenders.iter().any(|c| selected(c)) {
            let controller =
                KubeSvm::start(&bench.control_plane, "bench-controller", &default_args).await;
            bench.controller = Some(controller);
        }
    }
    if selected("in-tree") && !in_tree_first {
        in_tree_contender(&mut bench).await;
    }
    bench
        .measure(
            "kube-svm-controller-fast",
            "annotated kube-svm.io/pace: fast, end to end",
            true,
            SETTLE,
            |ctx| kube_svm_controller(ctx, Some(Pace::Fast)),
        )
        .await;
    bench
        .measure(
            "kube-svm-already-current",
            "the same migration again, defaults",
            false,
            Duration::ZERO,
            |ctx| kube_svm_controller(ctx, None),
        )
        .await;
    let flow_control = ["kube-svm-controller-flowcontrol", "kube-svm-controller-fast-flowcontrol"];
    if flow_control.iter().any(|c| selected(c)) {
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
            "the library at the controller's defaults (gentle)",
            true,
            Duration::ZERO,
            kube_svm_engine,
        )
        .await;
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
    if selected("idle-after") || std::env::var("BENCH_CONTENDERS").is_err() {
        bench.idle("idle-after", "nothing runs but the foreground client").await;
    }

    // The write window and the gentle band, swept: objects/s against the foreground's p99.
    let mut sweep = Vec::new();
    let in_tree = bench.rows.iter().find(|r| r.contender == "in-tree" && r.objects > 0);
    for setting in sweep_settings(in_tree.map(|row| row.objects_per_second)) {
        bench.switch().await;
        // As the controller's contenders do: the apiserver's work on a storage switch (its
        // storage for the resource rebuilt) is not the setting's. A point of 90 s would
        // otherwise carry it in its p99.
        tokio::time::sleep(SETTLE).await;
        let target = GroupVersionResource {
            group: bench.widgets.group.clone(),
            version: String::new(),
            resource: WidgetCrd::PLURAL.into(),
        };
        let resource = Resource::resolve(&bench.client, &target, false).await.expect("resolves");
        let settings = Settings {
            writes_in_flight: setting.writes_in_flight,
            pace: setting.pace,
            gentle_band: setting.gentle_band,
            ..Settings::default()
        };
        let metrics = Arc::new(kube_svm::ops::metrics::Metrics::new().expect("metrics"));
        let engine = Engine::new(
            bench.account.clone(),
            Arc::new(RateLimiter::new(setting.qps, 1)),
            settings,
            metrics.clone(),
        )
        .expect("an engine");
        let started = Instant::now();
        let (window_sum, window_samples) = (Arc::new(Mutex::new(0.0)), Arc::new(Mutex::new(0u64)));
        let sampler = {
            let (metrics, sum, samples) =
                (metrics.clone(), window_sum.clone(), window_samples.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let size: i64 = metrics
                        .write_window
                        .collect()
                        .iter()
                        .flat_map(|family| family.get_metric())
                        .map(|metric| metric.get_gauge().get_value() as i64)
                        .sum();
                    *sum.lock().expect("not poisoned") += size as f64;
                    *samples.lock().expect("not poisoned") += 1;
                }
            })
        };
        let probe = Probe::start(&bench.account);
        run_engine_for(&engine, resource, setting.for_at_most).await;
        let probed = probe.stop();
        let millis = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
        sampler.abort();
        let ended = Instant::now();
        let patches = metrics.request_duration.with_label_values(&["patch"]);
        let latency = patches.get_sample_sum() / patches.get_sample_count().max(1) as f64;
        let elapsed = ended.duration_since(started).as_secs_f64();
        // Each object is one minimal patch: a run cut short counts what it wrote.
        let rate = patches.get_sample_count() as f64 / elapsed;
        let mean_in_flight = patches.get_sample_sum() / elapsed;
        let mean_window = *window_sum.lock().expect("not poisoned")
            / (*window_samples.lock().expect("not poisoned")).max(1) as f64;
        bench.stored = if bench.stored == "v1" { "v2" } else { "v1" };
        let foreground = bench.foreground.between(started, ended);
        println!(
            "sweep: {:<28} {rate:>7.1} objects/s, mean write latency {:.1} ms, mean window {mean_window:.1}, in flight {mean_in_flight:.2}, foreground {}, probe p99 {}",
            setting.name,
            latency * 1000.0,
            foreground.as_ref().map(|f| f.cells()).unwrap_or_default(),
            millis(probed.probe_p99).map(|p| format!("{p:.1} ms")).unwrap_or_default()
        );
        let gentle = setting.pace == Pace::Gentle;
        sweep.push(Point {
            setting: setting.name,
            pace: setting.pace.name(),
            writes_in_flight: setting.writes_in_flight,
            grow_below: gentle.then_some(setting.gentle_band.grow_below),
            shrink_above: gentle.then_some(setting.gentle_band.shrink_above),
            max_spacing: gentle.then_some(setting.gentle_band.max_spacing),
            qps: (setting.qps > 0.0).then_some(setting.qps),
            objects_per_second: rate,
            mean_write_ms: latency * 1000.0,
            mean_window,
            mean_in_flight,
            foreground,
            probe_p99_ms: millis(probed.probe_p99),
        });
    }
    if !sweep.is_empty() {
        bench.idle("idle-after-sweep", "nothing runs but the foreground client").await;
    }
    write_report(&bench, &sweep, bytes);
}

/// Writes `docs/bench.md` and `docs/bench.json`.
fn write_report(bench: &Bench, sweep: &[Point], bytes: usize) {
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
        "{} custom resources of about {bytes} bytes over {NAMESPACES} namespaces, one local control plane (2 cores shared by etcd, kube-apiserver, the contender and the foreground client), one run. Ratios against the mean of the two 64-in-flight bare-client runs ({limit:.0} objects/s). The foreground client sends one GET and one merge PATCH of a ConfigMap every 50 ms as a ServiceAccount; its latency is measured while each contender runs.\n",
        bench.objects
    );
    // The budget the probe's default aims at, for the foreground's p99 of each minute.
    let idle_p99 = bench
        .rows
        .iter()
        .find(|r| r.contender == "idle-before")
        .and_then(|r| r.foreground.as_ref())
        .map(|f| f.p99_ms);
    let minutes = |row: &Row| -> String {
        let Some(per_minute) = row.foreground.as_ref().map(|f| &f.per_minute_p99_ms) else {
            return "-".to_owned();
        };
        if per_minute.is_empty() || row.objects == 0 {
            return "-".to_owned();
        }
        let cells: Vec<String> = per_minute.iter().map(|p99| format!("{p99:.1}")).collect();
        let within = match idle_p99 {
            Some(idle) => {
                let within = per_minute.iter().filter(|p99| **p99 <= 3.0 * idle).count();
                format!(" ({within} of {} within 3x idle)", per_minute.len())
            }
            None => String::new(),
        };
        format!("{}{within}", cells.join(", "))
    };
    table.push_str("| contender | objects/s | × limit | foreground p50 / p99 / max (ms) | foreground p99 each minute (ms) | requests/object | apiserver CPU s / 1,000 | etcd CPU s / 1,000 | peak RSS | note |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    let dash = || "-".to_owned();
    for row in &bench.rows {
        let migrates = row.objects > 0;
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.contender,
            if migrates { format!("{:.0}", row.objects_per_second) } else { dash() },
            match migrates && limit > 0.0 {
                true => format!("{:.2}", row.objects_per_second / limit),
                false => dash(),
            },
            row.foreground.as_ref().map(|f| f.cells()).unwrap_or_else(dash),
            minutes(row),
            if migrates { format!("{:.3}", row.requests_per_object) } else { dash() },
            if migrates { format!("{:.2}", row.apiserver_cpu_per_1000) } else { dash() },
            if migrates { format!("{:.2}", row.etcd_cpu_per_1000) } else { dash() },
            row.peak_rss_mib.map(|m| format!("{m:.1} MiB")).unwrap_or_else(dash),
            row.note
        );
    }
    table.push_str("\nWhat the apiserver spent its time on while each ran, every client's requests together (requests a second, and the seconds they took each second: summed latencies; watches aside):\n\n");
    for row in bench.rows.iter().filter(|r| !r.busiest.is_empty()) {
        let busiest: Vec<String> = row
            .busiest
            .iter()
            .take(5)
            .map(|b| format!("{} {:.1}/s {:.3} s/s", b.request, b.per_second, b.busy_per_second))
            .collect();
        let _ = writeln!(table, "- {}: {}", row.contender, busiest.join("; "));
    }
    if !sweep.is_empty() {
        table.push_str("\nkube-svm's engine (as the chart's ServiceAccount, no client-side rate limit) at fixed windows (the fast pace, at most N writes in flight), at gentle latency bands (grow below a×, shrink above b× the fastest write, at most 64 in flight; spaced: at one write in flight, up to c× its latency idle after each write) and at fixed rates (the fast pace held to N requests/s by the client-side limit, for 90 s at most): the curve of throughput against the foreground's latency. Writes in flight is their summed latency over the run's duration, below 1 when spaced.\n\n| setting | objects/s | × limit | foreground p50 / p99 / max (ms) | mean write latency (ms) | mean window | writes in flight |\n| --- | --- | --- | --- | --- | --- | --- |\n");
        for point in sweep {
            let _ = writeln!(
                table,
                "| {} | {:.0} | {} | {} | {:.1} | {:.1} | {:.2} |",
                point.setting,
                point.objects_per_second,
                match limit > 0.0 {
                    true => format!("{:.2}", point.objects_per_second / limit),
                    false => dash(),
                },
                point.foreground.as_ref().map(|f| f.cells()).unwrap_or_else(dash),
                point.mean_write_ms,
                point.mean_window,
                point.mean_in_flight,
            );
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
