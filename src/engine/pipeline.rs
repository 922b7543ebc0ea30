//! One run as a pipeline: a lister reads pages ahead (at most one page waits beside the one
//! being written), and writes flow as one continuous stream across pages, a bounded number
//! outstanding. There is no page barrier: an object in backoff holds back only the checkpoint,
//! not the writes after it. Progress is folded in page by page, in list order, once every object
//! of a page (and of every page before it) is done, so the continue token a checkpoint records
//! never skips an object that was not written.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, instrument};

use super::pager::{Listed, Page};
use super::writer::Halt;
use super::{Engine, Error, FailedObject, Finished, Job, Outcome, Progress, RunState};

/// Writes started but not finished (in flight, waiting for the window, or backing off), per
/// window slot: enough that the window never waits for the dispatcher, few enough that memory
/// stays a few pages.
const OUTSTANDING_PER_SLOT: usize = 4;

/// One listed page on its way through the pipeline.
struct PageInFlight {
    /// The token to list the page after this one; `None` for the last.
    next_token: Option<String>,
    remaining: Option<u64>,
    listed: u64,
    /// Objects of the page not yet done (dispatched or not).
    unfinished: usize,
    tally: Tally,
}

/// Outcomes of one page's objects.
#[derive(Default)]
struct Tally {
    rewritten: u64,
    already_current: u64,
    skipped: u64,
    failures: Vec<FailedObject>,
    failed: u64,
}

impl Tally {
    fn record(&mut self, outcome: Outcome, failures_kept: usize) {
        match outcome {
            Outcome::Rewritten => self.rewritten += 1,
            Outcome::AlreadyCurrent => self.already_current += 1,
            Outcome::Conflict | Outcome::Deleted => self.skipped += 1,
            Outcome::Failed(failure) => {
                self.failed += 1;
                if self.failures.len() < failures_kept {
                    self.failures.push(failure);
                }
            }
        }
    }
}

impl Engine {
    /// Migrates every object of `job.resource`, publishing progress on `report` as pages are
    /// done.
    #[instrument(skip_all, fields(resource = %job.resource))]
    pub async fn run(
        &self,
        job: Job,
        report: &watch::Sender<Progress>,
        cancel: &CancellationToken,
    ) -> Result<Finished, Error> {
        let Job { resource, write_to_status, resume, fence } = job;
        let mut progress = resume;
        let run = RunState::new(self.settings.writes_in_flight, fence);
        let first = progress.continue_token.clone();

        // The lister: one page waits in the channel while the dispatcher writes another.
        let (pages_tx, mut pages) = mpsc::channel::<Result<Page, Error>>(1);
        let lister = async {
            let mut token = first;
            let mut tokens = Tokens::default();
            loop {
                let mut page = self.list_page(&resource, token.as_deref(), &run).await;
                let next = page.as_ref().ok().and_then(|p| p.continue_token.clone());
                if next.as_deref().is_some_and(|next| !tokens.first_time(next)) {
                    page = Err(Error::ListLoops(resource.to_string()));
                }
                let failed = page.is_err();
                if pages_tx.send(page).await.is_err() || failed || next.is_none() {
                    break;
                }
                token = next;
            }
            drop(pages_tx);
            // Only the dispatcher ends the run.
            std::future::pending::<()>().await;
        };

        let max_outstanding = self.settings.writes_in_flight.max(1) * OUTSTANDING_PER_SLOT;
        let failures_kept = self.settings.failures_kept;
        let dispatcher = async {
            let mut pending: VecDeque<PageInFlight> = VecDeque::new();
            // Sequence number of `pending[0]`.
            let mut front_seq: u64 = 0;
            let mut current: Option<(u64, std::vec::IntoIter<Listed>)> = None;
            let mut lister_done = false;
            let mut writes = FuturesUnordered::new();
            loop {
                // Dispatch as long as there is room.
                while writes.len() < max_outstanding {
                    let Some((seq, objects)) = current.as_mut() else { break };
                    let Some(object) = objects.next() else {
                        current = None;
                        break;
                    };
                    let (seq, resource, run) = (*seq, &resource, &run);
                    writes.push(async move {
                        (seq, self.write(resource, &object, write_to_status, run).await)
                    });
                }
                // Fold the pages that are done, in order.
                while pending.front().is_some_and(|page| page.unfinished == 0) {
                    let Some(page) = pending.pop_front() else { break };
                    front_seq += 1;
                    let before = progress.clone();
                    fold(&mut progress, page, failures_kept);
                    run.drain_into(&mut progress);
                    self.observe_page(&resource, &before, &progress);
                    report.send_replace(progress.clone());
                    info!(
                        listed = progress.listed,
                        rewritten = progress.rewritten,
                        already_current = progress.already_current,
                        skipped = progress.skipped,
                        failed = progress.failed,
                        remaining = progress.remaining,
                        "page done"
                    );
                }
                if lister_done && current.is_none() && pending.is_empty() {
                    return Ok(Finished::Completed(progress));
                }
                let wants_page =
                    current.is_none() && !lister_done && writes.len() < max_outstanding;
                tokio::select! {
                    _ = cancel.cancelled() => {
                        run.drain_into(&mut progress);
                        return Ok(Finished::Cancelled(progress));
                    }
                    Some((seq, outcome)) = writes.next(), if !writes.is_empty() => {
                        let page = usize::try_from(seq - front_seq).ok().and_then(|i| pending.get_mut(i));
                        let Some(page) = page else { continue };
                        page.unfinished -= 1;
                        match outcome {
                            Ok(outcome) => page.tally.record(outcome, failures_kept),
                            Err(halt) => return halted(halt, &resource, &run, progress),
                        }
                    }
                    page = pages.recv(), if wants_page => match page {
                        None => lister_done = true,
                        Some(Err(Error::Fenced)) => {
                            run.drain_into(&mut progress);
                            return Ok(Finished::Cancelled(progress));
                        }
                        Some(Err(error)) => return Err(error),
                        Some(Ok(page)) => {
                            let seq = front_seq + pending.len() as u64;
                            let listed = page.items.len() as u64;
                            pending.push_back(PageInFlight {
                                next_token: page.continue_token,
                                remaining: page.remaining,
                                listed,
                                unfinished: page.items.len(),
                                tally: Tally::default(),
                            });
                            current = Some((seq, page.items.into_iter()));
                        }
                    },
                }
            }
        };
        tokio::select! {
            finished = dispatcher => finished,
            () = lister => unreachable!("the lister never ends on its own"),
        }
    }
}

