//! Leader election on a `coordination.k8s.io` Lease, with client-go's semantics: a holder renews
//! the lease every retry period; another candidate takes it over once it has seen no renewal for
//! a whole lease duration (measured on its own clock, so skew between nodes does not matter); a
//! holder that cannot renew within the renew deadline stops leading; a holder shutting down
//! releases the lease so the next leader starts at once.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Where the lease is and how it is held.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub name: String,
    /// This candidate's identity, written as the lease's holder.
    pub identity: String,
    /// How long a lease is valid without renewal (client-go's default: 15 s).
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before it gives up (client-go's default: 10 s).
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and leaders renew (client-go's default: 2 s).
    pub retry_period: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read lease {0}")]
    Read(String, #[source] kube::Error),
}

/// A held lease. Dropping it stops renewals without releasing the lease.
pub struct Leadership {
    lost: CancellationToken,
    stop: CancellationToken,
    renewals: Option<tokio::task::JoinHandle<()>>,
    lease: Api<Lease>,
    settings: Settings,
}

impl Leadership {
    /// Fires when this process stops being the leader.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Stops renewing and hands the lease back, so another candidate can take it at once.
    pub async fn release(mut self) {
        self.stop.cancel();
        if let Some(renewals) = self.renewals.take() {
            let _ = renewals.await;
        }
        if self.lost.is_cancelled() {
            return;
        }
        match self.lease.get(&self.settings.name).await {
            Ok(mut lease) if holder(&lease) == Some(self.settings.identity.as_str()) => {
                let spec = lease.spec.get_or_insert_with(Default::default);
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                spec.renew_time = Some(MicroTime(Timestamp::now()));
                match self.lease.replace(&self.settings.name, &PostParams::default(), &lease).await
                {
                    Ok(_) => info!(lease = self.settings.name, "released the lease"),
                    Err(error) => warn!(%error, "failed to release the lease"),
                }
            }
            Ok(_) => {}
            Err(error) => warn!(%error, "failed to read the lease to release it"),
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Waits until this candidate holds the lease; `None` when `shutdown` fires first.
/// `on_attempt` runs after every attempt, with whether it won.
pub async fn acquire(
    client: Client,
    settings: Settings,
    shutdown: &CancellationToken,
    on_attempt: impl Fn(bool),
) -> Result<Option<Leadership>, Error> {
    let lease: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let mut observed: Option<(String, Instant)> = None;
    info!(
        lease = settings.name,
        namespace = settings.namespace,
        identity = settings.identity,
        "waiting for leadership"
    );
    loop {
        let won = try_acquire(&lease, &settings, &mut observed).await?;
        on_attempt(won);
        if won {
            info!(lease = settings.name, identity = settings.identity, "became the leader");
            let (lost, stop) = (CancellationToken::new(), CancellationToken::new());
            let renewals =
                tokio::spawn(renew(lease.clone(), settings.clone(), lost.clone(), stop.clone()));
            return Ok(Some(Leadership { lost, stop, renewals: Some(renewals), lease, settings }));
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(settings.retry_period) => {}
        }
    }
}

/// One attempt: takes the lease when it is free, expired, or already ours.
async fn try_acquire(
    lease: &Api<Lease>,
    settings: &Settings,
    observed: &mut Option<(String, Instant)>,
) -> Result<bool, Error> {
    let current =
        lease.get_opt(&settings.name).await.map_err(|e| Error::Read(settings.name.clone(), e))?;
    let now = Timestamp::now();
    let Some(mut current) = current else {
        let fresh = Lease {
            metadata: ObjectMeta { name: Some(settings.name.clone()), ..Default::default() },
            spec: Some(LeaseSpec {
                holder_identity: Some(settings.identity.clone()),
                lease_duration_seconds: Some(seconds(settings.lease_duration)),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return Ok(lease.create(&PostParams::default(), &fresh).await.is_ok());
    };
    let version = current.metadata.resource_version.clone().unwrap_or_default();
    let ours = holder(&current) == Some(settings.identity.as_str());
    let free = holder(&current).is_none();
    // Expired when nobody renewed it for a lease duration, by our clock since we first saw it.
    let duration = current
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map_or(settings.lease_duration, Duration::from_secs);
    let first_seen = match observed {
        Some((seen_version, at)) if *seen_version == version => *at,
        _ => {
            *observed = Some((version.clone(), Instant::now()));
            Instant::now()
        }
    };
    let expired = first_seen.elapsed() >= duration;
    if !(ours || free || expired) {
        return Ok(false);
    }
    let spec = current.spec.get_or_insert_with(Default::default);
    if !ours {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        spec.acquire_time = Some(MicroTime(now));
    }
    spec.holder_identity = Some(settings.identity.clone());
    spec.lease_duration_seconds = Some(seconds(settings.lease_duration));
    spec.renew_time = Some(MicroTime(now));
    // The resourceVersion makes this conditional: of two candidates, one wins.
    Ok(lease.replace(&settings.name, &PostParams::default(), &current).await.is_ok())
}

/// Renews the lease every retry period; fires `lost` when renewals fail past the renew deadline
/// or someone else holds the lease.
async fn renew(
    lease: Api<Lease>,
    settings: Settings,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let mut last_renewal = Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(settings.retry_period) => {}
        }
        match renew_once(&lease, &settings).await {
            Ok(true) => last_renewal = Instant::now(),
            Ok(false) => {
                warn!(lease = settings.name, "another candidate holds the lease");
                lost.cancel();
                return;
            }
            Err(error) => warn!(%error, "failed to renew the lease"),
        }
        if last_renewal.elapsed() >= settings.renew_deadline {
            warn!(lease = settings.name, "could not renew the lease in time");
            lost.cancel();
            return;
        }
    }
}

/// `Ok(false)` when the lease is no longer ours.
async fn renew_once(lease: &Api<Lease>, settings: &Settings) -> Result<bool, kube::Error> {
    let mut current = lease.get(&settings.name).await?;
    if holder(&current) != Some(settings.identity.as_str()) {
        return Ok(false);
    }
    current.spec.get_or_insert_with(Default::default).renew_time =
        Some(MicroTime(Timestamp::now()));
    lease.replace(&settings.name, &PostParams::default(), &current).await?;
    Ok(true)
}

fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).filter(|h| !h.is_empty())
}

fn seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs()).unwrap_or(i32::MAX)
}
