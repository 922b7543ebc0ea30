//! HA control planes: three kube-apiservers on one etcd behind a round-robin balancer, and a
//! rolling upgrade across two releases. kube-apiserver 1.37 started with
//! `--emulated-version=1.36` chooses 1.36's storage versions, and for `mutatingadmissionpolicies`
//! (and their bindings) those differ from 1.37's: two apiservers at 1.36 and one at 1.37, then all
//! three at 1.37, is a real upgrade of those resources' storage, with no second build.
//!
//! `KUBE_SVM_HA_SECONDS` sets how long apiservers are killed and revived again and again in the
//! fault scenario (default 60, what CI runs).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicy;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kube_svm::api::{Phase, StorageState, StorageVersionMigration};
use kube_svm::apiserver::requests::Requests;
use kube_svm::evidence::{apiservers, encoding};
use kube_svm::rules::storage_hash::storage_version_hash;
use serde_json::json;

use crate::support::fixtures::{WidgetCrd, install_kube_svm_crds, missing_aggregated_api, unique};
use crate::support::migrations::{has_event_saying, wait_for_triggered};
use crate::support::process::KubeSvm;
use crate::support::{ControlPlane, Scenario, Topology};
use crate::support::{invariant, migrations};

/// The flag that makes a 1.37 kube-apiserver behave as the release before it.
const OLD_RELEASE: &str = "--emulated-version=1.36";

const GROUP: &str = "admissionregistration.k8s.io";
const POLICIES: &str = "mutatingadmissionpolicies";
const KIND: &str = "MutatingAdmissionPolicy";

/// How long any one phase of a scenario may take.
const PHASE: Duration = Duration::from_secs(300);

/// The StorageVersion API, as the apiservers of one topology serve it.
const STORAGE_VERSION_API: [&str; 2] = [
    "--feature-gates=StorageVersionAPI=true,APIServerIdentity=true",
    "--runtime-config=internal.apiserver.k8s.io/v1alpha1=true",
];

/// Three apiservers of the old release, with the StorageVersion API or without.
fn old_release(storage_version_api: bool) -> Topology {
    let common = match storage_version_api {
        true => STORAGE_VERSION_API.iter().map(ToString::to_string).collect(),
        false => Vec::new(),
    };
    Topology { apiservers: vec![vec![OLD_RELEASE.to_owned()]; 3], common }
}

/// The agreeing samples a sampled confirmation rests on (`... N samples through fresh
/// connections ...`): at least the 12 three apiservers need; the rounds the checks share may
/// give a check one more within its settle period. 0 when the evidence names none.
fn agreeing_samples(evidence: &str) -> u32 {
    let count = evidence.split(" samples through").next().and_then(|s| s.rsplit(' ').next());
    count.and_then(|n| n.parse().ok()).unwrap_or_default()
}

/// The storage version hash a release publishes for mutating admission policies.
fn hash(version: &str) -> String {
    storage_version_hash(GROUP, version, KIND)
}

/// A MutatingAdmissionPolicy named `name`.
fn policy(name: &str) -> MutatingAdmissionPolicy {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "matchConstraints": { "resourceRules": [{
                "apiGroups": ["example.com"], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["gadgets"],
            }]},
            "mutations": [{
                "patchType": "ApplyConfiguration",
                "applyConfiguration": {
                    "expression": "Object{metadata: Object.metadata{labels: {\"seen\": \"yes\"}}}",
                },
            }],
            "reinvocationPolicy": "Never",
            "failurePolicy": "Ignore",
        },
    }))
    .expect("a valid policy")
}

