//! When to try a request again, and how long to wait first. Pure logic.

use std::time::Duration;

use crate::apiserver::answers;

/// What to do after a failed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Wait this long, then try again.
    After(Duration),
    /// The failure is final for this request.
    Never,
}

/// Exponential backoff with full jitter, capped; `Retry-After` from the server wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry, before jitter.
    pub base: Duration,
    /// Longest delay backoff alone chooses.
    pub cap: Duration,
    /// Longest `Retry-After` honoured; a server asking for more gets this.
    pub retry_after_cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            // client-go's default backoff for throttled requests starts at 1 s; kube-svm retries
            // per object, so it starts lower and relies on Retry-After, which APF always sends.
            base: Duration::from_millis(200),
            cap: Duration::from_secs(10),
            // kube-apiserver's APF suggests 1 s; a minute bounds a misbehaving proxy.
            retry_after_cap: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The decision after the `attempt`-th failure (1 for the first), with `jitter` in [0, 1):
    /// the failure answered `code` (`None`: no answer at all) and maybe `Retry-After`.
    pub fn decide(
        &self,
        code: Option<u16>,
        retry_after: Option<Duration>,
        attempt: u32,
        jitter: f64,
    ) -> Retry {
        match code {
            None => Retry::After(self.exponential(attempt, jitter)),
            Some(code) if answers::is_transient_code(code) => match retry_after {
                // A little jitter spreads the writers the server throttled together.
                Some(wait) => {
                    Retry::After(wait.min(self.retry_after_cap).mul_f64(1.0 + jitter / 10.0))
                }
                None => Retry::After(self.exponential(attempt, jitter)),
            },
            Some(_) => Retry::Never,
        }
    }

    fn exponential(&self, attempt: u32, jitter: f64) -> Duration {
        let ceiling = crate::rules::backoff::doubling(attempt, self.base, self.cap);
        // Full jitter in [ceiling / 2, ceiling): never hammer, never stall.
        ceiling.mul_f64(0.5 + jitter.clamp(0.0, 1.0) / 2.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_are_final() {
        let backoff = Backoff::default();
        for code in [400, 403, 404, 409, 410, 422] {
            assert_eq!(backoff.decide(Some(code), None, 1, 0.5), Retry::Never, "{code}");
        }
    }

    #[test]
    fn throttling_server_errors_and_transport_errors_are_retried() {
        let backoff = Backoff::default();
        for code in [Some(429), Some(500), Some(503), Some(504), None] {
            assert!(matches!(backoff.decide(code, None, 1, 0.5), Retry::After(_)), "{code:?}");
        }
    }

    #[test]
    fn retry_after_is_honoured_and_capped() {
        let backoff = Backoff::default();
        let throttled =
            |secs, jitter| backoff.decide(Some(429), Some(Duration::from_secs(secs)), 1, jitter);
        assert_eq!(throttled(3, 0.0), Retry::After(Duration::from_secs(3)));
        assert_eq!(throttled(3600, 0.0), Retry::After(Duration::from_secs(60)));
        let Retry::After(jittered) = throttled(10, 0.99) else { panic!() };
        assert!(jittered >= Duration::from_secs(10) && jittered < Duration::from_secs(11));
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let backoff = Backoff::default();
        let delay = |attempt, jitter| match backoff.decide(None, None, attempt, jitter) {
            Retry::After(delay) => delay,
            Retry::Never => panic!("transport errors are retried"),
        };
        assert_eq!(delay(1, 0.0), Duration::from_millis(100));
        assert_eq!(delay(1, 1.0), Duration::from_millis(200));
        assert_eq!(delay(2, 1.0), Duration::from_millis(400));
        assert_eq!(delay(3, 0.0), Duration::from_millis(400));
        assert_eq!(delay(30, 1.0), Duration::from_secs(10));
        assert_eq!(delay(u32::MAX, 1.0), Duration::from_secs(10));
    }
}
