//! What a migration's steps need of the process running them (the controller or `kube-svm
//! migrate`): its client, its fence, its request timeout and its encoding checks, and the CRD
//! behind a resource read through them.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};

use crate::apiserver::fence::{Fence, RequestError, bounded};
use crate::engine::Resource;
use crate::evidence::encoding::{EncodingPolicy, Observer};

/// What the steps need of the process running them.
#[derive(Clone, Copy)]
pub struct Cluster<'a> {
    /// For requests: every request has a deadline.
    pub client: &'a Client,
    /// What `client` was made from, for fresh connections (the encoding check samples several
    /// apiservers behind a load balancer).
    pub config: &'a kube::Config,
    /// Nothing is written once it closes: the leader's term (open for `kube-svm migrate`).
    pub fence: &'a Fence,
    /// Longest time one request may go unanswered.
    pub request_timeout: Duration,
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
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    bounded(cluster.fence, cluster.request_timeout, crds.get_opt(&name)).await
}
