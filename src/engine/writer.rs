//! Writing one object back unchanged, so the apiserver re-encodes it.

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::Deserialize;
use serde_json::json;
use tracing::debug;

use super::pager::Listed;
use super::request::Reply;
use super::retry::{Failure, Retry};
use super::window::Signal;
use super::{Attempts, Engine, Resource, RunState};

/// What became of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The apiserver wrote it back to etcd, re-encoded.
    Rewritten,
    /// The apiserver skipped the write: the object was already stored in the current encoding.
    AlreadyCurrent,
    /// Written by someone else since it was listed (409), which re-encoded it.
    Conflict,
    /// Deleted since it was listed (404).
    Deleted,
    /// Could not be migrated.
    Failed(ObjectFailure),
}

/// Why an object could not be migrated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectFailure {
    pub namespace: String,
    pub name: String,
    /// HTTP status of the last attempt; 0 when no response came.
    pub code: u16,
    pub reason: String,
    pub message: String,
}

/// Reason recorded for objects listed in a namespace that no longer exists.
pub const NAMESPACE_GONE: &str = "NamespaceGone";

/// Reason recorded when a write found no object and its namespace could not be read.
pub const NAMESPACE_UNKNOWN: &str = "NamespaceUnknown";

/// Reason recorded when no attempt got an HTTP response.
pub const TRANSPORT_ERROR: &str = "TransportError";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    metadata: WrittenObjectMeta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenObjectMeta {
    resource_version: String,
}

impl Engine {
    /// Sends the minimal conditional write for `object`, retrying transient failures.
    pub(super) async fn write(
        &self,
        resource: &Resource,
        object: &Listed,
        to_status: bool,
        run: &RunState,
    ) -> Outcome {
        // Only type, identity and the resourceVersion precondition: nothing to merge, so the
        // stored content is untouched, and a concurrent write turns this into a 409.
        let mut metadata =
            json!({ "name": object.name, "resourceVersion": object.resource_version });
        if !object.namespace.is_empty() {
            metadata["namespace"] = json!(object.namespace);
        }
        let body = json!({ "apiVersion": resource.api_version(), "kind": resource.kind, "metadata": metadata });
        let mut attempts = Attempts::default();
        loop {
            let result = match self.write_request(resource, object, to_status, &body) {
                Ok(request) => {
                    let slot = run.window.enter().await;
                    let result = self.send(request, run).await;
                    slot.leave(match &result {
                        Ok(reply) if reply.code == 429 => Signal::Throttled,
                        Ok(reply) if reply.code < 300 || reply.code == 404 || reply.code == 409 => {
                            Signal::Success
                        }
                        _ => Signal::Neutral,
                    });
                    result
                }
                Err(error) => {
                    return Outcome::Failed(failure(
                        object,
                        0,
                        "InvalidRequest",
                        error.to_string(),
                    ));
                }
            };
            let (retry, last) = match result {
                Ok(reply) => match self.classify(resource, object, &reply).await {
                    Some(outcome) => return outcome,
                    None => (
                        self.retry_decision(
                            reply.failure(),
                            &mut attempts,
                            self.settings.write_attempts,
                        ),
                        Last::Reply(reply),
                    ),
                },
                Err(error) => {
                    debug!(%resource, name = object.name, %error, "write request failed");
                    (
                        self.retry_decision(
                            Failure::Transport,
                            &mut attempts,
                            self.settings.write_attempts,
                        ),
                        Last::Transport(error),
                    )
                }
            };
            match retry {
                Retry::After(wait) => tokio::time::sleep(wait).await,
                Retry::Never => {
                    return Outcome::Failed(match last {
                        Last::Reply(reply) => {
                            let status = reply.status();
                            failure(object, reply.code, &status.reason, status.message)
                        }
                        Last::Transport(error) => {
                            failure(object, 0, TRANSPORT_ERROR, error.to_string())
                        }
                    });
                }
            }
        }
    }

