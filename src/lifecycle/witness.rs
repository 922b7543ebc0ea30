//! Whether the cluster a run writes to is still the one it started writing to.
//!
//! Two things undo a run's writes without touching the target it follows:
//!
//! - an etcd restore: the objects written after the snapshot are back as they were, in the old
//!   version. The documented procedure (`etcdutl snapshot restore --bump-revision
//!   --mark-compacted`) makes every revision before the restore unreadable, and restarts the
//!   apiservers; one without `--bump-revision` takes etcd's revision back;
//! - an apiserver restarted with another encryption key (or another storage version): the
//!   objects written before the restart are under the old one.
//!
//! So a run keeps a [`Witness`]: the kube-apiserver processes its target recorded, and the
//! latest etcd revision it saw the cluster at. Checked every [`CHECK_EVERY`] while it writes and
//! at the end, the witness holds only while the same processes answer and that revision can
//! still be read (each check moves it to the revision of the check, so it is seconds old): a
//! restored etcd fails the read (410 Gone, or a revision it has not reached), and so does a
//! compaction of etcd to its latest revision by hand, which is taken for a restore. The
//! apiserver's own compaction trails by at least five minutes, so it never makes a revision of
//! the last check unreadable, unless the checks themselves could not reach the apiserver for that
//! long: then too the run is done again, as nothing else can show its writes are still there.

use std::time::Duration;

use kube::api::{ListParams, VersionMatch};

use crate::apiserver::requests::{RequestError, Requests};
use crate::engine::Resource;

use super::change::Change;
use super::resume;

/// How often a writing run checks its witness. Writes made between a restore and the check that
/// sees it are wasted (the run is done again), so this bounds waste, not safety.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);

/// Tries, a second apart, to read the witness at the end of a run before the run is taken as
/// unproven.
const END_ATTEMPTS: u32 = 5;

/// What a run holds the cluster to.
#[derive(Clone, Debug)]
pub struct Witness {
    /// The kube-apiserver processes the target recorded; `None` when they could not be read
    /// then (the check of processes is skipped, the check of revisions is not).
    apiservers: Option<Vec<String>>,
    /// The latest etcd revision the run saw the cluster at; `None` until one could be read.
    revision: Option<String>,
    /// Why the revisions seen do not reach back to the start of the run, when they do not.
    gap: Option<String>,
}

/// What a check of the witness found.
#[derive(Debug)]
pub enum Seen {
    /// The same apiservers answer, and etcd still holds the revision of the last check.
    Holds,
    /// The cluster is not the one the run wrote to: its writes so far may be undone.
    Changed(Change),
    /// The apiserver could not be asked; the next check asks again.
    Unreadable(String),
}

impl Witness {
    /// The witness of a run that starts writing now, under a target that recorded `apiservers`:
    /// the latest revision, read now. A change already, when other processes answer now.
    pub async fn start(
        requests: &Requests,
        resource: &Resource,
        apiservers: Option<Vec<String>>,
    ) -> Result<Witness, Change> {
        let mut witness = Witness { apiservers, revision: None, gap: None };
        if let Err(Seen::Changed(change)) = witness.same_apiservers(requests).await {
            return Err(change);
        }
        match latest_revision(requests, resource).await {
            Ok(revision) => witness.revision = Some(revision),
            Err(why) => {
                witness.gap = Some(format!("the revision at its start could not be read: {why}"))
            }
        }
        Ok(witness)
    }

    /// Checks the witness, and moves its revision to now when it holds.
    pub async fn check(&mut self, requests: &Requests, resource: &Resource) -> Seen {
        if let Err(seen) = self.same_apiservers(requests).await {
            return seen;
        }
        if let Some(revision) = &self.revision
            && let Err(seen) = readable(requests, resource, revision).await
        {
            return seen;
        }
        match latest_revision(requests, resource).await {
            Ok(revision) => {
                self.revision = Some(revision);
                Seen::Holds
            }
            Err(why) => Seen::Unreadable(why),
        }
    }

