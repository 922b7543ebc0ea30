//! Real CRDs from popular projects (prometheus-operator, cert-manager, Cluster API, Gateway API,
//! Kyverno, Flux), with their own example objects: every one is found at a version that serves
//! it, and a custom resource is written only through its storage version, whatever version its
//! group prefers or its migration names.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use kube_svm::api::{GroupResource, Phase, StorageState, StorageVersionMigration};

use crate::migrate::{migrate, result_line};
use crate::support::Scenario;
use crate::support::migrations::is_terminal;
use crate::support::process::KubeSvm;
use crate::support::real_crds;

/// Served only at versions their groups do not prefer: prometheus-operator's group prefers v1,
/// alertmanagerconfigs serves v1alpha1 (stored) and v1beta1; kyverno.io prefers v2,
/// clusterpolicies serves v1 (stored) and v2beta1.
const NOT_AT_THE_GROUPS_PREFERRED_VERSION: [&str; 2] =
    ["alertmanagerconfigs.monitoring.coreos.com", "clusterpolicies.kyverno.io"];

#[tokio::test]
async fn every_real_crd_is_found_and_written_only_through_its_storage_version() {
    let Scenario { control_plane, client } = Scenario::audited(&[]).await;
    let crds = real_crds::all();
    assert!(crds.len() >= 70, "the real CRDs are read ({})", crds.len());
    real_crds::install(&client, &crds).await;
    let by_name: BTreeMap<String, &CustomResourceDefinition> =
        crds.iter().map(|crd| (crd.name_any(), crd)).collect();
    for name in NOT_AT_THE_GROUPS_PREFERRED_VERSION {
        let crd = by_name[name];
        let mut created = 0;
        for example in real_crds::examples(name) {
            created +=
                usize::from(real_crds::create_example(&client, crd, &example, "default").await);
        }
        assert!(created > 0, "an example of {name} is created");
    }

    // `kube-svm migrate` finds each at its storage version.
    let state = tempfile::tempdir().expect("a directory");
    let (code, out) =
        migrate(control_plane.kubeconfig(), state.path(), &NOT_AT_THE_GROUPS_PREFERRED_VERSION);
    assert_eq!(code, Some(0), "{out}");
    for name in NOT_AT_THE_GROUPS_PREFERRED_VERSION {
        assert!(result_line(&out, name).contains("Succeeded"), "{out}");
    }

    // The discovery trigger keeps a StorageState for every one, and migrates them through the
    // version its migrations name (the first its group serves it at, not its storage version).
    let controller = KubeSvm::start(
        &control_plane,
        "controller",
        &[
            "controller",
            "--leader-elect=false",
            "--crd-trigger=false",
            "--discovery-trigger",
            "--pace=fast",
            "--storage-version-settle=0",
        ],
    )
    .await;
    let states: Api<StorageState> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let listed = states.list(&ListParams::default()).await.expect("StorageStates");
        let have: Vec<String> = listed.items.iter().map(ResourceExt::name_any).collect();
        let missing: Vec<&String> = by_name.keys().filter(|name| !have.contains(name)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} CRDs have no StorageState: {missing:?}\n{}",
            missing.len(),
            controller.logs()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    for name in NOT_AT_THE_GROUPS_PREFERRED_VERSION {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let listed = migrations.list(&ListParams::default()).await.expect("migrations");
            let of_it: Vec<&StorageVersionMigration> = listed
                .items
                .iter()
                .filter(|m| {
                    GroupResource::name_of(&m.spec.resource.group, &m.spec.resource.resource)
                        == name
                })
                .collect();
            if let Some(done) = of_it.iter().find(|m| is_terminal(m)) {
                assert_eq!(Phase::of(done), Phase::Succeeded, "{name}: {:?}", done.status);
                break;
            }
            assert!(Instant::now() < deadline, "{name} never migrated\n{}", controller.logs());
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    // Every write to a custom resource went through its storage version.
    let mut written: BTreeMap<String, usize> = BTreeMap::new();
    for event in control_plane.audit_events() {
        let Some(object) = event.object_ref.as_ref().filter(|_| event.verb == "patch") else {
            continue;
        };
        let name = format!("{}.{}", object.resource, object.api_group);
        let Some(crd) = by_name.get(&name) else { continue };
        assert_eq!(
            object.api_version,
            real_crds::storage_version(crd),
            "{name} written through a version it does not store: {event:?}"
        );
        *written.entry(name).or_default() += 1;
    }
    for name in NOT_AT_THE_GROUPS_PREFERRED_VERSION {
        assert!(written.get(name).is_some_and(|n| *n > 0), "{name} was written: {written:?}");
    }
}
