//! Connecting to the cluster the way kubectl does: `--kubeconfig`, `--context`, else
//! `$KUBECONFIG`, `~/.kube/config` or the in-cluster service account.

use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Which cluster to talk to, flags shared by every subcommand that does.
#[derive(Args, Clone, Debug)]
pub struct KubeArgs {
    /// Path to a kubeconfig file; defaults as kubectl's (`$KUBECONFIG`, `~/.kube/config`, in-cluster).
    #[arg(long, env = "KUBECONFIG", global = true)]
    pub kubeconfig: Option<std::path::PathBuf>,

    /// The kubeconfig context to use.
    #[arg(long, env = "KUBE_SVM_CONTEXT", global = true)]
    pub context: Option<String>,
}

impl KubeArgs {
    /// The client configuration these flags name, read as kubectl would.
    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        let KubeArgs { kubeconfig, context } = self;
        let options = KubeConfigOptions { context: context.clone(), ..Default::default() };
        let config = match kubeconfig {
            Some(path) => {
                let file = Kubeconfig::read_from(path)?;
                kube::Config::from_custom_kubeconfig(file, &options).await?
            }
            None if context.is_some() => kube::Config::from_kubeconfig(&options).await?,
            None => kube::Config::infer().await?,
        };
        Ok(config)
    }
}

/// Whether this process runs in a pod (the service account environment is there).
pub fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
}
