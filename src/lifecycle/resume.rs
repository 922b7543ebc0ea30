//! Whether a checkpoint still describes this cluster.
//!
//! A checkpoint says "every object before this continue token was written through the target".
//! The storage version hash and the CRD's uid and generation show that the target is the same;
//! they cannot show that what was written is still there, nor that the target means what it
//! meant. Two things happen to a cluster between an interrupted run and the next one that
//! neither can see:
//!
//! - an encryption key rotation: the apiservers restart with another write key, and the objects
//!   written before the checkpoint are under the old one (the storage version hash never
//!   changes with a key);
//! - an etcd restore: the objects written before the checkpoint are back as they were in the
//!   snapshot, and the documented procedure (`--bump-revision --mark-compacted`) leaves the
//!   CRD's uid and generation as they were.
//!
//! So a checkpoint is resumed only when two more witnesses agree:
//!
//! - the same kube-apiserver processes answer: each identity Lease's holder carries a new id at
//!   every start of its apiserver, and a key rotation (like any restart after an etcd restore)
//!   restarts them;
//! - the checkpoint's list snapshot is still in etcd: its continue token can still be read. A
//!   restore marks every earlier revision compacted, and a compaction since the checkpoint
//!   means the objects' history before it can no longer be compared.
//!
//! Otherwise the run starts over from the first object, which is always safe: writes are
//! idempotent. What this cannot see is said in docs/safety.md: an apiserver that reloads its
//! encryption configuration without restarting (`--encryption-provider-config-automatic-reload`).

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::ListParams;

use crate::api::MigrationTarget;
use crate::apiserver::requests::{RequestError, Requests};
use crate::engine::Resource;

/// The label kube-apiserver puts on its identity Lease in `kube-system` (APIServerIdentity, on
/// by default since Kubernetes 1.26).
const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity=kube-apiserver";

/// What the cluster shows now, to hold a checkpoint against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Witness {
    /// The kube-apiserver processes answering now ([`apiserver_processes`]), or why they
    /// could not be read.
    pub apiservers: Result<Vec<String>, String>,
    /// Whether the checkpoint's list snapshot can still be read.
    pub snapshot: Snapshot,
}

/// Whether a checkpoint's continue token can still be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Snapshot {
    /// The apiserver answered a page from it.
    Readable,
    /// It could not be read, and why: 410 Gone when etcd compacted (or a restore marked
    /// compacted) its revision.
    Unreadable(String),
}

/// The kube-apiserver processes serving the cluster: the holders of their identity Leases in
/// `kube-system`, sorted. A holder is `<lease name>_<id>`, the id new at every start of the
/// apiserver, so a restarted apiserver shows as another process. Empty when no apiserver
/// publishes an identity (APIServerIdentity off).
pub async fn apiserver_processes(requests: &Requests) -> Result<Vec<String>, String> {
    let leases: Api<Lease> = Api::namespaced(requests.client().clone(), "kube-system");
    let params = ListParams::default().labels(IDENTITY_LABEL);
    let list =
        requests.send(leases.list(&params)).await.map_err(|error| crate::error_chain(&error))?;
    let mut holders: Vec<String> = list
        .items
        .into_iter()
        .filter_map(|lease| lease.spec.and_then(|spec| spec.holder_identity))
        .collect();
    holders.sort();
    Ok(holders)
}

/// How the kube-apiserver processes answering `now` differ from those that answered `then`
/// (both as [`apiserver_processes`] reads them); `None` when they are the same.
pub fn restarted(then: &[String], now: &[String]) -> Option<String> {
    if then == now {
        return None;
    }
    let gone = then.iter().filter(|p| !now.contains(p)).count();
    let started = now.iter().filter(|p| !then.contains(p)).count();
    Some(format!(
        "{gone} of the {} that answered then are gone, {started} started since",
        then.len()
    ))
}

