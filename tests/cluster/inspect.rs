//! `kube-svm inspect` run as a process against the harness's etcd: the census counts exactly
//! what the apiserver stored, by stored version and by encryption key.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Output};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::support::fixtures::{
    KEY1, KEY2, WidgetCrd, create_namespace, encrypt_secrets, secrets_under_key1, unique,
};
use crate::support::process::binary;
use crate::support::recorder::Recorder;
use crate::support::{SecureEtcd, shared};

fn inspect(args: &[&str]) -> Output {
    Command::new(binary()).arg("inspect").args(args).output().expect("kube-svm runs")
}

/// The standard output of a run that must succeed.
fn stdout(output: Output) -> String {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("utf-8")
}

/// The standard error of a run that must fail.
fn failure(output: Output) -> String {
    assert!(!output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
    String::from_utf8(output.stderr).expect("utf-8")
}

fn json_report(args: &[&str]) -> Value {
    let args: Vec<&str> = args.iter().copied().chain(["-o", "json"]).collect();
    serde_json::from_str(&stdout(inspect(&args))).expect("a JSON report")
}

/// The report's entry for `key_prefix`.
fn row<'a>(report: &'a Value, key_prefix: &str) -> &'a Value {
    let resources = report["resources"].as_array().expect("resources");
    let found = resources.iter().find(|r| r["keyPrefix"] == key_prefix);
    found.unwrap_or_else(|| panic!("no {key_prefix} in {report:#}"))
}

fn counts(entries: &[(&str, u64)]) -> Value {
    let map: BTreeMap<&str, u64> = entries.iter().copied().collect();
    json!(map)
}

/// CRs stored at v1 and v2 after a partial rewrite are counted exactly, an empty CRD counts
/// zero, and `--list` prints exactly the keys still at v1.
#[tokio::test]
async fn counts_a_partial_migration_exactly() {
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let etcd = control_plane.etcd();
    let widgets = WidgetCrd::stale(&client, "census", 30).await;
    let touch = json!({ "metadata": { "labels": { "touched": "yes" } } });
    let api = widgets.api(&client, "v2", None);
    for i in 0..12 {
        api.patch(&format!("w-{i}"), &PatchParams::default(), &Patch::Merge(&touch))
            .await
            .expect("rewritten at v2");
    }
    let empty = WidgetCrd::new("census-empty", false);
    empty.create(&client, "v1").await;
    let (resource, nothing) = (widgets.name(), empty.name());

    let raw = etcd.list(&widgets.etcd_prefix()).await.expect("etcd");
    let report = json_report(&[&resource, &nothing, "--etcd-endpoints", etcd.url()]);
    let found = row(&report, &widgets.etcd_prefix());
    assert_eq!(found["group"], widgets.group.as_str());
    assert_eq!(found["resource"], "widgets");
    assert_eq!(found["objects"], 30);
    let (v1, v2) = (widgets.api_version("v1"), widgets.api_version("v2"));
    assert_eq!(found["apiVersions"], counts(&[(&v1, 18), (&v2, 12)]));
    assert_eq!((found["unencrypted"].clone(), found["encryption"].clone()), (json!(30), json!([])));
    let oldest = raw.iter().map(|kv| kv.mod_revision).min().expect("widgets");
    assert_eq!(found["oldestModRevision"], oldest);
    let newest = raw.iter().map(|kv| kv.mod_revision).max().expect("widgets");
    assert!(report["etcdRevision"].as_i64().expect("revision") >= newest);
    let none = row(&report, &empty.etcd_prefix());
    assert_eq!((none["objects"].clone(), none["apiVersions"].clone()), (json!(0), json!({})));
    assert!(none.get("oldestModRevision").is_none(), "{none}");

    let listed = stdout(inspect(&[&resource, "--list", &v1, "--etcd-endpoints", etcd.url()]));
    let listed: BTreeSet<&str> = listed.lines().collect();
    let still_v1: BTreeSet<&str> =
        raw.iter().filter(|kv| kv.api_version() == v1).map(|kv| kv.key.as_str()).collect();
    assert_eq!((listed.len(), &listed), (18, &still_v1));

    let table = stdout(inspect(&[&resource, "--etcd-endpoints", etcd.url()]));
    let line = table.lines().find(|l| l.starts_with(&resource)).expect("a row");
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[..4], [resource.as_str(), "30", v1.as_str(), "18"], "{table}");
}

