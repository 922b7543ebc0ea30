//! What the discovery trigger does about each resource a poll discovers, decided without a
//! request ([`step`]): start the encoding check of a hash not yet trusted, write the resource's
//! StorageState when it moved or its heartbeat is due, and, where its migration is due (the
//! hash it trusts is not proven yet), wait for one in flight, back off after migrations that
//! ended without proving anything, or try one now ([`plan`]), unless the runs for its hash keep
//! proving nothing ([`held`]). Pure: each case is a row of a table test; the poll carries the
//! step out.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use kube::ResourceExt;

use super::found::Discovered;
use super::storage_state::{self, Unproven};
use super::{MAX_UNPROVEN, TARGET_HASH_ANNOTATION};
use crate::api::{PERSISTED_SINCE_ANNOTATION, Phase, StorageState, StorageVersionMigration};
use crate::rules::backoff::doubling;

/// What a poll knows of one resource it discovered.
pub struct Seen<'a> {
    /// The resource, its version and the hash this poll's apiserver publishes for it.
    pub found: &'a Discovered,
    /// Its StorageState, as listed by this poll.
    pub state: Option<&'a StorageState>,
    /// The hash the trigger trusts for it after this poll (shown on enough polls in a row).
    pub trusted: Option<String>,
    /// When the streak of polls that had `trusted` trusted began, when this poll ended it.
    pub streak: Option<Timestamp>,
    /// Whether it is a CRD's: the encoding check of its new hash starts at its storage switch.
    pub crd: bool,
}

/// The poll's times.
pub struct Timing {
    /// How long a hash not seen again stays among the persisted ones.
    pub stale_after: Duration,
    /// The least time between two heartbeats of a StorageState that did not change.
    pub beat: Duration,
    /// The wait after the first migration that proved nothing, doubling with each further one.
    pub first_wait: Duration,
    /// The longest wait.
    pub longest_wait: Duration,
}

/// What to do about one resource.
#[derive(Debug)]
pub struct Step<'a> {
    /// Start the encoding check of the hash seen: it is not trusted yet.
    pub check: bool,
    /// `None` while no hash is trusted: nothing more to do.
    pub trusted: Option<Trusted<'a>>,
}

/// What to do about a resource whose hash is trusted.
#[derive(Debug)]
pub struct Trusted<'a> {
    /// The hash trusted.
    pub current: String,
    /// Its StorageState's next status.
    pub next: storage_state::Next,
    /// Whether to write it: it moved, its heartbeat is due, or it is new.
    pub write: bool,
    /// The persisted-since time to annotate it with, when it moves.
    pub stamp: Option<Timestamp>,
    /// The time a migration must have begun after to prove `current`.
    pub since: Timestamp,
    /// Its migrations.
    pub of_resource: Vec<&'a StorageVersionMigration>,
    /// What to do about its migration; `None` when none is due.
    pub migration: Option<Plan<'a>>,
}

/// The step for the resource `seen`, whose kind's migrations are `migrations`, at `now`. Pure.
pub fn step<'a>(
    seen: &Seen<'_>,
    migrations: &'a [StorageVersionMigration],
    timing: &Timing,
    now: Timestamp,
) -> Step<'a> {
    let Discovered { resource, hash, .. } = seen.found;
    let check = seen.trusted.as_deref() != Some(hash.as_str()) && !seen.crd;
    let Some(current) = seen.trusted.clone() else { return Step { check, trusted: None } };
    let state = seen.state;
    let status = state.and_then(|s| s.status.as_ref());
    let recorded_since = state
        .and_then(|s| s.metadata.annotations.as_ref())
        .and_then(|a| a.get(PERSISTED_SINCE_ANNOTATION))
        .and_then(|t| t.parse::<Timestamp>().ok());
    let rewound = storage_state::persisted_since(recorded_since, seen.streak);
    // A state without that time (kube-storage-version-migrator's, or one whose annotation was
    // lost) gets it now: no migration that began earlier proves anything about it.
    let since = rewound.unwrap_or(now);
    let of_resource: Vec<&StorageVersionMigration> =
        migrations.iter().filter(|m| m.is_of(&resource.group, &resource.resource)).collect();
    let proof =
        |m: &StorageVersionMigration| storage_state::proof(m, resource, &current, Some(since));
    let proven = of_resource.iter().any(|m| proof(m).is_ok());
    // `hash` is what one apiserver publishes, trusted or not: persisted at once.
    let next = storage_state::next_status(status, &current, hash, proven, now, timing.stale_after);
    let stamp = match next.stamps() || recorded_since.is_none() {
        true => Some(now),
        false => rewound.filter(|_| rewound != recorded_since),
    };
    let write = stamp.is_some() || storage_state::worth_writing(status, &next, timing.beat);
    let migration = storage_state::migration_due(&next, &current)
        .then(|| plan(&of_resource, proof, timing.first_wait, timing.longest_wait, now));
    let trusted = Trusted { current, next, write, stamp, since, of_resource, migration };
    Step { check, trusted: Some(trusted) }
}

