//! Prometheus metrics. kube-storage-version-migrator's three series keep their names and label
//! formats so existing dashboards work; kube-svm's own live under `kube_svm_`. Labels are bounded:
//! resources, results, verbs and status code classes, never object names or error text.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

/// Every series kube-svm exports, in one registry that the admin server renders.
pub struct Metrics {
    registry: Registry,
    /// Upstream: objects migrated, by `resource` (`<group>/<version>, Resource=<plural>`).
    pub migrated_objects: IntCounterVec,
    /// Upstream (never set there): objects left to migrate, by `resource`.
    pub remaining_objects: IntGaugeVec,
    /// Upstream: migrations finished, by `resource` and `status` (Succeeded or Failed).
    pub migrations: IntCounterVec,
    /// `kube_svm_objects_total`: objects handled, by `resource` and [`results`] label.
    pub objects: IntCounterVec,
    /// `kube_svm_api_requests_total`: the engine's apiserver requests, by `verb` and `code` class.
    pub requests: IntCounterVec,
    /// `kube_svm_api_request_duration_seconds`: latency of the engine's requests, by `verb`.
    pub request_duration: HistogramVec,
    /// `kube_svm_api_throttled_requests_total`: requests answered 429, by `verb`.
    pub throttled: IntCounterVec,
    /// `kube_svm_migration_duration_seconds`: start to end of each migration, by `status`.
    pub migration_duration: HistogramVec,
    /// Decisions on CRDs' storedVersions after migrations, by result and reason.
    pub stored_versions: IntCounterVec,
    /// `kube_svm_migrations_running`: migrations this process runs now.
    pub migrations_running: IntGauge,
    /// `kube_svm_writes_in_flight`: object writes this process has sent and not yet had answered.
    pub writes_in_flight: IntGauge,
    /// `kube_svm_write_window`: object writes a running migration's window allows in flight, by
    /// resource and pace.
    pub write_window: IntGaugeVec,
    /// `kube_svm_write_window_held_back`: 1 while a running migration's window is held below its
    /// maximum, by resource and reason.
    pub write_window_held_back: IntGaugeVec,
    /// `kube_svm_leader`: 1 while this process leads (or election is off), 0 while it waits.
    pub leader: IntGauge,
    /// The latency of the gentle pace's probe.
    pub probe_latency: Histogram,
    /// Object writes per second the gentle pace allows.
    pub gentle_rate: Gauge,
    /// The latency the probe may reach before the gentle rate is cut.
    pub probe_budget: Gauge,
    /// Changes of the gentle rate, by `change`: `cut`, `undone` or `grew`.
    pub gentle_changes: IntCounterVec,
    /// 1 while no other client writes and the gentle writes go as the write window allows.
    pub gentle_alone: IntGauge,
    build_info: IntGaugeVec,
}

/// Result labels of `kube_svm_objects_total`.
pub mod results {
    /// The apiserver wrote the object back to etcd, re-encoded.
    pub const REWRITTEN: &str = "rewritten";
    /// Written back, re-encoded, with its `managedFields` entries of versions no longer served
    /// removed.
    pub const CLEANED: &str = "cleaned";
    /// The object was already stored in the current encoding, so the apiserver skipped the write.
    pub const ALREADY_CURRENT: &str = "already_current";
    /// Written by someone else (409) or deleted (404) since it was listed: nothing left to do.
    pub const SKIPPED: &str = "skipped";
    /// Could not be migrated after every attempt.
    pub const FAILED: &str = "failed";
}

