//! Resolving a migration's resource through discovery, and the request paths it is served at.

use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIResource, APIResourceList};
use kube::{Api, Client};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::api::{GroupResource, GroupVersionResource};

/// A resource that discovery says can be listed and patched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group; empty for the core group.
    pub group: String,
    /// The served version requests go to.
    pub version: String,
    /// Plural resource name, as in the URL.
    pub plural: String,
    /// The kind of its objects, such as `Widget`.
    pub kind: String,
    /// Whether its objects live in namespaces.
    pub namespaced: bool,
    /// The resource's `storageVersionHash` from discovery, when published.
    pub storage_version_hash: Option<String>,
    /// Whether a `status` subresource can be patched.
    pub patchable_status: bool,
}

/// Why a resource cannot be migrated.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The migration names no resource.
    #[error("no resource named: spec.resource.resource is empty")]
    Empty,
    /// The name is a subresource's, such as `deployments/scale`.
    #[error("{0:?} is a subresource; name the resource itself")]
    Subresource(String),
    /// Discovery has no such API group.
    #[error("the apiserver does not serve API group {0:?}")]
    UnknownGroup(String),
    /// The group is served, but not at the version named.
    #[error("the apiserver does not serve {0}")]
    UnknownGroupVersion(String),
    /// The group is served, but none of the versions looked at holds such a resource.
    #[error("the apiserver serves no resource {resource:?} in {api_version}")]
    UnknownResource {
        /// The resource as named.
        resource: String,
        /// The `group/version`s discovery was read at, comma-separated.
        api_version: String,
    },
    /// The resource's CRD stores a version it does not serve: no write can go through it.
    #[error(
        "the CRD of {resource} stores version {version}, which it does not serve; kube-svm writes only through the storage version"
    )]
    StorageVersionNotServed {
        /// The CRD's name.
        resource: String,
        /// Its storage version.
        version: String,
    },
    /// The resource's CRD names no storage version.
    #[error("the CRD of {0} has no storage version")]
    NoStorageVersion(String),
    /// The CRD that may serve the resource could not be read; asking again later may succeed.
    #[error("failed to read the CRD {0}")]
    Crd(String, #[source] kube::Error),
    /// The resource cannot be listed or patched.
    #[error("{resource} does not support the verbs {missing:?}, which migration needs")]
    MissingVerbs {
        /// The resource as discovery names it.
        resource: String,
        /// The verbs it lacks, of `list` and `patch`.
        missing: Vec<&'static str>,
    },
    /// Writes were asked to go through a `status` subresource the resource does not have.
    #[error("{0} has no status subresource to write through")]
    NoStatusSubresource(String),
    /// Discovery could not be read; asking again later may succeed.
    #[error("failed to read discovery for {0}")]
    Discovery(String, #[source] kube::Error),
}

impl ResolveError {
    /// Whether asking again later may succeed (discovery was unreachable), as opposed to the
    /// resource being wrong.
    pub fn is_transient(&self) -> bool {
        matches!(self, ResolveError::Discovery(..) | ResolveError::Crd(..))
    }

    /// Whether the apiserver asked serves no such group, version or resource: behind a load
    /// balancer, what one apiserver answers (one of an older release, mid-upgrade) and not
    /// necessarily every one.
    pub fn is_not_served(&self) -> bool {
        matches!(
            self,
            ResolveError::UnknownGroup(_)
                | ResolveError::UnknownGroupVersion(_)
                | ResolveError::UnknownResource { .. }
        )
    }
}

/// Verbs every migrated resource must support.
const REQUIRED_VERBS: [&str; 2] = ["list", "patch"];

/// Whether a discovery entry is a resource that can be migrated: not a subresource, and with
/// the verbs migration needs.
pub fn migratable(entry: &APIResource) -> bool {
    !entry.name.contains('/')
        && REQUIRED_VERBS.iter().all(|verb| entry.verbs.iter().any(|v| v == verb))
}

impl Resource {
    /// Looks the resource up in discovery, at the version its writes must go through:
    /// - a custom resource at its CRD's storage version, whatever version the migration names:
    ///   a write through any other version is a round trip through conversion, which can change
    ///   what is stored (a lossy webhook, or `None` conversion pruning fields);
    /// - a built-in or aggregated resource at the version named, or when none is, at the first
    ///   of its group's versions (the preferred one first) that serves it, as client-go's
    ///   `ServerPreferredResources` picks a version per resource.
    pub async fn resolve(
        client: &Client,
        target: &GroupVersionResource,
        write_to_status: bool,
    ) -> Result<Resource, ResolveError> {
        let GroupVersionResource { group, version, resource } = target;
        if resource.is_empty() {
            return Err(ResolveError::Empty);
        }
        if resource.contains('/') {
            return Err(ResolveError::Subresource(resource.clone()));
        }
        let versions = match storage_version_of_crd(client, group, resource).await? {
            Some(storage) => vec![storage],
            None if !version.is_empty() => vec![version.clone()],
            None => served_versions(client, group).await?,
        };
        let mut looked_in = Vec::new();
        for version in &versions {
            let api_version = api_version(group, version);
            let list = if group.is_empty() {
                client.list_core_api_resources(version).await
            } else {
                client.list_api_group_resources(&api_version).await
            };
            let list = match list {
                Ok(list) => list,
                Err(error) if crate::apiserver::answers::is_not_found(&error) => {
                    if versions.len() == 1 {
                        return Err(ResolveError::UnknownGroupVersion(api_version));
                    }
                    continue;
                }
                Err(error) => return Err(ResolveError::Discovery(api_version, error)),
            };
            match list.resources.iter().find(|r| &r.name == resource) {
                Some(found) => {
                    return Resource::found(group, version, found, &list, write_to_status);
                }
                None => looked_in.push(api_version),
            }
        }
        Err(ResolveError::UnknownResource {
            resource: resource.clone(),
            api_version: looked_in.join(", "),
        })
    }

    /// The resource `found` in discovery's `list` of `group/version`, once it is shown to have
    /// what migration needs.
    fn found(
        group: &str,
        version: &str,
        found: &APIResource,
        list: &APIResourceList,
        write_to_status: bool,
    ) -> Result<Resource, ResolveError> {
        let resource = &found.name;
        let missing: Vec<_> = REQUIRED_VERBS
            .into_iter()
            .filter(|verb| !found.verbs.iter().any(|v| v == verb))
            .collect();
        let display = GroupResource::name_of(group, resource);
        if !missing.is_empty() {
            return Err(ResolveError::MissingVerbs { resource: display, missing });
        }
        let status_name = format!("{resource}/status");
        let patchable_status = list
            .resources
            .iter()
            .any(|r| r.name == status_name && r.verbs.iter().any(|v| v == "patch"));
        if write_to_status && !patchable_status {
            return Err(ResolveError::NoStatusSubresource(display));
        }
        Ok(Resource {
            group: group.to_owned(),
            version: version.to_owned(),
            plural: resource.clone(),
            kind: found.kind.clone(),
            namespaced: found.namespaced,
            storage_version_hash: found.storage_version_hash.clone(),
            patchable_status,
        })
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        api_version(&self.group, &self.version)
    }

    /// The URL path listing every object, across namespaces.
    pub fn collection_path(&self) -> String {
        match self.group.as_str() {
            "" => format!("/api/{}/{}", self.version, self.plural),
            group => format!("/apis/{group}/{}/{}", self.version, self.plural),
        }
    }

    /// The URL path of the collection holding objects of `namespace` (ignored when cluster-scoped).
    pub fn namespaced_path(&self, namespace: &str) -> String {
        if !self.namespaced || namespace.is_empty() {
            return self.collection_path();
        }
        let namespace = segment(namespace);
        match self.group.as_str() {
            "" => format!("/api/{}/namespaces/{namespace}/{}", self.version, self.plural),
            group => {
                format!("/apis/{group}/{}/namespaces/{namespace}/{}", self.version, self.plural)
            }
        }
    }

    /// The URL path of one object, with `/<subresource>` when given.
    pub fn object_path(&self, namespace: &str, name: &str, subresource: Option<&str>) -> String {
        let collection = self.namespaced_path(namespace);
        match subresource {
            Some(subresource) => format!("{collection}/{}/{subresource}", segment(name)),
            None => format!("{collection}/{}", segment(name)),
        }
    }
}

/// What a path segment built from a name must escape: everything but RFC 3986's unreserved
/// characters. Object names may hold `#`, `?`, `%`, spaces and more (a ClusterRole named `x#y`
/// is valid); unescaped, they end the path or change it.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// `name` as one URL path segment.
fn segment(name: &str) -> String {
    utf8_percent_encode(name, SEGMENT).to_string()
}

impl fmt::Display for Resource {
    /// `plural.group`, or `plural` for the core group, as kubectl names resources.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&GroupResource::name_of(&self.group, &self.plural))
    }
}

