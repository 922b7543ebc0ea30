//! What a migration's steps need of the process running them (the controller or `kube-svm
//! migrate`): its way to the apiserver and its encoding checks, and the CRD behind a resource
//! read through them.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

use crate::apiserver::requests::{RequestError, Requests};
use crate::engine::Resource;
use crate::evidence::encoding::{EncodingPolicy, Observer};

/// What the steps need of the process running them.
#[derive(Clone, Copy)]
pub struct Cluster<'a> {
    /// The way to the apiserver: every request bounded by the request timeout and the
    /// leader's term (which never ends for `kube-svm migrate`).
    pub requests: &'a Requests,
    /// How long the encoding checks take.
    pub encoding: EncodingPolicy,
    /// Encoding checks, shared by the migrations that need the same one.
    pub observer: &'a Observer,
}

/// The name of the CRD that would serve `resource`, if it can be a custom resource.
pub(super) fn crd_name(resource: &Resource) -> Option<String> {
    (!resource.group.is_empty()).then(|| format!("{}.{}", resource.plural, resource.group))
}

/// The CRD serving `resource`; `None` for built-in and aggregated resources.
pub async fn crd_of(
    cluster: &Cluster<'_>,
    resource: &Resource,
) -> Result<Option<CustomResourceDefinition>, RequestError> {
    let Some(name) = crd_name(resource) else { return Ok(None) };
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.requests.client().clone());
    cluster.requests.send(crds.get_opt(&name)).await
}
