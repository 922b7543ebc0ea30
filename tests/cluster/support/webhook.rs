//! A real validating admission webhook, served over TLS from the test process and registered
//! with the apiserver: it answers updates as a test tells it to, with the codes a
//! ValidatingAdmissionPolicy cannot give (a 409 "object is locked", a 404 naming the object,
//! kilobytes of message), or never answers at all. [`Tls`] is the HTTPS server under it, which
//! `conversion.rs` serves a conversion webhook from. [`Restorer`] is a mutating one that puts
//! back the `managedFields` an update found.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rcgen::{CertificateParams, KeyPair};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::fixtures::WidgetCrd;
use super::secure_etcd::authority;

/// How the webhook answers an update of an object it was told about.
#[derive(Clone, Debug)]
pub enum Answer {
    /// Deny with this `metav1.Status` code, reason and message.
    Deny { code: u16, reason: String, message: String },
    /// Deny with 404 NotFound, the Status details naming the object, as the apiserver does for an
    /// object that is gone.
    NotFound,
    /// Accept the connection and the request, and never answer.
    Hang,
    /// Hold the request until [`Webhook::release`], then allow it.
    Hold,
    /// Allow the request after this long.
    Delay(std::time::Duration),
}

/// What the webhook does: the answer for every object when `everyone` is set, else the one for
/// the object's name; it allows everything else.
#[derive(Debug, Default)]
struct Rules {
    named: BTreeMap<String, Answer>,
    everyone: Option<Answer>,
}

pub struct Webhook {
    name: String,
    rules: Arc<Mutex<Rules>>,
    /// Reviews received, whatever the answer.
    reviews: Arc<AtomicU64>,
    /// Reviews held now ([`Answer::Hold`]), and the release they wait for.
    held: Arc<AtomicU64>,
    released: tokio::sync::watch::Sender<bool>,
    /// Reviews answered after a delay ([`Answer::Delay`]).
    delayed: Arc<AtomicU64>,
    client: Client,
}

/// What the reviews of one webhook share.
#[derive(Clone)]
struct Shared {
    rules: Arc<Mutex<Rules>>,
    reviews: Arc<AtomicU64>,
    held: Arc<AtomicU64>,
    released: tokio::sync::watch::Receiver<bool>,
    delayed: Arc<AtomicU64>,
}

impl Webhook {
    /// Serves a webhook on 127.0.0.1 and registers it as `name` for UPDATEs of `resources` in
    /// API group `group`, failing closed, with `timeout_seconds`. It allows everything until told
    /// otherwise.
    pub async fn install(
        client: &Client,
        name: &str,
        group: &str,
        resources: &[&str],
        timeout_seconds: i32,
    ) -> Webhook {
        let (released, release) = tokio::sync::watch::channel(false);
        let shared = Shared {
            rules: Arc::new(Mutex::new(Rules::default())),
            reviews: Arc::new(AtomicU64::new(0)),
            held: Arc::new(AtomicU64::new(0)),
            released: release,
            delayed: Arc::new(AtomicU64::new(0)),
        };
        let answering = shared.clone();
        let server = Tls::serve(move |body| review(body, answering.clone())).await;
        register(client, name, group, resources, timeout_seconds, &server).await;
        let Shared { rules, reviews, held, delayed, .. } = shared;
        let client = client.clone();
        Webhook { name: name.to_owned(), rules, reviews, held, released, delayed, client }
    }

    /// Installs a webhook on the widgets of `widgets` (allowing everything until told
    /// otherwise) and waits until the apiserver calls it: it does once its informers see it.
    pub async fn on_widgets(client: &Client, widgets: &WidgetCrd, timeout_seconds: i32) -> Webhook {
        let name = format!("hook-{}", widgets.group);
        let webhook =
            Webhook::install(client, &name, &widgets.group, &["widgets"], timeout_seconds).await;
        let api = widgets.api(client, "v1", None);
        let touch = json!({ "metadata": { "annotations": { "probe": "yes" } } });
        webhook
            .wait_until_called(async || {
                let _ = api.patch("w-1", &PatchParams::default(), &Patch::Merge(&touch)).await;
            })
            .await;
        webhook
    }