/// Built-in resources are stored as protobuf: their apiVersion comes from the envelope, and a
/// census of everything finds them under their resource name with the group the values name.
#[tokio::test]
async fn reads_built_in_resources_from_their_protobuf_envelope() {
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let etcd = control_plane.etcd();
    let namespace = unique("census");
    create_namespace(&client, &namespace).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    for i in 0..3 {
        let configmap = serde_json::from_value(json!({ "metadata": { "name": format!("c-{i}") } }))
            .expect("valid");
        configmaps.create(&PostParams::default(), &configmap).await.expect("created");
    }
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": { "name": "web" },
        "spec": {
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": { "containers": [{ "name": "web", "image": "registry.example/web:1" }] },
            },
        },
    }))
    .expect("valid");
    Api::<Deployment>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &deployment)
        .await
        .expect("created");

    let (configmap_keys, deployment_keys) =
        (format!("/registry/configmaps/{namespace}"), format!("/registry/deployments/{namespace}"));
    let report = json_report(&[&configmap_keys, &deployment_keys, "--etcd-endpoints", etcd.url()]);
    let found = row(&report, &format!("{configmap_keys}/"));
    assert_eq!(
        (found["objects"].clone(), found["apiVersions"].clone()),
        (json!(3), counts(&[("v1", 3)]))
    );
    let found = row(&report, &format!("{deployment_keys}/"));
    assert_eq!(found["apiVersions"], counts(&[("apps/v1", 1)]));

    let named = json_report(&["configmaps", "deployments.apps", "--etcd-endpoints", etcd.url()]);
    let found = row(&named, "/registry/configmaps/");
    assert_eq!(
        (found["group"].clone(), found["resource"].clone()),
        (json!(""), json!("configmaps"))
    );
    assert!(found["apiVersions"]["v1"].as_u64().expect("v1 configmaps") >= 3);
    assert!(row(&named, "/registry/deployments/")["objects"].as_u64().expect("count") >= 1);

    WidgetCrd::new("census-everything", false).create(&client, "v1").await;
    let everything = json_report(&["--etcd-endpoints", etcd.url()]);
    let found = row(&everything, "/registry/deployments/");
    assert_eq!(
        (found["group"].clone(), found["resource"].clone()),
        (json!("apps"), json!("deployments"))
    );
    let crds = row(&everything, "/registry/apiextensions.k8s.io/customresourcedefinitions/");
    assert_eq!(crds["group"], "apiextensions.k8s.io");
    // kube-apiserver 1.37 still stores CRDs as apiextensions.k8s.io/v1beta1.
    let versions = crds["apiVersions"].as_object().expect("versions");
    assert!(crds["objects"].as_u64().is_some_and(|n| n >= 1), "{crds:#}");
    assert!(versions.keys().all(|v| v.starts_with("apiextensions.k8s.io/")), "{crds:#}");
}

/// Mistakes give one clear line: a wrong prefix, an etcd that does not answer, https without
/// the CA to check it.
#[tokio::test]
async fn mistakes_are_named() {
    let etcd = shared().await.etcd();
    let message =
        failure(inspect(&["secrets", "--etcd-prefix", "/nothing", "--etcd-endpoints", etcd.url()]));
    assert!(
        message.contains("etcd holds no key under /nothing/: is --etcd-prefix right?"),
        "{message}"
    );
    // A misspelt resource is no error (an empty resource is not either), but it is noted.
    let misspelt = inspect(&["deployment.apps", "--etcd-endpoints", etcd.url()]);
    let note = String::from_utf8_lossy(&misspelt.stderr);
    assert!(misspelt.status.success(), "{note}");
    assert!(note.contains("note: etcd holds no key under /registry/deployment/"), "{note}");
    let message = failure(inspect(&["secrets", "--etcd-endpoints", "http://127.0.0.1:1"]));
    assert!(
        message.contains("no etcd endpoint answered (last tried http://127.0.0.1:1)"),
        "{message}"
    );
    let message = failure(inspect(&["secrets", "--etcd-endpoints", "https://127.0.0.1:1"]));
    assert!(message.contains("give etcd's CA certificate with --etcd-ca"), "{message}");
    let message = failure(inspect(&["secrets"]));
    assert!(message.contains("--etcd-endpoints"), "{message}");
}

