//! The engine's flags, shared by `kube-svm controller` and `kube-svm migrate`: how hard to
//! press the apiserver, how long to wait for it, and how a CRD's new storage version is
//! confirmed.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use clap::builder::TypedValueParser;

use super::values;
use crate::api::{Budget, Pace};
use crate::apiserver::requests::Requests;
use crate::engine::{self, Engine, ProbeParams, RateLimiter, rate_limit};
use crate::evidence::encoding::EncodingPolicy;
use crate::ops::metrics::Metrics;

/// The most `--writes-in-flight` accepts: fifty times kube-apiserver's default limit on mutating
/// requests in flight (`--max-mutating-requests-inflight=200`), so never the bound that matters,
/// and far from where the engine's queues, sized as a multiple of it, would overflow.
const MAX_WRITES_IN_FLIGHT: usize = 10_000;

#[derive(Args, Clone, Debug)]
pub struct EngineArgs {
    /// Requests per second to the apiserver, averaged (upstream's flag); 0, the default, sets no
    /// client-side limit: the write window yields to the apiserver's throttling and latency.
    #[arg(long, env = "KUBE_SVM_KUBE_API_QPS", default_value_t = rate_limit::DEFAULT_QPS, value_parser = values::qps)]
    pub kube_api_qps: f64,

    /// Requests sent at once above the average rate (upstream's flag).
    #[arg(long, env = "KUBE_SVM_KUBE_API_BURST", default_value_t = rate_limit::DEFAULT_BURST, value_parser = values::count(1, u32::MAX))]
    pub kube_api_burst: u32,

    /// Writes in flight per migration, at most (throttling and rising latency narrow it).
    #[arg(long, env = "KUBE_SVM_WRITES_IN_FLIGHT", default_value_t = 64, value_parser = values::count(1, MAX_WRITES_IN_FLIGHT))]
    pub writes_in_flight: usize,

    /// How hard migrations press the apiserver: `gentle` keeps other clients' requests within
    /// the foreground budget (below); `fast` takes the apiserver's whole throughput, for
    /// maintenance windows. A migration can ask for either with the annotation
    /// `kube-svm.io/pace`.
    #[arg(long, env = "KUBE_SVM_PACE", default_value = "gentle", value_parser = pace_parser())]
    pub pace: Pace,

    /// How slow the gentle pace lets other clients get: the p99 of a probe kube-svm sends as
    /// another client would, either a multiple of the probe's quiet baseline (`2x`, the default)
    /// or a latency (`25ms`, which needs no baseline: its writes take no quiet pause). The
    /// gentle pace sets a rate of writes, cut when the probe passes the budget (and the cut
    /// undone if the probe is as slow without the run's writes) and grown below it; a migration can ask for a stricter budget with the annotation
    /// `kube-svm.io/foreground-budget`. `off` paces gentle migrations by their own write latency
    /// instead. The fast pace ignores it.
    #[arg(long, env = "KUBE_SVM_FOREGROUND_BUDGET", default_value = "2x", value_parser = budget)]
    pub foreground_budget: ForegroundBudget,

    /// The gentle pace's numbers, by name, comma-separated (`hold_ms=10000,cut=0.5`); those not
    /// named keep their defaults. For measuring the pace against a bench: docs/performance.md
    /// names each and its default.
    #[arg(long, env = "KUBE_SVM_PACE_PARAMS", default_value = "", hide_default_value = true, value_parser = ProbeParams::parse)]
    pub pace_params: ProbeParams,

    /// The namespace of the ConfigMap `kube-svm-probe` that the gentle pace's probe writes (one
    /// probe in four; the chart creates it in the release's namespace). The controller
    /// defaults to its own namespace; `kube-svm migrate` writes no probe without it.
    #[arg(long, env = "KUBE_SVM_PROBE_NAMESPACE")]
    pub probe_namespace: Option<String>,

    /// Objects per list request.
    #[arg(long, env = "KUBE_SVM_PAGE_SIZE", default_value_t = 500, value_parser = values::count(1, u32::MAX))]
    pub page_size: u32,

    /// Seconds the discovery storage version hash of a CRD must be seen unchanged, through
    /// enough new connections that every apiserver was likely asked, before kube-svm trusts that
    /// the apiservers encode in the new version (where the StorageVersion API is not served).
    #[arg(long, env = "KUBE_SVM_STORAGE_VERSION_SETTLE", default_value_t = 10.0, value_parser = values::seconds(0.0))]
    pub storage_version_settle: f64,

