//! The verdict on the apiservers' encoding of a resource: what [`crate::evidence::encoding`]
//! establishes before a migration writes, and what [`super::stored_versions::decide`] requires
//! before a prune.

/// What was established about the apiservers' encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Confirmed; says by what.
    Confirmed {
        /// What confirmed it: the StorageVersion API or discovery's samples, and when.
        by: String,
    },
    /// Not confirmed; the message says what was seen.
    Unconfirmed(String),
}
