//! Writing one migration's status without ever clobbering a newer one.
//!
//! Every write is conditional on the resourceVersion this task last saw, checks the leader's
//! term first and gets no more time than the term has left. On a conflict the object is read
//! again: if it was deleted, replaced, or finished by someone else, this task stops; if only its
//! metadata or spec changed, the write is sent again on the new resourceVersion. A deposed
//! leader therefore writes nothing, and a late write can never turn a finished migration back to
//! Running.

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tokio::time::Instant;
use tracing::warn;

use crate::api::{Phase, StorageVersionMigration, StorageVersionMigrationStatus};
use crate::fence::Fence;

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
    #[error("migration {0} kept changing under the status write")]
    Conflicts(String),
    #[error("no answer within {1:?} writing the status of migration {0}")]
    TimedOut(String, Duration),
    #[error("failed to write the status of migration {0}")]
    Write(String, #[source] kube::Error),
    #[error("failed to serialize the status of migration {0}")]
    Serialize(String, #[source] serde_json::Error),
}

impl Error {
    /// Whether trying again later may succeed.
    fn is_transient(&self) -> bool {
        match self {
            Error::TimedOut(..) | Error::Conflicts(_) => true,
            Error::Write(_, kube::Error::Api(status)) => status.code >= 500 || status.code == 429,
            Error::Write(..) => true,
            Error::Fenced | Error::Gone(_) | Error::Superseded(_) | Error::Serialize(..) => false,
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
    uid: Option<String>,
    resource_version: Option<String>,
    fence: Fence,
    request_timeout: Duration,
}

impl StatusWriter {
    pub fn new(
        api: Api<StorageVersionMigration>,
        migration: &StorageVersionMigration,
        fence: Fence,
        request_timeout: Duration,
    ) -> StatusWriter {
        StatusWriter {
            api,
            name: migration.name_any(),
            uid: migration.uid(),
            resource_version: migration.resource_version(),
            fence,
            request_timeout,
        }
    }

    /// Writes `status`, retrying transient failures with backoff for up to `patience`.
    pub async fn write_within(
        &mut self,
        status: &StorageVersionMigrationStatus,
        patience: Duration,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + patience;
        let mut backoff = FIRST_BACKOFF;
        loop {
            match self.write(status).await {
                Err(error) if error.is_transient() && Instant::now() + backoff < deadline => {
                    warn!(
                        migration = self.name,
                        error = %crate::error_chain(&error),
                        "status write failed; trying again"
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                result => return result,
            }
        }
    }

    /// Writes `status` once, resolving conflicts as the module says.
    pub async fn write(&mut self, status: &StorageVersionMigrationStatus) -> Result<(), Error> {
        let value = status_value(status).map_err(|e| Error::Serialize(self.name.clone(), e))?;
        for _ in 0..CONFLICT_RETRIES {
            let limit = self.fence.deadline(self.request_timeout).ok_or(Error::Fenced)?;
            let patch = json!({
                "metadata": { "resourceVersion": self.resource_version },
                "status": value,
            });
            let params = PatchParams::default();
            let patch = Patch::Merge(&patch);
            let sent = self.api.patch_status(&self.name, &params, &patch);
            match tokio::time::timeout(limit, sent).await {
                Ok(Ok(written)) => {
                    self.resource_version = written.resource_version();
                    return Ok(());
                }
                Ok(Err(kube::Error::Api(answer))) if answer.code == 409 => {
                    if self.reread(status).await? {
                        return Ok(());
                    }
                }
                Ok(Err(kube::Error::Api(answer))) if answer.code == 404 => {
                    return Err(Error::Gone(self.name.clone()));
                }
                Ok(Err(error)) => return Err(Error::Write(self.name.clone(), error)),
                Err(_) => return Err(Error::TimedOut(self.name.clone(), limit)),
            }
        }
        Err(Error::Conflicts(self.name.clone()))
    }

    /// After a conflict: reads the migration again and takes its resourceVersion. `Ok(true)`
    /// when it already holds `status` (an earlier write of ours landed after all).
    async fn reread(&mut self, status: &StorageVersionMigrationStatus) -> Result<bool, Error> {
        let limit = self.fence.deadline(self.request_timeout).ok_or(Error::Fenced)?;
        let current = match tokio::time::timeout(limit, self.api.get_opt(&self.name)).await {
            Ok(Ok(current)) => current,
            Ok(Err(error)) => return Err(Error::Write(self.name.clone(), error)),
            Err(_) => return Err(Error::TimedOut(self.name.clone(), limit)),
        };
        let Some(current) = current.filter(|c| c.uid() == self.uid) else {
            return Err(Error::Gone(self.name.clone()));
        };
        if current.metadata.deletion_timestamp.is_some() {
            return Err(Error::Gone(self.name.clone()));
        }
        if current.status.as_ref() == Some(status) {
            self.resource_version = current.resource_version();
            return Ok(true);
        }
        if Phase::of(&current).is_terminal() {
            return Err(Error::Superseded(self.name.clone()));
        }
        self.resource_version = current.resource_version();
        Ok(false)
    }
}

/// The status as a merge patch value: fields the status leaves out are cleared.
fn status_value(status: &StorageVersionMigrationStatus) -> Result<Value, serde_json::Error> {
    let mut value = serde_json::to_value(status)?;
    if let Value::Object(fields) = &mut value {
        for field in [
            "conditions",
            "progress",
            "checkpoint",
            "failedObjects",
            "target",
            "listedFromStart",
            "startTime",
            "completionTime",
        ] {
            fields.entry(field).or_insert(Value::Null);
        }
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_left_out_are_cleared() {
        let value = status_value(&StorageVersionMigrationStatus::default()).expect("serializes");
        assert_eq!(value["checkpoint"], Value::Null);
        assert_eq!(value["listedFromStart"], Value::Null);
        assert!(value.as_object().is_some_and(|fields| fields.contains_key("checkpoint")));
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
    }
}
