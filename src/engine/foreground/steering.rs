//! The gentle pace's law: a rate of writes per second, steered by a probe's latency against a
//! budget measured from the probe's own quiet baseline.
//!
//! - **Baseline.** Now and then the gentle writes pause for a moment (a quiet window); the
//!   probe's p99 in that window is one quiet sample, and the baseline is the least of the last
//!   [`QUIET_SAMPLES`]. So kube-svm's own load never drags it up, and a slow drift of the
//!   cluster (a larger etcd, another tenant) is followed within minutes, both ways.
//! - **Budget.** How slow the probe may get: a multiple of the baseline (`3x`, the default) or a
//!   fixed latency (`25ms`).
//! - **Rate.** The probe past the budget since the last change, plainly (one probe in ten,
//!   [`OVERLOAD`], over at least [`MIN_SAMPLES`]) or in its tail (its p99, [`JUDGED`], over at
//!   least [`TAIL_SAMPLES`]; right after a growth, its 98th percentile, [`ON_TRIAL`], over at
//!   least [`MIN_SAMPLES`]): the rate is cut at once, to [`LEAST_CUT`] of itself or, the probe
//!   further past the budget, to budget / p99 of itself, [`DEEPEST_CUT`] at most; and the rate
//!   that hurt is remembered, unless the probe was twice its budget or more at a rate that had
//!   not just grown: such a disturbance (a burst of other load) halves the rate at once, and the
//!   rate climbs back once it passes. Right after a growth the growth is to blame, however far
//!   past ([`BLAMED_WITHIN`]). A cut right after a cut is the same trouble going on: it remembers
//!   nothing. A rate well below the one remembered ([`NEAR_BAD_RATE`]) that hurts is doubted, not
//!   remembered, until it hurts again before the rate has held above it: one of the apiserver's
//!   spells does not lower the memory, a cluster grown slower does.
//!   A short spell of slow probes, the apiserver's own, counts as one ([`without_spells`]).
//!   Well within the budget (below [`ROOM`] of it) and with writes waiting on the rate: it
//!   grows, at most once per [`HOLD`], never past [`BAD_RATE_MARGIN`] of a remembered bad rate;
//!   the memory fades by [`BAD_RATE_FADE`] every [`BAD_RATE_AGE`]. Until a rate has hurt, it
//!   grows by the room the probe leaves (budget / p99, up to [`MOST_INCREASE`]), so a run finds
//!   the rate its budget allows in a few tens of seconds, not minutes; once one has, by
//!   [`INCREASE`].

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::api::Budget;

/// The percentile of the probe's latencies the budget bounds, as the quiet baseline is (like for
/// like): the tail, since that is where a loaded apiserver makes its other clients wait (their
/// median hardly moves), and the p99 of at least [`MIN_SAMPLES`]. Judged against a quiet p99,
/// an idle apiserver alone passed 3 times it; judged by its p99, the probe saw none of the load.
pub const JUDGED: f64 = 0.99;

/// Quiet samples the baseline is the least of: one a minute, as LEDBAT keeps ten per-minute
/// minima. A quiet sample is the slowest of about 40 probes, so their least is about the quiet
/// probe's 93rd percentile, and a budget of `3x` is stricter than 3 times its p99 (at 12,000
/// objects the foreground read 1.8 to 2.5 times idle). Their median, about its 98th, was tried:
/// twice the objects/s, and at 100,000 objects the foreground's p99 went from 28.0 to 46.1 ms,
/// its minutes past 12.3 ms (3 times idle) outside the apiserver's collector spells from 3 in 29
/// to 4 in 14.
pub const QUIET_SAMPLES: usize = 10;

/// The rate a run starts at, in objects per second.
pub const START_RATE: f64 = 20.0;

/// The slowest the rate gets, so a run always finishes.
pub const MIN_RATE: f64 = 2.0;

/// The rate after a cut, as a fraction of the rate before it, for a probe just past the budget.
/// Not less deep: with a cut of a tenth there (so that a chance tail cost little) and growth by
/// doubling, a rate found past the budget stayed near it for tens of seconds more, and a default
/// migration cost its foreground more than 3 times its idle p99 (measured: 10.2 ms against
/// 3.2 ms idle, at 90.9 objects/s).
const LEAST_CUT: f64 = 0.7;

