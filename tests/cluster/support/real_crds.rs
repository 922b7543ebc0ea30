//! Real CRDs from popular projects, with their own example objects: read from `../shared/crds/`
//! beside the project (its README says where each comes from), never copied into the project.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client, ResourceExt};

/// The folder of real CRDs: `KUBE_SVM_REAL_CRDS`, else `../shared/crds` beside the project.
pub fn folder() -> PathBuf {
    let folder = match std::env::var_os("KUBE_SVM_REAL_CRDS") {
        Some(folder) => PathBuf::from(folder),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/crds"),
    };
    assert!(
        folder.join("index.tsv").is_file(),
        "no real CRDs at {} (set KUBE_SVM_REAL_CRDS to the folder holding index.tsv)",
        folder.display()
    );
    folder
}

/// Every CRD of every project, as its project ships it (`<project>/crds/*.yaml`).
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut files: Vec<PathBuf> = Vec::new();
    for project in read_dir(&folder()) {
        let crds = project.join("crds");
        if crds.is_dir() {
            files.extend(read_dir(&crds).into_iter().filter(|f| is_yaml(f)));
        }
    }
    files.sort();
    files.iter().map(|file| parse(file)).collect()
}

/// The example objects shipped for the CRD `name` (`<project>/examples/<name>--NN.yaml`).
pub fn examples(name: &str) -> Vec<DynamicObject> {
    let mut objects = Vec::new();
    for project in read_dir(&folder()) {
        let examples = project.join("examples");
        if !examples.is_dir() {
            continue;
        }
        let prefix = format!("{name}--");
        let mut files: Vec<PathBuf> = read_dir(&examples)
            .into_iter()
            .filter(|f| f.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)))
            .collect();
        files.sort();
        objects.extend(files.iter().map(|file| parse::<DynamicObject>(file)));
    }
    objects
}

/// Creates every CRD in `crds` and waits until each is established and discovery serves it at
/// every version it serves.
pub async fn install(client: &Client, crds: &[CustomResourceDefinition]) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let mut crd = crd.clone();
        crd.metadata.resource_version = None;
        api.create(&PostParams::default(), &crd).await.unwrap_or_else(|e| {
            panic!("the CRD {} is created: {e}", crd.name_any());
        });
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    for crd in crds {
        loop {
            let now = api.get(&crd.name_any()).await.expect("the CRD reads");
            let conditions = now.status.and_then(|s| s.conditions).unwrap_or_default();
            if conditions.iter().any(|c| c.type_ == "Established" && c.status == "True") {
                break;
            }
            assert!(Instant::now() < deadline, "{} never established", crd.name_any());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for version in crd.spec.versions.iter().filter(|v| v.served) {
            let group_version = format!("{}/{}", crd.spec.group, version.name);
            loop {
                let served = client.list_api_group_resources(&group_version).await;
                let plural = &crd.spec.names.plural;
                if served.is_ok_and(|list| list.resources.iter().any(|r| &r.name == plural)) {
                    break;
                }
                assert!(Instant::now() < deadline, "{group_version} never served {plural}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    // The group list, which discovery walks first, lists each group too.
    loop {
        let groups = client.list_api_groups().await.expect("the API groups");
        let listed = |crd: &CustomResourceDefinition| {
            groups.groups.iter().any(|g| {
                g.name == crd.spec.group
                    && crd
                        .spec
                        .versions
                        .iter()
                        .filter(|v| v.served)
                        .all(|v| g.versions.iter().any(|listed| listed.version == v.name))
            })
        };
        if crds.iter().all(listed) {
            break;
        }
        assert!(Instant::now() < deadline, "the API group list never listed every CRD's group");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates `object` (an example of `crd`) at the version it names, in `namespace` when the CRD is
/// namespaced. Returns whether the apiserver took it: the examples' CEL rules were never
/// evaluated, so a few may be refused.
pub async fn create_example(
    client: &Client,
    crd: &CustomResourceDefinition,
    object: &DynamicObject,
    namespace: &str,
) -> bool {
    let types = object.types.as_ref().expect("an example names its apiVersion and kind");
    let (group, version) = types.api_version.split_once('/').expect("a group/version");
    let gvk = GroupVersionKind::gvk(group, version, &types.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
    let api: Api<DynamicObject> = match crd.spec.scope.as_str() {
        "Namespaced" => Api::namespaced_with(client.clone(), namespace, &resource),
        _ => Api::all_with(client.clone(), &resource),
    };
    let mut object = object.clone();
    object.metadata.namespace = None;
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => true,
        Err(kube::Error::Api(status)) if status.code == 422 || status.code == 400 => {
            eprintln!(
                "example {} of {} refused: {}",
                object.name_any(),
                crd.name_any(),
                status.message
            );
            false
        }
        Err(error) => panic!("example {} of {}: {error}", object.name_any(), crd.name_any()),
    }
}

/// The version `crd` stores its objects in.
pub fn storage_version(crd: &CustomResourceDefinition) -> String {
    let storage = crd.spec.versions.iter().find(|v| v.storage).expect("a storage version");
    storage.name.clone()
}

fn parse<T: serde::de::DeserializeOwned>(file: &Path) -> T {
    let text = std::fs::read_to_string(file).expect("a readable file");
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

fn is_yaml(file: &Path) -> bool {
    file.extension().is_some_and(|e| e == "yaml" || e == "yml")
}

fn read_dir(folder: &Path) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(folder).unwrap_or_else(|e| panic!("{}: {e}", folder.display()));
    entries.map(|entry| entry.expect("a folder entry").path()).collect()
}
