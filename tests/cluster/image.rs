//! The container image `make image` builds, checked as it will run: its config says what the
//! chart's Deployment relies on, and kube-svm started from its root filesystem alone, as the
//! chart's pod (its user, its arguments, its ServiceAccount's token and RBAC, in-cluster
//! configuration), migrates a stale CRD, as etcd shows.

use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;
use kube_svm::api::Phase;
use serde_json::Value;

use crate::support::chart::{self, objects, render};
use crate::support::fixtures::WidgetCrd;
use crate::support::image::{Image, Pod, layout};
use crate::support::migrations::{phase_is, wait_for, wait_for_triggered};
use crate::support::{CONTROLLER_NAMESPACE, Scenario, free_port, http_client, invariant};

/// Widgets the image's controller migrates.
const WIDGETS: usize = 200;

fn git(args: &[&str]) -> String {
    let output = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git runs");
    assert!(output.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("UTF-8").trim().to_owned()
}

fn strings(value: &Value) -> Vec<&str> {
    value.as_array().into_iter().flatten().filter_map(Value::as_str).collect()
}

/// The image is of this commit and this version, for this machine, runs `kube-svm controller`
/// as the user the chart's pods run as, and carries the commit's time, not the build's.
#[test]
fn the_image_config_says_what_the_chart_relies_on() {
    let image = Image::open(&layout());
    let head = git(&["rev-parse", "HEAD"]);
    let labels = image.setting("Labels");
    let revision = labels["org.opencontainers.image.revision"].as_str().unwrap_or_default();
    assert_eq!(revision, head, "the image is of another commit: run `make image`");
    assert_eq!(labels["org.opencontainers.image.version"], env!("CARGO_PKG_VERSION"));
    let source = labels["org.opencontainers.image.source"].as_str().unwrap_or_default();
    assert!(source.starts_with("https://"), "a source URL: {source:?}");

    let architecture = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    assert_eq!(
        (&image.config["os"], &image.config["architecture"]),
        (&"linux".into(), &architecture.into())
    );
    assert_eq!(strings(image.setting("Entrypoint")), ["/usr/local/bin/kube-svm", "controller"]);
    assert!(image.setting("Cmd").is_null(), "no arguments but the Deployment's");
    assert_eq!(image.setting("User"), "65532:65532");

    let rendered =
        objects(&render("kube-svm", "kube-svm", &["--show-only", "templates/deployment.yaml"]));
    let pod = &rendered[0].data["spec"]["template"]["spec"];
    let user =
        format!("{}:{}", pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]);
    assert_eq!(
        image.setting("User").as_str(),
        Some(user.as_str()),
        "the chart's runAsUser and runAsGroup"
    );

    let expected = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(epoch) => epoch,
        Err(_) => git(&["show", "--no-patch", "--format=%ct", revision]),
    };
    let expected: i64 = expected.parse().expect("seconds since the epoch");
    let created = image.config["created"].as_str().expect("a created time");
    let created: k8s_openapi::jiff::Timestamp = created.parse().expect("an RFC 3339 time");
    assert_eq!(created.as_second(), expected, "created at the commit's time");
    for entry in image.config["history"].as_array().into_iter().flatten() {
        assert_eq!(entry["created"], image.config["created"], "no other time in the config");
    }
}

/// kube-svm from the image alone, as the chart's pod: the Deployment's arguments after the
/// image's entrypoint, the image's user, a real token of the chart's ServiceAccount, bound only
/// to the chart's roles. It becomes ready where the Deployment's probe asks, its CRD trigger
/// migrates a stale CRD and prunes its storedVersions, and etcd holds every object at the new
/// version.
#[tokio::test]
async fn the_image_migrates_a_crd_as_the_charts_pod() {
    let image = Image::open(&layout());
    let user = image.setting("User").as_str().expect("a user").to_owned();
    let mut entrypoint: Vec<String> =
        strings(image.setting("Entrypoint")).into_iter().map(str::to_owned).collect();
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::stale(&client, "image", WIDGETS).await;

    // The chart's ServiceAccount, RBAC and probe ConfigMap, and a token of that ServiceAccount
    // as the kubelet would mount it.
    let (release, namespace) = ("kube-svm", CONTROLLER_NAMESPACE);
    let account = chart::install_service_account(&client, release, namespace, &[]).await;
    let account = account.rsplit(':').next().expect("system:serviceaccount:<ns>:<name>");
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("a token of the chart's ServiceAccount")
        .status
        .and_then(|status| status.token)
        .expect("the token");

    // The Deployment's container, with the chart's default values but the admin port (tests run
    // side by side on one network).
    let port = free_port().expect("a free port");
    let set = format!("metrics.port={port}");
    let args = ["--show-only", "templates/deployment.yaml", "--set", &set];
    let deployment = objects(&render(release, namespace, &args));
    let container = &deployment[0].data["spec"]["template"]["spec"]["containers"][0];
    assert!(container["command"].is_null(), "the Deployment runs the image's entrypoint");
    let env: Vec<&str> = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(env, ["POD_NAME"], "the pod's variables, which Pod::start sets");
    entrypoint.extend(strings(&container["args"]).into_iter().map(str::to_owned));

    let rootfs = control_plane.path("image-rootfs");
    image.unpack(&rootfs);
    let pod = Pod { rootfs: &rootfs, user: &user, name: "kube-svm-0", namespace, token: &token };
    let controller = pod.start(&control_plane, &entrypoint);

    // The Deployment's readiness probe.
    let readyz = format!("http://127.0.0.1:{port}/readyz");
    let http = http_client();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = http.get(&readyz).send().await.is_ok_and(|r| r.status().is_success());
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "never ready at {readyz}:\n{}", controller.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // kube-svm runs as the image's user, in the image's root: unshare's one child.
    let unshare = controller.pid();
    let children = fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
        .expect("unshare's children");
    let pid = children.split_whitespace().next().expect("unshare runs kube-svm");
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("kube-svm's status");
    let ids =
        |key: &str| status.lines().find_map(|l| l.strip_prefix(key)).map(str::split_whitespace);
    let expected: Vec<&str> = user.split(':').collect();
    assert!(ids("Uid:").expect("Uid").all(|id| id == expected[0]), "{status}");
    assert!(ids("Gid:").expect("Gid").all(|id| id == expected[1]), "{status}");
    assert_eq!(fs::read_link(format!("/proc/{pid}/root")).ok(), Some(rootfs.clone()));

    let migration = wait_for_triggered(&client, &widgets, 1, &controller).await;
    let name = migration.metadata.name.expect("a name");
    let done = phase_is(Phase::Succeeded);
    wait_for(&client, &name, Duration::from_secs(120), &[&controller], done).await;
    let etcd = control_plane.etcd();
    let outcome = invariant::check(&client, &etcd, &widgets, &name, WIDGETS).await;
    assert!(outcome.pruned, "storedVersions pruned: {:?}", outcome.stored_versions);
    widgets.assert_all_stored_as(&etcd, "v2", WIDGETS).await;
}
