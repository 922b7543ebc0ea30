//! The gentle pace's law: a rate of writes per second, steered by a probe's latency against a
//! budget measured from the probe's own quiet baseline. Pure: time is passed in.
//!
//! - **Baseline.** Now and then the gentle writes pause for a quiet window (the first few come a
//!   hold apart). The baseline is the median of the last few windows' judged percentiles, each
//!   the same statistic the law judges while writing, over about as many probes; one window in a
//!   passing spell of the apiserver's does not move it. Load that is not
//!   kube-svm's (another client, a busy machine) raises it as it raises the figure judged.
//!   Writes add to the probe's latency and never take from it, so the baseline is never above
//!   what the probe shows while writing: one read in a passing spell of the apiserver's is
//!   lowered at the first look after it, and at the first after each quiet window.
//! - **Budget.** How slow the probe may get: a multiple of the baseline (`2x`) or a latency.
//! - **Cut, on trial.** The probe's percentile past the budget cuts the rate, the deeper the
//!   further past (down to two cuts at once). The next look judges the cut: one that made the
//!   probe faster stands. If the probe is no faster for it, a quiet window comes at once and
//!   tells whose the latency is: faster with none of the run's writes, it was the run's, and the
//!   cut stands; as slow, it was not, and the cut is undone (a fixed budget, which takes no quiet
//!   windows, undoes it at once). The latency of an undone cut is noted, and only a probe past
//!   it cuts again until the probe is back within the budget.
//! - **Growth.** Well within the budget, with writes waiting on the rate, the rate grows by the
//!   room the probe leaves (up to `first_increase`) until a cut has stood, and by `increase` after.
//!   One change per `hold` at most, judged on the probes since the last change.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::params::ProbeParams;
use crate::api::Budget;

/// What the law decided on one look.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Change {
    /// The probe passed the budget: the rate was cut.
    Cut { from: f64, to: f64 },
    /// The cut before did not make the probe faster: a quiet window is to tell whether the
    /// latency goes with the run's writes.
    Judge,
    /// A quiet window found the probe faster without the run's writes: the cut stands.
    Stood { rate: f64 },
    /// The probe was as slow after a cut (in a quiet window, for a relative budget): the rate is
    /// back where it was.
    Undone { from: f64, to: f64 },
    /// Room under the budget, and writes waited on the rate: it grew.
    Grew { from: f64, to: f64 },
    /// Nothing to do, or too soon to tell.
    Held,
}

/// Why the rate is what it is, as `kube-svm status` and the progress line say it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Why {
    /// No baseline yet, or too few probes since the last change.
    #[default]
    Measuring,
    /// The probe left room under its budget.
    Grew,
    /// The probe is near its budget.
    NearBudget,
    /// The writes go slower than the rate (their own latency, the write window): no need to grow.
    NotNeeded,
    /// The probe passed its budget.
    Cut,
    /// The cut before did not make the probe faster: a quiet window tells whose the latency is.
    Judging,
    /// The probe was faster in a quiet window than with the run's writes: the cut stands.
    Stood,
    /// The cut before did not make the probe faster: the latency is not the run's.
    Undone,
    /// The probe is past its budget by latency shown not to be the run's.
    NotOurs,
    /// The probe is past its budget and the rate is at its floor.
    AtFloor,
    /// No other client writes: the write window sets the pace.
    Alone,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Why::Measuring => "measuring",
            Why::Grew => "grown: the probe is well within its budget",
            Why::NearBudget => "held: the probe is near its budget",
            Why::NotNeeded => "held: the writes go slower than the rate",
            Why::Cut => "cut: the probe passed its budget",
            Why::Judging => {
                "cut on trial: the probe was no faster for it, a quiet window tells whose the latency is"
            }
            Why::Stood => "cut stands: the probe was faster without this run's writes",
            Why::Undone => {
                "cut undone: the probe was no faster for it, the latency is not this run's"
            }
            Why::NotOurs => "held: the probe is past its budget by latency that is not this run's",
            Why::AtFloor => "at its floor: the probe is past its budget",
            Why::Alone => "alone: no other client writes",
        })
    }
}

