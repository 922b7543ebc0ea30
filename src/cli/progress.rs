//! How `kube-svm migrate` shows a running migration: a progress bar per resource on a terminal,
//! a plain line every few seconds otherwise (a CI log, a Helm hook's pod log). The numbers are
//! computed by [`Figures::of`], which is pure.

use std::time::Duration;

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::time::Instant;

use super::figures;
use crate::engine::{Pacing, Progress};

/// Least time between two plain progress lines: often enough to show life in a log, rarely
/// enough that a long migration's log stays readable.
const LINE_INTERVAL: Duration = Duration::from_secs(10);

/// Where progress goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Show {
    /// A bar when standard error is a terminal, lines otherwise.
    #[default]
    Auto,
    Bar,
    Lines,
    /// Only each resource's result.
    None,
}

/// What is shown of a migration at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    pub processed: u64,
    /// Objects in all, when the apiserver estimated how many are left to list.
    pub total: Option<u64>,
    /// Objects per second handled by this run (not counting what a resumed run had done).
    pub rate: Option<f64>,
    pub eta: Option<Duration>,
    /// The run's pace and write window, once the engine has reported them.
    pub pacing: Option<Pacing>,
}

impl Figures {
    /// The figures of `progress`, `elapsed` after this run started at `processed_at_start`.
    pub fn of(progress: &Progress, processed_at_start: u64, elapsed: Duration) -> Figures {
        let processed = progress.processed();
        // Listed objects not yet handled, and those the apiserver says are still to list.
        let total = progress.remaining.map(|remaining| progress.listed.max(processed) + remaining);
        let rate = figures::rate(processed.saturating_sub(processed_at_start), elapsed);
        let eta = total.and_then(|total| figures::eta(total.saturating_sub(processed), rate));
        Figures { processed, total, rate, eta, pacing: progress.pacing }
    }

    /// `4200 of ~10000 objects (42%), 398 objects/s, ETA 15s`, and while the window is held back
    /// for the cluster's sake `; holding back to 6 writes at once: ...`, and at the gentle pace
    /// what it steers by (`; probe p99 7.1ms, budget 12.0ms ...`).
    pub fn line(&self) -> String {
        let mut out = match self.total {
            Some(total) if total > 0 => format!(
                "{} of ~{total} objects ({}%)",
                self.processed,
                (self.processed * 100 / total).min(100)
            ),
            _ => format!("{} objects", self.processed),
        };
        if let Some(rate) = self.rate {
            out.push_str(&format!(", {rate:.0} objects/s"));
        }
        if let Some(eta) = self.eta {
            out.push_str(&format!(", ETA {}", figures::clock(eta)));
        }
        if let Some((pacing, restraint)) = self.held_back() {
            let size = pacing.window.size as u64;
            out.push_str(&format!("; {}", figures::holding_back(pacing.pace, size, restraint)));
        }
        if let Some(steered) = self.pacing.and_then(|pacing| pacing.steered) {
            out.push_str(&format!("; {steered}"));
        }
        out
    }

    /// The pacing, and what holds the window back, while something does.
    fn held_back(&self) -> Option<(Pacing, crate::engine::Restraint)> {
        let pacing = self.pacing?;
        Some((pacing, pacing.window.restraint?))
    }
}

/// The display of one resource's migration.
pub struct Display {
    name: String,
    bar: Option<ProgressBar>,
    lines: bool,
    started: Instant,
    processed_at_start: u64,
    last_line: Option<Instant>,
}

impl Display {
    /// The display of a run that starts with `processed_at_start` objects handled before it.
    pub fn new(show: Show, terminal: bool, name: &str, processed_at_start: u64) -> Display {
        let bar = match (show, terminal) {
            (Show::Bar, _) | (Show::Auto, true) => Some(bar(name)),
            _ => None,
        };
        let lines = matches!((show, terminal), (Show::Lines, _) | (Show::Auto, false));
        Display {
            name: name.to_owned(),
            bar,
            lines,
            started: Instant::now(),
            processed_at_start,
            last_line: None,
        }
    }

