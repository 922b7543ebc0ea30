//! Whether what a run targets still holds, asked of one [`TargetWatch`] made once per attempt:
//! before the first write ([`TargetWatch::changed_by_now`]), while the run writes
//! ([`TargetWatch::next_change`], the guard), at the end ([`TargetWatch::at_end`]) and before
//! `storedVersions` is pruned ([`TargetWatch::caught_up`]). From its first write, a run is also
//! held to the cluster it writes to ([`TargetWatch::hold_cluster`], a [`Witness`]): the guard and
//! the end check ask both.
//!
//! What is watched of the target depends on it: a CRD is followed change by change from the
//! resourceVersion its target was read at, so only a change that can affect what is stored
//! counts ([`super::crd_watch`]); a CRD whose target predates following is read every
//! [`GUARD_INTERVAL`], and any change of its generation counts; a built-in resource whose
//! encoding was confirmed has discovery's storage version hash sampled.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::api::{GroupVersionResource, MigrationTarget};
use crate::engine::{ResolveError, Resource};
use crate::evidence::encoding;
use crate::rules::crd::{CrdChange, CrdState};

use super::change::{Change, Unseen};
use super::cluster::{Cluster, crd_of};
use super::crd_watch::CrdWatch;
use super::witness::Witness;

/// Tries, a second apart, to read discovery again when verifying the end of a run.
const VERIFY_ATTEMPTS: u32 = 5;

/// How often a running migration of a CRD-backed resource whose CRD is not followed reads it to
/// see whether its target still holds, and how often a built-in resource's run samples
/// discovery. Objects written through the old target meanwhile are written again by the run
/// that starts over, so this bounds wasted work, not safety.
const GUARD_INTERVAL: Duration = Duration::from_secs(2);

/// What one attempt of a migration watches of its target, from the encoding check to the prune.
pub struct TargetWatch {
    /// The resource migrated.
    resource: Resource,
    /// The storage version hash the run targets: for a built-in resource, every apiserver must
    /// still publish it at the end.
    hash: Option<String>,
    /// How the target is watched.
    watched: Watched,
    /// The cluster the run writes to, from its first write; `None` before.
    witness: Option<Witness>,
}

/// How a target is watched.
enum Watched {
    /// A CRD followed change by change.
    Crd(CrdWatch),
    /// A CRD read now and then: any change since `recorded` counts (`None`: the target
    /// recorded no storage version, which the prune refuses anyway).
    CrdPolled(Option<CrdState>),
    /// A built-in resource whose encoding was confirmed: discovery's hash sampled.
    Hash(encoding::Check),
    /// A built-in resource whose run proves nothing anyway (its encoding not confirmed, or no
    /// hash to compare): only the end of the run checks it.
    Nothing,
}

impl TargetWatch {
    /// The watch of a run that works out a new target from `crd` (the CRD behind `resource` as
    /// resolved, if any): followed from the state `crd` was read in; read now and then when it
    /// was read without a resourceVersion.
    pub fn of_crd(resource: &Resource, crd: Option<&CustomResourceDefinition>) -> TargetWatch {
        let watched = match crd {
            None => Watched::Nothing,
            Some(crd) => match CrdWatch::from_crd(crd) {
                Some(watch) => Watched::Crd(watch),
                None => Watched::CrdPolled(CrdState::of(crd)),
            },
        };
        TargetWatch { resource: resource.clone(), hash: None, watched, witness: None }
    }

    /// The watch of a run that keeps the `target` it recorded: a CRD followed from the
    /// resourceVersion the target recorded, or read now and then when it recorded none.
    pub fn of_target(resource: &Resource, target: &MigrationTarget) -> TargetWatch {
        let watched = match (target.crd_generation, CrdWatch::of(resource, target)) {
            (None, _) => Watched::Nothing,
            (Some(_), Some(watch)) => Watched::Crd(watch),
            (Some(_), None) => Watched::CrdPolled(CrdState::recorded(target)),
        };
        let hash = target.storage_version_hash.clone();
        TargetWatch { resource: resource.clone(), hash, watched, witness: None }
    }

    /// Aims the watch at the `target` the run writes for: for a built-in resource (a target
    /// without a CRD's generation), its hash sampled while the run writes, when its encoding
    /// was confirmed. For a followed CRD, a run that cleans `managedFields` of the versions
    /// `cleaned` (the CRD as the run read it) does not serve also watches that none is served
    /// again.
    pub fn aim(&mut self, target: &MigrationTarget, cleaned: Option<&CustomResourceDefinition>) {
        self.hash = target.storage_version_hash.clone();
        if target.crd_generation.is_none() {
            self.watched = match built_in_check(&self.resource, target) {
                Some(check) => Watched::Hash(check),
                None => Watched::Nothing,
            };
        } else if let (Watched::Crd(watch), Some(crd)) = (&mut self.watched, cleaned) {
            watch.cleaning(crd);
        }
    }

