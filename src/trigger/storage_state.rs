//! The discovery trigger's decisions, pure: when a storage version hash seen in discovery is
//! trusted, how a StorageState changes at each poll, and which migration proves its objects are
//! stored in the current hash alone. The semantics are kube-storage-version-migrator's, with its
//! races closed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use crate::api::{GroupResource, Phase, StorageStateStatus, StorageVersionMigration, UNKNOWN_HASH};

/// Trusts a hash only once discovery has shown it on every poll for a while, and on enough polls
/// that every apiserver was likely asked: during a rolling upgrade, apiservers of two releases
/// answer discovery in turn, and their hashes must not make the trigger flap between them.
#[derive(Debug, Default)]
pub struct Guard {
    /// The hash each resource was last trusted at.
    trusted: HashMap<GroupResource, String>,
    /// A different hash seen on every poll since the instant given, and on how many polls.
    candidates: HashMap<GroupResource, (String, Instant, u32)>,
    /// Where the last poll trusted a new hash: the first poll of the streak that showed it.
    streaks: HashMap<GroupResource, Instant>,
    /// The agreement last asked for.
    trust: Option<Trust>,
    /// New hashes trusted so far.
    trusts: u64,
}

/// How much agreement a new hash needs before the trigger acts on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trust {
    /// How long every poll must show it.
    pub window: Duration,
    /// How many polls in a row must show it ([`crate::evidence::encoding::samples_needed`] for the number
    /// of apiservers: each poll reads discovery through a new connection).
    pub polls: u32,
}

impl Guard {
    /// Records that discovery shows `seen` for `resource` at `now`, and returns the hash to act
    /// on: `seen` once it has been shown on every poll for as long and as often as `trust` asks
    /// (or at once when it is the hash already trusted or `recorded` in the StorageState), else
    /// the hash trusted before (`None` for a resource never trusted).
    pub fn observe(
        &mut self,
        resource: &GroupResource,
        seen: &str,
        recorded: Option<&str>,
        now: Instant,
        trust: Trust,
    ) -> Option<String> {
        self.trust = Some(trust);
        let trusted = self.trusted.get(resource).cloned().or(recorded.map(str::to_owned));
        if trusted.as_deref() == Some(seen) {
            self.candidates.remove(resource);
            self.trusted.insert(resource.clone(), seen.to_owned());
            return trusted;
        }
        let (since, polls) = match self.candidates.get(resource) {
            Some((hash, since, polls)) if hash == seen => (*since, polls + 1),
            _ => (now, 1),
        };
        if now.duration_since(since) >= trust.window && polls >= trust.polls {
            self.candidates.remove(resource);
            self.trusted.insert(resource.clone(), seen.to_owned());
            self.streaks.insert(resource.clone(), since);
            self.trusts += 1;
            return Some(seen.to_owned());
        }
        self.candidates.insert(resource.clone(), (seen.to_owned(), since, polls));
        trusted
    }

    /// When the poll that just observed `resource` trusted a new hash: the first poll of the
    /// streak that showed it, every poll since showing it alone. Asked once.
    pub fn trusted_streak(&mut self, resource: &GroupResource) -> Option<Instant> {
        self.streaks.remove(resource)
    }

    /// Forgets candidates not seen in the last poll (a poll that saw them would have kept them).
    pub fn retain(&mut self, seen: &[GroupResource]) {
        self.candidates.retain(|resource, _| seen.contains(resource));
    }

    /// Whether a hash is waiting to be trusted: the next poll should come before long.
    pub fn pending(&self) -> bool {
        !self.candidates.is_empty()
    }

    /// The resources whose hash waits to be trusted, each with that hash.
    pub fn waiting(&self) -> Vec<(GroupResource, String)> {
        self.candidates
            .iter()
            .map(|(resource, (hash, ..))| (resource.clone(), hash.clone()))
            .collect()
    }

    /// The agreement last asked for, if any was.
    pub fn trust(&self) -> Option<Trust> {
        self.trust
    }

    /// How many new hashes were trusted so far: a poll that moved it trusted one.
    pub fn trusts(&self) -> u64 {
        self.trusts
    }

    /// How long a hash shown on every poll takes to be trusted at the polls [`Guard::next_poll`]
    /// asks for: the window, or longer when `least` keeps the polls it asks for from fitting in
    /// it. `None` when none waits.
    pub fn trust_period(&self, least: Duration) -> Option<Duration> {
        let trust = self.trust.filter(|_| self.pending())?;
        let spacing = self.next_poll(least)?;
        Some(trust.window.max(spacing * trust.polls.saturating_sub(1)))
    }