    /// Shows `progress`; plain lines at most every [`LINE_INTERVAL`].
    pub fn update(&mut self, progress: &Progress) {
        let figures = Figures::of(progress, self.processed_at_start, self.started.elapsed());
        if let Some(bar) = &self.bar {
            bar.set_length(figures.total.unwrap_or(figures.processed).max(figures.processed));
            bar.set_position(figures.processed);
            let rate = figures.rate.map_or(String::new(), |r| format!("{r:.0} objects/s"));
            let eta = figures.eta.map_or(String::new(), |e| format!(", ETA {}", figures::clock(e)));
            let held = figures.held_back().map_or(String::new(), |(pacing, restraint)| {
                let window = figures::window(pacing.window.size as u64, Some(restraint));
                format!(", {} pace, window {window}", pacing.pace.name())
            });
            bar.set_message(format!("{rate}{eta}{held}"));
        }
        let due = self.last_line.is_none_or(|last| last.elapsed() >= LINE_INTERVAL);
        if self.lines && due {
            eprintln!("{}: {}", self.name, figures.line());
            self.last_line = Some(Instant::now());
        }
    }

    /// Clears the bar: the resource's result line takes its place.
    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

fn bar(name: &str) -> ProgressBar {
    let style =
        ProgressStyle::with_template("{prefix} [{bar:24}] {pos}/{len} objects {percent}% {msg}")
            .map(|style| style.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    // No length until the first page says how many objects there are.
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(style);
    bar.set_prefix(name.to_owned());
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(listed: u64, rewritten: u64, remaining: Option<u64>) -> Progress {
        Progress { listed, rewritten, remaining, ..Progress::default() }
    }

    #[test]
    fn the_total_is_what_was_listed_and_what_is_left_to_list() {
        let figures = Figures::of(&progress(1000, 800, Some(9000)), 0, Duration::from_secs(4));
        assert_eq!(figures.total, Some(10_000));
        assert_eq!(figures.rate, Some(200.0));
        assert_eq!(figures.eta, Some(Duration::from_secs(46)));
        assert_eq!(figures.line(), "800 of ~10000 objects (8%), 200 objects/s, ETA 46s");
    }

    #[test]
    fn a_resumed_run_counts_its_rate_from_where_it_resumed() {
        let figures = Figures::of(&progress(5000, 5000, Some(5000)), 4000, Duration::from_secs(10));
        assert_eq!(figures.rate, Some(100.0));
        assert_eq!(figures.eta, Some(Duration::from_secs(50)));
    }

    #[test]
    fn no_rate_before_a_second_or_an_object_and_no_eta_without_a_total() {
        let early = Figures::of(&progress(500, 500, Some(1)), 0, Duration::from_millis(200));
        assert_eq!((early.rate, early.eta), (None, None));
        let unknown = Figures::of(&progress(500, 500, None), 0, Duration::from_secs(5));
        assert_eq!(unknown.eta, None);
        assert_eq!(unknown.line(), "500 objects, 100 objects/s");
    }

    #[test]
    fn a_window_held_back_is_said_and_one_that_is_not_is_not() {
        use crate::api::Pace;
        use crate::engine::{Holding, Restraint};
        let paced = |restraint| Progress {
            pacing: Some(Pacing {
                pace: Pace::Gentle,
                window: Holding { size: 6, restraint },
                steered: None,
            }),
            ..progress(1000, 800, Some(9000))
        };
        let free = Figures::of(&paced(None), 0, Duration::from_secs(4));
        assert_eq!(free.line(), "800 of ~10000 objects (8%), 200 objects/s, ETA 46s");
        let held = Figures::of(&paced(Some(Restraint::Latency)), 0, Duration::from_secs(4));
        assert_eq!(
            held.line(),
            "800 of ~10000 objects (8%), 200 objects/s, ETA 46s; holding back to 6 writes at once: the apiserver answers slower than the gentle pace allows"
        );
    }
}
