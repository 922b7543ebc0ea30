//! Whether the cluster's copies of kube-svm's CRDs can carry what kube-svm writes, decided
//! purely from the installed CustomResourceDefinitions.
//!
//! kube-storage-version-migrator installs CRDs of the same names whose status schema holds only
//! `conditions`, and the apiserver silently drops (prunes) every field a schema does not name. A
//! controller writing into them would lose its checkpoints, its counts and the proof a prune of
//! `storedVersions` needs, so it must refuse to run and say how to take the CRDs over.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion, JSONSchemaProps,
    JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};

/// The command that installs kube-svm's CRDs, or replaces other CRDs of the same names in place
/// (kube-storage-version-migrator's): server-side apply merges kube-svm's schema, a superset of
/// upstream's, into the existing objects; `--force-conflicts` takes over the fields another
/// field manager (upstream's `kubectl apply`) owns. Existing objects are untouched.
pub const TAKE_OVER_COMMAND: &str =
    "kube-svm crds | kubectl apply --server-side --force-conflicts -f -";

/// What is wrong with one of kube-svm's CRDs as installed in the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unusable {
    /// The CRD is not installed.
    Missing,
    /// The CRD has no version of the name kube-svm writes, or does not serve it.
    VersionNotServed {
        /// The version kube-svm writes.
        version: String,
    },
    /// The version has no `status` subresource: kube-svm's status writes would fail.
    NoStatusSubresource {
        /// The version without one.
        version: String,
    },
    /// The version's schema would drop these fields (paths such as `.status.progress`).
    PrunesFields {
        /// The version whose schema drops them.
        version: String,
        /// The dropped fields, as paths from the object's root.
        fields: Vec<String>,
    },
    /// Installed and fit, but the apiserver does not serve it yet.
    NotEstablished,
}

impl Unusable {
    /// What is wrong, for a log line, `/readyz` and an Event.
    pub fn describe(&self, crd: &str) -> String {
        match self {
            Unusable::Missing => format!("CRD {crd} is not installed"),
            Unusable::VersionNotServed { version } => {
                format!("CRD {crd} is not kube-svm's: it does not serve {version}")
            }
            Unusable::NoStatusSubresource { version } => {
                format!("CRD {crd} is not kube-svm's: {version} has no status subresource")
            }
            Unusable::PrunesFields { version, fields } => format!(
                "CRD {crd} is not kube-svm's: its {version} schema would drop {}",
                fields.join(", ")
            ),
            Unusable::NotEstablished => format!("CRD {crd} is not established yet"),
        }
    }

    /// Whether it may fix itself: the apiserver establishing a CRD just created.
    pub fn transient(&self) -> bool {
        matches!(self, Unusable::NotEstablished)
    }

    /// Whether an installed CRD is someone else's (kube-storage-version-migrator's, or an older
    /// kube-svm's): it must be taken over, not merely installed.
    pub fn foreign(&self) -> bool {
        matches!(
            self,
            Unusable::VersionNotServed { .. }
                | Unusable::NoStatusSubresource { .. }
                | Unusable::PrunesFields { .. }
        )
    }
}

/// Checks the cluster's copy of one of kube-svm's CRDs (`installed`, `None` when it is not
/// installed) against kube-svm's own (`ours`): every version kube-svm writes must be served,
/// have a status subresource, and keep every field kube-svm's schema names.
pub fn check(
    ours: &CustomResourceDefinition,
    installed: Option<&CustomResourceDefinition>,
) -> Result<(), Unusable> {
    let Some(installed) = installed else { return Err(Unusable::Missing) };
    for version in &ours.spec.versions {
        let name = version.name.clone();
        let found = installed.spec.versions.iter().find(|v| v.name == version.name);
        let Some(found) = found.filter(|v| v.served) else {
            return Err(Unusable::VersionNotServed { version: name });
        };
        if found.subresources.as_ref().and_then(|s| s.status.as_ref()).is_none() {
            return Err(Unusable::NoStatusSubresource { version: name });
        }
        // A CRD that preserves unknown fields everywhere (only possible for ones created before
        // apiextensions v1) prunes nothing.
        if installed.spec.preserve_unknown_fields != Some(true) {
            let fields = pruned_fields(schema(version), schema(found));
            if !fields.is_empty() {
                return Err(Unusable::PrunesFields { version: name, fields });
            }
        }
    }
    let conditions = installed.status.as_ref().and_then(|s| s.conditions.as_deref());
    let established = conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    match established {
        true => Ok(()),
        false => Err(Unusable::NotEstablished),
    }
}

