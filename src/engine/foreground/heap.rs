//! The gentle pace's ceiling from the apiserver's heap, where kube-svm may read its `/metrics`.
//!
//! The apiserver collects its heap each time its clients have made it allocate so much, and each
//! gentle write makes it allocate some: decoding, the schema, `managedFields`, the watch event
//! (hundreds of KiB for a merge patch of a small custom resource). How much between two
//! collections is measured too (`go_memstats_alloc_bytes_total` over `go_gc_duration_seconds`'
//! count): Go starts a collection before its heap reaches its goal (`go_gc_heap_goal_bytes`),
//! so the headroom (the goal less `go_gc_heap_live_bytes`) only bounds it. A collection of a
//! small heap passes unseen; one of a large heap is a spell every client feels, and at 100,000
//! objects the foreground's minutes past its budget were the minutes in which the apiserver
//! collected twice or more (docs/performance.md). So where the headroom is large ([`COSTLY`]),
//! the writes are held to the rate at which the apiserver collects at most once a minute
//! ([`EVERY`]), what its other clients make it allocate included, and to no less than
//! [`LEAST_SHARE`] of that for kube-svm's own.
//!
//! What a write costs is measured, not assumed: the apiserver's allocation over the last minute
//! ([`WINDOW`]), less what it allocates without kube-svm's writes (measured in the pace's quiet
//! windows, in which no gentle write goes), per write sent meanwhile. A burst of the other
//! clients' allocation reads as a costlier write, the more so the fewer writes went meanwhile,
//! and a ceiling lowered by it would lower the writes and raise the next reading again (measured
//! at 100,000 objects: from 0.45 to 15 MiB a write in 30 s, and the rate at its minimum). So
//! the cost is a low quantile ([`COST_QUANTILE`]) of the last minutes' readings
//! ([`COSTS_OVER`]): what a write costs is the resource's, and does not change in a minute. Not
//! the median: at 100,000 objects the apiserver's own consistency check (every object listed
//! from etcd every 5 minutes, its collections for 2 to 3 minutes after) touched half of the
//! readings, and their median read 0.44 to 0.48 MiB, then flipped between 0.43 and 2.09, where
//! the 25th percentile held at 0.46 through the minutes it ran.
//!
//! Each apiserver process is judged by its own counters: behind a load balancer every one of
//! them allocates for kube-svm's writes (their watch events), and the ceiling is the least of
//! theirs.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// A collection of a heap with this much headroom or more is a spell the apiserver's clients
/// feel. At 100,000 objects (2.2 to 3.8 GiB of heap in use, of which Go leaves about half as
/// headroom at its default `GOGC=100`) the minutes with two collections or more were past the
/// foreground's budget; at 12,000 (0.6 to 0.9 GiB in use) eight to thirteen a minute were not.
pub const COSTLY: f64 = 1024.0 * 1024.0 * 1024.0;

/// The apiserver collects a costly heap at most once this often.
pub const EVERY: Duration = Duration::from_secs(60);

/// The least share of [`EVERY`]'s collection left to kube-svm's writes, however much the
/// apiserver's other clients make it allocate: a migration always goes on.
pub const LEAST_SHARE: f64 = 0.25;

/// How far back the apiserver's allocation is measured.
pub const WINDOW: Duration = Duration::from_secs(60);

/// How far back what it allocates between two collections is measured, over at least
/// [`FEWEST_COLLECTIONS`]: fewer in that time, and its collections are rare.
pub const COLLECTED_OVER: Duration = Duration::from_secs(300);
const FEWEST_COLLECTIONS: f64 = 2.0;

/// How long each reading of what a write costs is kept, and the quantile of them taken.
pub const COSTS_OVER: Duration = Duration::from_secs(600);
pub const COST_QUANTILE: f64 = 0.25;

/// Less than this span, or fewer writes than [`FEWEST_WRITES`] in it, says nothing of what a
/// write costs.
const SHORTEST: Duration = Duration::from_secs(20);
const FEWEST_WRITES: u64 = 50;

/// Quiet measurements kept, the median of which is the apiserver's allocation without kube-svm's
/// writes.
const QUIET_KEPT: usize = 5;

/// A quiet measurement shorter than this says nothing.
const SHORTEST_QUIET: Duration = Duration::from_millis(500);

