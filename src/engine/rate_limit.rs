//! A token bucket shared by every request the engine sends: `--kube-api-qps` tokens per second,
//! at most `--kube-api-burst` saved up, as client-go's rate limiter does.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The default of `--kube-api-qps`: no client-side limit. A fixed rate either binds below what
/// the apiserver can spare (100 QPS held kube-svm to a third of a small apiserver's limit) or
/// protects nothing; the write window reads the apiserver's own signals instead (429 from API
/// Priority and Fairness, rising latency). Operators who want a fixed cap still set it.
pub const DEFAULT_QPS: f64 = 0.0;

/// The default of `--kube-api-burst`.
pub const DEFAULT_BURST: u32 = 200;

/// The token bucket; one per process, shared by every engine clone.
pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<Bucket>,
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

impl RateLimiter {
    /// A limiter allowing `qps` requests per second on average and `burst` at once. A `qps` of
    /// zero or less disables limiting.
    pub fn new(qps: f64, burst: u32) -> RateLimiter {
        let burst = f64::from(burst.max(1));
        RateLimiter {
            qps,
            burst,
            state: Mutex::new(Bucket { tokens: burst, updated: Instant::now() }),
        }
    }

    /// Waits until a request may be sent.
    pub async fn acquire(&self) {
        if let Some(wait) = self.reserve(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }

    /// Takes a token, possibly borrowed from the future; returns how long to wait for it.
    fn reserve(&self, now: Instant) -> Option<Duration> {
        if self.qps <= 0.0 {
            return None;
        }
        // A poisoned lock only means another task panicked mid-update; the bucket is still valid.
        let mut bucket = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.qps).min(self.burst);
        bucket.updated = now;
        bucket.tokens -= 1.0;
        (bucket.tokens < 0.0).then(|| Duration::from_secs_f64(-bucket.tokens / self.qps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_requests_are_spaced_at_the_rate() {
        let limiter = RateLimiter::new(10.0, 3);
        let start = Instant::now();
        for _ in 0..3 {
            assert_eq!(limiter.reserve(start), None);
        }
        let waits: Vec<_> = (0..3).map(|_| limiter.reserve(start).unwrap()).collect();
        assert_eq!(waits, [100, 200, 300].map(Duration::from_millis));
    }

    #[test]
    fn tokens_refill_over_time_up_to_the_burst() {
        let limiter = RateLimiter::new(10.0, 2);
        let start = Instant::now();
        limiter.reserve(start);
        limiter.reserve(start);
        assert!(limiter.reserve(start).is_some());
        // One minute later the bucket holds `burst` tokens again, not 600.
        let later = start + Duration::from_secs(60);
        assert_eq!(limiter.reserve(later), None);
        assert_eq!(limiter.reserve(later), None);
        assert!(limiter.reserve(later).is_some());
    }

    #[test]
    fn zero_qps_disables_limiting() {
        let limiter = RateLimiter::new(0.0, 1);
        let now = Instant::now();
        assert!((0..1000).all(|_| limiter.reserve(now).is_none()));
    }
}
