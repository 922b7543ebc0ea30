//! Following a run's CRD change by change. Its `metadata.generation` moves on any change to its
//! spec, but only some can affect how objects are stored: its storage version, or the CRD
//! itself (deleted, or created again under its name). A webhook's caBundle injected again and
//! again, printer columns, a schema's description move the generation and touch nothing stored.
//! Reading the CRD now and then cannot tell those from a storage switch there and back between
//! two reads, so every moved generation used to start the run over (and a CRD that churns was
//! never pruned). A watch from the resourceVersion the run's target was read at sees every
//! change in order: a run goes on through churn, and still starts over on a switch however
//! brief. When the watch cannot show that it saw every change (its history expired), the
//! generation decides as before: moved means changed.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{WatchEvent, WatchParams};
use tracing::debug;

use super::change::{Change, Unseen};
use super::cluster::Cluster;
use crate::api::MigrationTarget;
use crate::engine::Resource;
use crate::rules::crd::{CrdChange, CrdState};

/// Wait before a watch that failed (to open, or midway) is opened again.
const REOPEN_AFTER: Duration = Duration::from_secs(2);

/// A run's CRD as followed so far: every change up to `resource_version` was seen, and none
/// touched what is stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrdWatch {
    name: String,
    uid: Option<String>,
    storage_version: String,
    /// The latest generation seen; every change up to it left the storage version as it was.
    generation: i64,
    /// Where the watch goes on from.
    resource_version: String,
    /// For a run that cleans `managedFields`: the versions it cleans (unserved when it began).
    cleaned: Vec<String>,
}

/// What one state of the CRD, seen in order, says.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    /// Nothing stored is affected.
    Same,
    /// The CRD changed in a way that can affect what is stored.
    Changed(Change),
}

impl CrdWatch {
    /// Follows the CRD of a run from its target, where the target recorded the resourceVersion
    /// it was read at; `None` for a built-in resource or a target recorded without it (its
    /// generation decides).
    pub fn of(resource: &Resource, target: &MigrationTarget) -> Option<CrdWatch> {
        Some(CrdWatch {
            name: format!("{}.{}", resource.plural, resource.group),
            uid: target.crd_uid.clone(),
            storage_version: target.storage_version.clone()?,
            generation: target.crd_generation?,
            resource_version: target.crd_resource_version.clone()?,
            cleaned: Vec::new(),
        })
    }

    /// Also watches for a version whose `managedFields` entries the run cleans (one `crd`,
    /// as the run read it, does not serve) being served again: the run must stop cleaning it.
    pub fn cleaning(&mut self, crd: &CustomResourceDefinition) {
        let unserved = crd.spec.versions.iter().filter(|v| !v.served);
        self.cleaned = unserved.map(|v| v.name.clone()).collect();
    }

    /// Follows `crd` from the state it was read in; `None` when it names no storage version or
    /// was read without a resourceVersion.
    pub fn from_crd(crd: &CustomResourceDefinition) -> Option<CrdWatch> {
        let state = CrdState::of(crd)?;
        Some(CrdWatch {
            name: crd.metadata.name.clone()?,
            uid: state.uid,
            storage_version: state.storage_version,
            generation: state.generation,
            resource_version: crd.metadata.resource_version.clone()?,
            cleaned: Vec::new(),
        })
    }

    /// The latest generation every change up to which was seen, none of them affecting storage.
    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// Where the watch goes on from.
    pub fn resource_version(&self) -> &str {
        &self.resource_version
    }

    /// One state of the CRD, seen in order after the last. Pure.
    fn see(&mut self, resource: &Resource, crd: &CustomResourceDefinition) -> Seen {
        let now = CrdState::read(crd);
        match CrdChange::between(&self.state(), Some(&now)) {
            // Followed change by change: an edit that kept the storage version stores nothing
            // elsewhere.
            None | Some(CrdChange::Edited { .. }) => {}
            Some(CrdChange::Deleted | CrdChange::Replaced) => {
                return Seen::Changed(Change::Replaced { resource: resource.to_string() });
            }
            Some(CrdChange::StorageSwitched { from, to }) => {
                let (resource, generation) = (resource.to_string(), Some(now.generation));
                return Seen::Changed(Change::StorageSwitched { resource, from, to, generation });
            }
        }
        let versions: Vec<String> = crd
            .spec
            .versions
            .iter()
            .filter(|v| v.served && self.cleaned.contains(&v.name))
            .map(|v| v.name.clone())
            .collect();
        if !versions.is_empty() {
            let resource = resource.to_string();
            return Seen::Changed(Change::ServedAgain { resource, versions });
        }
        self.generation = self.generation.max(crd.metadata.generation.unwrap_or_default());
        if let Some(version) = &crd.metadata.resource_version {
            self.resource_version.clone_from(version);
        }
        Seen::Same
    }