/// A process not read for this long no longer bounds the rate.
const STALE_AFTER: Duration = Duration::from_secs(15);

/// Processes kept, as the guard keeps them.
const PROCESSES: usize = 8;

/// Where a reading falls in the pace's quiet windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quiet {
    /// Outside one.
    No,
    /// At the start of one, past its settling.
    Begins,
    /// At its end.
    Ends,
}

/// What one reading of the apiserver's `/metrics` says of its heap.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counters {
    /// Bytes allocated so far (`go_memstats_alloc_bytes_total`).
    pub allocated: f64,
    /// Collections so far (`go_gc_duration_seconds_count`), where it says.
    pub collections: Option<f64>,
    /// What it may allocate before its next collection, at most (`go_gc_heap_goal_bytes` less
    /// `go_gc_heap_live_bytes`), where it says.
    pub headroom: Option<f64>,
}

/// What the heap lets the gentle writes do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ceiling {
    /// The apiserver's headroom before its next collection, in bytes.
    pub headroom: f64,
    /// What it allocates between two collections, in bytes: as measured over the last minutes
    /// ([`COLLECTED_OVER`]), and at most its headroom.
    pub per_collection: f64,
    /// What one gentle write made it allocate, in bytes, once measured: not while what its
    /// other clients make it allocate hides the writes' share.
    pub per_write: Option<f64>,
    /// The most writes per second, where its collections are costly.
    pub rate: Option<f64>,
}

/// One reading: when, what it says, the gentle writes sent so far.
#[derive(Clone, Copy, Debug)]
struct Sample {
    at: Instant,
    allocated: f64,
    collections: Option<f64>,
    writes: u64,
}

/// The readings of one apiserver process.
#[derive(Default)]
struct Process {
    /// Its readings over the last [`COLLECTED_OVER`], oldest first.
    window: VecDeque<Sample>,
    /// Its allocation rates (bytes per second) in quiet windows, newest last.
    quiet: VecDeque<f64>,
    /// The reading that began the quiet window under way.
    quiet_began: Option<Sample>,
    headroom: Option<f64>,
    /// What a write cost, as read over the last [`WINDOW`] at each reading, oldest first.
    costs: VecDeque<(Instant, f64)>,
}

/// The heap's memory: each apiserver process's readings.
#[derive(Default)]
pub struct Heap {
    processes: HashMap<u64, Process>,
}

impl Heap {
    /// Takes a reading of `process` at `now` (its `counters`), with `writes` gentle writes
    /// sent so far, `quiet` telling where it falls.
    pub fn read(
        &mut self,
        process: f64,
        counters: Counters,
        writes: u64,
        now: Instant,
        quiet: Quiet,
    ) {
        let key = process.to_bits();
        if self.processes.len() >= PROCESSES && !self.processes.contains_key(&key) {
            self.processes.clear();
        }
        let process = self.processes.entry(key).or_default();
        let Counters { allocated, collections, headroom } = counters;
        let sample = Sample { at: now, allocated, collections, writes };
        // A counter gone back is another process under the same start time: start again.
        let back = |last: &Sample| {
            last.allocated > allocated
                || last.collections.zip(collections).is_some_and(|(a, b)| a > b)
        };
        if process.window.back().is_some_and(back) {
            *process = Process::default();
        }
        process.headroom = headroom;
        process.window.push_back(sample);
        while process
            .window
            .front()
            .is_some_and(|first| now.duration_since(first.at) > COLLECTED_OVER)
        {
            process.window.pop_front();
        }
        if let Some(cost) = process.per_write(median(&process.quiet).unwrap_or(0.0)) {
            process.costs.push_back((now, cost));
        }
        while process.costs.front().is_some_and(|(at, _)| now.duration_since(*at) > COSTS_OVER) {
            process.costs.pop_front();
        }
        match quiet {
            Quiet::No => {}
            Quiet::Begins => process.quiet_began = Some(sample),
            Quiet::Ends => {
                // Quiet only if no gentle write went meanwhile.
                let began = process.quiet_began.take().filter(|began| began.writes == writes);
                let span = began.map(|began| (now.duration_since(began.at), began.allocated));
                if let Some((span, before)) = span.filter(|(span, _)| *span >= SHORTEST_QUIET) {
                    process.quiet.push_back((allocated - before) / span.as_secs_f64());
                    while process.quiet.len() > QUIET_KEPT {
                        process.quiet.pop_front();
                    }
                }
            }
        }
    }