impl Metrics {
    /// Every series, registered in a fresh registry beside the process collector, with
    /// `kube_svm_build_info` set to this build's version.
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let counter =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
                let metric = IntCounterVec::new(Opts::new(name, help), labels)?;
                registry.register(Box::new(metric.clone()))?;
                Ok(metric)
            };
        let metrics = Metrics {
            migrated_objects: counter(
                "storage_migrator_core_migrator_migrated_objects",
                "Objects migrated, by resource (kube-storage-version-migrator's series).",
                &["resource"],
            )?,
            remaining_objects: {
                let metric = IntGaugeVec::new(
                    Opts::new(
                        "storage_migrator_core_migrator_remaining_objects",
                        "Objects of a running migration not yet migrated, by resource, as the apiserver estimates them.",
                    ),
                    &["resource"],
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            migrations: counter(
                "storage_migrator_core_migrator_migrations",
                "Migrations finished, by resource and status (Succeeded or Failed).",
                &["resource", "status"],
            )?,
            objects: counter(
                "kube_svm_objects_total",
                "Objects handled by migrations, by resource and result (rewritten, cleaned, already_current, skipped, failed).",
                &["resource", "result"],
            )?,
            requests: counter(
                "kube_svm_api_requests_total",
                "Requests the migration engine sent to the apiserver, by verb and status code class.",
                &["verb", "code"],
            )?,
            request_duration: {
                let metric = HistogramVec::new(
                    HistogramOpts::new(
                        "kube_svm_api_request_duration_seconds",
                        "Latency of the migration engine's requests to the apiserver, by verb.",
                    ),
                    &["verb"],
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            throttled: counter(
                "kube_svm_api_throttled_requests_total",
                "Requests the apiserver throttled with 429 Too Many Requests, by verb.",
                &["verb"],
            )?,
            migration_duration: {
                let buckets = prometheus::exponential_buckets(1.0, 4.0, 8)?;
                let metric = HistogramVec::new(
                    HistogramOpts::new(
                        "kube_svm_migration_duration_seconds",
                        "Time from a migration's start to its end, by status.",
                    )
                    .buckets(buckets),
                    &["status"],
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            stored_versions: counter(
                "kube_svm_stored_versions_decisions_total",
                "Decisions on a CRD's storedVersions after a migration, by result (pruned or kept) and reason.",
                &["result", "reason"],
            )?,
            migrations_running: gauge(
                &registry,
                "kube_svm_migrations_running",
                "Migrations running in this process.",
            )?,
            writes_in_flight: gauge(
                &registry,
                "kube_svm_writes_in_flight",
                "Object writes in flight in this process.",
            )?,
            write_window: gauge_vec(
                &registry,
                "kube_svm_write_window",
                "Object writes a running migration may have in flight now, as its adaptive window allows, by resource and pace (gentle or fast); 0 once it ends.",
                &["resource", "pace"],
            )?,
            write_window_held_back: gauge_vec(
                &registry,
                "kube_svm_write_window_held_back",
                "1 while a running migration's write window is held below its maximum for the cluster's sake, by resource and reason (latency: the apiserver answers slower than the migration's pace allows; throttling: the apiserver answered 429).",
                &["resource", "reason"],
            )?,
            leader: gauge(
                &registry,
                "kube_svm_leader",
                "1 when this process leads (or leader election is off), 0 while it waits.",
            )?,
            probe_latency: {
                let buckets = prometheus::exponential_buckets(0.001, 2.0, 12)?;
                let metric = Histogram::with_opts(
                    HistogramOpts::new(
                        "kube_svm_probe_latency_seconds",
                        "Latency of the gentle pace's probe: a small read of kube-svm's own, sent as another client would while gentle migrations write.",
                    )
                    .buckets(buckets),
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            gentle_rate: float_gauge(
                &registry,
                "kube_svm_gentle_rate_objects_per_second",
                "Object writes per second the gentle pace allows now, shared by this process's gentle migrations.",
            )?,
            probe_budget: float_gauge(
                &registry,
                "kube_svm_probe_budget_seconds",
                "The latency the gentle pace's probe may reach (its p99) before the rate is cut; 0 until measured.",
            )?,
            gentle_changes: counter(
                "kube_svm_gentle_rate_changes_total",
                "Changes of the gentle rate, by change: cut (the probe passed its budget), undone (the probe was no faster after a cut: the latency was not kube-svm's) and grew.",
                &["change"],
            )?,
            gentle_alone: gauge(
                &registry,
                "kube_svm_gentle_alone",
                "1 while no other client writes (fewer than alone_below writes a second) and the gentle writes go as the write window allows, as the fast pace does; 0 while the probe's rate steers them.",
            )?,
            build_info: {
                let metric = IntGaugeVec::new(
                    Opts::new(
                        "kube_svm_build_info",
                        "Always 1; the version label says which kube-svm runs.",
                    ),
                    &["version"],
                )?;
                registry.register(Box::new(metric.clone()))?;
                metric
            },
            registry,
        };
        metrics.build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        // Every change of the gentle rate is a series from the start, at 0, for the dashboard.
        for change in ["cut", "undone", "grew"] {
            metrics.gentle_changes.with_label_values(&[change]);
        }
        metrics
            .registry
            .register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
        Ok(metrics)
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Name, type, labels and help of kube-svm's metrics (process metrics left out), as the
    /// README's table lists them.
    pub fn describe(&self) -> Vec<(String, String, Vec<String>, String)> {
        self.registry
            .gather()
            .iter()
            .filter(|family| !family.name().starts_with("process_"))
            .map(|family| {
                let labels = family
                    .get_metric()
                    .first()
                    .map(|m| m.get_label().iter().map(|l| l.name().to_owned()).collect())
                    .unwrap_or_default();
                let kind = format!("{:?}", family.get_field_type()).to_lowercase();
                (family.name().to_owned(), kind, labels, family.help().to_owned())
            })
            .collect()
    }
}

fn gauge(registry: &Registry, name: &str, help: &str) -> Result<IntGauge, prometheus::Error> {
    let metric = IntGauge::new(name, help)?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

fn float_gauge(registry: &Registry, name: &str, help: &str) -> Result<Gauge, prometheus::Error> {
    let metric = Gauge::new(name, help)?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

fn gauge_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, prometheus::Error> {
    let metric = IntGaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// The `resource` label, in kube-storage-version-migrator's format: `<group>/<version>, Resource=<plural>`.
pub fn resource_label(group: &str, version: &str, plural: &str) -> String {
    format!("{group}/{version}, Resource={plural}")
}

/// The `resource` label of a migration whose resource discovery never confirmed: what a user
/// typed must not become a label value, or labels would be unbounded.
pub const UNRESOLVED_RESOURCE: &str = "unresolved";

/// The `code` label: the status code class, or `none` when no response came.
pub fn code_class(code: Option<u16>) -> &'static str {
    CODE_CLASSES[code_class_index(code)]
}

/// Every value of the `code` label, in the order [`code_class_index`] numbers them.
pub const CODE_CLASSES: [&str; 5] = ["2xx", "3xx", "4xx", "5xx", "none"];

/// The position of `code`'s class in [`CODE_CLASSES`] (`none`: no response).
pub fn code_class_index(code: Option<u16>) -> usize {
    match code {
        Some(200..300) => 0,
        Some(300..400) => 1,
        Some(400..500) => 2,
        Some(500..600) => 3,
        _ => 4,
    }
}

/// The metrics table of `docs/metrics.md`, generated from the registry.
pub fn markdown_table(metrics: &Metrics) -> String {
    let mut out = String::from("| metric | type | labels | meaning |\n| --- | --- | --- | --- |\n");
    for (name, kind, labels, help) in metrics.describe() {
        let labels = if labels.is_empty() { "-".to_owned() } else { labels.join(", ") };
        out.push_str(&format!("| `{name}` | {kind} | {labels} | {help} |\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_docs_list_every_metric() {
        let metrics = Metrics::new().unwrap();
        // Families without samples are not gathered: touch each labelled one.
        touch(&metrics);
        let table = markdown_table(&metrics);
        let page = include_str!("../../docs/metrics.md");
        assert!(
            page.contains(&table),
            "docs/metrics.md's metrics table is out of date; it should read:\n{table}"
        );
    }

    #[test]
    fn upstream_series_keep_their_names_and_label_format() {
        let metrics = Metrics::new().unwrap();
        touch(&metrics);
        let text = metrics.render().unwrap();
        for line in [
            "storage_migrator_core_migrator_migrated_objects{resource=\"example.com/v1, Resource=widgets\"} 0",
            "storage_migrator_core_migrator_remaining_objects{resource=\"example.com/v1, Resource=widgets\"} 0",
            "storage_migrator_core_migrator_migrations{resource=\"example.com/v1, Resource=widgets\",status=\"Succeeded\"} 0",
            "kube_svm_build_info{version=\"",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn code_classes_are_bounded() {
        assert_eq!(code_class(Some(201)), "2xx");
        assert_eq!(code_class(Some(429)), "4xx");
        assert_eq!(code_class(Some(503)), "5xx");
        assert_eq!(code_class(None), "none");
    }

    fn touch(metrics: &Metrics) {
        let resource = "example.com/v1, Resource=widgets";
        metrics.migrated_objects.with_label_values(&[resource]);
        metrics.remaining_objects.with_label_values(&[resource]);
        metrics.migrations.with_label_values(&[resource, "Succeeded"]);
        metrics.objects.with_label_values(&[resource, results::REWRITTEN]);
        metrics.requests.with_label_values(&["patch", "2xx"]);
        metrics.request_duration.with_label_values(&["patch"]);
        metrics.throttled.with_label_values(&["patch"]);
        metrics.migration_duration.with_label_values(&["Succeeded"]);
        metrics.stored_versions.with_label_values(&["pruned", "Pruned"]);
        metrics.write_window.with_label_values(&[resource, "gentle"]);
        metrics.write_window_held_back.with_label_values(&[resource, "latency"]);
    }
}
