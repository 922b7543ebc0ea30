//! What a run reports: where it stands, how it ended, and why it could not go on.

use super::{KeepFailing, NoReply, Pacing};
use crate::api::FailedObject;

/// Where a migration stands. Published after every page; exact at page boundaries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Objects returned by list requests.
    pub listed: u64,
    /// Written back to etcd, re-encoded.
    pub rewritten: u64,
    /// Written back to etcd, re-encoded, with the `managedFields` entries naming versions no
    /// longer served removed (only when the job cleans them).
    pub cleaned: u64,
    /// Already stored in the current encoding: the apiserver skipped the write.
    pub already_current: u64,
    /// Written by someone else (409) or deleted (404) since listed: nothing left to do.
    pub skipped: u64,
    /// Could not be migrated after every attempt.
    pub failed: u64,
    /// The apiserver's estimate of objects not yet listed.
    pub remaining: Option<u64>,
    /// The page to resume from; `None` once every page has been read (or before the first).
    pub continue_token: Option<String>,
    /// Pages fully written.
    pub pages: u64,
    /// Requests sent, lists and writes, retries included.
    pub requests: u64,
    /// Requests the apiserver throttled (429).
    pub throttled: u64,
    /// Continue tokens that expired (etcd compacted past them); the list went on from the
    /// latest revision.
    pub expired_tokens: u64,
    /// Times the run paused because the apiserver was not ready.
    pub outages: u64,
    /// The run's pace and write window when the last page was done; `None` until the engine
    /// has reported (a run not yet started, or progress read back from a checkpoint).
    pub pacing: Option<Pacing>,
    /// The first failures, at most [`Settings::failures_kept`](super::Settings::failures_kept).
    pub failures: Vec<FailedObject>,
}

impl Progress {
    /// Objects handled, whatever the outcome.
    pub fn processed(&self) -> u64 {
        self.rewritten + self.cleaned + self.already_current + self.skipped + self.failed
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finished {
    /// Every page was read and every object handled (some may have failed).
    Completed(Progress),
    /// Stopped by the cancellation token, or because the fence closed; progress is that of the
    /// last whole page.
    Cancelled(Progress),
}

/// Why a run could not go on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A list request for the resource could not be built.
    #[error("failed to build a request for {0}: {1}")]
    BuildRequest(String, String),
    /// The apiserver refused a list request, for good or after every attempt.
    #[error("failed to list {resource}: HTTP {code} {reason}: {message}")]
    List {
        /// The resource being listed.
        resource: String,
        /// The HTTP status code.
        code: u16,
        /// The `Status` reason, such as `Forbidden`.
        reason: String,
        /// The `Status` message.
        message: String,
    },
    /// List requests got no answer, attempt after attempt.
    #[error("failed to list {0}: no response")]
    ListTransport(String, #[source] NoReply),
    /// Continue tokens kept expiring (410), or one expired with no token offered to go on from.
    #[error("failed to list {0}: continue tokens kept expiring, or the apiserver offered no other")]
    ListExpired(String),
    /// The apiserver sent a continue token a second time: the list would go round forever.
    #[error(
        "failed to list {0}: the apiserver handed out a continue token it had handed out before, so the list would never end"
    )]
    ListLoops(String),
    /// Writes kept failing with none succeeding, so the run stopped early.
    #[error(
        "writes to {resource} keep failing: {} attempts at {} objects failed and none succeeded for {} s; the last failure: {}",
        .failing.attempts, .failing.objects, .failing.for_seconds, describe(&.failing.last)
    )]
    WritesFailing {
        /// The resource being migrated.
        resource: String,
        /// How long and how many writes failed, and the last failure.
        failing: Box<KeepFailing>,
    },
    /// A page of the list could not be decoded.
    #[error("failed to decode the list of {0}")]
    Decode(String, #[source] serde_json::Error),
    /// The resource stopped being served (404) while the run went on.
    #[error(
        "{resource} is no longer served at {api_version} (HTTP 404: {message}); its version or CRD was removed"
    )]
    NotServed {
        /// The resource being migrated.
        resource: String,
        /// The `group/version` requests went to.
        api_version: String,
        /// The `Status` message of the 404.
        message: String,
    },
    /// The apiserver was down longer than `outage_timeout` allows.
    #[error("the apiserver was not ready for {waited_seconds} s in all while migrating {resource}")]
    ApiserverUnavailable {
        /// The resource being migrated.
        resource: String,
        /// Seconds the run waited for the apiserver, in all.
        waited_seconds: u64,
    },
    /// The leader's term ended; not an error of the migration.
    #[error("this process may no longer write: its leadership ended")]
    Fenced,
}

/// One failure in words: `namespace/name: code reason: message`.
pub fn describe(failure: &FailedObject) -> String {
    let FailedObject { namespace, name, code, reason, message } = failure;
    match namespace.as_str() {
        "" => format!("{name}: {code} {reason}: {message}"),
        namespace => format!("{namespace}/{name}: {code} {reason}: {message}"),
    }
}