/// The deepest cut, for a probe twice its budget or more: the halving of TCP and Vitess. Such a
/// cut remembers no bad rate: at 100,000 objects the apiserver's first seconds after a storage
/// switch read 239.6 ms at the starting rate, and a memory of that rate held the run at 18 to 20
/// objects/s for minutes, where the probe then read 3.6 to 8.9 ms against a budget of 10.7 ms.
const DEEPEST_CUT: f64 = 0.5;

/// The first cut this soon after the rate grew blames the growth: the rate it grew to is
/// remembered as bad, however far past the budget the probe went. The apiserver's latency hardly
/// moves below its knee and then rises steeply (measured: the probe at 4.2 ms and 92 objects/s,
/// then at 19.0 ms and 138), so an overshoot reads as a disturbance; unremembered, the rate
/// climbed by half again past the same knee, and each overshoot cost the foreground its minute's
/// p99.
const BLAMED_WITHIN: Duration = Duration::from_secs(60);

/// The rate after an increase once a rate has hurt, as a multiple of the rate before it.
const INCREASE: f64 = 1.2;

/// The most an increase multiplies the rate by, before any rate hurt (a probe at two thirds of
/// its budget or less). A fixed 1.2 took 90 s to climb from 20 to 86 objects/s; doubling (TCP's
/// slow start) overshot the rate a budget of `3x` allows by as much, and cost its foreground the
/// overshoot.
const MOST_INCREASE: f64 = 1.5;

/// The least time between two changes of the rate, so the effect of one is seen before the next.
pub const HOLD: Duration = Duration::from_secs(10);

/// Probe samples since the last change needed before the rate may change again: about 10 s of
/// probing, so that a cut has taken effect before the next is judged.
const MIN_SAMPLES: usize = 100;

/// The share of probes that, past the budget over as few as [`MIN_SAMPLES`], shows it plainly
/// passed: one in ten.
const OVERLOAD: f64 = 0.9;

/// Probe samples the budget's p99 is judged on: about 25 s of probing, so that it rests on three
/// slow probes or more. Over 100 probes the p99 is the second slowest, and two slow ones come by
/// chance a quarter of the time where the probe is just within its budget (measured: two in the
/// run's first seconds cut a run with a budget of 43 ms, whose probe then read 1.7 to 5.3 ms, and
/// its memory of that rate held it to 19 objects/s).
const TAIL_SAMPLES: usize = 250;

/// The percentile a growth on trial is judged by, over as few as [`MIN_SAMPLES`] probes: three
/// slow probes in 100, the evidence of the tail's 250 in 10 s (a growth is on trial until the
/// first cut after it, within [`BLAMED_WITHIN`]). A growth past the apiserver's knee judged on
/// 250 probes stayed past it for half a minute (measured at 100,000 objects: grown to 84.1
/// objects/s, cut 27 s later at a probe p99 of 20.3 ms against a budget of 17.0 ms). Not the
/// p99 of 100, two slow probes: at 20,000 objects a spell of the apiserver's, at one of its
/// consistency checks, then blamed a growth of 12 s before (a probe p99 of 21.9 ms against 13.9),
/// and took the memory of a rate that hurt from 62 to 52 objects/s.
const ON_TRIAL: f64 = 0.98;

/// The probe's p99 below this fraction of the budget leaves room to grow. Not much lower: a
/// budget twice the probe's quiet p99 would leave none (measured: at a budget of 8 ms, the
/// probe's p99 of 4.6 to 5.5 ms held the rate at 24 to 29 objects/s, where a fixed rate of 80
/// cost the foreground 5.2 ms). The probe reads a little above another client at the same rate
/// (1.2 to 1.3 times the foreground's p99 over the bench's fixed rates), so the foreground stays
/// further within.
const ROOM: f64 = 0.85;

/// An increase stops this far below a rate that hurt.
const BAD_RATE_MARGIN: f64 = 0.9;

