//! What the gentle pace last saw, as the status, `kube-svm status` and the law's log lines say it.

use std::fmt;
use std::time::Duration;

use crate::api::Budget;

use super::{guard, heap};

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
    /// What the apiserver allocates per gentle write, against its headroom, and the rate that
    /// keeps its costly collections to one a minute, where kube-svm may read its `/metrics`.
    pub heap: Option<heap::Ceiling>,
}

// The rate is never NaN: it starts finite and is only multiplied and bounded; a share of long
// waits is of 200 waits at least; a heap's figures are of positive spans and counts.
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
        }?;
        if let Some(heap) = self.heap {
            let mib = |bytes: f64| bytes / (1024.0 * 1024.0);
            write!(
                f,
                "; the apiserver collects its heap every {:.0} MiB",
                mib(heap.per_collection)
            )?;
            if let Some(per_write) = heap.per_write {
                write!(f, " it allocates, {:.2} MiB a write", mib(per_write))?;
            }
            if let Some(rate) = heap.rate {
                write!(f, ": once a minute at {rate:.1} objects/s")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            heap: None,
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
        let mib = 1024.0 * 1024.0;
        let read = heap::Ceiling {
            headroom: 800.0 * mib,
            per_collection: 400.0 * mib,
            per_write: None,
            rate: None,
        };
        assert_eq!(
            Steered { heap: Some(read), ..unlooked }.to_string(),
            "probe p99 7.0ms, budget 25.0ms; 24.0 objects/s; the apiserver collects its heap every 400 MiB"
        );
        let small = heap::Ceiling { per_write: Some(0.38 * mib), ..read };
        assert_eq!(
            Steered { heap: Some(small), ..unlooked }.to_string(),
            "probe p99 7.0ms, budget 25.0ms; 24.0 objects/s; the apiserver collects its heap every 400 MiB it allocates, 0.38 MiB a write"
        );
        let costly = heap::Ceiling {
            headroom: 3072.0 * mib,
            per_collection: 1536.0 * mib,
            rate: Some(21.6),
            ..small
        };
        assert_eq!(
            Steered { heap: Some(costly), ..unlooked }.to_string(),
            "probe p99 7.0ms, budget 25.0ms; 24.0 objects/s; the apiserver collects its heap every 1536 MiB it allocates, 0.38 MiB a write: once a minute at 21.6 objects/s"
        );
    }
}
