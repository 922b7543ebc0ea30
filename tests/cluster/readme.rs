//! The command lines of the README and the docs run as written: every `kubectl` line, with
//! kubectl at the harness's
//! Kubernetes version (where the in-tree migrator's API takes the bare resource name, so only
//! names that find kube-svm's objects work), and its `kube-svm migrate` lines, against a private
//! control plane where kube-svm's controller runs. The outputs are printed (`--nocapture`): the
//! README shows them.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use kube_svm::api::Phase;

use crate::support::Scenario;
use crate::support::fixtures::WidgetCrd;
use crate::support::migrations::{phase_is, wait_for, wait_for_triggered};
use crate::support::process::{KubeSvm, ReadersPath};

/// The lines of the `sh` blocks (README and docs) that start with `prefix`.
fn readme_lines(prefix: &str) -> Vec<String> {
    crate::support::docs::sh_lines(prefix)
}

/// Runs `line` with `sh` from the repository root, as a reader would; returns the exit code and
/// what it printed (standard error after standard output, as a terminal shows them).
fn run(line: &str, path: &str, kubeconfig: &Path, state: &Path) -> (Option<i32>, String) {
    let output = Command::new("sh")
        .arg("-c")
        .arg(format!("exec 2>&1\n{line}"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig)
        .env("XDG_STATE_HOME", state)
        .env_remove("RUST_LOG")
        .output()
        .expect("sh runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("$ {line}\n{text}");
    (output.status.code(), text)
}

#[tokio::test]
async fn the_readmes_kubectl_and_migrate_lines_work_as_written() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;

    // The README's cluster: Secrets, and two CRDs whose storage version went from v1 to v2.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    for i in 0..5 {
        let mut secret = Secret::default();
        secret.metadata.name = Some(format!("s-{i}"));
        secrets.create(&PostParams::default(), &secret).await.expect("a secret");
    }
    let widgets = WidgetCrd { group: "example.com".into(), namespaced: false };
    widgets.create(&client, "v1").await;
    widgets.seed(&client, "v1", &[None], 2000).await;
    widgets.set_storage_version(&client, "v2").await;
    let shop = WidgetCrd { group: "shop.example.com".into(), namespaced: false };
    shop.create(&client, "v1").await;
    shop.seed(&client, "v1", &[None], 40).await;
    shop.set_storage_version(&client, "v2").await;

    // kubectl 1.37, kube-svm and its kubectl plugin name on PATH.
    let readers = ReadersPath::new();
    let path = readers.path.as_str();
    let state = tempfile::tempdir().expect("a directory");
    let admin = control_plane.kubeconfig();
    let (code, version) = run("kubectl version", path, admin, state.path());
    assert_eq!(code, Some(0), "{version}");
    assert!(version.contains("Client Version: v1.37"), "{version}");

    // "Run it once", before any controller: the first `kube-svm migrate` line.
    let migrate = readme_lines("kube-svm migrate ");
    let first = migrate.first().expect("the README shows kube-svm migrate");
    let (code, out) = run(first, path, admin, state.path());
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("widgets.example.com: Succeeded: 2000 objects"), "{out}");
    assert!(out.contains("secrets: Succeeded: 5 objects"), "{out}");
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 2000).await;

    // The controller, with its CRD trigger, migrates the other CRD.
    let controller =
        KubeSvm::start(&control_plane, "controller", &["controller", "--crd-trigger=true"]).await;
    let triggered = wait_for_triggered(&client, &shop, 1, &controller).await;
    let name = triggered.metadata.name.clone().expect("a name");
    wait_for(&client, &name, Duration::from_secs(60), &[&controller], phase_is(Phase::Succeeded))
        .await;

    let lines = readme_lines("kubectl ");
    assert!(lines.len() >= 8, "{lines:#?}");
    for line in &lines {
        let (code, out) = run(line, path, admin, state.path());
        assert_eq!(code, Some(0), "{line}: {out}");
        if line.contains("apply -f config/samples/secrets.yaml") {
            let timeout = Duration::from_secs(60);
            let done = phase_is(Phase::Succeeded);
            wait_for(&client, "secrets-key-rotation", timeout, &[&controller], done).await;
        }
        let expected: &[&str] = match line.as_str() {
            "kubectl get svm" => &["secrets-key-rotation", "secrets", "Succeeded", &name],
            l if l.contains("-o jsonpath='{.status.conditions[0].type}'") => &["Succeeded"],
            l if l.starts_with("kubectl describe svm") => &["Events:", "Succeeded"],
            "kubectl svm status" => &["secrets-key-rotation", "kube-svm", "100%"],
            l if l.contains("-l kube-svm.io/trigger=crd") => &[&name],
            l if l.contains("{.status.storedVersions}") => &[r#"["v2"]"#],
            _ => &[],
        };
        for text in expected {
            assert!(out.contains(text), "{line}: {text:?} not in {out}");
        }
        // kubectl prints the apiserver's warnings (an unknown schema format, say) on stderr.
        assert!(!out.contains("error:") && !out.contains("Warning:"), "{line}: {out}");
    }
}
