//! `kube-svm status`: migrations and their progress as a table (or JSON), once or following
//! them; kube-svm's `migration.k8s.io` migrations and, where the cluster serves it, the in-tree
//! migrator's `storagemigration.k8s.io` ones.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::core::DynamicObject;
use kube::{Api, Client};
use serde::Serialize;

use super::figures;
use super::fleet::{Answers, FleetArgs};
use super::kube::KubeArgs;
use super::table::{self, Output};
use crate::api::Pace;
use crate::api::{GroupResource, Phase, StorageVersionMigration};
use crate::apiserver::in_tree;
use crate::engine::Restraint;

/// The shortest `--interval`, in seconds: each table lists every migration, so more often would
/// mostly load the apiserver.
const MIN_INTERVAL: f64 = 0.5;

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub kube: KubeArgs,

    /// Several clusters at once.
    #[command(flatten)]
    pub fleet: FleetArgs,

    /// Keep printing the table, every --interval seconds, until interrupted.
    #[arg(short, long)]
    pub watch: bool,

    /// Seconds between two tables with --watch.
    #[arg(long, default_value_t = 2.0, value_parser = super::values::seconds(MIN_INTERVAL))]
    pub interval: f64,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Who runs a migration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum Migrator {
    /// kube-svm (`migration.k8s.io`).
    #[default]
    #[serde(rename = "kube-svm")]
    KubeSvm,
    /// The in-tree migrator of kube-controller-manager (`storagemigration.k8s.io`).
    #[serde(rename = "in-tree")]
    InTree,
}

impl Migrator {
    /// As the table and messages name it: `kube-svm`, `in-tree`.
    pub fn name(self) -> &'static str {
        match self {
            Migrator::KubeSvm => "kube-svm",
            Migrator::InTree => "in-tree",
        }
    }
}

/// One migration as `status` shows it; with `-o json`, a contract scripts can rely on.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub name: String,
    /// `kube-svm` or `in-tree`.
    pub migrator: Migrator,
    /// `resource.group`.
    pub resource: String,
    /// `New`, `Running`, `Succeeded` or `Failed`.
    pub phase: Phase,
    /// Percent of the objects handled, when the total is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress_percent: Option<u8>,
    pub processed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    pub failed: u64,
    /// Objects per second since the migration started (until it ended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objects_per_second: Option<f64>,
    /// Seconds left at that rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<u64>,
    /// `gentle` or `fast`, once kube-svm has recorded it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pace: Option<Pace>,
    /// Writes a running migration may have in flight at once, at its last checkpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
    /// Why a running migration holds its window below its maximum for the cluster's sake:
    /// `latency` or `throttling`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holding_back: Option<Restraint>,
    /// What a running gentle migration steers by: its probe's p99 against the budget, and the
    /// rate of writes allowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub foreground: Option<String>,
    pub age_seconds: u64,
}

/// Prints the status once, or until interrupted with --watch. With several clusters, exits 1
/// when one of them did not answer (the last time).
pub async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let StatusArgs { kube, fleet, watch, interval, output } = args;
    let fleet = fleet.fleet(&kube)?;
    let client = match fleet {
        Some(_) => None,
        None => Some(Client::try_from(kube.config().await?)?),
    };
    loop {
        let (text, code) = match (&client, &fleet) {
            (Some(client), _) => (output.format(&gather(client).await?, render)?, 0),
            (None, Some(fleet)) => {
                let answers = fleet.ask(|client| async move { gather(&client).await }).await;
                (output.format(&answers, render_fleet)?, answers.exit_code(|_| 0))
            }
            (None, None) => anyhow::bail!("no cluster to ask"),
        };
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(text.as_bytes()).context("failed to write the status")?;
        if !watch {
            return Ok(ExitCode::from(code));
        }
        stdout.write_all(b"\n").context("failed to write the status")?;
        drop(stdout);
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::from(code)),
            () = tokio::time::sleep(super::engine::seconds(interval)) => {}
        }
    }
}

/// Every migration, kube-svm's and the in-tree migrator's, of the APIs the cluster serves.
pub(super) async fn gather(client: &Client) -> anyhow::Result<Vec<Row>> {
    let now = Timestamp::now();
    let mut rows = Vec::new();
    match Api::<StorageVersionMigration>::all(client.clone()).list(&ListParams::default()).await {
        Ok(list) => rows.extend(list.items.iter().map(|m| row(m, now))),
        // kube-svm's CRDs are not installed (`kube-svm migrate` runs without them).
        Err(error) if crate::apiserver::answers::is_not_found(&error) => {}
        Err(error) => {
            return Err(error).context("failed to list migration.k8s.io StorageVersionMigrations");
        }
    }
    let in_tree =
        in_tree::list(client).await.context("failed to list storagemigration.k8s.io migrations")?;
    rows.extend(in_tree.iter().map(|m| in_tree_row(m, now)));
    Ok(rows)
}