/// A rate that hurts at this fraction of the remembered bad rate (faded) or above takes its
/// place at once; one further below is doubted first (it takes its place only if a rate that low
/// hurts again before the rate has held above it). The last climb to the memory's margin starts
/// from about 0.75 of it (its steps are [`INCREASE`]), so a cut near the memory's ceiling counts
/// at once. Lowered at every cut, the memory ratcheted down on the apiserver's own spells at
/// 100,000 objects: 22 cuts in an hour took it from 60 to 16 objects/s, the last ten, at 12 to
/// 19 objects/s, a few minutes apart, on probes of 16 to 43 ms against budgets of 13 to 15 ms
/// (the apiserver's idle p99 was 43.9 ms), and the run fell from 52 to 15 objects/s.
const NEAR_BAD_RATE: f64 = 0.75;

/// How often a remembered bad rate fades, and by how much.
const BAD_RATE_AGE: Duration = Duration::from_secs(180);
const BAD_RATE_FADE: f64 = 1.1;

/// What the law decided on one look.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Change {
    /// The probe passed the budget: the rate was cut.
    Cut { from: f64, to: f64 },
    /// Room under the budget, and writes waited on the rate: it grew.
    Grew { from: f64, to: f64 },
    /// Nothing to do, or too soon to tell.
    Held,
}

/// The rate's last change, as the next cut judges it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Last {
    /// None yet.
    None,
    /// It grew, at this time.
    Grew(Instant),
    /// It was cut.
    Cut,
}

/// The law's state.
#[derive(Clone, Debug)]
pub struct Steering {
    rate: f64,
    /// The probe's p99 in each recent quiet window, newest last.
    quiet: VecDeque<Duration>,
    /// A rate that hurt, and when it was remembered.
    bad: Option<(f64, Instant)>,
    /// A rate well below the remembered one that hurt once, until the rate holds above it.
    doubted: Option<f64>,
    /// The rate's last change.
    last: Last,
    /// When the rate last changed (or the run began).
    changed: Instant,
}

impl Steering {
    pub fn new(now: Instant) -> Steering {
        Steering {
            rate: START_RATE,
            quiet: VecDeque::new(),
            bad: None,
            doubted: None,
            last: Last::None,
            changed: now,
        }
    }

    /// Objects per second the gentle writes may reach now.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// When the rate last changed: probe samples from before it say nothing of the rate now.
    pub fn changed(&self) -> Instant {
        self.changed
    }

    /// The quiet baseline: the least of the recent quiet samples.
    pub fn baseline(&self) -> Option<Duration> {
        self.quiet.iter().min().copied()
    }

    /// Records the probe's p99 in a quiet window.
    pub fn quiet_sample(&mut self, p99: Duration) {
        self.quiet.push_back(p99);
        while self.quiet.len() > QUIET_SAMPLES {
            self.quiet.pop_front();
        }
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
        let Some(limit) = budget.limit(self.baseline()) else { return Change::Held };
        if samples.len() < MIN_SAMPLES {
            return Change::Held;
        }
        let seen = percentile(samples, JUDGED);
        let from = self.rate;
        // How many times the probe's p99 fits in the budget: below 1 past it, above 1 within.
        let room = limit.as_secs_f64() / seen.as_secs_f64().max(f64::MIN_POSITIVE);
        // Right after a growth, and until the first cut after it, the growth is on trial.
        let grown = matches!(self.last, Last::Grew(at) if now.duration_since(at) < BLAMED_WITHIN);
        let plainly = percentile(samples, OVERLOAD) > limit;
        let in_its_tail = samples.len() >= TAIL_SAMPLES && seen > limit
            || grown && percentile(samples, ON_TRIAL) > limit;
        if plainly || in_its_tail {
            self.rate = (from * room.clamp(DEEPEST_CUT, LEAST_CUT)).max(MIN_RATE);
            // A probe twice its budget or more is a disturbance (other load, the apiserver's
            // start-up or its collector), not the rate's own cost: halved, it is not remembered.
            // Unless the rate had just grown: then the growth went past the apiserver's knee.
            // Only the first cut after it: a second one is no longer the growth's.
            // A cut right after a cut is the same trouble going on.
            if (room > DEEPEST_CUT || grown) && self.last != Last::Cut {
                self.hurt(from, now);
            }
            self.last = Last::Cut;
            self.changed = now;
            return Change::Cut { from, to: self.rate };
        }
        if room <= 1.0 / ROOM || !waiting || now.duration_since(self.changed) < HOLD {
            return Change::Held;
        }
        let bad = self.bad_rate(now);
        let increase = match bad {
            None => room.clamp(INCREASE, MOST_INCREASE),
            Some(_) => INCREASE,
        };
        let ceiling = bad.map_or(f64::INFINITY, |bad| bad * BAD_RATE_MARGIN);
        let to = (from * increase).min(ceiling).max(from);
        if to <= from {
            return Change::Held;
        }
        // The rate held above a doubted one for a whole look: that hurt was not the rate's.
        if self.doubted.is_some_and(|doubted| from >= doubted) {
            self.doubted = None;
        }
        self.rate = to;
        self.changed = now;
        self.last = Last::Grew(now);
        Change::Grew { from, to }
    }

