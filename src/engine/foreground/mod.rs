//! The gentle pace, steered by what the apiserver's other clients feel rather than by
//! kube-svm's own writes: at one write in flight, kube-svm's own latency hardly moves while
//! every other client of a small apiserver waits.
//!
//! A probe task (`probe`), outside the write window, reads a small object often and writes it
//! now and then, as any client would ([`PROBE_OBJECT`]), and its latency is the signal. Gentle
//! writes pass through [`Foreground::admit`], which spaces them at the rate the law in
//! `steering` allows and now and then holds them all back for a quiet window, in which the probe
//! measures its baseline; no more of them are in flight than the rate needs (`flights`), so a
//! stall of the apiserver queues few of them. While no other client writes (`company`: the
//! revisions the answers carry), the gentle writes go as the write window allows, as `fast`
//! does, and the law waits. Every number is a field of [`ProbeParams`]. One
//! `Foreground` serves every gentle migration of the process: they share the rate, so two
//! migrations at once press the apiserver no harder than one.

mod company;
mod flights;
mod params;
mod probe;
mod steering;

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info};

use crate::api::Budget;
use crate::apiserver::own_writes::OwnWrites;
use crate::ops::metrics::Metrics;
use company::Company;
pub use company::revision;
pub use flights::Flight;
use flights::Flights;
pub use params::ProbeParams;
pub use steering::Why;
use steering::{Change, Steering, percentile};

/// The object the probe reads, and now and then writes: a ConfigMap of this name in kube-svm's
/// namespace (the chart creates it, and lets kube-svm `get` and `patch` it).
/// Where it does not exist or may not be written, the probe only reads: the apiserver answers a
/// read of a missing object from etcd all the same (a quorum read, as a client's plain GET is).
/// Its writes, a merge patch of the annotation [`PROBE_ANNOTATION`], go the way of a client's
/// update, etcd's commit included, so the probe feels what writes wait for, not only reads.
pub const PROBE_OBJECT: &str = "kube-svm-probe";

/// The annotation the probe's writes set on [`PROBE_OBJECT`]: how many probes had been sent.
pub const PROBE_ANNOTATION: &str = "kube-svm.io/probe";

/// A probe unanswered this long counts as this slow.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// The start of a quiet window that is not counted: writes in flight finish meanwhile.
const QUIET_SETTLE: Duration = Duration::from_millis(500);

/// How often the law looks at the probe (it changes the rate at most once a hold).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Probe samples kept, at most this old.
const KEEP: Duration = Duration::from_secs(60);

/// With no gentle write for this long, the probe rests.
const IDLE_AFTER: Duration = Duration::from_secs(10);

/// A migration's own budget counts this long after its last write.
const BUDGET_MEMORY: Duration = Duration::from_secs(10);

/// What the gentle pace last saw, for the status and `kube-svm status`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Steered {
    /// Writes per second allowed.
    pub rate: f64,
    /// Why the rate is what it is.
    pub why: Why,
    /// The probe's judged percentile since the rate last changed, when measured.
    pub probe: Option<Duration>,
    /// The latency it may reach.
    pub limit: Option<Duration>,
    /// Its quiet baseline.
    pub baseline: Option<Duration>,
    /// The budget the limit comes from.
    pub budget: Option<Budget>,
    /// Writes the rate may have in flight at once (0 before the law first looked).
    pub in_flight: usize,
    /// Other clients' writes per second, as the answers' revisions show them.
    pub others: Option<f64>,
}

// The rate is never NaN: it starts finite and is only multiplied and bounded.
impl Eq for Steered {}

impl fmt::Display for Steered {
    /// `24.0 objects/s (cut: the probe passed its budget); probe p99 13.1ms, budget 12.0ms (3x its
    /// quiet 4.0ms), 2 in flight at most`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| format!("{:.1}ms", d.as_secs_f64() * 1000.0);
        match (self.why, self.others) {
            (Why::Alone, Some(others)) => write!(
                f,
                "as fast as the write window allows ({}, {others:.1} writes/s by others); ",
                self.why
            )?,
            _ => write!(f, "{:.1} objects/s ({}); ", self.rate, self.why)?,
        }
        match self.probe {
            Some(probe) => write!(f, "probe p99 {}", ms(probe))?,
            None => write!(f, "probe p99 not measured yet")?,
        }
        match (self.limit, self.budget) {
            (Some(limit), Some(Budget::Relative(times))) => {
                let quiet = self.baseline.map_or_else(|| "?".to_owned(), ms);
                write!(f, ", budget {} ({times}x its quiet {quiet})", ms(limit))?;
            }
            (Some(limit), _) => write!(f, ", budget {}", ms(limit))?,
            (None, _) => write!(f, ", budget not measured yet")?,
        }
        if self.in_flight > 0 {
            write!(f, ", {} in flight at most", self.in_flight)?;
        }
        Ok(())
    }
}

