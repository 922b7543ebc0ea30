//! Writing one migration's status without ever clobbering a newer one.
//!
//! Every write is conditional on the resourceVersion this task last saw, checks the leader's
//! term first and gets no more time than the term has left. On a conflict the object is read
//! again: if it was deleted, replaced, or finished by someone else, this task stops; if only its
//! metadata or spec changed, the write is sent again on the new resourceVersion. A deposed
//! leader therefore writes nothing, and a late write can never turn a finished migration back to
//! Running.

use std::time::Duration;

use kube::api::PostParams;
use kube::{Api, ResourceExt};
use tokio::time::Instant;
use tracing::warn;

use crate::api::{
    Phase, StorageVersionMigration, StorageVersionMigrationSpec, StorageVersionMigrationStatus,
};
use crate::apiserver::answers;
use crate::apiserver::requests::{RequestError, Requests};

/// Conflicts resolved in a row before a write gives up.
const CONFLICT_RETRIES: u32 = 5;

/// First wait after a write that failed for another reason; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// Longest wait between two attempts of a write.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("this process may no longer write: its leadership ended")]
    Fenced,
    #[error("migration {0} was deleted or replaced")]
    Gone(String),
    #[error("migration {0} was finished by another writer")]
    Superseded(String),
    /// The migration is older than this writer last saw it: etcd was restored from a backup,
    /// and what the run wrote may be undone. Nothing is written over it: the run ends for now,
    /// and the migration is taken up again later from what it holds, whose checkpoint from
    /// before the restore is not resumed ([`crate::lifecycle::resume`]).
    #[error("migration {0} went back to an earlier state than this process wrote (etcd restored?)")]
    WentBack(String),
    #[error("migration {0} kept changing under the status write")]
    Conflicts(String),
    #[error("no answer within {1:?} writing the status of migration {0}")]
    TimedOut(String, Duration),
    #[error("failed to write the status of migration {0}")]
    Write(String, #[source] kube::Error),
    /// The apiserver answered without fields it was sent: the schema it serves the migrations
    /// under drops them (kube-storage-version-migrator's CRDs, or kube-svm's own not yet served
    /// after they were replaced in place).
    #[error(
        "the status of migration {0} was stored without {1:?}: the apiserver's schema drops them"
    )]
    Dropped(String, Vec<String>),
}

impl Error {
    /// Whether trying again later may succeed.
    fn is_transient(&self) -> bool {
        match self {
            Error::TimedOut(..) | Error::Conflicts(_) | Error::Dropped(..) => true,
            Error::Write(_, error) => crate::apiserver::answers::is_transient(error),
            Error::Fenced | Error::Gone(_) | Error::Superseded(_) | Error::WentBack(_) => false,
        }
    }

    /// Whether this task must stop touching the migration.
    pub fn ends_the_task(&self) -> bool {
        matches!(self, Error::Fenced | Error::Gone(_) | Error::Superseded(_))
    }
}

/// Writes the status of one migration object, as this task last saw it.
pub struct StatusWriter {
    api: Api<StorageVersionMigration>,
    name: String,
    spec: StorageVersionMigrationSpec,
    uid: Option<String>,
    resource_version: Option<String>,
    /// The way to the apiserver, inside the leader's term.
    requests: Requests,
}

impl StatusWriter {
    pub fn new(
        api: Api<StorageVersionMigration>,
        migration: &StorageVersionMigration,
        requests: Requests,
    ) -> StatusWriter {
        StatusWriter {
            api,
            name: migration.name_any(),
            spec: migration.spec.clone(),
            uid: migration.uid(),
            resource_version: migration.resource_version(),
            requests,
        }
    }

    /// Writes `status`, retrying transient failures with backoff for up to `patience`.
    pub async fn write_within(
        &mut self,
        status: &StorageVersionMigrationStatus,
        patience: Duration,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + patience;
        let mut failures = 0;
        loop {
            failures += 1;
            let backoff = crate::rules::backoff::doubling(failures, FIRST_BACKOFF, MAX_BACKOFF);
            match self.write(status).await {
                Err(error) if error.is_transient() && Instant::now() + backoff < deadline => {
                    warn!(
                        migration = self.name,
                        error = %crate::error_chain(&error),
                        "status write failed; trying again"
                    );
                    tokio::time::sleep(backoff).await;
                }
                result => return result,
            }
        }
    }

