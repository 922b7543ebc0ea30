//! What the discovery trigger does about a resource whose migration is due (the hash it trusts is
//! not proven yet), decided from the resource's migrations without a request: wait for one in
//! flight, back off after migrations that ended without proving anything, or try one now, unless
//! the runs for its hash keep proving nothing ([`held`]). Pure: each case is a row of a table
//! test; the poll carries the plan out.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use kube::ResourceExt;

use super::storage_state::{self, Unproven};
use super::{MAX_UNPROVEN, TARGET_HASH_ANNOTATION};
use crate::api::{Phase, StorageVersionMigration};
use crate::rules::backoff::doubling;

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
