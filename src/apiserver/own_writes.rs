//! The writes this process makes through its request client, counted: status records, CRD
//! conditions and prunes, StorageStates, Events, the leader's lease. The gentle pace tells other
//! clients' writes from kube-svm's by etcd's revision, which every write moves; these writes
//! move it too, and without being counted they would pass for another client's
//! ([`crate::engine::foreground`]). The migrations' own writes go through the engine's client,
//! which the pace follows write by write.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use kube::client::Body;
use tower::{Layer, Service};

/// API groups whose writes are reviews, answered and never stored: they move no revision.
const NOT_STORED: [&str; 2] = ["/apis/authorization.k8s.io/", "/apis/authentication.k8s.io/"];

/// How many writes a client answered with success so far. Cheap to clone; clones share the
/// count.
#[derive(Clone, Debug, Default)]
pub struct OwnWrites(Arc<AtomicU64>);

impl OwnWrites {
    /// The writes answered with success so far.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// A layer that counts here the writes of the client it is added to.
    pub fn layer(&self) -> Counting {
        Counting(self.clone())
    }
}

/// Counts a client's writes in an [`OwnWrites`].
pub struct Counting(OwnWrites);

impl<S> Layer<S> for Counting {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted { inner, writes: self.0.clone() }
    }
}

/// A client's service, its writes counted.
pub struct Counted<S> {
    inner: S,
    writes: OwnWrites,
}

impl<S, B> Service<Request<Body>> for Counted<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let stored = stores(request.method(), request.uri().path());
        let writes = self.writes.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            if stored && response.status().is_success() {
                writes.0.fetch_add(1, Ordering::Relaxed);
            }
            Ok(response)
        })
    }
}

/// Whether a request of `method` to `path`, answered with success, stored something. Pure.
fn stores(method: &Method, path: &str) -> bool {
    let writes = [Method::POST, Method::PUT, Method::PATCH, Method::DELETE].contains(method);
    writes && !NOT_STORED.iter().any(|group| path.starts_with(group))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apiserver::fake;

    #[tokio::test]
    async fn only_writes_answered_with_success_that_store_something_are_counted() {
        let (fake, _) = fake::service(|sent| match sent.method.as_str() {
            "PUT" => (409, json!({ "kind": "Status", "code": 409, "reason": "Conflict" })),
            _ => (200, json!({ "kind": "ConfigMap", "metadata": {} })),
        });
        let writes = OwnWrites::default();
        let client = kube::Client::new(writes.layer().layer(fake), "default");
        let send = |method: Method, path: &str| {
            let request = Request::builder().method(method).uri(path);
            client.request_text(request.body(b"{}".to_vec()).unwrap())
        };
        let _ = send(Method::GET, "/api/v1/namespaces/a/configmaps/b").await;
        assert_eq!(writes.count(), 0, "a read");
        let _ = send(Method::PATCH, "/api/v1/namespaces/a/configmaps/b").await;
        let _ = send(Method::POST, "/apis/events.k8s.io/v1/namespaces/a/events").await;
        assert_eq!(writes.count(), 2);
        let _ = send(Method::PUT, "/api/v1/namespaces/a/configmaps/b").await;
        assert_eq!(writes.count(), 2, "a conflict stores nothing");
        let review = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
        let _ = send(Method::POST, review).await;
        assert_eq!(writes.count(), 2, "a review is answered, not stored");
    }
}