/// The gentle pace's gate, and the probe behind it.
pub struct Foreground {
    /// The probe's client configuration: its client is made on its own thread.
    config: kube::Config,
    /// The probe's request path.
    path: String,
    /// The budget of a migration that gives none.
    budget: Budget,
    state: Mutex<State>,
    /// Writes waiting for a slot queue here, first come first served.
    turn: tokio::sync::Mutex<()>,
    /// Told when a gentle write in flight comes back.
    landed: tokio::sync::Notify,
    probing: AtomicBool,
    /// Probes sent so far, which says which is a write (one in `write_every`).
    probes: AtomicU64,
    write_every: u64,
    /// Whether a write of the probe is in flight.
    writing: AtomicBool,
    /// Whether the probe writes too: when it has a namespace of its own, until a write is
    /// refused (no such object, no permission).
    writes: AtomicBool,
    metrics: Arc<Metrics>,
}

struct State {
    params: ProbeParams,
    steering: Steering,
    /// The gentle writes in flight.
    flights: Flights,
    /// No write goes before this.
    next_slot: Instant,
    /// The current or the last quiet window.
    quiet_from: Instant,
    quiet_until: Instant,
    /// The next quiet window; `None` before the first write.
    next_quiet: Option<Instant>,
    /// Probe latencies outside quiet windows, by when they were answered.
    samples: VecDeque<(Instant, Duration)>,
    /// Probe latencies of the quiet window under way, past its settling.
    quiet: Vec<Duration>,
    /// Whether writes waited on the rate since the law last looked.
    waited: bool,
    last_write: Option<Instant>,
    last_look: Instant,
    /// The strictest budget asked for by a migration writing lately.
    strictest: Option<(Budget, Instant)>,
    /// Other clients' writes, and whether there were none to speak of: the writes then go as
    /// the write window allows, and the law waits.
    company: Company,
    alone: bool,
    /// The process's writes outside the engine, which are not another client's.
    own_writes: OwnWrites,
    seen: Steered,
}

impl Foreground {
    /// A gate probing the ConfigMap [`PROBE_OBJECT`] in `namespace` against `budget`, as the
    /// client of `config`, steered by `params`. The probe has a connection, a thread and a
    /// runtime of its own, so it waits in no queue of kube-svm's writes and for no worker busy
    /// with the engine's pages: its latency is the apiserver's, as another client feels it.
    pub fn new(
        config: kube::Config,
        namespace: Option<&str>,
        budget: Budget,
        params: ProbeParams,
        metrics: Arc<Metrics>,
    ) -> Self {
        // Without a namespace of its own, the probe reads in the kubeconfig's, and never writes:
        // a ConfigMap of that name there is someone else's.
        let writes = namespace.is_some();
        let namespace = namespace.unwrap_or(&config.default_namespace).to_owned();
        Foreground {
            config,
            path: format!("/api/v1/namespaces/{namespace}/configmaps/{PROBE_OBJECT}"),
            budget,
            state: Mutex::new(State::new(Instant::now(), params)),
            turn: tokio::sync::Mutex::new(()),
            landed: tokio::sync::Notify::new(),
            probing: AtomicBool::new(false),
            probes: AtomicU64::new(0),
            write_every: params.write_every,
            writing: AtomicBool::new(false),
            writes: AtomicBool::new(writes),
            metrics,
        }
    }

    /// The gate, with the process's writes outside the engine (`own_writes`) told from other
    /// clients': without them, its own records would pass for company.
    pub fn counting(self, own_writes: OwnWrites) -> Self {
        self.lock().own_writes = own_writes;
        self
    }