/// What to do about a resource whose migration is due.
#[derive(Debug)]
pub enum Plan<'a> {
    /// One of its migrations is pending or running: look again at the next follow-up.
    Busy,
    /// Its last `failures` migrations ended without proving anything: try again after `wait`.
    BackOff {
        wait: Duration,
        failures: u32,
        /// The last one, when it succeeded without proving anything, and why it proves nothing.
        unproven: Option<(&'a StorageVersionMigration, Unproven)>,
    },
    /// Try a migration now (unless the apiservers or kube-svm's access hold it back).
    Try,
}

/// The plan for a resource whose migrations are `of_resource`, at `now`: `proof` says whether
/// one proves its objects are stored in the trusted hash; the wait after the first failure is
/// `first_wait`, doubling with each further one, at most `longest_wait`. Pure.
pub fn plan<'a>(
    of_resource: &[&'a StorageVersionMigration],
    proof: impl Fn(&StorageVersionMigration) -> Result<(), Unproven>,
    first_wait: Duration,
    longest_wait: Duration,
    now: Timestamp,
) -> Plan<'a> {
    if of_resource.iter().any(|m| m.is_unfinished()) {
        return Plan::Busy;
    }
    let (failures, last_failure) = storage_state::failures(of_resource, |m| proof(m).is_ok());
    let retry = doubling(failures, first_wait, longest_wait);
    let since_failure = last_failure.map(|ended| now.duration_since(ended).unsigned_abs());
    let Some(wait) = since_failure.and_then(|elapsed| retry.checked_sub(elapsed)) else {
        return Plan::Try;
    };
    let last = storage_state::last_ended(of_resource);
    let succeeded = last.filter(|m| Phase::of(m) == Phase::Succeeded);
    let unproven = succeeded.and_then(|m| proof(m).err().map(|why| (m, why)));
    Plan::BackOff { wait, failures, unproven }
}