    /// How soon the next poll should come while a hash waits to be trusted: soon enough that
    /// the polls the trust asks for fit in its window (more apiservers ask for more polls in the
    /// same time, not for a longer time), but no sooner than `least`. `None` when none waits.
    pub fn next_poll(&self, least: Duration) -> Option<Duration> {
        let trust = self.trust.filter(|_| self.pending())?;
        let spacing = trust.window / trust.polls.saturating_sub(1).max(1);
        Some(spacing.max(least))
    }
}

/// A StorageState's status after a poll that trusts `current` and saw `seen`.
#[derive(Clone, Debug, PartialEq)]
pub struct Next {
    /// The status to write: persisted hashes, `current` as the current hash, and the heartbeat
    /// set to the poll's time.
    pub status: StorageStateStatus,
    /// Whether `persistedStorageVersionHashes` changed.
    pub persisted_changed: bool,
    /// Whether the poll saw a hash other than `current`: some apiserver may be writing objects
    /// in it now, so no migration that began before this poll proves anything.
    pub other_seen: bool,
}

impl Next {
    /// Whether the persisted-since time moves to now: the persisted hashes changed, or a hash
    /// other than the current one was seen. A migration proves its objects are stored in the
    /// current hash only if it began after that time.
    pub fn stamps(&self) -> bool {
        self.persisted_changed || self.other_seen
    }
}

/// The persisted-since time a migration must have begun after to prove `current`: the one
/// `recorded`, unless this poll trusted `current` after a streak of polls that showed it alone
/// since `streak` (every poll of it stamped the time, as it showed a hash other than the current
/// one then). Those polls showed the very hash now proved; what came before the streak did not,
/// so the time goes back to the streak's first poll, and no further.
pub fn persisted_since(
    recorded: Option<Timestamp>,
    streak: Option<Timestamp>,
) -> Option<Timestamp> {
    match (recorded, streak) {
        (Some(recorded), Some(streak)) if streak < recorded => Some(streak),
        (recorded, _) => recorded,
    }
}

/// How a StorageState changes when a poll trusts `current` and discovery showed `seen` (the
/// hash one apiserver publishes; during a rolling upgrade or a rollback it may differ from
/// `current`) at `now`:
/// - new, empty, or its heartbeat older than `stale_after` (the trigger was down and anything
///   may have been written meanwhile): `["Unknown"]`;
/// - `current` and `seen`, when not yet persisted, are appended: `seen` at once, however rarely
///   it shows (an apiserver publishing it writes objects in it; appending costs at most one
///   more migration), while only a trusted hash becomes `current`;
/// - `proven` (a migration proved every object is stored in `current`): `[current]`, unless
///   the state was stale (what was written while nobody watched is not covered by that proof)
///   or this poll saw another hash (an apiserver may be writing in it right now).
pub fn next_status(
    status: Option<&StorageStateStatus>,
    current: &str,
    seen: &str,
    proven: bool,
    now: Timestamp,
    stale_after: Duration,
) -> Next {
    let before: Vec<String> =
        status.map(|s| s.persisted_storage_version_hashes.clone()).unwrap_or_default();
    let heartbeat = status.and_then(|s| s.last_heartbeat_time.as_ref()).map(|t| t.0);
    let stale = heartbeat
        .is_none_or(|beat| now.duration_since(beat).as_secs_f64() > stale_after.as_secs_f64());
    let mut persisted = match before.is_empty() || stale {
        true => vec![UNKNOWN_HASH.to_owned()],
        false => before.clone(),
    };
    for hash in [current, seen] {
        if !persisted.iter().any(|h| h == hash) {
            persisted.push(hash.to_owned());
        }
    }
    let other_seen = seen != current;
    if proven && !stale && !other_seen {
        persisted = vec![current.to_owned()];
    }
    Next {
        persisted_changed: persisted != before,
        other_seen,
        status: StorageStateStatus {
            persisted_storage_version_hashes: persisted,
            current_storage_version_hash: Some(current.to_owned()),
            last_heartbeat_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
        },
    }
}

