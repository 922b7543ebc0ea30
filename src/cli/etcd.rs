//! Reaching etcd, for the commands that read it directly (`inspect`, `plan`): the flags name
//! the files kube-apiserver's own `--etcd-*` flags name.

use std::path::PathBuf;

use clap::Args;

use crate::census::Connection;

#[derive(Args, Clone, Debug)]
pub struct EtcdArgs {
    /// etcd's client URLs, comma-separated (kube-apiserver's --etcd-servers).
    #[arg(long, env = "KUBE_SVM_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,

    /// CA certificate that signed etcd's serving certificate (kube-apiserver's --etcd-cafile);
    /// required for https endpoints.
    #[arg(long, env = "KUBE_SVM_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,

    /// Client certificate for etcd (kube-apiserver's --etcd-certfile).
    #[arg(long, env = "KUBE_SVM_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,

    /// Client key for etcd (kube-apiserver's --etcd-keyfile).
    #[arg(long, env = "KUBE_SVM_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,

    /// The prefix kube-apiserver keeps its keys under (its --etcd-prefix).
    #[arg(long, default_value = "/registry")]
    pub etcd_prefix: String,

    /// Reach etcd through this HTTP proxy (`http://host:port`). Without it no proxy is used,
    /// whatever HTTP_PROXY, HTTPS_PROXY or ALL_PROXY say: etcd's answers hold raw values, and a
    /// proxy in front of an http:// endpoint would see every one of them.
    #[arg(long, env = "KUBE_SVM_ETCD_PROXY", value_name = "URL")]
    pub etcd_proxy: Option<String>,
}

impl EtcdArgs {
    /// How to reach etcd, or `None` when no endpoint was given; and the key prefix.
    pub fn connection(self) -> (Option<Connection>, String) {
        let EtcdArgs { etcd_endpoints, etcd_ca, etcd_cert, etcd_key, etcd_prefix, etcd_proxy } =
            self;
        let connection = (!etcd_endpoints.is_empty()).then_some(Connection {
            endpoints: etcd_endpoints,
            ca: etcd_ca,
            cert: etcd_cert,
            key: etcd_key,
            proxy: etcd_proxy,
        });
        // As kube-apiserver takes it: `registry`, `/registry` and `/registry/` are one prefix.
        (connection, format!("/{}", etcd_prefix.trim_matches('/')))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_is_taken_as_kube_apiserver_takes_it() {
        for given in ["registry", "/registry", "/registry/", "registry/"] {
            let args = EtcdArgs {
                etcd_endpoints: Vec::new(),
                etcd_ca: None,
                etcd_cert: None,
                etcd_key: None,
                etcd_prefix: given.into(),
                etcd_proxy: None,
            };
            assert_eq!(args.connection().1, "/registry", "{given}");
        }
    }
}