/// A kube-svm migration at `now`.
pub fn row(migration: &StorageVersionMigration, now: Timestamp) -> Row {
    let status = migration.status.clone().unwrap_or_default();
    let progress = status.progress.clone().unwrap_or_default();
    let phase = Phase::of(migration);
    let started = status.start_time.as_ref().map(|t| t.0);
    let until = match phase.is_terminal() {
        true => status.completion_time.as_ref().map_or(now, |t| t.0),
        false => now,
    };
    let elapsed = started.map(|s| until.duration_since(s).unsigned_abs()).unwrap_or_default();
    let rate = figures::rate(progress.processed, elapsed);
    let remaining = match phase {
        Phase::Succeeded => Some(0),
        _ => progress.remaining,
    };
    let total = remaining.map(|r| r + progress.processed).filter(|t| *t > 0);
    let progress_percent = match (phase, total) {
        (Phase::Succeeded, _) => Some(100),
        (_, Some(total)) => Some(u8::try_from(progress.processed * 100 / total).unwrap_or(100)),
        (_, None) => None,
    };
    let eta_seconds = match (phase, remaining) {
        (Phase::Running, Some(remaining)) => figures::eta(remaining, rate).map(|e| e.as_secs()),
        _ => None,
    };
    // The window describes a run in progress only.
    let running = phase == Phase::Running;
    let window = progress.window.filter(|_| running).map(u64::from);
    let holding_back = progress.holding_back.as_deref().and_then(Restraint::parse);
    Row {
        name: migration.metadata.name.clone().unwrap_or_default(),
        migrator: Migrator::KubeSvm,
        resource: GroupResource::name_of(
            &migration.spec.resource.group,
            &migration.spec.resource.resource,
        ),
        phase,
        progress_percent,
        processed: progress.processed,
        remaining,
        failed: progress.failed,
        objects_per_second: rate.map(|r| (r * 10.0).round() / 10.0),
        eta_seconds,
        pace: progress.pace.as_deref().and_then(Pace::parse),
        window,
        holding_back: holding_back.filter(|_| window.is_some()),
        foreground: progress.foreground.clone().filter(|_| running),
        age_seconds: age(migration.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
    }
}

/// An in-tree migration: it reports no counts, only its conditions.
fn in_tree_row(migration: &DynamicObject, now: Timestamp) -> Row {
    let phase = in_tree::phase(migration);
    Row {
        name: migration.metadata.name.clone().unwrap_or_default(),
        migrator: Migrator::InTree,
        resource: in_tree::resource(migration).name(),
        phase,
        progress_percent: (phase == Phase::Succeeded).then_some(100),
        processed: 0,
        remaining: None,
        failed: 0,
        objects_per_second: None,
        eta_seconds: None,
        pace: None,
        window: None,
        holding_back: None,
        foreground: None,
        age_seconds: age(migration.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
    }
}

fn age(created: Option<Timestamp>, now: Timestamp) -> u64 {
    created.map_or(0, |c| now.duration_since(c).as_secs().max(0).unsigned_abs())
}

/// `seconds` as [`figures::clock`] writes durations.
fn duration(seconds: u64) -> String {
    figures::clock(std::time::Duration::from_secs(seconds))
}

/// One row per cluster: its migrations by phase, and the running and failed ones by name.
fn render_fleet(answers: &Answers<Vec<Row>>) -> String {
    answers.render(
        ["MIGRATIONS", "RUNNING", "SUCCEEDED", "FAILED", "DETAIL"],
        |rows| {
            let count = |phase| rows.iter().filter(|r| r.phase == phase).count().to_string();
            let mut detail = Vec::new();
            for row in rows {
                match (row.phase, row.progress_percent) {
                    (Phase::Running, Some(percent)) => {
                        detail.push(format!("{} running {percent}%", row.name))
                    }
                    (Phase::Running, None) => detail.push(format!("{} running", row.name)),
                    (Phase::Failed, _) => detail.push(format!("{} failed", row.name)),
                    _ => {}
                }
            }
            [
                rows.len().to_string(),
                count(Phase::Running),
                count(Phase::Succeeded),
                count(Phase::Failed),
                if detail.is_empty() { "-".into() } else { detail.join(", ") },
            ]
        },
        &[0, 1, 2, 3],
    )
}

fn render(rows: &Vec<Row>) -> String {
    if rows.is_empty() {
        return "No migrations.\n".into();
    }
    let mut table = vec![
        [
            "NAME",
            "MIGRATOR",
            "RESOURCE",
            "PHASE",
            "PROGRESS",
            "OBJECTS/S",
            "ETA",
            "PACE",
            "WINDOW",
            "FAILED",
            "AGE",
        ]
        .map(str::to_owned),
    ];
    let or_dash = |value: Option<String>| value.unwrap_or_else(|| "-".into());
    for row in rows {
        let in_tree = row.migrator == Migrator::InTree;
        table.push([
            row.name.clone(),
            row.migrator.name().to_owned(),
            row.resource.clone(),
            row.phase.to_string(),
            or_dash(row.progress_percent.map(|p| format!("{p}%"))),
            or_dash(row.objects_per_second.map(|r| format!("{r:.1}"))),
            or_dash(row.eta_seconds.map(duration)),
            or_dash(row.pace.map(|p| p.name().to_owned())),
            or_dash(row.window.map(|w| figures::window(w, row.holding_back))),
            if in_tree { "-".into() } else { row.failed.to_string() },
            duration(row.age_seconds),
        ]);
    }
    let mut out = table::render(&table, &[4, 5, 9]);
    for row in rows {
        if let Some(foreground) = &row.foreground {
            out.push_str(&format!("{}: {foreground}\n", row.name));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn migration(phase: &str, processed: u64, remaining: Option<u64>) -> StorageVersionMigration {
        let mut migration: StorageVersionMigration = serde_json::from_value(serde_json::json!({
            "apiVersion": "migration.k8s.io/v1alpha1",
            "kind": "StorageVersionMigration",
            "metadata": { "name": "m", "creationTimestamp": "2026-01-01T00:00:00Z" },
            "spec": { "resource": { "group": "example.com", "version": "v2", "resource": "widgets" } },
            "status": {
                "conditions": [{ "type": phase, "status": "True" }],
                "progress": { "processed": processed, "failed": 1 },
                "startTime": "2026-01-01T00:00:00Z",
                "completionTime": "2026-01-01T00:01:40Z",
            },
        }))
        .unwrap();
        if let Some(status) = migration.status.as_mut() {
            status.progress.as_mut().unwrap().remaining = remaining;
        }
        migration
    }

    fn at(seconds: i64) -> Timestamp {
        let start: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        start + k8s_openapi::jiff::SignedDuration::from_secs(seconds)
    }

    #[test]
    fn a_running_migration_shows_rate_progress_and_eta() {
        let row = row(&migration("Running", 500, Some(1500)), at(50));
        assert_eq!(row.resource, "widgets.example.com");
        assert_eq!(
            (row.progress_percent, row.objects_per_second, row.eta_seconds),
            (Some(25), Some(10.0), Some(150))
        );
        assert_eq!((row.failed, row.age_seconds), (1, 50));
    }

    #[test]
    fn a_finished_migration_keeps_its_rate_and_has_no_eta() {
        let row = row(&migration("Succeeded", 1000, None), at(500));
        assert_eq!(
            (row.phase, row.progress_percent, row.remaining),
            (Phase::Succeeded, Some(100), Some(0))
        );
        assert_eq!((row.objects_per_second, row.eta_seconds), (Some(10.0), None));
    }

    #[test]
    fn unknown_totals_show_no_percentage() {
        let row = row(&migration("Running", 10, None), at(5));
        assert_eq!((row.progress_percent, row.eta_seconds), (None, None));
    }

    /// `migration(phase, ..)` at the gentle pace, its window of 6 held back by latency.
    fn held_back(phase: &str) -> StorageVersionMigration {
        let mut migration = migration(phase, 500, Some(1500));
        if let Some(progress) = migration.status.as_mut().and_then(|s| s.progress.as_mut()) {
            progress.pace = Some("gentle".into());
            progress.window = Some(6);
            progress.holding_back = Some("latency".into());
        }
        migration
    }

    #[test]
    fn a_running_migration_says_when_it_holds_back_and_an_ended_one_only_its_pace() {
        let running = row(&held_back("Running"), at(50));
        assert_eq!(
            (running.pace, running.window, running.holding_back),
            (Some(Pace::Gentle), Some(6), Some(Restraint::Latency))
        );
        let table = render(&vec![running]);
        let cells: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(cells[7..10], ["gentle", "6", "(latency)"], "{table}");
        let ended = row(&held_back("Succeeded"), at(500));
        assert_eq!(
            (ended.pace, ended.window, ended.holding_back),
            (Some(Pace::Gentle), None, None)
        );
    }

    #[test]
    fn a_cluster_row_counts_migrations_by_phase_and_names_the_running_and_failed() {
        use crate::cli::fleet::{Cluster, State};
        let rows = vec![
            row(&held_back("Running"), at(50)),
            row(&migration("Succeeded", 1000, None), at(500)),
            Row { name: "broken".into(), ..row(&migration("Failed", 10, None), at(5)) },
        ];
        let answers = Answers {
            clusters: vec![Cluster {
                context: "east".into(),
                state: State::Answered,
                reachable: true,
                installed: Some(true),
                error: None,
                answer: Some(rows),
            }],
        };
        let table = render_fleet(&answers);
        let cells: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            cells,
            ["east", "installed", "3", "1", "1", "1", "m", "running", "25%,", "broken", "failed"],
            "{table}"
        );
    }

    #[test]
    fn the_json_is_a_contract_of_names_not_debug_output() {
        let row = row(&held_back("Running"), at(50));
        let json = serde_json::to_value(&row).expect("serializes");
        assert_eq!(json["phase"], "Running");
        assert_eq!(json["migrator"], "kube-svm");
        assert_eq!(
            (&json["pace"], &json["window"], &json["holdingBack"]),
            (&serde_json::json!("gentle"), &serde_json::json!(6), &serde_json::json!("latency"))
        );
        assert_eq!(serde_json::to_value(Migrator::InTree).expect("serializes"), "in-tree");
    }
}
