//! `kube-svm migrate` as a lifecycle's host: the record goes to a checkpoint file, and the
//! operator hears of the migration through the [`Console`].

use std::path::PathBuf;
use std::time::Duration;

use super::{Console, Migrator};
use crate::api::conditions::events;
use crate::api::{GroupResource, StorageVersionMigration, StorageVersionMigrationStatus};
use crate::lifecycle::{self, Moment, Notice, Options, Tries, Unrecorded};

/// One resource's migration in this process.
pub(super) struct Host<'a, C> {
    migrator: &'a Migrator<C>,
    name: &'a GroupResource,
    /// The migration as the checkpoint left it (or a new one).
    migration: StorageVersionMigration,
    /// Where the last checkpoint was saved.
    saved: Option<PathBuf>,
}

impl<'a, C: Console> Host<'a, C> {
    pub(super) fn new(
        migrator: &'a Migrator<C>,
        name: &'a GroupResource,
        migration: StorageVersionMigration,
    ) -> Self {
        Host { migrator, name, migration, saved: None }
    }

    /// Where the last checkpoint was saved, if it could be.
    pub(super) fn saved(&self) -> Option<&PathBuf> {
        self.saved.as_ref()
    }

    fn say(&self, line: &str) {
        self.migrator.console.say(&format!("{}: {line}", self.name.name()));
    }
}

impl<C: Console> lifecycle::Host for Host<'_, C> {
    fn migration(&self) -> &StorageVersionMigration {
        &self.migration
    }

    fn options(&self) -> Options {
        let choices = self.migrator.choices;
        Options {
            write_to_status: choices.write_to_status,
            clean_managed_fields: choices.clean_managed_fields,
            // A checkpoint file is cheap to save: after every page.
            checkpoint_interval: Duration::ZERO,
            discovery: Tries::ONCE,
            // Interrupted, the run goes on only when the command is run again.
            stopped_runs_stay_marked: false,
            mark_reason: crate::api::conditions::storage_migrating::MIGRATING_BY_HAND,
        }
    }

    async fn record(
        &mut self,
        status: &StorageVersionMigrationStatus,
        moment: Moment,
    ) -> Result<(), Unrecorded> {
        let checkpoints = &self.migrator.checkpoints;
        if moment != Moment::Running {
            self.migrator.console.written();
        }
        match moment {
            Moment::Start | Moment::Running | Moment::Interrupted => {
                self.saved = checkpoints.save(self.name, &self.migration, status);
            }
            Moment::End => checkpoints.remove(self.name),
            // Nothing ran: a checkpoint from before stays for a later run.
            Moment::Unresolved => {}
        }
        Ok(())
    }

    async fn tell(&self, notice: Notice<'_>) {
        let console = &self.migrator.console;
        match notice {
            Notice::Start { event, processed, .. } if event == events::RESUMED => {
                self.say(&format!("resuming from the checkpoint after {processed} objects"));
            }
            Notice::Start { event, note, .. } if event == events::RESTARTED => console.say(note),
            Notice::Progress(progress) => console.progress(progress),
            Notice::Confirming { storage, .. } => self.say(&format!(
                "confirming that the apiservers encode in {storage} before the first write"
            )),
            Notice::Encoding { confirmed: Some(true), evidence, .. } => self.say(evidence),
            Notice::Encoding { evidence, .. } => self.say(&format!(
                "not confirmed, so storedVersions will be kept; migrating anyway: {evidence}"
            )),
            Notice::Retarget(change) => {
                self.say(&format!("{change}; before the first write, so only the target changes"))
            }
            Notice::Unproven(change) => {
                self.say(&format!("the objects were rewritten, but {change}"));
            }
            // The result line says how it ended.
            Notice::Start { .. }
            | Notice::StoredVersions(_)
            | Notice::Ended { .. }
            | Notice::Unresolved { .. }
            | Notice::Unresolvable(_) => {}
        }
        // The run writes next: its progress is shown from here.
        if let Notice::Start { processed, .. } = notice {
            console.writing(&self.name.name(), processed);
        }
    }
}
