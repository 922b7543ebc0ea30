//! How many writes of one migration are sent at once. The window reacts to the two signals the
//! apiserver gives:
//!
//! - **Throttling** (429, API Priority and Fairness): the window halves, as TCP's congestion
//!   window does on loss, so a migration settles at the concurrency its priority level grants
//!   instead of retrying in a herd.
//! - **Latency**, as TCP Vegas reads it: the fastest write seen is the apiserver's floor; while
//!   the smoothed latency stays below a [`Band`]'s lower bound (a multiple of that floor) the
//!   window grows (by one per success at first, then by one per window's worth of successes);
//!   above its upper bound, or above its ceiling at all, it shrinks by one per window's worth. In
//!   between it holds.
//!
//! Below one write in flight, a band may also **space** the writes: at one write at a time, the
//! further the smoothed latency sits into the band, the longer the window waits after each
//! write before the next (up to [`Band::max_spacing`] times its latency), so that a slower
//! apiserver gets idle time back. The floor stays the fastest write ever seen: an apiserver that
//! slows over a long run is given more idle time, never less.
//!
//! The band is the migration's [`Pace`]. A CPU-bound apiserver's latency climbs with every write
//! added beyond a few while its throughput still grows slowly, and every other client of the
//! apiserver waits about as long as kube-svm's own writes do: the band kube-svm keeps its own
//! latency in is the slowdown it imposes on everyone else. The gentle band keeps that slowdown
//! small; the fast one trades it for the apiserver's whole throughput
//! (bench/notes/2026-11-24-bands-and-spacing.md has the measurements).

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::api::Pace;

/// Windows' worth of successes before the window grows back to the size last throttled: with
/// 4 seats granted, about one write in 70 is rejected instead of one in 8 (measured against
/// API Priority and Fairness in the tests; kube-svm aims at no more than one in 20).
const PROBE_WINDOWS: usize = 16;

/// Weight of a new sample in the smoothed latency (TCP's 1/8).
const SMOOTHING: f64 = 0.125;

/// The longest a spaced write waits, however slow the apiserver: a run stays responsive to
/// being stopped, and a slow apiserver still sees progress.
const MAX_SPACING_WAIT: Duration = Duration::from_secs(2);

impl Pace {
    /// The latency band the pace keeps its writes in.
    pub fn band(self) -> Band {
        match self {
            Pace::Gentle => Band::GENTLE,
            Pace::Fast => Band::FAST,
        }
    }
}

/// The latency a window keeps its writes within, against the fastest write seen (the floor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Band {
    /// Smoothed latency below this many times the floor: the apiserver has room, grow.
    pub grow_below: f64,
    /// Smoothed latency above this many times the floor: requests are queueing, shrink.
    pub shrink_above: f64,
    /// Smoothed latency above this, whatever the floor, shrinks the window.
    pub ceiling: Duration,
    /// At one write in flight, the longest wait after a write before the next, as a multiple of
    /// the smoothed latency: reached at the upper bound, none at the lower one, in proportion in
    /// between. 0 never spaces writes.
    pub max_spacing: f64,
}

impl Band {
    /// Wide on purpose: measured on the bench's control plane (`make bench`, 3,000 objects), 5 ms
    /// and 188 objects/s at one write in flight, 18 ms and 406 at 8, 63 ms and 446 at 32, 119 ms
    /// and 483 at 64. This band settles between about 20 and 50 writes, near the apiserver's
    /// limit, and gives way only when something else makes the apiserver far slower; other
    /// clients then wait ten to twenty times as long as on an idle apiserver.
    pub const FAST: Band = Band {
        grow_below: 10.0,
        shrink_above: 20.0,
        ceiling: Duration::from_millis(500),
        max_spacing: 0.0,
    };