/// A cut waiting for the next look to show whether it made the probe faster.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Trial {
    /// The rate before the cut.
    rate: f64,
    /// The probe's latency that made the cut.
    latency: Duration,
    /// The probe's latency at the look that found it no faster for the cut, which a quiet
    /// window is to judge.
    no_faster: Option<Duration>,
}

/// The law's state.
#[derive(Clone, Debug)]
pub struct Steering {
    params: ProbeParams,
    rate: f64,
    /// The judged percentile of the probe's latencies in each recent quiet window, newest last.
    quiet: VecDeque<Duration>,
    /// The median of the quiet windows' judged percentiles, lowered to any look's since the
    /// last window.
    baseline: Option<Duration>,
    trial: Option<Trial>,
    /// Latency shown not to be the run's (a cut did not lower it), until the probe is back
    /// within its budget.
    ambient: Option<Duration>,
    /// Whether a cut has stood: the rate hurt once, and grows slowly from then on.
    hurt: bool,
    /// When the rate last changed (or the run began).
    changed: Instant,
    why: Why,
}

impl Steering {
    pub fn new(now: Instant, params: ProbeParams) -> Steering {
        Steering {
            params,
            rate: params.start_rate,
            quiet: VecDeque::new(),
            baseline: None,
            trial: None,
            ambient: None,
            hurt: false,
            changed: now,
            why: Why::Measuring,
        }
    }

    /// Objects per second the gentle writes may reach now.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Why the rate is what it is.
    pub fn why(&self) -> Why {
        self.why
    }

    /// When the rate last changed: probe samples from before it say nothing of the rate now.
    pub fn changed(&self) -> Instant {
        self.changed
    }

    /// The quiet baseline: the median of the recent quiet windows' judged percentiles.
    pub fn baseline(&self) -> Option<Duration> {
        self.baseline
    }

    /// Whether the baseline is made of as many quiet windows as it takes.
    pub fn settled(&self) -> bool {
        self.quiet.len() >= self.params.quiet_windows
    }

    /// The law steers again from `now`, on the probes from then on, after a time it did not.
    pub fn resume(&mut self, now: Instant) {
        self.changed = now;
        self.trial = None;
        self.why = Why::Measuring;
    }

    /// Records the probe's latencies in one quiet window, answered by `now`; judges a cut on
    /// trial by them.
    pub fn quiet_window(&mut self, now: Instant, latencies: Vec<Duration>) -> Change {
        if latencies.is_empty() {
            return Change::Held;
        }
        let window = percentile(&latencies, self.params.judged);
        let judged = self.judge(now, window);
        self.quiet.push_back(window);
        while self.quiet.len() > self.params.quiet_windows {
            self.quiet.pop_front();
        }
        let mut windows: Vec<Duration> = self.quiet.iter().copied().collect();
        windows.sort_unstable();
        // The lower of the middle two, for an even count.
        self.baseline = Some(windows[(windows.len() - 1) / 2]);
        judged
    }

    /// A cut on trial, judged by a quiet window whose probes read `quiet`: faster than with the
    /// run's writes, the latency was the run's and the cut stands; as slow, it is undone.
    fn judge(&mut self, now: Instant, quiet: Duration) -> Change {
        let Some(trial @ Trial { no_faster: Some(no_faster), .. }) = self.trial else {
            return Change::Held;
        };
        self.trial = None;
        if quiet.as_secs_f64() >= no_faster.as_secs_f64() * self.params.margin {
            return self.undo(now, trial, no_faster);
        }
        self.hurt = true;
        self.change(now, Why::Stood, Change::Stood { rate: self.rate })
    }

    /// Back to the rate before `trial`'s cut: the probe, at `seen`, was no faster for it.
    fn undo(&mut self, now: Instant, trial: Trial, seen: Duration) -> Change {
        let from = self.rate;
        self.rate = trial.rate;
        self.ambient = Some(seen.max(trial.latency));
        self.change(now, Why::Undone, Change::Undone { from, to: self.rate })
    }

