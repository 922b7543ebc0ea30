//! Writing one object back unchanged, so the apiserver re-encodes it.

use serde::Deserialize;

use super::pager::Listed;
use super::recheck::{
    Current, NoReread, Recheck, failure, names_its_namespace, names_the_object, recheck, refused,
    unchecked,
};
use super::request::{Access, Exchange, Failure, Paced, Reply, Settle, Unsettled};
use super::{Engine, KeepFailing, Resource, RunState};
use crate::api::FailedObject;
use crate::rules::managed_fields::Served;

/// What became of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The apiserver wrote it back to etcd, re-encoded.
    Rewritten,
    /// Written back, re-encoded, with its `managedFields` entries naming versions no longer
    /// served removed: the write's answer read back with none of them left.
    Cleaned,
    /// The apiserver skipped the write: the object was already stored in the current encoding.
    AlreadyCurrent,
    /// Written by someone else since it was listed (409), which re-encoded it.
    Conflict,
    /// Deleted since it was listed (404).
    Deleted,
    /// Could not be migrated.
    Failed(FailedObject),
}

/// Reason recorded when no attempt got an HTTP response.
pub const TRANSPORT_ERROR: &str = "TransportError";

/// Asks the apiserver to answer with the object's metadata only.
const METADATA_ONLY: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// The minimal write for `object`: only type, identity and the resourceVersion precondition.
/// Nothing to merge, so the stored content is untouched, and a concurrent write turns it into a
/// 409.
fn patch_body(resource: &Resource, object: &Listed) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Body<'a> {
        api_version: &'a str,
        kind: &'a str,
        metadata: Metadata<'a>,
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Metadata<'a> {
        name: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        namespace: &'a str,
        resource_version: &'a str,
        /// Replaces the list as a whole (a merge patch replaces arrays).
        #[serde(skip_serializing_if = "Option::is_none")]
        managed_fields: Option<&'a [serde_json::Value]>,
    }
    serde_json::to_vec(&Body {
        api_version: &resource.api_version(),
        kind: &resource.kind,
        metadata: Metadata {
            name: &object.name,
            namespace: &object.namespace,
            resource_version: &object.resource_version,
            managed_fields: object.managed_fields.as_deref(),
        },
    })
}

/// Reason recorded when the write request could not be built.
const INVALID_REQUEST: &str = "InvalidRequest";

/// Reason recorded when a successful write's answer could not be read.
const INVALID_RESPONSE: &str = "InvalidResponse";

/// The reason of an object whose write changed its content: its generation moved (a mutating
/// admission webhook changed what it was sent). The object stays as the write left it; the run
/// fails, and says which.
const CONTENT_CHANGED: &str = "ContentChanged";

/// Why a write of `object` answered with `generation` changed the object's content, when it
/// did: the write sent nothing but its identity and resourceVersion, on the condition that
/// nobody wrote it since it was listed, so only admission can have moved its generation. Pure.
fn changed_content(object: &Listed, generation: Option<i64>) -> Option<String> {
    let (Some(listed), Some(written)) = (object.generation, generation) else { return None };
    (written > listed).then(|| {
        format!(
            "the write moved its generation from {listed} to {written}: admission (a mutating webhook or policy) changed its content"
        )
    })
}

pub use crate::rules::managed_fields::MANAGED_FIELDS_NOT_CLEANED;