    /// Writes `status` once, resolving conflicts as the module says. The whole status is
    /// replaced (a merge patch would keep fields the new status leaves out, such as a continue
    /// token from an earlier run), on the resourceVersion last seen.
    pub async fn write(&mut self, status: &StorageVersionMigrationStatus) -> Result<(), Error> {
        for _ in 0..CONFLICT_RETRIES {
            let mut object = StorageVersionMigration::new(&self.name, self.spec.clone());
            object.metadata.resource_version = self.resource_version.clone();
            object.status = Some(status.clone());
            let params = PostParams::default();
            let sent = self.api.replace_status(&self.name, &params, &object);
            match self.requests.send(sent).await {
                Ok(written) => {
                    self.resource_version = written.resource_version();
                    // Believed only once the answer holds every field sent.
                    let dropped = dropped(status, written.status.as_ref());
                    if !dropped.is_empty() {
                        return Err(Error::Dropped(self.name.clone(), dropped));
                    }
                    return Ok(());
                }
                Err(RequestError::Api(error)) if answers::is_conflict(&error) => {
                    if self.reread(status).await? {
                        return Ok(());
                    }
                }
                Err(RequestError::Api(error)) if answers::is_not_found(&error) => {
                    return Err(Error::Gone(self.name.clone()));
                }
                Err(error) => return Err(self.failed(error)),
            }
        }
        Err(Error::Conflicts(self.name.clone()))
    }

    /// The error a request of this writer that failed ends in.
    fn failed(&self, error: RequestError) -> Error {
        match error {
            RequestError::Fenced => Error::Fenced,
            RequestError::TimedOut(limit) => Error::TimedOut(self.name.clone(), limit),
            RequestError::Api(error) => Error::Write(self.name.clone(), error),
        }
    }

    /// After a conflict: reads the migration again and takes its resourceVersion. `Ok(true)`
    /// when it already holds `status` (an earlier write of ours landed after all).
    async fn reread(&mut self, status: &StorageVersionMigrationStatus) -> Result<bool, Error> {
        let current = match self.requests.send(self.api.get_opt(&self.name)).await {
            Ok(current) => current,
            Err(error) => return Err(self.failed(error)),
        };
        let Some(current) = current.filter(|c| c.uid() == self.uid) else {
            return Err(Error::Gone(self.name.clone()));
        };
        if current.metadata.deletion_timestamp.is_some() {
            return Err(Error::Gone(self.name.clone()));
        }
        if same(current.status.as_ref(), status) {
            self.resource_version = current.resource_version();
            return Ok(true);
        }
        if Phase::of(&current).is_terminal() {
            return Err(Error::Superseded(self.name.clone()));
        }
        if went_back(self.resource_version.as_deref(), current.resource_version().as_deref()) {
            return Err(Error::WentBack(self.name.clone()));
        }
        self.resource_version = current.resource_version();
        Ok(false)
    }
}

/// Whether a migration read at resourceVersion `now` is older than the one last written at
/// `written`: both are etcd revisions, and an object's only grows while etcd's history holds.
/// Pure.
fn went_back(written: Option<&str>, now: Option<&str>) -> bool {
    let revision = |rv: Option<&str>| rv.and_then(|rv| rv.parse::<u64>().ok());
    matches!((revision(written), revision(now)), (Some(written), Some(now)) if now < written)
}

/// The fields of `sent` (as paths, `target.storageVersion`) that `answer` lacks. Pure.
fn dropped(
    sent: &StorageVersionMigrationStatus,
    answer: Option<&StorageVersionMigrationStatus>,
) -> Vec<String> {
    fn missing(
        sent: &serde_json::Value,
        answer: &serde_json::Value,
        at: &str,
        out: &mut Vec<String>,
    ) {
        let (Some(sent), Some(answer)) = (sent.as_object(), answer.as_object()) else { return };
        for (key, value) in sent {
            let path = if at.is_empty() { key.clone() } else { format!("{at}.{key}") };
            match answer.get(key) {
                None => out.push(path),
                Some(kept) => missing(value, kept, &path, out),
            }
        }
    }
    let as_json = |status: &StorageVersionMigrationStatus| {
        serde_json::to_value(status).unwrap_or(serde_json::Value::Null)
    };
    let answer = answer.map_or_else(|| serde_json::json!({}), as_json);
    let mut out = Vec::new();
    missing(&as_json(sent), &answer, "", &mut out);
    out
}

