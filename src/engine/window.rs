//! How many writes of one migration are sent at once, as TCP sizes its congestion window: the
//! window starts at one and grows by one per success (slow start) until the apiserver first
//! throttles (429); from then on a throttled request halves it and a window's worth of successes
//! widens it by one, never past `--writes-in-flight`. Under API Priority and Fairness this keeps a
//! migration at the concurrency its priority level grants, instead of retrying in a herd that
//! makes the apiserver ask for ever longer `Retry-After` waits.

use std::sync::Mutex;

use tokio::sync::{Semaphore, SemaphorePermit};

pub struct Window {
    permits: Semaphore,
    max: usize,
    state: Mutex<State>,
}

#[derive(Debug, PartialEq, Eq)]
struct State {
    /// The current window.
    size: usize,
    /// Permits to retire as they come back, after a decrease.
    to_retire: usize,
    /// Successes since the last change.
    successes: usize,
    /// Below this size the window grows by one per success (slow start).
    threshold: usize,
}

/// What the caller learnt from one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Success,
    Throttled,
    /// Neither: an error that says nothing about load.
    Neutral,
}

impl Window {
    pub fn new(max: usize) -> Window {
        let max = max.max(1);
        Window {
            permits: Semaphore::new(1),
            max,
            state: Mutex::new(State { size: 1, to_retire: 0, successes: 0, threshold: max }),
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
            Signal::Throttled if state.size == 1 => state.threshold = 1,
            Signal::Throttled => {
                let new_size = state.size.div_ceil(2);
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
            Signal::Success if state.size < self.max => {
                state.successes += 1;
                if state.size < state.threshold || state.successes >= state.size {
                    state.successes = 0;
                    state.size += 1;
                    // Growing first cancels a pending retirement, else adds a permit.
                    if state.to_retire > 0 {
                        state.to_retire -= 1;
                    } else {
                        self.permits.add_permits(1);
                    }
                }
            }
            _ => {}
        }
        if let Some(permit) = permit
            && state.to_retire > 0
        {
            state.to_retire -= 1;
            permit.forget();
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

    async fn succeed(window: &Window, times: usize) {
        for _ in 0..times {
            window.enter().await.leave(Signal::Success);
        }
    }

    #[tokio::test]
    async fn starts_at_one_and_grows_by_one_per_success_until_throttled() {
        let window = Window::new(8);
        assert_eq!((window.size(), window.permits.available_permits()), (1, 1));
        succeed(&window, 3).await;
        assert_eq!((window.size(), window.permits.available_permits()), (4, 4));
        window.enter().await.leave(Signal::Throttled);
        assert_eq!((window.size(), window.permits.available_permits()), (2, 2));
        // Past the first throttling, a window's worth of successes adds one.
        succeed(&window, 1).await;
        assert_eq!(window.size(), 2);
        succeed(&window, 1).await;
        assert_eq!(window.size(), 3);
        window.enter().await.leave(Signal::Neutral);
        assert_eq!(window.size(), 3);
    }

    #[tokio::test]
    async fn never_shrinks_below_one() {
        let window = Window::new(8);
        succeed(&window, 7).await;
        for _ in 0..5 {
            window.enter().await.leave(Signal::Throttled);
        }
        assert_eq!((window.size(), window.permits.available_permits()), (1, 1));
        succeed(&window, 1).await;
        assert_eq!(window.size(), 2, "throttled at one: congestion avoidance from there");
        succeed(&window, 1).await;
        assert_eq!(window.size(), 2);
    }

    #[tokio::test]
    async fn permits_held_during_a_decrease_are_retired_when_they_return() {
        let window = Window::new(4);
        succeed(&window, 3).await;
        let slots = [window.enter().await, window.enter().await, window.enter().await];
        window.enter().await.leave(Signal::Throttled);
        assert_eq!(window.size(), 2);
        for slot in slots {
            slot.leave(Signal::Neutral);
        }
        assert_eq!(window.permits.available_permits(), 2, "in flight never exceeds the window");
    }

    #[tokio::test]
    async fn never_grows_past_the_maximum() {
        let window = Window::new(2);
        succeed(&window, 10).await;
        assert_eq!((window.size(), window.permits.available_permits()), (2, 2));
    }
}
