//! The gentle pace's second signal, where kube-svm may read the apiserver's `/metrics`: how
//! long the apiserver's goroutines wait to run (`go_sched_latencies_seconds`, the Go runtime's
//! own histogram). When many of them wait, the apiserver has no CPU to spare, whatever the probe
//! read in its last few seconds, and the rate does not grow. The guard never cuts the rate and
//! never lets it grow: an apiserver that hides its `/metrics`, or a reading that makes no sense,
//! leaves the pace to the probe alone.
//!
//! Measured by the bench on two cores (bench/notes/2026-11-27-guard.md): of the apiserver's goroutines' waits, those past 0.92 ms were 0.2 to 1.0% through
//! a run of 12,000 objects, its cuts at the knee included, and 4.3 to 11.4% in the collector's
//! spells of an apiserver holding 100,000.

use std::collections::HashMap;
use std::time::Duration;

use kube::Client;
use tokio::time::Instant;

/// The request: only the two series the guard reads, which the apiserver filters for it
/// (a whole `/metrics` of the apiserver is over a megabyte).
pub const METRICS_PATH: &str =
    "/metrics?name[]=go_sched_latencies_seconds&name[]=process_start_time_seconds";

/// How often the guard reads.
pub const READ_EVERY: Duration = Duration::from_secs(5);

/// A reading this old says nothing of the apiserver now.
pub const STALE_AFTER: Duration = Duration::from_secs(15);

/// A goroutine that waited to run past the first bucket bound at least this long waited on the
/// CPU, not on the scheduler's own bookkeeping (the Go runtime's bound there is 0.92 ms).
const LONG_WAIT: f64 = 0.0005;

/// The apiserver is busy when more than this share of its goroutines' waits between two
/// readings were long: between the knee of a small apiserver (at most 1.0%) and the collector's
/// spells of a large one (4.3% and more).
pub const BUSY_SHARE: f64 = 0.02;

/// Fewer waits than this between two readings judge nothing.
const FEWEST_WAITS: f64 = 200.0;

/// An answer larger than this is an apiserver that does not filter its `/metrics`: reading all
/// of it every few seconds would cost it more than the guard learns.
const LARGEST_ANSWER: usize = 64 * 1024;

/// The longest a read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Readings kept, one per apiserver process: behind a load balancer each read may reach another.
const PROCESSES: usize = 8;

/// One reading of the apiserver's scheduler histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    /// `process_start_time_seconds`: which apiserver process answered.
    started: f64,
    /// Waits at most the bound [`LONG_WAIT`] picks, and its bound.
    short: f64,
    bound: f64,
    /// All waits.
    count: f64,
}

impl Reading {
    /// The reading in a `/metrics` answer, or what it lacks.
    pub fn parse(text: &str) -> Result<Reading, &'static str> {
        let (mut started, mut count) = (None, None);
        let mut short: Option<(f64, f64)> = None;
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            if series == "process_start_time_seconds" {
                started = Some(value);
            } else if series == "go_sched_latencies_seconds_count" {
                count = Some(value);
            } else if let Some(labels) = series.strip_prefix("go_sched_latencies_seconds_bucket{") {
                let bound = labels
                    .split(',')
                    .find_map(|label| label.strip_prefix("le=\""))
                    .and_then(|le| le.trim_end_matches(['"', '}']).parse::<f64>().ok());
                let Some(bound) = bound else { continue };
                if bound >= LONG_WAIT && short.is_none_or(|(least, _)| bound < least) {
                    short = Some((bound, value));
                }
            }
        }
        let (Some(started), Some(count), Some((bound, short))) = (started, count, short) else {
            return Err("it publishes no go_sched_latencies_seconds or process_start_time_seconds");
        };
        Ok(Reading { started, short, bound, count })
    }
}

/// The share of long waits between two readings of one process, or `None` when they cannot
/// be compared (another process, a counter gone back) or say too little.
pub fn long_share(before: &Reading, after: &Reading) -> Option<f64> {
    if before.started != after.started || before.bound != after.bound {
        return None;
    }
    let waits = after.count - before.count;
    let short = after.short - before.short;
    if waits < FEWEST_WAITS || short < 0.0 || short > waits {
        return None;
    }
    Some((waits - short) / waits)
}

/// The guard's memory: the last reading of each apiserver process seen, and when.
#[derive(Default)]
pub struct Guard {
    last: HashMap<u64, (Reading, Instant)>,
}

impl Guard {
    /// Takes `reading`, made at `now`, and gives the share of long waits since the last reading
    /// of its process, unless that is too old to say anything of the apiserver now (the probe
    /// rested meanwhile).
    pub fn read(&mut self, reading: Reading, now: Instant) -> Option<f64> {
        let process = reading.started.to_bits();
        let share = self
            .last
            .get(&process)
            .filter(|(_, at)| now.duration_since(*at) <= STALE_AFTER)
            .and_then(|(before, _)| long_share(before, &reading));
        if self.last.len() >= PROCESSES && !self.last.contains_key(&process) {
            self.last.clear();
        }
        self.last.insert(process, (reading, now));
        share
    }
}

