//! Discovery samples shared by the encoding checks of a process: one new connection a round,
//! asked for every group version a check waits on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apiserverinternal::v1alpha1::{StorageVersion, StorageVersionStatus};
use kube::api::ListParams;
use kube::{Api, Client};
use tokio::sync::watch;

use super::{MAX_SAMPLE_INTERVAL, SAMPLE_TIMEOUT, STORAGE_VERSION_API};
use crate::apiserver::requests::Requests;

/// Discovery samples shared by every encoding check of a process. A round asks one apiserver,
/// through one new connection, for the discovery document of every group version a check waits
/// on (and, where the StorageVersion API is served, every StorageVersion in one list), so that
/// each check waiting takes the
/// round as one sample: what an apiserver published, asked through a connection of its own,
/// exactly as a check of its own would have asked, at the cost of one connection a round for
/// every check together. A sweep of a whole cluster's resources then costs a few requests a
/// second, not a few per resource.
#[derive(Clone, Default)]
pub struct Rounds {
    state: Arc<Mutex<RoundsState>>,
}

#[derive(Default)]
struct RoundsState {
    /// Each group version wanted, with the intervals its checks want samples at.
    wanted: HashMap<String, Vec<Duration>>,
    /// The latest round; `None` until the first.
    latest: Option<watch::Sender<Option<Arc<Round>>>>,
    /// Whether a task takes rounds now.
    running: bool,
    /// Wakes that task when a check joins: its first sample comes at once.
    joined: Arc<tokio::sync::Notify>,
}

/// What one apiserver answered, asked through one new connection.
#[derive(Debug, Default)]
pub struct Round {
    /// Counts rounds, from 1.
    pub number: u64,
    /// What the StorageVersion API says, when it is served: each resource's common encoding
    /// version, by the StorageVersion's name (`group.plural`, `core.plural`), when every
    /// apiserver encodes in it; or why the list could not be read.
    pub storage_versions: Option<Result<HashMap<String, Option<String>>, String>>,
    /// Each group version asked for: its resources' storage version hashes, by plural name, or
    /// why it could not be read.
    pub(super) documents: HashMap<String, Result<HashMap<String, Option<String>>, String>>,
}

impl Round {
    /// The hash `group_version`'s discovery published for `plural` in this round.
    pub fn hash_of(&self, group_version: &str, plural: &str) -> Result<Option<String>, String> {
        match self.documents.get(group_version) {
            Some(Ok(hashes)) => Ok(hashes.get(plural).cloned().flatten()),
            Some(Err(error)) => Err(error.clone()),
            None => Err(format!("{group_version} was not asked for in this round")),
        }
    }
}

impl Rounds {
    /// Joins the rounds for `group_version`, wanting a sample every `interval` at most; leaving
    /// is dropping what is returned.
    pub(super) fn join(
        &self,
        requests: &Requests,
        group_version: &str,
        interval: Duration,
    ) -> Sampling {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.wanted.entry(group_version.to_owned()).or_default().push(interval);
        let sender = state.latest.get_or_insert_with(|| watch::channel(None).0);
        let receiver = sender.subscribe();
        state.joined.notify_one();
        if !state.running {
            state.running = true;
            tokio::spawn(take_rounds(self.clone(), requests.clone()));
        }
        Sampling {
            rounds: self.clone(),
            group_version: group_version.to_owned(),
            interval,
            receiver,
            last: 0,
        }
    }
}

/// Takes rounds while some check wants them, each as soon as the most impatient check wants its
/// next sample.
async fn take_rounds(rounds: Rounds, requests: Requests) {
    let mut number = 0;
    loop {
        let (wanted, sender, joined) = {
            let mut state = rounds.state.lock().unwrap_or_else(|p| p.into_inner());
            if state.wanted.is_empty() {
                state.running = false;
                return;
            }
            let wanted: Vec<String> = state.wanted.keys().cloned().collect();
            let sender = state.latest.get_or_insert_with(|| watch::channel(None).0).clone();
            (wanted, sender, state.joined.clone())
        };
        number += 1;
        let round = take_round(&requests, number, &wanted).await;
        sender.send_replace(Some(Arc::new(round)));
        let interval = {
            let state = rounds.state.lock().unwrap_or_else(|p| p.into_inner());
            state.wanted.values().flatten().min().copied().unwrap_or(MAX_SAMPLE_INTERVAL)
        };
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = joined.notified() => {}
        }
    }
}

