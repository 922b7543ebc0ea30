//! Leader election on a `coordination.k8s.io` Lease, with client-go's semantics: a holder renews
//! the lease every retry period; another candidate takes it over once it has seen no renewal for
//! a whole lease duration (measured on its own clock, so skew between nodes does not matter); a
//! holder shutting down releases the lease so the next leader starts at once.
//!
//! A holder's term ends at its last successful renewal (counted from when that renewal was sent)
//! plus the renew deadline, which is shorter than the lease duration. The term is a [`Fence`]
//! every write checks, and `lost` fires when it runs out, whether or not the renewal request
//! that should have extended it ever returns. So a leader stops writing before anyone else may
//! acquire the lease, however its connection to the apiserver fails.
//!
//! That holds only when the new leader knows the previous term is over: it saw the lease go
//! unrenewed for a whole lease duration, or the holder handed it back (leaving its release mark).
//! A Lease that does not exist may have been deleted under a leader still in its term, and a free
//! lease without the mark, or one naming this identity that this process did not take, may have a
//! writer behind it too. A leader that takes the lease in any of those ways holds it, renewing,
//! for a whole lease duration before it writes: by then any previous holder has reached its renew
//! deadline and stopped.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::apiserver::fence::Fence;

/// The shortest lease `--lease-duration` accepts, in seconds: with client-go's ratios a leader
/// renews every third of it (at most every 2 s), so below this renewals would have to come back
/// within a fraction of a second.
pub const MIN_LEASE_SECONDS: u64 = 2;

/// The longest lease `--lease-duration` accepts, in seconds: the Lease API holds it as an int32
/// (`spec.leaseDurationSeconds`).
pub const MAX_LEASE_SECONDS: u64 = i32::MAX as u64;

/// The annotation a holder leaves on the Lease when it hands the lease back, in the same write
/// that clears the holder: the lease's `leaseTransitions` then, and the holder's identity
/// (`"3 kube-svm-0"`). A free lease carrying it, with the transition count unchanged, was
/// released by its holder after that holder had stopped writing, so the next leader may write at
/// once. The leader that takes the lease removes it.
pub const RELEASED_ANNOTATION: &str = "kube-svm.io/released";

/// Where the lease is and how it is held.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This candidate's identity, written as the lease's holder.
    pub identity: String,
    /// How long a lease is valid without renewal (client-go's default: 15 s).
    pub lease_duration: Duration,
    /// How long a leader's term lasts after a renewal (client-go's default: 10 s). Shorter than
    /// the lease duration: the difference is the margin between this leader's last write and
    /// the earliest moment another candidate may take over.
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and leaders renew (client-go's default: 2 s).
    pub retry_period: Duration,
}

impl Settings {
    /// Settings with client-go's ratios for a lease of `lease_duration`: a renew deadline of two
    /// thirds of it, retries every 2 s (at most a third of it).
    pub fn new(
        namespace: String,
        name: String,
        identity: String,
        lease_duration: Duration,
    ) -> Self {
        let lease_duration = lease_duration
            .clamp(Duration::from_secs(MIN_LEASE_SECONDS), Duration::from_secs(MAX_LEASE_SECONDS));
        Settings {
            namespace,
            name,
            identity,
            renew_deadline: lease_duration * 2 / 3,
            retry_period: Duration::from_secs(2).min(lease_duration / 3),
            lease_duration,
        }
    }
}

/// A held lease. Dropping it stops renewals without releasing the lease.
pub struct Leadership {
    fence: Fence,
    lost: CancellationToken,
    stop: CancellationToken,
    renewals: Option<tokio::task::JoinHandle<()>>,
    lease: Api<Lease>,
    settings: Settings,
}

/// How a new leader's wait before its first write ended.
enum Probation {
    /// A lease duration passed with the lease renewed throughout: writes may begin.
    Served,
    /// The lease was lost meanwhile.
    Lost,
    /// The process is stopping.
    Shutdown,
}

