//! The gentle pace's numbers, in one place: what the probe sends, how its baseline is measured,
//! and how the rate answers it. `--pace-params` (and the bench's `BENCH_PACE`) sets any of them
//! by name, so trying another value is a run, not a change of the code.

use std::fmt;
use std::time::Duration;

/// The gentle pace's parameters. Each has a default that suits a small apiserver and a large one
/// alike; docs/performance.md says how the pace uses them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProbeParams {
    /// Objects per second a run starts at.
    pub start_rate: f64,
    /// The slowest the rate gets, so that a run always finishes.
    pub min_rate: f64,
    /// Time between two probes while gentle writes go, on average (a quiet window probes twice as often).
    pub probe_every: Duration,
    /// One probe in this many writes its ConfigMap (the others read), as a client that updates what it reads.
    pub write_every: u64,
    /// How often the gentle writes pause for a quiet window, in which the probe measures its baseline.
    pub quiet_every: Duration,
    /// How long a quiet window lasts.
    pub quiet_for: Duration,
    /// Quiet windows whose judged percentiles make the baseline (their median).
    pub quiet_windows: usize,
    /// The percentile of the probe's latency that is judged, in quiet windows and while writing alike.
    pub judged: f64,
    /// The least time between two changes of the rate, so the effect of one is seen before the next.
    pub hold: Duration,
    /// The rate after a cut, as a fraction of the rate before it (deeper, down to its square, as far as the probe is past its budget).
    pub cut: f64,
    /// The most the rate grows by in one step before a cut has shown that it hurt.
    pub first_increase: f64,
    /// The rate's growth in one step once a cut has shown that it hurt.
    pub increase: f64,
    /// A latency under this fraction of another is lower: of the budget, room to grow; of a cut's, the cut helped.
    pub margin: f64,
    /// Writes in flight allowed, as a multiple of what the rate keeps in flight on average.
    pub headroom: f64,
    /// Other clients' writes per second below which (over a second, judged a look later) a run counts as alone and goes as its write window allows, as `fast` does (0: never).
    pub alone_below: f64,
}

impl Default for ProbeParams {
    fn default() -> ProbeParams {
        ProbeParams {
            start_rate: 50.0,
            min_rate: 2.0,
            probe_every: Duration::from_millis(50),
            write_every: 4,
            quiet_every: Duration::from_secs(60),
            quiet_for: Duration::from_millis(2500),
            quiet_windows: 3,
            judged: 0.99,
            hold: Duration::from_secs(5),
            cut: 0.7,
            first_increase: 4.0,
            increase: 1.2,
            margin: 0.85,
            headroom: 3.0,
            alone_below: 5.0,
        }
    }
}

/// How a parameter is written: a count, a fraction, a multiple or a duration in ms.
enum Kind {
    Rate,
    Millis,
    Count,
    /// 0 or more.
    Writes,
    /// Between 0 and 1, both excluded.
    Fraction,
    /// More than 1.
    Multiple,
}