/// Whether `token`, a continue token of `resource`, can still be read: one object's metadata is
/// asked for from it.
pub async fn snapshot(requests: &Requests, resource: &Resource, token: &str) -> Snapshot {
    let params = ListParams::default().limit(1).continue_token(token);
    let request = match kube::core::Request::new(resource.collection_path()).list_metadata(&params)
    {
        Ok(request) => request,
        Err(error) => return Snapshot::Unreadable(crate::error_chain(&error)),
    };
    match requests.send(requests.client().request_text(request)).await {
        Ok(_) => Snapshot::Readable,
        Err(RequestError::Api(kube::Error::Api(status))) if status.code == 410 => {
            Snapshot::Unreadable(
                "etcd no longer holds its list snapshot (410 Gone: compacted since, or restored from a backup)"
                    .to_owned(),
            )
        }
        Err(error) => Snapshot::Unreadable(crate::error_chain(&error)),
    }
}

/// Why a checkpoint taken under `recorded` no longer describes the cluster `now` shows; `None`
/// when it still does.
pub fn refusal(recorded: &MigrationTarget, now: &Witness) -> Option<String> {
    let Some(then) = &recorded.apiservers else {
        return Some(
            "the checkpoint does not record which apiservers answered when it was taken".to_owned(),
        );
    };
    match &now.apiservers {
        Err(error) => {
            return Some(format!("the apiservers answering now cannot be read: {error}"));
        }
        Ok(now) => {
            if let Some(why) = restarted(then, now) {
                return Some(format!(
                    "the apiservers restarted since it was taken ({why}; a restart can bring another encryption key or storage version)"
                ));
            }
        }
    }
    match &now.snapshot {
        Snapshot::Readable => None,
        Snapshot::Unreadable(why) => Some(format!("its continue token cannot be read: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(apiservers: Option<&[&str]>) -> MigrationTarget {
        MigrationTarget {
            apiservers: apiservers.map(|a| a.iter().map(|s| s.to_string()).collect()),
            ..MigrationTarget::default()
        }
    }

    fn witness(apiservers: &[&str], snapshot: Snapshot) -> Witness {
        Witness { apiservers: Ok(apiservers.iter().map(|s| s.to_string()).collect()), snapshot }
    }

    #[test]
    fn the_same_apiservers_and_a_readable_token_resume() {
        let then = recorded(Some(&["apiserver-a_1", "apiserver-b_1"]));
        let now = witness(&["apiserver-a_1", "apiserver-b_1"], Snapshot::Readable);
        assert_eq!(refusal(&then, &now), None);
        // No apiserver publishes an identity, then or now: the token is the only witness.
        assert_eq!(refusal(&recorded(Some(&[])), &witness(&[], Snapshot::Readable)), None);
    }

    #[test]
    fn a_restarted_apiserver_refuses_the_checkpoint() {
        let then = recorded(Some(&["apiserver-a_1", "apiserver-b_1"]));
        let now = witness(&["apiserver-a_1", "apiserver-b_2"], Snapshot::Readable);
        let why = refusal(&then, &now).expect("refused");
        assert!(why.contains("1 of the 2 that answered then are gone, 1 started since"), "{why}");
    }

    #[test]
    fn a_token_etcd_no_longer_holds_refuses_the_checkpoint() {
        let then = recorded(Some(&["apiserver-a_1"]));
        let gone = Snapshot::Unreadable("410 Gone".into());
        let why = refusal(&then, &witness(&["apiserver-a_1"], gone)).expect("refused");
        assert!(why.starts_with("its continue token cannot be read: 410 Gone"), "{why}");
    }

    #[test]
    fn what_cannot_be_compared_refuses_the_checkpoint() {
        let unrecorded = refusal(&recorded(None), &witness(&["a_1"], Snapshot::Readable));
        assert!(unrecorded.is_some_and(|w| w.contains("does not record which apiservers")));
        let unreadable =
            Witness { apiservers: Err("forbidden".into()), snapshot: Snapshot::Readable };
        let why = refusal(&recorded(Some(&["a_1"])), &unreadable).expect("refused");
        assert!(why.ends_with("cannot be read: forbidden"), "{why}");
    }
}