/// Why no migration is tried for the hash `current` though [`Plan::Try`] says so: the last
/// [`MAX_UNPROVEN`] or more of `of_resource` ran for it, against the apiservers answering now
/// (`apiservers`), and succeeded without proving anything (`proof` says). Runs that could not
/// prove anything while apiservers came and went (a rolling restart) say nothing of whether the
/// next one can. `None`: it is not held back by its history. Pure.
pub fn held(
    of_resource: &[&StorageVersionMigration],
    current: &str,
    apiservers: Option<&Vec<String>>,
    proof: impl Fn(&StorageVersionMigration) -> Result<(), Unproven>,
) -> Option<String> {
    let for_current = |m: &StorageVersionMigration| {
        let target = m.status.as_ref().and_then(|s| s.target.as_ref());
        let against = target.and_then(|t| t.apiservers.as_ref());
        m.annotations().get(TARGET_HASH_ANNOTATION).is_some_and(|h| *h == current)
            && apiservers.is_some_and(|now| against == Some(now))
    };
    let unproven = storage_state::unproven_in_a_row(of_resource, for_current, |m| proof(m).is_ok());
    (unproven >= MAX_UNPROVEN).then(|| format!(
        "{unproven} migrations in a row succeeded without proving the objects are stored in {current} (the last: {}); none is created for it again while the same apiservers answer: vouch for the encoding on a migration of your own (kube-svm.io/encoding-confirmed), or serve the StorageVersion API",
        storage_state::last_ended(of_resource)
            .and_then(|m| proof(m).err())
            .map_or("unknown", |why| why.reason())
    ))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::api::conditions::{FAILED, RUNNING, SUCCEEDED};
    use crate::api::in_state;

    /// A migration named `name` in state `type_`, ended (if it did) at `second`.
    fn ended(name: &str, type_: &str, second: i64) -> StorageVersionMigration {
        let mut migration = in_state(type_);
        migration.metadata.name = Some(name.into());
        if let Some(status) = migration.status.as_mut() {
            status.completion_time = Some(Time(Timestamp::from_second(second).unwrap()));
        }
        migration
    }

    /// A success proves the objects are stored in the hash unless its name says otherwise.
    fn proof(migration: &StorageVersionMigration) -> Result<(), Unproven> {
        match (Phase::of(migration), migration.metadata.name.as_deref()) {
            (Phase::Succeeded, Some("unproven")) => Err(Unproven::StartedBefore),
            (Phase::Succeeded, _) => Ok(()),
            _ => Err(Unproven::NotSucceeded),
        }
    }

    /// `plan` in a few words.
    fn told(plan: &Plan) -> String {
        match plan {
            Plan::Busy => "busy".to_owned(),
            Plan::Try => "try".to_owned(),
            Plan::BackOff { wait, failures, unproven } => {
                let why = unproven.map_or(String::new(), |(m, why)| {
                    format!(", {} proves nothing: {why:?}", m.metadata.name.as_deref().unwrap())
                });
                format!("back off {}s after {failures}{why}", wait.as_secs())
            }
        }
    }

    #[test]
    fn each_history_of_a_resource_gets_its_plan() {
        let minute = Duration::from_secs(60);
        let hour = Duration::from_secs(3600);
        #[rustfmt::skip]
        let rows: Vec<(&str, Vec<StorageVersionMigration>, i64, &str)> = vec![
            ("no migration yet", vec![], 1_000, "try"),
            ("one in flight", vec![ended("a", FAILED, 900), in_state(RUNNING)], 1_000, "busy"),
            ("a failure waits out the first wait", vec![ended("a", FAILED, 990)], 1_000, "back off 50s after 1"),
            ("failures in a row double the wait", vec![ended("a", FAILED, 900), ended("b", FAILED, 990)], 1_000, "back off 110s after 2"),
            ("no longer than the longest wait", (0..12).map(|i| ended("a", FAILED, 900 + i)).collect(), 1_000, "back off 3511s after 12"),
            ("a failure whose wait is over", vec![ended("a", FAILED, 900)], 1_000, "try"),
            ("a success that proves nothing counts as a failure, and says why", vec![ended("unproven", SUCCEEDED, 990)], 1_000,
                "back off 50s after 1, unproven proves nothing: StartedBefore"),
            ("a success that proves ends the failures", vec![ended("a", FAILED, 900), ended("b", SUCCEEDED, 990)], 1_000, "try"),
        ];
        for (what, migrations, now, expected) in rows {
            let of_resource: Vec<&StorageVersionMigration> = migrations.iter().collect();
            let now = Timestamp::from_second(now).unwrap();
            let plan = plan(&of_resource, proof, minute, hour, now);
            assert_eq!(told(&plan), expected, "{what}");
        }
    }

    /// Widgets, discovered with the hash `hash`.
    fn widgets(hash: &str) -> Discovered {
        Discovered {
            resource: crate::api::GroupResource {
                group: "example.com".into(),
                resource: "widgets".into(),
            },
            kind: "Widget".into(),
            version: "v1".into(),
            hash: hash.into(),
        }
    }

    /// The widgets' StorageState: `persisted`, `current`, its heartbeat at `beat` and its
    /// persisted-since time at `since` (seconds).
    fn state(persisted: &[&str], current: &str, beat: i64, since: i64) -> StorageState {
        let mut state = StorageState::new("widgets.example.com", Default::default());
        let since = Timestamp::from_second(since).unwrap().to_string();
        state.metadata.annotations = Some([(PERSISTED_SINCE_ANNOTATION.to_owned(), since)].into());
        state.status = Some(crate::api::StorageStateStatus {
            persisted_storage_version_hashes: persisted.iter().map(|h| h.to_string()).collect(),
            current_storage_version_hash: Some(current.into()),
            last_heartbeat_time: Some(Time(Timestamp::from_second(beat).unwrap())),
        });
        state
    }

    /// A migration of the widgets in state `type_`, listed from the start for `hash`, started
    /// at `second`.
    fn of_widgets(type_: &str, hash: &str, second: i64) -> StorageVersionMigration {
        let mut migration = ended("m", type_, second + 10);
        migration.spec.resource.group = "example.com".into();
        migration.spec.resource.resource = "widgets".into();
        if let Some(status) = migration.status.as_mut() {
            status.start_time = Some(Time(Timestamp::from_second(second).unwrap()));
            status.listed_from_start = Some(true);
            status.target = Some(crate::api::MigrationTarget {
                storage_version_hash: Some(hash.into()),
                ..Default::default()
            });
        }
        migration
    }

    /// `step` in a few words.
    fn told_step(step: &Step) -> String {
        let mut words = Vec::new();
        if step.check {
            words.push("check".to_owned());
        }
        if let Some(trusted) = &step.trusted {
            let persisted = &trusted.next.status.persisted_storage_version_hashes;
            match (trusted.write, trusted.stamp.is_some()) {
                (true, true) => words.push(format!("write {persisted:?} stamped")),
                (true, false) => words.push(format!("write {persisted:?}")),
                (false, _) => {}
            }
            words.extend(trusted.migration.as_ref().map(told));
        }
        words.join(", ")
    }

    /// What it is, the hash seen, the hash trusted, whether a CRD's, its state, its migrations,
    /// and its step in a few words.
    type Row<'a> = (
        &'a str,
        &'a str,
        Option<&'a str>,
        bool,
        Option<&'a StorageState>,
        Vec<StorageVersionMigration>,
        &'a str,
    );

    #[test]
    fn each_resource_a_poll_sees_gets_its_step() {
        let timing = Timing {
            stale_after: Duration::from_secs(600),
            beat: Duration::from_secs(30),
            first_wait: Duration::from_secs(2),
            longest_wait: Duration::from_secs(60),
        };
        let now = 10_000;
        let fresh = state(&["h1"], "h1", now - 10, 5_000);
        let switched = state(&["h1", "h2"], "h2", now - 10, 9_000);
        let beat_due = state(&["h1"], "h1", now - 40, 5_000);
        let stale = state(&["h1"], "h1", now - 700, 5_000);
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            ("a hash not trusted yet: its encoding check starts", "h2", None, false, Some(&fresh), vec![], "check"),
            ("a CRD's hash not trusted yet: its check starts at its switch", "h2", None, true, Some(&fresh), vec![], ""),
            ("a new resource: its state, and a migration", "h1", Some("h1"), false, None, vec![],
                r#"write ["Unknown", "h1"] stamped, try"#),
            ("proven, its heartbeat recent: nothing", "h1", Some("h1"), false, Some(&fresh), vec![], ""),
            ("proven, its heartbeat due", "h1", Some("h1"), false, Some(&beat_due), vec![],
                r#"write ["h1"]"#),
            ("stale: anything may have been written", "h1", Some("h1"), false, Some(&stale), vec![],
                r#"write ["Unknown", "h1"] stamped, try"#),
            ("a switch trusted: a migration", "h2", Some("h2"), false, Some(&fresh), vec![],
                r#"write ["h1", "h2"] stamped, try"#),
            ("a migration in flight", "h2", Some("h2"), false, Some(&switched), vec![of_widgets(RUNNING, "h2", 9_500)], "busy"),
            ("a success that began after the stamp proves it", "h2", Some("h2"), false, Some(&switched),
                vec![of_widgets(SUCCEEDED, "h2", 9_500)], r#"write ["h2"] stamped"#),
            ("a success that began before the stamp proves nothing: another", "h2", Some("h2"), false, Some(&switched),
                vec![of_widgets(SUCCEEDED, "h2", 8_500)], "try"),
            ("a failure a second ago: back off", "h2", Some("h2"), false, Some(&switched),
                vec![of_widgets(FAILED, "h2", now - 11)], "back off 1s after 1"),
            ("another hash shown than the one trusted: its check, and no migration yet", "h1", Some("h2"), false,
                Some(&switched), vec![], r#"check, write ["h1", "h2"] stamped"#),
        ];
        for (what, hash, trusted, crd, state, migrations, expected) in rows {
            let found = widgets(hash);
            let trusted = trusted.map(str::to_owned);
            let seen = Seen { found: &found, state, trusted, streak: None, crd };
            let now = Timestamp::from_second(now).unwrap();
            let step = step(&seen, &migrations, &timing, now);
            assert_eq!(told_step(&step), expected, "{what}");
        }
    }

    #[test]
    fn the_stamp_goes_back_to_a_streak_and_a_state_without_one_gets_it_now() {
        let timing = Timing {
            stale_after: Duration::from_secs(600),
            beat: Duration::from_secs(30),
            first_wait: Duration::from_secs(2),
            longest_wait: Duration::from_secs(60),
        };
        let at = |second: i64| Timestamp::from_second(second).unwrap();
        let found = widgets("h2");
        let switched = state(&["h1", "h2"], "h2", 9_990, 9_000);
        // Polls since 8,000 showed h2 alone, each stamping its time: a success that began at
        // 8,500 proves it.
        let proven = vec![of_widgets(SUCCEEDED, "h2", 8_500)];
        let trusted = Some("h2".to_owned());
        let seen = Seen {
            found: &found,
            state: Some(&switched),
            trusted,
            streak: Some(at(8_000)),
            crd: false,
        };
        let trusted = step(&seen, &proven, &timing, at(10_000)).trusted.expect("trusted");
        assert_eq!(trusted.since, at(8_000));
        assert!(trusted.migration.is_none(), "proven: no migration due");
        let persisted = &trusted.next.status.persisted_storage_version_hashes;
        assert_eq!(persisted, &["h2"]);
        // Without the streak, the time recorded (9,000) stands: the same success proves nothing.
        let trusted = Some("h2".to_owned());
        let seen =
            Seen { found: &found, state: Some(&switched), trusted, streak: None, crd: false };
        let trusted = step(&seen, &proven, &timing, at(10_000)).trusted.expect("trusted");
        assert_eq!(trusted.since, at(9_000));
        assert!(matches!(trusted.migration, Some(Plan::Try)), "{:?}", trusted.migration);
        // kube-storage-version-migrator's state carries no time: it gets now, and no migration
        // that began earlier proves anything.
        let mut unstamped = switched.clone();
        unstamped.metadata.annotations = None;
        let trusted = Some("h2".to_owned());
        let seen =
            Seen { found: &found, state: Some(&unstamped), trusted, streak: None, crd: false };
        let trusted = step(&seen, &proven, &timing, at(10_000)).trusted.expect("trusted");
        assert_eq!((trusted.since, trusted.stamp), (at(10_000), Some(at(10_000))));
        assert!(matches!(trusted.migration, Some(Plan::Try)), "{:?}", trusted.migration);
    }

    /// A success for the hash `hash` against the apiservers `against` that proves nothing.
    fn unproven(hash: &str, against: &str, second: i64) -> StorageVersionMigration {
        let mut migration = ended("unproven", SUCCEEDED, second);
        migration.metadata.annotations =
            Some([(TARGET_HASH_ANNOTATION.to_owned(), hash.to_owned())].into());
        if let Some(status) = migration.status.as_mut() {
            status.target = Some(crate::api::MigrationTarget {
                apiservers: Some(vec![against.to_owned()]),
                ..Default::default()
            });
        }
        migration
    }

    #[test]
    fn runs_for_the_hash_that_keep_proving_nothing_hold_the_next_back() {
        let now = vec!["apiserver-1".to_owned()];
        #[rustfmt::skip]
        let rows: Vec<(&str, Vec<StorageVersionMigration>, bool)> = vec![
            ("three in a row", (0..3).map(|i| unproven("h1", "apiserver-1", i)).collect(), true),
            ("two in a row", (0..2).map(|i| unproven("h1", "apiserver-1", i)).collect(), false),
            ("one of them against other apiservers",
                vec![unproven("h1", "apiserver-1", 0), unproven("h1", "apiserver-0", 1), unproven("h1", "apiserver-1", 2)], false),
            ("one of them for another hash",
                vec![unproven("h1", "apiserver-1", 0), unproven("h1", "apiserver-1", 1), unproven("h0", "apiserver-1", 2)], false),
            ("a failure last", (0..3).map(|i| unproven("h1", "apiserver-1", i)).chain([ended("a", FAILED, 9)]).collect(), false),
        ];
        for (what, migrations, is_held) in rows {
            let of_resource: Vec<&StorageVersionMigration> = migrations.iter().collect();
            let why = held(&of_resource, "h1", Some(&now), proof);
            assert_eq!(why.is_some(), is_held, "{what}: {why:?}");
        }
        let three: Vec<StorageVersionMigration> =
            (0..3).map(|i| unproven("h1", "apiserver-1", i)).collect();
        let of_resource: Vec<&StorageVersionMigration> = three.iter().collect();
        assert_eq!(held(&of_resource, "h1", None, proof), None, "no apiservers known: not held");
        let why = held(&of_resource, "h1", Some(&now), proof).unwrap_or_default();
        assert!(
            why.starts_with("3 migrations in a row")
                && why.contains(Unproven::StartedBefore.reason()),
            "{why}"
        );
    }
}