fn schema(version: &CustomResourceDefinitionVersion) -> Option<&JSONSchemaProps> {
    version.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref())
}

/// Every field `ours` names that a schema `installed` would drop, as paths from the object's
/// root (`.status.progress`, `.status.conditions[].reason`); a field dropped whole is named, not
/// its contents. A level of `installed` with `x-kubernetes-preserve-unknown-fields: true` keeps
/// the fields it does not name, and everything in them. `apiVersion`, `kind` and `metadata`
/// are the apiserver's, never pruned.
pub fn pruned_fields(
    ours: Option<&JSONSchemaProps>,
    installed: Option<&JSONSchemaProps>,
) -> Vec<String> {
    let mut pruned = Vec::new();
    let empty = JSONSchemaProps::default();
    let (ours, installed) = (ours.unwrap_or(&empty), installed.unwrap_or(&empty));
    for (name, field) in ours.properties.iter().flatten() {
        if !["apiVersion", "kind", "metadata"].contains(&name.as_str()) {
            let kept = installed.properties.as_ref().and_then(|p| p.get(name));
            walk_field(field, kept, installed, &format!(".{name}"), &mut pruned);
        }
    }
    pruned
}

/// Walks field `ours` at `path`, which the installed schema describes as `kept` (`None` when
/// it does not name it) within `parent`.
fn walk_field(
    ours: &JSONSchemaProps,
    kept: Option<&JSONSchemaProps>,
    parent: &JSONSchemaProps,
    path: &str,
    pruned: &mut Vec<String>,
) {
    match kept {
        Some(installed) => walk(ours, installed, path, pruned),
        None if preserves(parent) => {}
        None => pruned.push(path.to_owned()),
    }
}

