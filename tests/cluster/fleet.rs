//! `kube-svm status` and `plan --drop` asking several clusters at once: one migrated (v1 can be
//! dropped), one still holding v1 without kube-svm installed, one that cannot be reached and one
//! that never answers.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use serde_yaml_ng::Value as Yaml;

use crate::support::fixtures::WidgetCrd;
use crate::support::process::binary;
use crate::support::{ControlPlane, Scenario, free_port};

/// A server that accepts connections and never answers: the kernel completes the handshake
/// for the listening socket, and nothing reads from it.
fn silent() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").expect("a listening socket")
}

/// The one context of the harness's kubeconfig at `path`, its cluster, user and context all
/// renamed `name`, and its server at `port` when given.
fn renamed(path: &Path, name: &str, port: Option<u16>) -> [Yaml; 3] {
    let text = std::fs::read_to_string(path).expect("a readable kubeconfig");
    let config: Yaml = serde_yaml_ng::from_str(&text).expect("a kubeconfig");
    let first = |list: &str| config[list][0].clone();
    let (mut cluster, mut user, mut context) =
        (first("clusters"), first("users"), first("contexts"));
    for entry in [&mut cluster, &mut user, &mut context] {
        entry["name"] = name.into();
    }
    context["context"]["cluster"] = name.into();
    context["context"]["user"] = name.into();
    if let Some(port) = port {
        cluster["cluster"]["server"] = format!("https://127.0.0.1:{port}").into();
    }
    [cluster, user, context]
}

/// A kubeconfig holding `contexts`, in their order.
fn kubeconfig(dir: &Path, file: &str, contexts: &[[Yaml; 3]]) -> std::path::PathBuf {
    let column = |i: usize| Yaml::Sequence(contexts.iter().map(|c| c[i].clone()).collect());
    let mut config = serde_yaml_ng::Mapping::new();
    config.insert("apiVersion".into(), "v1".into());
    config.insert("kind".into(), "Config".into());
    config.insert("clusters".into(), column(0));
    config.insert("users".into(), column(1));
    config.insert("contexts".into(), column(2));
    config.insert("current-context".into(), contexts[0][2]["name"].clone());
    let path = dir.join(file);
    std::fs::write(&path, serde_yaml_ng::to_string(&config).expect("YAML")).expect("written");
    path
}

/// `kube-svm <args> --kubeconfig <kubeconfig>`: its exit code and standard output.
fn kube_svm(kubeconfig: &Path, args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(binary())
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .expect("kube-svm runs");
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    (output.status.code(), String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The cells of the table row of `context`.
fn row(table: &str, context: &str) -> Vec<String> {
    let line = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(context))
        .unwrap_or_else(|| panic!("no row for {context}:\n{table}"));
    line.split_whitespace().map(str::to_owned).collect()
}

/// The JSON entry of `context`.
fn cluster<'a>(answers: &'a Value, context: &str) -> &'a Value {
    let clusters = answers["clusters"].as_array().expect("clusters");
    clusters.iter().find(|c| c["context"] == context).unwrap_or_else(|| panic!("{answers:#}"))
}

