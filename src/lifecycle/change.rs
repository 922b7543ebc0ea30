//! A [`Change`] to what a run targets that voids (or leaves unproven) its writes so far: what
//! happened, the Failed condition's reason should the migration end on it ([`Change::reason`]),
//! what the migration does about it ([`Change::then`], a [`Then`]) and the sentence that tells
//! an operator (its `Display`).

use std::fmt;

use crate::api::conditions::reasons;

/// What happened to the target of a run (or to the cluster it writes to) that voids, or leaves
/// unproven, its writes so far. `resource` is the resource as kubectl names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The CRD's storage version switched from `from` to `to` (empty: none);
    /// `generation` is the CRD's when it was seen change by change.
    StorageSwitched {
        /// The resource, as kubectl names it.
        resource: String,
        /// The version (or hash) before.
        from: String,
        /// The version (or hash) now.
        to: String,
        /// The CRD's generation at the switch, when followed change by change.
        generation: Option<i64>,
    },
    /// The CRD's spec changed (its generation moved from `from` to `to`) and how it changed
    /// could not be seen: its storage version may have been switched and switched back.
    Edited {
        /// The resource, as kubectl names it.
        resource: String,
        /// The generation last seen.
        from: i64,
        /// The generation now.
        to: i64,
        /// Why the changes between could not be seen.
        unseen: Unseen,
    },
    /// A discovery sample taken while the run wrote published the hash `seen` instead of
    /// `target`: an apiserver encodes the resource in another version.
    OtherHash {
        /// The resource, as kubectl names it.
        resource: String,
        /// The hash the run targets.
        target: String,
        /// What was published instead.
        seen: String,
    },
    /// At the end of the run discovery publishes the hash `to` instead of `from`.
    HashMoved {
        /// The resource, as kubectl names it.
        resource: String,
        /// The version (or hash) before.
        from: String,
        /// The version (or hash) now.
        to: String,
    },
    /// Versions whose `managedFields` entries the run cleans are served again.
    ServedAgain {
        /// The resource, as kubectl names it.
        resource: String,
        /// The versions served again.
        versions: Vec<String>,
    },
    /// The CRD was deleted.
    Deleted {
        /// The resource, as kubectl names it.
        resource: String,
    },
    /// The CRD was deleted and created again (another uid).
    Replaced {
        /// The resource, as kubectl names it.
        resource: String,
    },
    /// The resource is no longer served, as discovery says (`why`).
    NotServed {
        /// The resource, as kubectl names it.
        resource: String,
        /// What failed, or what was seen.
        why: String,
    },
    /// Discovery could not be read to confirm the resource was still served at the end.
    DiscoveryUnreadable {
        /// The resource, as kubectl names it.
        resource: String,
        /// What failed, or what was seen.
        why: String,
    },
    /// The CRD could not be read at the end.
    CrdUnreadable {
        /// The resource, as kubectl names it.
        resource: String,
        /// What failed, or what was seen.
        why: String,
    },
    /// The kube-apiserver processes the run started with are not the ones that answer now.
    ApiserversRestarted {
        /// What failed, or what was seen.
        why: String,
    },
    /// etcd no longer holds the revision of the last check (410 Gone).
    RevisionGone {
        /// The revision of the last check.
        revision: String,
    },
    /// etcd has not reached the revision of the last check.
    RevisionAhead {
        /// The revision of the last check.
        revision: String,
    },
    /// At the end of the run the apiservers did not all publish the target's hash.
    ApiserversDisagree {
        /// The resource, as kubectl names it.
        resource: String,
        /// The hash the run targeted.
        hash: String,
        /// What was published instead.
        seen: String,
    },
    /// Whether etcd still holds the run's writes could not be read at its end.
    WritesUnread {
        /// What failed, or what was seen.
        why: String,
    },
    /// Whether etcd still holds the run's writes cannot be shown (`gap`).
    WritesUnshown {
        /// Why the revisions seen do not reach back to the start of the run.
        gap: String,
    },
}

/// Why the changes to a CRD between two of its states could not all be seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unseen {
    /// The CRD was read now and then, not followed change by change.
    Polled,
    /// The watch's history expired.
    Expired,
    /// They were not all seen within the request timeout (in seconds).
    TimedOut(u64),
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
    /// The Failed condition's reason, should the migration end on it.
    pub fn reason(&self) -> &'static str {
        match self {
            Change::StorageSwitched { .. }
            | Change::Edited { .. }
            | Change::OtherHash { .. }
            | Change::HashMoved { .. }
            | Change::ApiserversDisagree { .. }
            | Change::WritesUnread { .. }
            | Change::WritesUnshown { .. } => reasons::STORAGE_VERSION_CHANGED,
            Change::ServedAgain { .. } => reasons::VERSION_SERVED_AGAIN,
            Change::Deleted { .. } | Change::Replaced { .. } | Change::NotServed { .. } => {
                reasons::RESOURCE_NOT_SERVED
            }
            Change::DiscoveryUnreadable { .. } | Change::CrdUnreadable { .. } => {
                reasons::DISCOVERY_FAILED
            }
            Change::ApiserversRestarted { .. }
            | Change::RevisionGone { .. }
            | Change::RevisionAhead { .. } => reasons::CLUSTER_CHANGED,
        }
    }

    /// What the migration does about it.
    pub fn then(&self) -> Then {
        match self {
            Change::StorageSwitched { .. }
            | Change::Edited { .. }
            | Change::OtherHash { .. }
            | Change::HashMoved { .. }
            | Change::ServedAgain { .. } => Then::StartOver,
            Change::ApiserversRestarted { .. }
            | Change::RevisionGone { .. }
            | Change::RevisionAhead { .. } => Then::Redo,
            Change::Deleted { .. }
            | Change::Replaced { .. }
            | Change::NotServed { .. }
            | Change::DiscoveryUnreadable { .. }
            | Change::CrdUnreadable { .. } => Then::Fail,
            Change::ApiserversDisagree { .. }
            | Change::WritesUnread { .. }
            | Change::WritesUnshown { .. } => Then::Unproven,
        }
    }

    /// Whether the migration can start over from the first object with the new target (its
    /// storage version changed, or the cluster under it), rather than end.
    pub fn starts_over(&self) -> bool {
        matches!(self.then(), Then::StartOver | Then::Redo)
    }
}

