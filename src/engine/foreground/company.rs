//! Whether the gentle writes have the apiserver to themselves: no other client writes.
//!
//! Every answer to a write carries etcd's revision after it (its resourceVersion), and that
//! revision counts every write of every client. Between two looks the highest revision kube-svm's
//! answers carried moves by kube-svm's own writes and everyone else's, and kube-svm knows its
//! own: the migrations' and the probe's (which also writes in the quiet window before the first
//! migration write) by their revisions; its records, Events and lease by their count, which a
//! look takes at its own time (records answered after the last migration write before it are
//! taken from that span, a write's spacing early). A run with no company is paced by its write
//! window alone, as `fast` is; a client that starts writing is seen within two looks (one marks
//! the span, the next judges it). Pure: time is passed in.
//!
//! A client that only reads is not seen; `alone_below=0` turns this off.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

/// A span shorter than this is not marked: a client writing a few times a second may write
/// nothing in it, and the first look after the first write would judge that write alone.
const SHORTEST_SPAN: Duration = Duration::from_millis(500);

/// Other clients' writes, as kube-svm's answers show them.
///
/// Each look marks the highest revision answered so far, and judges the span between the two
/// marks before: by then the answers to kube-svm's writes in it have come back, however many
/// were in flight, so none of them is taken for another client's.
#[derive(Clone, Debug, Default)]
pub struct Company {
    /// The highest revision an answer carried.
    top: Option<u64>,
    /// The revisions of kube-svm's writes past the older mark.
    ours: BTreeSet<u64>,
    /// The last two looks' marks, older first.
    marks: Vec<Mark>,
    /// Other clients' writes per second in the last span judged.
    others: Option<f64>,
}

/// What one look saw.
#[derive(Clone, Copy, Debug)]
struct Mark {
    at: Instant,
    /// The highest revision answered by then.
    top: u64,
    /// The process's writes outside the engine answered by then.
    own: u64,
}

impl Company {
    /// One of kube-svm's writes was answered with `revision` at `now`. The first one makes the
    /// first mark, so that the looks can tell sooner.
    pub fn wrote(&mut self, now: Instant, revision: u64) {
        if self.marks.is_empty() {
            self.marks.push(Mark { at: now, top: revision.saturating_sub(1), own: 0 });
        }
        if self.marks.first().is_some_and(|oldest| revision > oldest.top) {
            self.ours.insert(revision);
        }
        self.top = Some(self.top.map_or(revision, |top| top.max(revision)));
    }

    /// Other clients' writes per second, as last judged.
    pub fn others(&self) -> Option<f64> {
        self.others
    }

    /// A look at `now`, the process having made `own` writes outside the engine so far:
    /// whether others wrote fewer than `below` writes per second in the last span judged.
    /// Unknown (too few answers yet) counts as company.
    pub fn look(&mut self, now: Instant, below: f64, own: u64) -> bool {
        let Some(top) = self.top else { return false };
        if self.marks.last().is_some_and(|last| now.duration_since(last.at) < SHORTEST_SPAN) {
            return self.alone(below);
        }
        if let [older, newer] = self.marks[..] {
            if newer.top > older.top {
                let ours = self.ours.range(older.top + 1..=newer.top).count() as u64;
                let own = newer.own.saturating_sub(older.own);
                let theirs = (newer.top - older.top).saturating_sub(ours + own);
                let seconds = newer.at.duration_since(older.at).as_secs_f64();
                self.others = Some(theirs as f64 / seconds.max(f64::MIN_POSITIVE));
            }
            self.ours = self.ours.split_off(&(newer.top + 1));
            self.marks.remove(0);
        }
        self.marks.push(Mark { at: now, top, own });
        self.alone(below)
    }

    fn alone(&self, below: f64) -> bool {
        self.others.is_some_and(|others| others < below)
    }
}

