//! Test objects: multi-version CRDs, their custom resources, kube-svm's own CRDs.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use kube_svm::rules::storage_hash::storage_version_hash;
use serde_json::json;

use super::invariant::Census;
use super::{ControlPlane, Etcd};

/// How long the apiserver may take to act on a CRD change.
const CRD_TIMEOUT: Duration = Duration::from_secs(60);

/// A name no other test of this run uses: `<prefix>-<pid>-<n>`.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A test CRD `widgets.<group>` of kind `Widget`, served at v1, v2 and v3 with the same schema and
/// no conversion webhook (conversion only rewrites `apiVersion`), and a status subresource.
pub struct WidgetCrd {
    pub group: String,
    pub namespaced: bool,
}

impl WidgetCrd {
    pub const KIND: &str = "Widget";
    pub const PLURAL: &str = "widgets";

    /// A fresh group for one test.
    pub fn new(test: &str, namespaced: bool) -> WidgetCrd {
        WidgetCrd { group: format!("{}.svm.example.com", unique(test)), namespaced }
    }

    pub fn name(&self) -> String {
        format!("{}.{}", Self::PLURAL, self.group)
    }

    /// The etcd key prefix of every widget: `/registry/<group>/widgets/`.
    pub fn etcd_prefix(&self) -> String {
        format!("/registry/{}/{}/", self.group, Self::PLURAL)
    }

    pub fn api_version(&self, version: &str) -> String {
        format!("{}/{version}", self.group)
    }

