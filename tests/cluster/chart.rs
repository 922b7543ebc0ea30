//! The Helm chart and the manifests rendered from it: it lints, its values schema refuses bad
//! values, everything it renders is accepted by a real apiserver, `config/` has not drifted from
//! it, and its RBAC, narrowed to a list of resources, lets kube-svm migrate exactly those.
//!
//! That the default RBAC is enough is proven by every controller test: controllers run as the
//! chart's ServiceAccount (see `support::process`).

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kube::core::DynamicObject;
use kube::{Config, ResourceExt};
use kube_svm::api::Phase;

use crate::support::Scenario;
use crate::support::chart::{self, apply, objects, render, run_helm};
use crate::support::fixtures::{WidgetCrd, install_kube_svm_crds, unique};
use crate::support::migrations::{create_migration, phase_is, wait_for};
use crate::support::process::KubeSvm;
use crate::support::shared;

fn repository_file(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// `--set-json` restricting the migratable resources to `widgets` of `group`.
fn only_widgets_of(group: &str) -> String {
    format!(r#"rbac.migratableResources=[{{"apiGroups":["{group}"],"resources":["widgets"]}}]"#)
}

#[test]
fn the_chart_lints_with_default_and_optional_values() {
    let chart = chart::chart_dir();
    let chart = chart.to_str().expect("UTF-8 path");
    let only_widgets = only_widgets_of("example.com");
    for extra in [
        &[][..],
        &["--set", "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true"],
        &["--set-json", &only_widgets],
        &[
            "--set",
            "crds.install=false,rbac.create=false,serviceAccount.create=false,replicaCount=2",
        ],
        &["--set", "migrateOnUpgrade.enabled=true"],
        &["--set", "flowControl.enabled=true,controller.pace=fast"],
    ] {
        let mut args = vec!["lint", "--strict", chart];
        args.extend(extra);
        if let Err(error) = run_helm(&args) {
            panic!("helm lint {extra:?} fails: {error}");
        }
    }
}

#[test]
fn the_values_schema_refuses_bad_values() {
    for (set, field) in [
        ("controller.pageSize=0", "pageSize"),
        ("controller.logFormat=xml", "logFormat"),
        ("rbac.migratableResources=some", "migratableResources"),
        ("controller.writesInFligth=4", "writesInFligth"),
        ("controller.pace=slow", "pace"),
        ("flowControl.queues=0", "queues"),
        ("image.digest=latest", "digest"),
    ] {
        let chart = chart::chart_dir();
        let args = ["template", "x", chart.to_str().expect("UTF-8 path"), "--set", set];
        match run_helm(&args) {
            Ok(_) => panic!("helm template --set {set} was accepted"),
            Err(error) => assert!(error.contains(field), "--set {set}: {error}"),
        }
    }
    // A listed resource is one resource: "*" would grant every subresource too.
    for resources in [r#"["*"]"#, r#"["pods/ephemeralcontainers"]"#, r#"["*/status"]"#] {
        let chart = chart::chart_dir();
        let set =
            format!(r#"rbac.migratableResources=[{{"apiGroups":[""],"resources":{resources}}}]"#);
        let args = ["template", "x", chart.to_str().expect("UTF-8 path"), "--set-json", &set];
        match run_helm(&args) {
            Ok(_) => panic!("helm template --set-json {set} was accepted"),
            Err(error) => assert!(error.contains("migratableResources"), "{set}: {error}"),
        }
    }
}

#[test]
fn the_chart_version_follows_the_crate() {
    let chart: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&repository_file("charts/kube-svm/Chart.yaml")).expect("YAML");
    let crate_version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"].as_str(), Some(crate_version), "Chart.yaml version");
    assert_eq!(chart["appVersion"].as_str(), Some(crate_version), "Chart.yaml appVersion");
}

/// The controller and the hook Job run one image: tagged with the chart's appVersion by default,
/// by digest when `image.digest` is given (what the published chart sets), the tag ignored.
#[test]
fn the_image_is_pulled_by_digest_when_one_is_given() {
    let images = |set: &str| -> Vec<String> {
        let args = ["--set", "migrateOnUpgrade.enabled=true", "--set", set];
        objects(&render("kube-svm", "kube-svm", &args))
            .iter()
            .filter_map(|object| {
                let containers = &object.data["spec"]["template"]["spec"]["containers"];
                containers[0]["image"].as_str().map(str::to_owned)
            })
            .collect()
    };
    let version = env!("CARGO_PKG_VERSION");
    let tagged = format!("registry.example.com/kube-svm:{version}");
    assert_eq!(images("image.repository=registry.example.com/kube-svm"), [tagged.clone(), tagged]);
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let set =
        format!("image.repository=registry.example.com/kube-svm,image.tag=x,image.digest={digest}");
    let pinned = format!("registry.example.com/kube-svm@{digest}");
    assert_eq!(images(&set), [pinned.clone(), pinned]);
}

/// The CRDs are templated, installed by default, kept on uninstall, and can be left out.
#[test]
fn the_chart_installs_the_generated_crds_unless_told_not_to() {
    let kinds = |args: &[&str]| -> Vec<String> {
        objects(&render("kube-svm", "kube-svm", args))
            .into_iter()
            .filter_map(|object| object.types.map(|types| types.kind))
            .collect()
    };
    let crds = |kinds: &[String]| kinds.iter().filter(|k| *k == "CustomResourceDefinition").count();
    assert_eq!(crds(&kinds(&[])), 2);
    assert_eq!(crds(&kinds(&["--set", "crds.install=false"])), 0);
    let rendered = render("kube-svm", "kube-svm", &["--show-only", "templates/crds.yaml"]);
    for crd in objects(&rendered) {
        let annotations = crd.metadata.annotations.unwrap_or_default();
        assert_eq!(annotations.get("helm.sh/resource-policy").map(String::as_str), Some("keep"));
    }
}

/// `config/deploy/kube-svm.yaml` is what `make manifests` renders from the chart now.
#[test]
fn the_committed_manifests_match_the_chart() {
    let output = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/manifests.sh"))
        .arg(chart::helm())
        .output()
        .expect("hack/manifests.sh runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let rendered = String::from_utf8(output.stdout).expect("UTF-8");
    assert!(
        rendered == repository_file("config/deploy/kube-svm.yaml"),
        "config/deploy/kube-svm.yaml is out of date: run `make manifests`"
    );
}

/// Everything the chart renders, and every committed manifest and sample, is accepted by the
/// apiserver (server-side dry run): schemas, field names and references are checked for real.
#[tokio::test]
async fn rendered_and_committed_manifests_pass_a_server_side_dry_run() {
    let control_plane = shared().await;
    let client = control_plane.client().await;
    let namespace = unique("chart");
    let namespace_object =
        format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n");
    apply(&client, &objects(&namespace_object), false).await.expect("the namespace is created");
    install_kube_svm_crds(&client).await;

    let only_widgets = only_widgets_of("example.com");
    let narrowed_with_status =
        ["--set-json", &only_widgets, "--set", "controller.writeToStatus=true"];
    let hook = [
        "--set",
        "migrateOnUpgrade.enabled=true",
        "--set-json",
        r#"migrateOnUpgrade.resources=["widgets.example.com","secrets"]"#,
    ];
    for args in [
        &["--set", "replicaCount=2"][..],
        &["--set-json", &only_widgets],
        &narrowed_with_status,
        &hook,
        &["--set", "flowControl.enabled=true,controller.pace=fast"],
    ] {
        let rendered = objects(&render("kube-svm", &namespace, args));
        assert!(rendered.len() >= 8, "the chart renders its objects: {}", rendered.len());
        if let Err(error) = apply(&client, &rendered, true).await {
            panic!("the chart rendered with {args:?} is refused: {error}");
        }
    }
    let rendered = objects(&render("kube-svm", &namespace, &hook));
    let job = rendered
        .iter()
        .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "Job"))
        .expect("the hook Job is rendered");
    let annotations = job.annotations();
    assert_eq!(annotations["helm.sh/hook"], "post-install,post-upgrade");
    let container = &job.data["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> =
        container["args"].as_array().into_iter().flatten().filter_map(|a| a.as_str()).collect();
    assert_eq!(
        args[..6],
        [
            "migrate",
            "widgets.example.com",
            "secrets",
            "--all-stale",
            "--wait-for-others",
            "--progress=lines"
        ]
    );

    // The plain manifests bring their own namespace, which must exist before a dry run of the
    // objects in it.
    let committed = objects(&repository_file("config/deploy/kube-svm.yaml"));
    let (namespaces, namespaced): (Vec<DynamicObject>, Vec<DynamicObject>) = committed
        .into_iter()
        .partition(|object| object.types.as_ref().is_some_and(|t| t.kind == "Namespace"));
    apply(&client, &namespaces, false).await.expect("config/deploy's namespace is created");
    apply(&client, &namespaced, true).await.expect("config/deploy/kube-svm.yaml is accepted");
    for file in ["config/crd/migration.k8s.io.yaml", "config/samples/secrets.yaml"] {
        let objects = objects(&repository_file(file));
        assert!(!objects.is_empty(), "{file} holds objects");
        if let Err(error) = apply(&client, &objects, true).await {
            panic!("{file} is refused: {error}");
        }
    }
    let sample = objects(&repository_file("config/samples/custom-resource.yaml"));
    apply(&client, &sample, true).await.expect("the custom resource sample is accepted");
}

/// With `rbac.migratableResources` narrowed to one resource, kube-svm migrates that resource and
/// a migration of anything else fails at once, saying the apiserver forbade it.
#[tokio::test]
async fn a_narrowed_resource_list_limits_what_kube_svm_can_migrate() {
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::stale(&client, "rbac", 50).await;
    let only_widgets = only_widgets_of(&widgets.group);
    let kubeconfig = control_plane
        .impersonating_kubeconfig("narrow", "kube-svm-narrow", &["--set-json", &only_widgets])
        .await;
    let controller = KubeSvm::start_as(
        &control_plane,
        "narrow",
        &["controller", "--leader-elect=false"],
        &kubeconfig,
    );

    create_migration(&client, "allowed", &widgets.group, "widgets").await;
    create_migration(&client, "forbidden", "", "secrets").await;
    let timeout = Duration::from_secs(60);
    wait_for(&client, "allowed", timeout, &[&controller], phase_is(Phase::Succeeded)).await;
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 50).await;
    let failed =
        wait_for(&client, "forbidden", timeout, &[&controller], phase_is(Phase::Failed)).await;
    let message = failed.status.and_then(|s| s.conditions[0].message.clone()).unwrap_or_default();
    assert!(message.contains("secrets") && message.contains("403"), "{message}");
}

/// With `flowControl.enabled`, the apiserver puts the chart's ServiceAccount's requests into the
/// chart's priority level, of 3 seats on a default apiserver (600 seats; the default levels' 245
/// shares and its 1), its Lease requests into the cluster's leader-election level, and the gentle
/// pace's probe into `workload-low`, where ordinary workloads wait.
#[tokio::test]
async fn flow_control_gives_kube_svm_a_priority_level_of_its_own() {
    use k8s_openapi::api::flowcontrol::v1::PriorityLevelConfiguration;
    use kube::api::DeleteParams;
    use kube::config::{KubeConfigOptions, Kubeconfig};

    let control_plane = shared().await;
    let admin = control_plane.client().await;
    let (release, namespace) = (unique("flow"), unique("flow"));
    let kubeconfig = control_plane.impersonating_kubeconfig(&release, &namespace, &[]).await;
    let args = ["--set", "flowControl.enabled=true", "--show-only", "templates/flowcontrol.yaml"];
    let rendered = objects(&render(&release, &namespace, &args));
    assert_eq!(rendered.len(), 4, "a priority level and three flow schemas");
    apply(&admin, &rendered, false).await.expect("the flow control objects apply");
    let levels: kube::Api<PriorityLevelConfiguration> = kube::Api::all(admin.clone());
    let uid = |name: &str| {
        let levels = levels.clone();
        let name = name.to_owned();
        async move { levels.get(&name).await.expect("the level exists").metadata.uid }
    };
    let name = rendered
        .iter()
        .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "PriorityLevelConfiguration"))
        .and_then(|o| o.metadata.name.clone())
        .expect("a priority level");
    let (own, leader_election) = (uid(&name).await, uid("leader-election").await);
    let workload_low = uid("workload-low").await;

    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig).expect("readable"),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("a valid kubeconfig");
    let account = kube::Client::try_from(config).expect("a client");
    let level_of = |path: String| {
        let account = account.clone();
        async move {
            let request =
                http::Request::get(path).body(kube::client::Body::empty()).expect("a request");
            let response = account.send(request).await.expect("an answer");
            let header = response.headers().get("X-Kubernetes-PF-PriorityLevel-UID");
            header.and_then(|v| v.to_str().ok()).map(str::to_owned)
        }
    };
    let leases = format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/kube-svm");
    let probe =
        format!("/api/v1/namespaces/{namespace}/configmaps/{}", kube_svm::engine::PROBE_OBJECT);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let migrations =
            level_of("/apis/migration.k8s.io/v1alpha1/storageversionmigrations".into()).await;
        let lease = level_of(leases.clone()).await;
        let probed = level_of(probe.clone()).await;
        let found = (migrations.as_ref(), lease.as_ref(), probed.as_ref());
        if found == (own.as_ref(), leader_election.as_ref(), workload_low.as_ref()) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never classified: {found:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let request = http::Request::get("/metrics").body(Vec::new()).expect("a request");
    let metrics = admin.request_text(request).await.expect("the apiserver's metrics");
    let series = format!("apiserver_flowcontrol_nominal_limit_seats{{priority_level=\"{name}\"}} ");
    let seats = metrics.lines().find_map(|line| line.strip_prefix(&series));
    assert_eq!(seats, Some("3"), "the level's seats");

    for object in rendered {
        let types = object.types.expect("typed");
        let gvk = kube::core::GroupVersionKind::try_from(&types).expect("a kind");
        let (resource, _) = kube::discovery::pinned_kind(&admin, &gvk).await.expect("served");
        let api: kube::Api<DynamicObject> = kube::Api::all_with(admin.clone(), &resource);
        let name = object.metadata.name.expect("named");
        api.delete(&name, &DeleteParams::default()).await.expect("deleted");
    }
}

