//! `kube-svm retry`: runs Failed migrations again in place. It asks the controller to, with the
//! annotation `kube-svm.io/retry` (the time as its token); the controller clears the outcome, an
//! Event keeping it, and runs the migration again from its first object.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::kube::KubeArgs;
use crate::api::{Phase, RETRY_ANNOTATION, StorageVersionMigration, retry_token};

/// Times the request is made again when the migration changed between its read and the patch.
const CONFLICT_RETRIES: u32 = 3;

#[derive(Args, Debug)]
pub struct RetryArgs {
    #[command(flatten)]
    pub kube: KubeArgs,

    /// The Failed StorageVersionMigrations to run again.
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,
}

/// Why a migration was not retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("storageversionmigration {0} does not exist")]
    NotFound(String),
    #[error(
        "storageversionmigration {0} is {1}, not Failed: only a Failed migration can be retried"
    )]
    NotFailed(String, Phase),
    #[error("storageversionmigration {0} kept changing under the request; try again")]
    KeptChanging(String),
    #[error("failed to read storageversionmigration {0}")]
    Read(String, #[source] kube::Error),
    #[error("failed to annotate storageversionmigration {0}")]
    Annotate(String, #[source] kube::Error),
}

/// Asks for a retry of every migration named; exits 1 when any could not be retried, saying
/// why on standard error.
pub async fn run(args: RetryArgs) -> anyhow::Result<ExitCode> {
    let RetryArgs { kube, names } = args;
    let client = Client::try_from(kube.config().await?).context("failed to create a client")?;
    let api: Api<StorageVersionMigration> = Api::all(client);
    let mut refused = false;
    for name in &names {
        match ask(&api, name).await {
            Ok(token) => println!(
                "storageversionmigration.migration.k8s.io/{name} retry requested ({RETRY_ANNOTATION}={token})"
            ),
            Err(error) => {
                eprintln!("error: {}", crate::error_chain(&error));
                refused = true;
            }
        }
    }
    Ok(if refused { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Annotates migration `name` for a retry, on the version read, once it is found Failed;
/// returns the token.
async fn ask(api: &Api<StorageVersionMigration>, name: &str) -> Result<String, Error> {
    for _ in 0..CONFLICT_RETRIES {
        let found = api.get_opt(name).await.map_err(|e| Error::Read(name.to_owned(), e))?;
        let migration = retriable(name, found)?;
        let token = retry_token();
        let patch = Patch::Merge(migration.retry_patch(&token));
        match api.patch(name, &PatchParams::default(), &patch).await {
            Ok(_) => return Ok(token),
            Err(error) if crate::apiserver::answers::is_conflict(&error) => {}
            Err(error) => return Err(Error::Annotate(name.to_owned(), error)),
        }
    }
    Err(Error::KeptChanging(name.to_owned()))
}

/// The migration, when it exists and is Failed. Pure.
fn retriable(
    name: &str,
    found: Option<StorageVersionMigration>,
) -> Result<StorageVersionMigration, Error> {
    let migration = found.ok_or_else(|| Error::NotFound(name.to_owned()))?;
    match Phase::of(&migration) {
        Phase::Failed => Ok(migration),
        phase => Err(Error::NotFailed(name.to_owned(), phase)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::{FAILED, SUCCEEDED};
    use crate::api::in_state;

    #[test]
    fn only_a_failed_migration_that_exists_is_retried() {
        assert!(retriable("m", Some(in_state(FAILED))).is_ok());
        let said = |result: Result<StorageVersionMigration, Error>| {
            result.map(|_| ()).map_err(|e| e.to_string()).expect_err("refused")
        };
        assert_eq!(said(retriable("gone", None)), "storageversionmigration gone does not exist");
        assert_eq!(
            said(retriable("m", Some(in_state(SUCCEEDED)))),
            "storageversionmigration m is Succeeded, not Failed: only a Failed migration can be retried"
        );
        let new = StorageVersionMigration::new("m", Default::default());
        assert!(said(retriable("m", Some(new))).contains("is New, not Failed"));
    }
}
