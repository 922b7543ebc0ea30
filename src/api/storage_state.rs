use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The placeholder a StorageState's `persistedStorageVersionHashes` starts with (as
/// kube-storage-version-migrator writes it): nothing is known of how the objects are stored.
pub const UNKNOWN_HASH: &str = "Unknown";

/// Annotation on a StorageState: when its `persistedStorageVersionHashes` last changed, or
/// discovery last showed a hash other than the current one (RFC 3339). Only a migration started
/// after it can prove the objects are stored in the current hash alone.
pub const PERSISTED_SINCE_ANNOTATION: &str = "kube-svm.io/persisted-since";

// Several printcolumn(...) share a `type_`, which clippy mistakes for a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "migration.k8s.io",
    version = "v1alpha1",
    kind = "StorageState",
    status = "StorageStateStatus",
    shortname = "svmstate",
    category = "kube-svm",
    annotation(
        "api-approved.kubernetes.io",
        "unapproved, kube-svm serves the kube-storage-version-migrator API"
    ),
    doc = "The storage state of one resource: which storage versions its objects may be stored in. Named <resource>.<group>, or <resource> for the core group. The discovery trigger appends a new storage version hash to persistedStorageVersionHashes when the apiserver starts writing a new one and creates a StorageVersionMigration; once that succeeds the list holds the current hash alone.",
    printcolumn(name = "Resource", type_ = "string", json_path = ".spec.resource.resource"),
    printcolumn(name = "Group", type_ = "string", json_path = ".spec.resource.group"),
    printcolumn(
        name = "Current",
        type_ = "string",
        json_path = ".status.currentStorageVersionHash"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
/// Which resource this storage state describes.
#[serde(rename_all = "camelCase")]
pub struct StorageStateSpec {
    /// The resource this storage state is about.
    #[serde(default)]
    pub resource: GroupResource,
}

/// A resource within an API group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupResource {
    /// The API group; empty for the core group.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// The resource, in its plural lowercase form, for example `secrets`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
}

impl GroupResource {
    /// A resource as kubectl takes it, `resource[.group]`: `widgets.example.com` is resource
    /// `widgets` in group `example.com`, `secrets` is in the core group. Case does not matter.
    pub fn parse(argument: &str) -> GroupResource {
        let argument = argument.to_ascii_lowercase();
        let (resource, group) = argument.split_once('.').unwrap_or((&argument, ""));
        GroupResource { group: group.to_owned(), resource: resource.to_owned() }
    }

    /// `<resource>.<group>`, or `<resource>` for the core group: how kubectl names it, and
    /// the name of its StorageState.
    pub fn name(&self) -> String {
        GroupResource::name_of(&self.group, &self.resource)
    }

    /// [`GroupResource::name`] of `resource` in `group`.
    pub fn name_of(group: &str, resource: &str) -> String {
        match group {
            "" => resource.to_owned(),
            group => format!("{resource}.{group}"),
        }
    }
}

/// What is known about how a resource's objects are stored.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageStateStatus {
    /// Storage version hashes the resource's objects may be stored in. `["Unknown"]` when the state
    /// was created and nothing is known yet; the current hash alone after a successful migration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub persisted_storage_version_hashes: Vec<String>,
    /// The storage version hash the apiserver currently writes, from discovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_storage_version_hash: Option<String>,
    /// When the discovery trigger last checked this resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_are_named_as_kubectl_names_them() {
        let secrets = GroupResource { group: String::new(), resource: "secrets".into() };
        assert_eq!(GroupResource::parse("secrets"), secrets);
        assert_eq!(secrets.name(), "secrets");
        let widgets = GroupResource { group: "example.com".into(), resource: "widgets".into() };
        assert_eq!(GroupResource::parse("Widgets.Example.com"), widgets);
        assert_eq!(widgets.name(), "widgets.example.com");
    }
}