/// The chart's alerts pass `promtool check rules`, and `promtool test rules` with the unit tests
/// in `tests/alerts/` (series shaped like kube-svm's metrics). `make test` fetches promtool with
/// hack/promtool.sh; where it cannot, the test says it skipped the check.
#[test]
fn alerts_pass_promtool_unit_tests() {
    let Some(promtool) = std::env::var_os("PROMTOOL").filter(|p| !p.is_empty()) else {
        eprintln!(
            "SKIPPED alerts_pass_promtool_unit_tests: no promtool (hack/promtool.sh found none)"
        );
        return;
    };
    let rendered = render(
        "kube-svm",
        "kube-svm",
        &[
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--show-only",
            "templates/prometheusrule.yaml",
        ],
    );
    let rule = objects(&rendered).into_iter().next().expect("a PrometheusRule");
    let dir = tempfile::tempdir().expect("a directory");
    let rules = serde_json::json!({ "groups": rule.data["spec"]["groups"] });
    fs::write(
        dir.path().join("kube-svm.rules.yaml"),
        serde_yaml_ng::to_string(&rules).expect("YAML"),
    )
    .expect("written");
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/alerts/kube-svm.test.yaml");
    fs::copy(tests, dir.path().join("kube-svm.test.yaml")).expect("copied");
    for args in [["check", "rules", "kube-svm.rules.yaml"], ["test", "rules", "kube-svm.test.yaml"]]
    {
        let output = Command::new(&promtool)
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("promtool runs");
        assert!(
            output.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Kube-svm's metric names a dashboard panel queries (`kube_svm_*`, `storage_migrator_*`), with
/// a histogram's `_bucket` suffix dropped.
pub fn dashboard_metrics() -> BTreeSet<String> {
    let path = chart::chart_dir().join("dashboards/kube-svm.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(path).expect("read")).expect("JSON");
    let mut names = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("an expression");
            let tokens = expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
            for token in
                tokens.filter(|t| t.starts_with("kube_svm_") || t.starts_with("storage_migrator_"))
            {
                names.insert(token.trim_end_matches("_bucket").to_owned());
            }
        }
    }
    names
}

/// With `grafanaDashboard.enabled`, the chart renders the dashboard as a ConfigMap labelled for
/// Grafana's sidecar, and the dashboard is valid JSON whose every panel queries kube-svm.
#[test]
fn the_dashboard_is_delivered_for_grafanas_sidecar() {
    let rendered = render(
        "kube-svm",
        "kube-svm",
        &["--set", "grafanaDashboard.enabled=true", "--show-only", "templates/dashboard.yaml"],
    );
    let configmap = objects(&rendered).into_iter().next().expect("a ConfigMap");
    assert_eq!(configmap.labels().get("grafana_dashboard").map(String::as_str), Some("1"));
    let dashboard: serde_json::Value =
        serde_json::from_str(configmap.data["data"]["kube-svm.json"].as_str().expect("the JSON"))
            .expect("valid JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    for panel in panels {
        let exprs = panel["targets"].as_array().expect("targets");
        assert!(
            exprs.iter().all(|t| t["expr"]
                .as_str()
                .is_some_and(|e| e.contains("kube_svm_") || e.contains("storage_migrator_"))),
            "{panel}"
        );
    }
    assert!(dashboard_metrics().len() >= 9, "{:?}", dashboard_metrics());
    assert!(!render("kube-svm", "kube-svm", &[]).contains("-dashboard"), "off by default");
}

/// With the chart's admission policy, each power a migration's annotations ask for is a verb of
/// its own. Someone allowed only to create migrations may create a plain one, and is refused the
/// vouch, the fast pace and the cleaning, each with a message naming its verb; bound to the
/// chart's `migration-powers` ClusterRole they may ask for all three. The controller's
/// ServiceAccount may ask for the cleaning, as its CRD trigger does.
#[tokio::test]
async fn each_power_a_migration_asks_for_takes_a_verb_of_its_own() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::Api;
    use kube_svm::api::{StorageVersionMigration, StorageVersionMigrationSpec};
    use serde_json::json;
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    control_plane.controller_kubeconfig().await;
    let namespace = crate::support::CONTROLLER_NAMESPACE;
    let policy = render("kube-svm", namespace, &["--show-only", "templates/admission-policy.yaml"]);
    apply(&client, &objects(&policy), false).await.expect("the policy applies");
    let creator: ClusterRole = serde_json::from_value(json!({
        "metadata": { "name": "svm-creator" },
        "rules": [{ "apiGroups": ["migration.k8s.io"], "resources": ["storageversionmigrations"],
                    "verbs": ["create", "get", "patch"] }],
    }))
    .expect("a ClusterRole");
    Api::<ClusterRole>::all(client.clone())
        .create(&Default::default(), &creator)
        .await
        .expect("created");
    let bind = |name: &str, role: &str, user: &str| -> ClusterRoleBinding {
        serde_json::from_value(json!({
            "metadata": { "name": name },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
        }))
        .expect("a ClusterRoleBinding")
    };
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    bindings
        .create(&Default::default(), &bind("alice-creates", "svm-creator", "alice"))
        .await
        .expect("bound");
    let admin = control_plane.config().await;
    let as_user = |user: &str| {
        let mut config = admin.clone();
        config.auth_info.impersonate = Some(user.to_owned());
        kube::Client::try_from(config).expect("a client")
    };
    let migration = |name: &str, annotations: serde_json::Value| -> StorageVersionMigration {
        let mut migration =
            StorageVersionMigration::new(name, StorageVersionMigrationSpec::default());
        migration.metadata.annotations = serde_json::from_value(annotations).expect("annotations");
        migration.spec.resource.resource = "secrets".into();
        migration
    };
    let alice: Api<StorageVersionMigration> = Api::all(as_user("alice"));
    let powers = [
        ("kube-svm.io/encoding-confirmed", "true", "vouch-encoding"),
        ("kube-svm.io/pace", "fast", "pace-fast"),
        ("kube-svm.io/clean-managed-fields", "true", "clean-managed-fields"),
    ];
    // The policy takes effect once the apiserver has loaded it: wait for the first refusal.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for (i, (annotation, value, verb)) in powers.iter().enumerate() {
        let asked = migration(&format!("alice-{i}"), json!({ *annotation: *value }));
        let refusal = loop {
            match alice.create(&Default::default(), &asked).await {
                Err(kube::Error::Api(status)) if status.code == 403 => break status.message,
                answer => {
                    let created = answer.is_ok();
                    let _ = alice.delete(&format!("alice-{i}"), &Default::default()).await;
                    assert!(
                        std::time::Instant::now() < deadline,
                        "{annotation}: {value} was let through (created: {created})"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        assert!(refusal.contains(&format!("the verb {verb}")), "{refusal}");
    }
    alice
        .create(&Default::default(), &migration("alice-plain", json!({})))
        .await
        .expect("a plain migration");
    // A vouch named for a version is a vouch too.
    let named = migration("alice-named", json!({ "kube-svm.io/encoding-confirmed": "v2" }));
    let refused = alice.create(&Default::default(), &named).await.expect_err("refused");
    assert!(refused.to_string().contains("the verb vouch-encoding"), "{refused}");
    // A retry of a migration that vouches would vouch again: the same verb. Of another, none.
    let admin_api: Api<StorageVersionMigration> = Api::all(client.clone());
    let vouched = migration("vouched", json!({ "kube-svm.io/encoding-confirmed": "true" }));
    admin_api.create(&Default::default(), &vouched).await.expect("created by an admin");
    let retry =
        |token: &str| json!({ "metadata": { "annotations": { "kube-svm.io/retry": token } } });
    let patch = kube::api::Patch::Merge(retry("r1"));
    let refused = alice.patch("vouched", &Default::default(), &patch).await.expect_err("refused");
    assert!(refused.to_string().contains("the verb vouch-encoding"), "{refused}");
    alice.patch("alice-plain", &Default::default(), &patch).await.expect("a plain retry");
    // A trigger's label marks a migration it retries and deletes: kube-svm's alone.
    let labelled = json!({ "metadata": { "labels": { "kube-svm.io/trigger": "discovery" } } });
    let patch = kube::api::Patch::Merge(labelled);
    let refused = alice.patch("alice-plain", &Default::default(), &patch).await.expect_err("no");
    assert!(refused.to_string().contains("only kube-svm sets it"), "{refused}");

    let powers_role = "kube-svm-migration-powers";
    bindings
        .create(&Default::default(), &bind("alice-powers", powers_role, "alice"))
        .await
        .expect("bound");
    let all = json!({ "kube-svm.io/encoding-confirmed": "true", "kube-svm.io/pace": "fast",
                      "kube-svm.io/clean-managed-fields": "true" });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while alice.create(&Default::default(), &migration("alice-trusted", all.clone())).await.is_err()
    {
        assert!(std::time::Instant::now() < deadline, "the powers granted were never honoured");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let account = format!("system:serviceaccount:{namespace}:kube-svm");
    let controller: Api<StorageVersionMigration> = Api::all(as_user(&account));
    let cleaning =
        migration("crd-trigger-cleans", json!({ "kube-svm.io/clean-managed-fields": "true" }));
    controller
        .create(&Default::default(), &cleaning)
        .await
        .expect("the CRD trigger may ask for the cleaning");
}

/// The chart's write policy narrows the RBAC kube-svm needs (every resource and, with it, every
/// subresource) to writing objects back as they are. As the chart's ServiceAccount, a patch that
/// changes a ConfigMap's data, a Deployment's spec or a label is refused, and so are an ephemeral
/// container, a scale, a proxied request, a status write that changes the status and a narrowed
/// ClusterRole, and exec, attach and a token (verbs its role lacks); the no-op
/// writes a migration sends, to an object and to its status, pass; and the controller, running
/// under the policy (the chart's default), migrates a resource.
#[tokio::test]
async fn kube_svm_may_write_objects_back_only_as_they_are() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use kube::Api;
    use kube::api::PostParams;
    use serde_json::json;
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::stale(&client, "writes", 20).await;
    control_plane.controller_kubeconfig().await;
    let account =
        format!("system:serviceaccount:{}:kube-svm", crate::support::CONTROLLER_NAMESPACE);
    let namespace = crate::support::CONTROLLER_NAMESPACE;
    chart::install_write_policy(&control_plane, "kube-svm", namespace, &account).await;
    let mut config = control_plane.config().await;
    config.auth_info.impersonate = Some(account);
    let kube_svm = kube::Client::try_from(config).expect("a client");

    let created = PostParams::default();
    fn from<T: serde::de::DeserializeOwned>(body: serde_json::Value) -> T {
        serde_json::from_value(body).expect("an object")
    }
    let settings: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let object = from(json!({ "metadata": { "name": "settings" }, "data": { "mode": "safe" } }));
    settings.create(&created, &object).await.expect("created");
    let web = from(json!({ "metadata": { "name": "web" },
        "spec": { "replicas": 1, "selector": { "matchLabels": { "app": "web" } },
                  "template": { "metadata": { "labels": { "app": "web" } },
                                "spec": { "containers": [{ "name": "web", "image": "nginx" }] } } } }));
    Api::<Deployment>::namespaced(client.clone(), "default")
        .create(&created, &web)
        .await
        .expect("created");
    let app = from(json!({ "metadata": { "name": "app" },
                           "spec": { "containers": [{ "name": "app", "image": "nginx" }] } }));
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&created, &app)
        .await
        .expect("created");

    // A raw request as kube-svm, a merge patch or a POST of JSON, and the apiserver's answer:
    // its status code, or 200.
    let send = |post: bool, path: String, body: serde_json::Value| {
        let kube_svm = kube_svm.clone();
        async move {
            let (request, content_type) = match post {
                true => (http::Request::post(&path), "application/json"),
                false => (http::Request::patch(&path), "application/merge-patch+json"),
            };
            let request = request
                .header(http::header::CONTENT_TYPE, content_type)
                .body(serde_json::to_vec(&body).expect("JSON"))
                .expect("a request");
            match kube_svm.request_text(request).await {
                Ok(_) => (200, String::new()),
                Err(kube::Error::Api(status)) => (status.code, status.message),
                Err(error) => panic!("{path}: {error}"),
            }
        }
    };
    let patch = |path: String, body: serde_json::Value| send(false, path, body);
    let configmap = "/api/v1/namespaces/default/configmaps/settings".to_owned();
    let deployment = "/apis/apps/v1/namespaces/default/deployments/web".to_owned();
    let pod = "/api/v1/namespaces/default/pods/app".to_owned();
    let (code, refusal) = patch(configmap.clone(), json!({ "data": { "mode": "open" } })).await;
    assert_eq!(code, 403, "a change to a ConfigMap's data was let through");
    assert!(refusal.contains("only writes objects back as they are"), "{refusal}");
    let refused = [
        (deployment.clone(), json!({ "spec": { "replicas": 3 } })),
        (configmap.clone(), json!({ "metadata": { "labels": { "owned": "yes" } } })),
        (format!("{deployment}/status"), json!({ "status": { "replicas": 7 } })),
        (format!("{deployment}/scale"), json!({ "spec": { "replicas": 5 } })),
        (
            format!("{pod}/ephemeralcontainers"),
            json!({ "spec": { "ephemeralContainers": [{ "name": "shell", "image": "busybox" }] } }),
        ),
        (format!("{pod}/proxy/anything"), json!({})),
    ];
    for (path, body) in refused {
        let (code, message) = patch(path.clone(), body).await;
        assert_eq!(code, 403, "{path} was let through: {message}");
        assert!(message.contains("kube-svm"), "{path}: {message}");
    }
    // A change to an RBAC object is a change like any other: narrowing someone's role needs
    // no escalation, only the policy refuses it.
    let role: k8s_openapi::api::rbac::v1::ClusterRole = from(json!({
        "metadata": { "name": "someone-else" },
        "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }] }));
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone())
        .create(&created, &role)
        .await
        .expect("created");
    let role = "/apis/rbac.authorization.k8s.io/v1/clusterroles/someone-else".to_owned();
    let (code, message) = patch(role, json!({ "rules": [] })).await;
    assert_eq!(code, 403, "kube-svm emptied someone's ClusterRole: {message}");
    assert!(message.contains("kube-svm"), "{message}");
    // Exec, attach and tokens take verbs kube-svm's role does not grant (and a connect is
    // refused by the policy too).
    let post = |path: String, body: serde_json::Value| send(true, path, body);
    let token = json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": { "audiences": ["api"] } });
    for (path, body) in [
        (format!("{pod}/exec?command=sh&stdin=true&stdout=true"), json!({})),
        (format!("{pod}/attach?stdin=true&stdout=true"), json!({})),
        ("/api/v1/namespaces/default/serviceaccounts/default/token".to_owned(), token),
    ] {
        let (code, message) = post(path.clone(), body).await;
        assert_eq!(code, 403, "{path} was let through: {message}");
    }
    let kept = settings.get("settings").await.expect("read");
    assert_eq!(kept.data.and_then(|d| d.get("mode").cloned()).as_deref(), Some("safe"));

    // What a migration sends: its identity and resourceVersion, to the object or its status.
    let resource_version = kept.metadata.resource_version.expect("a resourceVersion");
    let write_back = json!({ "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "settings", "namespace": "default",
                      "resourceVersion": resource_version } });
    assert_eq!(patch(configmap, write_back).await, (200, String::new()));
    let identity = json!({ "metadata": { "name": "web", "namespace": "default" } });
    assert_eq!(patch(deployment.clone(), identity.clone()).await, (200, String::new()));
    assert_eq!(patch(format!("{deployment}/status"), identity).await, (200, String::new()));
    // kube-svm's own objects stay its own: the probe's count.
    let probe = format!(
        "/api/v1/namespaces/{}/configmaps/kube-svm-probe",
        crate::support::CONTROLLER_NAMESPACE
    );
    let count = json!({ "metadata": { "annotations": { "kube-svm.io/probe": "1" } } });
    assert_eq!(patch(probe, count).await, (200, String::new()));

    let controller = KubeSvm::start(&control_plane, "writes", &["controller"]).await;
    create_migration(&client, "widgets", &widgets.group, "widgets").await;
    let timeout = Duration::from_secs(60);
    wait_for(&client, "widgets", timeout, &[&controller], phase_is(Phase::Succeeded)).await;
    widgets.assert_all_stored_as(&control_plane.etcd(), "v2", 20).await;
}

/// The write policy's one cost: the apiserver reads the namespace of every namespaced write it
/// matches, so objects stranded in etcd under a deleted namespace cannot be written back. The
/// migration fails on them, naming the namespace, and keeps `storedVersions`; the objects of the
/// namespace that exists are rewritten, the stranded ones stay as they were in etcd.
#[tokio::test]
async fn under_the_write_policy_objects_of_a_deleted_namespace_fail_their_migration() {
    use crate::support::fixtures::{create_namespace, vanish_namespace};
    let Scenario { control_plane, client } = Scenario::own(&[]).await;
    let widgets = WidgetCrd::new("stranded", true);
    widgets.create(&client, "v1").await;
    let (kept, vanished) = (unique("kept"), unique("vanished"));
    create_namespace(&client, &kept).await;
    create_namespace(&client, &vanished).await;
    widgets.seed(&client, "v1", &[Some(&kept), Some(&vanished)], 5).await;
    vanish_namespace(&client, &vanished).await;
    widgets.set_storage_version(&client, "v2").await;
    control_plane.controller_kubeconfig().await;
    let namespace = crate::support::CONTROLLER_NAMESPACE;
    let account = format!("system:serviceaccount:{namespace}:kube-svm");
    chart::install_write_policy(&control_plane, "kube-svm", namespace, &account).await;

    let controller = KubeSvm::start(&control_plane, "stranded", &["controller"]).await;
    create_migration(&client, "widgets", &widgets.group, "widgets").await;
    let timeout = Duration::from_secs(120);
    let failed =
        wait_for(&client, "widgets", timeout, &[&controller], phase_is(Phase::Failed)).await;
    let message = failed.status.and_then(|s| s.conditions[0].message.clone()).unwrap_or_default();
    assert!(message.contains(&vanished), "the failure names the namespace: {message}");

    let etcd = control_plane.etcd();
    let stranded = etcd.list(&format!("{}{vanished}/", widgets.etcd_prefix())).await.expect("etcd");
    let census = crate::support::invariant::Census::of(&etcd, &widgets).await;
    assert_eq!(stranded.len(), 5, "the stranded objects are still stored");
    assert_eq!(
        (census.count(&widgets.api_version("v2")), census.count(&widgets.api_version("v1"))),
        (5, 5),
        "the kept namespace's objects rewritten, the stranded ones not: {:?}",
        census.0
    );
    let crds: kube::Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        kube::Api::all(client.clone());
    let stored =
        crds.get(&widgets.name()).await.expect("the CRD").status.map(|s| s.stored_versions);
    assert_eq!(
        stored.flatten(),
        Some(vec!["v1".to_owned(), "v2".to_owned()]),
        "storedVersions kept"
    );
}
