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

    /// The migration saved for `name`; an unreadable checkpoint, or one someone else could have
    /// written, is said and ignored. What it says of the encoding is not taken from it: the run
    /// proves it again.
    pub fn load(&self, name: &GroupResource) -> Option<StorageVersionMigration> {
        let path = self.path(name)?;
        match std::fs::metadata(&path) {
            Ok(found) => {
                if let Some(why) = untrusted(&found) {
                    warn!(path = %path.display(), why, "not resuming from the checkpoint; starting over");
                    return None;
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
            Err(_) => {}
        }
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
            Err(error) => {
                warn!(path = %path.display(), %error, "cannot read the checkpoint; starting over");
                return None;
            }
        };
        match serde_json::from_slice::<StorageVersionMigration>(&text) {
            Ok(mut migration) => {
                let target = migration.status.as_mut().and_then(|s| s.target.as_mut());
                if let Some(target) = target {
                    target.encoding_confirmed = None;
                    target.encoding_evidence = None;
                }
                Some(migration)
            }
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
            use std::io::Write;
            use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
            let dir = path.parent().unwrap_or(&path);
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
            let temporary = path.with_extension("json.tmp");
            let _ = std::fs::remove_file(&temporary);
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temporary)?;
            file.write_all(&serde_json::to_vec_pretty(&migration)?)?;
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

/// Why a checkpoint file whose metadata is `found` may have been written by someone else: not
/// owned by this process's user, or writable by others. `None` when it can be trusted.
fn untrusted(found: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    // The owner of /proc/self is the process's effective user.
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    if me.is_some_and(|me| me != found.uid()) {
        return Some(format!("it is owned by user {}, not this one", found.uid()));
    }
    match found.mode() & 0o022 {
        0 => None,
        _ => Some(format!("others may write it (mode {:o})", found.mode() & 0o777)),
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

    #[test]
    fn checkpoints_are_private_and_prove_no_encoding() {
        use crate::api::{MigrationTarget, StorageVersionMigrationSpec};
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("a directory");
        let checkpoints = Checkpoints::new(Some(dir.path().into()), Some("uid-a".into()));
        let widgets = GroupResource::parse("widgets.example.com");
        let migration = StorageVersionMigration::new("m", StorageVersionMigrationSpec::default());
        let status = StorageVersionMigrationStatus {
            target: Some(MigrationTarget { encoding_confirmed: Some(true), ..Default::default() }),
            ..Default::default()
        };
        let path = checkpoints.save(&widgets, &migration, &status).expect("saved");
        let mode = std::fs::metadata(&path).expect("metadata").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let loaded = checkpoints.load(&widgets).expect("loaded");
        let target = loaded.status.and_then(|s| s.target).expect("a target");
        assert_eq!(target.encoding_confirmed, None, "proved again, not read");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        assert!(checkpoints.load(&widgets).is_none(), "a file others may write is not trusted");
    }
}