/// How a reply settled one write.
enum Settled {
    /// The object is done, one way or another.
    Done(Outcome),
    /// Written by someone else since it was listed, and still naming versions no longer
    /// served in `managedFields`: to be cleaned again from what was read.
    Again(Listed),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    metadata: WrittenObjectMeta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenObjectMeta {
    resource_version: String,
    #[serde(default)]
    generation: Option<i64>,
    /// Read only when the write cleaned them.
    #[serde(default)]
    managed_fields: Option<Box<serde_json::value::RawValue>>,
}

/// Whether a write of `object` goes to the `/status` subresource, when the run writes there
/// (`to_status`). A write that cleans `managedFields` never does: for any subresource the
/// apiserver keeps the live `managedFields`, whatever the write sends, so the cleaning would
/// change nothing of them while the object is re-encoded all the same.
fn through_status(to_status: bool, object: &Listed) -> bool {
    to_status && object.managed_fields.is_none()
}

/// What a write of `object` that moved its resourceVersion comes to, given the `managedFields`
/// of its answer: a plain write is rewritten; a cleaning write (one that sent `managedFields`)
/// counts as cleaned only once the answer reads back clean by `cleaning`, the served versions.
fn rewritten(
    object: &Listed,
    code: u16,
    cleaning: Option<&Served>,
    answer: Option<&serde_json::value::RawValue>,
) -> Outcome {
    let Some(written) = object.managed_fields.as_deref() else { return Outcome::Rewritten };
    let not_cleaned = |message: String| {
        Outcome::Failed(failure(object, code, MANAGED_FIELDS_NOT_CLEANED, message))
    };
    let Some(served) = cleaning else {
        return not_cleaned("the run knows no served versions to check the answer against".into());
    };
    let answer: Vec<serde_json::Value> = match answer.map(|raw| serde_json::from_str(raw.get())) {
        None => Vec::new(),
        Some(Ok(entries)) => entries,
        Some(Err(error)) => {
            let message = format!("the answer's managedFields could not be read: {error}");
            return Outcome::Failed(failure(object, code, INVALID_RESPONSE, message));
        }
    };
    match served.reads_back(written, &answer) {
        Ok(()) => Outcome::Cleaned,
        Err(not_clean) => {
            Outcome::Failed(failure(object, code, not_clean.reason(), not_clean.message()))
        }
    }
}

/// Why a run must stop, found while writing one object.
#[derive(Debug)]
pub(super) enum Halt {
    /// The leader's term is over.
    Fenced,
    /// A write was answered 404 for the resource itself, not for the object: the version or
    /// the CRD is no longer served.
    NotServed(String),
    /// The apiserver stayed down past the run's outage budget.
    Unavailable(std::time::Duration),
    /// Write after write fails, none succeeding.
    WritesFailing(Box<KeepFailing>),
}

impl Engine {
    /// Sends the minimal conditional write for `object`, retrying transient failures. An
    /// object whose `managedFields` the run cleans, and which someone else wrote meanwhile, is
    /// cleaned again from what was read, a bounded number of times.
    pub(super) async fn write(
        &self,
        resource: &Resource,
        object: &Listed,
        to_status: bool,
        run: &RunState,
    ) -> Result<Outcome, Halt> {
        let mut object = std::borrow::Cow::Borrowed(object);
        for _ in 0..self.settings.write_attempts {
            match self.write_once(resource, &object, to_status, run).await? {
                Settled::Done(outcome) => return Ok(outcome),
                Settled::Again(again) => object = std::borrow::Cow::Owned(again),
            }
        }
        let message = format!(
            "written by others {} times before its managedFields could be cleaned",
            self.settings.write_attempts
        );
        Ok(Outcome::Failed(failure(&object, 409, MANAGED_FIELDS_NOT_CLEANED, message)))
    }

    async fn write_once(
        &self,
        resource: &Resource,
        object: &Listed,
        to_status: bool,
        run: &RunState,
    ) -> Result<Settled, Halt> {
        let to_status = through_status(to_status, object);
        let body = match patch_body(resource, object) {
            Ok(body) => body,
            Err(error) => {
                let failed = failure(object, 0, INVALID_REQUEST, error.to_string());
                return Ok(Settled::Done(Outcome::Failed(failed)));
            }
        };
        let mut exchange = WriteRequest { engine: self, run, resource, object, to_status, body };
        self.request(run, &mut exchange).await
    }