    /// Narrow: other clients wait about as long as kube-svm's writes do, so holding those within
    /// one and a half to three times the fastest write keeps everyone's latency within a small
    /// multiple of idle; the ceiling keeps a slow apiserver from being loaded further. Chosen
    /// from `make bench`'s sweep (bench/notes/2026-11-24-bands-and-spacing.md): of the bands tried (1.5x-3x, 2x-4x, 3x-6x,
    /// 5x-10x), this one left the foreground client's p50 at its idle value and its p99 lowest,
    /// while moving 0.56x the limit; wider bands bought up to 0.81x with twice the p99. Even one
    /// write at a time, back to back, kept a 2-core apiserver busy enough to put the foreground
    /// client's p99 at 12 times idle; spaced up to twice the write's latency, the p99 fell to
    /// about 4 times idle at about half the objects/s.
    pub const GENTLE: Band = Band {
        grow_below: 1.5,
        shrink_above: 3.0,
        ceiling: Duration::from_millis(100),
        max_spacing: 2.0,
    };
}

/// Why a window is below its maximum: the migration is holding back for the cluster's sake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Restraint {
    /// The apiserver answers slower than the band allows: other clients would feel more writes.
    Latency,
    /// The apiserver throttled the migration (429): its priority level is full.
    Throttling,
}

impl Restraint {
    /// Every restraint, in the order of [`Gauges::restraints`].
    pub const ALL: [Restraint; 2] = [Restraint::Latency, Restraint::Throttling];

    /// As a metric label and in `kube-svm status`.
    pub fn name(self) -> &'static str {
        match self {
            Restraint::Latency => "latency",
            Restraint::Throttling => "throttling",
        }
    }

    /// The restraint named `name`, as [`Restraint::name`] spells it.
    pub fn parse(name: &str) -> Option<Restraint> {
        Restraint::ALL.into_iter().find(|restraint| restraint.name() == name)
    }
}

/// What a window allows now, and why not more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holding {
    /// Writes allowed in flight at once.
    pub size: usize,
    /// Why the window is below its maximum; `None` when nothing holds it back (it is at its
    /// maximum, or still growing toward it).
    pub restraint: Option<Restraint>,
}

/// How a run holds its writes back: its pace, and its window as it stood when the last page was
/// done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    /// The pace the run keeps.
    pub pace: Pace,
    /// The write window: its size, and what holds it below its maximum.
    pub window: Holding,
    /// What the gentle pace's probe saw, and the rate it allows (a gentle run only).
    pub steered: Option<super::Steered>,
}

/// Gauges a window keeps current: its size, and 1 for the restraint holding it back.
pub struct Gauges {
    pub size: prometheus::IntGauge,
    /// One per restraint, in the order of [`Restraint::ALL`].
    pub restraints: [prometheus::IntGauge; 2],
}

impl Gauges {
    fn show(&self, holding: Holding) {
        self.size.set(i64::try_from(holding.size).unwrap_or(i64::MAX));
        for (restraint, gauge) in Restraint::ALL.into_iter().zip(&self.restraints) {
            gauge.set(i64::from(holding.restraint == Some(restraint)));
        }
    }
}

pub struct Window {
    permits: Semaphore,
    max: usize,
    band: Band,
    state: Mutex<State>,
    gauges: Option<Gauges>,
}

#[derive(Debug, PartialEq)]
struct State {
    /// The current window.
    size: usize,
    /// Permits to retire as they come back, after a decrease.
    to_retire: usize,
    /// Successes since the last change.
    successes: usize,
    /// Below this size the window grows by one per success (slow start).
    threshold: usize,
    /// The size the apiserver last throttled at: growing back to it waits [`PROBE_WINDOWS`]
    /// windows' worth of successes, so a migration held to a few seats by its priority level is
    /// rarely rejected, yet still notices when more seats free up.
    throttled_at: Option<usize>,
    /// The fastest write seen, in seconds.
    floor: Option<f64>,
    /// The smoothed latency, in seconds.
    smoothed: Option<f64>,
    /// What the smoothed latency said last.
    load: Load,
    /// At one write in flight: no write enters before this.
    not_before: Option<Instant>,
}

/// What the caller learnt from one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Signal {
    /// Done, after this long.
    Success(Duration),
    Throttled,
    /// Neither: an error that says nothing about load.
    Neutral,
}

/// What the latency says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Load {
    Light,
    Fair,
    Heavy,
}

