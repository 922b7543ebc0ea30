//! The Helm chart in `charts/kube-svm`, rendered with the helm binary `make test` provides
//! (`HELM`, built by `hack/helm.sh`), and applied to a test control plane.
//!
//! Controllers in tests run as the chart's ServiceAccount: an impersonating kubeconfig, bound only
//! to the ClusterRole and Role rendered from the chart, so the chart's RBAC is proven by use.

use std::path::{Path, PathBuf};
use std::process::Command;

use kube::api::{Patch, PatchParams};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::discovery::{Scope, pinned_kind};
use kube::{Api, Client};

use super::control_plane::ControlPlane;
use serde::Deserialize as _;

/// Where the chart lives.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/kube-svm")
}

/// The helm binary: `HELM`, as `make test` sets it.
pub fn helm() -> PathBuf {
    match std::env::var_os("HELM") {
        Some(path) => PathBuf::from(path),
        None => panic!("no helm binary: set HELM (`make test` builds it with hack/helm.sh)"),
    }
}

/// Runs helm with `args`; returns its standard output, or its standard error as the error.
pub fn run_helm(args: &[&str]) -> Result<String, String> {
    let output = Command::new(helm()).args(args).output().expect("helm runs");
    match output.status.success() {
        true => Ok(String::from_utf8(output.stdout).expect("helm prints UTF-8")),
        false => Err(String::from_utf8_lossy(&output.stderr).into_owned()),
    }
}

/// `helm template <release> charts/kube-svm --namespace <namespace> <args>`.
pub fn render(release: &str, namespace: &str, args: &[&str]) -> String {
    let chart = chart_dir();
    let mut all = vec!["template", release, chart.to_str().expect("UTF-8 path")];
    all.extend(["--namespace", namespace]);
    all.extend(args);
    run_helm(&all).unwrap_or_else(|error| panic!("helm template {args:?} fails: {error}"))
}

/// The objects of a multi-document YAML stream (empty documents skipped).
pub fn objects(yaml: &str) -> Vec<DynamicObject> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .filter_map(|document| {
            let value = serde_yaml_ng::Value::deserialize(document).expect("valid YAML");
            (!value.is_null())
                .then(|| serde_yaml_ng::from_value(value).expect("a Kubernetes object"))
        })
        .collect()
}

/// Applies `objects` server-side as the admin, for real or as a dry run; the first error is
/// returned with the object it is about.
pub async fn apply(
    client: &Client,
    objects: &[DynamicObject],
    dry_run: bool,
) -> Result<(), String> {
    let mut params = PatchParams::apply("kube-svm-tests").force();
    params.dry_run = dry_run;
    for object in objects {
        let types = object.types.as_ref().ok_or("an object without apiVersion and kind")?;
        let gvk = GroupVersionKind::try_from(types).map_err(|error| error.to_string())?;
        let (resource, capabilities) =
            pinned_kind(client, &gvk).await.map_err(|error| format!("{}: {error}", types.kind))?;
        let name = object.metadata.name.clone().ok_or("an object without a name")?;
        let api: Api<DynamicObject> = match (capabilities.scope, &object.metadata.namespace) {
            (Scope::Namespaced, Some(namespace)) => {
                Api::namespaced_with(client.clone(), namespace, &resource)
            }
            (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &resource),
            (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
        };
        api.patch(&name, &params, &Patch::Apply(object))
            .await
            .map_err(|error| format!("{} {name}: {error}", types.kind))?;
    }
    Ok(())
}

/// Installs the chart's ServiceAccount, RBAC and the probe's ConfigMap (release `release` in
/// `namespace`, with helm `args`) and returns the name the ServiceAccount authenticates as.
pub async fn install_service_account(
    client: &Client,
    release: &str,
    namespace: &str,
    args: &[&str],
) -> String {
    let mut all = vec!["--show-only", "templates/serviceaccount.yaml"];
    all.extend(["--show-only", "templates/rbac.yaml"]);
    all.extend(["--show-only", "templates/probe.yaml"]);
    all.extend(args);
    let namespace_object =
        format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n");
    let mut rendered = objects(&namespace_object);
    rendered.extend(objects(&render(release, namespace, &all)));
    let account = rendered
        .iter()
        .find(|object| object.types.as_ref().is_some_and(|t| t.kind == "ServiceAccount"))
        .and_then(|object| object.metadata.name.clone())
        .expect("the chart renders a ServiceAccount");
    apply(client, &rendered, false).await.expect("the chart's RBAC applies");
    format!("system:serviceaccount:{namespace}:{account}")
}

/// Installs the chart's policy on the writes of its ServiceAccount (`admissionPolicy.writes`, on
/// by default) for release `release` in `namespace`, whose ServiceAccount is `account`
/// (`system:serviceaccount:...`), and returns once the apiserver enforces it: a change that
/// `account` writes to a ConfigMap of `namespace` is refused by the policy.
pub async fn install_write_policy(
    control_plane: &ControlPlane,
    release: &str,
    namespace: &str,
    account: &str,
) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let client = control_plane.client().await;
    let args = ["--show-only", "templates/write-policy.yaml"];
    let rendered = objects(&render(release, namespace, &args));
    assert!(!rendered.is_empty(), "the chart renders the write policy");
    apply(&client, &rendered, false).await.expect("the policy on kube-svm's writes applies");

    let name = "write-policy-check";
    let check = serde_json::json!({ "metadata": { "name": name }, "data": { "mode": "safe" } });
    let check: ConfigMap = serde_json::from_value(check).expect("a ConfigMap");
    let admin: Api<ConfigMap> = Api::namespaced(client, namespace);
    admin.create(&Default::default(), &check).await.expect("the check's ConfigMap is created");
    let mut config = control_plane.config().await;
    config.auth_info.impersonate = Some(account.to_owned());
    let as_kube_svm: Api<ConfigMap> =
        Api::namespaced(Client::try_from(config).expect("a client"), namespace);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    for attempt in 0.. {
        // A new value each time: a write that changes nothing is one the policy lets through.
        let change = Patch::Merge(serde_json::json!({ "data": { "mode": attempt.to_string() } }));
        match as_kube_svm.patch(name, &PatchParams::default(), &change).await {
            Err(kube::Error::Api(status))
                if status.code == 403 && status.message.contains("as they are") =>
            {
                break;
            }
            answer => {
                let answer = answer.map(|_| "written");
                assert!(std::time::Instant::now() < deadline, "never enforced: {answer:?}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
    admin.delete(name, &Default::default()).await.expect("the check's ConfigMap is deleted");
}
