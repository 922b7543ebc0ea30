//! Reading an object again after its write was answered 409 or 404 ([`Engine::read_again`]),
//! to tell a concurrent write or a deletion (nothing left to do) from a refusal (a failure of
//! the object), and the failures recorded for it.

use kube::api::ListParams;
use serde::Deserialize;

use super::pager::Listed;
use super::request::{Access, ApiStatus, Exchange, Failure, Reply, Settle, Unsettled};
use super::{Engine, Resource, RunState};
use crate::api::FailedObject;

impl Engine {
    /// Reads `object`'s metadata again, from a consistent list of the one name (so `list`,
    /// which migration needs anyway, is the only permission it takes). Failures are retried as
    /// any request's are: an outage waited out, throttling and server errors after a backoff.
    pub(super) async fn read_again(
        &self,
        resource: &Resource,
        object: &Listed,
        run: &RunState,
    ) -> Result<Option<Current>, NoReread> {
        let attempts = self.settings.write_attempts;
        self.request(run, &mut ReadAgain { resource, object, attempts }).await
    }
}

/// One object's metadata, read again by name.
struct ReadAgain<'a> {
    resource: &'a Resource,
    object: &'a Listed,
    attempts: u32,
}

impl Exchange for ReadAgain<'_> {
    type Settled = Option<Current>;
    type Error = NoReread;

    fn access(&self) -> Access<'_> {
        let namespace = &self.object.namespace;
        Access { resource: self.resource, verb: "list", namespace, subresource: None }
    }

    fn attempts(&self) -> u32 {
        self.attempts
    }

    fn build(&self) -> Result<http::Request<Vec<u8>>, String> {
        let name = escape_field_value(&self.object.name);
        let params = ListParams::default().fields(&format!("metadata.name={name}"));
        kube::core::Request::new(self.resource.namespaced_path(&self.object.namespace))
            .list_metadata(&params)
            .map_err(|error| error.to_string())
    }

    async fn settle(
        &mut self,
        reply: Reply,
        _failed: u32,
    ) -> Result<Settle<Option<Current>>, NoReread> {
        if !reply.is_success() {
            return Ok(Settle::Failed(reply));
        }
        let list: CurrentList = serde_json::from_slice(&reply.body)
            .map_err(|error| NoReread::Request(error.to_string()))?;
        let mut found = list.items.into_iter().map(|item| item.metadata);
        Ok(Settle::Done(found.find(|meta| meta.name == self.object.name)))
    }

    fn unsettled(&self, why: Unsettled) -> Result<Option<Current>, NoReread> {
        Err(match why {
            Unsettled::Unbuilt(message) => NoReread::Request(message),
            Unsettled::Fenced => NoReread::Fenced,
            Unsettled::Unavailable(waited) => NoReread::Unavailable(waited),
            Unsettled::GaveUp(Failure::Answer(reply)) => {
                let status = reply.status();
                NoReread::Answer(reply.code, status.reason, status.message)
            }
            Unsettled::GaveUp(Failure::NoAnswer(error)) => NoReread::NoAnswer(error.to_string()),
        })
    }
}

/// An object's metadata as read again after a 409 or a 404.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Current {
    pub(super) name: String,
    #[serde(default)]
    pub(super) uid: String,
    pub(super) resource_version: String,
    #[serde(default)]
    pub(super) managed_fields: Option<Box<serde_json::value::RawValue>>,
}

#[derive(Deserialize)]
pub(super) struct CurrentList {
    #[serde(default, deserialize_with = "super::pager::null_as_empty")]
    pub(super) items: Vec<CurrentItem>,
}

#[derive(Deserialize)]
pub(super) struct CurrentItem {
    pub(super) metadata: Current,
}

/// Why an object's metadata could not be read again.
#[derive(Debug, thiserror::Error)]
pub(super) enum NoReread {
    #[error("this process may no longer write: its leadership ended")]
    Fenced,
    #[error("no answer: {0}")]
    NoAnswer(String),
    #[error("HTTP {0} {1}: {2}")]
    Answer(u16, String, String),
    #[error("the apiserver stayed unavailable")]
    Unavailable(std::time::Duration),
    #[error("{0}")]
    Request(String),
}

/// What an object read again says about the 409 or 404 its write got.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Recheck {
    /// Written by someone else since it was listed: re-encoded, nothing left to do.
    Written,
    /// Deleted, or deleted and created again (another uid): nothing left to do.
    Gone,
    /// Exactly as listed: nobody wrote or deleted it, so the answer was a refusal.
    Unchanged,
}

pub(super) fn recheck(listed: &Listed, found: Option<&Current>) -> Recheck {
    match found {
        None => Recheck::Gone,
        Some(found) if !listed.uid.is_empty() && found.uid != listed.uid => Recheck::Gone,
        Some(found) if found.resource_version != listed.resource_version => Recheck::Written,
        Some(_) => Recheck::Unchanged,
    }
}

/// A field selector value with the characters the selector syntax gives a meaning escaped.
pub(super) fn escape_field_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Reason recorded when a 409 or a 404 was not borne out: the object was neither written by
/// anyone else nor deleted, so admission refused it.
pub const REFUSED: &str = "Refused";

/// Reason recorded when an object answered 409 or 404 could not be read again to tell why.
pub const RECHECK_FAILED: &str = "RecheckFailed";

pub(super) fn refused(object: &Listed, reply: &Reply) -> FailedObject {
    let status = reply.status();
    let reason = if status.reason.is_empty() { REFUSED.to_owned() } else { status.reason };
    let message = format!(
        "answered {} but neither written by anyone else nor deleted since it was listed (resourceVersion {} unchanged): {}",
        reply.code, object.resource_version, status.message
    );
    failure(object, reply.code, &reason, message)
}

pub(super) fn unchecked(object: &Listed, reply: &Reply, error: NoReread) -> FailedObject {
    let status = reply.status();
    let message = format!(
        "answered {} {} ({}), and reading it again to tell whether it was written or deleted failed: {error}",
        reply.code, status.reason, status.message
    );
    failure(object, reply.code, RECHECK_FAILED, message)
}

/// Whether a 404 is about `object` (it was deleted), rather than about the resource: the
/// apiserver names the object and its resource in the Status details only in the first case.
pub(super) fn names_the_object(status: &ApiStatus, resource: &Resource, object: &Listed) -> bool {
    let Some(details) = &status.details else { return false };
    let kind_matches = details.kind == resource.plural
        || details.kind.strip_suffix("/status") == Some(resource.plural.as_str());
    details.name == object.name && details.group == resource.group && kind_matches
}

/// Whether a 404 is about `object`'s namespace: an admission policy reads the namespace of each
/// namespaced write it matches, and answers so when the object outlived it (stranded in etcd).
/// The write was refused; the object is still there to read again.
pub(super) fn names_its_namespace(status: &ApiStatus, object: &Listed) -> bool {
    let Some(details) = &status.details else { return false };
    !object.namespace.is_empty()
        && details.kind == "namespaces"
        && details.group.is_empty()
        && details.name == object.namespace
}

/// A failure of `object`, its reason and message cut to a bounded size: they may come from an
/// admission webhook, and a migration's status must stay small whatever the input.
pub(super) fn failure(object: &Listed, code: u16, reason: &str, message: String) -> FailedObject {
    FailedObject {
        namespace: object.namespace.clone(),
        name: object.name.clone(),
        code,
        reason: crate::api::cut(reason, crate::api::REASON_LIMIT),
        message: crate::api::cut(&message, crate::api::MESSAGE_LIMIT),
    }
}