    fn write_request(
        &self,
        resource: &Resource,
        object: &Listed,
        to_status: bool,
        body: &serde_json::Value,
    ) -> Result<http::Request<Vec<u8>>, kube::core::request::Error> {
        let request = kube::core::Request::new(resource.namespaced_path(&object.namespace));
        let patch = Patch::Merge(body);
        let params = PatchParams::default();
        if !to_status {
            return request.patch_metadata(&object.name, &params, &patch);
        }
        let mut status = request.patch_subresource("status", &object.name, &params, &patch)?;
        // Ask for metadata only, as for the main resource: the object itself is of no use here.
        status.headers_mut().insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static(
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
            ),
        );
        Ok(status)
    }

    /// The outcome a reply settles, or `None` when the request failed and may be retried.
    async fn classify(
        &self,
        resource: &Resource,
        object: &Listed,
        reply: &Reply,
    ) -> Option<Outcome> {
        match reply.code {
            200..300 => Some(match serde_json::from_slice::<WrittenMeta>(&reply.body) {
                Ok(written) if written.metadata.resource_version == object.resource_version => {
                    Outcome::AlreadyCurrent
                }
                Ok(_) => Outcome::Rewritten,
                Err(error) => Outcome::Failed(failure(
                    object,
                    reply.code,
                    "InvalidResponse",
                    error.to_string(),
                )),
            }),
            409 => Some(Outcome::Conflict),
            404 if resource.namespaced => {
                Some(not_found(object, self.namespace_exists(&object.namespace).await))
            }
            404 => Some(Outcome::Deleted),
            _ => None,
        }
    }
}

impl Engine {
    /// Whether `namespace` exists. Objects a list returns but a write cannot find are either
    /// deleted or stranded in a namespace that is gone; only the first are done.
    async fn namespace_exists(&self, namespace: &str) -> Result<bool, kube::Error> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        self.limiter.acquire().await;
        Ok(namespaces.get_metadata_opt(namespace).await?.is_some())
    }
}

/// The outcome of a 404 for a namespaced object, given whether its namespace still exists.
fn not_found(object: &Listed, namespace_exists: Result<bool, kube::Error>) -> Outcome {
    match namespace_exists {
        Ok(true) => Outcome::Deleted,
        Ok(false) => Outcome::Failed(failure(
            object,
            404,
            NAMESPACE_GONE,
            format!(
                "namespace {} no longer exists but the object is still listed; it was not rewritten",
                object.namespace
            ),
        )),
        Err(error) => Outcome::Failed(failure(
            object,
            404,
            NAMESPACE_UNKNOWN,
            format!(
                "the object was not found and namespace {} could not be read: {error}",
                object.namespace
            ),
        )),
    }
}

enum Last {
    Reply(Reply),
    Transport(kube::Error),
}

fn failure(object: &Listed, code: u16, reason: &str, message: String) -> ObjectFailure {
    ObjectFailure {
        namespace: object.namespace.clone(),
        name: object.name.clone(),
        code,
        reason: reason.to_owned(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed() -> Listed {
        Listed { namespace: "gone".into(), name: "w".into(), resource_version: "7".into() }
    }

    #[test]
    fn not_found_in_an_existing_namespace_means_deleted() {
        assert_eq!(not_found(&listed(), Ok(true)), Outcome::Deleted);
    }

    #[test]
    fn not_found_in_a_vanished_namespace_is_a_failure_not_a_success() {
        let Outcome::Failed(failure) = not_found(&listed(), Ok(false)) else { panic!("must fail") };
        assert_eq!((failure.code, failure.reason.as_str()), (404, NAMESPACE_GONE));
        assert_eq!((failure.namespace.as_str(), failure.name.as_str()), ("gone", "w"));
    }

    #[test]
    fn an_unreadable_namespace_is_never_assumed_to_exist() {
        let error = kube::Error::LinesCodecMaxLineLengthExceeded;
        let Outcome::Failed(failure) = not_found(&listed(), Err(error)) else {
            panic!("must fail")
        };
        assert_eq!(failure.reason, NAMESPACE_UNKNOWN);
    }
}
