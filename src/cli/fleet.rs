//! Asking several clusters the same question (`--context` given more than once, or
//! `--all-contexts`): each cluster is asked in parallel with the single-cluster code, within a
//! deadline, and answers in one row of one table (or one entry of one JSON document). A cluster
//! that cannot be reached, or does not answer in time, is a row that says so.

use std::future::Future;
use std::time::Duration;

use clap::Args;
use kube::Client;
use serde::Serialize;

use super::kube::KubeArgs;
use super::table;
use crate::api::StorageVersionMigration;

/// The shortest `--timeout`, in seconds: a TLS handshake and one request take longer than that
/// on any cluster not on this machine.
const MIN_TIMEOUT: f64 = 0.1;

/// Which clusters to ask besides `--context`, and how long each has to answer.
#[derive(Args, Clone, Debug)]
pub struct FleetArgs {
    /// Ask the cluster of every context of the kubeconfig, one row per cluster.
    #[arg(long)]
    pub all_contexts: bool,

    /// Seconds each cluster has to answer when several are asked; one that takes longer is a
    /// row saying so.
    #[arg(long, default_value_t = 10.0, value_parser = super::values::seconds(MIN_TIMEOUT))]
    pub timeout: f64,
}

/// The clusters to ask, and how long each has.
#[derive(Debug)]
pub struct Fleet {
    kube: KubeArgs,
    contexts: Vec<String>,
    timeout: Duration,
}

impl FleetArgs {
    /// The clusters these flags name, or `None` when they name one (no `--all-contexts`, and
    /// `--context` at most once): then the command runs as it always has.
    pub fn fleet(self, kube: &KubeArgs) -> anyhow::Result<Option<Fleet>> {
        let FleetArgs { all_contexts, timeout } = self;
        let contexts = match all_contexts {
            true => kube.contexts()?,
            false if kube.context.len() > 1 => kube.context.clone(),
            false => return Ok(None),
        };
        if contexts.is_empty() {
            anyhow::bail!("the kubeconfig has no contexts");
        }
        let timeout = super::engine::seconds(timeout);
        Ok(Some(Fleet { kube: kube.clone(), contexts, timeout }))
    }
}

/// What became of the question in one cluster.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// It answered.
    Answered,
    /// It was reached, and the question failed there (a CRD it does not have, a denied list).
    Failed,
    /// No client could be made, or its apiserver did not answer.
    Unreachable,
    /// It did not answer within `--timeout`.
    TimedOut,
}

/// One cluster's answer; with `-o json`, a contract scripts can rely on.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cluster<T> {
    /// The kubeconfig context.
    pub context: String,
    pub state: State,
    /// Whether its apiserver answered.
    pub reachable: bool,
    /// Whether it serves kube-svm's API (its CRDs are installed); null when unknown.
    pub installed: Option<bool>,
    /// Why there is no answer; null when there is one.
    pub error: Option<String>,
    /// What the command prints with `-o json` for this cluster alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<T>,
}

/// Every cluster's answer, in the order the contexts were named.
#[derive(Clone, Debug, Serialize)]
pub struct Answers<T> {
    pub clusters: Vec<Cluster<T>>,
}

impl Fleet {
    /// Asks every cluster `question` at once, each within the deadline.
    pub async fn ask<T, F, Fut>(&self, question: F) -> Answers<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        let asks = self.contexts.iter().map(|context| {
            let ask = self.ask_one(context, &question);
            async move {
                match tokio::time::timeout(self.timeout, ask).await {
                    Ok(cluster) => cluster,
                    Err(_) => Cluster {
                        context: context.clone(),
                        state: State::TimedOut,
                        reachable: false,
                        installed: None,
                        error: Some(format!(
                            "did not answer within {}s",
                            self.timeout.as_secs_f64()
                        )),
                        answer: None,
                    },
                }
            }
        });
        Answers { clusters: futures::future::join_all(asks).await }
    }

    async fn ask_one<T, F, Fut>(&self, context: &str, question: &F) -> Cluster<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = anyhow::Result<T>>,
    {
        let cluster = |state, installed, error: Option<String>, answer| Cluster {
            context: context.to_owned(),
            reachable: matches!(state, State::Answered | State::Failed),
            state,
            installed,
            error,
            answer,
        };
        let client = match self.client(context).await {
            Ok(client) => client,
            Err(error) => {
                return cluster(State::Unreachable, None, Some(format!("{error:#}")), None);
            }
        };
        let installed = match installed(&client).await {
            Ok(installed) => installed,
            Err(error) => return cluster(State::Unreachable, None, Some(error), None),
        };
        match question(client).await {
            Ok(answer) => cluster(State::Answered, installed, None, Some(answer)),
            Err(error) => cluster(State::Failed, installed, Some(format!("{error:#}")), None),
        }
    }

    async fn client(&self, context: &str) -> anyhow::Result<Client> {
        Ok(Client::try_from(self.kube.at(context).config().await?)?)
    }
}

