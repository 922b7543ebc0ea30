//! Reading a resource page by page, metadata only.

use std::sync::atomic::Ordering;

use kube::api::ListParams;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use tracing::warn;

use super::request::{Access, Exchange, Failure, Reply, Settle, Unsettled};
use super::{Engine, Error, Resource, RunState};
use crate::rules::managed_fields::Served;

/// What a write needs of a listed object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Empty for a cluster-scoped object.
    pub namespace: String,
    /// The object's `metadata.name`.
    pub name: String,
    /// Tells the object from one deleted and created again under its name.
    pub uid: String,
    /// The version listed; the write carries it as a precondition, so a newer object is
    /// left alone (409).
    pub resource_version: String,
    /// The `managedFields` to write instead of the object's, when the run cleans them and some
    /// entries name a version no longer served.
    pub managed_fields: Option<Vec<serde_json::Value>>,
    /// The generation listed, where the resource keeps one: a write that moves it changed the
    /// object's content (a mutating admission webhook), which a migration must never do.
    pub generation: Option<i64>,
}

/// One page of a list.
#[derive(Debug, Default)]
pub struct Page {
    /// The page's objects, in list order.
    pub items: Vec<Listed>,
    /// The token for the next page; `None` on the last page.
    pub continue_token: Option<String>,
    /// The apiserver's estimate of the objects after this page.
    pub remaining: Option<u64>,
}

// `PartialObjectMetadataList`, reduced to what a migration keeps: four strings an object, and
// its `managedFields` borrowed from the answer, unparsed and uncopied.
#[derive(Deserialize)]
struct MetadataList<'a> {
    #[serde(default)]
    metadata: ListMeta,
    /// The apiserver sends `"items": null` for an empty list.
    #[serde(default, borrow, deserialize_with = "null_as_empty")]
    items: Vec<MetadataItem<'a>>,
}

pub(super) fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default, rename = "continue")]
    continue_token: String,
    remaining_item_count: Option<u64>,
}

#[derive(Deserialize)]
struct MetadataItem<'a> {
    #[serde(borrow)]
    metadata: ObjectMeta<'a>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ObjectMeta<'a> {
    #[serde(default)]
    namespace: String,
    name: String,
    #[serde(default)]
    uid: String,
    resource_version: String,
    #[serde(default)]
    generation: Option<i64>,
    /// Kept unparsed and in the answer's bytes: only a run that cleans them reads them.
    #[serde(default, borrow)]
    managed_fields: Option<&'a RawValue>,
}

impl Engine {
    /// Reads the page at `continue_token` (the first page when `None`). An expired token goes on
    /// from the inconsistent token the apiserver hands out; throttling and server errors are
    /// retried with backoff.
    pub(super) async fn list_page(
        &self,
        resource: &Resource,
        continue_token: Option<&str>,
        run: &RunState,
    ) -> Result<Page, Error> {
        let mut exchange = PageRequest {
            resource,
            token: continue_token.map(str::to_owned),
            page_size: self.settings.page_size,
            attempts: self.settings.list_attempts,
            run,
        };
        self.request(run, &mut exchange).await
    }
}

/// A page of a resource's list, from its continue token.
struct PageRequest<'a> {
    resource: &'a Resource,
    token: Option<String>,
    page_size: u32,
    attempts: u32,
    run: &'a RunState,
}

