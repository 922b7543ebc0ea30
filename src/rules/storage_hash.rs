//! The storage version hash the apiserver publishes in discovery for each resource.
//!
//! kube-apiserver computes it as the first 8 bytes of sha256(`<group>/<version>/<kind>`) of the
//! resource's storage version, base64-encoded (`staging/src/k8s.io/apiserver/pkg/endpoints/
//! discovery/storageversionhash.go`). The apiserver's code warns the formula may change, so callers
//! use a computed hash only to confirm what discovery says, never in its place.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};

/// Bytes of the sha256 digest kept in the hash (`storageversionhash.go`).
const HASH_BYTES: usize = 8;

/// The storage version hash of `group/version, Kind=kind`; `group` is empty for the core group.
pub fn storage_version_hash(group: &str, version: &str, kind: &str) -> String {
    let digest = Sha256::digest(format!("{group}/{version}/{kind}").as_bytes());
    STANDARD.encode(&digest[..HASH_BYTES])
}

#[cfg(test)]
mod tests {
    use super::*;

    // Values published by kube-apiserver's discovery (`kubectl get --raw /api/v1`).
    #[test]
    fn matches_the_apiserver_for_core_resources() {
        assert_eq!(storage_version_hash("", "v1", "Pod"), "xPOwRZ+Yhw8=");
        assert_eq!(storage_version_hash("", "v1", "Secret"), "S6u1pOWzb84=");
    }

    #[test]
    fn differs_by_version() {
        assert_ne!(
            storage_version_hash("example.com", "v1", "Widget"),
            storage_version_hash("example.com", "v2", "Widget")
        );
    }
}
