//! How many writes of one migration are sent at once. The window reacts to the two signals the
//! apiserver gives:
//!
//! - **Throttling** (429, API Priority and Fairness): the window halves, as TCP's congestion
//!   window does on loss, so a migration settles at the concurrency its priority level grants
//!   instead of retrying in a herd.
//! - **Latency**, as TCP Vegas reads it: the fastest write seen is the apiserver's floor; while
//!   the smoothed latency stays within [`GROW_BELOW`] times that floor the window grows (by one
//!   per success at first, then by one per window's worth of successes); above [`SHRINK_ABOVE`]
//!   times the floor, or above [`LATENCY_CEILING`] at all, it shrinks by one per window's worth.
//!   In between it holds.
//!
//! The band is wide on purpose. A CPU-bound apiserver's latency climbs with every write added
//! beyond a few while its throughput still grows slowly; measured on the bench's control plane
//! (`make bench`, 3,000 objects): 5 ms and 188 objects/s at one write in flight, 18 ms and 406 at
//! 8, 63 ms and 446 at 32, 119 ms and 483 at 64. A narrow band would hold the window near 4 and
//! leave a fifth of the throughput unused; this one settles between about 20 and 50, near the
//! apiserver's limit, and gives way as soon as anything else makes the apiserver slower.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

/// Smoothed latency below this many times the floor: the apiserver has room, grow.
const GROW_BELOW: f64 = 10.0;

/// Smoothed latency above this many times the floor: requests are queueing, shrink.
const SHRINK_ABOVE: f64 = 20.0;

/// Smoothed latency above this, whatever the floor, shrinks the window: other clients of the
/// apiserver would feel it.
const LATENCY_CEILING: Duration = Duration::from_millis(500);

/// Windows' worth of successes before the window grows back to the size last throttled: with
/// 4 seats granted, about one write in 70 is rejected instead of one in 8 (measured against
/// API Priority and Fairness in the tests; kube-svm aims at no more than one in 20).
const PROBE_WINDOWS: usize = 16;

/// Weight of a new sample in the smoothed latency (TCP's 1/8).
const SMOOTHING: f64 = 0.125;

pub struct Window {
    permits: Semaphore,
    max: usize,
    state: Mutex<State>,
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
#[derive(Debug, PartialEq, Eq)]
enum Load {
    Light,
    Fair,
    Heavy,
}

impl Window {
    pub fn new(max: usize) -> Window {
        let max = max.max(1);
        Window {
            permits: Semaphore::new(1),
            max,
            state: Mutex::new(State {
                size: 1,
                to_retire: 0,
                successes: 0,
                threshold: max,
                throttled_at: None,
                floor: None,
                smoothed: None,
            }),
        }
    }

    /// Waits for room in the window.
    pub async fn enter(&self) -> Slot<'_> {
        // The semaphore is never closed, so acquiring cannot fail; fall back to no permit.
        let permit = self.permits.acquire().await.ok();
        Slot { window: self, permit }
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
        match signal {
            Signal::Throttled => {
                state.throttled_at = Some(state.size);
                let halved = state.size.div_ceil(2);
                self.shrink(&mut state, halved);
            }
            Signal::Success(latency) => match state.observe(latency) {
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
                        // Past the size last throttled, the apiserver has room again.
                        if state.throttled_at.is_some_and(|at| state.size > at) {
                            state.throttled_at = None;
                        }
                    }
                }
                Load::Light | Load::Fair => {}
            },
            Signal::Neutral => {}
        }
        if let Some(permit) = permit
            && state.to_retire > 0
        {
            state.to_retire -= 1;
            permit.forget();
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

impl State {
    /// Takes one write's latency into the floor and the smoothed latency; says what they show.
    fn observe(&mut self, latency: Duration) -> Load {
        let sample = latency.as_secs_f64();
        let floor = *self.floor.get_or_insert(sample);
        let floor = floor.min(sample);
        self.floor = Some(floor);
        let smoothed = match self.smoothed {
            None => sample,
            Some(previous) => previous + SMOOTHING * (sample - previous),
        };
        self.smoothed = Some(smoothed);
        if smoothed > LATENCY_CEILING.as_secs_f64() || smoothed > floor * SHRINK_ABOVE {
            Load::Heavy
        } else if smoothed < floor * GROW_BELOW {
            Load::Light
        } else {
            Load::Fair
        }
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

    async fn succeed(window: &Window, times: usize, signal: Signal) {
        for _ in 0..times {
            window.enter().await.leave(signal);
        }
    }

    #[tokio::test]
    async fn starts_at_one_and_grows_by_one_per_fast_success_until_throttled() {
        let window = Window::new(8);
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
        let window = Window::new(8);
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
        let window = Window::new(4);
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
        let window = Window::new(64);
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
        let window = Window::new(64);
        succeed(&window, 4, FAST).await;
        window.enter().await.leave(Signal::Throttled);
        // The apiserver now grants more: growth past the old ceiling resumes its pace.
        succeed(&window, 2000, FAST).await;
        assert!(window.size() > 20, "{}", window.size());
    }

    #[tokio::test]
    async fn never_grows_past_the_maximum() {
        let window = Window::new(2);
        succeed(&window, 10, FAST).await;
        assert_eq!((window.size(), window.permits.available_permits()), (2, 2));
    }

    #[tokio::test]
    async fn rising_latency_ends_slow_start_holds_then_shrinks() {
        let window = Window::new(64);
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
        let window = Window::new(16);
        let slowish = Signal::Success(Duration::from_millis(400));
        succeed(&window, 15, slowish).await;
        assert_eq!(window.size(), 16, "a slow but steady apiserver: its floor is its pace");
        succeed(&window, 200, Signal::Success(Duration::from_millis(900))).await;
        assert!(window.size() < 16, "{}", window.size());
    }
}
