//! The foreground client: what the cluster's own traffic feels of a contender. A ServiceAccount
//! of its own sends one GET and one merge PATCH of a ConfigMap every 50 ms, as any controller of
//! the cluster does; the p50, p99 and max of its requests while a contender runs are its cost to
//! everyone else. The burst is a second client of the same identity, ten times as busy, for a
//! minute.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use kube::core::DynamicObject;
use kube::{Api, Client};
use serde_json::json;

use crate::meter::{ApiserverAccount, apiserver_account};
use crate::minutes::{Minutes, Request, nearest_rank};
use crate::support::ControlPlane;
use crate::support::chart;
use crate::support::fixtures::create_namespace;
use crate::trace;

/// The foreground client's period: one GET and one PATCH every 50 ms, a busy controller's pace.
const FOREGROUND_PERIOD: Duration = Duration::from_millis(50);

/// Where the foreground client's ServiceAccount and ConfigMap live.
const FOREGROUND_NAMESPACE: &str = "bench-foreground";
const FOREGROUND: &str = "foreground";

/// The burst: a second client of the foreground's identity, a GET and a PATCH every
/// `BURST_PERIOD` (200 requests a second, ten times the foreground) for `BURST_FOR`, on the
/// ConfigMap `BURST`, in the middle of a migration: the gentle pace must give way while it lasts.
const BURST: &str = "burst";
pub const BURST_PERIOD: Duration = Duration::from_millis(10);
pub const BURST_FOR: Duration = Duration::from_secs(60);
/// When the burst starts, from the start of the migration it falls in.
pub const BURST_AFTER: Duration = Duration::from_secs(45);

/// Latencies of the foreground client's requests over some time.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Latencies {
    pub requests: usize,
    /// Requests that failed (they count in the latencies too).
    pub failed: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// The p99 of each whole minute, and of the last part if it lasted half a minute or more.
    pub per_minute_p99_ms: Vec<f64>,
}

impl Latencies {
    /// `4.2 / 18.0 / 40.1`
    pub fn cells(&self) -> String {
        format!("{:.1} / {:.1} / {:.0}", self.p50_ms, self.p99_ms, self.max_ms)
    }
}

/// The foreground client: a ServiceAccount of its own (so API Priority and Fairness classifies it
/// as it would any controller's), one GET and one merge PATCH of a ConfigMap every
/// [`FOREGROUND_PERIOD`], on a thread and runtime of its own so that a contender running in the
/// bench's process does not delay it.
pub struct Foreground {
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The client configuration it runs as, for a burst of the same identity.
    pub config: kube::Config,
}

impl Foreground {
    /// Creates the foreground's objects and starts it; with `trace_ms`, each of its requests
    /// that took that long or more is printed.
    /// `sending: false` (`BENCH_FOREGROUND=off`) makes its objects but sends nothing: the
    /// contenders have the apiserver to themselves.
    pub async fn start(
        control_plane: &ControlPlane,
        sending: bool,
        trace_ms: Option<f64>,
    ) -> Foreground {
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
        match sending {
            true => Foreground::spawn(config, FOREGROUND, FOREGROUND_PERIOD, trace_ms),
            false => {
                Foreground { requests: Arc::default(), stop: Arc::default(), thread: None, config }
            }
        }
    }

    /// A client sending one GET and one merge PATCH of the ConfigMap `name` every `period`.
    fn spawn(
        config: kube::Config,
        name: &'static str,
        period: Duration,
        trace_ms: Option<f64>,
    ) -> Foreground {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (config, requests, stop) = (config.clone(), requests.clone(), stop.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(foreground_loop(config, name, period, trace_ms, requests, stop));
            })
        };
        Foreground { requests, stop, thread: Some(thread), config }
    }

    /// A burst of extra foreground load: from `after` on, for [`BURST_FOR`], the foreground's
    /// identity (`config`) sends a GET and a PATCH every [`BURST_PERIOD`] on a ConfigMap of its
    /// own, as a busy client of the cluster would. It stops when its task ends or is aborted.
    pub fn burst(config: kube::Config, after: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let burst = Foreground::spawn(config, BURST, BURST_PERIOD, None);
            tokio::time::sleep(BURST_FOR).await;
            drop(burst);
        })
    }

    /// The latencies of the requests sent from `from` to `to`.
    pub fn between(&self, from: Instant, to: Instant) -> Option<Latencies> {
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

impl Drop for Foreground {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The client's loop, until `stop`. The foreground's own minutes are printed as they end (a
/// burst's are not), with what the apiserver says of itself meanwhile.
async fn foreground_loop(
    config: kube::Config,
    name: &str,
    period: Duration,
    trace_ms: Option<f64>,
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
    let mut minutes = (name == FOREGROUND).then(Minutes::new);
    let mut before: Option<ApiserverAccount> = None;
    let mut n: u64 = 0;
    let trace = trace_ms.filter(|_| name == FOREGROUND);
    if trace.is_some() {
        // Ends with `stop`, or with this thread's runtime.
        tokio::spawn(trace::checks(admin.clone(), stop.clone()));
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
            trace::slow_requests(slow, &[("GET", got), ("PATCH", patched)]);
        }
        let Some(minutes) = minutes.as_mut() else { continue };
        let ended = minutes.record(got.took);
        if let Some(line) = minutes.record(patched.took).or(ended) {
            let account = apiserver_account(&admin).await;
            eprintln!("{line}{}", Minutes::account(account, before));
            before = account;
        }
    }
}