    /// The outcome a reply settles, `None` when the request failed and may be retried, or why
    /// the run must stop.
    async fn classify(
        &self,
        resource: &Resource,
        object: &Listed,
        reply: &Reply,
        run: &RunState,
    ) -> Result<Option<Settled>, Halt> {
        let cleaning = object.managed_fields.is_some();
        Ok(match reply.code {
            200..300 => {
                Some(Settled::Done(match serde_json::from_slice::<WrittenMeta>(&reply.body) {
                    Ok(written) if written.metadata.resource_version == object.resource_version => {
                        match cleaning {
                            false => Outcome::AlreadyCurrent,
                            true => Outcome::Failed(failure(
                                object,
                                reply.code,
                                MANAGED_FIELDS_NOT_CLEANED,
                                "the apiserver accepted the write but changed nothing".to_owned(),
                            )),
                        }
                    }
                    Ok(written) => match changed_content(object, written.metadata.generation) {
                        Some(message) => {
                            Outcome::Failed(failure(object, reply.code, CONTENT_CHANGED, message))
                        }
                        None => rewritten(
                            object,
                            reply.code,
                            run.cleaning.as_ref(),
                            written.metadata.managed_fields.as_deref(),
                        ),
                    },
                    Err(error) => Outcome::Failed(failure(
                        object,
                        reply.code,
                        INVALID_RESPONSE,
                        error.to_string(),
                    )),
                }))
            }
            // A 409 or a 404 may be an admission webhook's own answer, passed through with its
            // code: believed only once the object's metadata, read again, bears it out.
            409 | 404 => {
                let status = reply.status();
                let about_the_object = names_the_object(&status, resource, object)
                    || names_its_namespace(&status, object);
                if reply.code == 404 && !about_the_object {
                    return Err(Halt::NotServed(status.message));
                }
                let found = match self.read_again(resource, object, run).await {
                    Ok(found) => found,
                    Err(NoReread::Fenced) => return Err(Halt::Fenced),
                    Err(NoReread::Unavailable(waited)) => return Err(Halt::Unavailable(waited)),
                    Err(error) => {
                        let failed = Outcome::Failed(unchecked(object, reply, error));
                        return Ok(Some(Settled::Done(failed)));
                    }
                };
                let outcome = match (recheck(object, found.as_ref()), resource.namespaced) {
                    (Recheck::Written, _) if cleaning => {
                        match self.clean_again(resource, object, found, run) {
                            Ok(Some(again)) => return Ok(Some(Settled::Again(again))),
                            Ok(None) => Outcome::Conflict,
                            Err(error) => Outcome::Failed(failure(
                                object,
                                reply.code,
                                INVALID_RESPONSE,
                                error.to_string(),
                            )),
                        }
                    }
                    (Recheck::Written, _) => Outcome::Conflict,
                    // The read again is consistent and lists by name in the object's namespace,
                    // which holds stranded objects of a namespace that is gone (they are listed,
                    // and written like any other): nothing found is an object deleted, whether
                    // or not its namespace still exists.
                    (Recheck::Gone, _) => Outcome::Deleted,
                    // Unchanged since listed: the answer was a refusal, not a conflict or a
                    // deletion. The object failed, with the refusal's own words.
                    (Recheck::Unchanged, _) => Outcome::Failed(refused(object, reply)),
                };
                Some(Settled::Done(outcome))
            }
            _ => None,
        })
    }

    /// `object` as read again after someone else wrote it, when its `managedFields` still need
    /// cleaning; `None` when the other write left nothing to clean.
    fn clean_again(
        &self,
        resource: &Resource,
        object: &Listed,
        found: Option<Current>,
        run: &RunState,
    ) -> Result<Option<Listed>, serde_json::Error> {
        let (Some(found), Some(served)) = (found, run.cleaning.as_ref()) else { return Ok(None) };
        let Some(entries) = found.managed_fields.as_deref() else { return Ok(None) };
        let Some(managed_fields) = super::pager::cleaned(served, resource, entries).transpose()?
        else {
            return Ok(None);
        };
        Ok(Some(Listed {
            resource_version: found.resource_version,
            managed_fields: Some(managed_fields),
            // Written by someone else since it was listed: its generation now is not known.
            generation: None,
            ..object.clone()
        }))
    }
}

/// One object's write: the minimal conditional patch of [`patch_body`].
struct WriteRequest<'a> {
    engine: &'a Engine,
    run: &'a RunState,
    resource: &'a Resource,
    object: &'a Listed,
    to_status: bool,
    body: Vec<u8>,
}

