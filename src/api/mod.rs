//! The `migration.k8s.io/v1alpha1` API that kube-svm serves and acts on.
//!
//! The types are wire-compatible with kubernetes-sigs/kube-storage-version-migrator: every upstream
//! field keeps its name and meaning, and kube-svm only adds optional status fields. The CRD YAML
//! committed under `config/crd/` is generated from these types (`kube-svm crds`).

pub mod conditions;
pub mod installed;
mod migration;
mod of_resource;
mod pace;
mod storage_state;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::CustomResourceExt;

pub use conditions::Phase;
pub use migration::{
    Checkpoint, FailedObject, GroupVersionResource, MigrationCondition, MigrationProgress,
    MigrationTarget, StorageVersionMigration, StorageVersionMigrationSpec,
    StorageVersionMigrationStatus,
};
pub use of_resource::{TRIGGER_LABEL, Trigger};
pub use pace::{Budget, Pace};
pub use storage_state::{
    GroupResource, PERSISTED_SINCE_ANNOTATION, StorageState, StorageStateSpec, StorageStateStatus,
    UNKNOWN_HASH,
};

/// The API group of kube-svm's own resources, shared with the upstream migrator.
pub const GROUP: &str = "migration.k8s.io";

/// Annotation every CRD in a `*.k8s.io` group must carry, or the apiserver rejects it.
pub const API_APPROVED_ANNOTATION: &str = "api-approved.kubernetes.io";

/// Value of [`API_APPROVED_ANNOTATION`]. Upstream uses a value starting with `unapproved`, which the
/// apiserver accepts and reports through the `KubernetesAPIApprovalPolicyConformant` condition.
pub const API_APPROVED_VALUE: &str =
    "unapproved, kube-svm serves the kube-storage-version-migrator API";

/// Annotation on a StorageVersionMigration asking kube-svm to write every object through its
/// `status` subresource (value `"true"`); the migration fails when the resource has none.
pub const WRITE_TO_STATUS_ANNOTATION: &str = "kube-svm.io/write-to-status";

/// Annotation on a StorageVersionMigration choosing how hard it presses the apiserver: `gentle`
/// (other clients barely notice the migration) or `fast` (the apiserver's whole throughput, for
/// maintenance windows). Without it, or with another value, the controller's `--pace` applies.
pub const PACE_ANNOTATION: &str = "kube-svm.io/pace";

/// Annotation on a StorageVersionMigration giving its gentle pace a stricter budget than the
/// controller's `--foreground-budget`: how slow a probe of the apiserver, sent as another client
/// would, may get while it writes (`2x` its quiet baseline, or a latency such as `15ms`). The
/// stricter of the two applies, so the annotation can only make a migration gentler.
pub const FOREGROUND_BUDGET_ANNOTATION: &str = "kube-svm.io/foreground-budget";

/// Annotation on a StorageVersionMigration asking kube-svm to remove, from every object it
/// writes, the `managedFields` entries naming a version the CRD no longer serves (value
/// `"true"`), so that the version can be removed from the CRD without breaking server-side apply.
pub const CLEAN_MANAGED_FIELDS_ANNOTATION: &str = "kube-svm.io/clean-managed-fields";

/// Annotation on a StorageVersionMigration by which an operator vouches that every apiserver
/// already encodes the resource's storage version, for clusters where kube-svm cannot confirm it
/// (a changed hash formula, discovery that never settles, an aggregated API, client-IP affinity
/// on the `kubernetes` Service that pins discovery samples to one apiserver). Its value names
/// what is vouched for: the CRD's storage version (`"v2"`), or the storage version hash of a
/// built-in resource; `"true"` vouches for whatever the migration first targets. kube-svm then
/// skips its encoding check, says so in an Event and in `status.target.encodingEvidence`, and
/// may prune `storedVersions` after the migration succeeds. The vouch covers the migration's
/// first run only: it lapses when the target changes, when the run starts over, and on a retry.
pub const ENCODING_CONFIRMED_ANNOTATION: &str = "kube-svm.io/encoding-confirmed";