impl Window {
    /// A window of at most `max` writes that keeps their latency within `band`, and shows
    /// itself on `gauges`.
    pub fn new(max: usize, band: Band, gauges: Option<Gauges>) -> Window {
        let max = max.max(1);
        let window = Window {
            permits: Semaphore::new(1),
            max,
            band,
            state: Mutex::new(State {
                size: 1,
                to_retire: 0,
                successes: 0,
                threshold: max,
                throttled_at: None,
                floor: None,
                smoothed: None,
                load: Load::Light,
                not_before: None,
            }),
            gauges,
        };
        if let Some(gauges) = &window.gauges {
            gauges.show(window.holding());
        }
        window
    }

    /// Waits for room in the window, and then for the spacing after the write before, if any.
    pub async fn enter(&self) -> Slot<'_> {
        // The semaphore is never closed, so acquiring cannot fail; fall back to no permit.
        let permit = self.permits.acquire().await.ok();
        let not_before = self.lock().not_before;
        if let Some(not_before) = not_before {
            tokio::time::sleep_until(not_before).await;
        }
        Slot { window: self, permit }
    }

    /// The window's size, and what holds it back.
    pub fn holding(&self) -> Holding {
        self.lock().holding(self.max)
    }

    /// The current window size.
    #[cfg(test)]
    fn size(&self) -> usize {
        self.lock().size
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adjusts the window by `signal`, and returns or retires the leaving request's permit.
    fn adjust(&self, signal: Signal, permit: Option<SemaphorePermit<'_>>) {
        let mut state = self.lock();
        let before = state.holding(self.max);
        match signal {
            Signal::Throttled => {
                state.throttled_at = Some(state.size);
                let halved = state.size.div_ceil(2);
                self.shrink(&mut state, halved);
            }
            Signal::Success(latency) => match state.observe(latency, &self.band) {
                Load::Heavy if state.size < state.threshold => {
                    // Slow start ends where queueing begins.
                    state.threshold = state.size;
                }
                Load::Heavy => {
                    state.successes += 1;
                    if state.successes >= state.size && state.size > 1 {
                        let smaller = state.size - 1;
                        self.shrink(&mut state, smaller);
                    }
                }
                Load::Light if state.size < self.max => {
                    state.successes += 1;
                    let probing = state.throttled_at.is_some_and(|at| state.size + 1 >= at);
                    let windows = if probing { PROBE_WINDOWS } else { 1 };
                    if state.size < state.threshold || state.successes >= state.size * windows {
                        self.grow(&mut state);
                        // Past the size last throttled, the apiserver has room again; at the
                        // maximum, there is nothing left to probe.
                        if state.throttled_at.is_some_and(|at| state.size > at)
                            || state.size >= self.max
                        {
                            state.throttled_at = None;
                        }
                    }
                }
                Load::Light | Load::Fair => {}
            },
            Signal::Neutral => {}
        }
        if let Signal::Success(_) = signal {
            state.not_before = state.spacing(&self.band).map(|wait| Instant::now() + wait);
        }
        if let Some(permit) = permit
            && state.to_retire > 0
        {
            state.to_retire -= 1;
            permit.forget();
        }
        let after = state.holding(self.max);
        drop(state);
        if after != before
            && let Some(gauges) = &self.gauges
        {
            gauges.show(after);
        }
    }

    fn grow(&self, state: &mut State) {
        state.successes = 0;
        state.size += 1;
        // Growing first cancels a pending retirement, else adds a permit.
        if state.to_retire > 0 {
            state.to_retire -= 1;
        } else {
            self.permits.add_permits(1);
        }
    }

    fn shrink(&self, state: &mut State, new_size: usize) {
        if state.size == 1 {
            state.threshold = 1;
            return;
        }
        let new_size = new_size.max(1);
        let mut shrink = state.size - new_size;
        state.size = new_size;
        state.threshold = new_size;
        state.successes = 0;
        // Idle permits go at once; those in flight when they come back.
        while shrink > 0
            && let Ok(idle) = self.permits.try_acquire()
        {
            idle.forget();
            shrink -= 1;
        }
        state.to_retire += shrink;
    }
}

impl Drop for Window {
    /// A run that ended allows no writes and holds nothing back.
    fn drop(&mut self) {
        if let Some(gauges) = &self.gauges {
            gauges.show(Holding::default());
        }
    }
}

