//! What is read from the cluster before and after writing, to know that a migration's writes
//! move objects where they should:
//!
//! - [`encoding`]: whether the apiservers encode a resource in the expected version yet.
//! - [`apiservers`]: how many apiservers there are, and whether discovery samples reach each.
//! - [`conversion`]: whether a CRD's conversion webhook answers, before the first write.

pub mod apiservers;
pub mod conversion;
pub mod encoding;
