//! `make demo`: kube-svm on a local control plane, from a CRD's storage version change to the
//! proof in etcd.
//!
//! Starts a real etcd and kube-apiserver (the test harness's), creates a CRD stored at v1 with a
//! few thousand objects, switches its storage version to v2, and runs `kube-svm controller` as the
//! Helm chart's ServiceAccount. The CRD trigger creates the migration by itself; the demo follows
//! its progress, then shows the stored bytes in etcd and the pruned `storedVersions`. Then the
//! rest of the road: v1 no longer served, the controller cleaning the `managedFields` entries
//! that name it, `kube-svm plan --drop v1` saying yes, v1 removed, and a widget applied
//! server-side at v1 applied again at v2. Everything is stopped and removed at the end.

// The integration tests' harness; the demo needs only part of it.
#[allow(dead_code, unused_imports)]
#[path = "../tests/cluster/support/mod.rs"]
mod support;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_svm::api::Phase;
use kube_svm::api::StorageVersionMigration;
use kube_svm::trigger::crd::REMOVE_VERSIONS_ANNOTATION;

use support::fixtures::{WidgetCrd, create_namespace, install_kube_svm_crds};
use support::process::KubeSvm;
use support::{ControlPlane, Etcd};

const NAMESPACES: [&str; 3] = ["shop", "warehouse", "billing"];
const PER_NAMESPACE: usize = 1000;

