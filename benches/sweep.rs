//! `make bench` (the sweep): a whole cluster swept after an install or an upgrade, on one local
//! control plane, in one run. `BENCH_SWEEP_CRDS` CRDs (default 200) of `BENCH_SWEEP_OBJECTS`
//! objects each (default 20) beside the built-in resources; before each contender every CRD's
//! storage version moves one version further (v1 -> v2 -> v3 -> v1), as after an upgrade:
//!
//! - the limit: a bare client rewriting every object of every CRD with the minimal conditional
//!   patch, 16 in flight, plus one settle period (what any proof of the encoding costs);
//! - `kube-svm controller` at its defaults, with the CRD trigger alone (every CRD pruned is the
//!   end), then with both triggers, as after an install: no
//!   StorageState and no migration yet. Timed from its start to every StorageState converged
//!   and every CRD's `storedVersions` pruned, then etcd is read to prove every object moved.
//!   Each time a CRD's StorageState is first seen converged at a hash, etcd is read too: it must
//!   hold every object of that CRD in that hash's version.
//!   One more CRD is switched in the middle of the sweep (once the first StorageState
//!   converged): the time from its switch to its prune;
//! - the same with `BENCH_SWEEP_BASELINE`, another kube-svm binary (an older build), if given.
//!
//! `BENCH_SWEEP_APISERVERS=3` runs it on three apiservers behind a round-robin balancer, as the HA
//! tests do; `BENCH_SWEEP_LOGS=DIR` keeps each contender's log in `DIR`. The table goes to
//! `docs/bench-sweep.md` (`BENCH_REPORT=/tmp/x` writes `/tmp/x.md` instead).

// The integration tests' harness; the bench needs only part of it.
#[allow(dead_code, unused_imports)]
#[path = "../tests/cluster/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use kube_svm::api::{StorageState, StorageVersionMigration};
use kube_svm::rules::storage_hash::storage_version_hash;
use serde_json::json;

use support::fixtures::{WidgetCrd, install_kube_svm_crds};
use support::invariant::Census;
use support::{ControlPlane, Etcd};

/// kube-svm's default `--storage-version-settle`, in seconds: the least any proof of the
/// encoding takes, so the limit is quoted with it.
const SETTLE: Duration = Duration::from_secs(10);

/// Longest a contender may take before the bench gives up on it.
const GIVE_UP: Duration = Duration::from_secs(3600);

/// CRDs created (and seeded) at once while setting up.
const SETUP_CONCURRENCY: usize = 8;

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The version after `version` in the cycle v1 -> v2 -> v3 -> v1.
fn next(version: &str) -> &'static str {
    match version {
        "v1" => "v2",
        "v2" => "v3",
        _ => "v1",
    }
}

/// One row of the table.
struct Row {
    contender: String,
    seconds: f64,
    note: String,
}