    /// One look at the probe: `samples`, the latencies seen since the last change (outside quiet
    /// windows); `waiting`, whether writes waited on the rate meanwhile.
    pub fn steer(
        &mut self,
        now: Instant,
        samples: &[Duration],
        budget: Budget,
        waiting: bool,
    ) -> Change {
        let params = self.params;
        if budget.limit(self.baseline).is_none() {
            self.why = Why::Measuring;
            return Change::Held;
        }
        if now.duration_since(self.changed) < params.hold || samples.len() < params.least_samples()
        {
            return Change::Held;
        }
        let seen = percentile(samples, params.judged);
        self.baseline = self.baseline.map(|baseline| baseline.min(seen));
        let Some(limit) = budget.limit(self.baseline) else { return Change::Held };
        let from = self.rate;
        if let Some(trial) = self.trial.take() {
            if trial.no_faster.is_some() {
                // Waiting for its quiet window; one that never comes (no write asks for it)
                // leaves the cut to be undone.
                if now.duration_since(self.changed) < params.hold + params.quiet_every {
                    self.trial = Some(trial);
                    return Change::Held;
                }
                return self.undo(now, trial, seen);
            }
            if seen.as_secs_f64() >= trial.latency.as_secs_f64() * params.margin {
                if let Budget::Fixed(_) = budget {
                    return self.undo(now, trial, seen);
                }
                self.trial = Some(Trial { no_faster: Some(seen), ..trial });
                self.why = Why::Judging;
                return Change::Judge;
            }
            self.hurt = true;
        }
        if seen <= limit {
            self.ambient = None;
        }
        // Past the budget, and past any latency shown not to be the run's.
        let bar = self.ambient.map_or(limit, |ambient| ambient.max(limit).div_f64(params.margin));
        if seen > bar {
            // As deep as the probe is past the budget, down to two cuts at once.
            let depth =
                (limit.as_secs_f64() / seen.as_secs_f64()).clamp(params.cut.powi(2), params.cut);
            let to = (from * depth).max(params.min_rate);
            if to >= from {
                self.why = Why::AtFloor;
                return Change::Held;
            }
            self.rate = to;
            self.trial = Some(Trial { rate: from, latency: seen, no_faster: None });
            return self.change(now, Why::Cut, Change::Cut { from, to });
        }
        if seen > limit {
            self.why = Why::NotOurs;
            return Change::Held;
        }
        let room = limit.as_secs_f64() / seen.as_secs_f64().max(f64::MIN_POSITIVE);
        if room <= 1.0 / params.margin {
            self.why = Why::NearBudget;
            return Change::Held;
        }
        if !waiting {
            self.why = Why::NotNeeded;
            return Change::Held;
        }
        let increase = match self.hurt {
            false => room.clamp(params.increase, params.first_increase),
            true => params.increase,
        };
        self.rate = from * increase;
        self.change(now, Why::Grew, Change::Grew { from, to: self.rate })
    }

    fn change(&mut self, now: Instant, why: Why, change: Change) -> Change {
        self.changed = now;
        self.why = why;
        change
    }
}