    /// Waits until a gentle write may go: with room in flight, after any quiet window under
    /// way, at the rate allowed. `budget` is the migration's own, if it gives one. The write is
    /// in flight until the [`Flight`] is dropped.
    pub async fn admit(self: &Arc<Self>, budget: Option<Budget>) -> Flight {
        self.start_probing();
        // One write at a time takes its slot, in turn: no slot is reserved ahead of the one
        // due, so a change of the rate applies from the next write on.
        let _turn = self.turn.lock().await;
        loop {
            loop {
                // Made before the look, so a landing in between is not missed.
                let landed = self.landed.notified();
                if self.lock().room() {
                    break;
                }
                landed.await;
            }
            let (until, admitted) = self.lock().admit(Instant::now(), budget, self.budget);
            tokio::time::sleep_until(until).await;
            // A slot taken before a quiet window began is given up: the window stays quiet.
            if admitted && self.lock().take_off(Instant::now()) {
                return Flight::new(Arc::clone(self));
            }
        }
    }

    /// Waits out a quiet window under way: a run's lists keep quiet in it too, or they would
    /// be measured as the cluster's own load.
    pub async fn quiet(&self) {
        let until = self.lock().quiet_until;
        tokio::time::sleep_until(until).await;
    }

    /// What the gentle pace last saw.
    pub fn seen(&self) -> Steered {
        self.lock().seen
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means another task panicked mid-update; the state is still valid.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    /// Before the first write: no quiet window yet, the starting rate.
    fn new(now: Instant, params: ProbeParams) -> State {
        State {
            params,
            steering: Steering::new(now, params),
            flights: Flights::new(params.headroom),
            next_slot: now,
            quiet_from: now,
            quiet_until: now,
            next_quiet: None,
            samples: VecDeque::new(),
            quiet: Vec::new(),
            waited: false,
            last_write: None,
            last_look: now,
            strictest: None,
            company: Company::default(),
            alone: false,
            own_writes: OwnWrites::default(),
            seen: Steered { rate: params.start_rate, ..Steered::default() },
        }
    }

    /// The admission of one write at `now`, of a migration with its own `budget` or the
    /// `default`: when to wake, and whether the write may then go.
    fn admit(&mut self, now: Instant, budget: Option<Budget>, default: Budget) -> (Instant, bool) {
        self.last_write = Some(now);
        if let Some(budget) = budget {
            // A stricter budget held lately stays, without being renewed by a looser one: it
            // lapses once its own migration has not written for a while.
            let baseline = self.steering.baseline();
            self.strictest = match self.strictest {
                Some((held, at))
                    if now.duration_since(at) < BUDGET_MEMORY
                        && budget.stricter(held, baseline) == held
                        && held != budget =>
                {
                    Some((held, at))
                }
                _ => Some((budget, now)),
            };
        }
        if now < self.quiet_until {
            return (self.quiet_until, false);
        }
        // Only a relative budget needs the baseline: the writes of a fixed one take no quiet
        // window of their own (they wait out one under way).
        let relative = matches!(budget.unwrap_or(default), Budget::Relative(_));
        if relative && !self.alone && self.next_quiet.is_none_or(|next| now >= next) {
            (self.quiet_from, self.quiet_until) = (now, now + self.params.quiet_for);
            // The first few come a hold apart, so that no one window makes the baseline.
            let apart = match self.steering.settled() {
                true => self.params.quiet_every,
                false => self.params.hold,
            };
            self.next_quiet = Some(self.quiet_until + apart);
            self.quiet.clear();
            return (self.quiet_until, false);
        }
        if self.alone {
            return (now, true);
        }
        let slot = self.next_slot.max(now);
        self.next_slot = slot + Duration::from_secs_f64(1.0 / self.steering.rate());
        self.waited |= slot > now;
        (slot, true)
    }

    /// Whether one more gentle write may be in flight.
    fn room(&self) -> bool {
        self.alone || self.flights.room(self.steering.rate())
    }

    /// A write admitted before `now` leaves, unless a quiet window began meanwhile.
    fn take_off(&mut self, now: Instant) -> bool {
        let quiet = self.quiet_at(now);
        if !quiet {
            self.flights.left();
        }
        !quiet
    }

    /// Whether `now` falls in a quiet window.
    fn quiet_at(&self, now: Instant) -> bool {
        self.quiet_from <= now && now < self.quiet_until
    }

    /// When the probe should next go, or `None` while no gentle write goes.
    fn next_probe(&self, now: Instant) -> Option<Duration> {
        let quiet = now < self.quiet_until;
        // Writes held for room in flight write too: the probe sees the stall that holds them.
        let writing = self.flights.aloft()
            || self.last_write.is_some_and(|at| now.duration_since(at) < IDLE_AFTER);
        if !quiet && !writing {
            return None;
        }
        // Twice as often in a quiet window, which is short: its probes make about as many as
        // the law judges while writing.
        let every = match quiet {
            true => self.params.probe_every / 2,
            false => self.params.probe_every,
        };
        Some(every.mul_f64(0.5 + fastrand::f64()))
    }

    /// Records one probe sent at `sent` that took `latency`; says what the law did if it looked.
    fn record(&mut self, sent: Instant, latency: Duration, default: Budget) -> Option<Change> {
        let answered = sent + latency;
        let (settled, until) = (self.quiet_from + QUIET_SETTLE, self.quiet_until);
        if sent >= settled && answered <= until {
            self.quiet.push(latency);
        } else if answered < self.quiet_from || sent > until {
            self.samples.push_back((answered, latency));
        }
        while self.samples.front().is_some_and(|(at, _)| answered.duration_since(*at) > KEEP) {
            self.samples.pop_front();
        }
        let mut judged = Change::Held;
        if answered > until && !self.quiet.is_empty() {
            judged = self.steering.quiet_window(answered, std::mem::take(&mut self.quiet));
        }
        if judged == Change::Held && answered.duration_since(self.last_look) < LOOK_EVERY {
            return None;
        }
        Some(self.look(answered, default, judged))
    }

    /// The budget that steers at `now`: the strictest a migration asked for lately, or the
    /// `default`.
    fn budget(&self, now: Instant, default: Budget) -> Budget {
        match self.strictest {
            Some((budget, at)) if now.duration_since(at) < BUDGET_MEMORY => budget,
            _ => default,
        }
    }

    /// The law's look at the probe samples since the rate last changed, or at what a quiet
    /// window just `judged` of a cut on trial.
    fn look(&mut self, now: Instant, default: Budget, judged: Change) -> Change {
        self.last_look = now;
        let budget = self.budget(now, default);
        let since = self.steering.changed();
        let recent: Vec<Duration> = self
            .samples
            .iter()
            .filter(|(at, _)| *at > since)
            .map(|(_, latency)| *latency)
            .collect();
        let alone = self.company.look(now, self.params.alone_below, self.own_writes.count());
        if alone != self.alone {
            self.alone = alone;
            self.next_slot = now;
            let others = self.company.others();
            match alone {
                true => info!(?others, "gentle writes alone: as fast as the write window allows"),
                false => {
                    // What the probe saw while alone says nothing of the rate now, nor of the
                    // cluster with its new client: a quiet window first.
                    self.steering.resume(now);
                    self.next_quiet = Some(now);
                    info!(?others, rate = self.steering.rate(), "gentle writes in company");
                }
            }
        }
        // Writes that waited once, long ago, say nothing of the rate now: a rate they no longer
        // wait on must not grow.
        let waited = std::mem::take(&mut self.waited);
        let change = match (alone, judged) {
            (true, _) => Change::Held,
            (false, Change::Held) => self.steering.steer(now, &recent, budget, waited),
            (false, judged) => judged,
        };
        if change == Change::Judge {
            // The writes pause at once: the probe without them tells whose the latency is.
            self.next_quiet = Some(now);
        }
        let baseline = self.steering.baseline();
        self.seen = Steered {
            rate: self.steering.rate(),
            why: if alone { Why::Alone } else { self.steering.why() },
            others: self.company.others(),
            probe: (!recent.is_empty()).then(|| percentile(&recent, self.params.judged)),
            limit: budget.limit(baseline),
            baseline,
            budget: Some(budget),
            in_flight: self.flights.most(self.steering.rate()),
        };
        match change {
            Change::Cut { from, to } => info!(from, to, seen = %self.seen, "gentle rate cut"),
            Change::Undone { from, to } => {
                info!(from, to, seen = %self.seen, "gentle rate cut undone")
            }
            Change::Grew { from, to } => debug!(from, to, seen = %self.seen, "gentle rate grew"),
            Change::Judge => info!(seen = %self.seen, "gentle rate cut on trial"),
            Change::Stood { rate } => info!(rate, seen = %self.seen, "gentle rate cut stands"),
            Change::Held => {}
        }
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The budget the tests steer by: 3 times the quiet baseline.
    fn budget() -> Budget {
        Budget::Relative(3.0)
    }

    /// The law with the company of other clients taken for granted (`alone_below=0`).
    fn params() -> ProbeParams {
        ProbeParams { alone_below: 0.0, ..ProbeParams::default() }
    }

    fn state(now: Instant) -> State {
        State::new(now, params())
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_write_waits_for_a_quiet_window_and_then_writes_go_at_the_rate() {
        let now = Instant::now();
        let mut state = state(now);
        let quiet_for = params().quiet_for;
        assert_eq!(state.admit(now, None, budget()), (now + quiet_for, false));
        let after = now + quiet_for;
        assert_eq!(state.admit(after, None, budget()), (after, true));
        let spacing = Duration::from_secs_f64(1.0 / params().start_rate);
        assert_eq!(state.admit(after, None, budget()), (after + spacing, true));
        assert!(state.waited, "the second write waited on the rate");
    }

    #[test]
    fn the_writes_of_a_fixed_budget_take_no_quiet_window() {
        let now = Instant::now();
        let fixed = Budget::Fixed(ms(8));
        let mut state = state(now);
        assert_eq!(state.admit(now, Some(fixed), budget()), (now, true));
        assert!(state.admit(now, None, fixed).1, "nor a default fixed one");
        assert!(!state.quiet_at(now));
        let (until, admitted) = state.admit(now, None, budget());
        assert!(!admitted && state.quiet_at(now), "a relative one does, and holds every write");
        assert_eq!(state.admit(now, Some(fixed), budget()), (until, false));
    }

    #[test]
    fn quiet_windows_come_a_hold_apart_then_every_quiet_every_and_hold_every_write() {
        let now = Instant::now();
        let ProbeParams { quiet_for, quiet_every, hold, quiet_windows, .. } = params();
        let mut state = state(now);
        state.admit(now, None, budget());
        let second = now + quiet_for + hold;
        assert!(state.admit(second - ms(1), None, budget()).1);
        assert_eq!(state.admit(second, None, budget()), (second + quiet_for, false));
        for _ in 0..quiet_windows {
            state.steering.quiet_window(second, vec![ms(4); 80]);
        }
        // The baseline made of as many windows as it takes: the next comes a while later.
        let now = second + quiet_for + hold;
        state.admit(now, None, budget());
        let next = now + quiet_for + quiet_every;
        assert!(state.admit(next - ms(1), None, budget()).1);
        assert_eq!(state.admit(next, None, budget()), (next + quiet_for, false));
        let midway = next + quiet_for / 2;
        assert_eq!(state.admit(midway, None, budget()), (next + quiet_for, false));
        assert!(state.quiet_at(midway) && !state.quiet_at(next + quiet_for));
    }

    #[test]
    fn a_quiet_window_s_settled_probes_make_the_baseline_and_the_rest_the_signal() {
        let now = Instant::now();
        let mut state = state(now);
        state.admit(now, None, budget());
        // Unsettled: not counted anywhere.
        state.record(now + ms(100), ms(30), budget());
        for i in 0..10 {
            state.record(now + QUIET_SETTLE + ms(50 * i), ms(4), budget());
        }
        assert_eq!(state.steering.baseline(), None, "the window is still under way");
        let after = now + params().quiet_for + ms(10);
        state.record(after, ms(9), budget());
        assert_eq!(state.steering.baseline(), Some(ms(4)));
        assert_eq!(state.samples.iter().map(|(_, l)| *l).collect::<Vec<_>>(), [ms(9)]);
    }

    #[test]
    fn a_write_leaves_only_with_room_in_flight_and_not_into_a_quiet_window() {
        let now = Instant::now();
        let mut state = state(now);
        let after = now + params().quiet_for;
        state.admit(now, None, budget());
        assert!(!state.take_off(now), "the first quiet window holds it");
        assert!(state.take_off(after) && state.take_off(after));
        assert!(!state.room(), "two aloft at the starting rate, none back yet");
        state.flights.landed(None);
        assert!(state.room());
    }

    #[test]
    fn the_probe_rests_when_no_gentle_write_goes_and_probes_twice_as_often_in_a_quiet_window() {
        let now = Instant::now();
        let mut state = state(now);
        assert_eq!(state.next_probe(now), None);
        state.admit(now, None, budget());
        let every = params().probe_every;
        assert!(state.next_probe(now).is_some_and(|wait| wait <= every.mul_f64(0.75)));
        let writing = now + params().quiet_for;
        assert!(state.next_probe(writing).is_some_and(|wait| wait >= every / 2));
        assert!(state.next_probe(now + params().quiet_for + IDLE_AFTER * 2).is_none());
        state.flights.left();
        let stalled = now + params().quiet_for + IDLE_AFTER * 2;
        assert!(state.next_probe(stalled).is_some(), "a write still in flight: a stall, probed");
    }

    /// A state past its first quiet window, whose probes read `baseline` ms, writing.
    fn measured(now: Instant, baseline: u64) -> (State, Instant) {
        let mut state = state(now);
        state.admit(now, None, budget());
        for i in 0..80 {
            state.record(now + QUIET_SETTLE + ms(20 * i), ms(baseline), budget());
        }
        let after = now + params().quiet_for;
        state.record(after, ms(baseline), budget());
        assert_eq!(state.steering.baseline(), Some(ms(baseline)));
        assert!(state.admit(after, None, budget()).1);
        (state, after)
    }

    /// Probes that read `latency` ms every 50 ms from `from` for `seconds`; the changes the law made.
    fn probes(state: &mut State, from: Instant, seconds: u64, latency: u64) -> Vec<Change> {
        (0..seconds * 20)
            .filter_map(|i| state.record(from + ms(50 * i), ms(latency), budget()))
            .filter(|change| *change != Change::Held)
            .collect()
    }

    #[test]
    fn a_cut_that_does_not_make_the_probe_faster_is_judged_by_a_quiet_window_and_said() {
        let now = Instant::now();
        let (mut state, after) = measured(now, 4);
        let changes = probes(&mut state, after, 6, 13);
        let start = params().start_rate;
        let cut = start * params().cut;
        assert_eq!(changes, [Change::Cut { from: start, to: cut }]);
        let judged_at = after + Duration::from_secs(6);
        let changes = probes(&mut state, judged_at, 6, 13);
        assert_eq!(changes, [Change::Judge]);
        assert_eq!(state.seen.why, Why::Judging);
        assert_eq!(state.seen.rate, cut, "held until a quiet window judges");
        // The next write finds a quiet window begun at once.
        let now = judged_at + Duration::from_secs(6);
        let quiet_for = params().quiet_for;
        assert_eq!(state.admit(now, None, budget()), (now + quiet_for, false));
        // As slow in it: the latency is not the run's, and the cut is undone.
        let changes = probes(&mut state, now + QUIET_SETTLE, 3, 13);
        assert_eq!(changes, [Change::Undone { from: cut, to: start }]);
        assert_eq!(state.seen.why, Why::Undone);
        assert_eq!(state.seen.rate, start);
        assert!(
            state.seen.to_string().starts_with(
                "50.0 objects/s (cut undone: the probe was no faster for it, the latency is not this run's); probe p99 not measured yet, budget 12.0ms (3x its quiet 4.0ms)"
            ),
            "{}",
            state.seen
        );
    }

    #[test]
    fn writes_that_waited_once_long_ago_do_not_let_the_rate_grow() {
        let now = Instant::now();
        let (mut state, after) = measured(now, 4);
        state.waited = true;
        // Looks come every second; none of them finds writes waiting after the first.
        let changes = probes(&mut state, after + Duration::from_secs(1), 12, 2);
        assert_eq!(changes, [], "grew on a wait that was over");
        assert_eq!(state.seen.why, Why::NotNeeded);
        state.waited = true;
        state.last_look = after;
        let changes = probes(&mut state, after + Duration::from_secs(13), 1, 2);
        assert!(matches!(changes[..], [Change::Grew { .. }]), "{changes:?}");
    }

    #[test]
    fn a_migration_s_stricter_budget_steers_while_it_writes() {
        let now = Instant::now();
        let (mut state, _) = measured(now, 4);
        let fixed = Budget::Fixed(ms(6));
        state.admit(now, Some(fixed), budget());
        state.look(now, budget(), Change::Held);
        assert_eq!(state.seen.limit, Some(ms(6)));
        state.look(now + BUDGET_MEMORY * 2, budget(), Change::Held);
        assert_eq!(state.seen.limit, Some(ms(12)), "forgotten once it stops");
    }

    #[test]
    fn a_looser_budget_still_writing_does_not_keep_a_stricter_one_alive() {
        let now = Instant::now();
        let (mut state, _) = measured(now, 4);
        let (strict, loose) = (Budget::Fixed(ms(6)), Budget::Relative(3.0));
        state.admit(now, Some(strict), budget());
        let mut later = now;
        for _ in 0..4 {
            later += BUDGET_MEMORY / 2;
            state.admit(later, Some(loose), budget());
        }
        state.look(later, budget(), Change::Held);
        assert_eq!(state.seen.limit, Some(ms(12)), "the strict one lapsed");
        state.admit(later, Some(strict), budget());
        state.look(later, budget(), Change::Held);
        assert_eq!(state.seen.limit, Some(ms(6)), "and comes back with it");
    }

    #[test]
    fn alone_the_writes_go_at_once_and_in_company_at_the_law_s_rate_again() {
        let now = Instant::now();
        let mut state = State::new(now, ProbeParams::default());
        let quiet_for = params().quiet_for;
        assert_eq!(state.admit(now, None, budget()), (now + quiet_for, false));
        // The probe's writes in the quiet window show what others write, and so do the
        // migration's after it.
        let mut revision = 1000;
        let mut second = |state: &mut State, at: Instant, ours: u64, theirs: u64| {
            revision += theirs;
            for _ in 0..ours {
                revision += 1;
                state.company.wrote(at, revision);
            }
            state.look(at, budget(), Change::Held);
        };
        second(&mut state, now, 1, 0);
        second(&mut state, now + Duration::from_secs(1), 1, 1);
        second(&mut state, now + Duration::from_secs(2), 1, 1);
        assert_eq!(state.seen.why, Why::Alone, "judged in the quiet window");
        let mut at = now + quiet_for;
        for _ in 0..50 {
            assert_eq!(state.admit(at, None, budget()), (at, true), "no spacing, no pause");
        }
        assert!(state.room(), "and no room held back but the write window's");
        for _ in 0..2 {
            at += Duration::from_secs(1);
            second(&mut state, at, 300, 100);
        }
        assert_eq!(state.seen.why, Why::Measuring, "another client: the law steers again");
        assert_eq!(state.seen.rate, params().start_rate);
        let quiet_until = at + quiet_for;
        assert_eq!(state.admit(at, None, budget()), (quiet_until, false), "a baseline first");
        let spacing = Duration::from_secs_f64(1.0 / params().start_rate);
        assert_eq!(state.admit(quiet_until, None, budget()), (quiet_until, true));
        let next = state.admit(quiet_until, None, budget());
        assert_eq!(next, (quiet_until + spacing, true));
    }

    #[test]
    fn what_it_saw_reads_as_a_sentence() {
        let seen = Steered {
            rate: 24.0,
            why: Why::Grew,
            probe: Some(ms(7)),
            limit: Some(ms(12)),
            baseline: Some(ms(4)),
            budget: Some(Budget::Relative(3.0)),
            in_flight: 2,
            others: Some(30.0),
        };
        assert_eq!(
            seen.to_string(),
            "24.0 objects/s (grown: the probe is well within its budget); probe p99 7.0ms, budget 12.0ms (3x its quiet 4.0ms), 2 in flight at most"
        );
        let fixed = Steered {
            why: Why::Cut,
            budget: Some(Budget::Fixed(ms(25))),
            limit: Some(ms(25)),
            in_flight: 0,
            ..seen
        };
        assert_eq!(
            fixed.to_string(),
            "24.0 objects/s (cut: the probe passed its budget); probe p99 7.0ms, budget 25.0ms"
        );
        let alone = Steered { why: Why::Alone, others: Some(0.4), in_flight: 0, ..seen };
        assert_eq!(
            alone.to_string(),
            "as fast as the write window allows (alone: no other client writes, 0.4 writes/s by others); probe p99 7.0ms, budget 12.0ms (3x its quiet 4.0ms)"
        );
        let unmeasured = Steered { rate: 20.0, ..Steered::default() };
        assert_eq!(
            unmeasured.to_string(),
            "20.0 objects/s (measuring); probe p99 not measured yet, budget not measured yet"
        );
    }
}
