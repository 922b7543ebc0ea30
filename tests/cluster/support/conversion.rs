//! CRD conversion webhooks: a working one served over TLS from the test process, which converts
//! by rewriting `apiVersion` (the widgets' versions share one schema), and the `clientConfig` of
//! one that points at nothing.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hyper::body::Bytes;
use kube::Client;
use serde_json::{Value, json};

use super::fixtures::{WidgetCrd, update_crd, wait_established};
use super::webhook::Tls;

/// A conversion webhook served by the test.
pub struct Converter {
    server: Tls,
    /// ConversionReviews answered.
    reviews: Arc<AtomicU64>,
}

impl Converter {
    pub async fn serve() -> Converter {
        let reviews = Arc::new(AtomicU64::new(0));
        let counted = reviews.clone();
        let server = Tls::serve(move |body| {
            counted.fetch_add(1, Ordering::Relaxed);
            std::future::ready(convert(&body))
        })
        .await;
        Converter { server, reviews }
    }

    /// The `clientConfig` that reaches it.
    pub fn client_config(&self) -> Value {
        json!({
            "url": format!("https://{}/convert", self.server.address),
            "caBundle": self.server.ca_bundle(),
        })
    }

    pub fn reviews(&self) -> u64 {
        self.reviews.load(Ordering::Relaxed)
    }
}

/// The answer to a ConversionReview: every object at the desired `apiVersion`.
fn convert(body: &Bytes) -> Value {
    let review: Value = serde_json::from_slice(body).unwrap_or_default();
    let request = &review["request"];
    let desired = request["desiredAPIVersion"].clone();
    let objects: Vec<Value> = request["objects"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|mut object| {
            object["apiVersion"] = desired.clone();
            object
        })
        .collect();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "response": {
            "uid": request["uid"],
            "convertedObjects": objects,
            "result": { "status": "Success" },
        },
    })
}

/// A `clientConfig` whose URL is a port on 127.0.0.1 nothing listens on: every call is refused.
pub fn closed_port() -> Value {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    json!({ "url": format!("https://127.0.0.1:{port}/convert") })
}

/// A `clientConfig` naming a Service that does not exist.
pub fn missing_service(name: &str) -> Value {
    json!({ "service": { "namespace": "default", "name": name, "path": "/convert", "port": 8443 } })
}

impl WidgetCrd {
    /// Makes the apiserver convert widgets between versions with the webhook `client_config`
    /// reaches, and waits until the CRD is established again.
    pub async fn convert_with(&self, client: &Client, client_config: Value) {
        let conversion = json!({
            "strategy": "Webhook",
            "webhook": { "clientConfig": client_config, "conversionReviewVersions": ["v1"] },
        });
        update_crd(client, &self.name(), |crd| {
            crd.spec.conversion = Some(serde_json::from_value(conversion.clone()).expect("valid"));
        })
        .await;
        wait_established(client, &self.name()).await;
    }

    /// Converts by rewriting `apiVersion` again, as the CRD did before [`WidgetCrd::convert_with`]
    /// (a webhook served by a test stops with it).
    pub async fn convert_without_webhook(&self, client: &Client) {
        update_crd(client, &self.name(), |crd| crd.spec.conversion = None).await;
        wait_established(client, &self.name()).await;
    }
}
