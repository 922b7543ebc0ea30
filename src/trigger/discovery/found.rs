//! What discovery shows the trigger: every migratable resource with its storage version hash,
//! and the cluster's CRDs.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIResourceList, GroupVersionForDiscovery};
use kube::Api;

use super::Error;
use crate::api::GroupResource;
use crate::apiserver::requests::Requests;

/// How long one group's discovery may take: an aggregated API whose backend hangs must not
/// hold up the others for a whole request timeout.
const GROUP_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A resource discovery says can be migrated.
pub(super) struct Discovered {
    pub resource: GroupResource,
    pub kind: String,
    /// The version migrations are created for: the first of its group's versions, the
    /// preferred one first, that serves it.
    pub version: String,
    pub hash: String,
}

/// Every migratable resource discovery shows, read through a new connection (so that, behind a
/// load balancer, consecutive polls may reach different apiservers); and the group versions
/// whose discovery failed. Every served version of every group is read, and each resource is
/// taken at the first version that lists it, the group's preferred version first (as client-go's
/// `ServerPreferredResources` does): a resource served only at a version its group does not
/// prefer (a CRD beside newer CRDs of its group, a beta built-in in a GA group) is seen too.
pub(super) async fn discover(requests: &Requests) -> Result<(Vec<Discovered>, Vec<String>), Error> {
    let client = requests.fresh_client().map_err(Error::Discovery)?;
    let mut lists: Vec<(String, String, APIResourceList)> = Vec::new();
    let mut unexamined = Vec::new();
    let core = client.list_core_api_resources("v1").await.map_err(Error::Discovery)?;
    lists.push((String::new(), "v1".into(), core));
    let groups = client.list_api_groups().await.map_err(Error::Discovery)?;
    for group in groups.groups {
        for version in in_preference_order(group.preferred_version, group.versions) {
            let request = client.list_api_group_resources(&version.group_version);
            match tokio::time::timeout(GROUP_DISCOVERY_TIMEOUT, request).await {
                Ok(Ok(list)) => lists.push((group.name.clone(), version.version, list)),
                Ok(Err(error)) => unexamined.push(format!(
                    "{}: {}",
                    version.group_version,
                    crate::error_chain(&error)
                )),
                Err(_) => unexamined.push(format!(
                    "{}: no answer within {GROUP_DISCOVERY_TIMEOUT:?}",
                    version.group_version
                )),
            }
        }
    }
    let mut seen = HashSet::new();
    let discovered = lists
        .into_iter()
        .flat_map(|(group, version, list)| {
            list.resources.into_iter().filter_map(move |r| {
                let migratable = crate::engine::migratable(&r);
                let hash = r.storage_version_hash.filter(|_| migratable)?;
                Some(Discovered {
                    resource: GroupResource { group: group.clone(), resource: r.name },
                    kind: r.kind,
                    version: version.clone(),
                    hash,
                })
            })
        })
        .filter(|found| seen.insert(found.resource.clone()))
        .collect();
    Ok((discovered, unexamined))
}

/// A group's versions, its preferred one first, then the others in discovery's order.
fn in_preference_order(
    preferred: Option<GroupVersionForDiscovery>,
    versions: Vec<GroupVersionForDiscovery>,
) -> Vec<GroupVersionForDiscovery> {
    let mut ordered: Vec<_> = preferred.into_iter().collect();
    let others: Vec<_> = versions.into_iter().filter(|v| !ordered.contains(v)).collect();
    ordered.extend(others);
    ordered
}

/// The names of the cluster's CRDs (`<plural>.<group>`, as a StorageState's), read as
/// metadata only; none when they cannot be read (every new hash then gets a check of its own).
pub(super) async fn crd_names(requests: &Requests) -> BTreeSet<String> {
    let crds: Api<CustomResourceDefinition> = Api::all(requests.client().clone());
    match requests.send(crds.list_metadata(&Default::default())).await {
        Ok(list) => list.items.into_iter().filter_map(|crd| crd.metadata.name).collect(),
        Err(_) => BTreeSet::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(version: &str) -> GroupVersionForDiscovery {
        GroupVersionForDiscovery {
            group_version: format!("monitoring.coreos.com/{version}"),
            version: version.to_owned(),
        }
    }

    #[test]
    fn the_preferred_version_comes_first_and_every_other_follows_once() {
        let versions = vec![version("v1"), version("v1beta1"), version("v1alpha1")];
        let ordered = in_preference_order(Some(version("v1beta1")), versions.clone());
        let names: Vec<_> = ordered.iter().map(|v| v.version.as_str()).collect();
        assert_eq!(names, ["v1beta1", "v1", "v1alpha1"]);
        let ordered = in_preference_order(None, versions);
        let names: Vec<_> = ordered.iter().map(|v| v.version.as_str()).collect();
        assert_eq!(names, ["v1", "v1beta1", "v1alpha1"]);
    }
}