    /// Records in `target` the state of the CRD the watch followed it to: every change up to
    /// it was seen, and none touched what is stored.
    pub fn record_into(&self, target: &mut MigrationTarget) {
        if let Watched::Crd(watch) = &self.watched {
            target.crd_generation = Some(watch.generation());
            target.crd_resource_version = Some(watch.resource_version().to_owned());
        }
    }

    /// Whether a CRD is watched: the resource is CRD-backed.
    fn watches_a_crd(&self) -> bool {
        matches!(self.watched, Watched::Crd(_) | Watched::CrdPolled(_))
    }

    /// Whether the CRD still is what the target recorded, read now: `None` when it is (or
    /// cannot be read: the guard asks again, the end of the run decides), and for a built-in
    /// resource. A followed CRD is followed up to the state read.
    pub async fn changed_by_now(&mut self, cluster: &Cluster<'_>) -> Option<Change> {
        self.watched.changed_by_now(cluster, &self.resource).await
    }

    /// Holds the run, from its first write to its end, to the cluster it writes to: the
    /// kube-apiserver processes its target recorded (`apiservers`), and the etcd revision read
    /// now ([`Witness`]). A change already, when other processes answer now.
    pub async fn hold_cluster(
        &mut self,
        cluster: &Cluster<'_>,
        apiservers: Option<Vec<String>>,
    ) -> Result<(), Change> {
        self.witness = Some(Witness::start(cluster.requests, &self.resource, apiservers).await?);
        Ok(())
    }

    /// Resolves once the target no longer holds ([`Watched::next_change`]), or once the cluster
    /// the run writes to is no longer the one it was held to ([`Witness::changes`]).
    pub async fn next_change(&mut self, cluster: &Cluster<'_>) -> Change {
        let TargetWatch { resource, watched, witness, .. } = self;
        let target = watched.next_change(cluster, resource);
        match witness {
            None => target.await,
            Some(witness) => tokio::select! {
                change = target => change,
                change = witness.changes(cluster.requests, resource) => change,
            },
        }
    }

    /// What changed since the run started, if anything, checked at its end: the target
    /// ([`TargetWatch::target_at_end`]), then the cluster it was held to ([`Witness::at_end`]).
    /// A run never held to one proves nothing.
    pub async fn at_end(
        &mut self,
        cluster: &Cluster<'_>,
        spec: &GroupVersionResource,
        requires_status: bool,
    ) -> Option<Change> {
        if let Some(change) = self.target_at_end(cluster, spec, requires_status).await {
            return Some(change);
        }
        match &mut self.witness {
            Some(witness) => witness.at_end(cluster.requests, &self.resource).await,
            None => {
                Some(Change::WritesUnshown { gap: "the run was held to no cluster".to_owned() })
            }
        }
    }

    /// What changed about the resource since the run started, if anything.
    ///
    /// A run that completed proves nothing if the resource stopped being served, or its storage
    /// version (or for a CRD not followed, anything of its spec) changed, while it ran: then
    /// objects written earlier may be stored in the old version.
    async fn target_at_end(
        &mut self,
        cluster: &Cluster<'_>,
        spec: &GroupVersionResource,
        requires_status: bool,
    ) -> Option<Change> {
        let resource = self.resource.to_string();
        let mut attempts = 0;
        let now = loop {
            match Resource::resolve(cluster.requests.client(), spec, requires_status).await {
                Ok(now) => break now,
                Err(error) if error.is_transient() && attempts + 1 < VERIFY_ATTEMPTS => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(error @ ResolveError::Discovery(..)) => {
                    let why = crate::error_chain(&error);
                    return Some(Change::DiscoveryUnreadable { resource, why });
                }
                Err(error) => {
                    let why = crate::error_chain(&error);
                    return Some(Change::NotServed { resource, why });
                }
            }
        };
        // For a CRD the CRD itself says (below); discovery may lag behind it. For a built-in
        // resource every apiserver must still publish the hash the run targeted: sampled again.
        if !self.watches_a_crd() {
            let hash = self.hash.clone()?;
            let check = hash_check(&now, hash.clone());
            return match encoding::at_end(cluster.requests, &check).await {
                encoding::AtEnd::Same => None,
                encoding::AtEnd::Moved(to) => Some(Change::HashMoved { resource, from: hash, to }),
                encoding::AtEnd::Mixed(seen) => {
                    Some(Change::ApiserversDisagree { resource, hash, seen })
                }
            };
        }
        let crd = match crd_of(cluster, &self.resource).await {
            Ok(crd) => crd,
            Err(error) => {
                let why = crate::error_chain(&error);
                return Some(Change::CrdUnreadable { resource, why });
            }
        };
        match (&mut self.watched, crd) {
            (Watched::Crd(watch), Some(crd)) => watch.catch_up(cluster, &self.resource, &crd).await,
            (Watched::Crd(_), None) => Some(Change::Deleted { resource }),
            (Watched::CrdPolled(recorded), crd) => {
                crd_change(&self.resource, recorded.as_ref()?, crd.as_ref())
            }
            (Watched::Hash(_) | Watched::Nothing, _) => None,
        }
    }