    /// Runs `update` (an update the webhook is registered for) again and again until the
    /// apiserver calls the webhook: it does once its informers see the registration.
    pub async fn wait_until_called(&self, mut update: impl AsyncFnMut()) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.reviews() == 0 {
            assert!(Instant::now() < deadline, "the apiserver never called the webhook");
            update().await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Unregisters the webhook and waits until the apiserver stops calling it (once its
    /// informers see it go): until an update of the widget `name` gets through.
    pub async fn remove_from_widgets(&self, client: &Client, widgets: &WidgetCrd, name: &str) {
        self.remove().await;
        let api = widgets.api(client, "v1", None);
        let touch = json!({ "metadata": { "annotations": { "unlocked": "yes" } } });
        let deadline = Instant::now() + Duration::from_secs(30);
        while api.patch(name, &PatchParams::default(), &Patch::Merge(&touch)).await.is_err() {
            assert!(Instant::now() < deadline, "the webhook never went");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Reviews held now ([`Answer::Hold`]).
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Reviews answered after a delay so far ([`Answer::Delay`]).
    pub fn delayed(&self) -> u64 {
        self.delayed.load(Ordering::Relaxed)
    }

    /// Lets every held review (and every later one) through, allowed.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// From now on, answers updates of the objects named `names` with `answer`.
    pub fn answer(&self, names: impl IntoIterator<Item = String>, answer: Answer) {
        let mut rules = self.rules.lock().expect("rules");
        rules.named.extend(names.into_iter().map(|name| (name, answer.clone())));
    }

    /// From now on, answers every update with `answer`.
    pub fn answer_all(&self, answer: Answer) {
        self.rules.lock().expect("rules").everyone = Some(answer);
    }

    /// From now on, allows every update (what [`Webhook::answer_all`] said is forgotten).
    pub fn allow_all(&self) {
        self.rules.lock().expect("rules").everyone = None;
    }

    /// Reviews received so far.
    pub fn reviews(&self) -> u64 {
        self.reviews.load(Ordering::Relaxed)
    }

    /// Unregisters the webhook.
    pub async fn remove(&self) {
        Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await
            .expect("the webhook is unregistered");
    }
}

async fn register(
    client: &Client,
    name: &str,
    group: &str,
    resources: &[&str],
    timeout_seconds: i32,
    server: &Tls,
) {
    let (address, ca_bundle) = (server.address, server.ca_bundle());
    let configuration: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": { "name": name },
        "webhooks": [{
            "name": format!("{name}.svm.example.com"),
            "clientConfig": { "url": format!("https://{address}/validate"), "caBundle": ca_bundle },
            "rules": [{
                "apiGroups": [group], "apiVersions": ["*"], "operations": ["UPDATE"],
                "resources": resources, "scope": "*",
            }],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": timeout_seconds,
        }],
    }))
    .expect("a valid webhook configuration");
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .expect("the webhook is registered");
}

async fn review(body: Bytes, mut shared: Shared) -> Value {
    shared.reviews.fetch_add(1, Ordering::Relaxed);
    let rules = &shared.rules;
    let review: Value = serde_json::from_slice(&body).unwrap_or_default();
    let request = &review["request"];
    let name = request["name"].as_str().unwrap_or_default().to_owned();
    let answer = {
        let rules = rules.lock().expect("rules");
        rules.everyone.clone().or_else(|| rules.named.get(&name).cloned())
    };
    let response = match answer {
        None => json!({ "uid": request["uid"], "allowed": true }),
        Some(Answer::Hang) => std::future::pending().await,
        Some(Answer::Delay(delay)) => {
            tokio::time::sleep(delay).await;
            shared.delayed.fetch_add(1, Ordering::Relaxed);
            json!({ "uid": request["uid"], "allowed": true })
        }
        Some(Answer::Hold) => {
            shared.held.fetch_add(1, Ordering::Relaxed);
            let _ = shared.released.wait_for(|released| *released).await;
            shared.held.fetch_sub(1, Ordering::Relaxed);
            json!({ "uid": request["uid"], "allowed": true })
        }
        Some(Answer::Deny { code, reason, message }) => json!({
            "uid": request["uid"], "allowed": false,
            "status": { "code": code, "reason": reason, "message": message },
        }),
        Some(Answer::NotFound) => json!({
            "uid": request["uid"], "allowed": false,
            "status": {
                "code": 404, "reason": "NotFound",
                "message": format!("{} {name:?} not found", request["resource"]["resource"].as_str().unwrap_or_default()),
                "details": {
                    "name": name,
                    "group": request["resource"]["group"],
                    "kind": request["resource"]["resource"],
                },
            },
        }),
    };
    json!({ "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response })
}

/// A mutating webhook on the widgets of one CRD that answers every update of one widget with a
/// patch putting back the `managedFields` its old object had, as any webhook may: the apiserver
/// stores managedFields a webhook sets whenever they are well formed. Other widgets pass
/// unchanged.
pub struct Restorer {
    name: String,
    reviews: Arc<AtomicU64>,
    client: Client,
}

impl Restorer {
    /// Serves and registers the webhook for the widget `restored` of `widgets`, and returns once
    /// the apiserver calls it: updates of the widget `probe` (which must exist) show when.
    pub async fn install(
        client: &Client,
        widgets: &WidgetCrd,
        restored: &str,
        probe: &str,
    ) -> Restorer {
        let reviews = Arc::new(AtomicU64::new(0));
        let (counted, restored) = (reviews.clone(), restored.to_owned());
        let server = Tls::serve(move |body| {
            counted.fetch_add(1, Ordering::Relaxed);
            std::future::ready(restore(&body, &restored))
        })
        .await;
        let name = format!("restorer-{}", widgets.group);
        let configuration: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": { "name": name },
            "webhooks": [{
                "name": format!("{name}.svm.example.com"),
                "clientConfig": {
                    "url": format!("https://{}/mutate", server.address),
                    "caBundle": server.ca_bundle(),
                },
                "rules": [{
                    "apiGroups": [widgets.group], "apiVersions": ["*"], "operations": ["UPDATE"],
                    "resources": ["widgets"], "scope": "*",
                }],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 10,
            }],
        }))
        .expect("a valid webhook configuration");
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &configuration)
            .await
            .expect("the webhook is registered");
        let restorer = Restorer { name, reviews, client: client.clone() };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !restorer.called_on_update(widgets, probe).await {
            assert!(Instant::now() < deadline, "the apiserver never called the webhook");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        restorer
    }