#[tokio::test]
async fn asks_every_cluster_and_says_which_did_not_answer() {
    // Migrated: v2 is the storage version and the only stored one, v1 no longer served.
    let migrated = Scenario::shared().await;
    let widgets = WidgetCrd::new("fleet", false);
    widgets.create(&migrated.client, "v2").await;
    widgets.seed(&migrated.client, "v2", &[None], 3).await;
    widgets.set_served(&migrated.client, "v1", false).await;
    // Stale: the same CRD still stored in v1 by objects created at v1, and no kube-svm.
    let stale = ControlPlane::start(&[]).await.expect("a private control plane starts");
    let stale_client = stale.client().await;
    let same = WidgetCrd { group: widgets.group.clone(), namespaced: false };
    same.create(&stale_client, "v1").await;
    same.seed(&stale_client, "v1", &[None], 3).await;
    same.set_storage_version(&stale_client, "v2").await;

    let dir = tempfile::tempdir().expect("a directory");
    let migrated_path = migrated.control_plane.kubeconfig();
    let gone = free_port().expect("a free port");
    let fleet = kubeconfig(
        dir.path(),
        "fleet",
        &[
            renamed(migrated_path, "migrated", None),
            renamed(stale.kubeconfig(), "stale", None),
            renamed(migrated_path, "gone", Some(gone)),
        ],
    );
    let name = widgets.name();
    let drop = ["plan", "--drop", "v1", name.as_str()];
    let drop_at = |contexts: &[&str], json: bool| {
        let mut args = drop.to_vec();
        args.extend(contexts.iter().flat_map(|c| ["--context", c]));
        // Listing every object for ownerReferences takes a while on a busy shared control plane.
        args.extend(["--timeout", "120"]);
        if json {
            args.extend(["-o", "json"]);
        }
        kube_svm(&fleet, &args)
    };

    // One context is one cluster, as always.
    let (code, table) = drop_at(&["migrated"], false);
    assert_eq!(code, Some(0), "{table}");
    assert!(table.starts_with(&format!("v1 can be removed from {name}")), "{table}");

    let all = ["migrated", "stale", "gone"];
    // The docs' command, whose output they show (`--nocapture`).
    let (code, table) = drop_at(&all, false);
    println!(
        "$ kube-svm plan --drop v1 {name} --context migrated --context stale --context gone\n{table}"
    );
    assert_eq!(code, Some(1), "a cluster did not answer:\n{table}");
    assert_eq!(row(&table, "CONTEXT"), ["CONTEXT", "KUBE-SVM", "REMOVABLE", "BLOCKERS"]);
    assert_eq!(row(&table, "migrated"), ["migrated", "installed", "yes", "-"], "{table}");
    assert_eq!(
        row(&table, "stale")[..6],
        ["stale", "not", "installed", "no", "StoredVersions,", "Served,"],
        "{table}"
    );
    assert!(row(&table, "stale").contains(&"ManagedFields".to_owned()), "{table}");
    assert_eq!(row(&table, "gone")[..4], ["gone", "-", "-", "unreachable:"], "{table}");

    let (code, out) = drop_at(&all, true);
    assert_eq!(code, Some(1), "{out}");
    let answers: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("JSON: {out}"));
    let first = cluster(&answers, "migrated");
    assert_eq!(
        (&first["state"], &first["reachable"], &first["installed"], &first["error"]),
        (&json!("answered"), &json!(true), &json!(true), &Value::Null),
        "{answers:#}"
    );
    assert_eq!(
        (&first["answer"]["removable"], &first["answer"]["blockers"]),
        (&json!(true), &json!([]))
    );
    let second = cluster(&answers, "stale");
    assert_eq!(
        (&second["installed"], &second["answer"]["removable"]),
        (&json!(false), &json!(false))
    );
    assert_eq!(second["answer"]["blockers"][0]["blocker"], "StoredVersions", "{answers:#}");
    let third = cluster(&answers, "gone");
    assert_eq!(
        (&third["state"], &third["reachable"], &third["installed"]),
        (&json!("unreachable"), &json!(false), &Value::Null),
        "{answers:#}"
    );
    assert!(third["error"].as_str().is_some_and(|e| !e.is_empty()), "{answers:#}");
    assert!(third.get("answer").is_none(), "{answers:#}");

    // Every cluster answered, and one cannot drop v1.
    let (code, out) = drop_at(&["migrated", "stale"], true);
    assert_eq!(code, Some(3), "{out}");

    // status: every context of the kubeconfig.
    let (code, table) = kube_svm(&fleet, &["status", "--all-contexts"]);
    println!("$ kube-svm status --all-contexts\n{table}");
    assert_eq!(code, Some(1), "{table}");
    assert_eq!(row(&table, "migrated")[..2], ["migrated", "installed"], "{table}");
    assert_eq!(row(&table, "stale"), ["stale", "not", "installed", "0", "0", "0", "0", "-"]);
    assert_eq!(row(&table, "gone")[..7], ["gone", "-", "-", "-", "-", "-", "unreachable:"]);
    let (code, out) =
        kube_svm(&fleet, &["status", "--context=migrated", "--context=stale", "-o", "json"]);
    assert_eq!(code, Some(0), "{out}");
    let answers: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("JSON: {out}"));
    assert!(cluster(&answers, "migrated")["answer"].is_array(), "{answers:#}");
    assert_eq!(cluster(&answers, "stale")["answer"], json!([]), "{answers:#}");

    // A cluster that takes the connection and never answers is cut off at --timeout.
    let listener = silent();
    let port = listener.local_addr().expect("an address").port();
    let quiet = kubeconfig(
        dir.path(),
        "quiet",
        &[renamed(migrated_path, "silent", Some(port)), renamed(migrated_path, "gone", Some(gone))],
    );
    let (code, out) =
        kube_svm(&quiet, &["status", "--all-contexts", "--timeout", "1", "-o", "json"]);
    assert_eq!(code, Some(1), "{out}");
    let answers: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("JSON: {out}"));
    let silent = cluster(&answers, "silent");
    assert_eq!(
        (&silent["state"], &silent["reachable"], &silent["error"]),
        (&json!("timed-out"), &json!(false), &json!("did not answer within 1s")),
        "{answers:#}"
    );
    assert_eq!(cluster(&answers, "gone")["state"], "unreachable", "{answers:#}");
}