    /// What the heap lets the writes do at `now`: the least ceiling of the processes read
    /// lately, or `None` when none can tell yet.
    pub fn ceiling(&self, now: Instant) -> Option<Ceiling> {
        let ceilings = self.processes.values().filter_map(|process| process.ceiling(now));
        ceilings.min_by(|a, b| {
            let rate = |c: &Ceiling| c.rate.unwrap_or(f64::INFINITY);
            rate(a).total_cmp(&rate(b))
        })
    }
}

impl Process {
    fn ceiling(&self, now: Instant) -> Option<Ceiling> {
        let last = self.window.back()?;
        if now.duration_since(last.at) > STALE_AFTER {
            return None;
        }
        let headroom = self.headroom?;
        let per_collection = self.per_collection().map_or(headroom, |bytes| bytes.min(headroom));
        // Without a quiet measurement yet, all of it is counted as the writes': the stricter.
        let others = median(&self.quiet).unwrap_or(0.0);
        let costs: Vec<f64> = self.costs.iter().map(|(_, cost)| *cost).collect();
        let per_write = quantile(costs, COST_QUANTILE);
        let once = per_collection / EVERY.as_secs_f64();
        let allowed = (once - others).max(once * LEAST_SHARE);
        let rate = per_write.filter(|_| headroom >= COSTLY).map(|per_write| allowed / per_write);
        Some(Ceiling { headroom, per_collection, per_write, rate })
    }

    /// What the apiserver allocated between two collections over the window, where it
    /// collected often enough to tell.
    fn per_collection(&self) -> Option<f64> {
        let counted = |sample: &&Sample| sample.collections.is_some();
        let first = self.window.iter().find(counted)?;
        let last = self.window.iter().rev().find(counted)?;
        let collections = last.collections? - first.collections?;
        (collections >= FEWEST_COLLECTIONS)
            .then(|| (last.allocated - first.allocated) / collections)
    }

    /// What a write made the apiserver allocate over the last [`WINDOW`], beyond what it
    /// allocates for its `others` (bytes a second).
    fn per_write(&self, others: f64) -> Option<f64> {
        let last = self.window.back()?;
        let first = self.window.iter().find(|s| last.at.duration_since(s.at) <= WINDOW)?;
        let span = last.at.duration_since(first.at);
        let writes = last.writes - first.writes;
        if span < SHORTEST || writes < FEWEST_WRITES {
            return None;
        }
        let seconds = span.as_secs_f64();
        let theirs = (last.allocated - first.allocated) / seconds - others;
        (theirs > 0.0).then(|| theirs * seconds / writes as f64)
    }
}

fn median(values: &VecDeque<f64>) -> Option<f64> {
    quantile(values.iter().copied().collect(), 0.5)
}

