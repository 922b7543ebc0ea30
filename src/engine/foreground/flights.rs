//! How many gentle writes may be in flight at once: what the rate needs, and a little more.
//!
//! The rate spaces writes as they leave, not as they come back. While the apiserver stalls (its
//! collector, a burst of other load) the writes of the rate kept leaving, up to a whole window's
//! worth (64), and the apiserver worked them off after the stall while its other clients
//! waited behind them: at 100,000 objects such spells read 55 to 114 ms on the foreground under
//! kube-svm's writes, and 20 ms at idle. Held to what the rate needs, a stall queues a few.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Foreground;

/// Flights the fastest recent one is taken from: a few seconds of writes, so that a stall
/// shorter than that does not widen the room, and a slower resource (a conversion webhook)
/// widens it within seconds.
const RECENT: usize = 200;

/// The room, as a multiple of the writes the rate keeps in flight at the fastest recent flight
/// (Little's law): writes up to this many times slower than the fastest keep the rate.
const HEADROOM: f64 = 3.0;

/// Writes in flight allowed at any rate, so that one slow write does not stop the next.
const LEAST: usize = 2;

/// A gentle write admitted and not yet answered: it lands when dropped.
pub struct Flight {
    gate: Arc<Foreground>,
    since: Instant,
}

impl Flight {
    /// A write that left through `gate` now.
    pub(super) fn new(gate: Arc<Foreground>) -> Flight {
        Flight { gate, since: Instant::now() }
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.gate.lock().flights.landed(self.since.elapsed());
        self.gate.landed.notify_one();
    }
}

/// The gentle writes in flight, and how long the recent ones took.
#[derive(Debug, Default)]
pub struct Flights {
    aloft: usize,
    recent: VecDeque<Duration>,
}

impl Flights {
    /// Whether one more write may leave at `rate` objects per second.
    pub fn room(&self, rate: f64) -> bool {
        self.aloft < self.most(rate)
    }

    /// The writes allowed in flight at once at `rate`.
    pub fn most(&self, rate: f64) -> usize {
        let Some(fastest) = self.recent.iter().min() else { return LEAST };
        let needed = (rate * fastest.as_secs_f64() * HEADROOM).ceil();
        // A float past usize's range saturates: no limit beyond the writes already bounded.
        (needed as usize).max(LEAST)
    }

    /// A write left.
    pub fn left(&mut self) {
        self.aloft += 1;
    }

    /// A write that left came back after `took`.
    pub fn landed(&mut self, took: Duration) {
        self.aloft = self.aloft.saturating_sub(1);
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

    #[test]
    fn the_room_is_what_the_rate_needs_at_the_fastest_recent_write_with_headroom() {
        let mut flights = Flights::default();
        assert_eq!(flights.most(100.0), LEAST, "before any write came back");
        flights.left();
        flights.landed(ms(20));
        flights.left();
        flights.landed(ms(10));
        // 100 objects/s at 10 ms keep one in flight; three times that.
        assert_eq!(flights.most(100.0), 3);
        assert_eq!(flights.most(400.0), 12);
        assert_eq!(flights.most(20.0), LEAST, "never below the least");
    }

    #[test]
    fn writes_aloft_fill_the_room_and_free_it_as_they_land() {
        let mut flights = Flights::default();
        assert!(flights.room(50.0));
        flights.left();
        flights.left();
        assert!(!flights.room(50.0), "a stall holds the third");
        flights.landed(ms(5));
        assert!(flights.room(50.0));
    }

    #[test]
    fn a_stall_shorter_than_the_recent_flights_does_not_widen_the_room_a_slower_resource_does() {
        let mut flights = Flights::default();
        for _ in 0..RECENT {
            flights.left();
            flights.landed(ms(5));
        }
        for _ in 0..3 {
            flights.left();
            flights.landed(Duration::from_secs(1));
        }
        assert_eq!(flights.most(100.0), LEAST, "the stall's writes are not the fastest");
        for _ in 0..RECENT {
            flights.left();
            flights.landed(ms(100));
        }
        assert_eq!(flights.most(100.0), 30, "a webhook's 100 ms: the rate still fits");
    }
}