/// Whether the status the apiserver holds is `written`, as the apiserver stores it (times to
/// the second).
fn same(
    stored: Option<&StorageVersionMigrationStatus>,
    written: &StorageVersionMigrationStatus,
) -> bool {
    let as_stored = serde_json::to_value(written)
        .and_then(serde_json::from_value::<StorageVersionMigrationStatus>)
        .and_then(serde_json::to_value);
    match (stored.map(serde_json::to_value), as_stored) {
        (Some(Ok(stored)), Ok(written)) => stored == written,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_older_revision_went_back() {
        assert!(went_back(Some("900"), Some("120")));
        assert!(!went_back(Some("900"), Some("900")));
        assert!(!went_back(Some("900"), Some("1200")));
        assert!(!went_back(None, Some("120")));
        assert!(!went_back(Some("900"), Some("opaque")));
    }

    #[test]
    fn an_answer_without_fields_sent_names_them() {
        use crate::api::MigrationTarget;
        let sent = StorageVersionMigrationStatus {
            listed_from_start: Some(true),
            target: Some(MigrationTarget {
                storage_version: Some("v2".into()),
                crd_generation: Some(3),
                ..MigrationTarget::default()
            }),
            ..StorageVersionMigrationStatus::default()
        };
        assert!(dropped(&sent, Some(&sent)).is_empty());
        // As an older schema stores it: the target's generation and the listing pruned.
        let pruned = StorageVersionMigrationStatus {
            target: Some(MigrationTarget {
                storage_version: Some("v2".into()),
                ..MigrationTarget::default()
            }),
            ..StorageVersionMigrationStatus::default()
        };
        assert_eq!(dropped(&sent, Some(&pruned)), ["listedFromStart", "target.crdGeneration"]);
        assert_eq!(dropped(&sent, None), ["listedFromStart", "target"]);
    }

    #[test]
    fn a_status_read_back_is_recognised_though_stored_to_the_second() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        use k8s_openapi::jiff::Timestamp;
        let written = StorageVersionMigrationStatus {
            start_time: Some(Time(Timestamp::new(1_800_000_000, 123_456_789).expect("valid"))),
            ..StorageVersionMigrationStatus::default()
        };
        let stored = StorageVersionMigrationStatus {
            start_time: Some(Time(Timestamp::from_second(1_800_000_000).expect("valid"))),
            ..StorageVersionMigrationStatus::default()
        };
        assert!(same(Some(&stored), &written));
        let later = StorageVersionMigrationStatus {
            start_time: Some(Time(Timestamp::from_second(1_800_000_001).expect("valid"))),
            ..StorageVersionMigrationStatus::default()
        };
        assert!(!same(Some(&later), &written));
        assert!(!same(None, &written));
    }

    #[test]
    fn only_some_failures_are_worth_another_try() {
        let api = |code| {
            Error::Write(
                "m".into(),
                kube::Error::Api(kube::core::Status::failure("x", "y").with_code(code).boxed()),
            )
        };
        assert!(api(503).is_transient() && api(429).is_transient());
        assert!(!api(422).is_transient() && !api(403).is_transient());
        assert!(Error::TimedOut("m".into(), Duration::from_secs(1)).is_transient());
        for final_ in [Error::Fenced, Error::Gone("m".into()), Error::Superseded("m".into())] {
            assert!(!final_.is_transient() && final_.ends_the_task(), "{final_}");
        }
        // A restored migration is neither written over at once nor dropped: taken up later.
        let went_back = Error::WentBack("m".into());
        assert!(!went_back.is_transient() && !went_back.ends_the_task());
    }
}
