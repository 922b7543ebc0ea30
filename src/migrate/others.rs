//! Whether another migrator is migrating a resource now: a kube-svm controller (its
//! `migration.k8s.io` migrations) or the in-tree migrator (`storagemigration.k8s.io`). At most
//! one migration per resource at a time, whoever runs it.

use std::time::Duration;

use kube::api::ListParams;
use kube::{Api, Client};

use crate::api::{GroupResource, StorageVersionMigration};
use crate::apiserver::answers::{is_not_found, is_transient};
use crate::apiserver::in_tree;

/// Tries to list the other migrators' migrations, [`AGAIN_AFTER`] apart.
const LIST_ATTEMPTS: u32 = 10;

/// Between two tries.
const AGAIN_AFTER: Duration = Duration::from_secs(2);

/// Why the other migrators' migrations could not be listed.
#[derive(Debug, thiserror::Error)]
#[error("failed to list {api} migrations")]
pub struct Unlisted {
    api: &'static str,
    #[source]
    source: kube::Error,
}

/// The migration running for `name`, in words (`the kube-svm migration NAME`), if any. An
/// apiserver that asks to be asked again (429: a new CRD's storage still initializing; 5xx; no
/// answer) is, a few times.
pub async fn running_for(
    client: &Client,
    name: &GroupResource,
) -> Result<Option<String>, Unlisted> {
    let mut attempt = 1;
    loop {
        let error = match running_now(client, name).await {
            Ok(running) => return Ok(running),
            Err(error) => error,
        };
        if !is_transient(&error.source) || attempt == LIST_ATTEMPTS {
            return Err(error);
        }
        attempt += 1;
        tokio::time::sleep(AGAIN_AFTER).await;
    }
}

async fn running_now(client: &Client, name: &GroupResource) -> Result<Option<String>, Unlisted> {
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    let ours = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // kube-svm's CRDs are not installed (`kube-svm migrate` runs without them).
        Err(error) if is_not_found(&error) => Vec::new(),
        Err(source) => return Err(Unlisted { api: "migration.k8s.io", source }),
    };
    // Not only a Running one: a migration checking the encoding, or waiting for its turn, is
    // about to write.
    let running = ours.iter().find(|m| m.is_unfinished() && m.is_of(&name.group, &name.resource));
    if let Some(running) = running {
        let named = running.metadata.name.as_deref().unwrap_or_default();
        return Ok(Some(format!("the kube-svm migration {named}")));
    }
    let in_tree = in_tree::running_for(client, name).await;
    let in_tree = in_tree.map_err(|source| Unlisted { api: "storagemigration.k8s.io", source })?;
    Ok(in_tree.map(|named| format!("the in-tree migration {named}")))
}
