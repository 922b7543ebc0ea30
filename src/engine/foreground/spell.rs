//! The apiserver's spells, as the probe sees them while they last: a probe past its budget
//! ([`PAST`]), answered or still awaited that long, and the gentle writes wait for the spell to
//! pass instead of adding to it. The law (`steering`) answers the probe's tail over seconds; a
//! spell (a collection of a large apiserver's heap, one of its consistency checks) is over
//! before the law has looked, and every other client's requests in it wait behind what is in the
//! apiserver's queue.
//!
//! A spell is the slow probes less than [`SPELL_GAP`] apart, as the law counts them. The writes
//! wait while its latest probe is slow, or while a probe is awaited past the mark, and never
//! longer than [`SPELL_LONGEST`] from its start: a spell longer than that is load, which the law
//! cuts the rate for, and the writes go on at that rate. So a probe that stays slow, or a probe's
//! connection that hangs, costs a migration one wait of a few seconds, never its progress.

use std::time::Duration;

use tokio::time::Instant;

use super::steering::{SPELL_GAP, SPELL_LONGEST};

/// A probe this many times its budget, or awaited this long, says a spell is under way: past
/// the budget, as the law counts a slow probe. Not twice it, the law's mark of a disturbance:
/// then the law cut the rate where the writes now wait, and the foreground's minutes were past
/// its budget more often (at 20,000 objects, both in one run: 7 of 12 minutes within 3 times
/// its idle p99, against 12 of 16 now, at 0.72 times the objects/s).
pub const PAST: f64 = 1.0;

/// How often a write waiting out a spell looks again: about a probe's interval, so the writes
/// go on within a probe of the spell's end.
const LOOK_AGAIN: Duration = Duration::from_millis(50);

#[derive(Clone, Copy, Debug, PartialEq)]
struct Spell {
    /// When the first slow probe of the spell was sent.
    from: Instant,
    /// When its last slow probe was answered.
    last: Instant,
    /// Whether the latest probe answered was slow.
    on: bool,
}

/// The spell under way, and the probe awaited.
#[derive(Debug, Default)]
pub struct Spells {
    spell: Option<Spell>,
    /// When the probe awaited now was sent.
    awaited: Option<Instant>,
    /// The start of the last spell waited out, so each is counted once.
    waited: Option<Instant>,
}

impl Spells {
    /// A probe sent at `at`, not yet answered.
    pub fn sent(&mut self, at: Instant) {
        self.awaited = Some(at);
    }

    /// The probe sent at `sent` answered after `latency`, or none came (`None`); `limit` is
    /// the budget then, if known.
    pub fn answered(&mut self, sent: Instant, latency: Option<Duration>, limit: Option<Duration>) {
        self.awaited = None;
        let (Some(latency), Some(limit)) = (latency, limit) else { return };
        let answered = sent + latency;
        self.spell = match (self.spell, latency >= limit.mul_f64(PAST)) {
            (Some(spell), true) if answered.duration_since(spell.last) < SPELL_GAP => {
                Some(Spell { last: answered, on: true, ..spell })
            }
            (_, true) => Some(Spell { from: sent, last: answered, on: true }),
            (Some(spell), false) => Some(Spell { on: false, ..spell }),
            (None, false) => None,
        };
    }

    /// Until when a gentle write waits at `now`, against `limit`, if a spell is under way; it
    /// looks again then. `true` beside it the first time this spell makes a write wait.
    pub fn wait(&mut self, now: Instant, limit: Duration) -> Option<(Instant, bool)> {
        let mark = limit.mul_f64(PAST);
        let awaited = self.awaited.filter(|sent| now.duration_since(*sent) >= mark);
        let from = match (self.spell, awaited) {
            (Some(spell), _) if spell.on => spell.from,
            (Some(spell), Some(sent)) if sent.duration_since(spell.last) < SPELL_GAP => spell.from,
            (_, Some(sent)) => sent,
            _ => return None,
        };
        let end = from + SPELL_LONGEST;
        if now >= end {
            return None;
        }
        let first = self.waited != Some(from);
        self.waited = Some(from);
        Some(((now + LOOK_AGAIN).min(end), first))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    const LIMIT: Duration = Duration::from_millis(10);

    #[test]
    fn a_probe_past_its_budget_holds_the_writes_until_a_probe_within_it() {
        let now = Instant::now();
        let mut spells = Spells::default();
        spells.answered(now, Some(ms(9)), Some(LIMIT));
        assert_eq!(spells.wait(now + ms(9), LIMIT), None, "within the budget");
        spells.answered(now + ms(100), Some(ms(12)), Some(LIMIT));
        let at = now + ms(112);
        assert_eq!(spells.wait(at, LIMIT), Some((at + LOOK_AGAIN, true)));
        assert_eq!(spells.wait(at + ms(10), LIMIT), Some((at + ms(10) + LOOK_AGAIN, false)));
        spells.answered(now + ms(200), Some(ms(5)), Some(LIMIT));
        assert_eq!(spells.wait(now + ms(205), LIMIT), None, "it passed");
    }

    #[test]
    fn a_probe_awaited_past_the_mark_holds_the_writes_before_it_answers() {
        let now = Instant::now();
        let mut spells = Spells::default();
        spells.sent(now);
        assert_eq!(spells.wait(now + ms(9), LIMIT), None);
        assert!(spells.wait(now + ms(10), LIMIT).is_some_and(|(_, first)| first));
        spells.answered(now, None, Some(LIMIT));
        assert_eq!(spells.wait(now + ms(30), LIMIT), None, "no answer says nothing");
    }

    #[test]
    fn a_spell_holds_the_writes_no_longer_than_the_longest_spell_however_it_goes_on() {
        let now = Instant::now();
        let mut spells = Spells::default();
        let mut sent = now;
        // Slow probes, and fast ones between them, less than the gap apart: one spell.
        while sent < now + SPELL_LONGEST * 2 {
            spells.answered(sent, Some(ms(30)), Some(LIMIT));
            let waits = spells.wait(sent + ms(30), LIMIT);
            let within = sent + ms(30) < now + SPELL_LONGEST;
            assert_eq!(waits.is_some(), within, "it waits until the spell's longest, not past");
            assert!(waits.is_none_or(|(until, _)| until <= now + SPELL_LONGEST));
            spells.answered(sent + ms(100), Some(ms(2)), Some(LIMIT));
            spells.sent(sent + ms(200));
            sent += ms(300);
        }
        assert_eq!(spells.wait(sent, LIMIT), None, "an awaited probe does not start it again");
        // A slow probe after a gap is a spell of its own.
        let later = sent + SPELL_GAP * 2;
        spells.answered(later, Some(ms(30)), Some(LIMIT));
        assert!(spells.wait(later + ms(30), LIMIT).is_some_and(|(_, first)| first));
    }

    #[test]
    fn without_a_budget_nothing_waits() {
        let now = Instant::now();
        let mut spells = Spells::default();
        spells.answered(now, Some(ms(500)), None);
        assert_eq!(spells.wait(now + ms(500), LIMIT), None);
    }
}
