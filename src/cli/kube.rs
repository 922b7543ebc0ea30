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

    /// The kubeconfig context to use. `status` and `plan --drop` take it more than once, and
    /// then ask each context's cluster.
    #[arg(long, env = "KUBE_SVM_CONTEXT", global = true)]
    pub context: Vec<String>,
}

impl KubeArgs {
    /// The client configuration these flags name, read as kubectl would.
    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        let KubeArgs { kubeconfig, context } = self;
        let context = match context.as_slice() {
            [] => None,
            [one] => Some(one.clone()),
            several => anyhow::bail!(
                "--context is given {} times: only status and plan --drop ask several clusters",
                several.len()
            ),
        };
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

    /// The same kubeconfig, at `context`.
    pub fn at(&self, context: &str) -> KubeArgs {
        KubeArgs { kubeconfig: self.kubeconfig.clone(), context: vec![context.to_owned()] }
    }

    /// Every context of the kubeconfig, in its order.
    pub fn contexts(&self) -> anyhow::Result<Vec<String>> {
        let file = match &self.kubeconfig {
            Some(path) => Kubeconfig::read_from(path)?,
            None => Kubeconfig::read()?,
        };
        Ok(file.contexts.into_iter().map(|context| context.name).collect())
    }
}

/// Whether this process runs in a pod (the service account environment is there).
pub fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
}

#[cfg(test)]
mod tests {
    use super::KubeArgs;

    #[tokio::test]
    async fn a_command_that_asks_one_cluster_refuses_several_contexts() {
        let kube = KubeArgs { kubeconfig: None, context: vec!["east".into(), "west".into()] };
        let error = kube.config().await.expect_err("refused");
        assert!(error.to_string().starts_with("--context is given 2 times"), "{error}");
        assert_eq!(kube.at("west").context, ["west"]);
    }
}
