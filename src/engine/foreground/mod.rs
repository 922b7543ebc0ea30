//! The gentle pace, steered by what the apiserver's other clients feel rather than by
//! kube-svm's own writes: at one write in flight, kube-svm's own latency hardly moves while
//! every other client of a small apiserver waits.
//!
//! A probe task (`probe`), outside the write window, reads a small object often and writes it
//! now and then, as any client would ([`PROBE_OBJECT`]), and its latency is the signal. Gentle
//! writes pass through [`Foreground::admit`], which spaces them at the rate the law in
//! `steering` allows and now and then holds them all back for a quiet window, in which the probe
//! measures its baseline; no more of them are in flight than the rate needs (`flights`), so a
//! stall of the apiserver queues few of them; while the probe says the apiserver is in a spell
//! (`spell`), the writes wait for it to pass. Where kube-svm may read the apiserver's
//! `/metrics`, the probe task also reads how long the apiserver's goroutines wait to run
//! (`guard`), and while they wait long the rate does not grow. One `Foreground` serves every
//! gentle migration of the process: they share the rate, so two migrations at once press the
//! apiserver no harder than one.

mod flights;
mod guard;
mod probe;
mod spell;
mod steering;

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info};

use crate::api::Budget;
use crate::ops::metrics::Metrics;
pub use flights::Flight;
use flights::Flights;
use spell::Spells;
use steering::{Change, Steering, percentile};

/// The object the probe reads, and now and then writes: a ConfigMap of this name in kube-svm's
/// namespace (the chart creates it, and lets kube-svm `get` and `patch` it).
/// Where it does not exist or may not be written, the probe only reads: the apiserver answers a
/// read of a missing object from etcd all the same (a quorum read, as a client's plain GET is).
pub const PROBE_OBJECT: &str = "kube-svm-probe";

/// The probe writes at most once in this long: a merge patch of the annotation
/// [`PROBE_ANNOTATION`] (the probe's count), which goes the way of a client's update, etcd's
/// commit included, so the probe feels what writes wait for, not only reads (which the
/// apiserver serves from its cache). A patch that changed nothing would not: the apiserver
/// stores nothing for it. Once a second keeps what every write costs the cluster (an etcd
/// revision, a watch event, an audit entry) small beside the migration's own.
const WRITE_EVERY: Duration = Duration::from_secs(1);

/// The annotation the probe's writes set on [`PROBE_OBJECT`]: how many probes had been sent.
pub const PROBE_ANNOTATION: &str = "kube-svm.io/probe";

/// Time between two probes, on average (jittered, so the probe never keeps step with writes).
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// Time between two probes in a quiet window: about 40 in a window past its settling, whose
/// p99 is their slowest (about their 97th percentile), and the baseline is the least of ten such.
/// So a relative budget is stricter than its multiple of the p99 another client sees on a quiet
/// apiserver (measured: at `3x` the foreground read 1.8 times its idle p99).
const QUIET_PROBE_EVERY: Duration = Duration::from_millis(50);

/// A probe unanswered this long counts as this slow.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the gentle writes pause for a quiet window, and for how long (the first window, before
/// the first write, is shorter): about 4% of the time.
const QUIET_EVERY: Duration = Duration::from_secs(60);

/// The first quiet windows come sooner, this far apart: the first may be loud (the first lists
/// of a run, a new connection), and the baseline is the least of them.
const EARLY_QUIET_EVERY: Duration = Duration::from_secs(10);
const EARLY_QUIET_WINDOWS: u32 = 3;
const QUIET_FOR: Duration = Duration::from_millis(2500);
const FIRST_QUIET_FOR: Duration = Duration::from_millis(1500);

/// The start of a quiet window that is not counted: writes in flight finish meanwhile.
const QUIET_SETTLE: Duration = Duration::from_millis(500);