/// The `q` quantile (0 to 1) of `samples`, nearest rank; zero for none.
pub fn percentile(samples: &[Duration], q: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The budget the tests steer by: 3 times the quiet baseline.
    fn budget() -> Budget {
        Budget::Relative(3.0)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn params() -> ProbeParams {
        ProbeParams::default()
    }

    fn hold() -> Duration {
        params().hold
    }

    fn steady(latency: u64) -> Vec<Duration> {
        vec![ms(latency); params().least_samples()]
    }

    /// A steering whose quiet probes all read `baseline` ms: the default budget is 3 times it.
    fn with_baseline(now: Instant, baseline: u64) -> Steering {
        let mut steering = Steering::new(now, params());
        steering.quiet_window(now, vec![ms(baseline); 80]);
        steering
    }

    /// A steering at a quiet 4 ms whose probe read 15 ms a hold in: cut once, on trial.
    fn cut_once(now: Instant) -> (Steering, Instant) {
        let mut steering = with_baseline(now, 4);
        let at = now + hold();
        let change = steering.steer(at, &steady(15), budget(), true);
        assert!(matches!(change, Change::Cut { .. }), "{change:?}");
        (steering, at)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn the_baseline_is_the_median_of_the_last_quiet_windows_percentiles() {
        let now = Instant::now();
        let mut steering = Steering::new(now, params());
        assert_eq!(steering.baseline(), None);
        // One slow probe in 100: the 99th percentile is the fast ones'.
        let mut window: Vec<Duration> = vec![ms(3); 99];
        window.push(ms(40));
        steering.quiet_window(now, window);
        assert_eq!(steering.baseline(), Some(ms(3)));
        assert!(!steering.settled(), "one window of three");
        // A window in a spell of the apiserver's moves it neither beside one window nor two.
        steering.quiet_window(now, vec![ms(9); 100]);
        assert_eq!(steering.baseline(), Some(ms(3)));
        steering.quiet_window(now, vec![ms(4); 100]);
        assert_eq!(steering.baseline(), Some(ms(4)), "the middle of 3, 4 and 9");
        assert!(steering.settled());
        // Load that lasts through most of the windows raises it.
        steering.quiet_window(now, vec![ms(8); 100]);
        assert_eq!(steering.baseline(), Some(ms(8)), "the middle of 4, 8 and 9");
        steering.quiet_window(now, vec![ms(3); 100]);
        steering.quiet_window(now, vec![ms(3); 100]);
        assert_eq!(steering.baseline(), Some(ms(3)), "the loaded windows are forgotten");
    }

    #[test]
    fn nothing_changes_without_a_baseline_a_hold_or_enough_samples() {
        let now = Instant::now();
        let mut steering = Steering::new(now, params());
        let later = now + hold();
        assert_eq!(steering.steer(later, &steady(100), budget(), true), Change::Held);
        assert_eq!(steering.why(), Why::Measuring);
        steering.quiet_window(now, vec![ms(4); 80]);
        let few = vec![ms(100); params().least_samples() - 1];
        assert_eq!(steering.steer(later, &few, budget(), true), Change::Held);
        assert_eq!(steering.steer(now, &steady(100), budget(), true), Change::Held);
        assert_eq!(steering.rate(), params().start_rate);
    }

    #[test]
    fn past_the_budget_the_rate_is_cut_and_never_below_the_floor() {
        let now = Instant::now();
        let mut steering = with_baseline(now, 4);
        let at = now + hold();
        let change = steering.steer(at, &steady(13), budget(), false);
        let start = params().start_rate;
        assert_eq!(change, Change::Cut { from: start, to: start * params().cut });
        assert_eq!(steering.why(), Why::Cut);
        let judged = steering.clone().steer(at + hold(), &steady(13), budget(), false);
        assert_eq!(judged, Change::Judge, "not faster: a quiet window is to judge");
        // Each cut stands, the probe faster after it, down to the floor.
        let mut steering = with_baseline(now, 4);
        let mut latency = 200.0;
        let mut at = now;
        for _ in 0..10 {
            at += hold();
            steering.steer(at, &steady(latency as u64), budget(), false);
            latency *= 0.8;
        }
        assert_eq!(steering.rate(), params().min_rate);
        at += hold();
        assert_eq!(steering.steer(at, &steady(13), budget(), false), Change::Held);
        assert_eq!(steering.why(), Why::AtFloor);
    }

    #[test]
    fn a_cut_is_as_deep_as_the_probe_is_past_the_budget_down_to_two_cuts() {
        let now = Instant::now();
        let factor = |latency: u64| match with_baseline(now, 4).steer(
            now + hold(),
            &steady(latency),
            budget(),
            true,
        ) {
            Change::Cut { from, to } => to / from,
            other => panic!("{other:?}"),
        };
        let cut = params().cut;
        assert!(close(factor(13), cut), "just past: one cut");
        assert!(close(factor(20), 12.0 / 20.0), "two thirds past: by as much");
        assert!(close(factor(100), cut * cut), "far past: two cuts at once, no deeper");
    }

    #[test]
    fn a_cut_the_probe_is_no_faster_for_is_undone_when_a_quiet_window_is_as_slow() {
        let now = Instant::now();
        let mut steering = with_baseline(now, 4);
        let start = params().start_rate;
        let cut = start * params().cut;
        let mut at = now + hold();
        assert_eq!(
            steering.steer(at, &steady(15), budget(), true),
            Change::Cut { from: start, to: cut }
        );
        // Another client's load: the probe is as slow at the lower rate.
        at += hold();
        assert_eq!(steering.steer(at, &steady(15), budget(), true), Change::Judge);
        assert_eq!(steering.why(), Why::Judging);
        at += hold();
        let waiting = steering.steer(at, &steady(15), budget(), true);
        assert_eq!(waiting, Change::Held, "the cut waits for its quiet window");
        // As slow with none of the run's writes: not the run's.
        let undone = steering.quiet_window(at, vec![ms(15); 80]);
        assert_eq!(undone, Change::Undone { from: cut, to: start });
        assert_eq!(steering.why(), Why::Undone);
        // One loaded window does not move the baseline; the latency undone is noted instead,
        // and the probe at it, past the budget, cuts no more.
        assert_eq!(steering.baseline(), Some(ms(4)));
        at += hold();
        let noted = steering.steer(at, &steady(16), budget(), true);
        assert_eq!((noted, steering.why()), (Change::Held, Why::NotOurs));
    }

    #[test]
    fn a_cut_the_probe_is_no_faster_for_stands_when_a_quiet_window_is_faster() {
        let (mut steering, mut at) = cut_once(Instant::now());
        let cut = steering.rate();
        at += hold();
        assert_eq!(steering.steer(at, &steady(15), budget(), true), Change::Judge);
        // Fast again as soon as the run's writes stop: the latency was the run's.
        assert_eq!(steering.quiet_window(at, vec![ms(4); 80]), Change::Stood { rate: cut });
        assert_eq!((steering.rate(), steering.why()), (cut, Why::Stood));
        // Still past the budget: cut again; and growth after a cut that stood is slow.
        at += hold();
        assert!(matches!(steering.steer(at, &steady(15), budget(), true), Change::Cut { .. }));
        let again = steering.rate();
        at += hold();
        let grown = steering.steer(at, &steady(5), budget(), true);
        assert_eq!(grown, Change::Grew { from: again, to: again * params().increase });
    }

    #[test]
    fn a_cut_whose_quiet_window_never_comes_is_undone() {
        let (mut steering, mut at) = cut_once(Instant::now());
        let (cut, cut_at) = (steering.rate(), at);
        at += hold();
        assert_eq!(steering.steer(at, &steady(15), budget(), true), Change::Judge);
        let late = cut_at + params().hold + params().quiet_every;
        let waiting = steering.steer(late - ms(1), &steady(15), budget(), true);
        assert_eq!(waiting, Change::Held);
        let undone = steering.steer(late, &steady(15), budget(), true);
        assert_eq!(undone, Change::Undone { from: cut, to: params().start_rate });
    }

    #[test]
    fn under_a_fixed_budget_a_cut_that_leaves_the_probe_as_slow_is_undone_and_its_latency_cuts_no_more()
     {
        let now = Instant::now();
        // 12 ms, as 3x the quiet 4: a fixed budget takes no quiet windows to judge a cut by.
        let budget = Budget::Fixed(ms(12));
        let mut steering = with_baseline(now, 4);
        let start = params().start_rate;
        let cut = start * params().cut;
        let mut at = now + hold();
        assert_eq!(
            steering.steer(at, &steady(15), budget, true),
            Change::Cut { from: start, to: cut }
        );
        // Another client's load: the probe is as slow at the lower rate.
        at += hold();
        assert_eq!(
            steering.steer(at, &steady(15), budget, true),
            Change::Undone { from: cut, to: start }
        );
        assert_eq!(steering.why(), Why::Undone);
        at += hold();
        assert_eq!(steering.steer(at, &steady(16), budget, true), Change::Held);
        assert_eq!(steering.why(), Why::NotOurs, "within what was shown not to be the run's");
        // Past it, the law cuts again; back within the budget, it is forgotten.
        at += hold();
        let again = steering.steer(at, &steady(20), budget, true);
        assert!(matches!(again, Change::Cut { .. }), "{again:?}");
        at += hold();
        assert!(matches!(steering.steer(at, &steady(20), budget, true), Change::Undone { .. }));
        at += hold();
        let grown = steering.steer(at, &steady(4), budget, true);
        assert!(matches!(grown, Change::Grew { .. }), "{grown:?}");
        at += hold();
        let cut_again = steering.steer(at, &steady(13), budget, true);
        assert!(
            matches!(cut_again, Change::Cut { .. }),
            "the latency noted is forgotten: {cut_again:?}"
        );
    }

    #[test]
    fn a_cut_that_makes_the_probe_faster_stands_and_growth_is_slow_after_it() {
        let (mut steering, at) = cut_once(Instant::now());
        let cut = steering.rate();
        let at = at + hold();
        let grown = steering.steer(at, &steady(6), budget(), true);
        assert_eq!(grown, Change::Grew { from: cut, to: cut * params().increase });
    }

    #[test]
    fn before_any_cut_stood_it_grows_by_the_room_the_probe_leaves() {
        let now = Instant::now();
        let grow = |latency: u64| {
            let change =
                with_baseline(now, 4).steer(now + hold(), &steady(latency), budget(), true);
            match change {
                Change::Grew { from, to } => to / from,
                other => panic!("{other:?}"),
            }
        };
        assert!(close(grow(4), 3.0), "at the baseline: by the room, three times");
        assert!(close(grow(8), 1.5), "at two thirds of it: by half");
        assert!(close(grow(10), params().increase), "near it: by the least increase");
        // No more than `first_increase`, whatever the room.
        let slow = ProbeParams { first_increase: 2.0, ..params() };
        let mut steering = Steering::new(now, slow);
        steering.quiet_window(now, vec![ms(4); 80]);
        let change = steering.steer(now + hold(), &steady(4), budget(), true);
        assert_eq!(change, Change::Grew { from: slow.start_rate, to: slow.start_rate * 2.0 });
    }

    #[test]
    fn it_does_not_grow_near_the_budget_or_when_writes_do_not_wait_on_it() {
        let now = Instant::now();
        let mut steering = with_baseline(now, 4);
        assert_eq!(steering.steer(now + hold(), &steady(5), budget(), false), Change::Held);
        assert_eq!(steering.why(), Why::NotNeeded);
        assert_eq!(steering.steer(now + hold(), &steady(11), budget(), true), Change::Held);
        assert_eq!(steering.why(), Why::NearBudget);
    }

    #[test]
    fn a_baseline_above_what_the_probe_shows_while_writing_is_lowered_to_it() {
        let now = Instant::now();
        // The quiet window fell in a spell of the apiserver's: a budget of 129 ms.
        let mut steering = with_baseline(now, 43);
        let mut at = now + hold();
        steering.steer(at, &steady(4), budget(), true);
        assert_eq!(steering.baseline(), Some(ms(4)), "writes never make the probe faster");
        // Past three times what the probe showed while writing: cut, where 129 ms would grow.
        at += hold();
        let change = steering.steer(at, &steady(15), budget(), true);
        assert!(matches!(change, Change::Cut { .. }), "{change:?}");
        at += hold();
        steering.steer(at, &steady(9), budget(), true);
        assert_eq!(steering.baseline(), Some(ms(4)), "a slower look does not raise it");
        // Measured again at the next quiet window, the spell one of the two: the lower, and
        // lowered again at the next look.
        steering.quiet_window(now, vec![ms(7); 80]);
        assert_eq!(steering.baseline(), Some(ms(7)));
        at += hold();
        steering.steer(at, &steady(6), budget(), true);
        assert_eq!(steering.baseline(), Some(ms(6)));
    }

    #[test]
    fn a_fixed_budget_needs_no_baseline() {
        let now = Instant::now();
        let mut steering = Steering::new(now, params());
        let change = steering.steer(now + hold(), &steady(30), Budget::Fixed(ms(25)), true);
        assert!(matches!(change, Change::Cut { .. }), "{change:?}");
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&samples, 0.99), ms(99));
        assert_eq!(percentile(&samples, 0.9), ms(90));
        assert_eq!(percentile(&[], 0.9), Duration::ZERO);
        assert_eq!(percentile(&[ms(7)], 0.99), ms(7));
    }
}
