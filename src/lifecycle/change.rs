//! A [`Change`] to the resource that voids (or leaves unproven) a run's writes so far, and what
//! the migration does about it ([`Then`]).

use crate::api::conditions::reasons;

/// A change to the resource that voids (or leaves unproven) a run's writes so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The Failed condition's reason, should the migration end on it.
    pub reason: &'static str,
    /// What changed, in words: the Failed condition's message or the note of the Event that
    /// tells of it.
    pub message: String,
    /// What the migration does about it.
    pub then: Then,
}

/// What a migration does about a [`Change`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// Start over from the first object with the new target: the storage version changed.
    StartOver,
    /// Start over from the first object: the cluster the run wrote to was restored or
    /// restarted, so its writes so far may be undone. Not a change of the target, and counted
    /// apart from those ([`super::status::MAX_REDOS`]).
    Redo,
    /// End Failed: the resource or its CRD is gone, or could not be read.
    Fail,
    /// End as the run did, but prove nothing: the apiservers disagree on the encoding (a
    /// rolling upgrade), so `status.target.encodingConfirmed` becomes false.
    Unproven,
}

impl Change {
    /// The storage version (or the hash discovery publishes) moved: start over.
    pub(super) fn storage_moved(message: String) -> Change {
        Change { reason: reasons::STORAGE_VERSION_CHANGED, message, then: Then::StartOver }
    }

    /// A version the run cleaned `managedFields` of is served again: start over.
    pub(super) fn served_again(message: String) -> Change {
        Change { reason: reasons::VERSION_SERVED_AGAIN, message, then: Then::StartOver }
    }

    /// etcd was restored, or the apiservers restarted, while the run wrote: do it again.
    pub(super) fn cluster_changed(message: String) -> Change {
        Change { reason: reasons::CLUSTER_CHANGED, message, then: Then::Redo }
    }

    /// The resource or its CRD is gone: fail.
    pub(super) fn not_served(message: String) -> Change {
        Change { reason: reasons::RESOURCE_NOT_SERVED, message, then: Then::Fail }
    }

    /// Discovery could not be read to tell: fail, as nothing can be proved.
    pub(super) fn unreadable(message: String) -> Change {
        Change { reason: reasons::DISCOVERY_FAILED, message, then: Then::Fail }
    }

    /// The apiservers disagree on the encoding at the end: the run proves nothing.
    pub(super) fn unproven(message: String) -> Change {
        Change { reason: reasons::STORAGE_VERSION_CHANGED, message, then: Then::Unproven }
    }

    /// Whether the migration can start over from the first object with the new target (its
    /// storage version changed), rather than end (the resource or its CRD is gone).
    pub fn starts_over(&self) -> bool {
        matches!(self.then, Then::StartOver | Then::Redo)
    }
}
