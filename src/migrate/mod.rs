//! `kube-svm migrate` without its arguments and printing: migrations run in this process,
//! without the controller or its CRDs (a laptop, a CI job, a Helm hook). Each resource goes
//! through the controller's [`lifecycle`](crate::lifecycle), with a [`Migrator`] as its host:
//! what the controller keeps in a migration's status is kept in a checkpoint file
//! ([`checkpoints`]), so a run that was interrupted goes on from where it stopped, and the
//! operator hears of it through a [`Console`] (lines on standard error and a progress bar, in
//! `cli`).

pub mod checkpoints;
mod host;
mod others;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ListParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::api::{
    GroupResource, GroupVersionResource, StorageVersionMigration, StorageVersionMigrationSpec,
    StorageVersionMigrationStatus,
};
use crate::apiserver::requests::Requests;
use crate::engine::{Engine, Progress};
use crate::evidence::encoding::{EncodingPolicy, Observer};
use crate::lifecycle::cluster::Cluster;
use crate::lifecycle::{End, LaterBecause, Lifecycle};
use crate::rules::crd::CrdState;
use checkpoints::Checkpoints;

/// How often `--wait-for-others` looks whether the other migration ended.
const OTHERS_POLL: Duration = Duration::from_secs(2);

/// Where the operator hears of a migration run in this process.
pub trait Console: Sync {
    /// A line for the operator.
    fn say(&self, line: &str);

    /// A run of `resource` starts writing, with `processed_at_start` objects handled before it.
    fn writing(&self, resource: &str, processed_at_start: u64);

    /// The run that writes moved on.
    fn progress(&self, progress: &Progress);

    /// The run that wrote, if any, stopped writing.
    fn written(&self);
}

/// The choices of one `kube-svm migrate`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Choices {
    /// Start every resource from its first object, whatever its checkpoint says.
    pub restart: bool,
    /// Wait for another migrator migrating a resource to end, rather than refuse it.
    pub wait_for_others: bool,
    /// Remove `managedFields` entries naming versions the CRD no longer serves.
    pub clean_managed_fields: bool,
    /// Write through the `status` subresource where a resource has one.
    pub write_to_status: bool,
}

/// What the migrations of one `kube-svm migrate` share.
pub struct Migrator<C> {
    /// The way to the cluster's apiserver, a deadline on every request; its fence never
    /// closes, as this process is the only writer it knows of.
    pub requests: Requests,
    /// How the encoding is confirmed before the first write.
    pub encoding: EncodingPolicy,
    /// Migrates the objects.
    pub engine: Engine,
    /// Where each resource's checkpoint is kept.
    pub checkpoints: Checkpoints,
    /// The command's choices.
    pub choices: Choices,
    /// Where the operator hears of it.
    pub console: C,
    /// Fires on SIGINT or SIGTERM.
    pub stop: CancellationToken,
    /// The encoding checks' shared samples.
    pub observer: Observer,
}

/// How one resource's migration ended.
#[derive(Debug)]
pub enum Outcome {
    /// It ended Succeeded or Failed, as this status says.
    Finished(Box<StorageVersionMigrationStatus>),
    /// Stopped by a signal after `processed` objects; `checkpoint` is where it goes on from,
    /// when it could be saved.
    Interrupted {
        /// Objects handled.
        processed: u64,
        /// The checkpoint file saved.
        checkpoint: Option<PathBuf>,
    },
    /// Stopped by a signal while waiting for `other` (another migrator) to end.
    InterruptedWaiting {
        /// The other migration, in words.
        other: String,
    },
    /// Not started, and why: another migrator is migrating it, or whether one is could not be
    /// told.
    Refused(String),
    /// Not started: another migrator, waited for, left nothing to do (the CRD's
    /// `storedVersions` lists only its storage version since).
    Done(String),
    /// It could not go on (a record could not be written, or the resource not resolved).
    Later(LaterBecause),
}