/// After a partial key rotation, Secrets are counted by encryption key without being
/// decrypted, and `--list` names the ones still under the old key.
#[tokio::test]
async fn counts_secrets_by_encryption_key() {
    let (control_plane, namespace) = secrets_under_key1(10).await;
    control_plane
        .restart_apiserver(&[&encrypt_secrets(&control_plane, &[KEY2, KEY1])])
        .await
        .expect("restarts with key2 first");
    let client = control_plane.client().await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let touch = json!({ "metadata": { "labels": { "rotated": "yes" } } });
    for i in 0..4 {
        secrets
            .patch(&format!("s-{i}"), &PatchParams::default(), &Patch::Merge(&touch))
            .await
            .expect("rewritten with key2");
    }

    let etcd = control_plane.etcd();
    let keys = format!("/registry/secrets/{namespace}");
    let report = json_report(&[&keys, "--etcd-endpoints", etcd.url()]);
    let found = row(&report, &format!("{keys}/"));
    assert_eq!(found["objects"], 10);
    assert_eq!(
        found["encryption"],
        json!([
            { "provider": "aescbc", "key": "key1", "objects": 6 },
            { "provider": "aescbc", "key": "key2", "objects": 4 },
        ])
    );
    assert_eq!((found["unencrypted"].clone(), found["apiVersions"].clone()), (json!(0), json!({})));
    let listed = stdout(inspect(&[&keys, "--list", "aescbc:key1", "--etcd-endpoints", etcd.url()]));
    let expected: Vec<String> = (4..10).map(|i| format!("{keys}/s-{i}")).collect();
    assert_eq!(listed.lines().collect::<Vec<_>>(), expected);
    let table = stdout(inspect(&[&keys, "--etcd-endpoints", etcd.url()]));
    assert!(!table.contains("value-"), "a value leaked: {table}");
    // The README's command, whose output it shows (`--nocapture`).
    let named = ["secrets", "configmaps", "deployments.apps", "--etcd-endpoints", etcd.url()];
    let table = stdout(inspect(&named));
    println!("$ kube-svm inspect {}\n{table}", named.join(" "));
    let secrets = table.lines().find(|l| l.starts_with("secrets ")).expect("a secrets row");
    assert!(secrets.contains("aescbc:key1 6"), "{table}");

    let all = Api::<Secret>::all(client).list(&Default::default()).await.expect("listed");
    let whole = json_report(&["secrets", "--etcd-endpoints", etcd.url()]);
    assert_eq!(row(&whole, "/registry/secrets/")["objects"], all.items.len());
}

