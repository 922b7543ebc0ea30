//! How hard a migration presses the apiserver: the `--pace` flag and the `kube-svm.io/pace`
//! annotation, and the gentle pace's budget (`--foreground-budget`,
//! `kube-svm.io/foreground-budget`). The latency band each pace keeps its writes in is the engine's
//! (`crate::engine::Band`).

use std::fmt;
use std::time::Duration;

/// How hard a migration presses the apiserver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pace {
    /// The cluster's own traffic first: writes go at a rate steered by a probe of what other
    /// clients feel, within the foreground [`Budget`] (or, with the budget off, in a window
    /// that grows only while the apiserver answers within [`Band::GENTLE`]).
    #[default]
    Gentle,
    /// The apiserver's whole throughput, for maintenance windows: [`Band::FAST`].
    Fast,
}

impl Pace {
    /// Every pace's name, as flags and annotations spell them.
    pub const NAMES: [&str; 2] = ["gentle", "fast"];

    /// As the `--pace` flag, the `kube-svm.io/pace` annotation and `kube-svm status` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Pace::Gentle => "gentle",
            Pace::Fast => "fast",
        }
    }

    /// The pace named `name` (`gentle` or `fast`).
    pub fn parse(name: &str) -> Option<Pace> {
        match name {
            "gentle" => Some(Pace::Gentle),
            "fast" => Some(Pace::Fast),
            _ => None,
        }
    }
}

/// How slow the probe may get while the gentle pace writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// This many times the probe's quiet baseline.
    Relative(f64),
    /// A fixed latency.
    Fixed(Duration),
}

impl Default for Budget {
    fn default() -> Budget {
        Budget::Relative(2.0)
    }
}

impl Budget {
    /// Reads `3x` (a multiple of the baseline, more than 1) or `25ms` (a latency, at least 1 ms).
    pub fn parse(text: &str) -> Result<Budget, String> {
        let text = text.trim();
        let number = |digits: &str| digits.trim().parse::<f64>().ok().filter(|n| n.is_finite());
        if let Some(times) = text.strip_suffix('x').and_then(number) {
            if times <= 1.0 {
                return Err(format!("{text:?}: a multiple of the baseline must be more than 1"));
            }
            return Ok(Budget::Relative(times));
        }
        if let Some(ms) = text.strip_suffix("ms").and_then(number) {
            if ms < 1.0 {
                return Err(format!("{text:?}: a latency budget must be at least 1ms"));
            }
            return Ok(Budget::Fixed(Duration::from_secs_f64(ms / 1000.0)));
        }
        Err(format!("{text:?} is neither a multiple of the baseline (3x) nor a latency (25ms)"))
    }

    /// The latency the probe may reach, given its quiet `baseline`; `None` while a relative
    /// budget has no baseline yet.
    pub fn limit(self, baseline: Option<Duration>) -> Option<Duration> {
        match self {
            Budget::Relative(times) => baseline.map(|b| b.mul_f64(times)),
            Budget::Fixed(limit) => Some(limit),
        }
    }

    /// The stricter of two budgets, given the baseline.
    pub fn stricter(self, other: Budget, baseline: Option<Duration>) -> Budget {
        match (self.limit(baseline), other.limit(baseline)) {
            (Some(mine), Some(theirs)) if theirs < mine => other,
            (None, Some(_)) => other,
            _ => self,
        }
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Relative(times) => write!(f, "{times}x"),
            Budget::Fixed(limit) => write!(f, "{}ms", limit.as_secs_f64() * 1000.0),
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
    fn budgets_read_back_from_their_flag_and_refuse_what_means_nothing() {
        assert_eq!(Budget::parse("3x"), Ok(Budget::Relative(3.0)));
        assert_eq!(Budget::parse("2.5x"), Ok(Budget::Relative(2.5)));
        assert_eq!(Budget::parse("25ms"), Ok(Budget::Fixed(ms(25))));
        for bad in ["1x", "0.5x", "0ms", "fast", "", "x", "nanx"] {
            assert!(Budget::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Budget::parse("3x").map(|b| b.to_string()), Ok("3x".to_owned()));
        assert_eq!(Budget::parse("25ms").map(|b| b.to_string()), Ok("25ms".to_owned()));
    }

    #[test]
    fn a_relative_budget_waits_for_a_baseline_and_the_stricter_one_wins() {
        assert_eq!(Budget::Relative(3.0).limit(None), None);
        assert_eq!(Budget::Relative(3.0).limit(Some(ms(4))), Some(ms(12)));
        let (relative, fixed) = (Budget::Relative(3.0), Budget::Fixed(ms(10)));
        assert_eq!(relative.stricter(fixed, Some(ms(4))), fixed);
        assert_eq!(relative.stricter(fixed, Some(ms(2))), relative);
        assert_eq!(relative.stricter(fixed, None), fixed);
    }
}
