//! The names of the CRD trigger's migrations: `<plural>.<group>-<storage version>-<generation>`
//! (shortened, with a hash of the full name, when that is longer than a name may be), and which
//! CRD a migration of that name was created for.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use sha2::{Digest, Sha256};

use crate::api::StorageVersionMigration;

/// The longest name an object may have (a DNS subdomain).
pub(super) const MAX_NAME: usize = 253;

/// Hex digits of the full name's sha256 kept in a shortened name: enough that two CRDs never
/// meet.
const NAME_HASH_DIGITS: usize = 10;

/// `<plural>.<group>-<storage version>-<generation>`, or, when that is too long for a name, its
/// beginning, a hash of the whole, and the same ending.
pub fn migration_name(plural: &str, group: &str, storage: &str, generation: i64) -> String {
    shortened(&format!("{plural}.{group}"), &format!("-{storage}-{generation}"))
}

/// The name of the migration that cleans `managedFields` of a state already migrated (its
/// versions no longer served long enough, or named for removal): another migration than
/// [`migration_name`]'s.
pub fn cleaning_name(plural: &str, group: &str, storage: &str, generation: i64) -> String {
    shortened(&format!("{plural}.{group}"), &format!("-{storage}-{generation}-clean"))
}

/// The name of the migration for a CRD created again under the name of one deleted since,
/// whose migration of the same state exists still: [`migration_name`] and the beginning of the
/// new CRD's uid.
pub fn recreated_name(
    plural: &str,
    group: &str,
    storage: &str,
    generation: i64,
    uid: &str,
) -> String {
    let uid: String = uid.chars().filter(char::is_ascii_alphanumeric).take(8).collect();
    shortened(&format!("{plural}.{group}"), &format!("-{storage}-{generation}-{uid}"))
}

/// `prefix` and `suffix`, or, when that is too long for a name, the beginning of `prefix`, a
/// hash of the whole, and `suffix`.
fn shortened(prefix: &str, suffix: &str) -> String {
    let full = format!("{prefix}{suffix}");
    if full.len() <= MAX_NAME {
        return full;
    }
    let digest = Sha256::digest(full.as_bytes());
    let hash: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let hash = &hash[..NAME_HASH_DIGITS];
    let room = MAX_NAME - suffix.len() - hash.len() - 1;
    // The prefix is ASCII (a CRD's name); a name may not end in '.' or '-' before the hash.
    let kept = prefix[..room.min(prefix.len())].trim_end_matches(['.', '-']);
    format!("{kept}-{hash}{suffix}")
}

/// The uid of the CRD a migration of the CRD trigger was created for: a CRD deleted and created
/// again through the same history needs a migration of the same name, which is not its own.
pub const CRD_UID_ANNOTATION: &str = "kube-svm.io/crd-uid";

/// Whether `migration`, named after a state of `crd`, was created for this CRD and not for one
/// of the same name deleted since: by the uid it records, or, when it records none, by being
/// created no earlier than the CRD. Pure.
pub fn created_for(migration: &StorageVersionMigration, crd: &CustomResourceDefinition) -> bool {
    let recorded = migration.metadata.annotations.as_ref().and_then(|a| a.get(CRD_UID_ANNOTATION));
    if let Some(recorded) = recorded {
        return crd.metadata.uid.as_ref() == Some(recorded);
    }
    match (&migration.metadata.creation_timestamp, &crd.metadata.creation_timestamp) {
        (Some(migration), Some(crd)) => migration.0 >= crd.0,
        _ => true,
    }
}
