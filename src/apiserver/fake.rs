//! A fake apiserver for the unit tests of orchestration: a real `kube::Client` whose every
//! request a test's function answers, each one recorded. The function answers by method and
//! path, not by order, so requests made beside the one under test (an encoding check's
//! samples) neither block nor confuse it.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::Mock;

/// One request the fake apiserver was sent.
#[derive(Clone, Debug)]
pub struct Sent {
    /// `GET`, `POST`, `PATCH`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query, without `?`; empty when none.
    pub query: String,
    /// The body, as JSON; `null` when it had none.
    pub body: Value,
}

impl Sent {
    /// Whether it would change something: anything but a read.
    pub fn writes(&self) -> bool {
        !["GET", "HEAD"].contains(&self.method.as_str())
    }
}

/// The requests sent so far, in order.
#[derive(Clone, Default)]
pub struct Recorded(Arc<Mutex<Vec<Sent>>>);

impl Recorded {
    /// Every write sent so far.
    pub fn writes(&self) -> Vec<Sent> {
        self.0.lock().unwrap().iter().filter(|s| s.writes()).cloned().collect()
    }
}

/// A client whose every request `answer` answers with a status code and a JSON body.
pub fn client(
    answer: impl Fn(&Sent) -> (u16, Value) + Send + Sync + 'static,
) -> (Client, Recorded) {
    let (service, requests) = service(answer);
    (Client::new(service, "default"), requests)
}

/// The service under [`client`], for a client built with layers of its own.
pub fn service(
    answer: impl Fn(&Sent) -> (u16, Value) + Send + Sync + 'static,
) -> (Mock<Request<Body>, Response<Body>>, Recorded) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let requests = Recorded::default();
    let recorded = requests.clone();
    tokio::spawn(async move {
        while let Some((request, respond)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            let sent = Sent {
                method: parts.method.to_string(),
                path: parts.uri.path().to_owned(),
                query: parts.uri.query().unwrap_or_default().to_owned(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let (code, reply) = answer(&sent);
            recorded.0.lock().unwrap().push(sent);
            let response = Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap();
            respond.send_response(response);
        }
    });
    (service, requests)
}

/// The apiserver's answer for something that does not exist.
pub fn not_found(sent: &Sent) -> (u16, Value) {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "reason": "NotFound", "code": 404, "message": format!("{} not found", sent.path),
    });
    (404, status)
}

/// A list of `items` of `kind`, as the apiserver answers a list.
pub fn list(api_version: &str, kind: &str, items: Vec<Value>) -> (u16, Value) {
    let list = json!({
        "apiVersion": api_version, "kind": format!("{kind}List"),
        "metadata": { "resourceVersion": "1" }, "items": items,
    });
    (200, list)
}

/// A configuration for fresh connections that go nowhere: what a check that opens its own
/// connections gets in a unit test.
pub fn config() -> kube::Config {
    kube::Config::new("http://127.0.0.1:9".parse().unwrap())
}

/// The way to the fake apiserver of `client`, as kube-svm's code asks the real one.
pub fn requests(client: Client) -> crate::apiserver::requests::Requests {
    let timeout = std::time::Duration::from_secs(10);
    crate::apiserver::requests::Requests::with_clients(client.clone(), client, config(), timeout)
}