    /// Resolves once a check every [`CHECK_EVERY`] finds the cluster changed. Checks that cannot
    /// reach the apiserver are asked again at the next.
    pub async fn changes(&mut self, requests: &Requests, resource: &Resource) -> Change {
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            if let Seen::Changed(change) = self.check(requests, resource).await {
                return change;
            }
        }
    }

    /// The check at the end of a run: a change, or, when the apiserver cannot be asked in
    /// [`END_ATTEMPTS`] tries, the run proves nothing.
    pub async fn at_end(&mut self, requests: &Requests, resource: &Resource) -> Option<Change> {
        let mut why = String::new();
        for attempt in 0..END_ATTEMPTS {
            why.clear();
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            match self.check(requests, resource).await {
                Seen::Holds => break,
                Seen::Changed(change) => return Some(change),
                Seen::Unreadable(error) => why = error,
            }
        }
        if !why.is_empty() {
            return Some(Change::WritesUnread { why });
        }
        let gap = self.gap.as_ref()?;
        Some(Change::WritesUnshown { gap: gap.clone() })
    }

    async fn same_apiservers(&self, requests: &Requests) -> Result<(), Seen> {
        let Some(then) = &self.apiservers else { return Ok(()) };
        let now = resume::apiserver_processes(requests).await.map_err(Seen::Unreadable)?;
        match resume::restarted(then, &now) {
            None => Ok(()),
            Some(why) => Err(Seen::Changed(Change::ApiserversRestarted { why })),
        }
    }
}

/// The latest etcd revision, as the apiserver answers a list of one object of `resource`.
async fn latest_revision(requests: &Requests, resource: &Resource) -> Result<String, String> {
    let params = ListParams::default().limit(1);
    let list = list_one(requests, resource, &params).await.map_err(|e| crate::error_chain(&e))?;
    revision_of(&list).ok_or_else(|| "the list answered no resourceVersion".to_owned())
}

/// Whether etcd still holds `revision`: a list of one object at exactly that revision.
async fn readable(requests: &Requests, resource: &Resource, revision: &str) -> Result<(), Seen> {
    let params = ListParams::default().limit(1).at(revision).matching(VersionMatch::Exact);
    match list_one(requests, resource, &params).await {
        Ok(_) => Ok(()),
        Err(RequestError::Api(kube::Error::Api(status))) if status.code == 410 => {
            Err(Seen::Changed(Change::RevisionGone { revision: revision.to_owned() }))
        }
        Err(RequestError::Api(kube::Error::Api(status)))
            if status.details.as_ref().is_some_and(|details| {
                details.causes.iter().any(|cause| cause.reason == "ResourceVersionTooLarge")
            }) =>
        {
            Err(Seen::Changed(Change::RevisionAhead { revision: revision.to_owned() }))
        }
        Err(error) => Err(Seen::Unreadable(crate::error_chain(&error))),
    }
}

async fn list_one(
    requests: &Requests,
    resource: &Resource,
    params: &ListParams,
) -> Result<serde_json::Value, RequestError> {
    let request = kube::core::Request::new(resource.collection_path())
        .list_metadata(params)
        .map_err(|error| RequestError::Api(kube::Error::BuildRequest(error)))?;
    let text = requests.send(requests.client().request_text(request)).await?;
    serde_json::from_str(&text).map_err(|error| RequestError::Api(kube::Error::SerdeError(error)))
}

fn revision_of(list: &serde_json::Value) -> Option<String> {
    let revision = list.pointer("/metadata/resourceVersion")?.as_str()?;
    (!revision.is_empty()).then(|| revision.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_names_its_revision() {
        let list = serde_json::json!({ "metadata": { "resourceVersion": "812" }, "items": [] });
        assert_eq!(revision_of(&list).as_deref(), Some("812"));
        assert_eq!(revision_of(&serde_json::json!({ "metadata": {} })), None);
        let empty = serde_json::json!({ "metadata": { "resourceVersion": "" } });
        assert_eq!(revision_of(&empty), None);
    }
}