/// How long the controller watches the discovery hash before trusting the new encoding; the
/// default is 10 s, shortened so the demo does not wait for nothing on a single apiserver.
const SETTLE: &str = "--storage-version-settle=2";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    step("Starting etcd and kube-apiserver (built from Go modules by hack/control-plane.sh)");
    let control_plane = ControlPlane::start(&[]).await?;
    let client = control_plane.client().await;
    let etcd = control_plane.etcd();
    done(format!("ready in {:.1} s", started.elapsed().as_secs_f64()));

    step("Installing kube-svm's CRDs (migration.k8s.io/v1alpha1)");
    install_kube_svm_crds(&client).await;
    done("established");

    // The control plane is the demo's own: a fixed group reads better than a unique one.
    let widgets = WidgetCrd { group: "demo.example.com".into(), namespaced: true };
    step(&format!("Creating CRD {} stored at v1, and {} widgets", widgets.name(), total()));
    let seeding = Instant::now();
    widgets.create(&client, "v1").await;
    for namespace in NAMESPACES {
        create_namespace(&client, namespace).await;
    }
    let namespaces: Vec<Option<&str>> = NAMESPACES.iter().copied().map(Some).collect();
    widgets.seed(&client, "v1", &namespaces, PER_NAMESPACE).await;
    apply_catalog(&client, &widgets, "v1", 1).await?;
    done(format!(
        "created in {:.1} s, and shop/catalog applied server-side at v1 by {MANAGER}",
        seeding.elapsed().as_secs_f64()
    ));

    step("Switching the CRD's storage version to v2");
    widgets.set_storage_version(&client, "v2").await;
    let switched = Instant::now();
    inspect(&etcd, &widgets)?;
    detail(&format!("status.storedVersions: {:?}", stored_versions(&client, &widgets).await));
    match drop_version(&client, &widgets, "v1", true).await {
        Err(message) => detail(&format!("removing v1 from spec.versions is refused: {message}")),
        Ok(()) => anyhow::bail!("the apiserver let v1 go while objects are stored in it"),
    }

    step("Starting `kube-svm controller` as the Helm chart's ServiceAccount, with the CRD trigger");
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let admin = format!("--metrics-bind-address=127.0.0.1:{port}");
    let args = [
        "controller",
        "--leader-elect=false",
        "--crd-trigger=true",
        // As the Helm chart runs it: a CRD that stops serving a version gets its managedFields
        // cleaned.
        "--clean-managed-fields=true",
        "--checkpoint-interval=1",
        // The control plane is the demo's alone: no client-side rate limit (the default, 100
        // requests per second, is meant for sharing a production apiserver).
        "--kube-api-qps=0",
        // As the chart runs it: the gentle pace steered by its probe of the apiserver.
        "--foreground-budget=3x",
        SETTLE,
        &admin,
    ];
    let mut controller = KubeSvm::start(&control_plane, "controller", &args).await;
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    let triggered = ListParams::default().labels("kube-svm.io/trigger=crd");
    let name = triggered_migration(&migrations, &triggered, 1, switched).await?;
    detail(&format!(
        "the CRD trigger created migration {name} {:.1} s after the storage switch, start-up included",
        switched.elapsed().as_secs_f64()
    ));

    let migrating = Instant::now();
    let migration = follow(&migrations, &name, &controller).await?;
    let progress = migration.status.clone().unwrap_or_default().progress.unwrap_or_default();
    detail(&format!(
        "{:?}: {} rewritten, {} already current, {} failed; {:.1} s from creation to the end, \
         the encoding check's {} included",
        Phase::of(&migration),
        progress.rewritten,
        progress.already_current,
        progress.failed,
        migrating.elapsed().as_secs_f64(),
        SETTLE.trim_start_matches("--storage-version-settle=").to_owned() + " s",
    ));
    anyhow::ensure!(Phase::of(&migration) == Phase::Succeeded, "the migration did not succeed");

    step("The proof");
    inspect(&etcd, &widgets)?;
    let pruned = wait_stored_versions(&client, &widgets, &["v2"]).await;
    detail(&format!("status.storedVersions: {pruned:?}"));
    let (code, _) = plan_drop(&control_plane, &widgets)?;
    anyhow::ensure!(code == Some(3), "plan --drop let v1 go while it is served");

    step("Stopping serving v1: the controller cleans the managedFields entries that name it");
    widgets.set_served(&client, "v1", false).await;
    // A version no longer served gets a grace before its entries are cleaned, unless the CRD
    // names it for removal, as an operator about to drop it does.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let intent = serde_json::json!({
        "metadata": { "annotations": { REMOVE_VERSIONS_ANNOTATION: "v1" } }
    });
    crds.patch(&widgets.name(), &PatchParams::default(), &Patch::Merge(&intent)).await?;
    detail(&format!("annotated the CRD {REMOVE_VERSIONS_ANNOTATION}: v1"));
    let unserved = Instant::now();
    let name = triggered_migration(&migrations, &triggered, 2, unserved).await?;
    detail(&format!(
        "the CRD trigger created migration {name}, annotated kube-svm.io/clean-managed-fields"
    ));
    let migration = follow(&migrations, &name, &controller).await?;
    let progress = migration.status.clone().unwrap_or_default().progress.unwrap_or_default();
    detail(&format!(
        "{:?}: {} objects with managedFields cleaned, {} rewritten, {} failed, in {:.1} s",
        Phase::of(&migration),
        progress.cleaned,
        progress.rewritten,
        progress.failed,
        unserved.elapsed().as_secs_f64(),
    ));
    anyhow::ensure!(Phase::of(&migration) == Phase::Succeeded, "the cleaning did not succeed");
    let (code, _) = plan_drop(&control_plane, &widgets)?;
    anyhow::ensure!(code == Some(0), "plan --drop still finds v1 blocked");

    step("Removing v1, and applying shop/catalog server-side again, at v2");
    match drop_version(&client, &widgets, "v1", false).await {
        Ok(()) => detail("removing v1 from spec.versions: accepted, v1 is gone"),
        Err(message) => anyhow::bail!("v1 could not be removed: {message}"),
    }
    let applied = apply_catalog(&client, &widgets, "v2", 2).await?;
    let entries: Vec<String> = applied
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            format!("{} ({})", e.manager.unwrap_or_default(), e.api_version.unwrap_or_default())
        })
        .collect();
    detail(&format!(
        "applied: spec.size is now {}; managedFields: {}",
        applied.data["spec"]["size"],
        entries.join(", ")
    ));

    step("The controller's metrics");
    let metrics = support::http_client()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    for line in metrics.lines().filter(|line| {
        line.starts_with("storage_migrator_core_migrator_")
            || line.starts_with("kube_svm_objects_total")
            || line.starts_with("kube_svm_stored_versions_decisions_total")
    }) {
        detail(line);
    }

    step("Stopping the controller (SIGTERM) and the control plane");
    controller.signal("TERM");
    let exit = controller.wait(Duration::from_secs(10));
    drop(control_plane);
    done(format!(
        "controller exited with {}; demo took {:.0} s",
        exit.map(|status| status.to_string()).unwrap_or_else(|| "no exit in 10 s".into()),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

fn total() -> usize {
    NAMESPACES.len() * PER_NAMESPACE
}

fn step(text: &str) {
    println!("\n==> {text}");
}

fn done(text: impl std::fmt::Display) {
    println!("    {text}");
}

fn detail(text: &str) {
    println!("    {text}");
}

/// The field manager that applies shop/catalog.
const MANAGER: &str = "shop-deployer";

/// Applies widget shop/catalog server-side at `version`, as [`MANAGER`].
async fn apply_catalog(
    client: &Client,
    widgets: &WidgetCrd,
    version: &str,
    size: u32,
) -> anyhow::Result<kube::core::DynamicObject> {
    let catalog = serde_json::json!({
        "apiVersion": widgets.api_version(version),
        "kind": WidgetCrd::KIND,
        "metadata": { "name": "catalog", "namespace": "shop" },
        "spec": { "size": size },
    });
    let api = widgets.api(client, version, Some("shop"));
    let params = kube::api::PatchParams::apply(MANAGER);
    Ok(api.patch("catalog", &params, &kube::api::Patch::Apply(&catalog)).await?)
}

/// Waits for the CRD trigger's `n`th migration; its name.
async fn triggered_migration(
    migrations: &Api<StorageVersionMigration>,
    triggered: &ListParams,
    n: usize,
    since: Instant,
) -> anyhow::Result<String> {
    loop {
        let mut found = migrations.list(triggered).await?.items;
        found.sort_by_key(|m| m.metadata.creation_timestamp.clone());
        if let Some(found) = found.into_iter().nth(n - 1) {
            return Ok(found.metadata.name.unwrap_or_default());
        }
        anyhow::ensure!(since.elapsed() < Duration::from_secs(60), "no migration was created");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `kube-svm plan --drop v1` on the widgets and shows its answer; its exit code.
fn plan_drop(
    control_plane: &ControlPlane,
    widgets: &WidgetCrd,
) -> anyhow::Result<(Option<i32>, String)> {
    let name = widgets.name();
    let args = ["plan", "--drop", "v1", &name];
    detail(&format!("$ kube-svm {}", args.join(" ")));
    let output = std::process::Command::new(support::process::binary())
        .args(args)
        .arg("--kubeconfig")
        .arg(control_plane.kubeconfig())
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    for line in text.lines() {
        match line.is_empty() {
            true => println!(),
            false => detail(line),
        }
    }
    anyhow::ensure!(
        matches!(output.status.code(), Some(0 | 3)),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.code(), text))
}

/// Runs `kube-svm inspect` on the widgets and shows its census of etcd.
fn inspect(etcd: &Etcd, widgets: &WidgetCrd) -> anyhow::Result<()> {
    let args = ["inspect", &widgets.name(), "--etcd-endpoints", etcd.url()];
    detail(&format!("$ kube-svm {}", args.join(" ")));
    let output = std::process::Command::new(support::process::binary()).args(args).output()?;
    anyhow::ensure!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        match line.is_empty() {
            true => println!(),
            false => detail(line),
        }
    }
    Ok(())
}

async fn stored_versions(client: &Client, widgets: &WidgetCrd) -> Vec<String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get(&widgets.name()).await.ok();
    crd.and_then(|crd| crd.status).and_then(|status| status.stored_versions).unwrap_or_default()
}

/// Waits a little for the pruned list: the controller writes it just before the migration's
/// final status, which the demo may read first.
async fn wait_stored_versions(client: &Client, widgets: &WidgetCrd, want: &[&str]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stored = stored_versions(client, widgets).await;
        if stored == want || Instant::now() > deadline {
            return stored;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Removes `version` from the CRD's `spec.versions` (as a dry run when asked); the apiserver's
/// message when it refuses.
async fn drop_version(
    client: &Client,
    widgets: &WidgetCrd,
    version: &str,
    dry_run: bool,
) -> Result<(), String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PostParams { dry_run, ..PostParams::default() };
    loop {
        let mut crd = crds.get(&widgets.name()).await.map_err(|error| error.to_string())?;
        crd.spec.versions.retain(|v| v.name != version);
        match crds.replace(&widgets.name(), &params, &crd).await {
            Ok(_) => return Ok(()),
            // Changed since it was read (kube-svm writes its status): read it again.
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(kube::Error::Api(status)) => return Err(status.message),
            Err(error) => return Err(error.to_string()),
        }
    }
}

/// Prints the migration's progress as it changes until it ends.
async fn follow(
    migrations: &Api<StorageVersionMigration>,
    name: &str,
    controller: &KubeSvm,
) -> anyhow::Result<StorageVersionMigration> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut shown = None;
    loop {
        let migration = migrations.get(name).await?;
        let phase = Phase::of(&migration);
        let progress = migration.status.as_ref().and_then(|s| s.progress.clone());
        if let Some(progress) = &progress
            && shown != Some(progress.processed)
        {
            shown = Some(progress.processed);
            detail(&format!(
                "{phase:?}: {:>5} of {} processed, {} remaining",
                progress.processed,
                total() + 1,
                progress.remaining.map(|r| r.to_string()).unwrap_or_else(|| "?".into())
            ));
        }
        if matches!(phase, Phase::Succeeded | Phase::Failed) {
            return Ok(migration);
        }
        if Instant::now() > deadline {
            anyhow::bail!("the migration did not finish; controller log:\n{}", controller.logs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