impl Leadership {
    /// Holds the lease won by an attempt sent at `sent`: the term runs a renew deadline from
    /// then, and renewals extend it.
    fn start(lease: Api<Lease>, settings: Settings, sent: Instant) -> Leadership {
        let fence = Fence::until(sent + settings.renew_deadline);
        let (lost, stop) = (CancellationToken::new(), CancellationToken::new());
        let renewals = tokio::spawn(renew(
            lease.clone(),
            settings.clone(),
            fence.clone(),
            lost.clone(),
            stop.clone(),
        ));
        Leadership { fence, lost, stop, renewals: Some(renewals), lease, settings }
    }

    /// Holds the lease, renewing it, for a whole lease duration from now, writing nothing:
    /// whoever held it before (and may not have known it lost it) reaches its renew deadline
    /// meanwhile. `on_attempt(false)` runs every retry period.
    async fn serve_probation(
        &self,
        shutdown: &CancellationToken,
        on_attempt: &impl Fn(bool),
    ) -> Probation {
        let until = Instant::now() + self.settings.lease_duration;
        loop {
            let now = Instant::now();
            if now >= until {
                return match self.fence.holds() {
                    true => Probation::Served,
                    false => Probation::Lost,
                };
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Probation::Shutdown,
                _ = self.lost.cancelled() => return Probation::Lost,
                _ = tokio::time::sleep_until((now + self.settings.retry_period).min(until)) => {
                    on_attempt(false);
                }
            }
        }
    }

    /// Fires when this process stops being the leader.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// The leader's term: closed once leadership is lost or runs out.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Stops renewing and hands the lease back, so another candidate can take it at once.
    pub async fn release(mut self) {
        self.stop.cancel();
        if let Some(renewals) = self.renewals.take() {
            let _ = renewals.await;
        }
        let Some(limit) = self.fence.deadline(self.settings.retry_period) else { return };
        if self.lost.is_cancelled() {
            return;
        }
        let released = tokio::time::timeout(limit, self.hand_back()).await;
        self.fence.close();
        match released {
            Ok(Ok(true)) => info!(lease = self.settings.name, "released the lease"),
            Ok(Ok(false)) => {}
            Ok(Err(error)) => warn!(%error, "failed to release the lease"),
            Err(_) => warn!("failed to release the lease in time"),
        }
    }

    async fn hand_back(&self) -> Result<bool, kube::Error> {
        let mut lease = self.lease.get(&self.settings.name).await?;
        if holder(&lease) != Some(self.settings.identity.as_str()) {
            return Ok(false);
        }
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        let mark = format!("{} {}", spec.lease_transitions.unwrap_or(0), self.settings.identity);
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(RELEASED_ANNOTATION.to_owned(), mark);
        self.lease.replace(&self.settings.name, &PostParams::default(), &lease).await?;
        Ok(true)
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.stop.cancel();
        self.fence.close();
    }
}

/// Waits until this candidate holds the lease and may write; `None` when `shutdown` fires first.
/// `on_attempt` runs after every attempt, and every retry period while a new leader waits out
/// a lease duration, with whether this candidate may write.
pub async fn acquire(
    client: Client,
    settings: Settings,
    shutdown: &CancellationToken,
    on_attempt: impl Fn(bool),
) -> Option<Leadership> {
    let lease: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let mut observed: Option<(String, Instant)> = None;
    info!(
        lease = settings.name,
        namespace = settings.namespace,
        identity = settings.identity,
        "waiting for leadership"
    );
    loop {
        if shutdown.is_cancelled() {
            return None;
        }
        let sent = Instant::now();
        // An attempt that hangs is abandoned, like any other request that takes too long.
        let attempt = tokio::time::timeout(
            settings.retry_period.max(Duration::from_secs(1)),
            try_acquire(&lease, &settings, &mut observed),
        )
        .await;
        let taken = match attempt {
            Ok(taken) => taken,
            Err(_) => {
                warn!(lease = settings.name, "reading or taking the lease timed out");
                None
            }
        };
        if let Some(previous) = taken {
            let leadership = Leadership::start(lease.clone(), settings.clone(), sent);
            let ready = match previous {
                PreviousTerm::Over => Probation::Served,
                PreviousTerm::Unknown => {
                    on_attempt(false);
                    info!(
                        lease = settings.name,
                        identity = settings.identity,
                        wait = ?settings.lease_duration,
                        "holding the lease; writing only after a lease duration, when any previous leader has stopped"
                    );
                    leadership.serve_probation(shutdown, &on_attempt).await
                }
            };
            match ready {
                Probation::Served => {
                    on_attempt(true);
                    info!(lease = settings.name, identity = settings.identity, "became the leader");
                    return Some(leadership);
                }
                Probation::Shutdown => {
                    leadership.release().await;
                    return None;
                }
                Probation::Lost => {
                    warn!(lease = settings.name, "lost the lease before writing anything");
                }
            }
        } else {
            on_attempt(false);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(settings.retry_period) => {}
        }
    }
}