/// One round: one new client (one new connection, kept for the round's requests), asking for
/// every group version in `wanted`.
async fn take_round(requests: &Requests, number: u64, wanted: &[String]) -> Round {
    let mut round = Round { number, ..Round::default() };
    let client = match requests.fresh_client() {
        Ok(client) => client,
        Err(error) => {
            let error = crate::error_chain(&error);
            round.documents = wanted.iter().map(|gv| (gv.clone(), Err(error.clone()))).collect();
            return round;
        }
    };
    for group_version in wanted {
        let document = async {
            let list = match group_version.split_once('/') {
                None => client.list_core_api_resources(group_version).await,
                Some(_) => client.list_api_group_resources(group_version).await,
            };
            let list = list.map_err(|e| crate::error_chain(&e))?;
            Ok(list.resources.into_iter().map(|r| (r.name, r.storage_version_hash)).collect())
        };
        let answered = match tokio::time::timeout(SAMPLE_TIMEOUT, document).await {
            Ok(answered) => answered,
            Err(_) => Err(format!("no answer within {SAMPLE_TIMEOUT:?}")),
        };
        round.documents.insert(group_version.clone(), answered);
    }
    let served = client.list_api_group_resources(STORAGE_VERSION_API);
    if matches!(tokio::time::timeout(SAMPLE_TIMEOUT, served).await, Ok(Ok(_))) {
        round.storage_versions = Some(storage_versions(&client).await);
    }
    round
}

/// Every StorageVersion's common encoding version, by name: one list answers for every
/// resource a check waits on.
async fn storage_versions(client: &Client) -> Result<HashMap<String, Option<String>>, String> {
    let api: Api<StorageVersion> = Api::all(client.clone());
    let list = match tokio::time::timeout(SAMPLE_TIMEOUT, api.list(&ListParams::default())).await {
        Ok(Ok(list)) => list,
        Ok(Err(error)) => return Err(crate::error_chain(&error)),
        Err(_) => return Err(format!("no answer within {SAMPLE_TIMEOUT:?}")),
    };
    Ok(list
        .items
        .into_iter()
        .filter_map(|found| Some((found.metadata.name?, common(found.status))))
        .collect())
}

/// The common encoding version a StorageVersion's status reports, when every apiserver encodes
/// in it (its condition `AllEncodingVersionsEqual` is True).
fn common(status: Option<StorageVersionStatus>) -> Option<String> {
    let status = status.unwrap_or_default();
    let all_equal = status
        .conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "AllEncodingVersionsEqual" && c.status == "True");
    status.common_encoding_version.filter(|_| all_equal)
}

/// A check's place in the rounds: each round once, none older than the last one taken.
pub(super) struct Sampling {
    rounds: Rounds,
    group_version: String,
    interval: Duration,
    /// The rounds' sender lives in [`RoundsState`] as long as the process: this never closes.
    receiver: watch::Receiver<Option<Arc<Round>>>,
    last: u64,
}

impl Sampling {
    /// The next round that asked for this check's group version.
    pub(super) async fn next(&mut self) -> Arc<Round> {
        let (last, group_version) = (self.last, &self.group_version);
        let newer = |round: &Option<Arc<Round>>| {
            round
                .as_ref()
                .is_some_and(|r| r.number > last && r.documents.contains_key(group_version))
        };
        loop {
            if let Ok(round) = self.receiver.wait_for(newer).await
                && let Some(round) = round.clone()
            {
                self.last = round.number;
                return round;
            }
            tokio::time::sleep(self.interval).await;
        }
    }
}

impl Drop for Sampling {
    fn drop(&mut self) {
        let mut state = self.rounds.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(intervals) = state.wanted.get_mut(&self.group_version) {
            if let Some(at) = intervals.iter().position(|i| *i == self.interval) {
                intervals.swap_remove(at);
            }
            if intervals.is_empty() {
                state.wanted.remove(&self.group_version);
            }
        }
    }
}