/// Annotation on a StorageVersionMigration letting the others write first (value `"true"`): it
/// takes a turn to write only when no migration created by hand or for a storage switch waits
/// for one. The CRD trigger sets it on the migrations it creates for CRDs it found switched when
/// it started (the catch-up after an install or an upgrade), so a switch made meanwhile does not
/// wait for them; remove it to let one go first.
pub const BACKLOG_ANNOTATION: &str = "kube-svm.io/backlog";

/// Annotation on a StorageVersionMigration asking kube-svm to run it again in place once it has
/// failed. Its value is a token (`kube-svm retry` writes the time, RFC 3339): the controller
/// acts once per value, recording the value in `status.retryToken`, so setting the same value
/// again, or restarting the controller, runs nothing again.
pub const RETRY_ANNOTATION: &str = "kube-svm.io/retry";

/// A new value for [`RETRY_ANNOTATION`]: the time now, RFC 3339, which also tells an operator
/// when the retry was asked for.
pub fn retry_token() -> String {
    Timestamp::now().to_string()
}

/// Longest message kept for one failed object, in bytes: webhook answers can be kilobytes, and a
/// migration's status must stay well inside what the apiserver accepts (1.5 MB an object in
/// etcd) whatever the input. 512 bytes keep any apiserver or webhook sentence seen in practice.
pub const MESSAGE_LIMIT: usize = 512;

/// Longest condition message, in bytes: counts and the first few failures, each with its
/// message cut to [`MESSAGE_LIMIT`].
pub const CONDITION_MESSAGE_LIMIT: usize = 2048;

/// Longest reason kept, in bytes: reasons are one CamelCase word, unless a webhook says otherwise.
pub const REASON_LIMIT: usize = 128;

/// `text` cut to at most `limit` bytes on a character boundary, with `…` saying it was cut.
pub fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    const MARK: &str = "…";
    let mut end = limit.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

impl StorageVersionMigration {
    /// Whether this migration asks to be written through the `status` subresource.
    pub fn requests_status_writes(&self) -> bool {
        self.annotation_is_true(WRITE_TO_STATUS_ANNOTATION)
    }

    /// The pace this migration asks for with [`PACE_ANNOTATION`], if it names one.
    pub fn requested_pace(&self) -> Option<Pace> {
        let annotations = self.metadata.annotations.as_ref();
        annotations.and_then(|a| a.get(PACE_ANNOTATION)).and_then(|v| Pace::parse(v))
    }

    /// The value of [`PACE_ANNOTATION`] when it names no pace (a typo such as `Fast`), so that
    /// the run can say the default applies instead of ignoring it silently.
    pub fn unknown_pace(&self) -> Option<&str> {
        let annotations = self.metadata.annotations.as_ref();
        let value = annotations.and_then(|a| a.get(PACE_ANNOTATION))?;
        Pace::parse(value).is_none().then_some(value.as_str())
    }

    /// The budget this migration asks for with [`FOREGROUND_BUDGET_ANNOTATION`]: `None` without
    /// the annotation, the reason when its value names no budget.
    pub fn requested_budget(&self) -> Option<Result<Budget, String>> {
        let annotations = self.metadata.annotations.as_ref();
        annotations.and_then(|a| a.get(FOREGROUND_BUDGET_ANNOTATION)).map(|v| Budget::parse(v))
    }

    /// Whether this migration asks for `managedFields` entries of versions not served to be
    /// removed.
    pub fn cleans_managed_fields(&self) -> bool {
        self.annotation_is_true(CLEAN_MANAGED_FIELDS_ANNOTATION)
    }

    /// What an operator vouched for on this migration ([`ENCODING_CONFIRMED_ANNOTATION`]).
    pub fn vouch(&self) -> Vouch {
        let annotations = self.metadata.annotations.as_ref();
        match annotations.and_then(|a| a.get(ENCODING_CONFIRMED_ANNOTATION)).map(String::as_str) {
            None | Some("" | "false") => Vouch::None,
            Some("true") => Vouch::FirstTarget,
            Some(storage) => Vouch::For(storage.to_owned()),
        }
    }

