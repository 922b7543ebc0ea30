//! How often the discovery trigger polls, and what a poll reads. A full poll reads every group's
//! discovery and lists the StorageStates, migrations and CRDs; while a new hash waits to be
//! trusted, the polls between the full ones are fast: they read only the discovery of the group
//! versions serving the waiting resources, and count what those show. A fast poll that changes
//! what waits (a hash trusted, the trusted hash shown again, a third hash, a resource not shown)
//! is followed at once by a full one, which writes what changed. Pure.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::api::GroupResource;

/// Trust periods the fast cadence lasts without a new hash trusted. A hash every apiserver
/// publishes is trusted within one period (the polls it asks for fit in it); one still waiting
/// after three is being contradicted again and again (a rollback that left one apiserver
/// behind), and polling it fast only costs the apiserver. The regular polls still look at it,
/// and a hash trusted, or nothing waiting once the three periods are over, arms the fast
/// cadence again.
pub(super) const FAST_PERIODS: u32 = 3;

/// A group version discovery serves: `("", "v1")` is the core API.
pub(super) type GroupVersion = (String, String);

/// The group versions a fast poll reads: those at which the last full poll found the
/// `waiting` resources (`found_at`, by resource). `None` when one of them was not found there
/// (a full poll reads everything), or when nothing waits.
pub(super) fn fast_reads(
    waiting: &[GroupResource],
    found_at: &HashMap<GroupResource, String>,
) -> Option<Vec<GroupVersion>> {
    let mut reads: Vec<GroupVersion> = Vec::new();
    for resource in waiting {
        let read = (resource.group.clone(), found_at.get(resource)?.clone());
        if !reads.contains(&read) {
            reads.push(read);
        }
    }
    (!reads.is_empty()).then_some(reads)
}

/// Whether a fast poll calls for a full poll at once: the hashes waiting before it (`before`)
/// are not exactly those waiting after it (`after`), or it did not show each of them with its
/// waiting hash (`shown`, by resource).
pub(super) fn needs_full_poll(
    before: &[(GroupResource, String)],
    shown: &HashMap<GroupResource, String>,
    after: &[(GroupResource, String)],
) -> bool {
    let same = before.len() == after.len() && before.iter().all(|waiting| after.contains(waiting));
    !same || before.iter().any(|(resource, hash)| shown.get(resource) != Some(hash))
}

/// The stretch of polling at the fast cadence: it begins when a hash starts to wait and lasts
/// [`FAST_PERIODS`] trust periods unless a hash is trusted.
#[derive(Debug, Default)]
pub(super) struct Cadence {
    /// When the current stretch began.
    since: Option<Instant>,
}

impl Cadence {
    /// Records a poll at `now`: whether a hash waits after it (`waiting`), whether it trusted a
    /// new one (`trusted`), and how long a trust takes (`period`).
    pub(super) fn record(&mut self, now: Instant, waiting: bool, trusted: bool, period: Duration) {
        let over =
            self.since.is_some_and(|since| now.duration_since(since) >= period * FAST_PERIODS);
        if trusted || (!waiting && over) {
            self.since = None;
        }
        if waiting && self.since.is_none() {
            self.since = Some(now);
        }
    }

