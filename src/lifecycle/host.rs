//! What differs between the controller and `kube-svm migrate`: the [`Host`] a lifecycle runs
//! in, and the words they share (when a status is recorded, what the operator is told, how a
//! migration ends).

use std::time::Duration;

use crate::api::{MigrationCondition, StorageVersionMigration, StorageVersionMigrationStatus};
use crate::engine::{Progress, Resource};

use super::change::Change;

/// When the host is asked to record a status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    /// The run starts (Running, its target and where it starts).
    Start,
    /// The engine goes on: its progress so far, at most every [`Options::checkpoint_interval`].
    Running,
    /// The run was stopped (the process stops, or is interrupted): its last whole page.
    Interrupted,
    /// The migration ended, Succeeded or Failed.
    End,
    /// The resource could not be resolved, for good: the migration failed before any run.
    Unresolved,
}

/// Why the record could not be written.
#[derive(Debug)]
pub enum Unrecorded {
    /// Nothing more may be written: this process lost its term, or the migration was deleted or
    /// finished by someone else.
    Stop(String),
    /// Writing failed for now; the migration is taken up again later.
    Later(String),
}

/// How the host runs every migration it hosts: read once, when its lifecycle is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Whether to write through the `status` subresource where a resource has one that can
    /// be patched (a migration's annotation can require it anyway).
    pub write_to_status: bool,
    /// Whether the run removes `managedFields` entries naming versions the CRD no longer serves.
    pub clean_managed_fields: bool,
    /// The least time between two records of progress while the engine runs.
    pub checkpoint_interval: Duration,
    /// Discovery of the resource (or reading its CRD) is tried this many times before the
    /// migration fails; the host takes it up again in between ([`LaterBecause::Discovery`]).
    pub discovery: Tries,
    /// Whether a run stopped with its process leaves the CRD marked `StorageMigrating`, as
    /// its migration stays Running for another process to take up (the controller's next
    /// leader); otherwise it is unmarked.
    pub stopped_runs_stay_marked: bool,
    /// The reason of the CRD's `StorageMigrating` condition while the run writes:
    /// [`storage_migrating::MIGRATING`](crate::api::conditions::storage_migrating), or
    /// `MIGRATING_BY_HAND` for `kube-svm migrate`, which the controller waits for.
    pub mark_reason: &'static str,
}

/// How many times something is tried: this is try `this` of `of`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tries {
    /// This try, from 1.
    pub this: u32,
    /// Tries in all.
    pub of: u32,
}

impl Tries {
    /// Only once.
    pub const ONCE: Tries = Tries { this: 1, of: 1 };

    /// Whether a try is left after this one.
    pub fn more_left(self) -> bool {
        self.this < self.of
    }
}

/// What the operator is told as the migration goes.
#[derive(Debug)]
pub enum Notice<'a> {
    /// A run starts: the Event reason (Started, Resumed, Restarted) and what kind of start.
    Start {
        /// The Event reason.
        event: &'static str,
        /// Says what kind of start, such as "resuming from the checkpoint".
        note: &'a str,
        /// Objects handled before this run (those of the checkpoint it resumes).
        processed: u64,
    },
    /// The encoding check is about to run (it may take a settle period).
    Confirming {
        /// The resource being migrated.
        resource: &'a Resource,
        /// The storage version the apiservers must encode in.
        storage: &'a str,
    },
    /// What the encoding check found: `vouched` when an operator said so on the migration.
    Encoding {
        /// Whether an operator vouched for the encoding, so the check was skipped.
        vouched: bool,
        /// `Some(true)` when confirmed, `Some(false)` when not; `None` when there was nothing
        /// to check.
        confirmed: Option<bool>,
        /// What was seen, or why the check was skipped.
        evidence: &'a str,
    },
    /// The engine moved on (told at each of its reports, recorded or not).
    Progress(&'a Progress),
    /// The resource could not be resolved on try `tries`; it is tried again later.
    Unresolved {
        /// What failed.
        message: &'a str,
        /// Which try failed.
        tries: Tries,
    },
    /// The resource could not be resolved for good: the migration failed, as `status` says.
    Unresolvable(&'a StorageVersionMigrationStatus),
    /// The target changed before the first write: it is worked out again.
    Retarget(&'a Change),
    /// The run proved nothing about the encoding (apiservers disagreed at the end).
    Unproven(&'a Change),
    /// What was done with `storedVersions`, and why.
    StoredVersions(&'a MigrationCondition),
    /// The migration of `resource` ended, as `status` says.
    Ended {
        /// The resource migrated.
        resource: &'a Resource,
        /// The final status, Succeeded or Failed.
        status: &'a StorageVersionMigrationStatus,
    },
}

/// How a migration's lifecycle ended.
#[derive(Debug)]
pub enum End {
    /// It ended Succeeded or Failed, recorded as this status.
    Finished(Box<StorageVersionMigrationStatus>),
    /// It stopped before its end (cancelled, or this process may no longer write); `why` says
    /// where it can be taken up again, when known.
    Stopped {
        /// How far it got.
        progress: Box<Progress>,
        /// Why it stopped.
        why: String,
    },
    /// What it needs could not be read (discovery, its CRD), or it could not be recorded; it
    /// is taken up again later.
    Later(LaterBecause),
}

/// Why a migration is to be taken up again later.
#[derive(Debug, PartialEq, Eq)]
pub enum LaterBecause {
    /// Discovery or the CRD could not be read.
    Discovery,
    /// The migration's record could not be written.
    Unrecorded,
}

/// What differs between the controller and `kube-svm migrate`.
pub trait Host {
    /// The migration as it was before this lifecycle (spec, status to go on from).
    fn migration(&self) -> &StorageVersionMigration;

    /// How this host runs migrations.
    fn options(&self) -> Options;

    /// Records `status` at `moment`. A [`Unrecorded::Later`] while running is only logged: the
    /// next record may succeed.
    fn record(
        &mut self,
        status: &StorageVersionMigrationStatus,
        moment: Moment,
    ) -> impl Future<Output = Result<(), Unrecorded>>;

    /// Tells the operator.
    fn tell(&self, notice: Notice<'_>) -> impl Future<Output = ()>;

    /// Waits for this migration's turn to write, once its evidence is in (the encoding check may
    /// wait a settle period, and waiting for evidence holds no slot); the turn is held while
    /// the engine writes. `None`: no other migration shares the writes (`kube-svm migrate`).
    fn turn(&self) -> impl Future<Output = Option<super::turns::Turn>> {
        async { None }
    }
}
