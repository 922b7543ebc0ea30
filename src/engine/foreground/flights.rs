//! How many gentle writes may be in flight at once: what the rate needs, and a little more.
//!
//! The rate spaces writes as they leave, not as they come back. While the apiserver stalls (its
//! collector, a burst of other load), writes that kept leaving at the rate would pile up, a whole
//! window's worth, for the apiserver to work off after the stall while its other clients wait
//! behind them. Held to what the rate needs, a stall queues a few.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::Foreground;

/// Answered writes whose latency is averaged: a few seconds' worth at the gentle rates, so that a
/// short stall moves the mean a little, and a slower resource (a conversion webhook) moves it
/// within its first writes.
const RECENT: usize = 200;

/// Writes in flight allowed at any rate, so that one slow write does not stop the next.
const LEAST: usize = 2;

/// A gentle write admitted and not yet answered: it lands when dropped.
#[must_use = "the write is in flight until this is dropped"]
pub struct Flight {
    gate: Arc<Foreground>,
    /// The write's latency, once answered.
    took: Option<Duration>,
    /// The revision its answer carried.
    revision: Option<u64>,
}

impl Flight {
    /// A write that left through `gate`.
    pub(super) fn new(gate: Arc<Foreground>) -> Flight {
        Flight { gate, took: None, revision: None }
    }

    /// The write was answered after `took` (done, or nothing left to do), with `revision` if
    /// it wrote: the latency counts toward the room, the revision tells others' writes from
    /// kube-svm's. A write unanswered, refused or throttled lands without either.
    pub fn answered(mut self, took: Duration, revision: Option<u64>) {
        self.took = Some(took);
        self.revision = revision;
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        state.flights.landed(self.took);
        if let Some(revision) = self.revision {
            state.company.wrote(tokio::time::Instant::now(), revision);
        }
        drop(state);
        self.gate.landed.notify_one();
    }
}

/// The gentle writes in flight, and how long the recent answered ones took.
#[derive(Debug)]
pub struct Flights {
    /// The room, as a multiple of the writes the rate keeps in flight on average (Little's law:
    /// objects/s times the mean latency), so that the writes of the rate keep going while their
    /// latency varies around its mean, and a stall of the apiserver still holds back all but a few.
    headroom: f64,
    aloft: usize,
    recent: VecDeque<Duration>,
}

impl Flights {
    /// No write in flight yet, with room for `headroom` times what the rate needs.
    pub fn new(headroom: f64) -> Flights {
        Flights { headroom, aloft: 0, recent: VecDeque::new() }
    }

    /// Whether one more write may leave at `rate` objects per second.
    pub fn room(&self, rate: f64) -> bool {
        self.aloft < self.most(rate)
    }

    /// The writes allowed in flight at once at `rate`.
    pub fn most(&self, rate: f64) -> usize {
        if self.recent.is_empty() {
            return LEAST;
        }
        let mean = self.recent.iter().sum::<Duration>() / self.recent.len() as u32;
        let needed = (rate * mean.as_secs_f64() * self.headroom).ceil();
        // A float past usize's range saturates: the writes are bounded by the window anyway.
        (needed as usize).max(LEAST)
    }

    /// Whether any write is in flight.
    pub fn aloft(&self) -> bool {
        self.aloft > 0
    }

    /// A write left.
    pub fn left(&mut self) {
        self.aloft += 1;
    }

    /// A write that left came back, answered after `took`, if it was.
    pub fn landed(&mut self, took: Option<Duration>) {
        self.aloft = self.aloft.saturating_sub(1);
        let Some(took) = took else { return };
        self.recent.push_back(took);
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn answered(flights: &mut Flights, times: usize, took: Duration) {
        for _ in 0..times {
            flights.left();
            flights.landed(Some(took));
        }
    }

    #[test]
    fn the_room_is_what_the_rate_needs_at_the_mean_latency_with_headroom() {
        let mut flights = Flights::new(3.0);
        assert_eq!(flights.most(100.0), LEAST, "before any write was answered");
        answered(&mut flights, 1, ms(5));
        answered(&mut flights, 1, ms(15));
        // 100 objects/s at 10 ms keep one in flight; three times that.
        assert_eq!(flights.most(100.0), 3);
        assert_eq!(flights.most(400.0), 12);
        assert_eq!(flights.most(20.0), LEAST, "never below the least");
    }

    #[test]
    fn writes_aloft_fill_the_room_and_free_it_as_they_land() {
        let mut flights = Flights::new(3.0);
        assert!(flights.room(50.0) && !flights.aloft());
        flights.left();
        flights.left();
        assert!(!flights.room(50.0) && flights.aloft(), "a stall holds the third");
        flights.landed(None);
        assert!(flights.room(50.0));
    }

    #[test]
    fn unanswered_writes_do_not_count_toward_the_room() {
        let mut flights = Flights::new(3.0);
        answered(&mut flights, 10, ms(100));
        for _ in 0..RECENT {
            flights.left();
            flights.landed(None);
        }
        assert_eq!(flights.most(100.0), 30, "refusals and cancelled writes took no time");
    }

    #[test]
    fn a_short_stall_widens_the_room_a_little_a_slower_resource_fully() {
        let mut flights = Flights::new(3.0);
        answered(&mut flights, RECENT, ms(5));
        answered(&mut flights, 2, Duration::from_secs(1));
        assert_eq!(flights.most(100.0), 5, "two writes of a 1 s stall: 15 ms on average");
        answered(&mut flights, RECENT, ms(100));
        assert_eq!(flights.most(100.0), 30, "a webhook's 100 ms: the rate still fits");
    }
}