impl fmt::Display for Change {
    /// What changed, in words: the Failed condition's message or the note of the Event that
    /// tells of it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::StorageSwitched { resource, from, to, generation } => {
                let to = if to.is_empty() { "none" } else { to };
                write!(f, "the storage version of {resource} changed from {from} to {to}")?;
                match generation {
                    Some(generation) => write!(f, " (generation {generation})"),
                    None => Ok(()),
                }
            }
            Change::Edited { resource, from, to, unseen: Unseen::Polled } => write!(
                f,
                "the CRD of {resource} changed (generation {from} then {to}): its storage version may have been switched and switched back"
            ),
            Change::Edited { resource, from, to, unseen: Unseen::Expired } => write!(
                f,
                "the CRD of {resource} changed while its changes could not all be seen (generation {from} then {to}): its storage version may have been switched and switched back"
            ),
            Change::Edited { resource, from, to, unseen: Unseen::TimedOut(seconds) } => write!(
                f,
                "the CRD of {resource} changed (generation {from} then {to}) and its changes could not all be seen within {seconds} s"
            ),
            Change::OtherHash { resource, target, seen } => write!(
                f,
                "discovery published storage version hash {seen} for {resource} while the run wrote in {target}: an apiserver encodes it in another version, so objects written through it may be stored there"
            ),
            Change::HashMoved { resource, from, to } => write!(
                f,
                "the storage version hash of {resource} changed from {from} to {to} while the migration ran"
            ),
            Change::ServedAgain { resource, versions } => write!(
                f,
                "{versions:?} of {resource} served again: the run starts over, keeping their managedFields entries"
            ),
            Change::Deleted { resource } => {
                write!(f, "the CRD of {resource} was deleted while the migration ran")
            }
            Change::Replaced { resource } => write!(
                f,
                "the CRD of {resource} was deleted and created again while the migration ran"
            ),
            Change::NotServed { resource, why } => {
                write!(f, "{resource} stopped being served while the migration ran: {why}")
            }
            Change::DiscoveryUnreadable { resource, why } => {
                write!(f, "could not confirm that {resource} was still served at the end: {why}")
            }
            Change::CrdUnreadable { resource, why } => {
                write!(f, "could not read the CRD of {resource} at the end: {why}")
            }
            Change::ApiserversRestarted { why } => write!(
                f,
                "the apiservers restarted while the run wrote ({why}): a restart can bring another encryption key, and follows an etcd restore"
            ),
            Change::RevisionGone { revision } => write!(
                f,
                "etcd no longer holds revision {revision}, read seconds before (410 Gone): it was restored from a backup, or compacted to its latest revision"
            ),
            Change::RevisionAhead { revision } => write!(
                f,
                "etcd has not reached revision {revision}, read seconds before: it was restored from a backup"
            ),
            Change::ApiserversDisagree { resource, hash, seen } => write!(
                f,
                "at the end of the run the apiservers did not all publish {hash} for {resource}: {seen}"
            ),
            Change::WritesUnread { why } => write!(
                f,
                "whether etcd still holds this run's writes could not be read at its end: {why}"
            ),
            Change::WritesUnshown { gap } => {
                write!(f, "whether etcd still holds this run's writes cannot be shown: {gap}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widgets() -> String {
        "widgets.example.com".to_owned()
    }

    #[test]
    fn a_deleted_or_replaced_crd_fails_the_migration() {
        for change in
            [Change::Deleted { resource: widgets() }, Change::Replaced { resource: widgets() }]
        {
            assert_eq!(
                (change.reason(), change.then()),
                (reasons::RESOURCE_NOT_SERVED, Then::Fail)
            );
            assert!(!change.starts_over());
        }
        assert_eq!(
            Change::Deleted { resource: widgets() }.to_string(),
            "the CRD of widgets.example.com was deleted while the migration ran"
        );
    }

    #[test]
    fn a_switch_starts_over_and_says_to_what() {
        let switched = Change::StorageSwitched {
            resource: widgets(),
            from: "v2".into(),
            to: String::new(),
            generation: Some(5),
        };
        assert_eq!(switched.then(), Then::StartOver);
        assert_eq!(switched.reason(), reasons::STORAGE_VERSION_CHANGED);
        assert_eq!(
            switched.to_string(),
            "the storage version of widgets.example.com changed from v2 to none (generation 5)"
        );
    }

    #[test]
    fn a_changed_cluster_is_done_again_and_disagreement_proves_nothing() {
        let restarted = Change::ApiserversRestarted { why: "a new process".into() };
        assert_eq!((restarted.reason(), restarted.then()), (reasons::CLUSTER_CHANGED, Then::Redo));
        assert!(restarted.starts_over());
        let mixed = Change::ApiserversDisagree {
            resource: widgets(),
            hash: "A".into(),
            seen: "B from 1 of 2".into(),
        };
        assert_eq!(
            (mixed.reason(), mixed.then()),
            (reasons::STORAGE_VERSION_CHANGED, Then::Unproven)
        );
        assert!(!mixed.starts_over());
    }
}
