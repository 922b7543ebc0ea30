//! How an object's value is stored in etcd, read from the raw bytes without decrypting anything.
//!
//! kube-apiserver writes custom resources as JSON and built-in resources as protobuf behind the
//! 4-byte prefix `k8s\0` (a `runtime.Unknown` envelope whose first field is the TypeMeta). With
//! encryption at rest the value is `k8s:enc:<provider>:v1:<key name>:` followed by ciphertext.

use serde::Deserialize;

/// Prefix of protobuf-encoded values (`k8s.io/apimachinery/pkg/runtime/serializer/protobuf`).
const PROTOBUF_PREFIX: &[u8] = b"k8s\0";

/// Prefix of values written through an encryption provider (`apiserver/pkg/storage/value`).
const ENCRYPTED_PREFIX: &[u8] = b"k8s:enc:";

/// The encoding of one stored value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stored {
    /// A JSON document with its `apiVersion` and `kind`.
    Json {
        /// The stored `apiVersion`, such as `example.com/v1`.
        api_version: String,
        /// The stored `kind`.
        kind: String,
    },
    /// A protobuf `runtime.Unknown` with its TypeMeta.
    Protobuf {
        /// The stored `apiVersion`, such as `apps/v1`.
        api_version: String,
        /// The stored `kind`.
        kind: String,
    },
    /// Encrypted at rest; the provider (`aescbc`, `aesgcm`, `secretbox`, `kms`) and key name are
    /// in clear text, the object is not.
    Encrypted {
        /// The encryption provider, such as `aescbc`.
        provider: String,
        /// The key's name in the apiserver's EncryptionConfiguration.
        key_name: String,
    },
    /// Anything else (CBOR, a malformed value, a provider kube-svm does not know).
    Unrecognized,
}

impl Stored {
    /// The stored `apiVersion`, when the value is not encrypted.
    pub fn api_version(&self) -> Option<&str> {
        match self {
            Stored::Json { api_version, .. } | Stored::Protobuf { api_version, .. } => {
                Some(api_version)
            }
            Stored::Encrypted { .. } | Stored::Unrecognized => None,
        }
    }
}

/// Reads how `value` is stored.
pub fn classify(value: &[u8]) -> Stored {
    if let Some(rest) = value.strip_prefix(ENCRYPTED_PREFIX) {
        return encrypted(rest).unwrap_or(Stored::Unrecognized);
    }
    if let Some(rest) = value.strip_prefix(PROTOBUF_PREFIX) {
        return protobuf_type_meta(rest)
            .map(|(api_version, kind)| Stored::Protobuf { api_version, kind })
            .unwrap_or(Stored::Unrecognized);
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct TypeMeta {
        api_version: String,
        kind: String,
    }
    match serde_json::from_slice::<TypeMeta>(value) {
        Ok(TypeMeta { api_version, kind }) => Stored::Json { api_version, kind },
        Err(_) => Stored::Unrecognized,
    }
}

/// Parses `<provider>:v1:<key name>:` (kms v2 writes `kms:v2:<name>:`).
fn encrypted(rest: &[u8]) -> Option<Stored> {
    let mut fields = rest.splitn(4, |&b| b == b':');
    let provider = std::str::from_utf8(fields.next()?).ok()?;
    let _format_version = fields.next()?;
    let key_name = std::str::from_utf8(fields.next()?).ok()?;
    fields.next()?;
    Some(Stored::Encrypted { provider: provider.to_owned(), key_name: key_name.to_owned() })
}

/// Reads field 1 (TypeMeta: 1 = apiVersion, 2 = kind) of a `runtime.Unknown` message.
fn protobuf_type_meta(message: &[u8]) -> Option<(String, String)> {
    let type_meta = protobuf_fields(message).find(|(field, _)| *field == 1)?.1;
    let (mut api_version, mut kind) = (String::new(), String::new());
    for (field, bytes) in protobuf_fields(type_meta) {
        let text = std::str::from_utf8(bytes).ok()?.to_owned();
        match field {
            1 => api_version = text,
            2 => kind = text,
            _ => {}
        }
    }
    Some((api_version, kind))
}

/// Iterates over the length-delimited fields of a protobuf message, stopping at the first field of
/// another wire type (TypeMeta and its envelope have only length-delimited fields before the raw
/// object bytes).
fn protobuf_fields(mut bytes: &[u8]) -> impl Iterator<Item = (u64, &[u8])> {
    const LENGTH_DELIMITED: u64 = 2;
    std::iter::from_fn(move || {
        let (tag, rest) = varint(bytes)?;
        if tag & 0x7 != LENGTH_DELIMITED {
            return None;
        }
        let (len, rest) = varint(rest)?;
        let len = usize::try_from(len).ok()?;
        let field = rest.get(..len)?;
        bytes = &rest[len..];
        Some((tag >> 3, field))
    })
}

fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3) | 2, u8::try_from(bytes.len()).unwrap()];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn reads_json_type_meta() {
        let value = br#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"a"}}"#;
        assert_eq!(
            classify(value),
            Stored::Json { api_version: "example.com/v1".into(), kind: "Widget".into() }
        );
    }

    #[test]
    fn reads_protobuf_type_meta() {
        let type_meta = [field(1, b"v1"), field(2, b"Secret")].concat();
        let mut value = PROTOBUF_PREFIX.to_vec();
        value.extend(field(1, &type_meta));
        value.extend(field(2, b"\x0a\x03raw"));
        let stored = classify(&value);
        assert_eq!(stored, Stored::Protobuf { api_version: "v1".into(), kind: "Secret".into() });
        assert_eq!(stored.api_version(), Some("v1"));
    }

    #[test]
    fn reads_encryption_provider_and_key_without_decrypting() {
        let value = b"k8s:enc:aescbc:v1:key2:\x00\x01binary:ciphertext";
        assert_eq!(
            classify(value),
            Stored::Encrypted { provider: "aescbc".into(), key_name: "key2".into() }
        );
        assert_eq!(classify(value).api_version(), None);
    }

    #[test]
    fn rejects_truncated_and_unknown_values() {
        assert_eq!(classify(b"k8s\0\x0a\x7f"), Stored::Unrecognized);
        assert_eq!(classify(b"k8s:enc:aescbc"), Stored::Unrecognized);
        assert_eq!(classify(b"\xd9\xd9\xf7"), Stored::Unrecognized);
        assert_eq!(classify(b"{}"), Stored::Unrecognized);
    }
}