    /// A read of the CRD after the watch's history expired: nothing was missed only if no spec
    /// change happened since the last state seen (the generation did not move). Pure.
    fn resync(&mut self, resource: &Resource, crd: &CustomResourceDefinition) -> Seen {
        if let Some(CrdChange::Edited { from, to }) =
            CrdChange::between(&self.state(), Some(&CrdState::read(crd)))
        {
            let resource = resource.to_string();
            return Seen::Changed(Change::Edited { resource, from, to, unseen: Unseen::Expired });
        }
        self.see(resource, crd)
    }

    /// The CRD as followed so far.
    fn state(&self) -> CrdState {
        CrdState {
            uid: self.uid.clone(),
            generation: self.generation,
            storage_version: self.storage_version.clone(),
            stored_versions: Vec::new(),
        }
    }

    /// Follows the CRD until it changes in a way that can affect what is stored.
    pub async fn follow(&mut self, cluster: &Cluster<'_>, resource: &Resource) -> Change {
        loop {
            if let Err(change) = self.follow_until(cluster, resource, None).await {
                return change;
            }
        }
    }

    /// Follows the CRD up to `now`, a state of it read after the last one seen: `None` when
    /// nothing between can have affected what is stored. A change that cannot all be seen
    /// within the request timeout counts as one that did.
    pub async fn catch_up(
        &mut self,
        cluster: &Cluster<'_>,
        resource: &Resource,
        now: &CustomResourceDefinition,
    ) -> Option<Change> {
        let generation = now.metadata.generation.unwrap_or_default();
        if generation == self.generation || now.metadata.resource_version.is_none() {
            // No spec change since the last state seen: `now` alone says.
            return match self.resync(resource, now) {
                Seen::Same => None,
                Seen::Changed(change) => Some(change),
            };
        }
        // Every spec change bumps the generation: once `now`'s is seen, every change up to it was.
        let caught_up = async {
            while self.generation < generation {
                self.follow_until(cluster, resource, Some(generation)).await?;
            }
            Ok(())
        };
        match tokio::time::timeout(cluster.requests.timeout(), caught_up).await {
            // `now` itself (already seen, or older than the last state seen): its uid and
            // storage version, without moving where the watch goes on from.
            Ok(Ok(())) => match self.clone().see(resource, now) {
                Seen::Same => None,
                Seen::Changed(change) => Some(change),
            },
            Ok(Err(change)) => Some(change),
            Err(_) => Some(Change::Edited {
                resource: resource.to_string(),
                from: self.generation,
                to: generation,
                unseen: Unseen::TimedOut(cluster.requests.timeout().as_secs()),
            }),
        }
    }

    /// One watch from the last state seen: `Ok` once it ends (the server closed it, or the
    /// generation `until` was seen), `Err` on a change that can affect what is stored.
    async fn follow_until(
        &mut self,
        cluster: &Cluster<'_>,
        resource: &Resource,
        until: Option<i64>,
    ) -> Result<(), Change> {
        let crds: Api<CustomResourceDefinition> = Api::all(cluster.requests.client().clone());
        // The server ends the watch before the client's read timeout would.
        let seconds = (cluster.requests.timeout().as_secs() / 2).clamp(1, 290);
        let params = WatchParams::default()
            .fields(&format!("metadata.name={}", self.name))
            .timeout(u32::try_from(seconds).unwrap_or(290));
        let stream = match crds.watch(&params, &self.resource_version).await {
            Ok(stream) => stream,
            Err(error) => {
                debug!(crd = %self.name, error = %crate::error_chain(&error), "could not watch the CRD; trying again");
                tokio::time::sleep(REOPEN_AFTER).await;
                return Ok(());
            }
        };
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let seen = match event {
                Ok(WatchEvent::Added(crd) | WatchEvent::Modified(crd)) => self.see(resource, &crd),
                Ok(WatchEvent::Deleted(_)) => {
                    return Err(Change::Deleted { resource: resource.to_string() });
                }
                Ok(WatchEvent::Bookmark(bookmark)) => {
                    self.resource_version = bookmark.metadata.resource_version;
                    Seen::Same
                }
                Ok(WatchEvent::Error(status)) if status.code == 410 => {
                    self.read_again(cluster, resource).await?;
                    return Ok(());
                }
                // Not at once: an apiserver that keeps failing the watch is not asked again and
                // again in a tight loop.
                Ok(WatchEvent::Error(status)) => {
                    debug!(crd = %self.name, message = %status.message, "the CRD's watch failed; watching again");
                    tokio::time::sleep(REOPEN_AFTER).await;
                    return Ok(());
                }
                Err(error) => {
                    debug!(crd = %self.name, error = %crate::error_chain(&error), "the CRD's watch broke; watching again");
                    tokio::time::sleep(REOPEN_AFTER).await;
                    return Ok(());
                }
            };
            if let Seen::Changed(change) = seen {
                return Err(change);
            }
            if until.is_some_and(|until| self.generation >= until) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// After the watch's history expired: the CRD read again decides whether anything was
    /// missed.
    async fn read_again(
        &mut self,
        cluster: &Cluster<'_>,
        resource: &Resource,
    ) -> Result<(), Change> {
        let crds: Api<CustomResourceDefinition> = Api::all(cluster.requests.client().clone());
        match cluster.requests.send(crds.get_opt(&self.name)).await {
            Ok(Some(crd)) => match self.resync(resource, &crd) {
                Seen::Same => Ok(()),
                Seen::Changed(change) => Err(change),
            },
            Ok(None) => Err(Change::Deleted { resource: resource.to_string() }),
            Err(error) => {
                debug!(crd = %self.name, error = %crate::error_chain(&error), "could not read the CRD again; trying again");
                tokio::time::sleep(REOPEN_AFTER).await;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::reasons;

    fn crd(uid: &str, generation: i64, storage: &str, rv: &str) -> CustomResourceDefinition {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "widgets.example.com", "uid": uid, "generation": generation,
                "resourceVersion": rv,
            },
            "spec": {
                "group": "example.com", "scope": "Namespaced",
                "names": { "plural": "widgets", "kind": "Widget" },
                "versions": [
                    { "name": "v1", "served": true, "storage": storage == "v1" },
                    { "name": "v2", "served": true, "storage": storage == "v2" },
                ],
            },
        }))
        .expect("a CRD")
    }

