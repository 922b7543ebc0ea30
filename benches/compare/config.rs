//! Every `BENCH_*` variable the bench reads, read once from the environment into a [`Config`].
//! `docs/performance.md` lists them for operators; this is where each one is read and used.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube_svm::api::Budget;
use kube_svm::engine::{Band, ProbeParams};

/// The widgets are spread over this many namespaces; `BENCH_OBJECTS` is rounded down to a
/// multiple of it.
pub const NAMESPACES: usize = 20;

/// What one run measures, from its environment.
pub struct Config {
    /// `BENCH_OBJECTS`: the custom resources each contender moves one storage version further,
    /// rounded down to a multiple of [`NAMESPACES`]. Default 10,000.
    pub objects: usize,
    /// `BENCH_OBJECT_BYTES`: the size of each, about. Default 1,500.
    pub object_bytes: usize,
    /// `BENCH_CONTENDERS`: the contenders and phases that run, comma-separated names; `None`
    /// (unset or blank) runs them all. Default all.
    pub contenders: Option<Vec<String>>,
    /// `BENCH_FOREGROUND_BUDGETS`: the budgets of the `kube-svm-controller-probe` contenders,
    /// comma-separated (`3x`, `25ms`, `off`; `in-tree` is the in-tree migrator's foreground p99
    /// in the run, `in-tree-relative` that p99 over the idle one). Default `in-tree,off`.
    pub foreground_budgets: Vec<String>,
    /// `BENCH_PACE_VARIANTS`: one more `kube-svm-controller-probe` per entry, `;`-separated, each
    /// the `--pace-params` it runs with (`alone_below=0`, `headroom=100,margin=0.5`) on top of
    /// `BENCH_PACE`'s, at `BENCH_PACE`'s budget: a mechanism measured with and without it in one
    /// run. Default none.
    pub pace_variants: Vec<String>,
    /// `BENCH_REPEAT`: how many rounds of the contenders that run beside the client at a pace of
    /// their own (`kube-svm-before`, `kube-svm-controller` and their bursts, `in-tree`, the
    /// budgets and variants of `kube-svm-controller-probe`), one round after another, so that each is measured as
    /// often as the others and the report gives the median of each. Default 1.
    pub repeat: usize,
    /// `BENCH_BEFORE_BINARY`: another kube-svm build, whose defaults run first, alone and with
    /// the burst (`kube-svm-before`, `kube-svm-before-burst`). Default none.
    pub before_binary: Option<PathBuf>,
    /// `BENCH_SWEEP`: which settings of kube-svm's engine the sweep runs. Default all.
    pub sweep: Sweep,
    /// `BENCH_REPORT`: where the report goes, `<stem>.md` and `<stem>.json`. Default
    /// `docs/bench`.
    pub report: PathBuf,
    /// `BENCH_IDLE_SECONDS`: how long the idle apiserver is measured, before the contenders and
    /// after them. Default 20 s: 800 foreground requests, so that the p99 is the eighth slowest;
    /// a large apiserver's collector slows every client a few times a minute, which 20 s may miss.
    pub idle: Duration,
    /// `BENCH_APISERVER_FLAGS`: flags added to kube-apiserver's, whitespace-separated. Default
    /// none.
    pub apiserver_flags: Vec<String>,
    /// `BENCH_TRACE_MS`: print each foreground request that took this many ms or more, and each
    /// check of the widgets' watch caches against etcd. Default none.
    pub trace_ms: Option<f64>,
    /// `BENCH_FOREGROUND`: `off` runs the contenders with no foreground client, each alone on
    /// the apiserver (no latencies are reported then). Default on.
    pub foreground: bool,
    /// `BENCH_PACE`: the gentle pace's numbers that kube-svm takes as parameters. Default
    /// kube-svm's own.
    pub pace: PaceTuning,
}