/// Creates `count` MutatingAdmissionPolicies named `<prefix>-<i>` through the balancer, each
/// through a connection of its own, so that they spread over the apiservers as many clients'
/// writes would.
async fn create_policies(control_plane: &ControlPlane, prefix: &str, count: usize) {
    for i in 0..count {
        let api: Api<MutatingAdmissionPolicy> = Api::all(control_plane.client().await);
        let policy = policy(&format!("{prefix}-{i}"));
        // A connection may land on an apiserver that was just killed: ask again.
        let deadline = Instant::now() + PHASE;
        while let Err(error) = api.create(&PostParams::default(), &policy).await {
            if matches!(&error, kube::Error::Api(s) if s.code == 409) {
                break;
            }
            assert!(Instant::now() < deadline, "policy {prefix}-{i} is not created: {error}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// How etcd stores the mutating admission policies: keys by stored apiVersion.
async fn stored(control_plane: &ControlPlane) -> BTreeMap<String, u64> {
    let census = control_plane.etcd().census(&format!("/registry/{POLICIES}/")).await;
    census.expect("etcd answers").api_versions
}

/// The StorageState of mutating admission policies, if the trigger has written one.
async fn storage_state(client: &Client) -> Option<StorageState> {
    let api: Api<StorageState> = Api::all(client.clone());
    api.get_opt(&format!("{POLICIES}.{GROUP}")).await.ok().flatten()
}

fn persisted(state: &StorageState) -> Vec<String> {
    state.status.as_ref().map(|s| s.persisted_storage_version_hashes.clone()).unwrap_or_default()
}

/// Waits until the StorageState of mutating admission policies persists `hashes` alone.
async fn wait_persisted(client: &Client, hashes: &[String], controller: &KubeSvm) -> StorageState {
    let deadline = Instant::now() + PHASE;
    loop {
        if let Some(state) = storage_state(client).await
            && persisted(&state) == hashes
        {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "the StorageState never persisted {hashes:?}: {:?}\n{}",
            storage_state(client).await.map(|s| s.status),
            controller.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The migrations of mutating admission policies, oldest first.
async fn policy_migrations(client: &Client) -> Vec<StorageVersionMigration> {
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    let mut found: Vec<_> = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(_) => return Vec::new(),
    };
    found.retain(|m| m.spec.resource.group == GROUP && m.spec.resource.resource == POLICIES);
    found.sort_by_key(|m| m.metadata.creation_timestamp.as_ref().map(|t| t.0));
    found
}

/// Whether a migration's status says it proved its target: Succeeded with the encoding
/// confirmed.
fn proved(migration: &StorageVersionMigration) -> Option<String> {
    let status = migration.status.as_ref()?;
    let target = status.target.as_ref()?;
    (Phase::of(migration) == Phase::Succeeded && target.encoding_confirmed == Some(true))
        .then(|| target.storage_version_hash.clone().unwrap_or_default())
}

/// The discovery trigger's controller on an HA control plane, as the chart's ServiceAccount,
/// through the balancer.
async fn controller(control_plane: &ControlPlane, name: &str) -> KubeSvm {
    let kubeconfig = control_plane.controller_kubeconfig().await.to_owned();
    let args = [
        "controller",
        "--leader-elect=false",
        "--discovery-trigger",
        "--discovery-interval=4",
        "--storage-version-settle=3",
        "--storage-version-wait=15",
        "--concurrency=6",
    ];
    KubeSvm::start_as(control_plane, name, &args, &kubeconfig)
}

/// A rolling upgrade, as an operator would see it: the discovery trigger migrates everything at
/// the old release and collapses the StorageState of mutating admission policies to the old
/// hash; while one apiserver of three runs the new release, objects are written through both and
/// the trigger does not flap, nor does any migration prove the new hash; once all three run the
/// new release, one migration moves every policy to the new version, as etcd shows, and
/// collapses the StorageState to the new hash.
async fn rolling_upgrade(storage_version_api: bool) {
    let control_plane =
        ControlPlane::start_ha(&old_release(storage_version_api)).await.expect("control plane");
    let client = control_plane.client().await;
    install_kube_svm_crds(&client).await;
    create_policies(&control_plane, "before", 10).await;
    let (old, new) = (hash("v1beta1"), hash("v1"));
    assert_eq!(stored(&control_plane).await, [(format!("{GROUP}/v1beta1"), 10)].into());

    let mut controller = controller(&control_plane, "controller").await;
    wait_persisted(&client, std::slice::from_ref(&old), &controller).await;

    // One apiserver upgraded: two releases serve the same etcd.
    let before: Vec<String> =
        policy_migrations(&client).await.iter().map(|m| m.name_any()).collect();
    control_plane.restart_apiserver_at(0, &[]).await.expect("apiserver 0 upgrades");
    create_policies(&control_plane, "during", 12).await;
    let mixed = stored(&control_plane).await;
    assert!(mixed.len() == 2, "written through both releases: {mixed:?}");
    // Several polls of the trigger while the releases are mixed: its heartbeat moves on.
    let beat =
        |state: &StorageState| state.status.as_ref().and_then(|s| s.last_heartbeat_time.clone());
    let first = storage_state(&client).await.and_then(|s| beat(&s));
    let deadline = Instant::now() + PHASE;
    let mut beats = 0;
    let mut last = first;
    while beats < 2 {
        let state = storage_state(&client).await.expect("the StorageState stays");
        // The new release's hash is listed once a poll reaches the upgraded apiserver (objects
        // are written in it there), but not trusted: the old one stays current.
        let current = state.status.as_ref().and_then(|s| s.current_storage_version_hash.clone());
        assert_eq!(current.as_ref(), Some(&old), "the trigger flapped mid-upgrade");
        let listed = persisted(&state);
        assert!(
            listed.first() == Some(&old) && listed.iter().all(|h| *h == old || *h == new),
            "mid-upgrade the StorageState lists {listed:?}"
        );
        for migration in policy_migrations(&client).await {
            if !before.contains(&migration.name_any()) {
                let status = &migration.status;
                assert_eq!(proved(&migration), None, "proved mid-upgrade: {status:?}");
            }
        }
        if beat(&state) != last {
            beats += 1;
            last = beat(&state);
        }
        assert!(Instant::now() < deadline, "the trigger never polled\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The upgrade ends; the controller is restarted with it, as a Deployment would be.
    controller.signal("TERM");
    controller.wait(Duration::from_secs(30)).expect("the controller stops");
    control_plane.restart_apiserver_at(1, &[]).await.expect("apiserver 1 upgrades");
    control_plane.restart_apiserver_at(2, &[]).await.expect("apiserver 2 upgrades");
    let controller = self::controller(&control_plane, "upgraded").await;
    wait_persisted(&client, std::slice::from_ref(&new), &controller).await;

    let proving: Vec<_> = policy_migrations(&client)
        .await
        .iter()
        .filter(|m| proved(m).as_deref() == Some(new.as_str()))
        .map(|m| m.name_any())
        .collect();
    assert!(!proving.is_empty(), "a migration proved the new hash");
    assert_eq!(stored(&control_plane).await, [(format!("{GROUP}/v1"), 22)].into());
    let evidence = policy_migrations(&client)
        .await
        .iter()
        .rev()
        .find(|m| proved(m).is_some())
        .and_then(|m| m.status.as_ref()?.target.as_ref()?.encoding_evidence.clone())
        .expect("evidence recorded");
    match storage_version_api {
        true => assert!(evidence.contains("the StorageVersion API"), "{evidence}"),
        false => assert!(
            agreeing_samples(&evidence) >= 12 && evidence.contains("3 apiservers"),
            "{evidence}"
        ),
    }
}

#[tokio::test]
async fn a_rolling_upgrade_is_migrated_once_the_last_apiserver_is_upgraded() {
    rolling_upgrade(false).await;
}

#[tokio::test]
async fn a_rolling_upgrade_with_the_storage_version_api() {
    rolling_upgrade(true).await;
}

/// Creates `count` MutatingAdmissionPolicies named `<prefix>-<i>` through `client` alone.
async fn create_policies_through(client: &Client, prefix: &str, count: usize) {
    let api: Api<MutatingAdmissionPolicy> = Api::all(client.clone());
    for i in 0..count {
        let policy = policy(&format!("{prefix}-{i}"));
        api.create(&PostParams::default(), &policy).await.expect("the policy is created");
    }
}

/// One apiserver of three rolled back to the old release after the discovery trigger converged
/// on the new hash: polls that reach it see the old hash, never on enough polls in a row to be
/// trusted, while the objects written through it are stored in the old version, as etcd shows.
/// The StorageState lists the old hash too, and keeps it while that apiserver runs: no
/// migration proves the new hash alone meanwhile.
#[tokio::test]
async fn a_hash_published_by_one_rolled_back_apiserver_is_persisted() {
    let topology = Topology { apiservers: vec![Vec::new(); 3], common: Vec::new() };
    let control_plane = ControlPlane::start_ha(&topology).await.expect("control plane");
    let client = control_plane.client().await;
    install_kube_svm_crds(&client).await;
    create_policies(&control_plane, "before", 5).await;
    let (old, new) = (hash("v1beta1"), hash("v1"));
    let controller = controller(&control_plane, "controller").await;
    wait_persisted(&client, std::slice::from_ref(&new), &controller).await;

    let before: Vec<String> =
        policy_migrations(&client).await.iter().map(|m| m.name_any()).collect();
    control_plane.restart_apiserver_at(2, &[OLD_RELEASE]).await.expect("apiserver 2 rolls back");
    create_policies_through(&control_plane.direct_client(2).await, "rolled-back", 3).await;
    let in_etcd = stored(&control_plane).await;
    assert_eq!(in_etcd.get(&format!("{GROUP}/v1beta1")), Some(&3), "{in_etcd:?}");

    // One poll in three reaches apiserver 2: the old hash is listed within a few polls.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let state = storage_state(&client).await.expect("the StorageState stays");
        if persisted(&state).contains(&old) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the StorageState lists only {:?} while etcd holds {in_etcd:?}\n{}",
            persisted(&state),
            controller.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Kept over the next polls (each moves the heartbeat), and no migration proves meanwhile.
    let beat =
        |state: &StorageState| state.status.as_ref().and_then(|s| s.last_heartbeat_time.clone());
    let mut last = storage_state(&client).await.and_then(|s| beat(&s));
    let mut beats = 0;
    let deadline = Instant::now() + PHASE;
    while beats < 3 {
        let state = storage_state(&client).await.expect("the StorageState stays");
        let listed = persisted(&state);
        assert!(listed.contains(&old) && listed.contains(&new), "collapsed to {listed:?}");
        let current = state.status.as_ref().and_then(|s| s.current_storage_version_hash.clone());
        assert_eq!(current.as_ref(), Some(&new), "the trigger flapped");
        for migration in policy_migrations(&client).await {
            if !before.contains(&migration.name_any()) {
                let status = &migration.status;
                assert_eq!(proved(&migration), None, "proved while rolled back: {status:?}");
            }
        }
        if beat(&state) != last {
            beats += 1;
            last = beat(&state);
        }
        assert!(Instant::now() < deadline, "the trigger never polled\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A run of a built-in resource during which one apiserver of three is rolled back to the old
/// release and then upgraded again: objects it had already rewritten are written through that
/// apiserver meanwhile, so etcd holds them in the old version, and discovery at the end shows the
/// new hash everywhere again. The run samples discovery while it writes: it starts over once it
/// sees the old hash, and never ends Succeeded with its encoding confirmed while etcd still holds
/// an object in the old version. (The apiserver's restart itself may be what the run sees first:
/// its witness of the apiservers starts it over too.)
#[tokio::test]
async fn a_built_in_run_seeing_another_hash_mid_run_starts_over() {
    const POLICIES_SEEDED: usize = 200;
    let topology = Topology { apiservers: vec![Vec::new(); 3], common: Vec::new() };
    let control_plane = ControlPlane::start_ha(&topology).await.expect("control plane");
    let client = control_plane.client().await;
    install_kube_svm_crds(&client).await;
    create_policies(&control_plane, "p", POLICIES_SEEDED).await;
    let kubeconfig = control_plane.controller_kubeconfig().await.to_owned();
    // One write a second: the run lasts over three minutes, longer than the rollback and the
    // upgrade after it (each restart of an apiserver takes up to half a minute on 2 cores).
    let args = [
        "controller",
        "--leader-elect=false",
        "--crd-trigger=false",
        "--kube-api-qps=1",
        "--kube-api-burst=1",
        // Progress reaches the status page by page.
        "--page-size=20",
        "--storage-version-settle=3",
        "--storage-version-wait=30",
    ];
    let controller = KubeSvm::start_as(&control_plane, "controller", &args, &kubeconfig);
    let name = "policies-rolled-back-mid-run";
    migrations::create_migration(&client, name, GROUP, POLICIES).await;
    let confirmed = |m: &StorageVersionMigration| {
        let target = m.status.as_ref().and_then(|s| s.target.as_ref());
        target.is_some_and(|t| t.encoding_confirmed == Some(true))
    };
    migrations::wait_for(&client, name, PHASE, &[&controller], |m| {
        confirmed(m) && migrations::processed_at_least(10)(m)
    })
    .await;

    // Rolled back: the first policies, already rewritten in v1, are written again through it.
    control_plane.restart_apiserver_at(1, &[OLD_RELEASE]).await.expect("apiserver 1 rolls back");
    let rolled_back: Api<MutatingAdmissionPolicy> = Api::all(control_plane.direct_client(1).await);
    let touch = json!({ "metadata": { "labels": { "written-by": "the-old-release" } } });
    // The first five in etcd's key order, the order the run lists and writes them in.
    let mut names: Vec<String> = (0..POLICIES_SEEDED).map(|i| format!("p-{i}")).collect();
    names.sort();
    for name in &names[..5] {
        let patch = kube::api::Patch::Merge(&touch);
        let params = kube::api::PatchParams::default();
        rolled_back.patch(name, &params, &patch).await.expect("patched");
    }
    let in_etcd = stored(&control_plane).await;
    assert_eq!(in_etcd.get(&format!("{GROUP}/v1beta1")), Some(&5), "{in_etcd:?}");
    // Until the run has seen the old hash (a discovery sample, one every 2 s, reached apiserver
    // 1: all of 30 miss it with a chance of (2/3)^30), or for 60 s.
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let migration = api.get(name).await.expect("the migration");
        if migration.status.as_ref().and_then(|s| s.restarts).is_some_and(|n| n > 0) {
            break;
        }
        assert!(!Phase::of(&migration).is_terminal(), "ended too soon: {:?}", migration.status);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    control_plane.restart_apiserver_at(1, &[]).await.expect("apiserver 1 upgrades again");

    let ended =
        migrations::wait_for(&client, name, PHASE * 2, &[&controller], migrations::is_terminal)
            .await;
    let in_etcd = stored(&control_plane).await;
    let status = &ended.status;
    let restarts = status.as_ref().and_then(|s| s.restarts).unwrap_or(0);
    if proved(&ended).is_some() {
        assert_eq!(
            in_etcd,
            [(format!("{GROUP}/v1"), POLICIES_SEEDED as u64)].into(),
            "Succeeded with its encoding confirmed, {restarts} restarts, while etcd holds \
             {in_etcd:?}: {status:?}\n{}",
            controller.logs()
        );
    }
    assert!(restarts > 0 || proved(&ended).is_none(), "{status:?}");
    eprintln!(
        "ended {:?} after {restarts} restarts, proved {:?}",
        Phase::of(&ended),
        proved(&ended)
    );
    // Whichever saw it first: the run's sampling of the hash, or its witness of the apiservers
    // (the rollback restarts apiserver 1).
    let logs = controller.logs();
    let seen = ["while the run wrote in", "the apiservers restarted while the run wrote"];
    assert!(seen.iter().any(|line| logs.contains(line)), "{logs}");
}

/// How long apiservers are killed and revived in the fault scenario (`KUBE_SVM_HA_SECONDS`).
fn chaos_duration() -> Duration {
    let seconds = std::env::var("KUBE_SVM_HA_SECONDS").ok().and_then(|s| s.parse().ok());
    Duration::from_secs(seconds.unwrap_or(60))
}

/// The upgrade, with faults on top: the three apiservers upgraded at once, then one apiserver
/// after another killed (SIGKILL) and started again, over and over, while the discovery trigger
/// and the CRD trigger migrate (mutating admission policies written through both releases, a CRD
/// switched to a new storage version) and the controller itself is killed and started again.
/// Every StorageState converges to its current hash alone, every migration ends Succeeded with
/// no object failed for an apiserver's absence, and etcd agrees.
#[tokio::test]
async fn apiservers_and_the_controller_killed_again_and_again_lose_nothing() {
    let control_plane = ControlPlane::start_ha(&old_release(false)).await.expect("control plane");
    let client = control_plane.direct_client(0).await;
    install_kube_svm_crds(&client).await;
    create_policies(&control_plane, "before", 10).await;
    let widgets = WidgetCrd::stale(&client, "ha-chaos", 300).await;
    let mut controller = controller(&control_plane, "first").await;
    wait_persisted(&client, &[hash("v1beta1")], &controller).await;

    for i in 0..3 {
        control_plane.restart_apiserver_at(i, &[]).await.expect("the apiserver upgrades");
    }
    create_policies(&control_plane, "after", 10).await;
    widgets.set_storage_version(&client, "v3").await;

    let chaos = chaos_duration();
    let started = Instant::now();
    let mut round = 0;
    let mut restarted = false;
    while started.elapsed() < chaos {
        let victim = round % 3;
        control_plane.kill_apiserver(victim).expect("killed");
        tokio::time::sleep(Duration::from_secs(3)).await;
        control_plane.revive_apiserver(victim).await.expect("the apiserver starts again");
        if !restarted && started.elapsed() > chaos / 2 {
            controller.signal("KILL");
            controller.wait(Duration::from_secs(30)).expect("the controller dies");
            controller = self::controller(&control_plane, "second").await;
            restarted = true;
        }
        round += 1;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert!(restarted, "the controller was killed once (KUBE_SVM_HA_SECONDS too short?)");

    // Everything converges: every StorageState to its current hash alone, every migration ended,
    // and the CRD's storedVersions to v3 alone. The last is waited for too: the discovery trigger
    // trusts v3's hash only once enough polls in a row agree, which the chaos may delay past its
    // end, and until then the widgets' StorageState still holds v2's hash as its current one.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let states: Api<StorageState> = Api::all(client.clone());
    let migrations_api: Api<StorageVersionMigration> = Api::all(client.clone());
    let deadline = Instant::now() + PHASE;
    loop {
        let pending: Vec<String> = states
            .list(&ListParams::default())
            .await
            .expect("StorageStates")
            .items
            .iter()
            .filter(|state| {
                let status = state.status.clone().unwrap_or_default();
                let current = status.current_storage_version_hash.clone().unwrap_or_default();
                status.persisted_storage_version_hashes != [current]
            })
            .map(|state| state.name_any())
            .collect();
        let running: Vec<String> = migrations_api
            .list(&ListParams::default())
            .await
            .expect("migrations")
            .items
            .iter()
            .filter(|m| !Phase::of(m).is_terminal())
            .map(|m| m.name_any())
            .collect();
        let crd = crds.get(&widgets.name()).await.expect("the CRD");
        let stored = crd.status.and_then(|s| s.stored_versions).unwrap_or_default();
        if pending.is_empty() && running.is_empty() && stored == ["v3"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not converged: states {pending:?}, migrations {running:?}, storedVersions {stored:?}\n{}",
            controller.logs()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let all = migrations_api.list(&ListParams::default()).await.expect("migrations").items;
    for migration in &all {
        let progress = migration.status.as_ref().and_then(|s| s.progress.clone());
        assert_eq!(
            Phase::of(migration),
            Phase::Succeeded,
            "{}: {:?}",
            migration.name_any(),
            migration.status
        );
        assert_eq!(progress.map_or(0, |p| p.failed), 0, "{}", migration.name_any());
    }
    assert_eq!(stored(&control_plane).await, [(format!("{GROUP}/v1"), 20)].into());

    // The CRD's migration: confirmed behind the balancer only once every apiserver was asked.
    let mut of_crd: Vec<&StorageVersionMigration> =
        all.iter().filter(|m| m.spec.resource.group == widgets.group).collect();
    of_crd.sort_by_key(|m| m.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let crd_migration = of_crd
        .into_iter()
        .rev()
        .find(|m| {
            m.status
                .as_ref()
                .and_then(|s| s.target.as_ref())
                .is_some_and(|t| t.encoding_confirmed == Some(true))
        })
        .expect("a confirmed migration of the CRD");
    let evidence = crd_migration
        .status
        .as_ref()
        .and_then(|s| s.target.as_ref()?.encoding_evidence.clone())
        .unwrap_or_default();
    assert!(agreeing_samples(&evidence) >= 12 && evidence.contains("3 apiservers"), "{evidence}");
    let outcome =
        invariant::check(&client, &control_plane.etcd(), &widgets, &crd_migration.name_any(), 300)
            .await;
    assert_eq!(outcome.stored_versions, ["v3"]);
    assert_eq!(outcome.census.count(&widgets.api_version("v3")), 300);
}

/// `apiservers` kube-apiservers behind the balancer, with kube-svm's CRDs, and client-IP affinity
/// on the `kubernetes` Service.
async fn sticky(apiservers: usize) -> (ControlPlane, Client) {
    let topology = Topology { apiservers: vec![Vec::new(); apiservers], common: Vec::new() };
    let control_plane = ControlPlane::start_ha(&topology).await.expect("control plane");
    let client = control_plane.client().await;
    install_kube_svm_crds(&client).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let affinity = json!({ "spec": { "sessionAffinity": "ClientIP" } });
    services
        .patch("kubernetes", &PatchParams::default(), &Patch::Merge(&affinity))
        .await
        .expect("the kubernetes Service takes client-IP affinity");
    (control_plane, client)
}

/// Client-IP affinity on the `kubernetes` Service sends every new connection of a client in the
/// cluster to one apiserver: fresh-connection samples of discovery are then one apiserver's
/// answer asked again, whatever their number. Without the StorageVersion API nothing else shows
/// how the others encode, so the migration runs but its encoding stays unconfirmed, and the
/// CRD's storedVersions are kept, with the affinity named in the condition and the Event.
#[tokio::test]
async fn client_ip_affinity_on_the_kubernetes_service_proves_nothing_by_sampling() {
    let (control_plane, client) = sticky(3).await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let widgets = WidgetCrd::stale(&client, "ha-sticky", 50).await;

    let kubeconfig = control_plane.controller_kubeconfig().await.to_owned();
    let args = [
        "controller",
        "--leader-elect=false",
        "--crd-trigger=true",
        "--storage-version-settle=1",
        "--storage-version-wait=15",
    ];
    let controller = KubeSvm::start_as(&control_plane, "controller", &args, &kubeconfig);
    let migration = wait_for_triggered(&client, &widgets, 1, &controller).await;
    let name = migration.name_any();
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    let deadline = Instant::now() + PHASE;
    let done = loop {
        let migration = migrations.get(&name).await.expect("the migration");
        if Phase::of(&migration).is_terminal() {
            break migration;
        }
        assert!(Instant::now() < deadline, "{name} never ended\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    assert_eq!(Phase::of(&done), Phase::Succeeded, "every widget is written: {:?}", done.status);
    let target = done.status.as_ref().and_then(|s| s.target.clone()).expect("target recorded");
    assert_eq!(
        target.encoding_confirmed,
        Some(false),
        "samples pinned to one apiserver confirmed nothing: {:?}",
        target.encoding_evidence
    );
    let evidence = target.encoding_evidence.unwrap_or_default();
    assert!(evidence.contains("sessionAffinity: ClientIP"), "{evidence}");
    eprintln!("evidence: {evidence}");
    let outcome = invariant::check(&client, &control_plane.etcd(), &widgets, &name, 50).await;
    assert_eq!(outcome.stored_versions, ["v1", "v2"], "storedVersions are kept");
    assert!(!outcome.pruned);
    assert_eq!(outcome.pruned_reason.as_deref(), Some("EncodingUnconfirmed"));
    assert_eq!(outcome.census.count(&widgets.api_version("v2")), 50);
    assert!(
        has_event_saying(&client, &name, "StoredVersionsKept", "sessionAffinity: ClientIP").await,
        "an Event says why storedVersions were kept"
    );
    // The apiservers left the affinity in place all along: the test showed what it meant to.
    let service = services.get("kubernetes").await.expect("the kubernetes Service");
    let affinity = service.spec.and_then(|s| s.session_affinity);
    assert_eq!(affinity.as_deref(), Some("ClientIP"));
}

/// The same affinity, with the discovery trigger: every migration of every resource succeeds
/// and proves nothing. After three such in a row for a hash, the trigger creates no more for it
/// and says why on the StorageState, instead of rewriting every resource at each poll for ever.
#[tokio::test]
async fn resources_that_can_never_be_proven_stop_being_migrated() {
    use kube_svm::trigger::discovery::{HELD_ANNOTATION, TARGET_HASH_ANNOTATION};
    let (control_plane, client) = sticky(2).await;
    let widgets = WidgetCrd::stale(&client, "ha-unprovable", 20).await;
    let kubeconfig = control_plane.controller_kubeconfig().await.to_owned();
    let args = [
        "controller",
        "--leader-elect=false",
        "--discovery-trigger",
        "--discovery-interval=3",
        "--storage-version-settle=0",
        "--concurrency=4",
    ];
    let controller = KubeSvm::start_as(&control_plane, "controller", &args, &kubeconfig);
    let states: Api<StorageState> = Api::all(client.clone());
    let migrations_api: Api<StorageVersionMigration> = Api::all(client.clone());
    let of_widgets = || async {
        let all = migrations_api.list(&ListParams::default()).await.expect("migrations").items;
        let hash = storage_version_hash(&widgets.group, "v2", WidgetCrd::KIND);
        all.into_iter()
            .filter(|m| m.spec.resource.group == widgets.group)
            .filter(|m| m.annotations().get(TARGET_HASH_ANNOTATION) == Some(&hash))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    let held = loop {
        let state = states.get_opt(&widgets.name()).await.expect("read");
        if let Some(why) = state.as_ref().and_then(|s| s.annotations().get(HELD_ANNOTATION)) {
            break why.clone();
        }
        assert!(
            Instant::now() < deadline,
            "never held; {} migrations of the widgets\n{}",
            of_widgets().await,
            controller.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(held.contains("3 migrations in a row succeeded without proving"), "{held}");
    assert!(held.contains("shown to encode in its target"), "{held}");
    let made = of_widgets().await;
    assert_eq!(made, 3, "three runs, then none");
    // Two more polls of the widgets' state (each writes its heartbeat), and still no new run.
    migrations::wait_for_polls(&client, &widgets.name(), 2, &controller).await;
    assert_eq!(of_widgets().await, made, "{}", controller.logs());
}

/// An aggregated API's discovery is proxied by kube-apiserver to the replicas of its own server,
/// over connections kube-apiserver keeps: fresh connections to kube-apiserver do not reach
/// those replicas one by one. Its encoding is never confirmed by sampling, and at once, not
/// after the wait; a CRD's group, served by kube-apiserver itself, is sampled as before.
#[tokio::test]
async fn an_aggregated_api_is_never_confirmed_by_sampling() {
    // A control plane of its own: an aggregated API that is down fails discovery of every group.
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let group = format!("{}.svm.example.com", unique("aggregated"));
    missing_aggregated_api(&client, &group).await;
    let survey = apiservers::survey(&client, &group, "v1").await;
    let refusal = apiservers::sampling(&survey).expect_err("proxied discovery is not sampled");
    assert!(
        matches!(&refusal, apiservers::Unsampleable::Aggregated { service, .. } if service == "default/nothing-here"),
        "{refusal:?}"
    );
    let check = encoding::Check {
        group: group.clone(),
        plural: "things".into(),
        kind: "Thing".into(),
        expected: encoding::Expected::Hash { hash: "AAAAAAAAAAA=".into(), served: "v1".into() },
        generation: 0,
        policy: encoding::EncodingPolicy { settle: Duration::from_secs(1), wait: PHASE },
    };
    let started = Instant::now();
    let requests = Requests::new(control_plane.config().await, Duration::from_secs(30)).unwrap();
    let verdict = encoding::confirm(&requests, &check).await;
    let kube_svm::rules::encoding::Encoding::Unconfirmed(why) = verdict else {
        panic!("confirmed: {verdict:?}")
    };
    assert!(
        why.contains("aggregated API served through the Service default/nothing-here"),
        "{why}"
    );
    assert!(started.elapsed() < PHASE, "refused at once, not after the wait");

    let widgets = WidgetCrd::new("sampled", false);
    widgets.create(&client, "v1").await;
    let survey = apiservers::survey(&client, &widgets.group, "v1").await;
    assert_eq!(survey.aggregated, Ok(None), "a CRD is served by kube-apiserver itself");
    assert!(apiservers::sampling(&survey).is_ok(), "{survey:?}");
}