/// Whether a poll's result is worth a write: something changed, or the heartbeat is older
/// than `beat` (heartbeats are kept well inside the stale limit without a write per poll).
pub fn worth_writing(before: Option<&StorageStateStatus>, next: &Next, beat: Duration) -> bool {
    let Some(before) = before else { return true };
    let heartbeat = |s: &StorageStateStatus| s.last_heartbeat_time.as_ref().map(|t| t.0);
    let old = match (heartbeat(before), heartbeat(&next.status)) {
        (Some(then), Some(now)) => now.duration_since(then).as_secs_f64() >= beat.as_secs_f64(),
        _ => true,
    };
    next.persisted_changed
        || before.current_storage_version_hash != next.status.current_storage_version_hash
        || old
}

/// Whether objects may still be stored under a hash other than `current`.
pub fn needs_migration(status: &StorageStateStatus, current: &str) -> bool {
    status.persisted_storage_version_hashes != [current]
}

/// Whether a poll calls for a migration of the resource: objects may be stored under a hash
/// other than `current`, and the poll saw `current` itself. A poll that saw another hash waits:
/// that hash may be about to become the current one (a storage switch the guard has not
/// trusted yet), and a migration created now would be for the hash before it; the next poll
/// comes soon, as the guard has a hash pending.
pub fn migration_due(next: &Next, current: &str) -> bool {
    needs_migration(&next.status, current) && !next.other_seen
}

/// Why a migration proves nothing about how a resource's objects are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unproven {
    /// It migrated another resource.
    OtherResource,
    /// It has not ended Succeeded (or has no status).
    NotSucceeded,
    /// Its status has neither `listedFromStart` nor `target`: the installed status schema drops
    /// kube-svm's fields (kube-storage-version-migrator's CRDs), or another migrator ran it.
    Unrecorded,
    /// It began at a continue token another migrator left.
    NotListedFromStart,
    /// It targeted another hash (the late success of a migration started before a switch).
    OtherTarget,
    /// It began before the apiservers were shown to encode in its target.
    EncodingUnconfirmed,
    /// It began before the persisted hashes last changed or discovery last showed another hash
    /// (the persisted-since time), or its start time is not recorded.
    StartedBefore,
}

impl Unproven {
    /// Why, for a log line.
    pub fn reason(self) -> &'static str {
        match self {
            Unproven::OtherResource => "it migrated another resource",
            Unproven::NotSucceeded => "it did not succeed",
            Unproven::Unrecorded => {
                "its status has no listedFromStart or target: the installed CRD's status schema \
                 drops kube-svm's fields (kube-storage-version-migrator's CRDs?), or another \
                 migrator ran it"
            }
            Unproven::NotListedFromStart => "it began at a continue token another migrator left",
            Unproven::OtherTarget => "it targeted another storage version hash",
            Unproven::EncodingUnconfirmed => {
                "it began before the apiservers were shown to encode in its target"
            }
            Unproven::StartedBefore => {
                "it began before the StorageState's persisted hashes last changed, or before \
                 discovery last showed another hash"
            }
        }
    }
}

/// Whether `migration` proves every object of `resource` is stored in `current`: it
/// succeeded, listed the resource from its first object, targeted `current` (what it recorded
/// at its start, not what the hash is now: a late success of an older target proves nothing
/// about the current one), was not found to start before the apiservers encoded in it, and
/// started after `persisted_since`: when the persisted hashes last changed or discovery last
/// showed a hash other than the current one.
pub fn proves(
    migration: &StorageVersionMigration,
    resource: &GroupResource,
    current: &str,
    persisted_since: Option<Timestamp>,
) -> bool {
    proof(migration, resource, current, persisted_since).is_ok()
}

/// [`proves`], saying why not.
pub fn proof(
    migration: &StorageVersionMigration,
    resource: &GroupResource,
    current: &str,
    persisted_since: Option<Timestamp>,
) -> Result<(), Unproven> {
    let spec = &migration.spec.resource;
    if spec.group != resource.group || spec.resource != resource.resource {
        return Err(Unproven::OtherResource);
    }
    if Phase::of(migration) != Phase::Succeeded {
        return Err(Unproven::NotSucceeded);
    }
    let Some(status) = migration.status.as_ref() else { return Err(Unproven::NotSucceeded) };
    let targeted = status.target.as_ref().and_then(|t| t.storage_version_hash.as_deref());
    match (status.listed_from_start, targeted) {
        (None, None) => return Err(Unproven::Unrecorded),
        (Some(true), _) => {}
        _ => return Err(Unproven::NotListedFromStart),
    }
    if targeted != Some(current) {
        return Err(Unproven::OtherTarget);
    }
    if status.target.as_ref().and_then(|t| t.encoding_confirmed) == Some(false) {
        return Err(Unproven::EncodingUnconfirmed);
    }
    // `startTime` is stored to the second, `persisted-since` to the nanosecond: compared at
    // the second, the migration the trigger creates right after stamping proves, as it must.
    let started = status.start_time.as_ref().map(|t| t.0.as_second());
    match (persisted_since.map(|since| since.as_second()), started) {
        (None, _) => Ok(()),
        (Some(since), Some(started)) if started >= since => Ok(()),
        (Some(_), _) => Err(Unproven::StartedBefore),
    }
}