    /// A rate that hurt: remembered, or doubted if well below the one remembered and not
    /// doubted already.
    fn hurt(&mut self, rate: f64, now: Instant) {
        let near = self.bad_rate(now).is_none_or(|bad| rate >= bad * NEAR_BAD_RATE);
        if near || self.doubted.is_some() {
            self.bad = Some((rate, now));
            self.doubted = None;
        } else {
            self.doubted = Some(rate);
        }
    }

    /// The remembered bad rate, faded by its age.
    fn bad_rate(&self, now: Instant) -> Option<f64> {
        let (rate, at) = self.bad?;
        let ages = now.duration_since(at).as_secs_f64() / BAD_RATE_AGE.as_secs_f64();
        Some(rate * BAD_RATE_FADE.powf(ages.floor()))
    }
}

/// Slow probes (past the limit) closer than this to the one before are one spell.
pub const SPELL_GAP: Duration = Duration::from_secs(1);

/// A spell this long at most is the apiserver's own, and counts as one slow probe: a garbage
/// collection of a large apiserver's heap slows every client for a second or two, a few times a
/// minute, whether kube-svm writes or not (measured with 100,000 objects, a 4.3 GiB apiserver:
/// ten slow probes in a row over 2.1 s, and four more over 1.1 s, in a minute in which kube-svm
/// wrote 3 objects/s; the rate had been halved at each such spell, down to 2.5 objects/s). A
/// longer spell is load, and every probe of it counts.
pub const SPELL_LONGEST: Duration = Duration::from_secs(5);