#[tokio::main]
async fn main() {
    let crds = env_number("BENCH_SWEEP_CRDS", 200);
    let objects = env_number("BENCH_SWEEP_OBJECTS", 20);
    let apiservers = env_number("BENCH_SWEEP_APISERVERS", 1);
    let control_plane = match apiservers {
        1 => ControlPlane::start(&[]).await,
        n => {
            let topology =
                support::Topology { apiservers: vec![Vec::new(); n], common: Vec::new() };
            ControlPlane::start_ha(&topology).await
        }
    };
    let control_plane = control_plane.expect("a control plane starts");
    let client = control_plane.client().await;
    let etcd = control_plane.etcd();
    install_kube_svm_crds(&client).await;

    let setup = Instant::now();
    let config = control_plane.config().await;
    let widgets: Vec<WidgetCrd> = futures::stream::iter(0..=crds)
        .map(|i| {
            let (client, config) = (client.clone(), config.clone());
            async move {
                let widgets = WidgetCrd::new(&format!("sweep{i}"), false);
                widgets.create(&client, "v1").await;
                served_everywhere(&config, &widgets, apiservers).await;
                widgets.seed(&client, "v1", &[None], objects).await;
                widgets
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect()
        .await;
    // The last one is switched in the middle of each sweep, the others before it.
    let (late, swept) = widgets.split_last().expect("at least one CRD");
    eprintln!(
        "sweep: {} CRDs of {objects} objects set up in {:.0?}",
        widgets.len(),
        setup.elapsed()
    );

    let mut rows = Vec::new();
    let mut version = "v1";

    version = next(version);
    switch_all(&client, swept, version).await;
    switch_all(&client, std::slice::from_ref(late), version).await;
    let seconds = bare_client(&client, &widgets, version).await + SETTLE.as_secs_f64();
    prove(&etcd, &widgets, version, objects).await;
    eprintln!("sweep: the limit: {seconds:.1} s");
    rows.push(Row {
        contender: "limit: a bare client, 16 in flight, + one settle".into(),
        seconds,
        note: format!("{} objects rewritten, plus {} s", widgets.len() * objects, SETTLE.as_secs()),
    });
    prune_all(&client, &widgets, version).await;

    let mut contenders = vec![
        ("kube-svm controller, CRD trigger alone".to_owned(), binary(), false),
        ("kube-svm controller, both triggers".to_owned(), binary(), true),
    ];
    if let Some(baseline) = std::env::var_os("BENCH_SWEEP_BASELINE") {
        let name = "kube-svm baseline build, both triggers".to_owned();
        contenders.push((name, PathBuf::from(baseline), true));
    }
    for (name, binary, discovery) in contenders {
        forget_everything(&client).await;
        version = next(version);
        switch_all(&client, swept, version).await;
        let run =
            sweep(&control_plane, &client, &etcd, &binary, discovery, swept, late, version).await;
        prove(&etcd, &widgets, version, objects).await;
        eprintln!(
            "sweep: {name}: {:.1} s, the CRDs switched before it pruned after {:.1} s, the late CRD pruned {:.1} s after its switch",
            run.seconds, run.crds_pruned, run.late_pruned
        );
        rows.push(Row {
            contender: name.clone(),
            seconds: run.seconds,
            note: format!(
                "{} StorageStates converged; the {} CRDs switched before the start pruned after {:.1} s; the CRD switched mid-sweep pruned {:.1} s after its switch",
                run.converged,
                swept.len(),
                run.crds_pruned,
                run.late_pruned
            ),
        });
    }
    write_report(&rows, widgets.len(), objects, apiservers);
}

/// Waits until the widgets of `widgets` can be listed through as many new connections in a row
/// as make it near certain that each of `apiservers` behind the balancer was asked: a CRD just
/// created is served by one apiserver before the others.
async fn served_everywhere(config: &kube::Config, widgets: &WidgetCrd, apiservers: usize) {
    let needed = 4 * apiservers;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut in_a_row = 0;
    while in_a_row < needed {
        let client = Client::try_from(config.clone()).expect("a client");
        let listed = widgets.api(&client, "v1", None).list(&ListParams::default().limit(1)).await;
        in_a_row = if listed.is_ok() { in_a_row + 1 } else { 0 };
        assert!(Instant::now() < deadline, "the widgets were never served everywhere");
        if listed.is_err() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The kube-svm binary Cargo built.
fn binary() -> PathBuf {
    std::env::var_os("KUBE_SVM_BINARY")
        .map(PathBuf::from)
        .or(option_env!("CARGO_BIN_EXE_kube-svm").map(PathBuf::from))
        .expect("the kube-svm binary")
}

/// Switches every CRD's storage version to `version`.
async fn switch_all(client: &Client, widgets: &[WidgetCrd], version: &str) {
    futures::stream::iter(widgets)
        .map(|w| w.set_storage_version(client, version))
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
}

/// Sets every CRD's `storedVersions` to `[version]` (the objects proved moved), as a migrator
/// would have: the next contender starts from the same state.
async fn prune_all(client: &Client, widgets: &[WidgetCrd], version: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for w in widgets {
        let patch = json!({ "status": { "storedVersions": [version] } });
        crds.patch_status(&w.name(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("storedVersions set");
    }
}

/// Deletes every StorageState and migration: the cluster as kube-svm finds it when installed.
async fn forget_everything(client: &Client) {
    let states: Api<StorageState> = Api::all(client.clone());
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    let all = ListParams::default();
    let _ = states.delete_collection(&DeleteParams::default(), &all).await;
    let _ = migrations.delete_collection(&DeleteParams::default(), &all).await;
}

/// Seconds a bare client takes to rewrite every object of `widgets` through `version`.
async fn bare_client(client: &Client, widgets: &[WidgetCrd], version: &str) -> f64 {
    let started = Instant::now();
    let writes = widgets.iter().map(|w| {
        let gvk = GroupVersionKind::gvk(&w.group, version, WidgetCrd::KIND);
        let api: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &ApiResource::from_gvk_with_plural(&gvk, WidgetCrd::PLURAL),
        );
        (api, w.api_version(version))
    });
    let objects = futures::stream::iter(writes)
        .then(|(api, api_version)| async move {
            let list = api.list_metadata(&ListParams::default()).await.expect("listed");
            list.items
                .into_iter()
                .map(move |o| (api.clone(), api_version.clone(), o))
                .collect::<Vec<_>>()
        })
        .flat_map(futures::stream::iter);
    objects
        .map(|(api, api_version, object)| async move {
            let name = object.metadata.name.unwrap_or_default();
            let patch = json!({
                "apiVersion": api_version, "kind": WidgetCrd::KIND,
                "metadata": { "name": name, "resourceVersion": object.metadata.resource_version },
            });
            let _ = api.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    started.elapsed().as_secs_f64()
}

/// What one sweep took.
struct Run {
    /// From the controller's start to every StorageState converged and every CRD pruned.
    seconds: f64,
    /// From the controller's start to every CRD switched before it pruned.
    crds_pruned: f64,
    /// From the late CRD's switch to its prune.
    late_pruned: f64,
    /// StorageStates converged at the end.
    converged: usize,
}

/// Runs `kube-svm controller` (`binary`) with both triggers from a cluster with no StorageState
/// until every StorageState converged and every CRD in `swept` and `late` is pruned to
/// `[version]`; `late` is switched once the first StorageState converged. Whenever a CRD's
/// StorageState is seen converged, etcd must hold every one of its objects in the version of
/// that hash.
#[allow(clippy::too_many_arguments)]
async fn sweep(
    control_plane: &ControlPlane,
    client: &Client,
    etcd: &Etcd,
    binary: &Path,
    discovery: bool,
    swept: &[WidgetCrd],
    late: &WidgetCrd,
    version: &str,
) -> Run {
    // Without the discovery trigger no StorageState is kept: the CRDs' prune is the end.
    let expected = match discovery {
        true => migratable_resources(client).await,
        false => 0,
    };
    let started = Instant::now();
    let mut controller = Controller::start(control_plane, binary, discovery).await;
    let mut late_switched: Option<Instant> = None;
    let mut late_pruned: Option<f64> = None;
    let mut crds_pruned: Option<f64> = None;
    let mut proved = BTreeSet::new();
    loop {
        assert!(started.elapsed() < GIVE_UP, "the sweep did not end within {GIVE_UP:?}");
        let (states, total) = storage_states(client).await;
        let converged = states.len();
        for widgets in swept.iter().chain([late]) {
            if let Some(hash) = states.get(&widgets.name())
                && proved.insert((widgets.name(), hash.clone()))
            {
                converged_in_etcd(etcd, widgets, hash).await;
            }
        }
        let begun = converged > 0 || (!discovery && pruned(client, swept, version).await > 0);
        if late_switched.is_none() && begun {
            late.set_storage_version(client, version).await;
            late_switched = Some(Instant::now());
        }
        let pruned = pruned(client, swept, version).await;
        if pruned == swept.len() && crds_pruned.is_none() {
            crds_pruned = Some(started.elapsed().as_secs_f64());
        }
        if let (Some(at), None) = (late_switched, late_pruned)
            && pruned_one(client, late, version).await
        {
            late_pruned = Some(at.elapsed().as_secs_f64());
        }
        if converged == total && total >= expected && pruned == swept.len() && late_pruned.is_some()
        {
            let seconds = started.elapsed().as_secs_f64();
            controller.stop();
            return Run {
                seconds,
                crds_pruned: crds_pruned.unwrap_or(seconds),
                late_pruned: late_pruned.unwrap_or_default(),
                converged,
            };
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The resources the discovery trigger keeps a StorageState for: migratable ones whose
/// discovery publishes a storage version hash, at their group's preferred version.
async fn migratable_resources(client: &Client) -> usize {
    let mut found = BTreeSet::new();
    let core = client.list_core_api_resources("v1").await.expect("core discovery");
    let mut lists = vec![(String::new(), core)];
    for group in client.list_api_groups().await.expect("discovery").groups {
        let Some(preferred) = group.preferred_version else { continue };
        let list = client.list_api_group_resources(&preferred.group_version).await;
        lists.push((group.name.clone(), list.expect("group discovery")));
    }
    for (group, list) in lists {
        for resource in list.resources {
            if kube_svm::engine::migratable(&resource) && resource.storage_version_hash.is_some() {
                found.insert((group.clone(), resource.name));
            }
        }
    }
    found.len()
}

/// StorageStates converged (one hash persisted, the current one), by name with that hash, and
/// StorageStates in all.
async fn storage_states(client: &Client) -> (BTreeMap<String, String>, usize) {
    let states: Api<StorageState> = Api::all(client.clone());
    let Ok(list) = states.list(&ListParams::default()).await else {
        return (BTreeMap::new(), usize::MAX);
    };
    let converged = list
        .items
        .iter()
        .filter_map(|s| {
            let status = s.status.as_ref()?;
            let current = status.current_storage_version_hash.clone()?;
            let alone = status.persisted_storage_version_hashes == [current.clone()];
            alone.then(|| (s.metadata.name.clone().unwrap_or_default(), current))
        })
        .collect();
    (converged, list.items.len())
}

/// A StorageState of `widgets` converged at `hash`: etcd holds every widget in that hash's
/// version, none in another.
async fn converged_in_etcd(etcd: &Etcd, widgets: &WidgetCrd, hash: &str) {
    let version = ["v1", "v2", "v3"]
        .into_iter()
        .find(|v| storage_version_hash(&widgets.group, v, WidgetCrd::KIND) == hash)
        .unwrap_or_else(|| panic!("{}: converged at an unknown hash {hash}", widgets.name()));
    let census = Census::of(etcd, widgets).await;
    let expected = widgets.api_version(version);
    assert_eq!(
        census.count(&expected),
        census.total(),
        "{}: its StorageState converged at {version} while etcd holds {:?}",
        widgets.name(),
        census.0
    );
}

/// CRDs of `widgets` whose `storedVersions` is `[version]`.
async fn pruned(client: &Client, widgets: &[WidgetCrd], version: &str) -> usize {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let Ok(list) = crds.list(&ListParams::default()).await else { return 0 };
    let names: BTreeSet<String> = widgets.iter().map(WidgetCrd::name).collect();
    list.items
        .iter()
        .filter(|crd| names.contains(crd.metadata.name.as_deref().unwrap_or_default()))
        .filter(|crd| {
            let stored = crd.status.as_ref().and_then(|s| s.stored_versions.clone());
            stored == Some(vec![version.to_owned()])
        })
        .count()
}

async fn pruned_one(client: &Client, widgets: &WidgetCrd, version: &str) -> bool {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get(&widgets.name()).await.expect("the CRD");
    crd.status.and_then(|s| s.stored_versions) == Some(vec![version.to_owned()])
}

/// Every object of every CRD is stored as `version` in etcd.
async fn prove(etcd: &Etcd, widgets: &[WidgetCrd], version: &str, objects: usize) {
    for w in widgets {
        let census = Census::of(etcd, w).await;
        let expected = w.api_version(version);
        assert_eq!(
            (census.total(), census.count(&expected)),
            (objects, objects),
            "{}: expected every object stored as {expected}: {:?}",
            w.name(),
            census.0
        );
    }
}

/// A `kube-svm controller` process at its defaults with both triggers, as the chart's
/// ServiceAccount.
struct Controller(Child);

impl Controller {
    async fn start(control_plane: &ControlPlane, binary: &Path, discovery: bool) -> Controller {
        let kubeconfig = control_plane.controller_kubeconfig().await;
        // `BENCH_SWEEP_LOGS=DIR` keeps each contender's log there.
        static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = match std::env::var_os("BENCH_SWEEP_LOGS") {
            Some(dir) => PathBuf::from(dir).join(format!("controller-{run}.log")),
            None => control_plane.path(&format!("sweep-{}.log", std::process::id())),
        };
        let out = std::fs::File::create(&log).expect("a log file");
        let lease_namespace =
            format!("--leader-election-namespace={}", support::CONTROLLER_NAMESPACE);
        let child = Command::new(binary)
            .args(["controller", "--leader-elect=false"])
            .args(discovery.then_some("--discovery-trigger"))
            .args(["--metrics-bind-address=127.0.0.1:0", &lease_namespace])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("a log file"))
            .stderr(out)
            .spawn()
            .expect("kube-svm starts");
        Controller(child)
    }

    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop();
    }
}

fn write_report(rows: &[Row], crds: usize, objects: usize, apiservers: usize) {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# The whole-cluster sweep\n\nThe built-in resources plus {crds} CRDs of {objects} objects each, every CRD switched to a new storage version; one more switched in the middle of the sweep. `make bench` (`cargo bench --bench sweep`), one run on {apiservers} kube-apiserver(s) (one etcd, behind a round-robin balancer when more than one).\n"
    );
    let _ = writeln!(md, "| contender | seconds | |\n| --- | --- | --- |");
    let limit = rows.first().map_or(1.0, |r| r.seconds);
    for row in rows {
        let _ = writeln!(
            md,
            "| {} | {:.1} ({:.2}x the limit) | {} |",
            row.contender,
            row.seconds,
            row.seconds / limit,
            row.note
        );
    }
    let stem = std::env::var("BENCH_REPORT").unwrap_or_else(|_| "docs/bench-sweep".to_owned());
    std::fs::write(format!("{stem}.md"), &md).expect("the report is written");
    print!("{md}");
}