    /// Whether the next poll may come at the fast cadence, at `now`.
    pub(super) fn fast(&self, now: Instant, period: Duration) -> bool {
        self.since.is_some_and(|since| now.duration_since(since) < period * FAST_PERIODS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(group: &str, plural: &str) -> GroupResource {
        GroupResource { group: group.into(), resource: plural.into() }
    }

    #[test]
    fn a_fast_poll_reads_only_the_group_versions_serving_what_waits() {
        let found_at: HashMap<GroupResource, String> = [
            (resource("", "configmaps"), "v1"),
            (resource("", "secrets"), "v1"),
            (resource("apps", "deployments"), "v1"),
            (resource("example.com", "widgets"), "v2"),
            (resource("example.com", "gadgets"), "v1beta1"),
        ]
        .into_iter()
        .map(|(r, v)| (r, v.to_owned()))
        .collect();
        let gv = |g: &str, v: &str| (g.to_owned(), v.to_owned());
        let cases: [(&[GroupResource], Option<Vec<GroupVersion>>); 6] = [
            (&[], None),
            (&[resource("", "secrets")], Some(vec![gv("", "v1")])),
            (&[resource("", "secrets"), resource("", "configmaps")], Some(vec![gv("", "v1")])),
            (
                &[resource("example.com", "widgets"), resource("example.com", "gadgets")],
                Some(vec![gv("example.com", "v2"), gv("example.com", "v1beta1")]),
            ),
            (
                &[resource("apps", "deployments"), resource("", "secrets")],
                Some(vec![gv("apps", "v1"), gv("", "v1")]),
            ),
            // Never found at a version: only a full poll knows where to look.
            (&[resource("", "secrets"), resource("example.com", "sprockets")], None),
        ];
        for (waiting, reads) in cases {
            assert_eq!(fast_reads(waiting, &found_at), reads, "{waiting:?}");
        }
    }

    #[test]
    fn a_fast_poll_that_changes_what_waits_calls_for_a_full_one() {
        let w = |plural: &str, hash: &str| (resource("", plural), hash.to_owned());
        let shown = |pairs: &[(&str, &str)]| -> HashMap<GroupResource, String> {
            pairs.iter().map(|(p, h)| (resource("", p), (*h).to_owned())).collect()
        };
        let before = [w("secrets", "new"), w("configmaps", "new")];
        let cases: [(&str, HashMap<GroupResource, String>, Vec<_>, bool); 6] = [
            (
                "each shows its waiting hash",
                shown(&[("secrets", "new"), ("configmaps", "new")]),
                before.to_vec(),
                false,
            ),
            (
                "one was trusted",
                shown(&[("secrets", "new"), ("configmaps", "new")]),
                vec![w("configmaps", "new")],
                true,
            ),
            (
                "one shows the trusted hash again",
                shown(&[("secrets", "old"), ("configmaps", "new")]),
                vec![w("configmaps", "new")],
                true,
            ),
            (
                "one shows a third hash",
                shown(&[("secrets", "third"), ("configmaps", "new")]),
                vec![w("secrets", "third"), w("configmaps", "new")],
                true,
            ),
            ("one is not shown", shown(&[("configmaps", "new")]), before.to_vec(), true),
            (
                "another resource shows up besides",
                shown(&[("secrets", "new"), ("configmaps", "new"), ("pods", "x")]),
                before.to_vec(),
                false,
            ),
        ];
        for (case, shown, after, full) in cases {
            assert_eq!(needs_full_poll(&before, &shown, &after), full, "{case}");
        }
    }

    #[test]
    fn the_fast_cadence_ends_after_three_trust_periods_without_a_hash_trusted() {
        let period = Duration::from_secs(10);
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut cadence = Cadence::default();
        assert!(!cadence.fast(at(0), period), "nothing waits yet");
        cadence.record(at(0), true, false, period);
        assert!(cadence.fast(at(1), period));
        // The trusted hash shown again, and the new one again: the stretch goes on.
        cadence.record(at(5), false, false, period);
        cadence.record(at(6), true, false, period);
        assert!(cadence.fast(at(29), period));
        assert!(!cadence.fast(at(30), period), "three periods without a hash trusted");
        cadence.record(at(40), true, false, period);
        assert!(!cadence.fast(at(41), period), "still the same stretch");
        // Nothing waits once the stretch is over: the next hash to wait gets a stretch again.
        cadence.record(at(50), false, false, period);
        cadence.record(at(60), true, false, period);
        assert!(cadence.fast(at(61), period));
        // A hash trusted starts a stretch for the next one at once.
        cadence.record(at(100), true, false, period);
        assert!(!cadence.fast(at(100), period));
        cadence.record(at(101), true, true, period);
        assert!(cadence.fast(at(102), period));
    }
}
