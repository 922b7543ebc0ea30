//! How long to wait before trying again what keeps failing: one rule for the whole tree.

use std::time::Duration;

/// The wait after `failures` failures in a row: `first` after one (or none), doubling with each
/// further one, at most `longest`. Pure.
pub fn doubling(failures: u32, first: Duration, longest: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    first.saturating_mul(1 << doublings).min(longest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_from_the_first_up_to_the_longest() {
        let (first, longest) = (Duration::from_secs(5), Duration::from_secs(60));
        let waits: Vec<u64> = (0..7).map(|n| doubling(n, first, longest).as_secs()).collect();
        assert_eq!(waits, [5, 5, 10, 20, 40, 60, 60]);
        assert_eq!(doubling(u32::MAX, first, longest), longest, "no overflow");
        assert_eq!(doubling(40, Duration::from_secs(3600 * 24), longest), longest);
    }
}