/// Whether the cluster serves kube-svm's StorageVersionMigrations, from discovery; `None` when
/// the apiserver answered with an error, `Err` when it did not answer.
async fn installed(client: &Client) -> Result<Option<bool>, String> {
    use kube::Resource;
    let api_version = StorageVersionMigration::api_version(&());
    let plural = StorageVersionMigration::plural(&());
    match client.list_api_group_resources(&api_version).await {
        Ok(list) => Ok(Some(list.resources.iter().any(|r| r.name == plural))),
        Err(error) if crate::apiserver::answers::is_not_found(&error) => Ok(Some(false)),
        Err(kube::Error::Api(_)) => Ok(None),
        Err(error) => Err(crate::error_chain(&error)),
    }
}

/// The exit code when a cluster gave no answer: the one an error gives.
pub const EXIT_UNANSWERED: u8 = 1;

impl<T> Answers<T> {
    /// [`EXIT_UNANSWERED`] when a cluster gave no answer, else the largest of the exit codes
    /// `each` gives the answers (0 when every one is 0).
    pub fn exit_code(&self, each: impl Fn(&T) -> u8) -> u8 {
        let mut code = 0;
        for cluster in &self.clusters {
            match &cluster.answer {
                Some(answer) => code = code.max(each(answer)),
                None => return EXIT_UNANSWERED,
            }
        }
        code
    }

    /// The table: `CONTEXT`, `KUBE-SVM`, then the `header` columns, filled by `cells` from a
    /// cluster's answer; a cluster without one has `-` in them but the last, which says why.
    pub fn render<const N: usize>(
        &self,
        header: [&str; N],
        cells: impl Fn(&T) -> [String; N],
        right: &[usize],
    ) -> String {
        let mut rows =
            vec![["CONTEXT", "KUBE-SVM"].iter().chain(&header).map(|h| (*h).to_owned()).collect()];
        for cluster in &self.clusters {
            let installed = match cluster.installed {
                Some(true) => "installed",
                Some(false) => "not installed",
                None => "-",
            };
            let mut row = vec![cluster.context.clone(), installed.to_owned()];
            match &cluster.answer {
                Some(answer) => row.extend(cells(answer)),
                None => {
                    row.extend(std::iter::repeat_n("-".to_owned(), N.saturating_sub(1)));
                    row.push(why(cluster));
                }
            }
            rows.push(row);
        }
        let right: Vec<usize> = right.iter().map(|column| column + 2).collect();
        table::render(&rows, &right)
    }
}

/// Why a cluster has no answer, as its row says it.
fn why<T>(cluster: &Cluster<T>) -> String {
    let error = cluster.error.as_deref().unwrap_or_default();
    match cluster.state {
        State::Answered => String::new(),
        State::Failed => format!("failed: {error}"),
        State::Unreachable => format!("unreachable: {error}"),
        State::TimedOut => error.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(context: &str, state: State, answer: Option<u32>) -> Cluster<u32> {
        Cluster {
            context: context.into(),
            reachable: matches!(state, State::Answered | State::Failed),
            installed: answer.map(|_| true),
            error: answer.is_none().then(|| "connection refused".into()),
            state,
            answer,
        }
    }

    fn answers() -> Answers<u32> {
        Answers {
            clusters: vec![
                cluster("east", State::Answered, Some(7)),
                cluster("west", State::Unreachable, None),
                cluster("north", State::TimedOut, None),
            ],
        }
    }

    #[test]
    fn a_cluster_without_an_answer_is_a_row_saying_why() {
        let table = answers().render(["COUNT", "NOTE"], |n| [n.to_string(), "fine".into()], &[0]);
        assert_eq!(
            table,
            "CONTEXT  KUBE-SVM   COUNT  NOTE\n\
             east     installed      7  fine\n\
             west     -              -  unreachable: connection refused\n\
             north    -              -  connection refused\n"
        );
        assert_eq!(answers().exit_code(|_| 3), EXIT_UNANSWERED);
        let answered = Answers { clusters: answers().clusters[..1].to_vec() };
        assert_eq!(answered.exit_code(|n| u8::from(*n == 7) * 3), 3);
        assert_eq!(answered.exit_code(|_| 0), 0);
    }

    #[test]
    fn the_json_names_each_cluster_and_what_became_of_it() {
        let json = serde_json::to_value(answers()).expect("serializes");
        let clusters = &json["clusters"];
        assert_eq!(
            clusters[0],
            serde_json::json!({
                "context": "east", "state": "answered", "reachable": true, "installed": true,
                "error": null, "answer": 7,
            })
        );
        assert_eq!(
            (&clusters[1]["state"], &clusters[1]["reachable"], &clusters[1]["installed"]),
            (
                &serde_json::json!("unreachable"),
                &serde_json::json!(false),
                &serde_json::Value::Null
            )
        );
        assert_eq!(clusters[2]["state"], "timed-out");
        assert!(clusters[1].get("answer").is_none());
    }
}
