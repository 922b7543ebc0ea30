use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

// Several printcolumn(...) share a `type_`, which clippy mistakes for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[kube(
    group = "migration.k8s.io",
    version = "v1alpha1",
    kind = "StorageVersionMigration",
    status = "StorageVersionMigrationStatus",
    // `kubectl get svm` finds kube-svm's migrations on every release, also where the in-tree
    // migrator's API (1.37+) takes the bare resource name; `kubectl get kube-svm` lists all kinds.
    shortname = "svm",
    category = "kube-svm",
    annotation(
        "api-approved.kubernetes.io",
        "unapproved, kube-svm serves the kube-storage-version-migrator API"
    ),
    doc = "A request to migrate every stored object of one resource to its current storage version. kube-svm reads each object of the resource and writes it back unchanged, so that the apiserver re-encodes it in the current storage version and with the current encryption key. Progress and outcome are in status; .status.conditions[0].type is Running, Succeeded or Failed once kube-svm has picked the migration up.",
    printcolumn(name = "Resource", type_ = "string", json_path = ".spec.resource.resource"),
    printcolumn(name = "Group", type_ = "string", json_path = ".spec.resource.group"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.conditions[0].type"),
    printcolumn(
        name = "Processed",
        type_ = "integer",
        json_path = ".status.progress.processed",
        description = "Objects handled so far"
    ),
    printcolumn(
        name = "Remaining",
        type_ = "integer",
        json_path = ".status.progress.remaining",
        description = "Estimate of the objects still to handle"
    ),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.progress.failed"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
/// What to migrate.
#[serde(rename_all = "camelCase")]
pub struct StorageVersionMigrationSpec {
    /// The resource to migrate. kube-svm sends its requests to the endpoint serving this resource.
    /// Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.resource is immutable"))]
    pub resource: GroupVersionResource,

    /// The continue token of the list request to resume from. Kept for compatibility with
    /// migrations written for kube-storage-version-migrator: kube-svm resumes from it when the
    /// status has no checkpoint of its own, and records its progress in `status.checkpoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_token: Option<String>,
}

/// A resource, named by API group, version and plural resource name.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupVersionResource {
    /// The API group; empty for the core group (for example for `secrets`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// The API version to send requests to. Any served version works: the apiserver always stores
    /// in the storage version. Empty means the group's preferred version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// The resource, in its plural lowercase form, for example `secrets` or `crontabs`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
}

/// The observed state of a migration.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageVersionMigrationStatus {
    /// The latest observations of the migration's state. Exactly one of Running, Succeeded and
    /// Failed is present, and it is the first entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<MigrationCondition>,

    /// Object counts so far. Exact, including when the migration resumed after a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<MigrationProgress>,

    /// Where a restarted controller resumes: the continue token of the next page to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Checkpoint>,

    /// The first objects that could not be migrated (at most a few dozen are listed; the count in
    /// `progress.failed` is always exact).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_objects: Vec<FailedObject>,

    /// What the migration moved the objects to, recorded when it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<MigrationTarget>,

    /// Whether kube-svm listed the resource from its first object: true when the migration
    /// started at the beginning of the list (or resumed from kube-svm's own checkpoint of such a
    /// run), false when it began at a `spec.continueToken` another migrator left, so objects
    /// before it were never written by kube-svm. `status.storedVersions` of a CRD is pruned only
    /// after a run that listed from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listed_from_start: Option<bool>,

    /// Times the migration started over from the first object because the resource's storage
    /// version (or its CRD) changed after it had begun writing, or etcd was restored or the
    /// apiservers restarted under it: objects written before may be stored in the version
    /// before, or be undone. After a few, the migration fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int32"))]
    pub restarts: Option<u32>,

    /// Times the migration was run again in place after it had failed, at the request of the
    /// annotation `kube-svm.io/retry` (set by `kube-svm retry`, or by the CRD trigger for its
    /// own migrations). Each retry starts from the first object; an Event `Retried` keeps the
    /// outcome it cleared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int32"))]
    pub retries: Option<u32>,

    /// The value of the annotation `kube-svm.io/retry` that kube-svm last acted on: a retry is
    /// run once per value, whatever restarts or resyncs follow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_token: Option<String>,

    /// When kube-svm started the migration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the migration reached Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

/// Describes the state of a migration at a certain point.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationCondition {
    /// Type of the condition: Running, Succeeded or Failed.
    #[serde(rename = "type")]
    pub type_: String,
    /// Status of the condition, one of True, False, Unknown.
    pub status: String,
    /// The last time this condition was updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// A machine-readable reason for the condition's last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable message with details about the transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Object counts of a migration. Integer formats are the ones the apiserver knows (`int64`,