impl WriteRequest<'_> {
    /// The object as failed by `failed`, in the apiserver's words where it answered.
    fn failed(&self, failed: &Failure) -> FailedObject {
        match failed {
            Failure::Answer(reply) => {
                let status = reply.status();
                failure(self.object, reply.code, &status.reason, status.message)
            }
            Failure::NoAnswer(error) => failure(self.object, 0, TRANSPORT_ERROR, error.to_string()),
        }
    }
}

impl Exchange for WriteRequest<'_> {
    type Settled = Settled;
    type Error = Halt;

    fn access(&self) -> Access<'_> {
        Access {
            resource: self.resource,
            verb: "patch",
            namespace: &self.object.namespace,
            subresource: self.to_status.then_some("status"),
        }
    }

    fn attempts(&self) -> u32 {
        self.engine.settings.write_attempts
    }

    fn build(&self) -> Result<http::Request<Vec<u8>>, String> {
        let (object, subresource) = (self.object, self.to_status.then_some("status"));
        let path = self.resource.object_path(&object.namespace, &object.name, subresource);
        http::Request::patch(path)
            .header(http::header::CONTENT_TYPE, "application/merge-patch+json")
            // Metadata only in the answer: the object itself is of no use here.
            .header(http::header::ACCEPT, METADATA_ONLY)
            .body(self.body.clone())
            .map_err(|error| error.to_string())
    }

    fn paced(&self) -> Option<Paced> {
        Some(Paced { listed: self.object.resource_version.parse().ok() })
    }

    async fn settle(&mut self, reply: Reply, failed: u32) -> Result<Settle<Settled>, Halt> {
        let (engine, run) = (self.engine, self.run);
        match engine.classify(self.resource, self.object, &reply, run).await? {
            Some(Settled::Done(Outcome::Failed(failure))) => {
                if let Some(failing) = run.write_failed(failed == 0, &failure) {
                    return Err(Halt::WritesFailing(Box::new(failing)));
                }
                Ok(Settle::Done(Settled::Done(Outcome::Failed(failure))))
            }
            Some(settled) => {
                run.write_succeeded();
                Ok(Settle::Done(settled))
            }
            None => Ok(Settle::Failed(reply)),
        }
    }

    fn charged(&mut self, failed: &Failure, first: bool) -> Result<(), Halt> {
        match self.run.write_failed(first, &self.failed(failed)) {
            Some(failing) => Err(Halt::WritesFailing(Box::new(failing))),
            None => Ok(()),
        }
    }

    fn unsettled(&self, why: Unsettled) -> Result<Settled, Halt> {
        match why {
            Unsettled::Unbuilt(message) => {
                let failed = failure(self.object, 0, INVALID_REQUEST, message);
                Ok(Settled::Done(Outcome::Failed(failed)))
            }
            Unsettled::Fenced => Err(Halt::Fenced),
            Unsettled::Unavailable(waited) => Err(Halt::Unavailable(waited)),
            Unsettled::GaveUp(failed) => Ok(Settled::Done(Outcome::Failed(self.failed(&failed)))),
        }
    }
}

#[cfg(test)]
mod not_found_tests {
    use super::super::request::ApiStatus;
    use super::*;

    fn widgets() -> Resource {
        Resource { patchable_status: true, ..Resource::widgets() }
    }

    fn status(json: &str) -> ApiStatus {
        serde_json::from_str(json).expect("a Status")
    }

