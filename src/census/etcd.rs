//! A read-only etcd client: range reads through etcd's v3 JSON gateway (`POST /v3/kv/range`),
//! served on the same client port as gRPC (on by default since etcd 3.4). The only request this
//! client can build is a range, so a census can never write, delete or compact.
//!
//! Its answers are raw values, Secrets among them (unencrypted ones in the clear), so requests go
//! to the endpoints given and nowhere else: a redirect is an error, never followed (a 307 would
//! send the request to wherever it points), and no proxy is used unless one is given explicitly
//! (`HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY` are ignored).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

/// How long one range read may take. A page is at most [`crate::census::PAGE_KEYS`] values
/// (each under etcd's 1.5 MiB request limit), so this is generous.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// etcd's gRPC status code for a read below the compacted revision (`codes.OutOfRange`,
/// `ErrCompacted` in `etcdserver/api/v3rpc/rpctypes`).
const GRPC_OUT_OF_RANGE: i64 = 11;

/// Why etcd could not be reached or read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A certificate or key file could not be read.
    #[error("failed to read {what} {path}")]
    ReadFile {
        /// What the file should hold, such as "CA certificate".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The read's failure.
        #[source]
        source: std::io::Error,
    },
    /// A certificate or key file holds nothing usable in PEM format.
    #[error("{path} holds no {what} in PEM format")]
    Pem {
        /// What the file should hold, such as "private key".
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// rustls refused the certificates or key.
    #[error("invalid TLS settings")]
    Tls(#[source] rustls::Error),
    /// A client certificate without its key, or a key without its certificate.
    #[error("--etcd-cert and --etcd-key go together")]
    HalfIdentity,
    /// An https endpoint without a CA certificate to trust.
    #[error("{endpoint} is https: give etcd's CA certificate with --etcd-ca")]
    MissingCa {
        /// The endpoint as given.
        endpoint: String,
    },
    /// An endpoint that is not an http or https URL.
    #[error("{endpoint} is not an http:// or https:// URL")]
    Endpoint {
        /// The endpoint as given.
        endpoint: String,
    },
    /// No endpoint at all.
    #[error("no etcd endpoint given")]
    NoEndpoint,
    /// reqwest could not build the client.
    #[error("failed to build the HTTP client")]
    Client(#[source] reqwest::Error),
    /// The proxy given is not a URL reqwest accepts.
    #[error("{proxy} is not a usable proxy URL")]
    Proxy {
        /// The proxy as given.
        proxy: String,
        /// reqwest's refusal.
        #[source]
        source: reqwest::Error,
    },
    /// etcd answered with a redirect, which is never followed.
    #[error(
        "etcd at {endpoint} answered with a redirect (HTTP {status}) to {location}; redirects are never followed: give the endpoint that serves"
    )]
    Redirected {
        /// The endpoint that answered.
        endpoint: String,
        /// The HTTP status code, a 3xx.
        status: u16,
        /// The `Location` header, or "nowhere" without one.
        location: String,
    },
    /// No endpoint could be connected to.
    #[error(
        "no etcd endpoint answered (last tried {endpoint}): no connection, or the TLS handshake failed"
    )]
    Unreachable {
        /// The last endpoint tried.
        endpoint: String,
        /// Its connection failure.
        #[source]
        source: reqwest::Error,
    },
    /// etcd answered the read with an error status.
    #[error("etcd at {endpoint} refused the read (HTTP {status}): {message}")]
    Refused {
        /// The endpoint that answered.
        endpoint: String,
        /// The HTTP status code.
        status: u16,
        /// The gateway's error message, or the body when it gives none.
        message: String,
    },
    /// The revision being read was compacted away before the read finished.
    #[error(
        "revision {revision} was compacted while it was being read (kube-apiserver compacts every 5 minutes by default)"
    )]
    Compacted {
        /// The revision the read asked for.
        revision: i64,
    },
    /// The connection broke while the body was read.
    #[error("etcd at {endpoint} stopped answering in the middle of a response")]
    Interrupted {
        /// The endpoint that answered.
        endpoint: String,
        /// reqwest's failure.
        #[source]
        source: reqwest::Error,
    },
    /// The body is not the JSON of a range response.
    #[error("etcd at {endpoint} answered with a body that is not a range response")]
    Decode {
        /// The endpoint that answered.
        endpoint: String,
        /// What failed to decode.
        #[source]
        source: anyhow::Error,
    },
}

/// Results of reading etcd.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where etcd is and how to prove who we are, as kube-apiserver's `--etcd-servers`,
/// `--etcd-cafile`, `--etcd-certfile` and `--etcd-keyfile` say.
#[derive(Clone, Debug, Default)]
pub struct Connection {
    /// etcd's client URLs (`http://` or `https://`), tried in turn.
    pub endpoints: Vec<String>,
    /// The CA certificate (PEM) to trust; the only one trusted, needed for https.
    pub ca: Option<PathBuf>,
    /// The client certificate (PEM) to present, with `key`.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key: Option<PathBuf>,
    /// The HTTP proxy to reach etcd through; none unless given (the environment's proxy
    /// variables are never read).
    pub proxy: Option<String>,
}