    /// The retry token to act on: the value of [`RETRY_ANNOTATION`] on a Failed migration, when
    /// it is not the one last acted on (`status.retryToken`). `None` otherwise: a migration that
    /// did not fail is never run again, and a token is acted on once.
    pub fn retry_requested(&self) -> Option<&str> {
        let annotations = self.metadata.annotations.as_ref();
        let token = annotations.and_then(|a| a.get(RETRY_ANNOTATION))?.trim();
        let acted_on = self.status.as_ref().and_then(|s| s.retry_token.as_deref());
        let wanted = !token.is_empty() && acted_on != Some(token);
        (wanted && Phase::of(self) == Phase::Failed).then_some(token)
    }

    /// The merge patch that asks for a retry with `token`, conditional on the resourceVersion
    /// this copy was read at: a migration that changed since is read and judged again.
    pub fn retry_patch(&self, token: &str) -> serde_json::Value {
        serde_json::json!({ "metadata": {
            "resourceVersion": self.metadata.resource_version,
            "annotations": { RETRY_ANNOTATION: token },
        }})
    }

    /// Retries run so far (`status.retries`).
    pub fn retries(&self) -> u32 {
        self.status.as_ref().and_then(|s| s.retries).unwrap_or(0)
    }

    /// When the migration ended: its `completionTime`, else (a status schema that drops it) when
    /// its first condition was last updated, else when it was created.
    pub fn ended_at(&self) -> Option<Timestamp> {
        let status = self.status.as_ref();
        let completed = status.and_then(|s| s.completion_time.as_ref());
        let updated = status.and_then(|s| s.conditions.first()?.last_update_time.as_ref());
        let created = self.metadata.creation_timestamp.as_ref();
        completed.or(updated).or(created).map(|t| t.0)
    }

    fn annotation_is_true(&self, key: &str) -> bool {
        let annotations = self.metadata.annotations.as_ref();
        annotations.and_then(|a| a.get(key)).is_some_and(|v| v == "true")
    }
}

/// What an operator vouched for with [`ENCODING_CONFIRMED_ANNOTATION`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Vouch {
    /// Nothing.
    None,
    /// Whatever the migration first targets (`"true"`).
    FirstTarget,
    /// This storage version, or storage version hash.
    For(String),
}

impl Vouch {
    /// Whether the vouch covers a target stored as `storage` (a CRD's storage version, or a
    /// built-in resource's storage version hash), on the migration's first run. Pure.
    pub fn covers(&self, storage: &str) -> bool {
        match self {
            Vouch::None => false,
            Vouch::FirstTarget => true,
            Vouch::For(named) => named == storage,
        }
    }
}

/// A migration named `m` whose first condition is `type_`, true: the state tests start from.
#[cfg(test)]
pub fn in_state(type_: &str) -> StorageVersionMigration {
    let mut migration = StorageVersionMigration::new("m", Default::default());
    let condition = MigrationCondition {
        type_: type_.to_owned(),
        status: conditions::STATUS_TRUE.to_owned(),
        ..MigrationCondition::default()
    };
    migration.status = Some(StorageVersionMigrationStatus {
        conditions: vec![condition],
        ..StorageVersionMigrationStatus::default()
    });
    migration
}

/// Both CRDs, in the order they are printed and installed.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![StorageVersionMigration::crd(), StorageState::crd()]
}

/// Annotation that tells Helm to leave a resource in place when the release is uninstalled, so
/// uninstalling the chart never deletes the CRDs and with them every migration.
pub const HELM_KEEP_ANNOTATION: (&str, &str) = ("helm.sh/resource-policy", "keep");

/// The CRDs as one multi-document YAML stream, exactly as committed under `config/crd/`.
pub fn crds_yaml() -> Result<String, serde_yaml_ng::Error> {
    to_yaml_stream(crds())
}

