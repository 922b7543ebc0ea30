//! The foreground's latencies of each minute, printed to stderr as the minute ends, with the time
//! of day and what the apiserver says of itself meanwhile: a run stopped before its end (a long
//! one) still tells what the foreground felt, minute by minute, beside the controller's log.
//! Also what every latency figure of the bench is made of: one foreground [`Request`], and the
//! nearest-rank quantile ([`nearest_rank`]).

use std::time::{Duration, Instant};

use crate::meter::ApiserverAccount;

/// The latencies of the minute under way.
pub struct Minutes {
    from: Instant,
    millis: Vec<f64>,
}

impl Minutes {
    pub fn new() -> Minutes {
        Minutes { from: Instant::now(), millis: Vec::new() }
    }

    /// Records one latency; the minute's line once it ends.
    pub fn record(&mut self, took: Duration) -> Option<String> {
        self.millis.push(took.as_secs_f64() * 1000.0);
        if self.from.elapsed() < Duration::from_secs(60) {
            return None;
        }
        self.millis.sort_by(f64::total_cmp);
        let line = format!(
            "foreground minute to {} UTC: p50 / p99 / max {:.1} / {:.1} / {:.0} ms over {} requests",
            &clock(Instant::now())[..8],
            nearest_rank(&self.millis, 0.50),
            nearest_rank(&self.millis, 0.99),
            self.millis[self.millis.len() - 1],
            self.millis.len(),
        );
        *self = Minutes::new();
        Some(line)
    }

    /// What the apiserver did in the minute, from its account at the minute's end (`now`) and at
    /// the last one's (`before`), for the end of the minute's line; empty when either is missing.
    pub fn account(now: Option<ApiserverAccount>, before: Option<ApiserverAccount>) -> String {
        match (now, before) {
            (Some(now), Some(before)) => format!(
                "; the apiserver collected its heap {} times, {:.2} GiB in use, \
                 checked its watch cache of widgets against etcd {} times",
                now.collections - before.collections,
                now.inuse / f64::from(1 << 30),
                now.checks - before.checks,
            ),
            _ => String::new(),
        }
    }
}

/// The time of day (UTC) at `at`, to the millisecond.
pub fn clock(at: Instant) -> String {
    let now = std::time::SystemTime::now();
    let then = now.checked_sub(at.elapsed()).unwrap_or(now);
    let millis = then.duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis());
    let seconds = millis / 1000 % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        millis % 1000
    )
}

/// One foreground request: when it was sent, how long it took, whether it succeeded.
#[derive(Clone, Copy)]
pub struct Request {
    pub sent: Instant,
    pub took: Duration,
    pub ok: bool,
}

/// The `p` quantile of `sorted` (not empty), nearest rank.
pub fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}