/// One key as etcd holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key, such as `/registry/secrets/default/token`.
    pub key: Vec<u8>,
    /// The stored bytes: JSON, protobuf, or an encrypted envelope.
    pub value: Vec<u8>,
    /// The revision of the last write to this key: the object's `metadata.resourceVersion`.
    pub mod_revision: i64,
}

/// A page of keys in key order, read at one revision.
#[derive(Debug)]
pub struct Page {
    /// The keys read, with their values (none for a count).
    pub kvs: Vec<KeyValue>,
    /// Whether keys remain in the range after the last one returned.
    pub more: bool,
    /// The revision the page was read at (the store's current one when none was asked for).
    pub revision: i64,
    /// How many keys the whole range holds at that revision.
    pub count: u64,
}

/// Reads etcd and nothing else.
pub struct EtcdReader {
    endpoints: Vec<String>,
    /// The endpoint that answered last, tried first next time.
    preferred: AtomicUsize,
    http: reqwest::Client,
}

impl EtcdReader {
    /// A reader of `connection`'s endpoints, after checking its settings; connects on first use.
    pub fn connect(connection: &Connection) -> Result<EtcdReader> {
        let Connection { endpoints, ca, cert, key, proxy } = connection;
        let endpoints: Vec<String> =
            endpoints.iter().map(|e| e.trim_end_matches('/').to_owned()).collect();
        if endpoints.is_empty() {
            return Err(Error::NoEndpoint);
        }
        for endpoint in &endpoints {
            let https = endpoint.starts_with("https://");
            if !https && !endpoint.starts_with("http://") {
                return Err(Error::Endpoint { endpoint: endpoint.clone() });
            }
            if https && ca.is_none() {
                return Err(Error::MissingCa { endpoint: endpoint.clone() });
            }
        }
        let builder = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .http1_only()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .tls_backend_preconfigured(tls_config(ca.as_deref(), cert, key)?);
        let builder = match proxy {
            None => builder,
            Some(proxy) => builder.proxy(
                reqwest::Proxy::all(proxy.as_str())
                    .map_err(|source| Error::Proxy { proxy: proxy.clone(), source })?,
            ),
        };
        let http = builder.build().map_err(Error::Client)?;
        Ok(EtcdReader { endpoints, preferred: AtomicUsize::new(0), http })
    }

    /// Up to `limit` keys of `[start, end)` at `revision` (0: the current revision).
    pub async fn range(&self, start: &[u8], end: &[u8], limit: u64, revision: i64) -> Result<Page> {
        let request = RangeRequest {
            key: STANDARD.encode(start),
            range_end: STANDARD.encode(end),
            limit: limit.to_string(),
            revision: revision.to_string(),
            count_only: false,
        };
        self.send(&request).await
    }

    /// How many keys `[start, end)` holds now, and the current revision.
    pub async fn count(&self, start: &[u8], end: &[u8]) -> Result<Page> {
        let request = RangeRequest {
            key: STANDARD.encode(start),
            range_end: STANDARD.encode(end),
            limit: "0".into(),
            revision: "0".into(),
            count_only: true,
        };
        self.send(&request).await
    }

    /// Sends the range to the preferred endpoint, then to the others while none answers.
    async fn send(&self, request: &RangeRequest) -> Result<Page> {
        let first = self.preferred.load(Ordering::Relaxed);
        let mut unreachable = None;
        for offset in 0..self.endpoints.len() {
            let index = (first + offset) % self.endpoints.len();
            let endpoint = &self.endpoints[index];
            let sent = self.http.post(format!("{endpoint}/v3/kv/range")).json(request).send();
            let response = match sent.await {
                Ok(response) => response,
                Err(source) => {
                    unreachable = Some(Error::Unreachable { endpoint: endpoint.clone(), source });
                    continue;
                }
            };
            self.preferred.store(index, Ordering::Relaxed);
            return read_response(endpoint, response, request).await;
        }
        Err(unreachable.unwrap_or(Error::NoEndpoint))
    }
}

async fn read_response(
    endpoint: &str,
    response: reqwest::Response,
    request: &RangeRequest,
) -> Result<Page> {
    let status = response.status();
    if status.is_redirection() {
        let location = response.headers().get(reqwest::header::LOCATION);
        let location = location.map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned());
        return Err(Error::Redirected {
            endpoint: endpoint.to_owned(),
            status: status.as_u16(),
            location: location.unwrap_or_else(|| "nowhere".to_owned()),
        });
    }
    let body = response
        .bytes()
        .await
        .map_err(|source| Error::Interrupted { endpoint: endpoint.to_owned(), source })?;
    if !status.is_success() {
        let failure: GatewayError = serde_json::from_slice(&body).unwrap_or_default();
        if failure.code == GRPC_OUT_OF_RANGE {
            return Err(Error::Compacted {
                revision: request.revision.parse().unwrap_or_default(),
            });
        }
        let message = match failure.message.is_empty() {
            true => String::from_utf8_lossy(&body).trim().to_owned(),
            false => failure.message,
        };
        return Err(Error::Refused {
            endpoint: endpoint.to_owned(),
            status: status.as_u16(),
            message,
        });
    }
    decode(&body).map_err(|source| Error::Decode { endpoint: endpoint.to_owned(), source })
}

