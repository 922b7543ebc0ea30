//! Value parsers for the flags that take a number. A value that makes no sense (a negative or
//! non-finite number of seconds, a page of no objects, a lease longer than the Lease API can
//! hold) is refused while the command line is parsed, with a message that names the bound:
//! never clamped in silence, never left to panic or to change what kube-svm does later on.

use std::fmt::Display;
use std::str::FromStr;

/// The longest time a flag may name, in seconds: a year. Longer than any wait of kube-svm's is
/// useful, and far from where a deadline computed from it would overflow a clock
/// (`Duration::from_secs_f64` panics at 2^64 seconds; adding to an `Instant` panics sooner).
pub const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// The slowest client-side rate `--kube-api-qps` accepts: one request every 1,000 seconds.
/// Slower would serve no one, and a rate near zero makes the wait for a token overflow.
pub const MIN_QPS: f64 = 0.001;

/// Why a flag's value was refused; clap prints it after the flag and the value.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Error {
    #[error("not a number ({0})")]
    NotANumber(String),
    #[error("must be a finite number of seconds")]
    NotFinite,
    #[error("must be at least {0}")]
    TooSmall(String),
    #[error("must be at most {0}")]
    TooLarge(String),
    #[error("must be 0 (no limit) or at least {MIN_QPS} requests per second")]
    Rate,
}

/// A number of seconds: finite, at least `least`, at most [`MAX_SECONDS`].
pub fn seconds(least: f64) -> impl Fn(&str) -> Result<f64, Error> + Clone + Send + Sync + 'static {
    move |value: &str| {
        let seconds = number::<f64>(value)?;
        if !seconds.is_finite() {
            return Err(Error::NotFinite);
        }
        // `-0` is zero seconds, not a negative number of them.
        let seconds = if seconds == 0.0 { 0.0 } else { seconds };
        within(seconds, least, MAX_SECONDS)
    }
}

/// A count from `least` to `most`.
pub fn count<T>(
    least: T,
    most: T,
) -> impl Fn(&str) -> Result<T, Error> + Clone + Send + Sync + 'static
where
    T: FromStr + PartialOrd + Display + Copy + Send + Sync + 'static,
    T::Err: Display,
{
    move |value: &str| within(number::<T>(value)?, least, most)
}

/// Requests per second: 0 for no limit, otherwise finite and at least [`MIN_QPS`].
pub fn qps(value: &str) -> Result<f64, Error> {
    let qps = number::<f64>(value)?;
    match qps == 0.0 || (qps.is_finite() && qps >= MIN_QPS) {
        true => Ok(qps),
        false => Err(Error::Rate),
    }
}

fn number<T: FromStr>(value: &str) -> Result<T, Error>
where
    T::Err: Display,
{
    value.trim().parse().map_err(|error: T::Err| Error::NotANumber(error.to_string()))
}

fn within<T: PartialOrd + Display>(value: T, least: T, most: T) -> Result<T, Error> {
    if value < least {
        return Err(Error::TooSmall(least.to_string()));
    }
    if value > most {
        return Err(Error::TooLarge(most.to_string()));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_must_be_finite_and_within_bounds() {
        let timeout = seconds(1.0);
        assert_eq!(timeout("30"), Ok(30.0));
        assert_eq!(timeout("1.5"), Ok(1.5));
        for infinite in ["inf", "-inf", "infinity", "NaN"] {
            assert_eq!(timeout(infinite), Err(Error::NotFinite), "{infinite}");
        }
        assert_eq!(timeout("0"), Err(Error::TooSmall("1".into())));
        assert_eq!(timeout("-5"), Err(Error::TooSmall("1".into())));
        assert_eq!(timeout("1e300"), Err(Error::TooLarge("31536000".into())));
        assert!(matches!(timeout("soon"), Err(Error::NotANumber(_))));

        let interval = seconds(0.0);
        assert_eq!(interval("0"), Ok(0.0));
        assert!(interval("-0").is_ok_and(|zero| zero.is_sign_positive()));
        assert_eq!(interval("-0.1"), Err(Error::TooSmall("0".into())));
    }

    #[test]
    fn counts_must_be_within_bounds() {
        let page_size = count(1u32, u32::MAX);
        assert_eq!(page_size("500"), Ok(500));
        assert_eq!(page_size("0"), Err(Error::TooSmall("1".into())));
        assert!(matches!(page_size("-1"), Err(Error::NotANumber(_))));
        assert!(matches!(page_size("4294967296"), Err(Error::NotANumber(_))));

        let lease = count(2u64, 100);
        assert_eq!(lease("100"), Ok(100));
        assert_eq!(lease("101"), Err(Error::TooLarge("100".into())));
        assert!(matches!(lease("18446744073709551616"), Err(Error::NotANumber(_))));
    }

    #[test]
    fn a_rate_is_zero_or_a_usable_positive_number() {
        assert_eq!(qps("0"), Ok(0.0));
        assert_eq!(qps("150"), Ok(150.0));
        assert_eq!(qps("0.5"), Ok(0.5));
        for refused in ["-1", "inf", "NaN", "1e-300"] {
            assert_eq!(qps(refused), Err(Error::Rate), "{refused}");
        }
    }
}