/// The continue tokens one run was handed, to catch an apiserver (or a proxy) that hands out
/// one it handed out before: following it would list the same pages forever. Kept as hashes, so
/// memory stays small however long the list.
#[derive(Default)]
struct Tokens(HashSet<u64>);

impl Tokens {
    /// Whether `token` was not handed out before in this run.
    fn first_time(&mut self, token: &str) -> bool {
        let mut hasher = DefaultHasher::new();
        token.hash(&mut hasher);
        self.0.insert(hasher.finish())
    }
}

/// Adds a finished page to `progress`: counts, the token to resume after it, the estimate.
fn fold(progress: &mut Progress, page: PageInFlight, failures_kept: usize) {
    let PageInFlight { next_token, remaining, listed, tally, .. } = page;
    progress.listed += listed;
    progress.rewritten += tally.rewritten;
    progress.already_current += tally.already_current;
    progress.skipped += tally.skipped;
    progress.failed += tally.failed;
    let room = failures_kept.saturating_sub(progress.failures.len());
    progress.failures.extend(tally.failures.into_iter().take(room));
    progress.remaining = remaining;
    progress.continue_token = next_token;
    progress.pages += 1;
}

/// How a run ends when one write says it must stop.
fn halted(
    halt: Halt,
    resource: &super::Resource,
    run: &RunState,
    mut progress: Progress,
) -> Result<Finished, Error> {
    match halt {
        Halt::Fenced => {
            run.drain_into(&mut progress);
            Ok(Finished::Cancelled(progress))
        }
        Halt::NotServed(message) => Err(Error::NotServed {
            resource: resource.to_string(),
            api_version: resource.api_version(),
            message,
        }),
        Halt::Unavailable(waited) => Err(Error::ApiserverUnavailable {
            resource: resource.to_string(),
            waited_seconds: waited.as_secs(),
        }),
        Halt::WritesFailing(failing) => {
            Err(Error::WritesFailing { resource: resource.to_string(), failing })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(listed: u64, next: Option<&str>) -> PageInFlight {
        PageInFlight {
            next_token: next.map(str::to_owned),
            remaining: Some(7),
            listed,
            unfinished: 0,
            tally: Tally::default(),
        }
    }

    #[test]
    fn a_continue_token_handed_out_twice_is_caught() {
        let mut tokens = Tokens::default();
        assert!(tokens.first_time("a") && tokens.first_time("b"));
        assert!(!tokens.first_time("a"), "a loop back to an earlier page");
        assert!(!tokens.first_time("b"), "the same token again");
    }

    #[test]
    fn a_folded_page_moves_the_resume_point_past_it_and_adds_its_counts() {
        let mut progress = Progress::default();
        let mut first = page(3, Some("after-first"));
        first.tally.record(Outcome::Rewritten, 1);
        first.tally.record(Outcome::Deleted, 1);
        first.tally.record(
            Outcome::Failed(FailedObject {
                namespace: String::new(),
                name: "a".into(),
                code: 422,
                reason: "Invalid".into(),
                message: "no".into(),
            }),
            1,
        );
        fold(&mut progress, first, 1);
        assert_eq!(progress.continue_token.as_deref(), Some("after-first"));
        assert_eq!(
            (progress.listed, progress.rewritten, progress.skipped, progress.failed),
            (3, 1, 1, 1)
        );
        assert_eq!((progress.pages, progress.remaining, progress.failures.len()), (1, Some(7), 1));
        let mut last = page(1, None);
        last.tally.record(
            Outcome::Failed(FailedObject {
                namespace: String::new(),
                name: "b".into(),
                code: 422,
                reason: "Invalid".into(),
                message: "no".into(),
            }),
            1,
        );
        fold(&mut progress, last, 1);
        assert_eq!(progress.continue_token, None);
        assert_eq!((progress.failed, progress.failures.len()), (2, 1), "failures kept are bounded");
        assert_eq!(progress.processed(), 4);
    }
}