/// What is known of the previous holder's term when a candidate takes the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PreviousTerm {
    /// Over: nobody renewed the lease for a whole lease duration by this candidate's clock, or
    /// its holder handed it back (and stopped writing first).
    Over,
    /// Possibly still open: no Lease existed (it may have been deleted under its holder), it was
    /// free without its holder's release mark, or it named this identity though this process
    /// did not hold it. Writes wait a lease duration.
    Unknown,
}

/// What a candidate may do with the lease as it reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Another candidate holds it and renews it.
    Held,
    /// Take it (create it, when there is none).
    Take(PreviousTerm),
}

/// The pure part of an attempt: `lease` as read (`None`: there is none), and whether it went
/// unrenewed for a lease duration by this candidate's clock.
fn judge(lease: Option<&Lease>, identity: &str, expired: bool) -> Verdict {
    let Some(lease) = lease else { return Verdict::Take(PreviousTerm::Unknown) };
    if expired {
        return Verdict::Take(PreviousTerm::Over);
    }
    match holder(lease) {
        Some(other) if other != identity => Verdict::Held,
        Some(_) => Verdict::Take(PreviousTerm::Unknown),
        None if released(lease) => Verdict::Take(PreviousTerm::Over),
        None => Verdict::Take(PreviousTerm::Unknown),
    }
}

/// Whether the lease carries its last holder's release mark, made at the current transition.
fn released(lease: &Lease) -> bool {
    let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions).unwrap_or(0);
    let mark = lease.metadata.annotations.as_ref().and_then(|a| a.get(RELEASED_ANNOTATION));
    let at = mark.and_then(|m| m.split_whitespace().next()).and_then(|n| n.parse::<i32>().ok());
    at == Some(transitions)
}

/// One attempt: takes the lease when it is free, expired, or already ours, and says what is
/// known of the previous term; `None` when another candidate holds it or the attempt failed.
async fn try_acquire(
    lease: &Api<Lease>,
    settings: &Settings,
    observed: &mut Option<(String, Instant)>,
) -> Option<PreviousTerm> {
    // Not being able to read the lease (the apiserver restarting, its authorizer not synced
    // yet, a permission missing) only means this attempt lost; the next one asks again.
    let current = match lease.get_opt(&settings.name).await {
        Ok(current) => current,
        Err(error) => {
            if !crate::apiserver::reachability::unreachable(&error, "reading the lease") {
                warn!(error = %crate::error_chain(&error), lease = settings.name, "failed to read the lease");
            }
            return None;
        }
    };
    let now = Timestamp::now();
    let Some(mut current) = current else {
        let Verdict::Take(previous) = judge(None, &settings.identity, false) else { return None };
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
        return lease.create(&PostParams::default(), &fresh).await.ok().map(|_| previous);
    };
    let version = current.metadata.resource_version.clone().unwrap_or_default();
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
    let Verdict::Take(previous) = judge(Some(&current), &settings.identity, expired) else {
        return None;
    };
    let ours = holder(&current) == Some(settings.identity.as_str());
    if let Some(annotations) = current.metadata.annotations.as_mut() {
        annotations.remove(RELEASED_ANNOTATION);
    }
    let spec = current.spec.get_or_insert_with(Default::default);
    if !ours {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        spec.acquire_time = Some(MicroTime(now));
    }
    spec.holder_identity = Some(settings.identity.clone());
    spec.lease_duration_seconds = Some(seconds(settings.lease_duration));
    spec.renew_time = Some(MicroTime(now));
    // The resourceVersion makes this conditional: of two candidates, one wins.
    let taken = lease.replace(&settings.name, &PostParams::default(), &current).await;
    taken.ok().map(|_| previous)
}