    /// Follows a CRD up to `crd`, read to be pruned: the generation every change up to which
    /// was seen, none affecting what is stored (`Ok(None)` when the CRD is not followed: the
    /// target's own generation decides), or the change that did.
    pub async fn caught_up(
        &mut self,
        cluster: &Cluster<'_>,
        crd: &CustomResourceDefinition,
    ) -> Result<Option<i64>, Change> {
        let Watched::Crd(watch) = &mut self.watched else { return Ok(None) };
        match watch.catch_up(cluster, &self.resource, crd).await {
            Some(change) => Err(change),
            None => Ok(Some(watch.generation())),
        }
    }
}

impl Watched {
    /// Whether the CRD of `resource` still is what the target recorded, read now
    /// ([`TargetWatch::changed_by_now`]).
    async fn changed_by_now(
        &mut self,
        cluster: &Cluster<'_>,
        resource: &Resource,
    ) -> Option<Change> {
        match self {
            Watched::Crd(watch) => match crd_of(cluster, resource).await {
                Ok(Some(crd)) => watch.catch_up(cluster, resource, &crd).await,
                Ok(None) => Some(Change::Deleted { resource: resource.to_string() }),
                Err(_) => None,
            },
            Watched::CrdPolled(recorded) => {
                let crd = crd_of(cluster, resource).await.ok()?;
                crd_change(resource, recorded.as_ref()?, crd.as_ref())
            }
            Watched::Hash(_) | Watched::Nothing => None,
        }
    }

    /// Resolves once the target no longer holds: a followed CRD changed in a way that can
    /// affect what is stored; a CRD read every [`GUARD_INTERVAL`] is no longer what the target
    /// recorded; a discovery sample through a new connection, taken every [`GUARD_INTERVAL`],
    /// shows another hash than the target (an apiserver of another release, or one rolled back,
    /// stores what the run writes through it in another version). Never for a run that proves
    /// nothing anyway: the end of the run checks those.
    async fn next_change(&mut self, cluster: &Cluster<'_>, resource: &Resource) -> Change {
        if let Watched::Crd(watch) = self {
            return watch.follow(cluster, resource).await;
        }
        loop {
            if let Watched::Nothing = self {
                return std::future::pending().await;
            }
            tokio::time::sleep(GUARD_INTERVAL).await;
            let change = match self {
                Watched::Hash(check) => {
                    let seen = encoding::sample_during_run(cluster.requests, check).await;
                    hash_change(resource, check, seen)
                }
                _ => self.changed_by_now(cluster, resource).await,
            };
            if let Some(change) = change {
                return change;
            }
        }
    }
}

/// What changed about a CRD-backed `resource`'s CRD (`now`, `None` when deleted) since it was
/// `recorded`: deleted, replaced, its storage version switched, or its generation moved (any
/// spec change; a storage switch there and back leaves the same storage version and a newer
/// generation). `None` when nothing changed. Pure.
fn crd_change(
    resource: &Resource,
    recorded: &CrdState,
    now: Option<&CustomResourceDefinition>,
) -> Option<Change> {
    let now = now.map(CrdState::read);
    // A target recorded without the uid is left to the prune's own check, which refuses it.
    let resource = resource.to_string();
    Some(match CrdChange::between(recorded, now.as_ref())? {
        CrdChange::Deleted => Change::Deleted { resource },
        CrdChange::Replaced => Change::Replaced { resource },
        CrdChange::StorageSwitched { from, to } => {
            Change::StorageSwitched { resource, from, to, generation: None }
        }
        CrdChange::Edited { from, to } => {
            Change::Edited { resource, from, to, unseen: Unseen::Polled }
        }
    })
}