    fn definition(&self, storage: &str) -> CustomResourceDefinition {
        let versions: Vec<_> = ["v1", "v2", "v3"]
            .iter()
            .map(|&name| {
                json!({
                    "name": name,
                    "served": true,
                    "storage": name == storage,
                    "subresources": { "status": {} },
                    "schema": { "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                            "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                        },
                    }},
                })
            })
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": { "name": self.name() },
            "spec": {
                "group": self.group,
                "scope": if self.namespaced { "Namespaced" } else { "Cluster" },
                "names": { "kind": Self::KIND, "plural": Self::PLURAL, "singular": "widget" },
                "versions": versions,
            },
        }))
        .expect("a valid CRD")
    }

    /// Creates the CRD stored at `storage` and waits until it is established and served.
    pub async fn create(&self, client: &Client, storage: &str) {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.create(&PostParams::default(), &self.definition(storage))
            .await
            .expect("the CRD is created");
        wait_established(client, &self.name()).await;
        self.wait_storage_version(client, storage).await;
    }

    /// Switches the storage version and waits until discovery shows the apiserver writing it.
    pub async fn set_storage_version(&self, client: &Client, storage: &str) {
        update_crd(client, &self.name(), |crd| {
            for version in &mut crd.spec.versions {
                version.storage = version.name == storage;
            }
        })
        .await;
        self.wait_storage_version(client, storage).await;
    }

    /// Marks the CRD so kube-svm's CRD trigger leaves it alone (migrations are created by hand).
    pub async fn opt_out(&self, client: &Client) {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let annotate = json!({ "metadata": { "annotations": {
            kube_svm::trigger::crd::OPT_OUT_ANNOTATION: "false",
        }}});
        crds.patch(&self.name(), &PatchParams::default(), &Patch::Merge(&annotate))
            .await
            .expect("the CRD is annotated");
    }

    /// Stops (or starts again) serving `version`, and waits until discovery says so.
    pub async fn set_served(&self, client: &Client, version: &str, served: bool) {
        update_crd(client, &self.name(), |crd| {
            for each in &mut crd.spec.versions {
                if each.name == version {
                    each.served = served;
                }
            }
        })
        .await;
        let deadline = Instant::now() + CRD_TIMEOUT;
        while client.list_api_group_resources(&self.api_version(version)).await.is_ok() != served {
            assert!(Instant::now() < deadline, "discovery never showed {version} served={served}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until discovery publishes the storage version hash of `version`.
    pub async fn wait_storage_version(&self, client: &Client, version: &str) {
        let expected = storage_version_hash(&self.group, version, Self::KIND);
        let deadline = Instant::now() + CRD_TIMEOUT;
        loop {
            let published =
                client.list_api_group_resources(&self.api_version("v1")).await.ok().and_then(
                    |list| {
                        list.resources
                            .into_iter()
                            .find(|r| r.name == Self::PLURAL)
                            .and_then(|r| r.storage_version_hash)
                    },
                );
            if published.as_deref() == Some(expected.as_str()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "discovery never published storage version {version}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The dynamic API for widgets at `version`, in `namespace` (ignored when cluster-scoped).
    pub fn api(
        &self,
        client: &Client,
        version: &str,
        namespace: Option<&str>,
    ) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk(&self.group, version, Self::KIND);
        let resource = ApiResource::from_gvk_with_plural(&gvk, Self::PLURAL);
        match (self.namespaced, namespace) {
            (true, Some(namespace)) => Api::namespaced_with(client.clone(), namespace, &resource),
            _ => Api::all_with(client.clone(), &resource),
        }
    }

    /// Creates a widget through `version` with a small spec.
    pub async fn create_widget(
        &self,
        client: &Client,
        version: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> DynamicObject {
        let mut object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": self.api_version(version),
            "kind": Self::KIND,
            "metadata": { "name": name },
            "spec": { "size": name.len(), "note": "created by a test" },
        }))
        .expect("a valid widget");
        object.metadata.namespace = namespace.filter(|_| self.namespaced).map(str::to_owned);
        self.api(client, version, namespace)
            .create(&PostParams::default(), &object)
            .await
            .expect("the widget is created")
    }

    /// A fresh cluster-scoped widget CRD holding `count` widgets stored at v1, with its storage
    /// version switched to v2: the state a migration starts from.
    pub async fn stale(client: &Client, test: &str, count: usize) -> WidgetCrd {
        let widgets = WidgetCrd::new(test, false);
        widgets.create(client, "v1").await;
        widgets.seed(client, "v1", &[None], count).await;
        widgets.set_storage_version(client, "v2").await;
        widgets
    }

    /// The etcd key of one widget.
    pub fn etcd_key(&self, namespace: Option<&str>, name: &str) -> String {
        match namespace.filter(|_| self.namespaced) {
            Some(namespace) => format!("{}{namespace}/{name}", self.etcd_prefix()),
            None => format!("{}{name}", self.etcd_prefix()),
        }
    }
}

/// Changes CRD `name` with `change`, reading it again when kube-svm wrote its status meanwhile
/// (409), as any client must.
pub async fn update_crd(
    client: &Client,
    name: &str,
    change: impl Fn(&mut CustomResourceDefinition),
) -> CustomResourceDefinition {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    loop {
        let mut crd = crds.get(name).await.expect("the CRD exists");
        change(&mut crd);
        match crds.replace(name, &PostParams::default(), &crd).await {
            Ok(changed) => return changed,
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => panic!("CRD {name} is not changed: {error}"),
        }
    }
}

/// Waits until a CRD reports `Established`.
pub async fn wait_established(client: &Client, name: &str) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + CRD_TIMEOUT;
    loop {
        let crd = crds.get(name).await.expect("the CRD exists");
        let established = crd
            .status
            .and_then(|status| status.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return;
        }
        assert!(Instant::now() < deadline, "CRD {name} never became established");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Installs kube-svm's CRDs with server-side apply (idempotent across tests) and waits for them.
pub async fn install_kube_svm_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in kube_svm::api::crds() {
        let name = crd.metadata.name.clone().expect("CRDs are named");
        crds.patch(&name, &PatchParams::apply("kube-svm-tests").force(), &Patch::Apply(&crd))
            .await
            .expect("kube-svm's CRD is applied");
        wait_established(client, &name).await;
    }
}

/// Creates a namespace.
pub async fn create_namespace(client: &Client, name: &str) {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(json!({ "metadata": { "name": name } })).expect("valid");
    namespaces.create(&PostParams::default(), &namespace).await.expect("the namespace is created");
}

/// Deletes namespace `name` so that it vanishes while its contents stay in etcd: no namespace
/// controller runs here, so deleting leaves it terminating with its contents, and removing its
/// finalizer makes it go. Returns once it is gone.
pub async fn vanish_namespace(client: &Client, name: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.delete(name, &Default::default()).await.expect("deletion starts");
    let mut terminating = namespaces.get(name).await.expect("terminating");
    terminating.spec = Some(Default::default());
    namespaces
        .replace_subresource("finalize", name, &PostParams::default(), &terminating)
        .await
        .expect("finalized");
    let deadline = Instant::now() + Duration::from_secs(30);
    while namespaces.get_opt(name).await.expect("reads").is_some() {
        assert!(Instant::now() < deadline, "namespace {name} never vanished");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Objects created at once when seeding many.
const CREATE_CONCURRENCY: usize = 32;

impl WidgetCrd {
    /// Creates `per_namespace` widgets named `w-<i>` in each namespace (or cluster-wide when the
    /// CRD is cluster-scoped and `namespaces` is `[None]`), through `version`.
    pub async fn seed(
        &self,
        client: &Client,
        version: &str,
        namespaces: &[Option<&str>],
        per_namespace: usize,
    ) {
        let creates = namespaces.iter().flat_map(|namespace| {
            (0..per_namespace).map(move |i| async move {
                self.create_widget(client, version, *namespace, &format!("w-{i}")).await;
            })
        });
        futures::stream::iter(creates)
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
    }

    /// Asserts that etcd holds exactly `count` widgets, every one encoded as `version`.
    pub async fn assert_all_stored_as(&self, etcd: &Etcd, version: &str, count: usize) {
        let census = Census::of(etcd, self).await;
        let expected = self.api_version(version);
        assert_eq!(
            (census.total(), census.count(&expected)),
            (count, count),
            "expected {count} widgets stored as {expected}, found {:?}",
            census.0
        );
    }
}

/// Two aescbc keys for encryption at rest: (name, base64 of 32 bytes).
pub const KEY1: (&str, &str) = ("key1", "MTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTI=");
pub const KEY2: (&str, &str) = ("key2", "YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXoxMjM0NTY=");
/// A third aescbc key, for a second rotation.
pub const KEY3: (&str, &str) = ("key3", "MDk4NzY1NDMyMTA5ODc2NTQzMjEwOTg3NjU0MzIxMDk=");

/// Writes an EncryptionConfiguration that encrypts Secrets with `keys` (the first writes, all
/// read) and returns the kube-apiserver flag that loads it.
pub fn encrypt_secrets(control_plane: &ControlPlane, keys: &[(&str, &str)]) -> String {
    encrypt(control_plane, &["secrets"], keys)
}

/// Writes an EncryptionConfiguration that encrypts `resources` (`secrets`,
/// `clusterroles.rbac.authorization.k8s.io`) with `keys` (the first writes, all read) and
/// returns the kube-apiserver flag that loads it.
pub fn encrypt(control_plane: &ControlPlane, resources: &[&str], keys: &[(&str, &str)]) -> String {
    let keys: String = keys
        .iter()
        .map(|(name, secret)| format!("      - name: {name}\n        secret: {secret}\n"))
        .collect();
    let resources = resources.join(", ");
    let path = control_plane.path("encryption.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [{resources}]\n  providers:\n  - aescbc:\n      keys:\n{keys}  - identity: {{}}\n"
        ),
    )
    .expect("written");
    format!("--encryption-provider-config={}", path.display())
}

/// Registers `<group>/v1` as an aggregated API whose backend Service does not exist, and waits
/// until its discovery fails (503), as an aggregated API whose server is down does.
pub async fn missing_aggregated_api(client: &Client, group: &str) {
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
    let service: APIService = serde_json::from_value(json!({
        "metadata": { "name": format!("v1.{group}") },
        "spec": {
            "group": group,
            "version": "v1",
            "service": { "namespace": "default", "name": "nothing-here" },
            "insecureSkipTLSVerify": true,
            "groupPriorityMinimum": 1000,
            "versionPriority": 15,
        },
    }))
    .expect("a valid APIService");
    Api::<APIService>::all(client.clone())
        .create(&PostParams::default(), &service)
        .await
        .expect("the APIService is created");
    // Until the aggregator notices, a request may also hang: that counts as failing too.
    let deadline = Instant::now() + Duration::from_secs(30);
    let group_version = format!("{group}/v1");
    let answers = || async {
        let request = client.list_api_group_resources(&group_version);
        matches!(tokio::time::timeout(Duration::from_secs(5), request).await, Ok(Ok(_)))
    };
    while answers().await {
        assert!(Instant::now() < deadline, "the missing backend's discovery keeps answering");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A private control plane encrypting Secrets with [`KEY1`], and `count` Secrets named `s-<i>`
/// (holding `value-<i>`) in a new namespace, which is returned.
pub async fn secrets_under_key1(count: usize) -> (ControlPlane, String) {
    use k8s_openapi::api::core::v1::Secret;
    let control_plane = ControlPlane::start(&[]).await.expect("a private control plane starts");
    control_plane
        .restart_apiserver(&[&encrypt_secrets(&control_plane, &[KEY1])])
        .await
        .expect("restarts with key1");
    let client = control_plane.client().await;
    let namespace = unique("secrets");
    create_namespace(&client, &namespace).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    for i in 0..count {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": { "name": format!("s-{i}") }, "stringData": { "token": format!("value-{i}") },
        }))
        .expect("valid");
        secrets.create(&PostParams::default(), &secret).await.expect("created");
    }
    (control_plane, namespace)
}