    #[test]
    fn a_404_naming_the_object_means_it_was_deleted() {
        let object = Listed::w_1();
        let deleted = status(
            r#"{"kind":"Status","status":"Failure","reason":"NotFound","code":404,
                "message":"widgets.example.com \"w-1\" not found",
                "details":{"name":"w-1","group":"example.com","kind":"widgets"}}"#,
        );
        assert!(names_the_object(&deleted, &widgets(), &object));
    }

    #[test]
    fn a_404_for_the_resource_is_not_a_deletion() {
        let object = Listed::w_1();
        // What the apiserver answers for a version or CRD it does not serve.
        let unserved = status(
            r#"{"kind":"Status","status":"Failure","reason":"NotFound","code":404,
                "message":"the server could not find the requested resource","details":{}}"#,
        );
        assert!(!names_the_object(&unserved, &widgets(), &object));
        assert!(!names_the_object(&ApiStatus::default(), &widgets(), &object), "no Status at all");
        let other = status(r#"{"details":{"name":"w-2","group":"example.com","kind":"widgets"}}"#);
        assert!(!names_the_object(&other, &widgets(), &object), "another object");
        let elsewhere =
            status(r#"{"details":{"name":"w-1","group":"other.com","kind":"widgets"}}"#);
        assert!(!names_the_object(&elsewhere, &widgets(), &object), "another group");
    }

    #[test]
    fn a_404_naming_the_objects_namespace_is_about_the_object() {
        let object = Listed { namespace: "gone".into(), ..Listed::w_1() };
        // What a write answers when an admission policy cannot read the object's namespace.
        let stranded = status(
            r#"{"kind":"Status","status":"Failure","reason":"NotFound","code":404,
                "message":"namespaces \"gone\" not found",
                "details":{"name":"gone","kind":"namespaces"}}"#,
        );
        assert!(names_its_namespace(&stranded, &object));
        assert!(!names_its_namespace(&stranded, &Listed::w_1()), "an object of another namespace");
        let cluster_scoped = Listed { namespace: String::new(), ..Listed::w_1() };
        let nameless = status(r#"{"details":{"name":"","kind":"namespaces"}}"#);
        assert!(!names_its_namespace(&nameless, &cluster_scoped));
    }
}

#[cfg(test)]
mod body_tests {
    use super::*;

    #[test]
    fn the_write_carries_type_identity_and_precondition_only() {
        let resource = Resource { version: "v2".into(), namespaced: true, ..Resource::widgets() };
        let object = |namespace: &str| Listed {
            namespace: namespace.into(),
            resource_version: "42".into(),
            ..Listed::w_1()
        };
        let body: serde_json::Value =
            serde_json::from_slice(&patch_body(&resource, &object("ns")).expect("serializes"))
                .expect("JSON");
        assert_eq!(
            body,
            serde_json::json!({
                "apiVersion": "example.com/v2",
                "kind": "Widget",
                "metadata": { "name": "w-1", "namespace": "ns", "resourceVersion": "42" },
            })
        );
        let cluster = patch_body(&resource, &object("")).expect("serializes");
        assert!(!String::from_utf8_lossy(&cluster).contains("namespace"));
    }

    #[test]
    fn a_cleaning_write_replaces_managed_fields_as_a_whole() {
        let kept = serde_json::json!({ "manager": "m", "apiVersion": "example.com/v2" });
        let object = Listed {
            resource_version: "42".into(),
            managed_fields: Some(vec![kept.clone()]),
            ..Listed::w_1()
        };
        let body: serde_json::Value =
            serde_json::from_slice(&patch_body(&Resource::widgets(), &object).expect("serializes"))
                .expect("JSON");
        assert_eq!(
            body["metadata"],
            serde_json::json!({ "name": "w-1", "resourceVersion": "42", "managedFields": [kept] })
        );
    }
}

#[cfg(test)]
mod cleaning_tests {
    use serde_json::{Value, json};

    use super::*;

