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
    cleaned: u64,
    already_current: u64,
    skipped: u64,
    failures: Vec<FailedObject>,
    failed: u64,
}

impl Tally {
    fn record(&mut self, outcome: Outcome, failures_kept: usize) {
        match outcome {
            Outcome::Rewritten => self.rewritten += 1,
            Outcome::Cleaned => self.cleaned += 1,
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

/// The pages of one run on their way through it, in list order: which object to write next,
/// which outcome belongs to which page, and which pages are done (every object of them and of
/// every page before them). Pure: the run feeds it pages and outcomes.
#[derive(Default)]
struct Pages {
    /// Pages listed and not yet folded into the progress, oldest first.
    pending: VecDeque<PageInFlight>,
    /// Sequence number of `pending[0]`.
    front: u64,
    /// The page being dispatched (its sequence number), and its objects not yet dispatched.
    current: Option<(u64, std::vec::IntoIter<Listed>)>,
    /// Whether the lister has handed over its last page.
    listed_all: bool,
}

impl Pages {
    /// Takes a page from the lister; its objects are dispatched next.
    fn admit(&mut self, page: Page) {
        let seq = self.front + self.pending.len() as u64;
        self.pending.push_back(PageInFlight {
            next_token: page.continue_token,
            remaining: page.remaining,
            listed: page.items.len() as u64,
            unfinished: page.items.len(),
            tally: Tally::default(),
        });
        self.current = Some((seq, page.items.into_iter()));
    }

    /// The next object to write, and the page it belongs to.
    fn next_object(&mut self) -> Option<(u64, Listed)> {
        let (seq, objects) = self.current.as_mut()?;
        let seq = *seq;
        match objects.next() {
            Some(object) => Some((seq, object)),
            None => {
                self.current = None;
                None
            }
        }
    }

    /// Whether the next page may come: the current one is dispatched.
    fn wants_page(&self) -> bool {
        self.current.is_none() && !self.listed_all
    }

    /// Records the outcome of an object of page `seq`.
    fn finish(&mut self, seq: u64, outcome: Outcome, failures_kept: usize) {
        let index = usize::try_from(seq.wrapping_sub(self.front)).ok();
        if let Some(page) = index.and_then(|i| self.pending.get_mut(i)) {
            page.unfinished -= 1;
            page.tally.record(outcome, failures_kept);
        }
    }

    /// The oldest page, once it and every page before it are done.
    fn pop_done(&mut self) -> Option<PageInFlight> {
        if self.pending.front()?.unfinished > 0 {
            return None;
        }
        self.front += 1;
        self.pending.pop_front()
    }

    /// Whether every page was listed, written and folded.
    fn all_done(&self) -> bool {
        self.listed_all && self.current.is_none() && self.pending.is_empty()
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
        let Job { resource, write_to_status, pace, resume, fence, clean_managed_fields, budget } =
            job;
        let mut progress = resume;
        let mut run = self.run_state(&resource, pace, budget, fence);
        run.cleaning = clean_managed_fields;

        // The lister: one page waits in the channel while the dispatcher writes another.
        let (pages_tx, mut listed) = mpsc::channel::<Result<Page, Error>>(1);
        let lister = self.list_ahead(&resource, progress.continue_token.clone(), &run, pages_tx);

        let max_outstanding = self.settings.writes_in_flight.max(1) * OUTSTANDING_PER_SLOT;
        let failures_kept = self.settings.failures_kept;
        let dispatcher = async {
            let mut pages = Pages::default();
            let mut writes = FuturesUnordered::new();
            loop {
                // Dispatch as long as there is room.
                while writes.len() < max_outstanding {
                    let Some((seq, object)) = pages.next_object() else { break };
                    let (resource, run) = (&resource, &run);
                    writes.push(async move {
                        (seq, self.write(resource, &object, write_to_status, run).await)
                    });
                }
                // Fold the pages that are done, in list order.
                while let Some(page) = pages.pop_done() {
                    self.page_done(&resource, &run, &mut progress, page, report);
                }
                if pages.all_done() {
                    return Ok(Finished::Completed(progress));
                }
                let wants_page = pages.wants_page() && writes.len() < max_outstanding;
                tokio::select! {
                    _ = cancel.cancelled() => {
                        run.drain_into(&mut progress);
                        return Ok(Finished::Cancelled(progress));
                    }
                    Some((seq, outcome)) = writes.next(), if !writes.is_empty() => match outcome {
                        Ok(outcome) => pages.finish(seq, outcome, failures_kept),
                        Err(halt) => return halted(halt, &resource, &run, progress),
                    },
                    page = listed.recv(), if wants_page => match page {
                        None => pages.listed_all = true,
                        Some(Err(Error::Fenced)) => {
                            run.drain_into(&mut progress);
                            return Ok(Finished::Cancelled(progress));
                        }
                        Some(Err(error)) => return Err(error),
                        Some(Ok(page)) => pages.admit(page),
                    },
                }
            }
        };
        tokio::select! {
            finished = dispatcher => finished,
            never = lister => match never {},
        }
    }

    /// Lists page after page from `first`, handing each over on `pages` (which holds one):
    /// then waits for the run to end, which only the dispatcher decides.
    async fn list_ahead(
        &self,
        resource: &super::Resource,
        first: Option<String>,
        run: &RunState,
        pages: mpsc::Sender<Result<Page, Error>>,
    ) -> std::convert::Infallible {
        let mut token = first;
        let mut tokens = Tokens::default();
        loop {
            run.before_list().await;
            let mut page = self.list_page(resource, token.as_deref(), run).await;
            let next = page.as_ref().ok().and_then(|p| p.continue_token.clone());
            if next.as_deref().is_some_and(|next| !tokens.first_time(next)) {
                page = Err(Error::ListLoops(resource.to_string()));
            }
            let failed = page.is_err();
            if pages.send(page).await.is_err() || failed || next.is_none() {
                break;
            }
            token = next;
        }
        drop(pages);
        std::future::pending().await
    }

    /// Folds a finished page into `progress` and publishes it: the report, the metrics, a log
    /// line.
    fn page_done(
        &self,
        resource: &super::Resource,
        run: &RunState,
        progress: &mut Progress,
        page: PageInFlight,
        report: &watch::Sender<Progress>,
    ) {
        let before = progress.clone();
        fold(progress, page, self.settings.failures_kept);
        run.drain_into(progress);
        self.observe_page(resource, &before, progress);
        report.send_replace(progress.clone());
        info!(
            listed = progress.listed,
            rewritten = progress.rewritten,
            cleaned = progress.cleaned,
            already_current = progress.already_current,
            skipped = progress.skipped,
            failed = progress.failed,
            remaining = progress.remaining,
            "page done"
        );
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
    progress.cleaned += tally.cleaned;
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

    fn listed(names: &[&str], next: Option<&str>) -> Page {
        Page {
            items: names
                .iter()
                .map(|name| Listed {
                    namespace: String::new(),
                    name: (*name).into(),
                    uid: format!("uid-{name}"),
                    resource_version: "1".into(),
                    managed_fields: None,
                    generation: None,
                })
                .collect(),
            continue_token: next.map(str::to_owned),
            remaining: None,
        }
    }

    fn dispatch_all(pages: &mut Pages) -> Vec<(u64, String)> {
        std::iter::from_fn(|| pages.next_object()).map(|(seq, o)| (seq, o.name)).collect()
    }

    #[test]
    fn objects_are_dispatched_in_list_order_across_pages() {
        let mut pages = Pages::default();
        assert!(pages.wants_page());
        pages.admit(listed(&["a", "b"], Some("t1")));
        assert!(!pages.wants_page(), "the current page is not dispatched yet");
        assert_eq!(dispatch_all(&mut pages), [(0, "a".to_owned()), (0, "b".to_owned())]);
        assert!(pages.wants_page());
        pages.admit(listed(&["c"], None));
        assert_eq!(dispatch_all(&mut pages), [(1, "c".to_owned())]);
        pages.listed_all = true;
        assert!(!pages.wants_page() && !pages.all_done(), "written but not done");
    }

    #[test]
    fn pages_are_done_in_list_order_whatever_order_their_objects_finish_in() {
        let mut pages = Pages::default();
        pages.admit(listed(&["a", "b"], Some("t1")));
        dispatch_all(&mut pages);
        pages.admit(listed(&["c"], None));
        dispatch_all(&mut pages);
        pages.listed_all = true;
        // The later page finishes first: nothing is folded, or the token would skip `a`.
        pages.finish(1, Outcome::Rewritten, 1);
        assert!(pages.pop_done().is_none());
        pages.finish(0, Outcome::Rewritten, 1);
        assert!(pages.pop_done().is_none(), "b is still in backoff");
        pages.finish(0, Outcome::Deleted, 1);
        let first = pages.pop_done().expect("the first page is done");
        assert_eq!(first.next_token.as_deref(), Some("t1"));
        assert_eq!((first.tally.rewritten, first.tally.skipped), (1, 1));
        let second = pages.pop_done().expect("then the second");
        assert_eq!(second.next_token, None);
        assert!(pages.pop_done().is_none() && pages.all_done());
    }

    #[test]
    fn an_empty_page_is_done_at_once() {
        let mut pages = Pages::default();
        pages.admit(listed(&[], None));
        assert!(dispatch_all(&mut pages).is_empty());
        pages.listed_all = true;
        assert_eq!(pages.pop_done().map(|p| p.listed), Some(0));
        assert!(pages.all_done());
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