impl ProbeParams {
    /// Every parameter's name, and how it is written.
    const NAMES: [(&'static str, Kind); 15] = [
        ("start_rate", Kind::Rate),
        ("min_rate", Kind::Rate),
        ("probe_every_ms", Kind::Millis),
        ("write_every", Kind::Count),
        ("quiet_every_ms", Kind::Millis),
        ("quiet_for_ms", Kind::Millis),
        ("quiet_windows", Kind::Count),
        ("judged", Kind::Fraction),
        ("hold_ms", Kind::Millis),
        ("cut", Kind::Fraction),
        ("first_increase", Kind::Multiple),
        ("increase", Kind::Multiple),
        ("margin", Kind::Fraction),
        ("headroom", Kind::Multiple),
        ("alone_below", Kind::Writes),
    ];

    /// The defaults with the `name=value` pairs of `text` (comma-separated) in their place:
    /// `hold_ms=10000,cut=0.5`. An unknown name, a value out of its range, or a minimum rate
    /// above the starting one is refused, naming it.
    pub fn parse(text: &str) -> Result<ProbeParams, String> {
        let mut params = ProbeParams::default();
        for pair in text.split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .map(|(name, value)| (name.trim(), value.trim()))
                .ok_or_else(|| format!("{pair:?} is not name=value"))?;
            let Some((_, kind)) = Self::NAMES.iter().find(|(known, _)| *known == name) else {
                return Err(format!("no parameter {name:?} (there are {})", Self::names()));
            };
            let number = value
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite())
                .ok_or_else(|| format!("{name}={value}: not a number"))?;
            let valid = match kind {
                Kind::Rate => number > 0.0,
                Kind::Millis => number >= 1.0,
                Kind::Count => number >= 1.0 && number.fract() == 0.0,
                Kind::Writes => number >= 0.0,
                Kind::Fraction => number > 0.0 && number < 1.0,
                Kind::Multiple => number > 1.0,
            };
            if !valid {
                let range = match kind {
                    Kind::Rate => "more than 0",
                    Kind::Millis => "1 ms or more",
                    Kind::Count => "a whole number, 1 or more",
                    Kind::Writes => "0 or more",
                    Kind::Fraction => "between 0 and 1",
                    Kind::Multiple => "more than 1",
                };
                return Err(format!("{name}={value}: must be {range}"));
            }
            params.set(name, number);
        }
        if params.min_rate > params.start_rate {
            return Err(format!(
                "min_rate={} is above start_rate={}",
                params.min_rate, params.start_rate
            ));
        }
        Ok(params)
    }

    fn set(&mut self, name: &str, number: f64) {
        let millis = Duration::from_secs_f64(number / 1000.0);
        match name {
            "start_rate" => self.start_rate = number,
            "min_rate" => self.min_rate = number,
            "probe_every_ms" => self.probe_every = millis,
            "write_every" => self.write_every = number as u64,
            "quiet_every_ms" => self.quiet_every = millis,
            "quiet_for_ms" => self.quiet_for = millis,
            // Counts are checked whole and positive; far past any sensible count saturates.
            "quiet_windows" => self.quiet_windows = number as usize,
            "judged" => self.judged = number,
            "hold_ms" => self.hold = millis,
            "cut" => self.cut = number,
            "first_increase" => self.first_increase = number,
            "increase" => self.increase = number,
            "margin" => self.margin = number,
            "headroom" => self.headroom = number,
            "alone_below" => self.alone_below = number,
            _ => unreachable!("every name of NAMES is set"),
        }
    }

    fn names() -> String {
        Self::NAMES.map(|(name, _)| name).join(", ")
    }

    /// Probe answers since the rate last changed that the law needs before it changes it again:
    /// half of what a hold brings, so that slow answers do not hold the law for long.
    pub fn least_samples(&self) -> usize {
        let per_hold = self.hold.as_secs_f64() / self.probe_every.as_secs_f64();
        ((per_hold / 2.0).ceil() as usize).max(1)
    }
}

impl fmt::Display for ProbeParams {
    /// As [`ProbeParams::parse`] reads them: every parameter, by name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        write!(
            f,
            "start_rate={},min_rate={},probe_every_ms={},write_every={},quiet_every_ms={},\
             quiet_for_ms={},quiet_windows={},judged={},hold_ms={},cut={},first_increase={},\
             increase={},margin={},headroom={},alone_below={}",
            self.start_rate,
            self.min_rate,
            ms(self.probe_every),
            self.write_every,
            ms(self.quiet_every),
            ms(self.quiet_for),
            self.quiet_windows,
            self.judged,
            ms(self.hold),
            self.cut,
            self.first_increase,
            self.increase,
            self.margin,
            self.headroom,
            self.alone_below,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_given_is_the_defaults_and_each_name_sets_its_own() {
        assert_eq!(ProbeParams::parse(""), Ok(ProbeParams::default()));
        let params = ProbeParams::parse(" hold_ms=10000, cut=0.5 ,quiet_windows=5").unwrap();
        assert_eq!(params.hold, Duration::from_secs(10));
        assert_eq!(params.cut, 0.5);
        assert_eq!(params.quiet_windows, 5);
        assert_eq!(params.margin, ProbeParams::default().margin, "the others keep their defaults");
    }

    #[test]
    fn the_defaults_read_back_as_they_are_written() {
        let defaults = ProbeParams::default();
        assert_eq!(ProbeParams::parse(&defaults.to_string()), Ok(defaults));
        let tuned = ProbeParams::parse("probe_every_ms=25,increase=1.5").unwrap();
        assert_eq!(ProbeParams::parse(&tuned.to_string()), Ok(tuned));
    }

    #[test]
    fn a_bad_pair_is_refused_by_name() {
        let refused = |text: &str| ProbeParams::parse(text).unwrap_err();
        assert!(refused("holds=3").starts_with("no parameter \"holds\" (there are start_rate,"));
        assert_eq!(refused("cut"), "\"cut\" is not name=value");
        assert_eq!(refused("cut=half"), "cut=half: not a number");
        assert_eq!(refused("cut=1.5"), "cut=1.5: must be between 0 and 1");
        assert_eq!(refused("increase=0.9"), "increase=0.9: must be more than 1");
        assert_eq!(
            refused("quiet_windows=2.5"),
            "quiet_windows=2.5: must be a whole number, 1 or more"
        );
        assert_eq!(refused("hold_ms=0.5"), "hold_ms=0.5: must be 1 ms or more");
        assert_eq!(refused("min_rate=300"), "min_rate=300 is above start_rate=50");
    }

    #[test]
    fn the_law_waits_for_half_a_hold_of_answers() {
        assert_eq!(ProbeParams::default().least_samples(), 50);
        let slow = ProbeParams::parse("probe_every_ms=5000").unwrap();
        assert_eq!(slow.least_samples(), 1);
    }
}