/// The latencies of `samples` (when answered, how long), in the order answered, with each short
/// spell of slow probes (past `limit`) counted once, as its slowest.
pub fn without_spells(samples: &[(Instant, Duration)], limit: Duration) -> Vec<Duration> {
    let mut kept = Vec::with_capacity(samples.len());
    let mut spell: Vec<(Instant, Duration)> = Vec::new();
    let end_spell = |spell: &mut Vec<(Instant, Duration)>, kept: &mut Vec<Duration>| {
        let (Some(first), Some(last)) = (spell.first(), spell.last()) else { return };
        if last.0.duration_since(first.0) <= SPELL_LONGEST {
            kept.extend(spell.iter().map(|(_, latency)| *latency).max());
        } else {
            kept.extend(spell.iter().map(|(_, latency)| *latency));
        }
        spell.clear();
    };
    for &(at, latency) in samples {
        if latency <= limit {
            kept.push(latency);
            continue;
        }
        if spell.last().is_some_and(|(last, _)| at.duration_since(*last) >= SPELL_GAP) {
            end_spell(&mut spell, &mut kept);
        }
        spell.push((at, latency));
    }
    end_spell(&mut spell, &mut kept);
    kept
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

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn steady(latency: u64) -> Vec<Duration> {
        vec![ms(latency); MIN_SAMPLES]
    }

    fn with_baseline(now: Instant, baseline: u64) -> Steering {
        let mut steering = Steering::new(now);
        steering.quiet_sample(ms(baseline));
        steering
    }

    #[test]
    fn the_baseline_is_the_least_of_the_last_quiet_samples_and_forgets_old_ones() {
        let mut steering = Steering::new(Instant::now());
        assert_eq!(steering.baseline(), None);
        steering.quiet_sample(ms(3));
        for _ in 0..QUIET_SAMPLES - 1 {
            steering.quiet_sample(ms(5));
        }
        assert_eq!(steering.baseline(), Some(ms(3)));
        steering.quiet_sample(ms(6));
        assert_eq!(steering.baseline(), Some(ms(5)), "the oldest sample is forgotten");
    }

    #[test]
    fn nothing_changes_without_a_baseline_or_enough_samples() {
        let now = Instant::now();
        let mut steering = Steering::new(now);
        let later = now + HOLD * 2;
        assert_eq!(steering.steer(later, &steady(100), Budget::default(), true), Change::Held);
        steering.quiet_sample(ms(4));
        let few = vec![ms(100); MIN_SAMPLES - 1];
        assert_eq!(steering.steer(later, &few, Budget::default(), true), Change::Held);
        assert_eq!(steering.rate(), START_RATE);
    }

    #[test]
    fn past_the_budget_the_rate_is_cut_at_once_and_never_below_the_minimum() {
        let now = Instant::now();
        let mut steering = with_baseline(now, 4);
        let change = steering.steer(now, &steady(13), Budget::default(), false);
        assert_eq!(change, Change::Cut { from: START_RATE, to: START_RATE * LEAST_CUT });
        for _ in 0..30 {
            steering.steer(now, &steady(50), Budget::default(), false);
        }
        assert_eq!(steering.rate(), MIN_RATE);
    }

    /// The factor a change multiplied the rate by.
    fn factor(change: Change) -> f64 {
        match change {
            Change::Cut { from, to } | Change::Grew { from, to } => to / from,
            Change::Held => 1.0,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn a_cut_is_as_deep_as_the_probe_is_past_the_budget_within_its_bounds() {
        let now = Instant::now();
        // A baseline of 4 ms: the default budget is 12 ms.
        let cut = |latency: u64| {
            factor(with_baseline(now, 4).steer(now, &steady(latency), Budget::default(), false))
        };
        assert!(close(cut(13), LEAST_CUT), "just past it: the least cut, {}", cut(13));
        assert!(close(cut(15), LEAST_CUT), "a fifth past it: the least cut, {}", cut(15));
        assert!(close(cut(20), 12.0 / 20.0), "two thirds past it: by as much, {}", cut(20));
        assert!(close(cut(24), DEEPEST_CUT), "twice past it: halved, {}", cut(24));
        assert!(close(cut(100), DEEPEST_CUT), "never deeper than halved, {}", cut(100));
    }

    #[test]
    fn before_any_rate_hurt_it_grows_by_the_room_the_probe_leaves() {
        let now = Instant::now();
        let grow = |latency: u64| {
            factor(with_baseline(now, 4).steer(
                now + HOLD,
                &steady(latency),
                Budget::default(),
                true,
            ))
        };
        assert!(close(grow(2), MOST_INCREASE), "far within: by the most, {}", grow(2));
        assert!(close(grow(8), 1.5), "at two thirds of it: by half, {}", grow(8));
        assert!(close(grow(9), 12.0 / 9.0), "at three quarters: by a third, {}", grow(9));
        assert!(close(grow(10), INCREASE), "near it: by the least increase, {}", grow(10));
    }

    /// `slow` probes of 40 ms among `of`, the others 5 ms.
    fn with_slow(slow: usize, of: usize) -> Vec<Duration> {
        let mut samples = vec![ms(5); of - slow];
        samples.extend(vec![ms(40); slow]);
        samples
    }

    #[test]
    fn the_tail_is_judged_on_enough_probes_and_a_plain_excess_at_once() {
        let now = Instant::now();
        let cut = |samples: &[Duration]| {
            let mut steering = with_baseline(now, 4);
            matches!(steering.steer(now, samples, Budget::default(), false), Change::Cut { .. })
        };
        assert!(!cut(&with_slow(2, MIN_SAMPLES)), "two in a hundred come by chance");
        assert!(!cut(&with_slow(2, TAIL_SAMPLES)));
        assert!(cut(&with_slow(3, TAIL_SAMPLES)), "the p99 of enough probes is past the budget");
        assert!(cut(&with_slow(11, MIN_SAMPLES)), "one in ten is past it plainly");
    }

    #[test]
    fn a_growth_is_judged_on_fewer_probes_until_the_first_cut_after_it() {
        let now = Instant::now();
        let mut steering = with_baseline(now, 4);
        let grown = steering.steer(now + HOLD, &steady(4), Budget::default(), true);
        assert!(matches!(grown, Change::Grew { .. }), "{grown:?}");
        let at = now + HOLD * 2;
        let held = steering.steer(at, &with_slow(2, MIN_SAMPLES), Budget::default(), true);
        assert_eq!(held, Change::Held, "two slow probes in 100 come by chance");
        let cut = steering.steer(at, &with_slow(3, MIN_SAMPLES), Budget::default(), true);
        assert!(matches!(cut, Change::Cut { .. }), "three in 100 blame the growth: {cut:?}");
        // After that cut, and long after a growth, the tail needs its full count again.
        let held = steering.steer(at + HOLD, &with_slow(3, MIN_SAMPLES), Budget::default(), true);
        assert_eq!(held, Change::Held);
        let mut steering = with_baseline(now, 4);
        steering.steer(now + HOLD, &steady(4), Budget::default(), true);
        let later = now + HOLD + BLAMED_WITHIN;
        let held = steering.steer(later, &with_slow(3, MIN_SAMPLES), Budget::default(), false);
        assert_eq!(held, Change::Held);
    }

    #[test]
    fn with_room_and_writes_waiting_it_grows_once_per_hold() {
        let now = Instant::now();
        let mut steering = with_baseline(now, 4);
        let fast = steady(8);
        assert_eq!(steering.steer(now + HOLD / 2, &fast, Budget::default(), true), Change::Held);
        let grown = steering.steer(now + HOLD, &fast, Budget::default(), true);
        assert!(matches!(grown, Change::Grew { .. }), "{grown:?}");
        let soon = now + HOLD + HOLD / 2;
        assert_eq!(steering.steer(soon, &fast, Budget::default(), true), Change::Held);
    }

    #[test]
    fn once_a_rate_hurt_it_grows_slowly() {
        let now = Instant::now();
        let mut steering = with_baseline(now, 10);
        let idle = steady(10);
        let grown = steering.steer(now + HOLD, &idle, Budget::default(), true);
        assert_eq!(grown, Change::Grew { from: START_RATE, to: START_RATE * MOST_INCREASE });
        let hurt = steering.steer(now + HOLD * 2, &steady(40), Budget::default(), true);
        assert!(matches!(hurt, Change::Cut { .. }), "{hurt:?}");
        let from = steering.rate();
        let grown = steering.steer(now + HOLD * 3, &idle, Budget::default(), true);
        assert_eq!(grown, Change::Grew { from, to: from * INCREASE }, "once hurt, slowly");
    }

    #[test]
    fn it_does_not_grow_when_writes_do_not_wait_on_it_or_the_probe_is_near_the_budget() {
        let now = Instant::now() + HOLD;
        let mut steering = with_baseline(now - HOLD, 4);
        assert_eq!(steering.steer(now, &steady(5), Budget::default(), false), Change::Held);
        assert_eq!(steering.steer(now, &steady(11), Budget::default(), true), Change::Held);
    }

    #[test]
    fn a_disturbance_halves_the_rate_and_leaves_no_memory() {
        let now = Instant::now();
        let mut steering = with_baseline(now, 4);
        let cut = steering.steer(now, &steady(240), Budget::default(), true);
        assert_eq!(cut, Change::Cut { from: START_RATE, to: START_RATE * DEEPEST_CUT });
        let grown = steering.steer(now + HOLD, &steady(4), Budget::default(), true);
        assert_eq!(grown, Change::Grew { from: 10.0, to: 10.0 * MOST_INCREASE }, "no memory");
        let grown = steering.steer(now + HOLD * 2, &steady(4), Budget::default(), true);
        assert!(matches!(grown, Change::Grew { to, .. } if to > START_RATE), "{grown:?}");
    }

    #[test]
    fn a_disturbance_right_after_a_growth_blames_the_growth() {
        let now = Instant::now();
        let mut steering = with_baseline(now, 4);
        let grown = steering.steer(now + HOLD, &steady(4), Budget::default(), true);
        assert_eq!(grown, Change::Grew { from: START_RATE, to: START_RATE * MOST_INCREASE });
        let past_the_knee = START_RATE * MOST_INCREASE;
        let cut = steering.steer(now + HOLD * 2, &steady(240), Budget::default(), true);
        assert_eq!(cut, Change::Cut { from: past_the_knee, to: past_the_knee * DEEPEST_CUT });
        let mut at = now + HOLD * 2;
        for _ in 0..10 {
            at += HOLD;
            steering.steer(at, &steady(4), Budget::default(), true);
        }
        assert!(close(steering.rate(), past_the_knee * BAD_RATE_MARGIN), "{steering:?}");
        // Only the first cut after a growth blames it: a second disturbance soon after is
        // other load, and leaves the rate the growth reached as the one remembered.
        let mut steering = with_baseline(now, 4);
        steering.steer(now + HOLD, &steady(4), Budget::default(), true);
        steering.steer(now + HOLD * 2, &steady(240), Budget::default(), true);
        steering.steer(now + HOLD * 3, &steady(240), Budget::default(), true);
        assert!(
            matches!(steering.bad, Some((rate, _)) if close(rate, past_the_knee)),
            "{steering:?}"
        );
        // Long after the last growth, a disturbance is other load again.
        let mut steering = with_baseline(now, 4);
        steering.steer(now + HOLD, &steady(4), Budget::default(), true);
        let later = now + HOLD + BLAMED_WITHIN;
        steering.steer(later, &steady(240), Budget::default(), true);
        assert_eq!(steering.bad, None, "{steering:?}");
    }

    #[test]
    fn a_rate_that_hurt_is_not_reached_again_until_its_memory_fades() {
        let start = Instant::now();
        let mut steering = with_baseline(start, 4);
        steering.steer(start, &steady(20), Budget::default(), true);
        let mut now = start;
        for _ in 0..10 {
            now += HOLD;
            steering.steer(now, &steady(5), Budget::default(), true);
        }
        assert!((steering.rate() - START_RATE * BAD_RATE_MARGIN).abs() < 1e-9, "{steering:?}");
        for _ in 0..80 {
            now += HOLD;
            steering.steer(now, &steady(5), Budget::default(), true);
        }
        assert!(steering.rate() > START_RATE, "the memory fades: {steering:?}");
    }

    /// A steering that has remembered `bad` as a rate that hurt (a baseline of 4 ms, so a budget
    /// of 12 ms), whose rate has since been cut and grown back to `rate`, and is now cut by a
    /// probe just past its budget (14 ms) at `now`: the steering, and that cut.
    fn hurt_at(now: Instant, bad: f64, rate: f64) -> (Steering, Change) {
        let mut steering = with_baseline(now, 4);
        steering.bad = Some((bad, now));
        steering.rate = rate;
        steering.last = Last::Grew(now - HOLD);
        let cut = steering.steer(now, &steady(14), Budget::default(), true);
        (steering, cut)
    }

    fn remembered(steering: &Steering) -> Option<f64> {
        steering.bad.map(|(rate, _)| rate)
    }

    #[test]
    fn a_cut_near_the_remembered_rate_takes_its_place() {
        let now = Instant::now();
        let (steering, cut) = hurt_at(now, 60.0, 54.0);
        assert_eq!(cut, Change::Cut { from: 54.0, to: 54.0 * LEAST_CUT });
        assert_eq!(remembered(&steering), Some(54.0), "{steering:?}");
    }

    #[test]
    fn a_cut_right_after_a_cut_remembers_nothing() {
        let now = Instant::now();
        let (mut steering, _) = hurt_at(now, 60.0, 54.0);
        let again = steering.steer(now + HOLD, &steady(14), Budget::default(), true);
        assert!(matches!(again, Change::Cut { .. }), "{again:?}");
        assert_eq!(remembered(&steering), Some(54.0), "{steering:?}");
        assert_eq!(steering.doubted, None, "{steering:?}");
        // Nor after a disturbance: the trouble goes on, whatever its depth.
        let mut steering = with_baseline(now, 4);
        steering.steer(now, &steady(240), Budget::default(), true);
        steering.steer(now + HOLD, &steady(14), Budget::default(), true);
        assert_eq!(steering.bad, None, "{steering:?}");
    }

    #[test]
    fn a_rate_well_below_the_remembered_one_is_doubted_until_it_hurts_again() {
        let now = Instant::now();
        // It hurts once at 30, half the remembered 60: the memory stays.
        let (mut steering, cut) = hurt_at(now, 60.0, 30.0);
        assert_eq!(cut, Change::Cut { from: 30.0, to: 30.0 * LEAST_CUT });
        assert_eq!(remembered(&steering), Some(60.0), "{steering:?}");
        assert_eq!(steering.doubted, Some(30.0), "{steering:?}");
        // It climbs back and hurts again before holding above 30: now it is remembered.
        let mut at = now;
        while steering.rate() < 30.0 {
            at += HOLD;
            let grown = steering.steer(at, &steady(5), Budget::default(), true);
            assert!(matches!(grown, Change::Grew { .. }), "{grown:?}");
        }
        let hurt = steering.rate();
        at += HOLD;
        steering.steer(at, &steady(14), Budget::default(), true);
        assert_eq!(remembered(&steering), Some(hurt), "{steering:?}");
        assert_eq!(steering.doubted, None, "{steering:?}");
    }

    #[test]
    fn a_doubted_rate_is_forgotten_once_the_rate_holds_above_it() {
        let now = Instant::now();
        let (mut steering, _) = hurt_at(now, 60.0, 30.0);
        let mut at = now;
        while steering.doubted.is_some() {
            at += HOLD;
            let grown = steering.steer(at, &steady(5), Budget::default(), true);
            assert!(matches!(grown, Change::Grew { .. }), "{grown:?}");
        }
        assert!(steering.rate() > 30.0 * INCREASE, "{steering:?}");
        // A later spell well below the memory is doubted afresh, and the rate climbs on to the
        // memory's margin.
        at += HOLD;
        steering.steer(at, &steady(14), Budget::default(), true);
        assert_eq!(remembered(&steering), Some(60.0), "{steering:?}");
        for _ in 0..8 {
            at += HOLD;
            steering.steer(at, &steady(5), Budget::default(), true);
        }
        assert!(at < now + BAD_RATE_AGE, "the memory has not faded yet");
        assert!(close(steering.rate(), 60.0 * BAD_RATE_MARGIN), "{steering:?}");
    }

    #[test]
    fn a_fixed_budget_needs_no_baseline() {
        let now = Instant::now();
        let mut steering = Steering::new(now);
        let change = steering.steer(now, &steady(30), Budget::Fixed(ms(25)), true);
        assert!(matches!(change, Change::Cut { .. }), "{change:?}");
    }

    #[test]
    fn a_short_spell_of_slow_probes_counts_once_and_a_long_one_in_full() {
        let start = Instant::now();
        let at = |tenths: u64| start + Duration::from_millis(100 * tenths);
        let limit = ms(10);
        // 1 s of fast probes, a spell of ten slow ones over 1 s, fast again, and one lone slow.
        let mut samples: Vec<(Instant, Duration)> = (0..10).map(|i| (at(i), ms(3))).collect();
        samples.extend((10..20).map(|i| (at(i), ms(30 + i))));
        samples.extend((20..40).map(|i| (at(i), ms(3))));
        samples.push((at(40), ms(25)));
        let kept = without_spells(&samples, limit);
        assert_eq!(kept.len(), 10 + 1 + 20 + 1, "{kept:?}");
        assert_eq!(
            kept.iter().filter(|l| **l > limit).copied().collect::<Vec<_>>(),
            [ms(49), ms(25)]
        );
        // Slow for 8 s on end: load, not a spell.
        let long: Vec<(Instant, Duration)> = (0..80).map(|i| (at(i), ms(30))).collect();
        assert_eq!(without_spells(&long, limit).len(), 80);
        // Slow probes a second or more apart are spells of their own.
        let apart: Vec<(Instant, Duration)> = (0..5).map(|i| (at(10 * i), ms(30))).collect();
        assert_eq!(without_spells(&apart, limit).len(), 5);
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