/// Against an etcd that requires client certificates: the census works with the CA,
/// certificate and key, and says why it cannot without them.
#[tokio::test]
async fn speaks_tls_with_client_certificates() {
    let etcd = SecureEtcd::start().await.expect("a secure etcd starts");
    let prefix = "/registry/example.com/widgets/";
    for (name, version) in [("a", "v1"), ("b", "v1"), ("c", "v2")] {
        let value = json!({ "apiVersion": format!("example.com/{version}"), "kind": "Widget" });
        etcd.plain
            .put(&format!("{prefix}{name}"), value.to_string().as_bytes())
            .await
            .expect("put");
    }
    let file = |name: &str| etcd.file(name).display().to_string();
    let (ca, cert, key) = (file("ca.crt"), file("client.crt"), file("client.key"));
    // `inspect widgets.example.com` against `endpoints`, trusting `ca`, with the client
    // certificate when `identity` is set.
    let args = |endpoints: &str, ca: &str, identity: bool| {
        let mut args: Vec<String> =
            ["widgets.example.com", "--etcd-endpoints", endpoints, "--etcd-ca", ca]
                .map(str::to_owned)
                .to_vec();
        if identity {
            args.extend(["--etcd-cert".into(), cert.clone(), "--etcd-key".into(), key.clone()]);
        }
        args.extend(["-o".into(), "json".into()]);
        args
    };
    let run = |args: Vec<String>| inspect(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let found = stdout(run(args(&etcd.https_url, &ca, true)));
    let report: Value = serde_json::from_str(&found).expect("a JSON report");
    assert_eq!(
        row(&report, prefix)["apiVersions"],
        counts(&[("example.com/v1", 2), ("example.com/v2", 1)])
    );

    let anonymous = failure(run(args(&etcd.https_url, &ca, false)));
    assert!(anonymous.contains("no etcd endpoint answered"), "{anonymous}");
    let untrusted = failure(run(args(&etcd.https_url, &file("other-ca.crt"), true)));
    assert!(untrusted.contains("no etcd endpoint answered"), "{untrusted}");
    // A second endpoint is tried when the first does not answer.
    let endpoints = format!("https://127.0.0.1:1,{}", etcd.https_url);
    let found = stdout(run(args(&endpoints, &ca, true)));
    let failover: Value = serde_json::from_str(&found).expect("a JSON report");
    assert_eq!(row(&failover, prefix)["objects"], 3);
}

/// inspect reads only from the endpoints it is given: a redirect is an error that names where it
/// pointed, and that place receives nothing (a followed 307 or 308 sends the POST there again,
/// body and all; a 302 sends a GET).
#[test]
fn a_redirect_is_refused_not_followed() {
    let range = r#"{"header":{"revision":"7"},"count":"0"}"#;
    for status in ["307 Temporary Redirect", "308 Permanent Redirect", "302 Found"] {
        let elsewhere = Recorder::answering("200 OK", &[], range);
        let target = format!("{}/v3/kv/range", elsewhere.url());
        let redirecting = Recorder::answering(status, &[("Location", &target)], "");
        let output = inspect(&["secrets", "--etcd-endpoints", redirecting.url()]);
        assert_eq!(elsewhere.requests(), Vec::<String>::new(), "{status} was followed");
        let message = failure(output);
        assert!(message.contains("redirect") && message.contains(&target), "{status}: {message}");
        assert_eq!(redirecting.requests().len(), 1, "{status}");
    }
}

/// The proxy variables of the environment are ignored: a census of the real etcd with
/// HTTP_PROXY, HTTPS_PROXY and ALL_PROXY all pointing at a recording proxy sends it nothing
/// (through a proxy, an http:// endpoint's answers, raw Secrets included, would pass in the
/// clear). A proxy given with --etcd-proxy is used.
#[tokio::test]
async fn proxies_are_used_only_when_given_explicitly() {
    let etcd = shared().await.etcd();
    let proxy = Recorder::answering("502 Bad Gateway", &[], r#"{"message":"a recording proxy"}"#);
    let mut command = Command::new(binary());
    command.args(["inspect", "namespaces", "--etcd-endpoints", etcd.url(), "-o", "json"]);
    for variable in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        command.env(variable, proxy.url()).env(variable.to_lowercase(), proxy.url());
    }
    let output = command.env_remove("NO_PROXY").env_remove("no_proxy").output().expect("runs");
    assert_eq!(proxy.requests(), Vec::<String>::new(), "a request went through the proxy");
    let report: Value = serde_json::from_str(&stdout(output)).expect("a JSON report");
    let namespaces = &row(&report, "/registry/namespaces/")["objects"];
    assert!(namespaces.as_u64().is_some_and(|n| n >= 1), "{report:#}");

    let message = failure(inspect(&[
        "namespaces",
        "--etcd-endpoints",
        etcd.url(),
        "--etcd-proxy",
        proxy.url(),
    ]));
    let sent = proxy.requests();
    assert!(sent.first().is_some_and(|r| r.contains("/v3/kv/range")), "{sent:?}");
    assert!(message.contains("HTTP 502"), "{message}");
}