impl State {
    /// Takes one write's latency into the floor and the smoothed latency; says what they show
    /// against `band`.
    fn observe(&mut self, latency: Duration, band: &Band) -> Load {
        let sample = latency.as_secs_f64();
        let floor = self.floor.map_or(sample, |floor| floor.min(sample));
        self.floor = Some(floor);
        let smoothed = match self.smoothed {
            None => sample,
            Some(previous) => previous + SMOOTHING * (sample - previous),
        };
        self.smoothed = Some(smoothed);
        let ceiling = band.ceiling.as_secs_f64();
        self.load = if smoothed > ceiling || smoothed > floor * band.shrink_above {
            Load::Heavy
        } else if smoothed < floor * band.grow_below {
            Load::Light
        } else {
            Load::Fair
        };
        self.load
    }

    /// How long to wait after a write before the next: only at one write in flight, in
    /// proportion to how far the smoothed latency sits into `band`, in multiples of it.
    fn spacing(&self, band: &Band) -> Option<Duration> {
        let (Some(smoothed), Some(floor)) = (self.smoothed, self.floor) else {
            return None;
        };
        if self.size > 1 || band.max_spacing <= 0.0 {
            return None;
        }
        let depth = if smoothed > band.ceiling.as_secs_f64() {
            1.0
        } else {
            let width = band.shrink_above - band.grow_below;
            ((smoothed / floor - band.grow_below) / width).clamp(0.0, 1.0)
        };
        let wait = band.max_spacing * depth * smoothed;
        (wait > 0.0).then(|| Duration::from_secs_f64(wait).min(MAX_SPACING_WAIT))
    }

    /// The size, and what holds it back: below `max`, throttling, until the window has grown
    /// past where it was last throttled, else latency at or above the band's lower bound; and
    /// latency whenever writes are spaced, even at `max`.
    fn holding(&self, max: usize) -> Holding {
        let restraint = if self.size < max && self.throttled_at.is_some() {
            Some(Restraint::Throttling)
        } else if self.not_before.is_some() || (self.size < max && self.load != Load::Light) {
            Some(Restraint::Latency)
        } else {
            None
        };
        Holding { size: self.size, restraint }
    }
}

/// One request's place in the window.
pub struct Slot<'a> {
    window: &'a Window,
    permit: Option<SemaphorePermit<'a>>,
}

