//! A lone etcd that serves clients over TLS and accepts only client certificates signed by its
//! CA, as a kubeadm cluster's etcd does; it also listens on plain http for the test's own writes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

use super::Etcd;
use super::control_plane::{
    asset, free_port, keep_on_panic, record_pid, spawn, spawn_watchdog, terminate,
};

pub struct SecureEtcd {
    /// The TLS client URL.
    pub https_url: String,
    /// The same etcd over plain http.
    pub plain: Etcd,
    dir: PathBuf,
    process: Mutex<Child>,
}

impl SecureEtcd {
    pub async fn start() -> anyhow::Result<SecureEtcd> {
        let dir = tempfile::Builder::new().prefix("kube-svm-secure-etcd-").tempdir()?.keep();
        keep_on_panic(&dir);
        spawn_watchdog(&dir)?;
        write_certificates(&dir)?;
        let (https_port, http_port, peer_port) = (free_port()?, free_port()?, free_port()?);
        let https_url = format!("https://127.0.0.1:{https_port}");
        let http_url = format!("http://127.0.0.1:{http_port}");
        let path = |name: &str| dir.join(name).display().to_string();
        let process = spawn(
            &asset("etcd")?,
            &[
                format!("--data-dir={}", path("data")),
                format!("--listen-client-urls={https_url},{http_url}"),
                format!("--advertise-client-urls={https_url}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
                format!("--cert-file={}", path("server.crt")),
                format!("--key-file={}", path("server.key")),
                format!("--trusted-ca-file={}", path("ca.crt")),
                "--client-cert-auth=true".into(),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
            &dir.join("etcd.log"),
        )?;
        record_pid(&dir, &process)?;
        let plain = Etcd::new(&http_url);
        plain.wait_healthy(Duration::from_secs(60)).await?;
        Ok(SecureEtcd { https_url, plain, dir, process: Mutex::new(process) })
    }

    /// A file of the PKI: `ca.crt`, `client.crt`, `client.key`, `other-ca.crt`.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for SecureEtcd {
    fn drop(&mut self) {
        if let Ok(mut process) = self.process.lock() {
            let _ = terminate(&mut process);
        }
    }
}

/// A CA, a serving certificate for 127.0.0.1 and a client certificate signed by it, and an
/// unrelated CA.
fn write_certificates(dir: &Path) -> anyhow::Result<()> {
    let ca = authority("etcd-ca")?;
    fs::write(dir.join("ca.crt"), ca.pem())?;
    fs::write(dir.join("other-ca.crt"), authority("other-ca")?.pem())?;
    // etcd's JSON gateway dials etcd's own gRPC port with the serving certificate, so that one
    // is a client certificate too (as kubeadm makes it).
    let both = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let client = vec![ExtendedKeyUsagePurpose::ClientAuth];
    for (name, purposes, names) in [
        ("server", both, vec!["127.0.0.1".into(), "localhost".into()]),
        ("client", client, vec!["apiserver-etcd-client".into()]),
    ] {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params.extended_key_usages = purposes;
        let certificate = params.signed_by(&key, &ca)?;
        fs::write(dir.join(format!("{name}.crt")), certificate.pem())?;
        fs::write(dir.join(format!("{name}.key")), key.serialize_pem())?;
    }
    Ok(())
}

/// A self-signed CA named `name`.
pub(super) fn authority(name: &str) -> anyhow::Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}