impl Config {
    /// Reads the environment; a value that cannot be read stops the bench before it starts.
    pub fn from_env() -> Config {
        let var = |name: &str| std::env::var(name).ok();
        // As before: a number that does not parse leaves the default.
        let number =
            |name: &str, default: usize| var(name).and_then(|v| v.parse().ok()).unwrap_or(default);
        let idle = var("BENCH_IDLE_SECONDS").map(|s| {
            s.parse::<u64>()
                .unwrap_or_else(|_| panic!("BENCH_IDLE_SECONDS={s}: a number of seconds"))
        });
        let trace_ms = var("BENCH_TRACE_MS").map(|value| {
            value.parse().unwrap_or_else(|_| panic!("BENCH_TRACE_MS={value}: a number of ms"))
        });
        let budgets = var("BENCH_FOREGROUND_BUDGETS").unwrap_or_else(|| "in-tree,off".into());
        Config {
            objects: number("BENCH_OBJECTS", 10_000) / NAMESPACES * NAMESPACES,
            object_bytes: number("BENCH_OBJECT_BYTES", 1500),
            contenders: var("BENCH_CONTENDERS")
                .filter(|list| !list.trim().is_empty())
                .map(|list| list.split(',').map(|c| c.trim().to_owned()).collect()),
            foreground_budgets: budgets
                .split(',')
                .map(str::trim)
                .filter(|b| !b.is_empty())
                .map(str::to_owned)
                .collect(),
            pace_variants: var("BENCH_PACE_VARIANTS")
                .unwrap_or_default()
                .split(';')
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|variant| match ProbeParams::parse(variant) {
                    Ok(_) => variant.to_owned(),
                    Err(error) => panic!("BENCH_PACE_VARIANTS: {variant}: {error}"),
                })
                .collect(),
            repeat: var("BENCH_REPEAT").map_or(1, |value| match value.parse::<usize>() {
                Ok(rounds) if rounds >= 1 => rounds,
                _ => panic!("BENCH_REPEAT={value}: a number of rounds, 1 or more"),
            }),
            before_binary: std::env::var_os("BENCH_BEFORE_BINARY").map(PathBuf::from),
            sweep: Sweep::parse(&var("BENCH_SWEEP").unwrap_or_default()),
            report: var("BENCH_REPORT")
                .map(PathBuf::from)
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/bench")),
            idle: Duration::from_secs(idle.unwrap_or(20)),
            apiserver_flags: var("BENCH_APISERVER_FLAGS")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
            trace_ms,
            foreground: var("BENCH_FOREGROUND").is_none_or(|value| value != "off"),
            pace: PaceTuning::parse(&var("BENCH_PACE").unwrap_or_default()),
        }
    }

    /// Whether `contender` runs: a row named `<contender> <setting>` runs with its contender.
    pub fn selected(&self, contender: &str) -> bool {
        let contender = contender.split(' ').next().unwrap_or(contender);
        match &self.contenders {
            Some(list) => list.iter().any(|c| c == contender),
            None => true,
        }
    }

    /// The arguments of a `kube-svm controller` the bench starts, its gentle pace steered by
    /// `budget` (`--foreground-budget`).
    pub fn controller_args(&self, budget: &str) -> Vec<String> {
        self.variant_args(budget, None)
    }

    /// [`Config::controller_args`], with the `--pace-params` of `variant` after `BENCH_PACE`'s
    /// (the later of two values of a name is the one taken).
    pub fn variant_args(&self, budget: &str, variant: Option<&str>) -> Vec<String> {
        let mut args = Vec::from(
            ["controller", "--leader-elect=false", "--crd-trigger=false"].map(String::from),
        );
        args.push(format!("--foreground-budget={budget}"));
        let params: Vec<&str> = self.pace.params.as_deref().into_iter().chain(variant).collect();
        if !params.is_empty() {
            args.push(format!("--pace-params={}", params.join(",")));
        }
        if let Some(writes) = self.pace.writes_in_flight {
            args.push(format!("--writes-in-flight={writes}"));
        }
        args
    }
}

/// Which settings the sweep of kube-svm's engine runs (`BENCH_SWEEP`).
#[derive(Clone, Debug, PartialEq)]
pub enum Sweep {
    /// `0`: none.
    Off,
    /// Unset or empty: every setting.
    All,
    /// `windows`: the fixed write windows at the fast pace.
    Windows,
    /// `bands`: the gentle latency bands.
    Bands,
    /// `rates`: the fixed rates.
    Rates,
    /// Any other text: every setting whose name holds it (`rate 80`, `in-tree`).
    Named(String),
}