/// The `q` quantile (0 to 1) of `values`, nearest rank below.
fn quantile(mut values: Vec<f64>, q: f64) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let rank = (q * values.len() as f64) as usize;
    values.get(rank.min(values.len().saturating_sub(1))).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1024.0 * 1024.0;
    const GIB: f64 = 1024.0 * MIB;

    /// Readings of one process every 5 s for a minute: `others` bytes a second allocated
    /// without kube-svm, `per_write` more for each of `rate` writes a second, with a quiet
    /// measurement first.
    fn measured(others: f64, per_write: f64, rate: f64, headroom: f64) -> (Heap, Instant) {
        let start = Instant::now();
        let mut heap = Heap::default();
        heap.read(1.0, counters(0.0, headroom), 0, start, Quiet::Begins);
        let quiet_end = start + Duration::from_secs(2);
        heap.read(1.0, counters(others * 2.0, headroom), 0, quiet_end, Quiet::Ends);
        let (mut allocated, mut writes) = (others * 2.0, 0.0);
        let mut at = quiet_end;
        for _ in 0..12 {
            at += Duration::from_secs(5);
            allocated += 5.0 * (others + rate * per_write);
            writes += 5.0 * rate;
            heap.read(1.0, counters(allocated, headroom), writes as u64, at, Quiet::No);
        }
        (heap, at)
    }

    fn counters(allocated: f64, headroom: f64) -> Counters {
        Counters { allocated, collections: None, headroom: Some(headroom) }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn a_costly_heap_holds_the_writes_to_one_collection_a_minute_others_included() {
        // 1.5 GiB of headroom: 25.6 MiB/s for one collection a minute; others take 4 MiB/s.
        let (heap, now) = measured(4.0 * MIB, MIB, 30.0, 1.5 * GIB);
        let ceiling = heap.ceiling(now).expect("a ceiling");
        assert!(close(ceiling.per_write.expect("measured"), MIB), "{ceiling:?}");
        let expected = (1.5 * GIB / 60.0 - 4.0 * MIB) / MIB;
        assert!(close(ceiling.rate.expect("costly"), expected), "{ceiling:?}");
    }

    #[test]
    fn what_it_allocates_between_two_collections_is_measured_and_bounded_by_its_headroom() {
        let start = Instant::now();
        let mut heap = Heap::default();
        // 20 MiB/s, a collection every 30 s (600 MiB), 1.5 GiB of headroom: 20 writes a second,
        // 1 MiB each, nothing else.
        let read = |heap: &mut Heap, step: u32, collections: Option<f64>| {
            let at = start + Duration::from_secs(5) * step;
            let allocated = 100.0 * MIB * f64::from(step);
            let counters = Counters { allocated, collections, headroom: Some(1.5 * GIB) };
            heap.read(1.0, counters, 100 * u64::from(step), at, Quiet::No);
        };
        for step in 0..=11 {
            read(&mut heap, step, Some(f64::from(step / 6)));
        }
        let at = start + Duration::from_secs(55);
        assert_eq!(heap.ceiling(at).map(|c| c.per_collection), Some(1.5 * GIB), "one collection");
        read(&mut heap, 12, Some(2.0));
        let ceiling = heap.ceiling(start + Duration::from_secs(60)).expect("measured");
        assert!(close(ceiling.per_collection, 600.0 * MIB), "{ceiling:?}");
        // 10 MiB/s for one collection a minute: 10 writes a second.
        assert!(close(ceiling.rate.expect("costly"), 10.0), "{ceiling:?}");
        // A counter gone back: another process.
        read(&mut heap, 13, Some(0.0));
        assert_eq!(heap.processes[&1.0f64.to_bits()].window.len(), 1);
    }

    #[test]
    fn a_burst_of_the_other_clients_allocation_as_the_writes_slow_does_not_raise_their_cost() {
        let start = Instant::now();
        let mut heap = Heap::default();
        let (mut allocated, mut writes) = (0.0, 0u64);
        let mut read = |heap: &mut Heap, step: u32, bytes_a_second: f64, rate: u64| {
            allocated += 5.0 * bytes_a_second;
            writes += 5 * rate;
            let counters = Counters { allocated, collections: None, headroom: Some(1.5 * GIB) };
            let at = start + Duration::from_secs(5) * step;
            heap.read(1.0, counters, writes, at, Quiet::No);
        };
        // Five minutes of 30 writes a second at 1 MiB each, then one of 5 a second, with the
        // other clients allocating 40 MiB/s more.
        for step in 1..=60 {
            read(&mut heap, step, 30.0 * MIB, 30);
        }
        for step in 61..=72 {
            read(&mut heap, step, 45.0 * MIB, 5);
        }
        let ceiling = heap.ceiling(start + Duration::from_secs(360)).expect("measured");
        assert!(close(ceiling.per_write.expect("measured"), MIB), "{ceiling:?}");
    }

    #[test]
    fn a_small_heap_sets_no_rate_and_says_what_a_write_costs() {
        let (heap, now) = measured(4.0 * MIB, 0.4 * MIB, 30.0, 0.4 * GIB);
        let ceiling = heap.ceiling(now).expect("measured");
        assert_eq!(ceiling.rate, None);
        assert!(close(ceiling.per_write.expect("measured"), 0.4 * MIB), "{ceiling:?}");
    }

    #[test]
    fn others_that_take_the_whole_minute_leave_the_writes_a_quarter_of_it() {
        let (heap, now) = measured(40.0 * MIB, MIB, 30.0, 1.5 * GIB);
        let rate = heap.ceiling(now).and_then(|c| c.rate).expect("costly");
        assert!(close(rate, 1.5 * GIB / 60.0 * LEAST_SHARE / MIB), "{rate}");
    }

    #[test]
    fn without_a_quiet_measurement_all_the_allocation_is_the_writes() {
        let start = Instant::now();
        let mut heap = Heap::default();
        for i in 0..=12u32 {
            let at = start + Duration::from_secs(5) * i;
            // 10 MiB/s, 20 writes/s.
            let allocated = 50.0 * MIB * f64::from(i);
            heap.read(1.0, counters(allocated, 1.5 * GIB), 100 * u64::from(i), at, Quiet::No);
        }
        let ceiling = heap.ceiling(start + Duration::from_secs(60)).expect("a ceiling");
        assert!(close(ceiling.per_write.expect("measured"), 0.5 * MIB), "{ceiling:?}");
    }

    #[test]
    fn a_quiet_window_in_which_a_write_went_measures_nothing() {
        let start = Instant::now();
        let mut heap = Heap::default();
        heap.read(1.0, counters(0.0, GIB), 10, start, Quiet::Begins);
        heap.read(1.0, counters(MIB, GIB), 11, start + Duration::from_secs(2), Quiet::Ends);
        assert!(heap.processes.values().all(|process| process.quiet.is_empty()));
        heap.read(1.0, counters(MIB, GIB), 11, start + Duration::from_secs(3), Quiet::Begins);
        heap.read(1.0, counters(3.0 * MIB, GIB), 11, start + Duration::from_secs(5), Quiet::Ends);
        let quiet: Vec<f64> = heap.processes.values().flat_map(|p| p.quiet.clone()).collect();
        assert_eq!(quiet, vec![MIB]);
    }

    #[test]
    fn too_short_a_span_too_few_writes_or_too_old_a_reading_tell_nothing() {
        let (heap, now) = measured(4.0 * MIB, MIB, 30.0, 1.5 * GIB);
        assert!(heap.ceiling(now + STALE_AFTER + Duration::from_secs(1)).is_none(), "stale");
        let unmeasured = Some(Ceiling {
            headroom: 1.5 * GIB,
            per_collection: 1.5 * GIB,
            per_write: None,
            rate: None,
        });
        let (idle, now) = measured(4.0 * MIB, MIB, 0.5, 1.5 * GIB);
        assert_eq!(idle.ceiling(now), unmeasured, "30 writes in a minute");
        let start = Instant::now();
        let mut short = Heap::default();
        short.read(1.0, counters(0.0, 1.5 * GIB), 0, start, Quiet::No);
        short.read(1.0, counters(1e9, 1.5 * GIB), 500, start + Duration::from_secs(10), Quiet::No);
        assert_eq!(short.ceiling(start + Duration::from_secs(10)), unmeasured, "10 s");
        // Others allocating more in the quiet windows than the writes and they do at once.
        let (hidden, now) = measured(4.0 * MIB, 0.0, 30.0, 1.5 * GIB);
        assert_eq!(hidden.ceiling(now), unmeasured, "the writes' share hidden");
    }

    #[test]
    fn the_ceiling_is_the_least_of_the_processes_and_a_restart_starts_again() {
        let (mut heap, now) = measured(4.0 * MIB, MIB, 30.0, 1.5 * GIB);
        let one = heap.ceiling(now).and_then(|c| c.rate).expect("costly");
        // Another process, allocating twice as much per write, read over the same minute.
        let start = now - Duration::from_secs(60);
        for i in 0..=12u32 {
            let at = start + Duration::from_secs(5) * i;
            let writes = 150 * u64::from(i);
            heap.read(2.0, counters(2.0 * MIB * writes as f64, 1.5 * GIB), writes, at, Quiet::No);
        }
        let least = heap.ceiling(now).and_then(|c| c.rate).expect("costly");
        assert!(least < one, "{least} < {one}");
        // The first process's counter went back: its readings start again.
        heap.read(1.0, counters(0.0, 1.5 * GIB), 5000, now, Quiet::No);
        assert_eq!(heap.processes[&1.0f64.to_bits()].window.len(), 1);
    }
}