    fn followed() -> CrdWatch {
        CrdWatch::from_crd(&crd("u1", 4, "v2", "100")).expect("followed")
    }

    #[test]
    fn churn_that_leaves_storage_alone_moves_the_generation_followed() {
        let mut f = followed();
        let widgets = Resource::widgets();
        assert_eq!(f.see(&widgets, &crd("u1", 5, "v2", "101")), Seen::Same);
        assert_eq!(f.see(&widgets, &crd("u1", 6, "v2", "105")), Seen::Same);
        assert_eq!((f.generation(), f.resource_version()), (6, "105"));
    }

    #[test]
    fn a_switch_there_and_back_is_seen_on_the_way() {
        let mut f = followed();
        let widgets = Resource::widgets();
        let Seen::Changed(there) = f.see(&widgets, &crd("u1", 5, "v1", "101")) else {
            panic!("a switch to v1 is a change")
        };
        assert!(there.starts_over() && there.to_string().contains("from v2 to v1"), "{there:?}");
    }

    #[test]
    fn a_version_served_again_stops_a_run_that_cleans_it() {
        let widgets = Resource::widgets();
        let mut unserved = crd("u1", 4, "v2", "100");
        unserved.spec.versions[0].served = false;
        let mut f = CrdWatch::from_crd(&unserved).expect("followed");
        // Not cleaning: serving v1 again changes nothing stored.
        assert_eq!(f.clone().see(&widgets, &crd("u1", 5, "v2", "101")), Seen::Same);
        f.cleaning(&unserved);
        assert_eq!(f.see(&widgets, &unserved), Seen::Same);
        let Seen::Changed(again) = f.see(&widgets, &crd("u1", 5, "v2", "101")) else {
            panic!("v1 served again stops the cleaning")
        };
        assert!(
            again.starts_over() && again.reason() == reasons::VERSION_SERVED_AGAIN,
            "{again:?}"
        );
    }

    #[test]
    fn a_crd_created_again_is_another_crd() {
        let mut f = followed();
        let Seen::Changed(replaced) = f.see(&Resource::widgets(), &crd("u2", 1, "v2", "300"))
        else {
            panic!("another uid is a change")
        };
        assert!(!replaced.starts_over(), "{replaced:?}");
    }

    #[test]
    fn a_read_after_the_history_expired_proves_nothing_once_the_generation_moved() {
        let widgets = Resource::widgets();
        let mut f = followed();
        // Only the status changed since: nothing was missed.
        assert_eq!(f.resync(&widgets, &crd("u1", 4, "v2", "180")), Seen::Same);
        assert_eq!(f.resource_version(), "180");
        // The spec changed unseen: it may have been a switch there and back.
        let Seen::Changed(moved) = f.resync(&widgets, &crd("u1", 7, "v2", "200")) else {
            panic!("an unseen change counts")
        };
        assert!(
            moved.starts_over() && moved.to_string().contains("generation 4 then 7"),
            "{moved:?}"
        );
    }
}
