//! Writing and proving, once a run has its target and its turn: the engine with the target
//! guarded beside it, the check at the end, `storedVersions` settled, and the end recorded.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::api::conditions::SUCCEEDED;
use crate::api::{GroupVersionResource, MigrationTarget, StorageVersionMigrationStatus};
use crate::engine::{self, Job, Progress, Resource};

use super::change::Change;
use super::status::{self, Start};
use super::target_watch::TargetWatch;
use super::{End, Host, Lifecycle, Moment, Notice, Ran, Unrecorded, prune};

impl<H: Host> Lifecycle<'_, H> {
    /// The engine, with progress recorded beside it (never pausing it), until it finishes or
    /// `moves` (the target or the cluster changed) resolves.
    pub(super) async fn run_engine(
        &mut self,
        resource: &Resource,
        crd: Option<&CustomResourceDefinition>,
        target: &MigrationTarget,
        start: Start,
        mut current: StorageVersionMigrationStatus,
        moves: impl Future<Output = Change>,
    ) -> Ran {
        // This run only: a change of the target stops it, and the migration goes on.
        let cancel = self.cancel.child_token();
        let (report, updates) = watch::channel(start.progress.clone());
        let job = Job {
            resource: resource.clone(),
            write_to_status: self.writes_to_status(resource),
            pace: self.host.migration().requested_pace(),
            resume: start.progress,
            fence: self.cluster.requests.fence().clone(),
            clean_managed_fields: self.cleaning(crd),
            budget: self.host.migration().requested_budget().and_then(Result::ok),
        };
        let latest = updates.clone();
        let mut run = Box::pin(self.engine.run(job, &report, &cancel));
        let stopped = {
            let interval = self.options.checkpoint_interval;
            let follow = follow(&mut self.host, interval, &mut current, target, updates);
            tokio::select! {
                finished = &mut run => Ok(finished),
                stop = follow => Err(stop),
                change = moves => {
                    cancel.cancel();
                    let _ = (&mut run).await;
                    let progress = latest.borrow().clone();
                    let now = Timestamp::now();
                    let current = status::running(Some(&current), target, &progress, now);
                    return Ran::Changed { change, current };
                }
            }
        };
        let finished = match stopped {
            Ok(finished) => finished,
            Err(stop) => {
                info!(reason = ?stop, "stopping the migration");
                self.cancel.cancel();
                let _ = (&mut run).await;
                // Deleted or finished by someone else: the CRD is no longer being migrated by
                // this lifecycle. A process that lost its term leaves it to the next one.
                if self.cluster.requests.fence().holds() {
                    self.unmark().await;
                }
                let progress = latest.borrow().clone();
                return Ran::Ended(self.unrecorded(stop, progress));
            }
        };
        // The engine's last report, which the follow loop may not have seen.
        let last = latest.borrow().clone();
        self.host.tell(Notice::Progress(&last)).await;
        let now = Timestamp::now();
        match finished {
            Ok(engine::Finished::Completed(progress)) => {
                let done = status::completed(Some(&current), target, &progress, now);
                Ran::Finished { progress: Box::new(progress), done }
            }
            Ok(engine::Finished::Cancelled(progress)) => {
                let checkpoint = status::running(Some(&current), target, &progress, now);
                let why = match self.host.record(&checkpoint, Moment::Interrupted).await {
                    Ok(()) => format!("{} objects handled; checkpointed", progress.processed()),
                    Err(unrecorded) => format!(
                        "{} objects handled; no checkpoint ({unrecorded:?})",
                        progress.processed()
                    ),
                };
                Ran::Ended(End::Stopped { progress: Box::new(progress), why })
            }
            Err(error) => {
                let progress = latest.borrow().clone();
                let done = status::engine_failed(Some(&current), target, &progress, &error, now);
                Ran::Finished { progress: Box::new(progress), done }
            }
        }
    }

    /// A run that completed proves nothing if the resource stopped being served, or its storage
    /// version (or its CRD) changed, while it ran: then objects written earlier may be stored in
    /// the old version; nor if etcd was restored or the apiservers restarted
    /// ([`TargetWatch::at_end`]). The change, if any, for a Succeeded run.
    pub(super) async fn check_at_end(
        &self,
        spec: &GroupVersionResource,
        done: &StorageVersionMigrationStatus,
        watch: &mut TargetWatch,
    ) -> Option<Change> {
        if done.conditions.first().map(|c| c.type_.as_str()) != Some(SUCCEEDED) {
            return None;
        }
        let requires_status = self.host.migration().requests_status_writes();
        watch.at_end(&self.cluster, spec, requires_status).await
    }

    /// Prunes the CRD's `storedVersions` when that is proven safe; says what was done, and why,
    /// in a condition of `done` and to the operator.
    pub(super) async fn settle_stored_versions(
        &self,
        resource: &Resource,
        target: &MigrationTarget,
        done: &mut StorageVersionMigrationStatus,
        watch: &mut TargetWatch,
    ) {
        let run = status::run_of(done);
        let settled = prune::settle_stored_versions(&self.cluster, resource, target, &run, watch);
        let Some(pruned) = settled.await else {
            return;
        };
        // The record says which state of the CRD the run was followed to.
        if let Some(recorded) = done.target.as_mut() {
            watch.record_into(recorded);
        }
        self.host.tell(Notice::StoredVersions(&pruned)).await;
        done.conditions.retain(|c| c.type_ != pruned.type_);
        done.conditions.push(pruned);
    }

    /// The CRD unmarked, then the final status recorded and told.
    pub(super) async fn record_end(
        &mut self,
        resource: &Resource,
        done: StorageVersionMigrationStatus,
    ) -> End {
        // The CRD first: whoever sees the migration finished finds its CRD settled too.
        self.unmark().await;
        if let Err(unrecorded) = self.host.record(&done, Moment::End).await {
            let progress = Progress::default();
            return self.unrecorded(unrecorded, progress);
        }
        self.host.tell(Notice::Ended { resource, status: &done }).await;
        End::Finished(Box::new(done))
    }
}

/// Tells `host` of every report of the engine in `updates`, and records the status after
/// `current` with the latest progress at most every `interval`; returns only when a record says
/// the migration must stop. A record that fails for now is logged, and tried at the next.
pub(super) async fn follow(
    host: &mut impl Host,
    interval: Duration,
    current: &mut StorageVersionMigrationStatus,
    target: &MigrationTarget,
    mut updates: watch::Receiver<Progress>,
) -> Unrecorded {
    let mut last_record = Instant::now();
    let mut pending = false;
    loop {
        tokio::select! {
            changed = updates.changed() => {
                if changed.is_err() {
                    // The engine is gone; the select around this ends first.
                    std::future::pending::<()>().await;
                }
                let progress = updates.borrow_and_update().clone();
                host.tell(Notice::Progress(&progress)).await;
                pending = true;
            }
            () = tokio::time::sleep_until(last_record + interval), if pending => {
                let progress = updates.borrow().clone();
                let next = status::running(Some(current), target, &progress, Timestamp::now());
                match host.record(&next, Moment::Running).await {
                    Ok(()) => *current = next,
                    Err(stop @ Unrecorded::Stop(_)) => return stop,
                    Err(Unrecorded::Later(why)) => warn!(why, "failed to checkpoint"),
                }
                last_record = Instant::now();
                pending = false;
            }
        }
    }
}