/// The revision a write's answer carries: its resourceVersion, when it is etcd's (a number).
pub fn revision(body: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Answer {
        metadata: Metadata,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Metadata {
        resource_version: String,
    }
    let answer: Answer = serde_json::from_slice(body).ok()?;
    answer.metadata.resource_version.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Ends one second of 300 writes of kube-svm's and `theirs` of others' at `at`, from
    /// `revision`, with a look: whether alone.
    fn second(company: &mut Company, revision: &mut u64, at: Instant, theirs: u64) -> bool {
        *revision += theirs;
        for _ in 0..300 {
            *revision += 1;
            company.wrote(at, *revision);
        }
        company.look(at, 5.0, 0)
    }

    #[test]
    fn alone_once_a_span_judged_shows_others_wrote_less_than_the_threshold() {
        let (start, mut company, mut revision) = (Instant::now(), Company::default(), 100);
        company.wrote(start, revision);
        assert!(!second(&mut company, &mut revision, start + secs(1), 1), "nothing judged yet");
        assert_eq!(company.others(), None);
        assert!(second(&mut company, &mut revision, start + secs(2), 2), "the first span: 1/s");
        assert_eq!(company.others(), Some(1.0));
        assert!(second(&mut company, &mut revision, start + secs(3), 0));
        assert_eq!(company.others(), Some(2.0));
    }

    #[test]
    fn a_client_that_writes_is_company_once_its_span_is_judged() {
        let (start, mut company, mut revision) = (Instant::now(), Company::default(), 100);
        company.wrote(start, revision);
        for n in 1..=3 {
            second(&mut company, &mut revision, start + secs(n), 0);
        }
        assert!(
            second(&mut company, &mut revision, start + secs(4), 20),
            "judged: the span before"
        );
        assert!(!second(&mut company, &mut revision, start + secs(5), 0), "20 writes/s of another");
        assert_eq!(company.others(), Some(20.0));
        assert!(second(&mut company, &mut revision, start + secs(6), 0), "alone again");
    }

    #[test]
    fn a_look_right_after_the_first_write_judges_nothing() {
        let (start, mut company) = (Instant::now(), Company::default());
        company.wrote(start, 100);
        assert!(!company.look(start + Duration::from_millis(5), 5.0, 0));
        company.wrote(start + secs(1), 121);
        assert!(!company.look(start + secs(1), 5.0, 0), "the first span is marked, not judged");
        assert!(!company.look(start + secs(2), 5.0, 0), "101 to 120: another's, in a second");
        assert_eq!(company.others(), Some(20.0));
    }

    #[test]
    fn answers_that_come_back_after_the_look_are_still_counted_as_ours() {
        let (start, mut company) = (Instant::now(), Company::default());
        company.wrote(start, 100);
        // 101 to 105 are ours, 106 and 107 another client's; 104 and 105 are answered only after
        // the look that marked 108.
        for revision in [101, 102, 103, 108] {
            company.wrote(start, revision);
        }
        company.look(start + secs(1), 5.0, 0);
        company.wrote(start + secs(1), 104);
        company.wrote(start + secs(1), 105);
        company.wrote(start + secs(2), 109);
        company.look(start + secs(2), 5.0, 0);
        assert_eq!(company.others(), Some(2.0));
    }

    #[test]
    fn nothing_seen_is_company_and_a_threshold_of_zero_is_never_alone() {
        let (start, mut company) = (Instant::now(), Company::default());
        assert!(!company.look(start, 5.0, 0), "no answer yet");
        company.wrote(start, 100);
        company.look(start + secs(1), 5.0, 0);
        company.wrote(start + secs(1), 101);
        assert!(company.look(start + secs(2), 5.0, 0));
        assert!(!company.look(start + secs(3), 0.0, 0));
    }

    #[test]
    fn the_process_s_own_records_are_not_company() {
        let (start, mut company) = (Instant::now(), Company::default());
        company.wrote(start, 100);
        company.look(start + secs(1), 5.0, 0);
        // 101 to 150: 10 gentle writes, and 40 of the process's records.
        for revision in 141..=150 {
            company.wrote(start + secs(1), revision);
        }
        company.look(start + secs(2), 5.0, 40);
        // 151 to 190: 20 of the process's records and 20 writes of another client; then 191.
        company.wrote(start + secs(2), 191);
        assert!(company.look(start + secs(3), 5.0, 60), "101 to 150: all the process's own");
        assert_eq!(company.others(), Some(0.0));
        assert!(!company.look(start + secs(4), 5.0, 60), "151 to 191: another client's 20");
        assert_eq!(company.others(), Some(20.0));
    }

    #[test]
    fn the_revision_is_the_answers_resource_version_when_it_is_a_number() {
        let written = br#"{"kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"4711"}}"#;
        assert_eq!(revision(written), Some(4711));
        assert_eq!(revision(br#"{"metadata":{"resourceVersion":"opaque-1"}}"#), None);
        assert_eq!(revision(b"not json"), None);
    }
}