impl Slot<'_> {
    /// Leaves the window, adjusting it by what the request showed.
    pub fn leave(mut self, signal: Signal) {
        let permit = self.permit.take();
        self.window.adjust(signal, permit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: Signal = Signal::Success(Duration::from_millis(5));

    fn window(max: usize) -> Window {
        Window::new(max, Band::FAST, None)
    }

    async fn succeed(window: &Window, times: usize, signal: Signal) {
        for _ in 0..times {
            window.enter().await.leave(signal);
        }
    }

    #[tokio::test]
    async fn starts_at_one_and_grows_by_one_per_fast_success_until_throttled() {
        let window = window(8);
        assert_eq!((window.size(), window.permits.available_permits()), (1, 1));
        succeed(&window, 3, FAST).await;
        assert_eq!((window.size(), window.permits.available_permits()), (4, 4));
        window.enter().await.leave(Signal::Throttled);
        assert_eq!((window.size(), window.permits.available_permits()), (2, 2));
        // Past the first throttling, a window's worth of successes adds one.
        succeed(&window, 1, FAST).await;
        assert_eq!(window.size(), 2);
        succeed(&window, 1, FAST).await;
        assert_eq!(window.size(), 3);
        window.enter().await.leave(Signal::Neutral);
        assert_eq!(window.size(), 3);
    }

    #[tokio::test]
    async fn never_shrinks_below_one() {
        let window = window(8);
        succeed(&window, 7, FAST).await;
        for _ in 0..5 {
            window.enter().await.leave(Signal::Throttled);
        }
        assert_eq!((window.size(), window.permits.available_permits()), (1, 1));
        // Throttled even at one: a second write only after a long run of successes.
        succeed(&window, PROBE_WINDOWS - 1, FAST).await;
        assert_eq!(window.size(), 1);
        succeed(&window, 1, FAST).await;
        assert_eq!(window.size(), 2);
    }

    #[tokio::test]
    async fn permits_held_during_a_decrease_are_retired_when_they_return() {
        let window = window(4);
        succeed(&window, 3, FAST).await;
        let slots = [window.enter().await, window.enter().await, window.enter().await];
        window.enter().await.leave(Signal::Throttled);
        assert_eq!(window.size(), 2);
        for slot in slots {
            slot.leave(Signal::Neutral);
        }
        assert_eq!(window.permits.available_permits(), 2, "in flight never exceeds the window");
    }

    #[tokio::test]
    async fn held_to_a_few_seats_it_is_rarely_rejected() {
        // An apiserver that rejects whatever exceeds 4 writes at once.
        let window = window(64);
        let mut rejected = 0;
        for _ in 0..2000 {
            if window.size() > 4 {
                rejected += 1;
                window.enter().await.leave(Signal::Throttled);
            } else {
                window.enter().await.leave(FAST);
            }
        }
        assert!(rejected * 20 <= 2000, "{rejected} of 2000 rejected");
        assert!((3..=5).contains(&window.size()), "{}", window.size());
    }

    #[tokio::test]
    async fn more_seats_are_found_again() {
        let window = window(64);
        succeed(&window, 4, FAST).await;
        window.enter().await.leave(Signal::Throttled);
        // The apiserver now grants more: growth past the old ceiling resumes its pace.
        succeed(&window, 2000, FAST).await;
        assert!(window.size() > 20, "{}", window.size());
    }

    #[tokio::test]
    async fn never_grows_past_the_maximum() {
        let window = window(2);
        succeed(&window, 10, FAST).await;
        assert_eq!((window.size(), window.permits.available_permits()), (2, 2));
    }

    #[tokio::test]
    async fn rising_latency_ends_slow_start_holds_then_shrinks() {
        let window = window(64);
        succeed(&window, 7, FAST).await;
        assert_eq!(window.size(), 8);
        // Latency climbs to twelve times the floor: the band where the window holds. Slow start
        // goes on until the smoothed latency has climbed past the band.
        let fair = Signal::Success(Duration::from_millis(60));
        succeed(&window, 40, fair).await;
        let held = window.size();
        succeed(&window, 40, fair).await;
        assert_eq!(window.size(), held, "between the bounds, the window holds");
        // Far past the band: it shrinks, one per window's worth of successes.
        let slow = Signal::Success(Duration::from_millis(200));
        succeed(&window, held * 3, slow).await;
        assert!(window.size() < held, "{} after {held}", window.size());
        assert_eq!(window.permits.available_permits(), window.size());
    }

    #[tokio::test]
    async fn latency_past_the_ceiling_shrinks_whatever_the_floor() {
        let window = window(16);
        let slowish = Signal::Success(Duration::from_millis(400));
        succeed(&window, 15, slowish).await;
        assert_eq!(window.size(), 16, "a slow but steady apiserver: its floor is its pace");
        succeed(&window, 200, Signal::Success(Duration::from_millis(900))).await;
        assert!(window.size() < 16, "{}", window.size());
    }

    #[tokio::test]
    async fn the_gentle_band_holds_where_the_fast_one_still_grows() {
        let gentle = Window::new(64, Band::GENTLE, None);
        let fast = window(64);
        for window in [&gentle, &fast] {
            succeed(window, 3, FAST).await;
        }
        // Twice the floor: too slow for the gentle band to grow, well inside the fast one.
        let slower = Signal::Success(Duration::from_millis(10));
        for window in [&gentle, &fast] {
            succeed(window, 200, slower).await;
        }
        let held = gentle.size();
        succeed(&gentle, 200, slower).await;
        assert_eq!(gentle.size(), held, "the gentle window holds");
        assert!(held < 12, "{held}");
        assert_eq!(fast.size(), 64, "the fast window grows to its maximum");
    }

    #[tokio::test]
    async fn says_what_holds_it_back() {
        let window = window(8);
        assert_eq!(window.holding(), Holding { size: 1, restraint: None }, "growing freely");
        succeed(&window, 7, FAST).await;
        assert_eq!(window.holding(), Holding { size: 8, restraint: None }, "at its maximum");
        window.enter().await.leave(Signal::Throttled);
        let throttled = Holding { size: 4, restraint: Some(Restraint::Throttling) };
        assert_eq!(window.holding(), throttled);
        // Grown past where it was throttled, then slowed down by latency.
        succeed(&window, 4 + 5 * PROBE_WINDOWS * 8, FAST).await;
        assert_eq!(window.holding(), Holding { size: 8, restraint: None });
        let slow = Signal::Success(Duration::from_millis(200));
        succeed(&window, 40, slow).await;
        let holding = window.holding();
        assert!(holding.size < 8, "{holding:?}");
        assert_eq!(holding.restraint, Some(Restraint::Latency));
    }

    #[tokio::test]
    async fn keeps_its_gauges_current_and_zeroes_them_when_gone() {
        let gauge = |name: &str| prometheus::IntGauge::new(name, "test").unwrap();
        let (size, latency, throttling) = (gauge("s"), gauge("l"), gauge("t"));
        let gauges =
            Gauges { size: size.clone(), restraints: [latency.clone(), throttling.clone()] };
        let window = Window::new(8, Band::FAST, Some(gauges));
        assert_eq!(size.get(), 1);
        succeed(&window, 3, FAST).await;
        window.enter().await.leave(Signal::Throttled);
        assert_eq!((size.get(), latency.get(), throttling.get()), (2, 0, 1));
        drop(window);
        assert_eq!((size.get(), latency.get(), throttling.get()), (0, 0, 0));
    }

    /// How long entering `window` waits, on a paused clock.
    async fn wait_to_enter(window: &Window) -> Duration {
        let start = Instant::now();
        let slot = window.enter().await;
        let waited = start.elapsed();
        slot.leave(Signal::Neutral);
        waited
    }

    #[tokio::test(start_paused = true)]
    async fn at_one_write_a_slower_apiserver_gets_idle_time_back() {
        // A gentle window held to one write: 5 ms is the floor, then the apiserver slows down.
        let window = Window::new(1, Band::GENTLE, None);
        succeed(&window, 1, FAST).await;
        assert_eq!(wait_to_enter(&window).await, Duration::ZERO, "at the floor, no spacing");
        // 2.25 times the floor: halfway into the band, half the maximum spacing.
        succeed(&window, 100, Signal::Success(Duration::from_micros(11_250))).await;
        let waited = wait_to_enter(&window).await.as_secs_f64();
        let expected = 0.5 * Band::GENTLE.max_spacing * 0.011_25;
        assert!((waited - expected).abs() < 0.001, "waited {waited} s, not {expected} s");
        let spaced = Holding { size: 1, restraint: Some(Restraint::Latency) };
        assert_eq!(window.holding(), spaced, "spaced, even at its maximum of one");
        // Past the band: the maximum.
        succeed(&window, 100, Signal::Success(Duration::from_millis(40))).await;
        let waited = wait_to_enter(&window).await.as_secs_f64();
        let expected = Band::GENTLE.max_spacing * 0.040;
        assert!((waited - expected).abs() < 0.002, "waited {waited} s, not {expected} s");
        // Back at the floor, back to back again.
        succeed(&window, 100, FAST).await;
        assert_eq!(wait_to_enter(&window).await, Duration::ZERO);
        assert_eq!(window.holding(), Holding { size: 1, restraint: None });
    }

    #[tokio::test(start_paused = true)]
    async fn the_fast_band_and_a_wider_window_never_space_writes() {
        let fast = Window::new(1, Band::FAST, None);
        let gentle = Window::new(8, Band::GENTLE, None);
        for window in [&fast, &gentle] {
            succeed(window, 3, FAST).await;
            succeed(window, 100, Signal::Success(Duration::from_millis(12))).await;
        }
        assert_eq!(wait_to_enter(&fast).await, Duration::ZERO);
        assert!(gentle.size() > 1, "{}", gentle.size());
        assert_eq!(wait_to_enter(&gentle).await, Duration::ZERO);
    }

    #[test]
    fn paces_and_restraints_read_back_from_their_names() {
        for name in Pace::NAMES {
            assert_eq!(Pace::parse(name).map(Pace::name), Some(name));
        }
        assert_eq!(Pace::parse("Fast"), None, "names are exact");
        for restraint in Restraint::ALL {
            assert_eq!(Restraint::parse(restraint.name()), Some(restraint));
        }
    }
}