    /// Seconds to wait, in all, for discovery to publish a CRD's new storage version hash and
    /// hold it for the settle period; past that the migration runs but storedVersions is kept.
    #[arg(long, env = "KUBE_SVM_STORAGE_VERSION_WAIT", default_value_t = 120.0, value_parser = values::seconds(0.0))]
    pub storage_version_wait: f64,

    /// Seconds one request to the apiserver may go unanswered (watches excepted).
    #[arg(long, env = "KUBE_SVM_REQUEST_TIMEOUT", default_value_t = 30.0, value_parser = values::seconds(1.0))]
    pub request_timeout: f64,

    /// Seconds a migration waits, in all, for an apiserver that is down before it fails.
    #[arg(long, env = "KUBE_SVM_APISERVER_OUTAGE_TIMEOUT", default_value_t = 900.0, value_parser = values::seconds(0.0))]
    pub apiserver_outage_timeout: f64,

    /// Write objects back through their `status` subresource wherever the resource has one: it
    /// re-encodes the whole object, and admission webhooks and policies rarely guard it. A
    /// migration can ask for it alone with the annotation `kube-svm.io/write-to-status: "true"`.
    #[arg(long, env = "KUBE_SVM_WRITE_TO_STATUS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub write_to_status: bool,
}

/// The engine and the settings the steps around it take, from [`EngineArgs`].
pub struct Built {
    pub engine: Engine,
    /// The way to the cluster's apiserver, a deadline on every request.
    pub requests: Requests,
    pub encoding: EncodingPolicy,
    pub write_to_status: bool,
}

impl EngineArgs {
    /// The engine and its requests. `own_namespace` is the process's own namespace when it runs
    /// in one (the controller): where the probe writes unless `--probe-namespace` says otherwise.
    pub fn build(
        self,
        config: kube::Config,
        metrics: Arc<Metrics>,
        own_namespace: Option<String>,
    ) -> anyhow::Result<Built> {
        let EngineArgs {
            kube_api_qps,
            kube_api_burst,
            writes_in_flight,
            pace,
            foreground_budget,
            pace_params,
            probe_namespace,
            page_size,
            storage_version_settle,
            storage_version_wait,
            request_timeout,
            apiserver_outage_timeout,
            write_to_status,
        } = self;
        let request_timeout = seconds(request_timeout);
        let requests =
            Requests::new(config, request_timeout).context("failed to create a client")?;
        let limiter = Arc::new(RateLimiter::new(kube_api_qps, kube_api_burst));
        let settings = engine::Settings {
            page_size,
            writes_in_flight,
            pace,
            foreground_budget: foreground_budget.0,
            probe_params: pace_params,
            probe_namespace: probe_namespace.or(own_namespace),
            own_writes: requests.own_writes().clone(),
            request_timeout,
            outage_timeout: seconds(apiserver_outage_timeout),
            ..engine::Settings::default()
        };
        let engine = Engine::new(requests.config().clone(), limiter, settings, metrics)
            .context("failed to create a client")?;
        Ok(Built {
            engine,
            requests,
            encoding: EncodingPolicy {
                settle: seconds(storage_version_settle),
                wait: seconds(storage_version_wait),
            },
            write_to_status,
        })
    }
}

/// `--foreground-budget`: `off`, or a [`Budget`].
#[derive(Clone, Copy, Debug)]
pub struct ForegroundBudget(pub Option<Budget>);

fn budget(text: &str) -> Result<ForegroundBudget, String> {
    match text {
        "off" => Ok(ForegroundBudget(None)),
        budget => Budget::parse(budget).map(|budget| ForegroundBudget(Some(budget))),
    }
}

/// Parses `--pace`: one of [`Pace::NAMES`], listed in `--help`.
fn pace_parser() -> impl TypedValueParser<Value = Pace> {
    clap::builder::PossibleValuesParser::new(Pace::NAMES)
        .map(|name: String| Pace::parse(&name).unwrap_or_default())
}

/// A number of seconds from the command line, which [`values::seconds`] has checked is finite,
/// not negative, and not too large to count from.
pub fn seconds(value: f64) -> Duration {
    Duration::try_from_secs_f64(value.clamp(0.0, values::MAX_SECONDS)).unwrap_or_default()
}