/// Walks the fields below `path`, which both schemas describe.
fn walk(ours: &JSONSchemaProps, installed: &JSONSchemaProps, path: &str, pruned: &mut Vec<String>) {
    let empty = JSONSchemaProps::default();
    for (name, field) in ours.properties.iter().flatten() {
        let kept = installed.properties.as_ref().and_then(|p| p.get(name));
        walk_field(field, kept, installed, &format!("{path}.{name}"), pruned);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(items)) = &ours.items {
        let kept = match &installed.items {
            Some(JSONSchemaPropsOrArray::Schema(kept)) => kept,
            _ => &empty,
        };
        walk(items, kept, &format!("{path}[]"), pruned);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = &ours.additional_properties {
        match &installed.additional_properties {
            Some(JSONSchemaPropsOrBool::Schema(kept)) => {
                walk(values, kept, &format!("{path}.*"), pruned)
            }
            _ if preserves(installed) => {}
            _ => pruned.push(format!("{path}.*")),
        }
    }
    // kube-svm writes fields of its own choosing at a level that preserves unknown fields.
    if preserves(ours) && !preserves(installed) && installed.additional_properties.is_none() {
        pruned.push(format!("{path}.*"));
    }
}

fn preserves(schema: &JSONSchemaProps) -> bool {
    schema.x_kubernetes_preserve_unknown_fields == Some(true)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::crds;

    fn ours() -> CustomResourceDefinition {
        crds().remove(0)
    }

    /// kube-svm's StorageVersionMigration CRD with its schema replaced by `schema`, established.
    fn installed(schema: serde_json::Value) -> CustomResourceDefinition {
        let mut crd = ours();
        crd.spec.versions[0].schema =
            Some(serde_json::from_value(json!({ "openAPIV3Schema": schema })).unwrap());
        crd.status = Some(
            serde_json::from_value(json!({
                "conditions": [{ "type": "Established", "status": "True" }],
            }))
            .unwrap(),
        );
        crd
    }

    /// Upstream's CRD with this schema for `status`.
    fn upstream_with_status(status: serde_json::Value) -> CustomResourceDefinition {
        let mut crd = upstream();
        if let Some(schema) =
            crd.spec.versions[0].schema.as_mut().and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema
                .properties
                .as_mut()
                .unwrap()
                .insert("status".into(), serde_json::from_value(status).unwrap());
        }
        crd
    }

    /// The shape of kube-storage-version-migrator's CRD: status holds only `conditions`.
    fn upstream() -> CustomResourceDefinition {
        let string = json!({ "type": "string" });
        installed(json!({
            "type": "object",
            "properties": {
                "apiVersion": string, "kind": string, "metadata": { "type": "object" },
                "spec": { "type": "object", "required": ["resource"], "properties": {
                    "continueToken": string,
                    "resource": { "type": "object", "properties": {
                        "group": string, "resource": string, "version": string,
                    }},
                }},
                "status": { "type": "object", "properties": {
                    "conditions": { "type": "array", "items": {
                        "type": "object", "required": ["status", "type"], "properties": {
                            "lastUpdateTime": { "type": "string", "format": "date-time" },
                            "message": string, "reason": string, "status": string, "type": string,
                        },
                    }},
                }},
            },
        }))
    }

    #[test]
    fn kube_svms_own_crds_are_usable() {
        for crd in crds() {
            let mut installed = crd.clone();
            installed.status = Some(
                serde_json::from_value(json!({
                    "conditions": [{ "type": "Established", "status": "True" }],
                }))
                .unwrap(),
            );
            assert_eq!(check(&crd, Some(&installed)), Ok(()));
        }
    }

    #[test]
    fn upstreams_crd_prunes_every_status_field_but_conditions() {
        let Err(Unusable::PrunesFields { version, fields }) = check(&ours(), Some(&upstream()))
        else {
            panic!("upstream's CRD must be refused");
        };
        assert_eq!(version, "v1alpha1");
        assert_eq!(
            fields,
            [
                ".status.checkpoint",
                ".status.completionTime",
                ".status.failedObjects",
                ".status.listedFromStart",
                ".status.progress",
                ".status.restarts",
                ".status.retries",
                ".status.retryToken",
                ".status.startTime",
                ".status.target",
            ]
        );
    }

    #[test]
    fn fields_missing_deep_down_are_named_by_their_path() {
        let mut schema = serde_json::to_value(ours().spec.versions[0].schema.clone()).unwrap();
        let status = &mut schema["openAPIV3Schema"]["properties"]["status"]["properties"];
        let conditions = &mut status["conditions"]["items"]["properties"];
        conditions.as_object_mut().unwrap().remove("reason");
        let progress = &mut status["progress"]["properties"];
        progress.as_object_mut().unwrap().remove("remaining");
        let crd = installed(schema["openAPIV3Schema"].clone());
        assert_eq!(
            check(&ours(), Some(&crd)),
            Err(Unusable::PrunesFields {
                version: "v1alpha1".into(),
                fields: vec![
                    ".status.conditions[].reason".into(),
                    ".status.progress.remaining".into()
                ],
            })
        );
    }

    #[test]
    fn a_level_that_preserves_unknown_fields_keeps_everything_below_it() {
        let crd = upstream_with_status(json!({
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
            "properties": { "conditions": { "type": "array", "items": {
                "type": "object", "x-kubernetes-preserve-unknown-fields": true,
            }}},
        }));
        assert_eq!(check(&ours(), Some(&crd)), Ok(()));
        // Named fields are still pruned below a level that preserves: conditions' items here.
        let crd = upstream_with_status(json!({
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
            "properties": { "conditions": { "type": "array", "items": {
                "type": "object", "properties": { "type": { "type": "string" } },
            }}},
        }));
        let Err(Unusable::PrunesFields { fields, .. }) = check(&ours(), Some(&crd)) else {
            panic!("condition fields are pruned");
        };
        assert!(fields.contains(&".status.conditions[].reason".to_owned()), "{fields:?}");
        assert!(!fields.iter().any(|f| f.starts_with(".status.progress")), "{fields:?}");
    }

    #[test]
    fn missing_versions_subresources_and_crds_are_told_apart() {
        assert_eq!(check(&ours(), None), Err(Unusable::Missing));
        let mut crd = upstream();
        crd.spec.versions[0].subresources = None;
        assert_eq!(
            check(&ours(), Some(&crd)),
            Err(Unusable::NoStatusSubresource { version: "v1alpha1".into() })
        );
        crd.spec.versions[0].served = false;
        assert_eq!(
            check(&ours(), Some(&crd)),
            Err(Unusable::VersionNotServed { version: "v1alpha1".into() })
        );
        let mut fresh = ours();
        fresh.status = None;
        assert_eq!(check(&ours(), Some(&fresh)), Err(Unusable::NotEstablished));
        assert!(Unusable::NotEstablished.transient() && !Unusable::Missing.foreign());
    }

    #[test]
    fn descriptions_name_the_crd_and_the_fields() {
        let pruned = Unusable::PrunesFields {
            version: "v1alpha1".into(),
            fields: vec![".status.progress".into(), ".status.target".into()],
        };
        let text = pruned.describe("storageversionmigrations.migration.k8s.io");
        assert_eq!(
            text,
            "CRD storageversionmigrations.migration.k8s.io is not kube-svm's: its v1alpha1 \
             schema would drop .status.progress, .status.target"
        );
    }
}
