//! Pure rules: decisions over plain values, with no `kube::Client` anywhere below. The tiers
//! above gather the facts and carry the decisions out.
//!
//! - [`stored_versions`]: whether a CRD is stale, and whether its `storedVersions` may be pruned.
//! - [`crd`]: a CRD's state as kube-svm reasons about it, and whether it is still the one a
//!   migration recorded.
//! - [`encoding`]: the verdict on the apiservers' encoding, which a prune requires.
//! - [`managed_fields`]: which `managedFields` entries name a version no longer served, and what
//!   an object keeps of them.
//! - [`storage_hash`]: the storage version hash the apiserver publishes in discovery.
//! - [`backoff`]: how long to wait before trying again what keeps failing.

pub mod backoff;
pub mod crd;
pub mod encoding;
pub mod managed_fields;
pub mod storage_hash;
pub mod stored_versions;
