//! Whether this process may still write, and for how long.
//!
//! A leader's right to write ends at a point in time it knows in advance: its last successful
//! lease renewal plus the renew deadline, which comes before any other replica may take the lease
//! over. The leader keeps a [`Fence`] at that point, and every request that writes (an object, a
//! migration's status, a CRD's `storedVersions`) checks it first and gets no more time than is
//! left. So a leader that was paused, or whose connection hung, sends nothing once its term is
//! over, even before the code that renews the lease has run again. Without leader election the
//! fence never closes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// A shared, movable deadline for writes. Cheap to clone; clones share the deadline.
#[derive(Clone, Debug)]
pub struct Fence(Option<Arc<Term>>);

#[derive(Debug)]
struct Term {
    /// The instant the deadline is measured from.
    origin: Instant,
    /// The deadline, in microseconds after `origin`; 0 when closed.
    until_micros: AtomicU64,
}

impl Fence {
    /// A fence that never closes: this process is the only writer.
    pub fn open() -> Fence {
        Fence(None)
    }

    /// A fence open until `until`.
    pub fn until(until: Instant) -> Fence {
        let origin = Instant::now();
        let until_micros = AtomicU64::new(micros_after(origin, until));
        Fence(Some(Arc::new(Term { origin, until_micros })))
    }

    /// Moves the deadline later (never earlier) to `until`; a closed fence stays closed.
    pub fn extend_to(&self, until: Instant) {
        if let Some(term) = &self.0 {
            let micros = micros_after(term.origin, until);
            let _ = term.until_micros.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now != 0 && micros > now).then_some(micros)
            });
        }
    }

    /// Closes the fence for good: nothing may be written any more.
    pub fn close(&self) {
        if let Some(term) = &self.0 {
            term.until_micros.store(0, Ordering::Release);
        }
    }

    /// How long writes may still go on; `None` when the fence never closes, zero once closed.
    pub fn remaining(&self) -> Option<Duration> {
        let term = self.0.as_ref()?;
        let until = term.until_micros.load(Ordering::Acquire);
        let until = term.origin + Duration::from_micros(until);
        Some(until.saturating_duration_since(Instant::now()))
    }

    /// Whether a write may be sent now.
    pub fn holds(&self) -> bool {
        self.remaining().is_none_or(|left| !left.is_zero())
    }

    /// The time a request sent now may take: `limit`, or less when the fence closes sooner.
    /// `None` when the fence is closed.
    pub fn deadline(&self, limit: Duration) -> Option<Duration> {
        match self.remaining() {
            None => Some(limit),
            Some(left) if left.is_zero() => None,
            Some(left) => Some(left.min(limit)),
        }
    }
}

/// `until` in microseconds after `origin`, at least 1 (0 means closed).
fn micros_after(origin: Instant, until: Instant) -> u64 {
    let micros = until.saturating_duration_since(origin).as_micros();
    u64::try_from(micros).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_open_fence_always_holds() {
        let fence = Fence::open();
        assert!(fence.holds());
        assert_eq!(fence.deadline(Duration::from_secs(30)), Some(Duration::from_secs(30)));
        fence.close();
        assert!(fence.holds(), "closing an open fence does nothing: there is no lease");
    }

    #[tokio::test(start_paused = true)]
    async fn a_term_closes_at_its_deadline_unless_extended() {
        let fence = Fence::until(Instant::now() + Duration::from_secs(10));
        assert_eq!(fence.deadline(Duration::from_secs(30)), Some(Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(fence.deadline(Duration::from_secs(30)), Some(Duration::from_secs(6)));
        assert_eq!(fence.deadline(Duration::from_secs(2)), Some(Duration::from_secs(2)));
        fence.extend_to(Instant::now() + Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(fence.holds());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!fence.holds());
        assert_eq!(fence.deadline(Duration::from_secs(30)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_never_moves_earlier_and_closing_is_final() {
        let fence = Fence::until(Instant::now() + Duration::from_secs(10));
        let clone = fence.clone();
        clone.extend_to(Instant::now() + Duration::from_secs(5));
        assert_eq!(fence.remaining(), Some(Duration::from_secs(10)));
        clone.close();
        assert!(!fence.holds(), "clones share the term");
        fence.extend_to(Instant::now() + Duration::from_secs(20));
        assert!(!fence.holds(), "a late renewal does not reopen a closed term");
    }
}