fn decode(body: &[u8]) -> anyhow::Result<Page> {
    let RangeResponse { header, kvs, more, count } = serde_json::from_slice(body)?;
    let kvs = kvs
        .into_iter()
        .map(|raw| {
            Ok(KeyValue {
                key: STANDARD.decode(raw.key)?,
                value: STANDARD.decode(raw.value)?,
                mod_revision: raw.mod_revision.parse()?,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Page { kvs, more, revision: header.revision.parse()?, count: count.parse()? })
}

/// A TLS configuration that trusts `ca` alone (nothing without it: plain http) and presents
/// `cert`/`key` when given. rustls on ring, the provider the Kubernetes client uses too.
fn tls_config(
    ca: Option<&Path>,
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = ca {
        for certificate in certificates(ca, "CA certificate")? {
            roots.add(certificate).map_err(Error::Tls)?;
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(Error::Tls)?
    .with_root_certificates(roots);
    match (cert, key) {
        (Some(cert), Some(key)) => {
            let chain = certificates(cert, "client certificate")?;
            let bytes = read(key, "client key")?;
            let key = PrivateKeyDer::from_pem_slice(&bytes)
                .map_err(|_| Error::Pem { what: "private key", path: key.clone() })?;
            builder.with_client_auth_cert(chain, key).map_err(Error::Tls)
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(Error::HalfIdentity),
    }
}

fn certificates(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = read(path, what)?;
    let certificates: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|_| Error::Pem { what, path: path.to_owned() })?;
    match certificates.is_empty() {
        true => Err(Error::Pem { what, path: path.to_owned() }),
        false => Ok(certificates),
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::ReadFile { what, path: path.to_owned(), source })
}

// The gateway speaks protobuf's JSON mapping: bytes as base64, 64-bit integers as strings, and
// fields at their default value left out.
#[derive(Serialize)]
struct RangeRequest {
    key: String,
    range_end: String,
    limit: String,
    revision: String,
    count_only: bool,
}

#[derive(Deserialize)]
struct RangeResponse {
    header: Header,
    #[serde(default)]
    kvs: Vec<RawKeyValue>,
    #[serde(default)]
    more: bool,
    #[serde(default = "zero")]
    count: String,
}

#[derive(Deserialize)]
struct Header {
    revision: String,
}

#[derive(Deserialize)]
struct RawKeyValue {
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default = "zero")]
    mod_revision: String,
}

#[derive(Deserialize, Default)]
struct GatewayError {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    message: String,
}

fn zero() -> String {
    "0".into()
}

/// The smallest key greater than every key that starts with `prefix` (etcd's `range_end` for a
/// prefix read).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range runs to the end of the keyspace.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_the_prefix() {
        assert_eq!(prefix_end(b"/registry/secrets/"), b"/registry/secrets0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
    }

    #[test]
    fn decodes_the_gateways_json() {
        let body = br#"{"header":{"revision":"42"},"kvs":[{"key":"L2E=","value":"eyJ9","mod_revision":"7"}],"more":true,"count":"3"}"#;
        let page = decode(body).unwrap();
        assert_eq!((page.revision, page.count, page.more), (42, 3, true));
        assert_eq!(
            page.kvs,
            [KeyValue { key: b"/a".to_vec(), value: b"{\"}".to_vec(), mod_revision: 7 }]
        );
        let empty = decode(br#"{"header":{"revision":"9"}}"#).unwrap();
        assert_eq!((empty.kvs.len(), empty.more, empty.count), (0, false, 0));
    }

    #[test]
    fn refuses_bad_settings_before_connecting() {
        let https =
            Connection { endpoints: vec!["https://10.0.0.1:2379".into()], ..Default::default() };
        assert!(matches!(EtcdReader::connect(&https), Err(Error::MissingCa { .. })));
        let bare = Connection { endpoints: vec!["10.0.0.1:2379".into()], ..Default::default() };
        assert!(matches!(EtcdReader::connect(&bare), Err(Error::Endpoint { .. })));
        let half = Connection {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            cert: Some("/tmp/cert.pem".into()),
            ..Default::default()
        };
        assert!(matches!(EtcdReader::connect(&half), Err(Error::HalfIdentity)));
        assert!(matches!(EtcdReader::connect(&Connection::default()), Err(Error::NoEndpoint)));
        let proxied = Connection {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            proxy: Some("http://[::1".into()),
            ..Default::default()
        };
        assert!(matches!(EtcdReader::connect(&proxied), Err(Error::Proxy { .. })));
    }
}