impl Exchange for PageRequest<'_> {
    type Settled = Page;
    type Error = Error;

    fn access(&self) -> Access<'_> {
        Access { resource: self.resource, verb: "list", namespace: "", subresource: None }
    }

    fn attempts(&self) -> u32 {
        self.attempts
    }

    fn build(&self) -> Result<http::Request<Vec<u8>>, String> {
        let mut params = ListParams::default().limit(self.page_size);
        if let Some(token) = &self.token {
            params = params.continue_token(token);
        }
        kube::core::Request::new(self.resource.collection_path())
            .list_metadata(&params)
            .map_err(|error| error.to_string())
    }

    async fn settle(&mut self, reply: Reply, _failed: u32) -> Result<Settle<Page>, Error> {
        let resource = self.resource;
        match reply.code {
            200..300 => parse_page(resource, &reply, self.run.cleaning.as_ref()).map(Settle::Done),
            410 => {
                self.token = Some(expired(resource, &reply)?);
                self.run.expired_tokens.fetch_add(1, Ordering::Relaxed);
                Ok(Settle::Again(reply))
            }
            // The collection itself is not found: the version or the CRD is gone.
            404 => Err(Error::NotServed {
                resource: resource.to_string(),
                api_version: resource.api_version(),
                message: reply.status().message,
            }),
            _ => Ok(Settle::Failed(reply)),
        }
    }

    fn unsettled(&self, why: Unsettled) -> Result<Page, Error> {
        let resource = self.resource.to_string();
        Err(match why {
            Unsettled::Unbuilt(message) => Error::BuildRequest(resource, message),
            Unsettled::Fenced => Error::Fenced,
            Unsettled::Unavailable(waited) => {
                Error::ApiserverUnavailable { resource, waited_seconds: waited.as_secs() }
            }
            Unsettled::GaveUp(Failure::NoAnswer(error)) => Error::ListTransport(resource, error),
            // A token that expires again and again.
            Unsettled::GaveUp(Failure::Answer(reply)) if reply.code == 410 => {
                Error::ListExpired(resource)
            }
            Unsettled::GaveUp(Failure::Answer(reply)) => {
                let status = reply.status();
                Error::List {
                    resource,
                    code: reply.code,
                    reason: status.reason,
                    message: status.message,
                }
            }
        })
    }
}

#[cfg(test)]
impl Listed {
    /// The cluster-scoped widget `w-1` as listed at resourceVersion 5: the object unit tests
    /// write.
    pub(crate) fn w_1() -> Listed {
        Listed {
            namespace: String::new(),
            name: "w-1".into(),
            uid: "u".into(),
            resource_version: "5".into(),
            managed_fields: None,
            generation: None,
        }
    }
}

/// The token to go on with after 410 Gone: the apiserver's inconsistent continue token, which
/// reads on in key order from where the expired one pointed, at the latest revision. Writes are
/// idempotent, so nothing is lost; objects created meanwhile are already in the new encoding.
fn expired(resource: &Resource, reply: &Reply) -> Result<String, Error> {
    let token = reply.status().metadata.continue_token;
    if token.is_empty() {
        return Err(Error::ListExpired(resource.to_string()));
    }
    warn!(%resource, "continue token expired; continuing from the latest revision");
    Ok(token)
}