/// Renews the lease every retry period, extending the term from when each successful renewal
/// was sent. Fires `lost` (and closes the fence) when the term runs out before a renewal
/// succeeds, or someone else holds the lease.
async fn renew(
    lease: Api<Lease>,
    settings: Settings,
    fence: Fence,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let give_up = |why: &str| {
        warn!(lease = settings.name, "{why}: no longer the leader");
        fence.close();
        lost.cancel();
    };
    loop {
        let Some(left) = fence.remaining() else { return };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(settings.retry_period) => {}
            // The term may run out while waiting for the next renewal.
            _ = tokio::time::sleep(left) => {}
        }
        let sent = Instant::now();
        let Some(left) = fence.deadline(settings.renew_deadline) else {
            return give_up("could not renew the lease in time");
        };
        let renewed = tokio::select! {
            _ = stop.cancelled() => return,
            renewed = tokio::time::timeout(left, renew_once(&lease, &settings)) => renewed,
        };
        match renewed {
            Ok(Ok(true)) => {
                crate::apiserver::reachability::reachable();
                fence.extend_to(sent + settings.renew_deadline);
            }
            Ok(Ok(false)) => return give_up("another candidate holds the lease"),
            Ok(Err(error))
                if crate::apiserver::reachability::unreachable(&error, "lease renewal") => {}
            Ok(Err(error)) => {
                warn!(error = %crate::error_chain(&error), "failed to renew the lease")
            }
            Err(_) => return give_up("could not renew the lease in time"),
        }
        if !fence.holds() {
            return give_up("could not renew the lease in time");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, transitions: i32, mark: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                annotations: mark.map(|m| {
                    [(RELEASED_ANNOTATION.to_owned(), m.to_owned())].into_iter().collect()
                }),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_transitions: Some(transitions),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_missing_lease_is_created_but_its_last_term_is_unknown() {
        assert_eq!(judge(None, "me", false), Verdict::Take(PreviousTerm::Unknown));
    }

    #[test]
    fn a_lease_held_by_another_is_taken_only_once_expired() {
        let held = lease(Some("other"), 3, None);
        assert_eq!(judge(Some(&held), "me", false), Verdict::Held);
        assert_eq!(judge(Some(&held), "me", true), Verdict::Take(PreviousTerm::Over));
    }

    #[test]
    fn a_free_lease_is_over_only_with_its_holders_mark_of_this_transition() {
        let released = lease(None, 3, Some("3 other"));
        assert_eq!(judge(Some(&released), "me", false), Verdict::Take(PreviousTerm::Over));
        let cleared = lease(None, 3, None);
        assert_eq!(judge(Some(&cleared), "me", false), Verdict::Take(PreviousTerm::Unknown));
        let stale = lease(None, 4, Some("3 other"));
        assert_eq!(judge(Some(&stale), "me", false), Verdict::Take(PreviousTerm::Unknown));
        let garbled = lease(None, 3, Some("three"));
        assert_eq!(judge(Some(&garbled), "me", false), Verdict::Take(PreviousTerm::Unknown));
        assert_eq!(judge(Some(&cleared), "me", true), Verdict::Take(PreviousTerm::Over));
    }

    #[test]
    fn a_lease_naming_this_identity_may_belong_to_an_earlier_process() {
        let ours = lease(Some("me"), 1, None);
        assert_eq!(judge(Some(&ours), "me", false), Verdict::Take(PreviousTerm::Unknown));
        assert_eq!(judge(Some(&ours), "me", true), Verdict::Take(PreviousTerm::Over));
    }

    #[test]
    fn settings_keep_client_gos_ratios_within_bounds() {
        let name = || String::from("x");
        let settings = Settings::new(name(), name(), name(), Duration::from_secs(15));
        assert_eq!(settings.renew_deadline, Duration::from_secs(10));
        assert_eq!(settings.retry_period, Duration::from_secs(2));
        let huge = Settings::new(name(), name(), name(), Duration::MAX);
        assert_eq!(huge.lease_duration, Duration::from_secs(MAX_LEASE_SECONDS));
    }
}
