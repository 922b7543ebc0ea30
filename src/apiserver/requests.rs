//! How kube-svm asks the apiserver: one [`Requests`] holds the clients, the leader's term and
//! the time one request may take, and bounds every request it sends by both.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::client::ClientBuilder;

use super::fence::Fence;
use super::own_writes::OwnWrites;

/// The way to the apiserver, shared by everything that asks it: a client whose every request
/// has a deadline, one for watches, the configuration both came from (for fresh connections),
/// the leader's term and the request timeout. Cheap to clone; clones share the clients and the
/// term.
#[derive(Clone)]
pub struct Requests {
    client: Client,
    watches: Client,
    config: Arc<kube::Config>,
    fence: Fence,
    timeout: Duration,
    /// The request client's writes, counted.
    own_writes: OwnWrites,
}

impl Requests {
    /// Requests to the cluster of `config`, each given at most `timeout` (`--request-timeout`),
    /// under a fence that never closes until [`Requests::within`] gives them a leader's term.
    pub fn new(config: kube::Config, timeout: Duration) -> Result<Requests, kube::Error> {
        let watches = Client::try_from(config.clone())?;
        let config = with_deadlines(config, timeout);
        let own_writes = OwnWrites::default();
        let client =
            ClientBuilder::try_from(config.clone())?.with_layer(&own_writes.layer()).build();
        Ok(Requests { own_writes, ..Requests::with_clients(client, watches, config, timeout) })
    }

    /// Requests through clients made elsewhere (a test's fake apiserver): `client` for requests,
    /// `watches` for watches, `config` for fresh connections.
    pub fn with_clients(
        client: Client,
        watches: Client,
        config: kube::Config,
        timeout: Duration,
    ) -> Requests {
        let (config, fence, own_writes) = (Arc::new(config), Fence::open(), OwnWrites::default());
        Requests { client, watches, config, fence, timeout, own_writes }
    }

    /// The same requests, sent only while `fence` holds: a leader's term.
    pub fn within(&self, fence: Fence) -> Requests {
        Requests { fence, ..self.clone() }
    }

    /// The client for requests: each one fails after the request timeout rather than never.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The client for watches, which stay open for minutes and are kept alive by the watcher.
    pub fn watches(&self) -> &Client {
        &self.watches
    }

    /// What the request client was made from, deadlines included.
    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// A client with a connection of its own: behind a load balancer, each may reach another
    /// apiserver (the encoding check samples several).
    pub fn fresh_client(&self) -> Result<Client, kube::Error> {
        Client::try_from((*self.config).clone())
    }

    /// The writes the request client made so far (not the engine's: it has a client of its own).
    pub fn own_writes(&self) -> &OwnWrites {
        &self.own_writes
    }

    /// The leader's term: nothing is written once it closes.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Longest time one request may go unanswered (`--request-timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The time a request sent now may take: the request timeout, or less when the leader's
    /// term ends sooner. `None` once it has ended.
    pub fn deadline(&self) -> Option<Duration> {
        self.fence.deadline(self.timeout)
    }

    /// Sends `request` inside the leader's term, giving it at most [`Requests::deadline`].
    pub async fn send<T>(
        &self,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, RequestError> {
        let limit = self.deadline().ok_or(RequestError::Fenced)?;
        match tokio::time::timeout(limit, request).await {
            Ok(answer) => Ok(answer?),
            Err(_) => Err(RequestError::TimedOut(limit)),
        }
    }

    /// Waits for `reading` at most the request timeout, whether or not this process leads: for
    /// reads that decide nothing a deposed leader could get wrong. `None` when it took longer.
    pub async fn read<T>(&self, reading: impl Future<Output = T>) -> Option<T> {
        tokio::time::timeout(self.timeout, reading).await.ok()
    }
}

/// A request that got no answer in time, was not sent, or got an error answer.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// No answer within the time the request was given.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// The leader's term is over: the request was not sent, or its answer came too late.
    #[error("this process may no longer write: its leadership ended")]
    Fenced,
    /// The apiserver answered with an error, or the request failed on the way.
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// `config` with a deadline on every request: connections that hang, and answers that stop
/// coming, fail after `timeout` instead of never; and no retries behind kube-svm's back.
fn with_deadlines(mut config: kube::Config, timeout: Duration) -> kube::Config {
    config.connect_timeout = Some(timeout.min(Duration::from_secs(10)));
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    // Count from when a request is sent, not from when its pooled connection last read.
    config.reset_reader_on_write = true;
    // kube-svm decides itself what to retry, and for how long: the client's own retries would
    // stretch a request past its deadline and hide an unavailable API behind one slow call.
    config.default_retry = false;
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::fake;

    fn requests() -> Requests {
        let (client, _) = fake::client(fake::not_found);
        Requests::with_clients(client.clone(), client, fake::config(), Duration::from_secs(30))
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_gets_the_timeout_or_what_is_left_of_the_term() {
        let requests = requests();
        assert_eq!(requests.deadline(), Some(Duration::from_secs(30)));
        let fence = Fence::until(tokio::time::Instant::now() + Duration::from_secs(5));
        let term = requests.within(fence.clone());
        assert_eq!(term.deadline(), Some(Duration::from_secs(5)));
        assert_eq!(requests.deadline(), Some(Duration::from_secs(30)), "the original is open");
        fence.close();
        let sent = term.send(async { Ok::<_, kube::Error>(()) }).await;
        assert!(matches!(sent, Err(RequestError::Fenced)), "{sent:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_without_an_answer_times_out() {
        let requests = requests();
        let hung = std::future::pending::<Result<(), kube::Error>>();
        let sent = requests.send(hung).await;
        assert!(matches!(sent, Err(RequestError::TimedOut(t)) if t == Duration::from_secs(30)));
        assert_eq!(requests.read(std::future::pending::<()>()).await, None);
    }
}