impl<C: Console> Migrator<C> {
    fn cluster(&self) -> Cluster<'_> {
        Cluster { requests: &self.requests, encoding: self.encoding, observer: &self.observer }
    }

    /// One resource's migration, through the controller's lifecycle.
    pub async fn migrate(&self, name: &GroupResource) -> Outcome {
        match self.wait_for_others(name).await {
            Err(outcome) => return outcome,
            // Waited: the other may have done it all.
            Ok(Some(other)) if self.settled_since(name).await => {
                return Outcome::Done(format!(
                    "nothing left to do: {other} migrated it, and storedVersions lists only the storage version"
                ));
            }
            Ok(_) => {}
        }
        let spec = GroupVersionResource {
            group: name.group.clone(),
            version: String::new(),
            resource: name.resource.clone(),
        };
        let host = host::Host::new(self, name, self.previous(name, spec));
        let by = format!("kube-svm migrate (pid {})", std::process::id());
        let mut lifecycle = Lifecycle::new(self.cluster(), &self.engine, host, &self.stop, by);
        let end = lifecycle.run().await;
        // However it ended (some ends record nothing), nothing is shown writing any more.
        self.console.written();
        match end {
            End::Finished(done) => Outcome::Finished(done),
            End::Stopped { progress, .. } => Outcome::Interrupted {
                processed: progress.processed(),
                checkpoint: lifecycle.host.saved().cloned(),
            },
            End::Later(why) => Outcome::Later(why),
        }
    }

    /// The migration a checkpoint file left for `name`, or a new one.
    fn previous(
        &self,
        name: &GroupResource,
        spec: GroupVersionResource,
    ) -> StorageVersionMigration {
        let saved = if self.choices.restart { None } else { self.checkpoints.load(name) };
        saved.unwrap_or_else(|| {
            let spec = StorageVersionMigrationSpec { resource: spec, continue_token: None };
            StorageVersionMigration::new(&name.name(), spec)
        })
    }

    /// Whether `name` is a CRD-backed resource whose `storedVersions` lists only its storage
    /// version now: read again after waiting for another migrator.
    async fn settled_since(&self, name: &GroupResource) -> bool {
        let crds = Api::<CustomResourceDefinition>::all(self.requests.client().clone());
        match self.requests.send(crds.get_opt(&name.name())).await {
            Ok(Some(crd)) => CrdState::of(&crd).is_some_and(|state| !state.is_stale()),
            _ => false,
        }
    }

    /// Returns once no other migrator is migrating `name` (at most one migration per resource at
    /// a time, whoever runs it): at once (`None`), or after waiting for one with
    /// `--wait-for-others` (the other, in words). Otherwise the outcome that refuses it.
    async fn wait_for_others(&self, name: &GroupResource) -> Result<Option<String>, Outcome> {
        let mut waited_for = None;
        loop {
            let running = others::running_for(self.requests.client(), name).await.map_err(|error| {
                let why = format!(
                    "cannot tell whether another migrator is migrating it, so it was not started: {}",
                    crate::error_chain(&error)
                );
                Outcome::Refused(why)
            })?;
            let Some(other) = running else { return Ok(waited_for) };
            if !self.choices.wait_for_others {
                let why = format!(
                    "refused: {other} is migrating it now; wait for it to end (kube-svm status -w), or pass --wait-for-others"
                );
                return Err(Outcome::Refused(why));
            }
            if waited_for.is_none() {
                self.console.say(&format!("{}: waiting for {other} to end", name.name()));
                waited_for = Some(other.clone());
            }
            tokio::select! {
                () = tokio::time::sleep(OTHERS_POLL) => {}
                () = self.stop.cancelled() => return Err(Outcome::InterruptedWaiting { other }),
            }
        }
    }
}

/// Every CRD whose `storedVersions` lists more than its storage version.
pub async fn stale_crds(client: &Client) -> Result<Vec<GroupResource>, kube::Error> {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let crds = crds.list(&ListParams::default()).await?;
    Ok(crds
        .items
        .iter()
        .filter(|crd| CrdState::of(crd).is_some_and(|s| s.is_stale()))
        .map(|crd| GroupResource {
            group: crd.spec.group.clone(),
            resource: crd.spec.names.plural.clone(),
        })
        .collect())
}