/// `int32`), not Rust's `uint64`, which it warns about on every create.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationProgress {
    /// Objects returned by the list requests so far.
    #[serde(default)]
    #[schemars(extend("format" = "int64"))]
    pub listed: u64,
    /// Objects handled so far, whatever the result: rewritten + cleaned + alreadyCurrent +
    /// skipped + failed.
    #[serde(default)]
    #[schemars(extend("format" = "int64"))]
    pub processed: u64,
    /// Objects the apiserver wrote back to etcd, re-encoded.
    #[serde(default)]
    #[schemars(extend("format" = "int64"))]
    pub rewritten: u64,
    /// Objects written back, re-encoded, with their `managedFields` entries naming versions no
    /// longer served removed (migrations that clean them only).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(extend("format" = "int64"))]
    pub cleaned: u64,
    /// Objects already stored in the current encoding: the apiserver skipped the write.
    #[serde(default)]
    #[schemars(extend("format" = "int64"))]
    pub already_current: u64,
    /// Objects that needed no write from kube-svm: deleted since they were listed, or written by
    /// someone else since (which re-encoded them).
    #[serde(default)]
    #[schemars(extend("format" = "int64"))]
    pub skipped: u64,
    /// Objects that could not be migrated; see `failedObjects`.
    #[serde(default)]
    #[schemars(extend("format" = "int64"))]
    pub failed: u64,
    /// Estimate of the objects still to handle, from the apiserver's `remainingItemCount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int64"))]
    pub remaining: Option<u64>,
    /// How hard the migration presses the apiserver: `gentle` (other clients barely notice it)
    /// or `fast` (the apiserver's whole throughput). Chosen by the annotation `kube-svm.io/pace`
    /// or the controller's `--pace`; set from the first checkpoint on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace: Option<String>,
    /// Object writes the running migration may have in flight at once, as its adaptive window
    /// allowed at the last checkpoint. Absent once the migration has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int32"))]
    pub window: Option<u32>,
    /// Why the window was held below its maximum at the last checkpoint, for the cluster's sake:
    /// `latency` (the apiserver answered slower than the pace allows) or `throttling` (the
    /// apiserver answered 429). Absent when nothing held it back, and once the migration has
    /// ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holding_back: Option<String>,
    /// What the gentle pace steers by, at the last checkpoint: the p99 of a probe kube-svm sends
    /// as another client would, against its budget, the rate of writes that allows, and the
    /// writes that rate may have in flight at once (`probe p99 7.1ms, budget 12.0ms (3x its
    /// quiet 4.0ms); 24.0 objects/s, 2 in flight at most`). Absent at the fast pace, and once
    /// the migration has ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreground: Option<String>,
}

/// A point to resume a migration from.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// Continue token of the next page to read; empty when every page has been read.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub continue_token: String,
    /// When the checkpoint was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}

/// An object that could not be migrated.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FailedObject {
    /// The object's namespace; empty for cluster-scoped resources.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// HTTP status code of the last attempt; 0 when no response was received.
    #[serde(default)]
    #[schemars(extend("format" = "int32"))]
    pub code: u16,
    /// The apiserver's reason for the last failure, for example `Invalid` or `Forbidden`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The apiserver's message for the last failure.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// What a migration moves the objects to, recorded when it starts. For a CRD-backed resource these
/// are what decide whether `status.storedVersions` can be pruned afterwards.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationTarget {
    /// The storage version the apiserver encodes in, for example `v2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_version: Option<String>,
    /// The storage version hash the migration targets: the resource's `storageVersionHash` from
    /// discovery, or for a CRD the hash of its storage version. A checkpoint is resumed only
    /// while discovery still publishes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_version_hash: Option<String>,
    /// `metadata.generation` of the CustomResourceDefinition, for CRD-backed resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crd_generation: Option<i64>,
    /// `metadata.uid` of the CustomResourceDefinition: a CRD deleted and created again under the
    /// same name is another CRD, whose objects this migration may never have listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crd_uid: Option<String>,
    /// `metadata.resourceVersion` of the CustomResourceDefinition as last followed: the run
    /// watches it from there, so a change that leaves the storage version alone (a caBundle,
    /// printer columns) neither starts it over nor keeps `storedVersions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crd_resource_version: Option<String>,
    /// Whether, before the migration started, the apiservers were proven to encode in the
    /// storage version; `status.storedVersions` of the CRD is pruned only then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding_confirmed: Option<bool>,
    /// How the encoding was confirmed, or what was seen instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding_evidence: Option<String>,
    /// The kube-apiserver processes answering when the migration started (the holders of their
    /// identity Leases; a holder changes at every restart of its apiserver). A checkpoint is
    /// resumed only while the same ones answer: a restart can bring another encryption key or
    /// storage version, or follow an etcd restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apiservers: Option<Vec<String>>,
}

impl MigrationProgress {
    /// `12 rewritten, 3 already current, 0 skipped`, with the objects whose `managedFields`
    /// were cleaned when there are any: `0 rewritten, 12 with managedFields cleaned, …`.
    pub fn outcomes(&self) -> String {
        let cleaned = match self.cleaned {
            0 => String::new(),
            cleaned => format!(", {cleaned} with managedFields cleaned"),
        };
        format!(
            "{} rewritten{cleaned}, {} already current, {} skipped",
            self.rewritten, self.already_current, self.skipped
        )
    }
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}