    fn served() -> Served {
        let crd = json!({
            "metadata": { "name": "widgets.example.com" },
            "spec": {
                "group": "example.com",
                "names": { "plural": "widgets", "kind": "Widget" },
                "scope": "Cluster",
                "versions": [
                    { "name": "v1", "served": false, "storage": false },
                    { "name": "v2", "served": true, "storage": true },
                ],
            }
        });
        Served::of(&serde_json::from_value(crd).expect("a CRD"))
    }

    fn entry(manager: &str, version: &str) -> Value {
        json!({ "manager": manager, "apiVersion": format!("example.com/{version}") })
    }

    fn cleaning(written: Vec<Value>) -> Listed {
        Listed { managed_fields: Some(written), ..Listed::w_1() }
    }

    fn raw(entries: &[Value]) -> Box<serde_json::value::RawValue> {
        serde_json::value::to_raw_value(entries).expect("JSON")
    }

    #[test]
    fn a_cleaning_write_never_goes_to_status() {
        let plain = Listed { managed_fields: None, ..cleaning(vec![]) };
        assert!(through_status(true, &plain));
        assert!(!through_status(false, &plain));
        assert!(!through_status(true, &cleaning(vec![entry("tuner", "v2")])));
    }

    #[test]
    fn a_write_that_moved_the_generation_changed_content() {
        let plain = Listed { managed_fields: None, ..cleaning(vec![]) };
        let listed = Listed { generation: Some(3), ..plain.clone() };
        assert_eq!(changed_content(&listed, Some(3)), None);
        let changed = changed_content(&listed, Some(4)).expect("changed");
        assert!(changed.contains("from 3 to 4"), "{changed}");
        // A resource that keeps no generation, or an answer without one, shows nothing.
        assert_eq!(changed_content(&plain, Some(4)), None);
        assert_eq!(changed_content(&listed, None), None);
    }

    #[test]
    fn a_plain_write_that_moved_the_resource_version_is_rewritten() {
        let plain = Listed { managed_fields: None, ..cleaning(vec![]) };
        let live = raw(&[entry("deployer", "v1")]);
        assert_eq!(rewritten(&plain, 200, None, Some(&live)), Outcome::Rewritten);
    }

    #[test]
    fn a_cleaning_write_counts_as_cleaned_only_once_its_answer_reads_back_clean() {
        let object = cleaning(vec![entry("tuner", "v2")]);
        let clean = raw(&[entry("tuner", "v2")]);
        assert_eq!(rewritten(&object, 200, Some(&served()), Some(&clean)), Outcome::Cleaned);

        // The live entries kept, as `/status` or the field manager's fallback does.
        let live = raw(&[entry("deployer", "v1"), entry("tuner", "v2")]);
        let Outcome::Failed(failed) = rewritten(&object, 200, Some(&served()), Some(&live)) else {
            panic!("still naming v1")
        };
        assert_eq!((failed.code, failed.reason.as_str()), (200, MANAGED_FIELDS_NOT_CLEANED));
        assert!(failed.message.contains("example.com/v1"), "{}", failed.message);

        // Every entry dropped, or none in the answer.
        for answer in [Some(raw(&[])), None] {
            let Outcome::Failed(failed) =
                rewritten(&object, 200, Some(&served()), answer.as_deref())
            else {
                panic!("dropped")
            };
            assert_eq!(failed.reason, MANAGED_FIELDS_NOT_CLEANED);
        }

        // Nothing to check against: never counted as cleaned.
        let unchecked = rewritten(&object, 200, None, Some(&clean));
        assert!(matches!(unchecked, Outcome::Failed(_)), "{unchecked:?}");
    }

    #[test]
    fn an_unreadable_answer_is_not_cleaned() {
        let object = cleaning(vec![entry("tuner", "v2")]);
        let garbled = serde_json::value::RawValue::from_string("{}".into()).expect("JSON");
        let Outcome::Failed(failed) = rewritten(&object, 200, Some(&served()), Some(&garbled))
        else {
            panic!("unreadable")
        };
        assert_eq!(failed.reason, INVALID_RESPONSE);
    }
}