/// How often the law looks at the probe.
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// Probe samples kept, at most this old: enough for the tail's judgment
/// ([`steering`]'s `TAIL_SAMPLES`) however slow the probe gets.
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
    /// The probe's p99 since the rate last changed, when measured.
    pub probe_p99: Option<Duration>,
    /// The latency it may reach.
    pub limit: Option<Duration>,
    /// Its quiet baseline.
    pub baseline: Option<Duration>,
    /// The budget the limit comes from.
    pub budget: Option<Budget>,
    /// Writes the rate may have in flight at once (0 before the law first looked).
    pub in_flight: usize,
    /// Of the apiserver's goroutines that waited to run lately, the share that waited long,
    /// where kube-svm may read its `/metrics`: past [`guard::BUSY_SHARE`], the rate does not grow.
    pub apiserver_long_waits: Option<f64>,
}

// The rate is never NaN: it starts finite and is only multiplied and bounded; a share of long
// waits is of 200 waits at least.
impl Eq for Steered {}

impl fmt::Display for Steered {
    /// `probe p99 7.1ms, budget 12.0ms (3x its quiet 4.0ms); 24.0 objects/s, 2 in flight at most`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| format!("{:.1}ms", d.as_secs_f64() * 1000.0);
        match self.probe_p99 {
            Some(p99) => write!(f, "probe p99 {}", ms(p99))?,
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
        write!(f, "; {:.1} objects/s", self.rate)?;
        if self.in_flight > 0 {
            write!(f, ", {} in flight at most", self.in_flight)?;
        }
        match self.apiserver_long_waits {
            Some(share) if share > guard::BUSY_SHARE => {
                write!(
                    f,
                    "; apiserver busy, {:.1}% of its goroutines wait long to run: no growth",
                    share * 100.0
                )
            }
            Some(share) => {
                write!(f, "; {:.1}% of the apiserver's goroutines wait long to run", share * 100.0)
            }
            None => Ok(()),
        }
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
    /// Probes sent so far, which says which is a write.
    probes: AtomicU64,
    /// Whether the probe writes too: when it has a namespace of its own, until a write is
    /// refused (no such object, no permission).
    writes: AtomicBool,
    /// When the probe last wrote ([`WRITE_EVERY`]).
    last_write: std::sync::Mutex<Option<std::time::Instant>>,
    metrics: Arc<Metrics>,
}

struct State {
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
    /// Quiet windows begun so far.
    quiet_windows: u32,
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
    /// The guard's last reading of the apiserver (its share of long waits), and when.
    apiserver: Option<(f64, Instant)>,
    /// The apiserver's spell under way, which writes wait out.
    spells: Spells,
    /// A spell began to make writes wait, not yet counted in the metrics.
    spell_began: bool,
    seen: Steered,
}

impl Foreground {
    /// A gate probing the ConfigMap [`PROBE_OBJECT`] in `namespace` against `budget`, as the
    /// client of `config`. The probe has a connection, a thread and a runtime of its own, so it
    /// waits in no queue of kube-svm's writes and for no worker busy with the engine's pages:
    /// its latency is the apiserver's, as another client feels it.
    pub fn new(
        config: kube::Config,
        namespace: Option<&str>,
        budget: Budget,
        metrics: Arc<Metrics>,
    ) -> Self {
        // Without a namespace of its own, the probe reads in the kubeconfig's, and never writes:
        // a ConfigMap of that name there is someone else's.
        let writes = namespace.is_some();
        let namespace = namespace.unwrap_or(&config.default_namespace).to_owned();
        Foreground {
            config,
            path: format!("/api/v1/namespaces/{namespace}/configmaps/{PROBE_OBJECT}"),
            last_write: std::sync::Mutex::new(None),
            budget,
            state: Mutex::new(State::new(Instant::now())),
            turn: tokio::sync::Mutex::new(()),
            landed: tokio::sync::Notify::new(),
            probing: AtomicBool::new(false),
            probes: AtomicU64::new(0),
            writes: AtomicBool::new(writes),
            metrics,
        }
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
            let (until, admitted) = {
                let mut state = self.lock();
                let admission = state.admit(Instant::now(), budget, self.budget);
                if state.spell_began {
                    state.spell_began = false;
                    self.metrics.spell_waits.inc();
                }
                admission
            };
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
    fn new(now: Instant) -> State {
        State {
            steering: Steering::new(now),
            flights: Flights::default(),
            next_slot: now,
            quiet_from: now,
            quiet_until: now,
            next_quiet: None,
            quiet_windows: 0,
            samples: VecDeque::new(),
            quiet: Vec::new(),
            waited: false,
            last_write: None,
            last_look: now,
            strictest: None,
            apiserver: None,
            spells: Spells::default(),
            spell_began: false,
            seen: Steered { rate: steering::START_RATE, ..Steered::default() },
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
        if relative && self.next_quiet.is_none_or(|next| now >= next) {
            let length = match self.next_quiet {
                None => FIRST_QUIET_FOR,
                Some(_) => QUIET_FOR,
            };
            (self.quiet_from, self.quiet_until) = (now, now + length);
            self.quiet_windows += 1;
            let every = match self.quiet_windows <= EARLY_QUIET_WINDOWS {
                true => EARLY_QUIET_EVERY,
                false => QUIET_EVERY,
            };
            self.next_quiet = Some(self.quiet_until + every);
            self.quiet.clear();
            return (self.quiet_until, false);
        }
        // The apiserver in a spell: writes wait for it to pass rather than queue behind it.
        let limit = self.budget(now, default).limit(self.steering.baseline());
        if let Some((until, first)) = limit.and_then(|limit| self.spells.wait(now, limit)) {
            if first {
                self.spell_began = true;
                debug!(seen = %self.seen, "gentle writes wait out a spell of the apiserver's");
            }
            return (until, false);
        }
        let slot = self.next_slot.max(now);
        self.next_slot = slot + Duration::from_secs_f64(1.0 / self.steering.rate());
        self.waited |= slot > now;
        (slot, true)
    }

    /// Whether one more gentle write may be in flight.
    fn room(&self) -> bool {
        self.flights.room(self.steering.rate())
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
        let every = if quiet { QUIET_PROBE_EVERY } else { PROBE_EVERY };
        Some(every.mul_f64(0.5 + fastrand::f64()))
    }

    fn record(&mut self, sent: Instant, latency: Duration, default: Budget) {
        let answered = sent + latency;
        let limit = self.budget(answered, default).limit(self.steering.baseline());
        self.spells.answered(sent, Some(latency), limit);
        let (settled, until) = (self.quiet_from + QUIET_SETTLE, self.quiet_until);
        if sent >= settled && answered <= until {
            self.quiet.push(latency);
        } else if answered < self.quiet_from || sent > until {
            self.samples.push_back((answered, latency));
        }
        while self.samples.front().is_some_and(|(at, _)| answered.duration_since(*at) > KEEP) {
            self.samples.pop_front();
        }
        if answered > until && !self.quiet.is_empty() {
            self.steering.quiet_sample(percentile(&self.quiet, steering::JUDGED));
            self.quiet.clear();
        }
        if answered.duration_since(self.last_look) >= LOOK_EVERY {
            self.look(answered, default);
        }
    }

    /// The budget that steers at `now`: the strictest a migration asked for lately, or the
    /// `default`.
    fn budget(&self, now: Instant, default: Budget) -> Budget {
        match self.strictest {
            Some((budget, at)) if now.duration_since(at) < BUDGET_MEMORY => budget,
            _ => default,
        }
    }

    /// The law's look at the probe samples since the rate last changed.
    fn look(&mut self, now: Instant, default: Budget) {
        self.last_look = now;
        let budget = self.budget(now, default);
        let since = self.steering.changed();
        let baseline = self.steering.baseline();
        let recent: Vec<(Instant, Duration)> =
            self.samples.iter().filter(|(at, _)| *at > since).copied().collect();
        let recent = match budget.limit(baseline) {
            Some(limit) => steering::without_spells(&recent, limit),
            None => recent.into_iter().map(|(_, latency)| latency).collect(),
        };
        // The apiserver short of CPU by its own account: the rate does not grow.
        let apiserver = self
            .apiserver
            .filter(|(_, at)| now.duration_since(*at) < guard::STALE_AFTER)
            .map(|(share, _)| share);
        let busy = apiserver.is_some_and(|share| share > guard::BUSY_SHARE);
        let change = self.steering.steer(now, &recent, budget, self.waited && !busy);
        // A growth the guard held back is said as the law's changes are: a look that holds
        // leaves the law as it was, so a copy of it tells what it would have done.
        let held = match (change, busy && self.waited) {
            (Change::Held, true) => match self.steering.clone().steer(now, &recent, budget, true) {
                Change::Grew { from, to } => Some((from, to)),
                _ => None,
            },
            _ => None,
        };
        self.waited = false;
        self.seen = Steered {
            rate: self.steering.rate(),
            probe_p99: (!recent.is_empty()).then(|| percentile(&recent, steering::JUDGED)),
            limit: budget.limit(baseline),
            baseline,
            budget: Some(budget),
            in_flight: self.flights.most(self.steering.rate()),
            apiserver_long_waits: apiserver,
        };
        match change {
            Change::Cut { from, to } => info!(from, to, seen = %self.seen, "gentle rate cut"),
            Change::Grew { from, to } => debug!(from, to, seen = %self.seen, "gentle rate grew"),
            Change::Held => {
                if let Some((from, to)) = held {
                    debug!(from, to, seen = %self.seen, "gentle rate held, not grown: the apiserver is busy by its own account");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(now: Instant) -> State {
        State::new(now)
    }

    #[test]
    fn the_first_write_waits_for_a_quiet_window_and_then_writes_go_at_the_rate() {
        let now = Instant::now();
        let mut state = state(now);
        assert_eq!(state.admit(now, None, Budget::default()), (now + FIRST_QUIET_FOR, false));
        let after = now + FIRST_QUIET_FOR;
        assert_eq!(state.admit(after, None, Budget::default()), (after, true));
        let spacing = Duration::from_secs_f64(1.0 / steering::START_RATE);
        assert_eq!(state.admit(after, None, Budget::default()), (after + spacing, true));
        assert!(state.waited, "the second write waited on the rate");
    }

    #[test]
    fn the_writes_of_a_fixed_budget_take_no_quiet_window() {
        let now = Instant::now();
        let fixed = Budget::Fixed(Duration::from_millis(8));
        let mut state = state(now);
        assert_eq!(state.admit(now, Some(fixed), Budget::default()), (now, true));
        assert!(state.admit(now, None, fixed).1, "nor a default fixed one");
        assert!(!state.quiet_at(now));
        let (until, admitted) = state.admit(now, None, Budget::default());
        assert!(!admitted && state.quiet_at(now), "a relative one does, and holds every write");
        assert_eq!(state.admit(now, Some(fixed), Budget::default()), (until, false));
    }

    #[test]
    fn quiet_windows_come_back_soon_at_first_then_every_minute_and_hold_every_write() {
        let now = Instant::now();
        let mut state = state(now);
        state.admit(now, None, Budget::default());
        let mut until = now + FIRST_QUIET_FOR;
        for _ in 0..EARLY_QUIET_WINDOWS {
            let next = until + EARLY_QUIET_EVERY;
            assert!(state.admit(next - Duration::from_millis(1), None, Budget::default()).1);
            assert_eq!(state.admit(next, None, Budget::default()), (next + QUIET_FOR, false));
            until = next + QUIET_FOR;
        }
        let next = until + QUIET_EVERY;
        assert!(
            state.admit(next - Duration::from_millis(1), None, Budget::default()).1,
            "a minute"
        );
        assert_eq!(state.admit(next, None, Budget::default()), (next + QUIET_FOR, false));
        assert_eq!(
            state.admit(next + QUIET_FOR / 2, None, Budget::default()),
            (next + QUIET_FOR, false)
        );
        assert!(state.quiet_at(next + QUIET_FOR / 2) && !state.quiet_at(next + QUIET_FOR));
    }

    #[test]
    fn a_quiet_window_s_settled_probes_make_the_baseline_and_the_rest_the_signal() {
        let now = Instant::now();
        let mut state = state(now);
        state.admit(now, None, Budget::default());
        let ms = Duration::from_millis;
        // Unsettled: not counted anywhere.
        state.record(now + ms(100), ms(30), Budget::default());
        for i in 0..10 {
            state.record(now + QUIET_SETTLE + ms(50 * i), ms(4), Budget::default());
        }
        assert_eq!(state.steering.baseline(), None, "the window is still under way");
        let after = now + FIRST_QUIET_FOR + ms(10);
        state.record(after, ms(9), Budget::default());
        assert_eq!(state.steering.baseline(), Some(ms(4)));
        assert_eq!(state.samples.iter().map(|(_, l)| *l).collect::<Vec<_>>(), [ms(9)]);
    }

    #[test]
    fn a_write_leaves_only_with_room_in_flight_and_not_into_a_quiet_window() {
        let now = Instant::now();
        let mut state = state(now);
        let after = now + FIRST_QUIET_FOR;
        state.admit(now, None, Budget::default());
        assert!(!state.take_off(now), "the first quiet window holds it");
        assert!(state.take_off(after) && state.take_off(after));
        assert!(!state.room(), "two aloft at the starting rate, none back yet");
        state.flights.landed(None);
        assert!(state.room());
    }

    #[test]
    fn the_probe_rests_when_no_gentle_write_goes() {
        let now = Instant::now();
        let mut state = state(now);
        assert_eq!(state.next_probe(now), None);
        state.admit(now, None, Budget::default());
        assert!(state.next_probe(now).is_some_and(|wait| wait <= QUIET_PROBE_EVERY * 2));
        assert!(state.next_probe(now + FIRST_QUIET_FOR + IDLE_AFTER * 2).is_none());
        state.flights.left();
        let stalled = now + FIRST_QUIET_FOR + IDLE_AFTER * 2;
        assert!(state.next_probe(stalled).is_some(), "a write still in flight: a stall, probed");
    }

    #[test]
    fn writes_wait_out_a_spell_of_the_apiserver_and_go_on_after_it() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        let fixed = Budget::Fixed(ms(10));
        let mut state = state(now);
        assert!(state.admit(now, None, fixed).1);
        state.record(now, ms(25), fixed);
        let (until, admitted) = state.admit(now + ms(25), None, fixed);
        assert!(!admitted && until > now + ms(25), "a probe at 2.5 times its budget");
        assert!(state.spell_began, "a spell begins to hold writes");
        state.spell_began = false;
        assert!(!state.admit(now + ms(50), None, fixed).1, "it holds them still");
        assert!(!state.spell_began, "counted once");
        state.record(now + ms(100), ms(3), fixed);
        assert!(state.admit(now + ms(103), None, fixed).1, "the spell passed");
    }

    #[test]
    fn a_migration_s_stricter_budget_steers_while_it_writes() {
        let now = Instant::now();
        let mut state = state(now);
        state.steering.quiet_sample(Duration::from_millis(4));
        let fixed = Budget::Fixed(Duration::from_millis(6));
        state.admit(now, Some(fixed), Budget::default());
        state.look(now, Budget::default());
        assert_eq!(state.seen.limit, Some(Duration::from_millis(6)));
        state.look(now + BUDGET_MEMORY * 2, Budget::default());
        assert_eq!(state.seen.limit, Some(Duration::from_millis(12)), "forgotten once it stops");
    }

    #[test]
    fn a_looser_budget_still_writing_does_not_keep_a_stricter_one_alive() {
        let now = Instant::now();
        let mut state = state(now);
        state.steering.quiet_sample(Duration::from_millis(4));
        let (strict, loose) = (Budget::Fixed(Duration::from_millis(6)), Budget::Relative(3.0));
        state.admit(now, Some(strict), Budget::default());
        let mut later = now;
        for _ in 0..4 {
            later += BUDGET_MEMORY / 2;
            state.admit(later, Some(loose), Budget::default());
        }
        state.look(later, Budget::default());
        assert_eq!(state.seen.limit, Some(Duration::from_millis(12)), "the strict one lapsed");
        state.admit(later, Some(strict), Budget::default());
        state.look(later, Budget::default());
        assert_eq!(state.seen.limit, Some(Duration::from_millis(6)), "and comes back with it");
    }

    #[test]
    fn what_it_saw_reads_as_a_sentence() {
        let ms = Duration::from_millis;
        let seen = Steered {
            rate: 24.0,
            probe_p99: Some(ms(7)),
            limit: Some(ms(12)),
            baseline: Some(ms(4)),
            budget: Some(Budget::Relative(3.0)),
            in_flight: 2,
            apiserver_long_waits: None,
        };
        assert_eq!(
            seen.to_string(),
            "probe p99 7.0ms, budget 12.0ms (3x its quiet 4.0ms); 24.0 objects/s, 2 in flight at most"
        );
        let fixed = Steered { budget: Some(Budget::Fixed(ms(25))), limit: Some(ms(25)), ..seen };
        assert_eq!(
            fixed.to_string(),
            "probe p99 7.0ms, budget 25.0ms; 24.0 objects/s, 2 in flight at most"
        );
        let unlooked = Steered { in_flight: 0, ..fixed };
        assert_eq!(unlooked.to_string(), "probe p99 7.0ms, budget 25.0ms; 24.0 objects/s");
        let guarded = Steered { apiserver_long_waits: Some(0.004), ..unlooked };
        assert_eq!(
            guarded.to_string(),
            "probe p99 7.0ms, budget 25.0ms; 24.0 objects/s; 0.4% of the apiserver's goroutines wait long to run"
        );
        let busy = Steered { apiserver_long_waits: Some(0.084), ..unlooked };
        assert_eq!(
            busy.to_string(),
            "probe p99 7.0ms, budget 25.0ms; 24.0 objects/s; apiserver busy, 8.4% of its goroutines wait long to run: no growth"
        );
    }

    /// Whether the rate grows at a look with the probe well within its budget and writes
    /// waiting, the guard having read `apiserver` (a share of long waits, so long ago).
    fn grows_with(apiserver: Option<(f64, Duration)>) -> (bool, Steered) {
        let now = Instant::now();
        let mut state = state(now);
        state.steering.quiet_sample(Duration::from_millis(4));
        let later = now + Duration::from_secs(30);
        for n in 1..=200 {
            state.samples.push_back((later - Duration::from_millis(n), Duration::from_millis(4)));
        }
        state.waited = true;
        state.apiserver = apiserver.map(|(share, ago)| (share, later - ago));
        state.look(later, Budget::default());
        (state.steering.rate() > steering::START_RATE, state.seen)
    }

    #[test]
    fn the_rate_does_not_grow_while_the_apiserver_says_it_is_busy() {
        assert!(grows_with(None).0, "no reading: the probe alone steers");
        let (grew, seen) = grows_with(Some((0.01, Duration::from_secs(1))));
        assert!(grew, "an apiserver with CPU to spare");
        assert_eq!(seen.apiserver_long_waits, Some(0.01));
        let (grew, seen) = grows_with(Some((0.05, Duration::from_secs(1))));
        assert!(!grew, "a busy apiserver holds the rate");
        assert_eq!(seen.apiserver_long_waits, Some(0.05));
        let (grew, seen) = grows_with(Some((0.05, guard::STALE_AFTER)));
        assert!(grew, "a reading too old to tell");
        assert_eq!(seen.apiserver_long_waits, None);
    }
}