impl Sweep {
    fn parse(text: &str) -> Sweep {
        match text {
            "0" => Sweep::Off,
            "" => Sweep::All,
            "windows" => Sweep::Windows,
            "bands" => Sweep::Bands,
            "rates" => Sweep::Rates,
            other => Sweep::Named(other.to_owned()),
        }
    }
}

/// The gentle pace's numbers that kube-svm takes as parameters (`BENCH_PACE`, `key=value` pairs
/// separated by commas: `BENCH_PACE=budget=2x,hold_ms=10000`). A key not given keeps kube-svm's
/// default, and so does every argument the bench passes. The names of kube-svm's
/// `--pace-params` (the steering law's numbers: `start_rate`, `cut`, `hold_ms`, ...) go to every
/// controller the bench starts, a `BENCH_BEFORE_BINARY` build's included, and to its own probe.
pub struct PaceTuning {
    /// `budget`: the `--foreground-budget` of the controllers that run at the defaults
    /// (every contender but `kube-svm-controller-probe`), and the budget of the probe the bench
    /// sends by itself. Default `2x`.
    pub budget: String,
    /// `writes_in_flight`: `--writes-in-flight` of every controller the bench starts, and the
    /// engine contender's most writes at once. Default kube-svm's (64).
    pub writes_in_flight: Option<usize>,
    /// `grow_below`, `shrink_above`, `ceiling_ms`, `max_spacing`: the gentle latency band of the
    /// engine contender (`kube-svm-engine`), which paces by its own write latency. The controller
    /// takes no flag for it. Default [`Band::GENTLE`] (1.5, 3, 100 ms, 2).
    pub band: Band,
    /// Any of kube-svm's `--pace-params` names: the steering law's numbers, passed on as given.
    pub params: Option<String>,
}

impl PaceTuning {
    /// The keys `BENCH_PACE` knows.
    const KEYS: &'static str = "budget, writes_in_flight, grow_below, shrink_above, ceiling_ms, max_spacing, and the names of kube-svm's --pace-params";

    fn parse(text: &str) -> PaceTuning {
        // The controller's default budget, named: the test support's controllers follow their own
        // latency unless told.
        let mut tuning = PaceTuning {
            budget: "2x".to_owned(),
            writes_in_flight: None,
            band: Band::GENTLE,
            params: None,
        };
        let mut params = Vec::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or_else(|| {
                panic!("BENCH_PACE: {pair:?} is not key=value (keys: {})", Self::KEYS)
            });
            let (key, value) = (key.trim(), value.trim());
            let number = || -> f64 {
                value.parse().unwrap_or_else(|_| panic!("BENCH_PACE: {key}={value}: a number"))
            };
            match key {
                "budget" => {
                    if let Err(error) = Budget::parse(value) {
                        panic!("BENCH_PACE: {error}");
                    }
                    tuning.budget = value.to_owned();
                }
                "writes_in_flight" => {
                    let writes = value.parse().unwrap_or_else(|_| {
                        panic!("BENCH_PACE: writes_in_flight={value}: a count")
                    });
                    tuning.writes_in_flight = Some(writes);
                }
                "grow_below" => tuning.band.grow_below = number(),
                "shrink_above" => tuning.band.shrink_above = number(),
                "ceiling_ms" => tuning.band.ceiling = Duration::from_secs_f64(number() / 1000.0),
                "max_spacing" => tuning.band.max_spacing = number(),
                _ => params.push(format!("{key}={value}")),
            }
        }
        if !params.is_empty() {
            let params = params.join(",");
            if let Err(error) = ProbeParams::parse(&params) {
                panic!("BENCH_PACE: {error} (keys: {})", Self::KEYS);
            }
            tuning.params = Some(params);
        }
        tuning
    }

    /// The steering law's numbers of the probe the bench sends by itself.
    pub fn probe_params(&self) -> ProbeParams {
        ProbeParams::parse(self.params.as_deref().unwrap_or_default()).expect("checked when read")
    }

    /// The budget of the probe the bench sends by itself.
    pub fn probe_budget(&self) -> Budget {
        Budget::parse(&self.budget).expect("checked when read")
    }
}