fn api_version(group: &str, version: &str) -> String {
    match group {
        "" => version.to_owned(),
        group => format!("{group}/{version}"),
    }
}

/// The storage version of the CRD that serves `resource` of `group`; `None` when no CRD does
/// (a built-in or aggregated resource).
async fn storage_version_of_crd(
    client: &Client,
    group: &str,
    resource: &str,
) -> Result<Option<String>, ResolveError> {
    if group.is_empty() {
        return Ok(None);
    }
    let name = GroupResource::name_of(group, resource);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = match crds.get_opt(&name).await {
        Ok(Some(crd)) => crd,
        Ok(None) => return Ok(None),
        Err(error) => return Err(ResolveError::Crd(name, error)),
    };
    let storage = crd.spec.versions.iter().find(|v| v.storage);
    match storage {
        Some(version) if version.served => Ok(Some(version.name.clone())),
        Some(version) => Err(ResolveError::StorageVersionNotServed {
            resource: name,
            version: version.name.clone(),
        }),
        None => Err(ResolveError::NoStorageVersion(name)),
    }
}

/// The versions `group` is served at, its preferred version first, then the others in the
/// order discovery lists them (highest priority first).
async fn served_versions(client: &Client, group: &str) -> Result<Vec<String>, ResolveError> {
    if group.is_empty() {
        return Ok(vec!["v1".to_owned()]);
    }
    let groups = client
        .list_api_groups()
        .await
        .map_err(|error| ResolveError::Discovery("the API group list".to_owned(), error))?;
    let found = groups
        .groups
        .into_iter()
        .find(|g| g.name == group)
        .ok_or_else(|| ResolveError::UnknownGroup(group.to_owned()))?;
    let preferred = found.preferred_version.map(|v| v.version);
    let mut versions: Vec<String> = preferred.iter().cloned().collect();
    versions.extend(
        found.versions.into_iter().map(|v| v.version).filter(|v| Some(v) != preferred.as_ref()),
    );
    match versions.is_empty() {
        true => Err(ResolveError::UnknownGroup(group.to_owned())),
        false => Ok(versions),
    }
}

