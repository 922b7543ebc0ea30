//! How kube-svm's commands put a migration's numbers into words, in one place so that `status`
//! and `migrate` read alike: durations (`15s`, `4m05s`, `2h01m`, `3d04h`), how fast a
//! migration goes and how long it has left, and its write window when it holds back.

use std::time::Duration;

use crate::api::Pace;
use crate::engine::Restraint;

/// `15s`, `4m05s`, `2h01m`, `3d04h`: the two largest units, as kubectl prints ages.
pub fn clock(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m{:02}s", seconds / 60, seconds % 60),
        3600..86400 => format!("{}h{:02}m", seconds / 3600, (seconds % 3600) / 60),
        _ => format!("{}d{:02}h", seconds / 86400, (seconds % 86400) / 3600),
    }
}

/// Objects a second, `done` in `elapsed`; none before a second has passed or an object is done
/// (the first page's burst would say nothing of the rate).
pub fn rate(done: u64, elapsed: Duration) -> Option<f64> {
    let seconds = elapsed.as_secs_f64();
    (seconds >= 1.0 && done > 0).then(|| done as f64 / seconds)
}

/// The time `left` objects take at `rate`.
pub fn eta(left: u64, rate: Option<f64>) -> Option<Duration> {
    rate.filter(|r| *r > 0.0).map(|rate| Duration::from_secs_f64(left as f64 / rate).ceil_secs())
}

/// A write window as a cell: `64`, or `6 (latency)` when it is held back for the cluster's sake.
pub fn window(size: u64, restraint: Option<Restraint>) -> String {
    match restraint {
        Some(restraint) => format!("{size} ({})", restraint.name()),
        None => size.to_string(),
    }
}

/// A window held back, in words: `holding back to 6 writes at once: the apiserver answers
/// slower than the gentle pace allows`. Held back by latency to one write, a pace that spaces
/// its writes also pauses between them, and says so.
pub fn holding_back(pace: Pace, size: u64, restraint: Restraint) -> String {
    let why = match restraint {
        Restraint::Latency => {
            format!("the apiserver answers slower than the {} pace allows", pace.name())
        }
        Restraint::Throttling => "the apiserver throttles kube-svm (429)".to_owned(),
    };
    let spaced = restraint == Restraint::Latency && pace.band().max_spacing > 0.0;
    match size {
        1 if spaced => format!("holding back to one write at a time, with pauses: {why}"),
        1 => format!("holding back to one write at a time: {why}"),
        _ => format!("holding back to {size} writes at once: {why}"),
    }
}

/// Rounding up to whole seconds: an ETA of 0.4 s is shown as `1s`, never `0s`.
trait CeilSecs {
    fn ceil_secs(self) -> Duration;
}

impl CeilSecs for Duration {
    fn ceil_secs(self) -> Duration {
        Duration::from_secs(self.as_secs_f64().ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_read_as_the_two_largest_units() {
        let clock_of = |seconds| clock(Duration::from_secs(seconds));
        assert_eq!(clock_of(42), "42s");
        assert_eq!(clock_of(90), "1m30s");
        assert_eq!(clock_of(245), "4m05s");
        assert_eq!(clock_of(7260), "2h01m");
        assert_eq!(clock_of(90000), "1d01h");
    }

    #[test]
    fn rates_wait_for_a_second_and_an_object_and_etas_round_up() {
        assert_eq!(rate(10, Duration::from_millis(500)), None);
        assert_eq!(rate(0, Duration::from_secs(5)), None);
        assert_eq!(rate(500, Duration::from_secs(50)), Some(10.0));
        assert_eq!(eta(1500, Some(10.0)), Some(Duration::from_secs(150)));
        assert_eq!(eta(3, Some(10.0)), Some(Duration::from_secs(1)));
        assert_eq!(eta(3, None), None);
    }

    #[test]
    fn a_window_says_what_holds_it_back() {
        assert_eq!(window(64, None), "64");
        assert_eq!(window(6, Some(Restraint::Latency)), "6 (latency)");
        assert_eq!(
            holding_back(Pace::Gentle, 6, Restraint::Latency),
            "holding back to 6 writes at once: the apiserver answers slower than the gentle pace allows"
        );
        assert_eq!(
            holding_back(Pace::Fast, 3, Restraint::Throttling),
            "holding back to 3 writes at once: the apiserver throttles kube-svm (429)"
        );
        assert_eq!(
            holding_back(Pace::Gentle, 1, Restraint::Latency),
            "holding back to one write at a time, with pauses: the apiserver answers slower than the gentle pace allows"
        );
        assert_eq!(
            holding_back(Pace::Gentle, 1, Restraint::Throttling),
            "holding back to one write at a time: the apiserver throttles kube-svm (429)"
        );
        assert_eq!(
            holding_back(Pace::Fast, 1, Restraint::Latency),
            "holding back to one write at a time: the apiserver answers slower than the fast pace allows"
        );
    }
}
