//! Talking to the apiserver: reading its answers by status code, the leader's term every write
//! checks, saying an outage once, and the in-tree migrator's migrations.
//!
//! - [`answers`]: what a `kube::Error` says, by status code, in one place.
//! - [`requests`]: the clients, the leader's term and the request timeout, together; every
//!   request is bounded by both.
//! - [`fence`]: whether this process may still write, and for how long.
//! - [`own_writes`]: the writes of the request client, counted, so the gentle pace does not take
//!   them for another client's.
//! - [`reachability`]: saying once that the apiserver is unreachable, and once that it is back.
//! - [`in_tree`]: the in-tree migrator's `storagemigration.k8s.io/v1` migrations, to coexist.
//! - `fake` (tests only): a `kube::Client` whose requests a test answers and records, for unit
//!   tests of orchestration without a control plane.

pub mod answers;
#[cfg(test)]
pub mod fake;
pub mod fence;
pub mod in_tree;
pub mod own_writes;
pub mod reachability;
pub mod requests;
