//! What discovery shows the trigger: every migratable resource with its storage version hash,
//! and the cluster's CRDs.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
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
    /// The version migrations are created for (the group's preferred one).
    pub version: String,
    pub hash: String,
}

/// Every migratable resource discovery shows, read through a new connection (so that, behind a
/// load balancer, consecutive polls may reach different apiservers); and the group versions
/// whose discovery failed.
pub(super) async fn discover(requests: &Requests) -> Result<(Vec<Discovered>, Vec<String>), Error> {
    let client = requests.fresh_client().map_err(Error::Discovery)?;
    let mut lists: Vec<(String, String, APIResourceList)> = Vec::new();
    let mut unexamined = Vec::new();
    let core = client.list_core_api_resources("v1").await.map_err(Error::Discovery)?;
    lists.push((String::new(), "v1".into(), core));
    let groups = client.list_api_groups().await.map_err(Error::Discovery)?;
    for group in groups.groups {
        let Some(preferred) = group.preferred_version.or_else(|| group.versions.first().cloned())
        else {
            continue;
        };
        let request = client.list_api_group_resources(&preferred.group_version);
        match tokio::time::timeout(GROUP_DISCOVERY_TIMEOUT, request).await {
            Ok(Ok(list)) => lists.push((group.name.clone(), preferred.version.clone(), list)),
            Ok(Err(error)) => unexamined.push(format!(
                "{}: {}",
                preferred.group_version,
                crate::error_chain(&error)
            )),
            Err(_) => unexamined.push(format!(
                "{}: no answer within {GROUP_DISCOVERY_TIMEOUT:?}",
                preferred.group_version
            )),
        }
    }
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
        .collect();
    Ok((discovered, unexamined))
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