/// What a built-in resource's run samples discovery for while it writes: the hash it targets,
/// read at the version it writes through. `None` when the run is not sampled: a CRD-backed
/// resource (its CRD says), no hash recorded, or the encoding not confirmed at the start.
fn built_in_check(resource: &Resource, target: &MigrationTarget) -> Option<encoding::Check> {
    if target.crd_generation.is_some() || target.encoding_confirmed != Some(true) {
        return None;
    }
    Some(hash_check(resource, target.storage_version_hash.clone()?))
}

/// One look at the hash discovery publishes for a built-in `resource`, read at the version it
/// is served at, against `hash`: no settle, no wait.
fn hash_check(resource: &Resource, hash: String) -> encoding::Check {
    encoding::Check {
        group: resource.group.clone(),
        plural: resource.plural.clone(),
        kind: resource.kind.clone(),
        expected: encoding::Expected::Hash { hash, served: resource.version.clone() },
        generation: 0,
        policy: encoding::EncodingPolicy::AT_ONCE,
    }
}

/// The change one discovery sample taken during a built-in resource's run shows, if any: a hash
/// other than the target starts the run over, as a CRD's storage switch does (a flip there and
/// back before the end is a mixed run all the same). Pure.
fn hash_change(
    resource: &Resource,
    check: &encoding::Check,
    seen: encoding::DuringRun,
) -> Option<Change> {
    let encoding::DuringRun::Other(other) = seen else { return None };
    let encoding::Expected::Hash { hash, .. } = &check.expected else { return None };
    Some(Change::OtherHash { resource: resource.to_string(), target: hash.clone(), seen: other })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::reasons;

    fn crd(uid: &str, generation: i64, storage: &str) -> CustomResourceDefinition {
        let versions: Vec<_> = ["v1", "v2"]
            .iter()
            .map(|v| serde_json::json!({ "name": v, "served": true, "storage": *v == storage }))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "widgets.example.com", "uid": uid, "generation": generation },
            "spec": {
                "group": "example.com", "scope": "Cluster",
                "names": { "kind": "Widget", "plural": "widgets" },
                "versions": versions,
            },
        }))
        .expect("a CRD")
    }

    fn target() -> MigrationTarget {
        MigrationTarget {
            storage_version: Some("v2".into()),
            crd_generation: Some(4),
            crd_uid: Some("u1".into()),
            ..MigrationTarget::default()
        }
    }

    #[test]
    fn an_unchanged_crd_is_no_change() {
        assert_eq!(crd_change(&Resource::widgets(), &recorded(), Some(&crd("u1", 4, "v2"))), None);
    }

    #[test]
    fn a_switch_or_any_spec_change_starts_over() {
        let switched = crd_change(&Resource::widgets(), &recorded(), Some(&crd("u1", 5, "v1")));
        let switched = switched.expect("a change");
        assert!(switched.starts_over());
        assert!(switched.to_string().contains("from v2 to v1"), "{switched}");
        // v2 -> v1 -> v2: the same storage version, two generations later.
        let back = crd_change(&Resource::widgets(), &recorded(), Some(&crd("u1", 6, "v2")))
            .expect("a change");
        assert!(back.starts_over());
        assert!(back.to_string().contains("generation 4 then 6"), "{back}");
    }

    fn recorded() -> CrdState {
        CrdState::recorded(&target()).expect("recorded")
    }

    fn built_in_target(confirmed: Option<bool>) -> MigrationTarget {
        MigrationTarget {
            storage_version_hash: Some("A".into()),
            encoding_confirmed: confirmed,
            ..MigrationTarget::default()
        }
    }

    #[test]
    fn only_a_confirmed_built_in_run_samples_discovery_while_it_writes() {
        let resource = Resource::widgets();
        assert!(built_in_check(&resource, &built_in_target(Some(true))).is_some());
        // It proves nothing anyway; the end of the run checks it.
        assert!(built_in_check(&resource, &built_in_target(Some(false))).is_none());
        assert!(built_in_check(&resource, &built_in_target(None)).is_none());
        let no_hash = MigrationTarget { storage_version_hash: None, ..built_in_target(Some(true)) };
        assert!(built_in_check(&resource, &no_hash).is_none());
        // A CRD's run is guarded by its CRD.
        let crd = MigrationTarget { encoding_confirmed: Some(true), ..target() };
        assert!(built_in_check(&resource, &crd).is_none());
    }

    #[test]
    fn another_hash_mid_run_starts_a_built_in_run_over() {
        let resource = Resource::widgets();
        let check = built_in_check(&resource, &built_in_target(Some(true))).expect("sampled");
        assert_eq!(hash_change(&resource, &check, encoding::DuringRun::Target), None);
        let unread = encoding::DuringRun::Unread("connection refused".into());
        assert_eq!(hash_change(&resource, &check, unread), None, "a restart is no flip");
        let other = hash_change(&resource, &check, encoding::DuringRun::Other("B".into()))
            .expect("a change");
        assert!(other.starts_over());
        assert_eq!(other.reason(), reasons::STORAGE_VERSION_CHANGED);
        let message = other.to_string();
        assert!(message.contains("hash B") && message.contains("in A"), "{message}");
    }

    #[test]
    fn a_deleted_or_replaced_crd_ends_the_migration() {
        let gone = crd_change(&Resource::widgets(), &recorded(), None).expect("a change");
        assert_eq!((gone.reason(), gone.starts_over()), (reasons::RESOURCE_NOT_SERVED, false));
        let other = crd_change(&Resource::widgets(), &recorded(), Some(&crd("u2", 4, "v2")))
            .expect("a change");
        assert!(!other.starts_over());
    }

    /// The watch against a fake apiserver that answers a read of the CRD with `now` (404 when
    /// `None`), and every other request with 404.
    fn cluster_with(
        now: Option<CustomResourceDefinition>,
    ) -> (crate::apiserver::requests::Requests, crate::apiserver::fake::Recorded) {
        use crate::apiserver::fake;
        const CRD: &str =
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com";
        let (client, recorded) = fake::client(move |sent| match (&now, sent.path.as_str()) {
            (Some(crd), CRD) => (200, serde_json::to_value(crd).expect("JSON")),
            _ => fake::not_found(sent),
        });
        (fake::requests(client), recorded)
    }

    async fn changed_by_now(
        watch: &mut TargetWatch,
        requests: &crate::apiserver::requests::Requests,
    ) -> Option<Change> {
        let observer = encoding::Observer::default();
        let encoding = encoding::EncodingPolicy::AT_ONCE;
        let cluster = Cluster { requests, encoding, observer: &observer };
        watch.changed_by_now(&cluster).await
    }

    #[tokio::test]
    async fn a_built_in_target_changes_nothing_before_the_first_write() {
        let (requests, recorded) = cluster_with(None);
        let mut watch = TargetWatch::of_target(&Resource::widgets(), &built_in_target(Some(true)));
        watch.aim(&built_in_target(Some(true)), None);
        assert_eq!(changed_by_now(&mut watch, &requests).await, None);
        assert!(recorded.writes().is_empty());
    }

    #[tokio::test]
    async fn a_crd_deleted_since_the_target_was_recorded_is_a_change() {
        let (requests, _) = cluster_with(None);
        // Followed from where the target was read, and read now and then where it predates that.
        let followed = MigrationTarget { crd_resource_version: Some("100".into()), ..target() };
        for target in [followed, target()] {
            let mut watch = TargetWatch::of_target(&Resource::widgets(), &target);
            let resource = "widgets.example.com".to_owned();
            let change = changed_by_now(&mut watch, &requests).await;
            assert_eq!(change, Some(Change::Deleted { resource }), "{target:?}");
        }
    }

    #[tokio::test]
    async fn a_crd_read_now_and_then_counts_any_move_of_its_generation() {
        let (requests, _) = cluster_with(Some(crd("u1", 5, "v2")));
        let mut watch = TargetWatch::of_target(&Resource::widgets(), &target());
        let change = changed_by_now(&mut watch, &requests).await.expect("a change");
        let resource = "widgets.example.com".to_owned();
        assert_eq!(change, Change::Edited { resource, from: 4, to: 5, unseen: Unseen::Polled });
        assert!(change.starts_over());
    }

    #[test]
    fn a_followed_crd_records_the_state_it_was_followed_to() {
        let mut read = crd("u1", 7, "v2");
        read.metadata.resource_version = Some("250".into());
        let watch = TargetWatch::of_crd(&Resource::widgets(), Some(&read));
        let mut recorded = MigrationTarget::default();
        watch.record_into(&mut recorded);
        assert_eq!(recorded.crd_generation, Some(7));
        assert_eq!(recorded.crd_resource_version.as_deref(), Some("250"));
        // A CRD read now and then records nothing of its own: the target's generation stands.
        let polled = TargetWatch::of_target(&Resource::widgets(), &target());
        let mut untouched = MigrationTarget::default();
        polled.record_into(&mut untouched);
        assert_eq!(untouched, MigrationTarget::default());
    }
}