/// How many migrations of a resource ended without proving anything since the last one that
/// did, and when the last of them ended. A migration that failed counts, and so does one that
/// succeeded without proving the objects are stored in the current hash (`proves` says): the
/// same migration created again at once would end the same way, again and again.
pub fn failures(
    migrations: &[&StorageVersionMigration],
    proves: impl Fn(&StorageVersionMigration) -> bool,
) -> (u32, Option<Timestamp>) {
    let mut ended: Vec<(Timestamp, bool)> = migrations
        .iter()
        .filter(|m| Phase::of(m).is_terminal())
        .filter_map(|m| Some((m.ended_at()?, !proves(m))))
        .collect();
    ended.sort_by_key(|(at, _)| *at);
    let failed = ended.iter().rev().take_while(|(_, failed)| *failed).count();
    let last = ended.last().filter(|(_, failed)| *failed).map(|(at, _)| *at);
    (u32::try_from(failed).unwrap_or(u32::MAX), last)
}

/// How many of the newest `migrations` that ended, in a row, were made for the current hash
/// (`for_current`) and succeeded without proving anything (what `proves` refuses). Pure.
pub fn unproven_in_a_row(
    migrations: &[&StorageVersionMigration],
    for_current: impl Fn(&StorageVersionMigration) -> bool,
    proves: impl Fn(&StorageVersionMigration) -> bool,
) -> u32 {
    let mut ended: Vec<(Timestamp, &StorageVersionMigration)> = migrations
        .iter()
        .copied()
        .filter(|m| Phase::of(m).is_terminal())
        .filter_map(|m| Some((m.ended_at()?, m)))
        .collect();
    ended.sort_by_key(|(at, _)| *at);
    let in_a_row = ended
        .iter()
        .rev()
        .take_while(|(_, m)| Phase::of(m) == Phase::Succeeded && for_current(m) && !proves(m))
        .count();
    u32::try_from(in_a_row).unwrap_or(u32::MAX)
}