    /// Unregisters the webhook and returns once an update of the widget `probe` no longer
    /// reaches it.
    pub async fn remove(&self, widgets: &WidgetCrd, probe: &str) {
        Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await
            .expect("the webhook is unregistered");
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.called_on_update(widgets, probe).await {
            assert!(Instant::now() < deadline, "the webhook never went");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether an update of the widget `probe` made now reaches the webhook: the apiserver
    /// calls it within the request, so the count has moved by the time the answer is back.
    async fn called_on_update(&self, widgets: &WidgetCrd, probe: &str) -> bool {
        let before = self.reviews.load(Ordering::Relaxed);
        let touch = json!({ "metadata": { "annotations": { "probed": before.to_string() } } });
        let api = widgets.api(&self.client, "v2", None);
        let updated = api.patch(probe, &PatchParams::default(), &Patch::Merge(&touch)).await;
        updated.is_ok() && self.reviews.load(Ordering::Relaxed) > before
    }
}

/// The answer to one review: for the widget `restored`, a JSON patch setting `managedFields` to
/// the old object's.
fn restore(body: &[u8], restored: &str) -> Value {
    let review: Value = serde_json::from_slice(body).unwrap_or_default();
    let request = &review["request"];
    let mut response = json!({ "uid": request["uid"], "allowed": true });
    let old = &request["oldObject"]["metadata"]["managedFields"];
    if request["name"] == restored && old.is_array() {
        let patch = json!([{ "op": "replace", "path": "/metadata/managedFields", "value": old }]);
        response["patchType"] = json!("JSONPatch");
        response["patch"] =
            json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
    }
    json!({ "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response })
}

/// An HTTPS server on 127.0.0.1 with a certificate of its own CA, answering every POST with the
/// JSON its handler makes of the request body: what the apiserver's webhooks call.
pub struct Tls {
    pub address: SocketAddr,
    /// The CA that signed the serving certificate, PEM-encoded.
    pub ca_pem: String,
}

impl Tls {
    /// Serves `answer` from a task of the test's runtime.
    pub async fn serve<F, A>(answer: F) -> Tls
    where
        F: Fn(Bytes) -> A + Clone + Send + Sync + 'static,
        A: Future<Output = Value> + Send + 'static,
    {
        let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
        let ca = authority("webhook-ca").expect("a CA");
        let key = KeyPair::generate().expect("a key");
        let params = CertificateParams::new(vec!["127.0.0.1".into()]).expect("parameters");
        let certificate = params.signed_by(&key, &ca).expect("a serving certificate");
        let tls = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(certificate.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .expect("a TLS configuration");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("an address");
        tokio::spawn(accept(listener, TlsAcceptor::from(Arc::new(tls)), answer));
        Tls { address, ca_pem: ca.pem() }
    }

    /// The CA bundle a webhook's `clientConfig.caBundle` carries.
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }
}

async fn accept<F, A>(listener: TcpListener, acceptor: TlsAcceptor, answer: F)
where
    F: Fn(Bytes) -> A + Clone + Send + Sync + 'static,
    A: Future<Output = Value> + Send + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let (acceptor, answer) = (acceptor.clone(), answer.clone());
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(stream).await else { return };
            let service = service_fn(move |request: Request<Incoming>| {
                let answer = answer.clone();
                async move {
                    let body = request.into_body().collect().await?.to_bytes();
                    let reply = answer(body).await;
                    Ok::<_, hyper::Error>(
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(reply.to_string())))
                            .expect("a response"),
                    )
                }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
