//! The sweep: kube-svm's engine at fixed write windows, at gentle latency bands and at fixed
//! rates, each after its own storage switch, with kube-svm's probe sent alongside: the curve of
//! objects/s against the foreground's p99 (`docs/bench.png`), which any pace's point can be read
//! against.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube_svm::api::{GroupVersionResource, Pace};
use kube_svm::engine::{Band, Engine, RateLimiter, Resource, Settings};
use prometheus::core::Collector as _;

use crate::bench::Bench;
use crate::config::Sweep;
use crate::contenders::{SETTLE, run_engine_for};
use crate::foreground::Latencies;
use crate::probe::Probe;
use crate::support::fixtures::WidgetCrd;

/// The fixed rates of the sweep, objects per second: the curve of the foreground's p99 against
/// the rate alone, which any pace's point can be read against.
const SWEEP_RATES: [f64; 7] = [10.0, 20.0, 40.0, 80.0, 160.0, 240.0, 320.0];

/// The in-tree migrator's objects/s times this is one more fixed rate: what its foreground costs
/// says whether any pace can move that much at the in-tree migrator's harm.
const IN_TREE_TIMES: f64 = 1.2;

/// How long each fixed rate runs: a minute and a half, enough for 1,800 foreground requests.
const RATE_STEP: Duration = Duration::from_secs(90);

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

/// One point of the sweep's curve.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Point {
    pub setting: String,
    pace: &'static str,
    writes_in_flight: usize,
    grow_below: Option<f64>,
    shrink_above: Option<f64>,
    max_spacing: Option<f64>,
    /// The client-side limit, requests per second, at a fixed rate's point.
    qps: Option<f64>,
    pub objects_per_second: f64,
    pub mean_write_ms: f64,
    /// The window's mean size over the run, sampled every 100 ms.
    pub mean_window: f64,
    /// Writes in flight on average (Little's law: the writes' summed latency over the run's
    /// duration); below 1 when writes are spaced.
    pub mean_in_flight: f64,
    pub foreground: Option<Latencies>,
    /// What kube-svm's probe, sent alongside ([`Probe`]), read: its p99 over the last minute.
    /// (Its quiet windows hold no write of the sweep's engine: it has no baseline here.)
    probe_p99_ms: Option<f64>,
}

/// The settings `sweep` runs: fixed windows at the fast pace, where the window grows to its
/// maximum; gentle bands of several widths and spacings with the maximum of 64; and fixed rates
/// ([`SWEEP_RATES`], each for [`RATE_STEP`] at most) at the fast pace held to the rate by the
/// client-side limit alone, and, where the in-tree migrator ran, at [`IN_TREE_TIMES`] its
/// objects/s (`in_tree`).
fn settings(sweep: &Sweep, in_tree: Option<f64>) -> Vec<Setting> {
    let mut settings = Vec::new();
    let (windows, bands, rates) = match sweep {
        Sweep::Off => return settings,
        Sweep::All | Sweep::Named(_) => (true, true, true),
        Sweep::Windows => (true, false, false),
        Sweep::Bands => (false, true, false),
        Sweep::Rates => (false, false, true),
    };
    if windows {
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
    if bands {
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
    if rates {
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
    // Any other text than a group's name filters every setting by name.
    if let Sweep::Named(text) = sweep {
        settings.retain(|setting| setting.name.contains(text.as_str()));
    }
    settings
}

/// Runs the settings `BENCH_SWEEP` selects, each after a storage switch and its settle; the
/// points of the curve.
pub async fn run(bench: &mut Bench) -> Vec<Point> {
    let mut sweep = Vec::new();
    let in_tree = bench.rows.iter().find(|r| r.contender == "in-tree" && r.objects > 0);
    for setting in settings(&bench.config.sweep, in_tree.map(|row| row.objects_per_second)) {
        sweep.push(point(bench, setting).await);
    }
    sweep
}

/// Runs kube-svm's engine at `setting`, as the chart's ServiceAccount, and measures it.
async fn point(bench: &mut Bench, setting: Setting) -> Point {
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
        let (metrics, sum, samples) = (metrics.clone(), window_sum.clone(), window_samples.clone());
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
    let probe = Probe::start(
        &bench.account,
        bench.config.pace.probe_budget(),
        bench.config.pace.probe_params(),
    );
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
        millis(probed.probe).map(|p| format!("{p:.1} ms")).unwrap_or_default()
    );
    let gentle = setting.pace == Pace::Gentle;
    Point {
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
        probe_p99_ms: millis(probed.probe),
    }
}