/// The CRDs as the Helm chart's template, exactly as committed in
/// `charts/kube-svm/templates/crds.yaml`: installed unless `crds.install` is false, and kept
/// when the release is uninstalled.
pub fn crds_chart_template() -> Result<String, serde_yaml_ng::Error> {
    let kept = crds().into_iter().map(|mut crd| {
        let (key, value) = HELM_KEEP_ANNOTATION;
        crd.metadata.annotations.get_or_insert_default().insert(key.to_owned(), value.to_owned());
        crd
    });
    Ok(format!(
        "{{{{- /* Generated from kube-svm's Rust types by `make crds`; do not edit. */}}}}\n\
         {{{{- if .Values.crds.install }}}}\n{}{{{{- end }}}}\n",
        to_yaml_stream(kept)?
    ))
}

fn to_yaml_stream(
    crds: impl IntoIterator<Item = CustomResourceDefinition>,
) -> Result<String, serde_yaml_ng::Error> {
    let mut out = String::new();
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&serde_yaml_ng::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vouch_covers_what_it_names() {
        let vouched = |value: &str| {
            let mut migration = in_state(conditions::RUNNING);
            migration.metadata.annotations =
                Some([(ENCODING_CONFIRMED_ANNOTATION.to_owned(), value.to_owned())].into());
            migration.vouch()
        };
        assert_eq!(in_state(conditions::RUNNING).vouch(), Vouch::None);
        assert_eq!(vouched("false"), Vouch::None);
        assert!(vouched("true").covers("v3"));
        assert!(vouched("v2").covers("v2"));
        assert!(!vouched("v2").covers("v3"));
        assert!(vouched("dbHF0ZRbxSw=").covers("dbHF0ZRbxSw="));
    }

    #[test]
    fn long_text_is_cut_on_a_character_boundary_and_says_so() {
        assert_eq!(cut("short", 10), "short");
        let long = "é".repeat(600);
        let kept = cut(&long, MESSAGE_LIMIT);
        assert!(kept.len() <= MESSAGE_LIMIT, "{}", kept.len());
        assert!(kept.ends_with('…') && kept.starts_with("éé"));
        assert_eq!(cut(&"x".repeat(MESSAGE_LIMIT), MESSAGE_LIMIT).len(), MESSAGE_LIMIT);
    }

    #[test]
    fn a_pace_annotation_is_read_or_said_to_name_no_pace() {
        let with = |value: &str| {
            let mut migration = StorageVersionMigration::new("m", Default::default());
            migration.metadata.annotations =
                Some([(PACE_ANNOTATION.to_owned(), value.to_owned())].into());
            migration
        };
        assert_eq!(with("fast").requested_pace(), Some(Pace::Fast));
        assert_eq!(with("fast").unknown_pace(), None);
        assert_eq!(with("Fast").requested_pace(), None);
        assert_eq!(with("Fast").unknown_pace(), Some("Fast"));
        let plain = StorageVersionMigration::new("m", Default::default());
        assert_eq!((plain.requested_pace(), plain.unknown_pace()), (None, None));
    }

    #[test]
    fn a_retry_token_is_acted_on_once_and_only_for_a_failed_migration() {
        use crate::api::conditions::{FAILED, SUCCEEDED};
        let migration = |phase: &str, token: Option<&str>, acted_on: Option<&str>| {
            let mut migration = in_state(phase);
            migration.metadata.annotations =
                token.map(|t| [(RETRY_ANNOTATION.to_owned(), t.to_owned())].into());
            if let Some(status) = migration.status.as_mut() {
                status.retry_token = acted_on.map(str::to_owned);
            }
            migration
        };
        assert_eq!(migration(FAILED, Some("t1"), None).retry_requested(), Some("t1"));
        assert_eq!(migration(FAILED, Some("t2"), Some("t1")).retry_requested(), Some("t2"));
        // Acted on already: a restart or a resync sees the same token and does nothing.
        assert_eq!(migration(FAILED, Some("t1"), Some("t1")).retry_requested(), None);
        assert_eq!(migration(FAILED, None, Some("t1")).retry_requested(), None);
        assert_eq!(migration(FAILED, Some("  "), None).retry_requested(), None);
        // Only a Failed migration runs again.
        assert_eq!(migration(SUCCEEDED, Some("t1"), None).retry_requested(), None);
        assert_eq!(migration("Running", Some("t1"), None).retry_requested(), None);
    }

    /// The committed CRDs are what `kube-svm crds` prints; regenerate with `make crds`.
    #[test]
    fn committed_crds_match_the_types() {
        let committed = include_str!("../../config/crd/migration.k8s.io.yaml");
        let generated = crds_yaml().expect("CRDs serialize");
        assert!(
            committed == generated,
            "config/crd/migration.k8s.io.yaml is out of date: run `make crds`"
        );
    }

    /// The chart's CRD template is what `kube-svm crds --chart-template` prints.
    #[test]
    fn committed_chart_crds_match_the_types() {
        let committed = include_str!("../../charts/kube-svm/templates/crds.yaml");
        let generated = crds_chart_template().expect("CRDs serialize");
        assert!(
            committed == generated,
            "charts/kube-svm/templates/crds.yaml is out of date: run `make crds`"
        );
    }

    #[test]
    fn chart_crds_are_kept_on_uninstall_and_optional() {
        let template = crds_chart_template().expect("CRDs serialize");
        assert!(template.contains("{{- if .Values.crds.install }}"));
        assert_eq!(template.matches("helm.sh/resource-policy: keep").count(), crds().len());
    }

    /// The apiserver warns on every create of an object whose schema names a format it does
    /// not know (`uint64`, `uint16`).
    #[test]
    fn schemas_use_only_formats_the_apiserver_knows() {
        fn formats(value: &serde_json::Value, found: &mut Vec<String>) {
            match value {
                serde_json::Value::Object(map) => {
                    if let Some(serde_json::Value::String(format)) = map.get("format") {
                        found.push(format.clone());
                    }
                    map.values().for_each(|v| formats(v, found));
                }
                serde_json::Value::Array(items) => items.iter().for_each(|v| formats(v, found)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        for crd in crds() {
            formats(&serde_json::to_value(&crd.spec).expect("serializes"), &mut found);
        }
        assert!(found.contains(&"int64".to_owned()), "{found:?}");
        let known = ["int32", "int64", "date-time", "byte", "date", "duration", "uri"];
        let unknown: Vec<_> = found.iter().filter(|f| !known.contains(&f.as_str())).collect();
        assert!(unknown.is_empty(), "formats the apiserver does not know: {unknown:?}");
    }

    #[test]
    fn crds_carry_the_api_approval_annotation() {
        for crd in crds() {
            let annotations = crd.metadata.annotations.unwrap_or_default();
            assert_eq!(
                annotations.get(API_APPROVED_ANNOTATION).map(String::as_str),
                Some(API_APPROVED_VALUE)
            );
            assert!(API_APPROVED_VALUE.starts_with("unapproved"));
        }
    }

    #[test]
    fn status_writes_are_requested_only_by_a_true_annotation() {
        let with = |value: &str| {
            let mut migration = StorageVersionMigration::new("m", Default::default());
            migration.metadata.annotations =
                Some([(WRITE_TO_STATUS_ANNOTATION.to_owned(), value.to_owned())].into());
            migration
        };
        assert!(with("true").requests_status_writes());
        assert!(!with("false").requests_status_writes());
        assert!(!with("yes").requests_status_writes());
        assert!(!StorageVersionMigration::new("m", Default::default()).requests_status_writes());
    }

    #[test]
    fn crds_are_cluster_scoped_with_status_subresource() {
        for crd in crds() {
            assert_eq!(crd.spec.group, GROUP);
            assert_eq!(crd.spec.scope, "Cluster");
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, "v1alpha1");
            assert!(version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
        }
    }
}
