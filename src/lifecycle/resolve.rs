//! The resource a migration names, through discovery, and the CRD behind it; and the end of a
//! migration when they cannot be had: taken up again later while a try is left, else Failed.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use tracing::info;

use crate::api::GroupVersionResource;
use crate::api::conditions::reasons;
use crate::engine::{Progress, Resource};

use super::{End, Host, LaterBecause, Lifecycle, Moment, Notice, cluster, status};

/// New connections a resource one apiserver does not serve is asked for again through: behind a
/// round-robin balancer, each of three apiservers twice.
const NOT_SERVED_LOOKS: usize = 6;

impl<H: Host> Lifecycle<'_, H> {
    /// The resource, through discovery, and the CRD behind it.
    pub(super) async fn resolve(
        &mut self,
        spec: &GroupVersionResource,
    ) -> Result<(Resource, Option<CustomResourceDefinition>), End> {
        let requires_status = self.host.migration().requests_status_writes();
        let (transient, message) =
            match Resource::resolve(self.cluster.requests.client(), spec, requires_status).await {
                Err(error) if error.is_not_served() => {
                    let message = crate::error_chain(&error);
                    match self.served_elsewhere(spec, requires_status).await {
                        true => (true, format!("{message}, though another apiserver serves it")),
                        false => (false, message),
                    }
                }
                Err(error) => (error.is_transient(), crate::error_chain(&error)),
                Ok(resource) => match cluster::crd_of(&self.cluster, &resource).await {
                    Ok(crd) => return Ok((resource, crd)),
                    Err(error) => (
                        true,
                        format!(
                            "failed to read the CRD of {resource}: {}",
                            crate::error_chain(&error)
                        ),
                    ),
                },
            };
        Err(self.unresolved(transient, message).await)
    }

    /// Whether an apiserver reached through one of a few new connections serves the resource
    /// one did not: apiservers of two releases (an upgrade under way) serve different APIs, and
    /// such a resource is asked for again later rather than failed for good.
    async fn served_elsewhere(&self, spec: &GroupVersionResource, requires_status: bool) -> bool {
        for _ in 0..NOT_SERVED_LOOKS {
            let Ok(client) = self.cluster.requests.fresh_client() else {
                return false;
            };
            if Resource::resolve(&client, spec, requires_status).await.is_ok() {
                return true;
            }
        }
        false
    }

    /// The end of a migration whose resource could not be resolved: taken up again later while
    /// a try is left and the failure may pass (discovery or the CRD could not be read), else
    /// Failed and recorded.
    async fn unresolved(&mut self, transient: bool, message: String) -> End {
        let tries = self.options.discovery;
        if transient && tries.more_left() {
            info!(error = message, try_ = tries.this, "discovery failed; trying again later");
            self.host.tell(Notice::Unresolved { message: &message, tries }).await;
            return End::Later(LaterBecause::Discovery);
        }
        let (reason, message) = match transient {
            false => (reasons::INVALID_RESOURCE, message),
            true if tries.of > 1 => {
                (reasons::DISCOVERY_FAILED, format!("{message} ({} tries)", tries.of))
            }
            true => (reasons::DISCOVERY_FAILED, message),
        };
        let previous = self.host.migration().status.as_ref();
        let failed = status::failed(previous, reason, message, Timestamp::now());
        if let Err(unrecorded) = self.host.record(&failed, Moment::Unresolved).await {
            return self.unrecorded(unrecorded, Progress::default());
        }
        self.host.tell(Notice::Unresolvable(&failed)).await;
        End::Finished(Box::new(failed))
    }
}