/// The newest of `migrations` that ended.
pub fn last_ended<'a>(
    migrations: &[&'a StorageVersionMigration],
) -> Option<&'a StorageVersionMigration> {
    migrations
        .iter()
        .copied()
        .filter(|m| Phase::of(m).is_terminal())
        .filter_map(|m| Some((m.ended_at()?, m)))
        .max_by_key(|(at, _)| *at)
        .map(|(_, m)| m)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::api::{
        MigrationTarget, StorageVersionMigrationSpec,
        StorageVersionMigrationStatus as MigrationStatus,
    };

    fn widgets() -> GroupResource {
        GroupResource { group: "example.com".into(), resource: "widgets".into() }
    }

    const WINDOW: Trust = Trust { window: Duration::from_secs(10), polls: 2 };

    #[test]
    fn a_new_hash_is_trusted_once_seen_for_the_whole_window() {
        let mut guard = Guard::default();
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        // A new resource: nothing trusted until its hash has held.
        assert_eq!(guard.observe(&widgets(), "A", None, at(0), WINDOW), None);
        assert!(guard.pending());
        assert_eq!(guard.observe(&widgets(), "A", None, at(10), WINDOW).as_deref(), Some("A"));
        assert!(!guard.pending());
        // A change is acted on only after the window; the old hash meanwhile.
        assert_eq!(guard.observe(&widgets(), "B", None, at(20), WINDOW).as_deref(), Some("A"));
        assert_eq!(guard.observe(&widgets(), "B", None, at(25), WINDOW).as_deref(), Some("A"));
        assert_eq!(guard.observe(&widgets(), "B", None, at(30), WINDOW).as_deref(), Some("B"));
    }

    #[test]
    fn behind_three_apiservers_a_new_hash_needs_twelve_polls_in_a_row() {
        let mut guard = Guard::default();
        let start = Instant::now();
        let three = Trust { window: Duration::from_secs(3), polls: 12 };
        guard.observe(&widgets(), "A", Some("A"), start, three);
        let at = |s: u64| start + Duration::from_secs(s);
        // Two polls in a row reached the one upgraded apiserver: not enough.
        for s in 1..12 {
            assert_eq!(guard.observe(&widgets(), "B", None, at(s), three).as_deref(), Some("A"));
        }
        assert_eq!(guard.observe(&widgets(), "B", None, at(12), three).as_deref(), Some("B"));
    }

    #[test]
    fn a_trusted_hash_says_once_since_when_every_poll_showed_it_alone() {
        let mut guard = Guard::default();
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        guard.observe(&widgets(), "A", Some("A"), at(0), WINDOW);
        assert_eq!(guard.trusted_streak(&widgets()), None, "A was trusted already");
        // B shows, then A again: that streak of B is broken; the next one counts from 15 s.
        guard.observe(&widgets(), "B", None, at(5), WINDOW);
        guard.observe(&widgets(), "A", None, at(10), WINDOW);
        guard.observe(&widgets(), "B", None, at(15), WINDOW);
        assert_eq!(guard.trusted_streak(&widgets()), None, "B is not trusted yet");
        assert_eq!(guard.observe(&widgets(), "B", None, at(25), WINDOW).as_deref(), Some("B"));
        assert_eq!(guard.trusted_streak(&widgets()), Some(at(15)));
        assert_eq!(guard.trusted_streak(&widgets()), None, "asked once");
        guard.observe(&widgets(), "B", None, at(30), WINDOW);
        assert_eq!(guard.trusted_streak(&widgets()), None, "B was trusted already");
    }

    #[test]
    fn the_persisted_since_time_goes_back_only_to_the_streak_that_had_the_hash_trusted() {
        let ts = |s: i64| Timestamp::from_second(1_000 + s).unwrap();
        // Every poll of the streak stamped the time: it goes back to the streak's first poll.
        assert_eq!(persisted_since(Some(ts(24)), Some(ts(15))), Some(ts(15)));
        // Nothing trusted on this poll, or a time older than the streak: kept as recorded.
        assert_eq!(persisted_since(Some(ts(24)), None), Some(ts(24)));
        assert_eq!(persisted_since(Some(ts(10)), Some(ts(15))), Some(ts(10)));
        // No time recorded: none (the poll stamps it now).
        assert_eq!(persisted_since(None, Some(ts(15))), None);
    }

    #[test]
    fn the_polls_a_trust_asks_for_fit_in_its_window() {
        let mut guard = Guard::default();
        let least = Duration::from_secs(2);
        assert_eq!(guard.next_poll(least), None, "nothing waits");
        let start = Instant::now();
        guard.observe(&widgets(), "A", None, start, WINDOW);
        assert_eq!(guard.next_poll(least), Some(Duration::from_secs(10)), "two polls, 10 s apart");
        let three = Trust { window: Duration::from_secs(10), polls: 12 };
        guard.observe(&widgets(), "A", None, start, three);
        assert_eq!(guard.next_poll(least), Some(least), "twelve polls: as often as allowed");
        let wide = Trust { window: Duration::from_secs(110), polls: 12 };
        guard.observe(&widgets(), "A", None, start, wide);
        assert_eq!(guard.next_poll(least), Some(Duration::from_secs(10)));
    }

    #[test]
    fn alternating_hashes_are_never_trusted() {
        let mut guard = Guard::default();
        let start = Instant::now();
        guard.observe(&widgets(), "A", Some("A"), start, WINDOW);
        for i in 1..20 {
            let seen = if i % 2 == 0 { "A" } else { "B" };
            let at = start + Duration::from_secs(i * 7);
            assert_eq!(
                guard.observe(&widgets(), seen, Some("A"), at, WINDOW).as_deref(),
                Some("A")
            );
        }
    }

    #[test]
    fn the_recorded_hash_is_trusted_after_a_restart() {
        let mut guard = Guard::default();
        let now = Instant::now();
        assert_eq!(guard.observe(&widgets(), "A", Some("A"), now, WINDOW).as_deref(), Some("A"));
    }

    fn ts(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn status(persisted: &[&str], heartbeat: i64) -> StorageStateStatus {
        StorageStateStatus {
            persisted_storage_version_hashes: persisted.iter().map(|h| h.to_string()).collect(),
            current_storage_version_hash: persisted.last().map(|h| h.to_string()),
            last_heartbeat_time: Some(Time(ts(heartbeat))),
        }
    }

    const STALE: Duration = Duration::from_secs(1200);

    #[test]
    fn storage_states_follow_upstream_semantics() {
        let new = next_status(None, "A", "A", false, ts(0), STALE);
        assert_eq!(new.status.persisted_storage_version_hashes, ["Unknown", "A"]);
        assert!(new.persisted_changed && needs_migration(&new.status, "A"));

        let proven = next_status(Some(&new.status), "A", "A", true, ts(60), STALE);
        assert_eq!(proven.status.persisted_storage_version_hashes, ["A"]);
        assert!(!needs_migration(&proven.status, "A"));

        let beat = next_status(Some(&proven.status), "A", "A", false, ts(600), STALE);
        assert!(!beat.persisted_changed);
        assert_eq!(beat.status.last_heartbeat_time, Some(Time(ts(600))));

        let changed = next_status(Some(&status(&["A"], 600)), "B", "B", false, ts(1200), STALE);
        assert_eq!(changed.status.persisted_storage_version_hashes, ["A", "B"]);
        assert_eq!(changed.status.current_storage_version_hash.as_deref(), Some("B"));

        let stale = next_status(Some(&status(&["A"], 0)), "A", "A", false, ts(1201), STALE);
        assert_eq!(stale.status.persisted_storage_version_hashes, ["Unknown", "A"]);
        // A proof does not cover what was written while the trigger was away.
        let stale = next_status(Some(&status(&["A"], 0)), "A", "A", true, ts(1201), STALE);
        assert_eq!(stale.status.persisted_storage_version_hashes, ["Unknown", "A"]);
    }

    /// One apiserver of three rolled back after the state converged: discovery shows its
    /// hash now and then, never on enough polls in a row to be trusted, but the objects it
    /// writes are stored in it. The state lists it from the first poll that shows it, and keeps
    /// it while it shows: a proof of the current hash does not collapse the list then.
    #[test]
    fn every_hash_seen_is_persisted_though_only_a_trusted_one_is_current() {
        let converged = status(&["B"], 0);
        let rolled_back = next_status(Some(&converged), "B", "A", false, ts(10), STALE);
        assert_eq!(rolled_back.status.persisted_storage_version_hashes, ["B", "A"]);
        assert_eq!(rolled_back.status.current_storage_version_hash.as_deref(), Some("B"));
        assert!(rolled_back.persisted_changed && rolled_back.other_seen && rolled_back.stamps());
        assert!(needs_migration(&rolled_back.status, "B"));

        // Seen again: nothing more to append, but the persisted-since time moves all the same.
        let again = next_status(Some(&rolled_back.status), "B", "A", false, ts(20), STALE);
        assert!(!again.persisted_changed && again.stamps());
        // A proof of B while A still shows: kept.
        let proven = next_status(Some(&again.status), "B", "A", true, ts(30), STALE);
        assert_eq!(proven.status.persisted_storage_version_hashes, ["B", "A"]);
        // Once only B shows, a proof of B (of a run begun after A was last seen) collapses it.
        let settled = next_status(Some(&again.status), "B", "B", true, ts(40), STALE);
        assert_eq!(settled.status.persisted_storage_version_hashes, ["B"]);
        assert!(!settled.other_seen);

        // Migrations are created on the polls that see the current hash, for it.
        assert!(!migration_due(&rolled_back, "B") && !migration_due(&again, "B"));
        let between = next_status(Some(&again.status), "B", "B", false, ts(35), STALE);
        assert!(migration_due(&between, "B"));

        // A resource new to the trigger, first seen through the apiserver of the other release.
        let new = next_status(None, "B", "A", false, ts(0), STALE);
        assert_eq!(new.status.persisted_storage_version_hashes, ["Unknown", "B", "A"]);
    }

    /// Hashes alternating poll by poll (a flapping or stuck rolling upgrade) are never trusted,
    /// but both are persisted, so the StorageState never says one while objects are in the other.
    #[test]
    fn alternating_hashes_are_all_persisted() {
        let mut guard = Guard::default();
        let start = Instant::now();
        let mut state = status(&["A"], 0);
        guard.observe(&widgets(), "A", Some("A"), start, WINDOW);
        for i in 1..6u64 {
            let seen = if i % 2 == 0 { "A" } else { "B" };
            let at = start + Duration::from_secs(i * 7);
            let current = guard.observe(&widgets(), seen, Some("A"), at, WINDOW);
            let current = current.as_deref().unwrap_or("A");
            let seconds = i64::try_from(i * 7).unwrap_or(0);
            state = next_status(Some(&state), current, seen, false, ts(seconds), STALE).status;
        }
        assert_eq!(state.persisted_storage_version_hashes, ["A", "B"]);
        assert_eq!(state.current_storage_version_hash.as_deref(), Some("A"));
    }

    fn migration(
        targeted: &str,
        phase: &str,
        listed_from_start: bool,
        started: i64,
    ) -> StorageVersionMigration {
        let mut migration = StorageVersionMigration::new(
            "m",
            StorageVersionMigrationSpec {
                resource: crate::api::GroupVersionResource {
                    group: "example.com".into(),
                    version: "v2".into(),
                    resource: "widgets".into(),
                },
                continue_token: None,
            },
        );
        migration.status = Some(
            serde_json::from_value::<MigrationStatus>(serde_json::json!({
                "conditions": [{ "type": phase, "status": "True" }],
                "listedFromStart": listed_from_start,
                "startTime": Time(ts(started)),
            }))
            .unwrap(),
        );
        if let Some(status) = migration.status.as_mut() {
            status.target = Some(MigrationTarget {
                storage_version_hash: Some(targeted.into()),
                ..MigrationTarget::default()
            });
        }
        migration
    }

    #[test]
    fn only_a_whole_success_of_the_current_hash_proves_anything() {
        let since = Some(ts(100));
        assert!(proves(&migration("B", "Succeeded", true, 200), &widgets(), "B", since));
        // The late success of a migration that targeted the hash before.
        assert!(!proves(&migration("A", "Succeeded", true, 200), &widgets(), "B", since));
        assert!(!proves(&migration("B", "Failed", true, 200), &widgets(), "B", since));
        assert!(!proves(&migration("B", "Succeeded", false, 200), &widgets(), "B", since));
        // Started before the hashes last changed: objects may have been written since.
        assert!(!proves(&migration("B", "Succeeded", true, 50), &widgets(), "B", since));
        assert_eq!(
            proof(&migration("B", "Succeeded", true, 50), &widgets(), "B", since),
            Err(Unproven::StartedBefore)
        );
        // A state written by kube-storage-version-migrator has no such time.
        assert!(proves(&migration("B", "Succeeded", true, 50), &widgets(), "B", None));
        let other = GroupResource { group: "example.com".into(), resource: "gadgets".into() };
        assert!(!proves(&migration("B", "Succeeded", true, 200), &other, "B", since));
        // A run that began before the apiservers were shown to encode in the target.
        let mut unconfirmed = migration("B", "Succeeded", true, 200);
        if let Some(target) = unconfirmed.status.as_mut().and_then(|s| s.target.as_mut()) {
            target.encoding_confirmed = Some(false);
        }
        assert!(!proves(&unconfirmed, &widgets(), "B", since));
    }

    /// `persisted-since` is written with nanoseconds, a migration's `startTime` is stored to the
    /// second: the migration the trigger creates right after stamping starts in the same second.
    #[test]
    fn a_migration_started_in_the_second_of_the_stamp_proves() {
        let since = Some(Timestamp::new(1_800_000_100, 400_000_000).unwrap());
        assert!(proves(&migration("B", "Succeeded", true, 100), &widgets(), "B", since));
        assert!(!proves(&migration("B", "Succeeded", true, 99), &widgets(), "B", since));
    }

    #[test]
    fn failing_resources_are_tried_again_less_and_less_often() {
        let ended = |phase: &str, at: i64| {
            let mut m = migration("B", phase, true, at - 1);
            if let Some(status) = m.status.as_mut() {
                status.completion_time = Some(Time(ts(at)));
            }
            m
        };
        let (ok, failed1, failed2) =
            (ended("Succeeded", 10), ended("Failed", 20), ended("Failed", 30));
        let proved = |m: &StorageVersionMigration| proves(m, &widgets(), "B", None);
        assert_eq!(failures(&[&failed2, &ok, &failed1], proved), (2, Some(ts(30))));
        let after = ended("Succeeded", 40);
        assert_eq!(failures(&[&failed1, &failed2, &after], proved), (0, None));
        assert!(last_ended(&[&failed1, &after, &failed2]).is_some_and(|m| std::ptr::eq(m, &after)));
    }

    /// A status schema that keeps only `conditions` (kube-storage-version-migrator's CRD) makes
    /// every success prove nothing: each counts as a failure, so the trigger backs off instead
    /// of creating the same migration again and again.
    #[test]
    fn successes_that_prove_nothing_count_as_failures() {
        let pruned = |at: i64| {
            let mut m = migration("B", "Succeeded", true, at - 1);
            m.status = Some(
                serde_json::from_value::<MigrationStatus>(serde_json::json!({
                    "conditions": [{ "type": "Succeeded", "status": "True",
                                     "lastUpdateTime": Time(ts(at)) }],
                }))
                .unwrap(),
            );
            m
        };
        let (first, second) = (pruned(10), pruned(20));
        assert_eq!(proof(&first, &widgets(), "B", None), Err(Unproven::Unrecorded));
        let proved = |m: &StorageVersionMigration| proves(m, &widgets(), "B", None);
        assert_eq!(failures(&[&second, &first], proved), (2, Some(ts(20))));
        // Ordered by when they ended, from the condition when completionTime was dropped.
        assert!(last_ended(&[&second, &first]).is_some_and(|m| std::ptr::eq(m, &second)));
        // A success of another hash proves nothing about this one either.
        let mut late = migration("A", "Succeeded", true, 29);
        if let Some(status) = late.status.as_mut() {
            status.completion_time = Some(Time(ts(30)));
        }
        assert_eq!(proof(&late, &widgets(), "B", None), Err(Unproven::OtherTarget));
        assert_eq!(failures(&[&first, &late], proved), (2, Some(ts(30))));
    }

    #[test]
    fn only_unproven_successes_of_the_current_hash_in_a_row_are_counted() {
        const MADE_FOR: &str = "made-for";
        let ended = |targeted: &str, phase: &str, at: i64, hash: &str| {
            let mut m = migration(targeted, phase, true, at - 1);
            if let Some(status) = m.status.as_mut() {
                status.completion_time = Some(Time(ts(at)));
            }
            m.metadata.annotations = Some([(MADE_FOR.to_owned(), hash.to_owned())].into());
            m
        };
        let made_for = |hash: &'static str| {
            move |m: &StorageVersionMigration| {
                m.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(MADE_FOR))
                    .is_some_and(|h| h == hash)
            }
        };
        // Unproven: they targeted another hash than they were created for.
        let unproven = |at: i64| ended("A", "Succeeded", at, "B");
        let (a, b, c) = (unproven(10), unproven(20), unproven(30));
        let proved = |m: &StorageVersionMigration| proves(m, &widgets(), "B", None);
        assert_eq!(unproven_in_a_row(&[&c, &a, &b], made_for("B"), proved), 3);
        // A failure in between ends the row; so does a success that proves.
        let failed = ended("B", "Failed", 25, "B");
        assert_eq!(unproven_in_a_row(&[&a, &b, &failed, &c], made_for("B"), proved), 1);
        let good = ended("B", "Succeeded", 25, "B");
        assert!(proved(&good));
        assert_eq!(unproven_in_a_row(&[&a, &b, &good, &c], made_for("B"), proved), 1);
        // Made for another hash: not this hash's.
        assert_eq!(unproven_in_a_row(&[&a, &b, &c], made_for("C"), proved), 0);
    }

    #[test]
    fn heartbeats_are_written_when_something_changed_or_they_age() {
        let before = status(&["A"], 0);
        let beat = Duration::from_secs(300);
        let same = next_status(Some(&before), "A", "A", false, ts(60), STALE);
        assert!(!worth_writing(Some(&before), &same, beat));
        let later = next_status(Some(&before), "A", "A", false, ts(300), STALE);
        assert!(worth_writing(Some(&before), &later, beat));
        let changed = next_status(Some(&before), "B", "B", false, ts(60), STALE);
        assert!(worth_writing(Some(&before), &changed, beat));
        assert!(worth_writing(None, &same, beat));
    }

    #[test]
    fn names_follow_upstream() {
        assert_eq!(widgets().name(), "widgets.example.com");
        let secrets = GroupResource { group: String::new(), resource: "secrets".into() };
        assert_eq!(secrets.name(), "secrets");
    }
}
