//! The report: a row per contender or phase and a point per setting of the sweep, as a table
//! (`<stem>.md`, printed too) and as numbers (`<stem>.json`, which `hack/plot.py` draws). The
//! stem is `docs/bench` unless `BENCH_REPORT` says otherwise.

use std::fmt::Write as _;

use serde_json::json;

use crate::bench::{Bench, Row};
use crate::config::NAMESPACES;
use crate::sweep::Point;

/// Writes the report's table and numbers where the config says (`docs/bench.md` and
/// `docs/bench.json` by default).
pub fn write(bench: &Bench, sweep: &[Point]) {
    let bytes = bench.config.object_bytes;
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
        bench.config.objects
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
    if bench.config.repeat > 1 {
        table.push_str(&rounds(&bench.rows));
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
    let stem = &bench.config.report;
    if let Some(dir) = stem.parent() {
        std::fs::create_dir_all(dir).expect("the report's directory is created");
    }
    std::fs::write(stem.with_extension("md"), &table).expect("the table is written");
    let json = json!({ "objects": bench.config.objects, "bytes": bytes, "limit": limit, "rows": bench.rows, "sweep": sweep });
    std::fs::write(
        stem.with_extension("json"),
        serde_json::to_string_pretty(&json).expect("serializes"),
    )
    .expect("the numbers are written");
}

/// The contenders measured in rounds (`BENCH_REPEAT`, rows named `<contender> #<round>`): the
/// median of each one's objects/s and foreground p99 over its rounds, and every round's figures.
fn rounds(rows: &[Row]) -> String {
    let mut contenders: Vec<(&str, Vec<&Row>)> = Vec::new();
    for row in rows {
        let Some((contender, _)) = row.contender.rsplit_once(" #") else { continue };
        match contenders.iter_mut().find(|(name, _)| *name == contender) {
            Some((_, rounds)) => rounds.push(row),
            None => contenders.push((contender, vec![row])),
        }
    }
    let mut table = String::from(
        "\nEach contender over its rounds: the median, then each round in the order run.\n\n| contender | rounds | objects/s, median | foreground p99 (ms), median | objects/s | foreground p99 (ms) |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for (contender, rounds) in contenders {
        let rates: Vec<f64> = rounds.iter().map(|r| r.objects_per_second).collect();
        let p99s: Vec<f64> =
            rounds.iter().filter_map(|r| r.foreground.as_ref()).map(|f| f.p99_ms).collect();
        let list = |values: &[f64]| {
            values.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(", ")
        };
        let median =
            |values: &[f64]| median(values).map_or_else(|| "-".to_owned(), |m| format!("{m:.1}"));
        let _ = writeln!(
            table,
            "| {contender} | {} | {} | {} | {} | {} |",
            rounds.len(),
            median(&rates),
            median(&p99s),
            list(&rates),
            list(&p99s),
        );
    }
    table
}

/// The middle value (the mean of the two middle ones of an even count); `None` of none.
fn median(values: &[f64]) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[middle]),
        _ => Some((sorted[middle - 1] + sorted[middle]) / 2.0),
    }
}
