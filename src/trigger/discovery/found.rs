//! What discovery shows the trigger: every migratable resource with its storage version hash
//! (in a fast poll, only those whose hash waits to be trusted), and the cluster's CRDs.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIResourceList, GroupVersionForDiscovery};
use kube::Api;
use tracing::debug;

use super::Error;
use super::cadence::{GroupVersion, needs_full_poll};
use super::storage_state::Guard;
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
    Ok((migratable(lists), unexamined))
}

/// The migratable resources the discovery of `group_versions` alone shows, read through a new
/// connection: what a fast poll reads. Any group version that cannot be read fails it.
async fn discover_only(
    requests: &Requests,
    group_versions: &[GroupVersion],
) -> Result<Vec<Discovered>, Error> {
    let client = requests.fresh_client().map_err(Error::Discovery)?;
    let mut lists = Vec::new();
    for (group, version) in group_versions {
        let list = match group.is_empty() {
            true => client.list_core_api_resources(version).await,
            false => {
                let group_version = format!("{group}/{version}");
                let request = client.list_api_group_resources(&group_version);
                let answer = tokio::time::timeout(GROUP_DISCOVERY_TIMEOUT, request).await;
                answer.map_err(|_| Error::Unanswered(group_version.clone()))?
            }
        };
        lists.push((group.clone(), version.clone(), list.map_err(Error::Discovery)?));
    }
    Ok(migratable(lists))
}

/// A fast poll: the discovery of `reads` alone, counted for the resources whose hash waits to
/// be trusted. Returns whether a full poll must follow at once, as [`needs_full_poll`] decides.
pub(super) async fn fast_poll(
    requests: &Requests,
    guard: &mut Guard,
    reads: &[GroupVersion],
) -> Result<bool, Error> {
    let before = guard.waiting();
    let Some(trust) = guard.trust() else { return Ok(true) };
    let shown: HashMap<GroupResource, String> =
        discover_only(requests, reads).await?.into_iter().map(|d| (d.resource, d.hash)).collect();
    let now = Instant::now();
    for (resource, hash) in &before {
        if shown.get(resource) == Some(hash) {
            guard.observe(resource, hash, None, now, trust);
        }
    }
    debug!(?reads, waiting = before.len(), "fast discovery poll");
    Ok(needs_full_poll(&before, &shown, &guard.waiting()))
}

/// The migratable resources of discovery `lists` (group, version, resources), each taken at the
/// first list that shows it.
fn migratable(lists: Vec<(String, String, APIResourceList)>) -> Vec<Discovered> {
    let mut seen = HashSet::new();
    lists
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
        .collect()
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