/// One read of the apiserver's `/metrics` through `client`: `Ok(None)` when no answer came this
/// time (worth trying again), `Err` with the reason the guard should stop.
pub async fn read(client: &Client) -> Result<Option<Reading>, String> {
    let request = http::Request::get(METRICS_PATH)
        .body(kube::client::Body::from(Vec::new()))
        .map_err(|error| error.to_string())?;
    let answered = tokio::time::timeout(READ_TIMEOUT, async {
        let response = client.send(request).await.ok()?;
        let code = response.status();
        let body = response.into_body().collect_bytes().await.ok()?;
        Some((code, body))
    })
    .await;
    let Ok(Some((code, body))) = answered else { return Ok(None) };
    if code.as_u16() == 429 || code.is_server_error() {
        return Ok(None);
    }
    if !code.is_success() {
        return Err(format!("the apiserver answered {code} (kube-svm may not get /metrics)"));
    }
    if body.len() > LARGEST_ANSWER {
        return Err(format!(
            "the apiserver does not filter its /metrics by name ({} bytes)",
            body.len()
        ));
    }
    let text = String::from_utf8_lossy(&body);
    Reading::parse(&text).map(Some).map_err(|lack| lack.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An apiserver's answer (Kubernetes 1.37, Go's bucket bounds), with `short` waits at most
    /// 0.92 ms of `count`.
    fn answer(started: f64, short: u64, count: u64) -> String {
        format!(
            "# HELP go_sched_latencies_seconds Distribution of the time goroutines have spent in the scheduler in a runnable state before actually running.\n\
             # TYPE go_sched_latencies_seconds histogram\n\
             go_sched_latencies_seconds_bucket{{le=\"6.399999999999999e-08\"}} 10\n\
             go_sched_latencies_seconds_bucket{{le=\"8.191999999999999e-05\"}} 20\n\
             go_sched_latencies_seconds_bucket{{le=\"0.0009175039999999999\"}} {short}\n\
             go_sched_latencies_seconds_bucket{{le=\"0.010485759999999998\"}} {count}\n\
             go_sched_latencies_seconds_bucket{{le=\"+Inf\"}} {count}\n\
             go_sched_latencies_seconds_sum 0.28\n\
             go_sched_latencies_seconds_count {count}\n\
             # HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n\
             # TYPE process_start_time_seconds gauge\n\
             process_start_time_seconds {started:e}\n"
        )
    }

    fn reading(started: f64, short: u64, count: u64) -> Reading {
        Reading::parse(&answer(started, short, count)).expect("a reading")
    }

    #[test]
    fn a_reading_takes_the_first_bucket_past_half_a_millisecond() {
        let read = reading(1.7e9, 6120, 6265);
        assert_eq!(read.bound, 0.0009175039999999999);
        assert_eq!((read.short, read.count, read.started), (6120.0, 6265.0, 1.7e9));
    }

    #[test]
    fn an_answer_without_the_series_says_what_it_lacks() {
        let no_start = answer(1.7e9, 1, 2).replace("process_start_time_seconds 1.7e9", "");
        assert!(Reading::parse(&no_start).is_err());
        assert!(Reading::parse("go_goroutines 12\n").is_err());
    }

    #[test]
    fn the_share_is_of_the_waits_between_two_readings() {
        let share = long_share(&reading(1.7e9, 1000, 1100), &reading(1.7e9, 1900, 2100));
        // 1,000 waits, 900 of them short.
        assert_eq!(share, Some(0.1));
    }

    #[test]
    fn readings_of_two_processes_or_too_few_waits_are_not_compared() {
        let before = reading(1.7e9, 1000, 1100);
        assert_eq!(long_share(&before, &reading(1.8e9, 1900, 2100)), None, "another process");
        assert_eq!(long_share(&before, &reading(1.7e9, 1050, 1150)), None, "50 waits");
        assert_eq!(long_share(&before, &reading(1.7e9, 900, 2100)), None, "gone back");
    }

    #[test]
    fn the_guard_compares_each_process_with_its_own_last_reading() {
        let mut guard = Guard::default();
        let now = Instant::now();
        assert_eq!(guard.read(reading(1.0, 1000, 1100), now), None, "a first reading");
        assert_eq!(guard.read(reading(2.0, 50, 60), now), None, "another apiserver's first");
        let later = now + READ_EVERY;
        assert_eq!(guard.read(reading(1.0, 1900, 2100), later), Some(0.1));
        assert_eq!(guard.read(reading(2.0, 450, 560), later), Some(0.2));
        let rested = later + STALE_AFTER + READ_EVERY;
        assert_eq!(guard.read(reading(1.0, 2000, 3100), rested), None, "too old to compare");
        assert_eq!(guard.read(reading(1.0, 2500, 4100), rested + READ_EVERY), Some(0.5));
    }
}