fn parse_page(
    resource: &Resource,
    reply: &Reply,
    cleaning: Option<&Served>,
) -> Result<Page, Error> {
    let list: MetadataList = serde_json::from_slice(&reply.body)
        .map_err(|source| Error::Decode(resource.to_string(), source))?;
    let items = list
        .items
        .into_iter()
        .map(|item| {
            let entries = item.metadata.managed_fields;
            let managed_fields = match (cleaning, entries) {
                (Some(served), Some(entries)) => cleaned(served, resource, entries).transpose()?,
                _ => None,
            };
            Ok(Listed {
                namespace: item.metadata.namespace,
                name: item.metadata.name,
                uid: item.metadata.uid,
                resource_version: item.metadata.resource_version,
                managed_fields,
                generation: item.metadata.generation,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| Error::Decode(resource.to_string(), source))?;
    let continue_token = Some(list.metadata.continue_token).filter(|token| !token.is_empty());
    let remaining = match continue_token {
        Some(_) => list.metadata.remaining_item_count,
        None => Some(0),
    };
    Ok(Page { items, continue_token, remaining })
}

/// The `managedFields` an object should have instead of `entries` (as listed, unparsed), when
/// some name a version not `served`; the seed entry names the version the run writes to.
pub(super) fn cleaned(
    served: &Served,
    resource: &Resource,
    entries: &RawValue,
) -> Option<Result<Vec<serde_json::Value>, serde_json::Error>> {
    let entries: Vec<serde_json::Value> = match serde_json::from_str(entries.get()) {
        Ok(entries) => entries,
        Err(error) => return Some(Err(error)),
    };
    served.clean(&entries, &resource.api_version()).map(|cleaned| Ok(cleaned.entries))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    use super::*;

    fn page(body: &str) -> Page {
        let resource = Resource {
            group: String::new(),
            version: "v1".into(),
            plural: "secrets".into(),
            kind: "Secret".into(),
            namespaced: true,
            storage_version_hash: None,
            patchable_status: false,
        };
        let reply = Reply { code: 200, retry_after: None, body: body.to_owned().into() };
        parse_page(&resource, &reply, None).expect("the page parses")
    }

    #[test]
    fn an_empty_list_with_null_items_is_an_empty_last_page() {
        let empty = page(
            r#"{"kind":"PartialObjectMetadataList","metadata":{"resourceVersion":"9"},"items":null}"#,
        );
        assert!(empty.items.is_empty());
        assert_eq!((empty.continue_token, empty.remaining), (None, Some(0)));
        assert!(page(r#"{"metadata":{}}"#).items.is_empty(), "items left out");
    }

    #[test]
    fn a_page_keeps_identity_and_resource_version_and_the_next_token() {
        let parsed = page(
            r#"{"metadata":{"continue":"next","remainingItemCount":7},"items":[
                {"metadata":{"namespace":"ns","name":"a","uid":"u-a","resourceVersion":"11"}},
                {"metadata":{"name":"b","uid":"u-b","resourceVersion":"12"}}]}"#,
        );
        assert_eq!(
            parsed.items,
            [
                Listed {
                    namespace: "ns".into(),
                    name: "a".into(),
                    uid: "u-a".into(),
                    resource_version: "11".into(),
                    managed_fields: None,
                    generation: None,
                },
                Listed {
                    namespace: String::new(),
                    name: "b".into(),
                    uid: "u-b".into(),
                    resource_version: "12".into(),
                    managed_fields: None,
                    generation: None,
                },
            ]
        );
        assert_eq!((parsed.continue_token.as_deref(), parsed.remaining), (Some("next"), Some(7)));
    }

    #[test]
    fn a_cleaning_run_keeps_new_managed_fields_only_for_objects_naming_unserved_versions() {
        let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "secrets" },
            "spec": { "group": "", "names": { "plural": "secrets", "kind": "Secret" },
                "scope": "Namespaced", "versions": [
                    { "name": "v1", "served": false, "storage": false },
                    { "name": "v2", "served": true, "storage": true }] }
        }))
        .expect("a CRD");
        let served = Served::of(&crd);
        let resource = Resource {
            group: String::new(),
            version: "v2".into(),
            plural: "secrets".into(),
            kind: "Secret".into(),
            namespaced: true,
            storage_version_hash: None,
            patchable_status: false,
        };
        let body = r#"{"metadata":{},"items":[
            {"metadata":{"name":"old","resourceVersion":"1","managedFields":[
                {"manager":"a","apiVersion":"/v1"},{"manager":"b","apiVersion":"/v2"}]}},
            {"metadata":{"name":"new","resourceVersion":"2","managedFields":[
                {"manager":"b","apiVersion":"/v2"}]}},
            {"metadata":{"name":"none","resourceVersion":"3"}}]}"#;
        let reply = Reply { code: 200, retry_after: None, body: body.to_owned().into() };
        let parsed = parse_page(&resource, &reply, Some(&served)).expect("the page parses");
        let cleaned: Vec<_> = parsed.items.iter().map(|i| i.managed_fields.clone()).collect();
        let kept = serde_json::json!({"manager": "b", "apiVersion": "/v2"});
        assert_eq!(cleaned, [Some(vec![kept]), None, None]);
        let plain = parse_page(&resource, &reply, None).expect("the page parses");
        assert!(plain.items.iter().all(|i| i.managed_fields.is_none()), "not cleaning");
    }
}
