//! The checkpoint files of `kube-svm migrate`: one per resource and cluster, holding the
//! migration as the controller would have recorded it in status, so that an interrupted run goes
//! on from where it stopped.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use tracing::warn;

use crate::api::{GroupResource, StorageVersionMigration, StorageVersionMigrationStatus};

/// What tells this cluster from any other, for checkpoints: the uid of its `kube-system`
/// namespace (a cluster created again at the same address has another). `None`, said once,
/// when it cannot be read: then nothing is checkpointed, as nothing could be resumed safely.
pub async fn cluster_identity(client: &Client) -> Option<String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.get_metadata("kube-system").await {
        Ok(namespace) => namespace.metadata.uid,
        Err(error) => {
            warn!(%error, "cannot read the kube-system namespace to tell this cluster apart; an interrupted run will start over");
            None
        }
    }
}

/// Checkpoint files, one per resource and cluster: the migration's status as the controller
/// would have recorded it.
pub struct Checkpoints {
    dir: Option<PathBuf>,
    /// Tells the clusters apart (see [`cluster_identity`]).
    cluster: String,
    /// Whether saving failed already (said once, not on every page).
    failed: std::sync::atomic::AtomicBool,
}

impl Checkpoints {
    /// The checkpoints of the cluster `cluster` names ([`cluster_identity`]) in `dir` (the
    /// default directory when `None`); none are kept when the cluster cannot be told apart.
    pub fn new(dir: Option<PathBuf>, cluster: Option<String>) -> Checkpoints {
        let Some(cluster) = cluster else {
            return Checkpoints { dir: None, cluster: String::new(), failed: Default::default() };
        };
        let dir = dir.or_else(|| {
            let state = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from).or_else(|| {
                std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state"))
            })?;
            Some(state.join("kube-svm/migrate"))
        });
        Checkpoints { dir, cluster, failed: Default::default() }
    }

    fn path(&self, name: &GroupResource) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        Some(dir.join(format!("{}@{}.json", name.name(), self.cluster)))
    }

    /// The migration saved for `name`; an unreadable checkpoint is said and ignored.
    pub fn load(&self, name: &GroupResource) -> Option<StorageVersionMigration> {
        let path = self.path(name)?;
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
            Err(error) => {
                warn!(path = %path.display(), %error, "cannot read the checkpoint; starting over");
                return None;
            }
        };
        match serde_json::from_slice(&text) {
            Ok(migration) => Some(migration),
            Err(error) => {
                warn!(path = %path.display(), %error, "the checkpoint is damaged; starting over");
                None
            }
        }
    }

    /// Saves `status` as the checkpoint of `name`; returns where, or `None` when it could not be.
    pub fn save(
        &self,
        name: &GroupResource,
        migration: &StorageVersionMigration,
        status: &StorageVersionMigrationStatus,
    ) -> Option<PathBuf> {
        let path = self.path(name)?;
        let mut migration = migration.clone();
        migration.status = Some(status.clone());
        let written = (|| -> std::io::Result<()> {
            let dir = path.parent().unwrap_or(&path);
            std::fs::create_dir_all(dir)?;
            let temporary = path.with_extension("json.tmp");
            std::fs::write(&temporary, serde_json::to_vec_pretty(&migration)?)?;
            std::fs::rename(&temporary, &path)
        })();
        match written {
            Ok(()) => Some(path),
            Err(error) => {
                if !self.failed.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    warn!(path = %path.display(), %error, "cannot save checkpoints; an interrupted run will start over");
                }
                None
            }
        }
    }

    /// Forgets the checkpoint of `name`: its migration ended.
    pub fn remove(&self, name: &GroupResource) {
        if let Some(path) = self.path(name) {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_are_kept_apart_by_cluster() {
        let dir = PathBuf::from("/state");
        let a = Checkpoints::new(Some(dir.clone()), Some("uid-a".into()));
        let b = Checkpoints::new(Some(dir.clone()), Some("uid-b".into()));
        let unknown = Checkpoints::new(Some(dir), None);
        let widgets = GroupResource::parse("widgets.example.com");
        assert_ne!(a.path(&widgets), b.path(&widgets));
        let file = a.path(&widgets).map(|p| p.display().to_string()).unwrap_or_default();
        assert_eq!(file, "/state/widgets.example.com@uid-a.json");
        assert_eq!(unknown.path(&widgets), None, "a cluster not told apart is not checkpointed");
    }
}