#[cfg(test)]
impl Resource {
    /// `widgets.example.com/v1`, cluster-scoped, without a hash: the resource unit tests use.
    pub(crate) fn widgets() -> Resource {
        Resource {
            group: "example.com".into(),
            version: "v1".into(),
            plural: "widgets".into(),
            kind: "Widget".into(),
            namespaced: false,
            storage_version_hash: None,
            patchable_status: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(group: &str, namespaced: bool) -> Resource {
        Resource { group: group.into(), namespaced, ..Resource::widgets() }
    }

    #[test]
    fn paths_follow_the_api_layout() {
        assert_eq!(resource("", true).collection_path(), "/api/v1/widgets");
        assert_eq!(resource("", true).namespaced_path("ns"), "/api/v1/namespaces/ns/widgets");
        assert_eq!(resource("example.com", true).collection_path(), "/apis/example.com/v1/widgets");
        assert_eq!(
            resource("example.com", true).namespaced_path("ns"),
            "/apis/example.com/v1/namespaces/ns/widgets"
        );
        assert_eq!(
            resource("example.com", false).namespaced_path(""),
            "/apis/example.com/v1/widgets"
        );
    }

    #[test]
    fn names_are_escaped_as_one_path_segment() {
        let clusterroles = Resource {
            group: "rbac.authorization.k8s.io".into(),
            plural: "clusterroles".into(),
            ..resource("", false)
        };
        let base = "/apis/rbac.authorization.k8s.io/v1/clusterroles";
        for (name, escaped) in [
            ("x#y", "x%23y"),
            ("q?z", "q%3Fz"),
            ("a b", "a%20b"),
            ("100%", "100%25"),
            ("system:node", "system%3Anode"),
            ("w-1.a_b~c", "w-1.a_b~c"),
        ] {
            assert_eq!(clusterroles.object_path("", name, None), format!("{base}/{escaped}"));
        }
        assert_eq!(
            resource("example.com", true).object_path("ns", "x#y", Some("status")),
            "/apis/example.com/v1/namespaces/ns/widgets/x%23y/status"
        );
    }

    #[test]
    fn names_read_like_kubectl() {
        assert_eq!(resource("", true).to_string(), "widgets");
        assert_eq!(resource("example.com", true).to_string(), "widgets.example.com");
        assert_eq!(resource("example.com", true).api_version(), "example.com/v1");
        assert_eq!(resource("", true).api_version(), "v1");
    }
}
