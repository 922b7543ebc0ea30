//! A real etcd and kube-apiserver, started as processes on free loopback ports.
//!
//! Binaries are found the envtest way: `TEST_ASSET_<NAME>`, then `$KUBEBUILDER_ASSETS/<name>`
//! (`make test` points it at what `hack/control-plane.sh` built). Each control plane lives in its
//! own temporary directory (data, certificates, logs). Dropping a control plane stops its servers; a
//! watchdog process also stops them, and removes the directory, when the test binary exits however
//! it exits. The directory is kept, and its path printed, when a test panicked.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tokio::sync::OnceCell;

use super::chart;
use super::etcd::Etcd;

/// The bearer token of the `admin` user (group `system:masters`).
const ADMIN_TOKEN: &str = "kube-svm-test-admin";

/// How long a server may take to become ready; kube-apiserver needs 30-60 s on 2 cores.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Namespace of the chart's release whose ServiceAccount controllers in tests run as; leader
/// election Leases live there.
pub const CONTROLLER_NAMESPACE: &str = "kube-svm";

/// File whose presence tells the watchdog to keep the directory.
const KEEP_MARKER: &str = "KEEP";

pub struct ControlPlane {
    dir: PathBuf,
    etcd_url: String,
    /// One kube-apiserver, or several on the same etcd (an HA control plane).
    apiservers: Vec<Apiserver>,
    /// In front of several apiservers: the one address clients are given.
    balancer: Option<Balancer>,
    /// Flags every apiserver gets after its own.
    common_flags: Vec<String>,
    etcd_process: Mutex<Child>,
    /// etcd's flags, to start it again after a restore.
    etcd_args: Vec<String>,
    /// etcd's peer URL, which a restore names.
    etcd_peer_url: String,
    kubeconfig: PathBuf,
    controller_kubeconfig: OnceCell<PathBuf>,
}

/// One kube-apiserver process of a control plane.
struct Apiserver {
    /// `kube-apiserver`, or `kube-apiserver-<i>` among several: its log and host name.
    name: String,
    port: u16,
    process: Mutex<Option<Child>>,
    /// Its own flags (appended to the common ones).
    flags: Mutex<Vec<String>>,
}

/// An HA control plane: how many apiservers, and the flags of each.
pub struct Topology {
    /// Each apiserver's own flags (`--emulated-version=1.36` for one of an older release).
    pub apiservers: Vec<Vec<String>>,
    /// Flags every apiserver gets (feature gates, runtime config).
    pub common: Vec<String>,
}

static SHARED: OnceCell<ControlPlane> = OnceCell::const_new();

/// The control plane shared by every test of this binary. Tests isolate themselves with unique
/// names and must not restart it; a test that needs other apiserver flags starts its own.
pub async fn shared() -> &'static ControlPlane {
    SHARED
        .get_or_init(|| async {
            ControlPlane::start(&[]).await.expect("the shared control plane starts")
        })
        .await
}

/// The audit policy of audited control planes: every request that writes, with who sent it, once
/// when it is received and once when it is answered (so a test can tell a request still being
/// handled from one that never came).
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  - level: Metadata
    nonResourceURLs: [/api, /api/*, /apis, /apis/*]
  - level: Metadata
    verbs: [list]
    resources: [{ group: migration.k8s.io, resources: [storagestates] }]
  - level: None
    verbs: [get, list, watch]
  - level: Metadata
";

/// One entry of kube-apiserver's audit log: a request that wrote, a read of discovery or a list
/// of StorageStates, as the apiserver saw it.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// `RequestReceived`, `ResponseComplete` or `Panic` (`ResponseStarted` only for watches).
    pub stage: String,
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub verb: String,
    /// The path and query asked for.
    #[serde(default, rename = "requestURI")]
    pub request_uri: String,
    #[serde(default)]
    pub impersonated_user: Option<AuditUser>,
    pub user: AuditUser,
    #[serde(default)]
    pub object_ref: Option<AuditObject>,
    /// When the apiserver began to handle the request.
    pub request_received_timestamp: String,
    /// The apiserver's answer.
    #[serde(default)]
    pub response_status: Option<AuditStatus>,
}

#[derive(Clone, Debug, serde::Deserialize)]
pub struct AuditStatus {
    #[serde(default)]
    pub code: u16,
}

#[derive(Clone, Debug, serde::Deserialize)]
pub struct AuditUser {
    pub username: String,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AuditObject {
    pub resource: String,
    pub name: String,
    pub api_group: String,
    /// The version the request was made at.
    pub api_version: String,
    pub subresource: String,
}

impl AuditEvent {
    /// Whether this event records the answer (or a panic), not the request's arrival.
    pub fn answered(&self) -> bool {
        matches!(self.stage.as_str(), "ResponseComplete" | "Panic")
    }

    /// The HTTP code of the answer.
    pub fn code(&self) -> Option<u16> {
        self.response_status.as_ref().map(|s| s.code)
    }

    /// Whether the request changes something.
    pub fn writes(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch" | "delete" | "deletecollection")
    }

    /// Who sent it: the impersonated user when there is one.
    pub fn sender(&self) -> &str {
        self.impersonated_user.as_ref().map_or(&self.user.username, |u| &u.username)
    }

    /// When the apiserver received it.
    pub fn received(&self) -> k8s_openapi::jiff::Timestamp {
        self.request_received_timestamp.parse().expect("an RFC 3339 timestamp")
    }
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver (with `extra_flags` appended) and waits until both serve.
    pub async fn start(extra_flags: &[&str]) -> anyhow::Result<ControlPlane> {
        Self::start_with(extra_flags, false).await
    }

    /// [`ControlPlane::start`], with kube-apiserver writing every request that writes to an
    /// audit log ([`ControlPlane::audit_events`]).
    pub async fn start_audited(extra_flags: &[&str]) -> anyhow::Result<ControlPlane> {
        Self::start_with(extra_flags, true).await
    }

    async fn start_with(extra_flags: &[&str], audited: bool) -> anyhow::Result<ControlPlane> {
        let mut extra_flags: Vec<String> = extra_flags.iter().map(ToString::to_string).collect();
        let dir = tempfile::Builder::new().prefix("kube-svm-control-plane-").tempdir()?.keep();
        if audited {
            fs::write(dir.join("audit-policy.yaml"), AUDIT_POLICY)?;
            extra_flags
                .push(format!("--audit-policy-file={}", dir.join("audit-policy.yaml").display()));
            extra_flags.push(format!("--audit-log-path={}", dir.join("audit.log").display()));
        }
        let topology = Topology { apiservers: vec![extra_flags], common: Vec::new() };
        Self::start_in(dir, &topology).await
    }

    /// Starts etcd and the apiservers of `topology` on it, each with its own identity (host
    /// name), behind a round-robin TCP balancer that every kubeconfig points at, as a cloud load
    /// balancer in front of an HA control plane: each new connection goes to the next apiserver
    /// that accepts it.
    pub async fn start_ha(topology: &Topology) -> anyhow::Result<ControlPlane> {
        let dir = tempfile::Builder::new().prefix("kube-svm-control-plane-").tempdir()?.keep();
        Self::start_in(dir, topology).await
    }

    async fn start_in(dir: PathBuf, topology: &Topology) -> anyhow::Result<ControlPlane> {
        keep_on_panic(&dir);
        write_serving_certificate(&dir.join("certs"))?;
        spawn_watchdog(&dir)?;
        let several = topology.apiservers.len() > 1;
        let mut apiservers = Vec::new();
        for (i, flags) in topology.apiservers.iter().enumerate() {
            apiservers.push(Apiserver {
                name: if several { format!("kube-apiserver-{i}") } else { "kube-apiserver".into() },
                port: free_port()?,
                process: Mutex::new(None),
                flags: Mutex::new(flags.clone()),
            });
        }
        let balancer = match several {
            true => Some(Balancer::start(apiservers.iter().map(|a| a.port).collect())?),
            false => None,
        };
        let front = balancer.as_ref().map_or(apiservers[0].port, |b| b.port);

        let (etcd_port, peer_port) = (free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let etcd_peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args = vec![
            "--data-dir".into(),
            dir.join("etcd").display().to_string(),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={etcd_peer_url}"),
            format!("--initial-advertise-peer-urls={etcd_peer_url}"),
            format!("--initial-cluster=default={etcd_peer_url}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        let etcd_process = spawn(&asset("etcd")?, &etcd_args, &dir.join("etcd.log"))?;
        record_pid(&dir, &etcd_process)?;

        write_credentials(&dir, front)?;
        for apiserver in &apiservers {
            let direct = kubeconfig(&dir, apiserver.port, None);
            fs::write(dir.join(format!("kubeconfig-{}", apiserver.name)), direct)?;
        }
        let control_plane = ControlPlane {
            kubeconfig: dir.join("kubeconfig"),
            controller_kubeconfig: OnceCell::new(),
            apiservers,
            balancer,
            common_flags: topology.common.clone(),
            etcd_process: Mutex::new(etcd_process),
            etcd_args,
            etcd_peer_url,
            dir,
            etcd_url,
        };
        let started = async {
            control_plane.etcd().wait_healthy(READY_TIMEOUT).await?;
            // One at a time: each creates what a new cluster needs; the others find it there.
            for i in 0..control_plane.apiservers.len() {
                control_plane.start_apiserver(i).await?;
            }
            anyhow::Ok(())
        };
        if let Err(error) = started.await {
            control_plane.keep();
            anyhow::bail!("{error}\n{}", control_plane.log_tail());
        }
        Ok(control_plane)
    }

    /// The last lines of every apiserver's log.
    fn log_tail(&self) -> String {
        let mut tails = Vec::new();
        for apiserver in &self.apiservers {
            let log = fs::read_to_string(self.log(&apiserver.name)).unwrap_or_default();
            let tail: Vec<_> = log.lines().rev().take(20).collect();
            let tail: Vec<_> = tail.into_iter().rev().collect();
            tails.push(format!("{}:\n{}", apiserver.name, tail.join("\n")));
        }
        tails.join("\n")
    }

    /// A new admin client. Each test runs on its own runtime, so clients are never shared.
    pub async fn client(&self) -> Client {
        Client::try_from(self.config().await).expect("the admin kubeconfig makes a client")
    }

    /// The admin client configuration.
    pub async fn config(&self) -> Config {
        let kubeconfig =
            Kubeconfig::read_from(&self.kubeconfig).expect("the kubeconfig is readable");
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("the kubeconfig is valid")
    }

    /// Path of an admin kubeconfig, for processes (`kube-svm --kubeconfig`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Path of a kubeconfig for `kube-svm controller` processes: the admin's credentials,
    /// impersonating the Helm chart's ServiceAccount (release `kube-svm` in namespace
    /// [`CONTROLLER_NAMESPACE`]), which is bound only to the chart's ClusterRole and Role. The
    /// chart's RBAC is installed on first use.
    pub async fn controller_kubeconfig(&self) -> &Path {
        self.controller_kubeconfig
            .get_or_init(|| async {
                self.impersonating_kubeconfig("kube-svm", CONTROLLER_NAMESPACE, &[]).await
            })
            .await
    }

    /// Installs the chart's ServiceAccount and RBAC as release `release` in `namespace` (with
    /// helm `args`) and writes a kubeconfig that impersonates that ServiceAccount in
    /// `namespace`, as the release's pod runs (its probe's ConfigMap is there).
    pub async fn impersonating_kubeconfig(
        &self,
        release: &str,
        namespace: &str,
        args: &[&str],
    ) -> PathBuf {
        let client = self.client().await;
        let user = chart::install_service_account(&client, release, namespace, args).await;
        let path = self.dir.join(format!("kubeconfig-{release}"));
        fs::write(&path, kubeconfig(&self.dir, self.front_port(), Some((&user, namespace))))
            .expect("the kubeconfig is written");
        path
    }

    /// The port clients are given, on 127.0.0.1: the balancer's, or the one apiserver's.
    pub fn front_port(&self) -> u16 {
        self.balancer.as_ref().map_or(self.apiservers[0].port, |b| b.port)
    }

    /// The CA certificate that signed the apiserver's serving certificate (a pod's `ca.crt`).
    pub fn ca_certificate(&self) -> PathBuf {
        self.dir.join("certs/ca.crt")
    }

    /// An admin client of apiserver `i` alone, bypassing the balancer.
    pub async fn direct_client(&self, i: usize) -> Client {
        let path = self.dir.join(format!("kubeconfig-{}", self.apiservers[i].name));
        let kubeconfig = Kubeconfig::read_from(&path).expect("the kubeconfig is readable");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("the kubeconfig is valid");
        Client::try_from(config).expect("a client")
    }

    /// Raw access to the etcd behind the apiserver.
    pub fn etcd(&self) -> Etcd {
        Etcd::new(&self.etcd_url)
    }

    /// A file in this control plane's directory, for configuration the apiserver reads.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Restarts kube-apiserver with `extra_flags` instead of the previous ones (etcd and its data
    /// stay), and waits until it is ready again.
    pub async fn restart_apiserver(&self, extra_flags: &[&str]) -> anyhow::Result<()> {
        self.restart_apiserver_at(0, extra_flags).await
    }

    /// Restarts apiserver `i` with its own flags replaced by `flags` (an upgrade: without
    /// `--emulated-version`), and waits until it is ready again.
    pub async fn restart_apiserver_at(&self, i: usize, flags: &[&str]) -> anyhow::Result<()> {
        let apiserver = &self.apiservers[i];
        if let Some(mut child) = apiserver.process.lock().expect("apiserver lock").take() {
            terminate(&mut child)?;
        }
        *apiserver.flags.lock().expect("flags lock") =
            flags.iter().map(ToString::to_string).collect();
        self.start_apiserver(i).await
    }

    /// Sends `signal` (`STOP`, `CONT`, `KILL`) to kube-apiserver.
    pub fn signal_apiserver(&self, signal: &str) {
        let apiserver = self.apiservers[0].process.lock().expect("apiserver lock");
        let pid = apiserver.as_ref().expect("kube-apiserver runs").id();
        let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{signal} kube-apiserver");
    }

    /// Kills kube-apiserver (SIGKILL: no graceful shutdown), starts it again with the same
    /// flags, and waits until it is ready.
    pub async fn kill_and_restart_apiserver(&self) -> anyhow::Result<()> {
        self.kill_apiserver(0)?;
        self.start_apiserver(0).await
    }

    /// Kills apiserver `i` (SIGKILL: no graceful shutdown); the balancer sends new connections
    /// to the others.
    pub fn kill_apiserver(&self, i: usize) -> anyhow::Result<()> {
        if let Some(mut child) = self.apiservers[i].process.lock().expect("apiserver lock").take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts apiserver `i` again with its flags, after [`ControlPlane::kill_apiserver`], and
    /// waits until it is ready.
    pub async fn revive_apiserver(&self, i: usize) -> anyhow::Result<()> {
        self.start_apiserver(i).await
    }

    /// Saves a snapshot of etcd to the file `name` in this control plane's directory, as a
    /// backup job does (`etcdctl snapshot save`).
    pub fn snapshot_etcd(&self, name: &str) -> anyhow::Result<PathBuf> {
        let path = self.dir.join(name);
        let status = Command::new(asset("etcdctl")?)
            .args(["--endpoints", &self.etcd_url, "snapshot", "save"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "etcdctl snapshot save failed ({status})");
        Ok(path)
    }

    /// Restores etcd from `snapshot` the documented way: every apiserver stopped, then etcd,
    /// its data replaced by `etcdutl snapshot restore --bump-revision --mark-compacted`, etcd
    /// started again, then the apiservers; returns once they are ready.
    pub async fn restore_etcd(&self, snapshot: &Path) -> anyhow::Result<()> {
        for apiserver in &self.apiservers {
            if let Some(mut child) = apiserver.process.lock().expect("apiserver lock").take() {
                terminate(&mut child)?;
            }
        }
        terminate(&mut self.etcd_process.lock().expect("etcd lock"))?;
        let (data, restored) = (self.dir.join("etcd"), self.dir.join("etcd-restored"));
        let peer = &self.etcd_peer_url;
        let output = Command::new(asset("etcdutl")?)
            .args(["snapshot", "restore"])
            .arg(snapshot)
            .arg("--data-dir")
            .arg(&restored)
            .args(["--name", "default"])
            .arg(format!("--initial-cluster=default={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .args(["--bump-revision", "1000000", "--mark-compacted"])
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "etcdutl snapshot restore failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        fs::remove_dir_all(&data)?;
        fs::rename(&restored, &data)?;
        let etcd = spawn(&asset("etcd")?, &self.etcd_args, &self.dir.join("etcd-restored.log"))?;
        record_pid(&self.dir, &etcd)?;
        *self.etcd_process.lock().expect("etcd lock") = etcd;
        self.etcd().wait_healthy(READY_TIMEOUT).await?;
        for i in 0..self.apiservers.len() {
            self.start_apiserver(i).await?;
        }
        Ok(())
    }

    /// Process IDs of kube-apiserver and etcd, for reading their CPU time and memory.
    pub fn pids(&self) -> (u32, u32) {
        let apiserver = self.apiservers[0].process.lock().expect("apiserver lock");
        let etcd = self.etcd_process.lock().expect("etcd lock");
        (apiserver.as_ref().expect("kube-apiserver runs").id(), etcd.id())
    }

    /// The requests that wrote, answered so far, as the audit log holds them (an audited control
    /// plane only).
    pub fn audit_events(&self) -> Vec<AuditEvent> {
        self.audit_log().into_iter().filter(AuditEvent::answered).collect()
    }

    /// The requests that wrote, received but not answered yet.
    pub fn audit_unanswered(&self) -> Vec<AuditEvent> {
        let log = self.audit_log();
        let answered: std::collections::HashSet<&str> =
            log.iter().filter(|e| e.answered()).map(|e| e.audit_id.as_str()).collect();
        log.iter()
            .filter(|e| e.stage == "RequestReceived" && !answered.contains(e.audit_id.as_str()))
            .cloned()
            .collect()
    }

    fn audit_log(&self) -> Vec<AuditEvent> {
        let log = fs::read_to_string(self.dir.join("audit.log")).expect("an audited control plane");
        // The last line may be half written.
        log.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
    }

    /// Records `pid` so the watchdog stops it when the test binary exits.
    pub fn adopt(&self, pid: u32) {
        use std::io::Write;
        let mut pids = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("pids"))
            .expect("the pid file opens");
        writeln!(pids, "{pid}").expect("the pid file is written");
    }

    async fn start_apiserver(&self, i: usize) -> anyhow::Result<()> {
        let dir = &self.dir;
        let apiserver = &self.apiservers[i];
        let port = apiserver.port;
        let mut args = vec![
            format!("--etcd-servers={}", self.etcd_url),
            format!("--cert-dir={}", dir.join("certs").display()),
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            // 1.37 refuses a loopback advertise address with the default endpoint reconciler.
            "--endpoint-reconciler-type=none".into(),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            "--authorization-mode=RBAC".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            format!("--token-auth-file={}", dir.join("tokens.csv").display()),
            format!("--service-account-issuer=https://127.0.0.1:{}", self.front_port()),
            format!("--service-account-key-file={}", dir.join("sa.pub").display()),
            format!("--service-account-signing-key-file={}", dir.join("sa.key").display()),
        ];
        args.extend(self.common_flags.iter().cloned());
        args.extend(apiserver.flags.lock().expect("flags lock").iter().cloned());
        let binary = asset("kube-apiserver")?;
        let log = dir.join(format!("{}.log", apiserver.name));
        let child = match self.apiservers.len() {
            1 => spawn(&binary, &args, &log)?,
            // Among several, each needs a host name of its own: kube-apiserver names its
            // identity Lease after it.
            _ => spawn_with_host_name(&binary, &args, &log, &apiserver.name)?,
        };
        record_pid(dir, &child)?;
        *apiserver.process.lock().expect("apiserver lock") = Some(child);
        self.wait_apiserver_ready(i).await
    }

    async fn wait_apiserver_ready(&self, i: usize) -> anyhow::Result<()> {
        let apiserver = &self.apiservers[i];
        let deadline = Instant::now() + READY_TIMEOUT;
        let client = self.direct_client(i).await;
        loop {
            let exited = match apiserver.process.lock().expect("apiserver lock").as_mut() {
                Some(child) => child.try_wait()?,
                None => None,
            };
            if let Some(status) = exited {
                anyhow::bail!(
                    "{} exited ({status}); see {}",
                    apiserver.name,
                    self.log(&apiserver.name)
                );
            }
            let readyz = http::Request::get("/readyz").body(Vec::new())?;
            if client.request_text(readyz).await.is_ok() {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} not ready; see {}",
                apiserver.name,
                self.log(&apiserver.name)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let namespaces: Api<Namespace> = Api::all(client);
        while namespaces.get_opt("default").await?.is_none() {
            anyhow::ensure!(Instant::now() < deadline, "namespace default never appeared");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(())
    }

    /// Keeps this control plane's directory (data and logs) after the test binary exits.
    pub fn keep(&self) {
        let _ = fs::write(self.dir.join(KEEP_MARKER), "");
        eprintln!("control plane logs kept in {}", self.dir.display());
    }

    /// Path of a server's log file.
    pub fn log(&self, server: &str) -> String {
        self.dir.join(format!("{server}.log")).display().to_string()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for apiserver in &self.apiservers {
            if let Ok(mut process) = apiserver.process.lock()
                && let Some(child) = process.as_mut()
            {
                let _ = terminate(child);
            }
        }
        if let Ok(mut etcd) = self.etcd_process.lock() {
            let _ = terminate(&mut etcd);
        }
        // The watchdog removes the directory once the test binary exits, unless it is kept.
    }
}

/// Finds a binary of the control plane (or kubectl) the envtest way.
pub fn asset(name: &str) -> anyhow::Result<PathBuf> {
    let variable = format!("TEST_ASSET_{}", name.to_uppercase().replace('-', "_"));
    if let Ok(path) = std::env::var(&variable) {
        return Ok(PathBuf::from(path));
    }
    if let Ok(dir) = std::env::var("KUBEBUILDER_ASSETS") {
        let path = Path::new(&dir).join(name);
        if path.exists() {
            return Ok(path);
        }
    }
    anyhow::bail!(
        "no {name} binary: set {variable} or KUBEBUILDER_ASSETS (`make test` builds them with hack/control-plane.sh)"
    )
}

pub(super) fn spawn(binary: &Path, args: &[String], log: &Path) -> anyhow::Result<Child> {
    let mut command = Command::new(binary);
    command.args(args);
    spawn_logged(command, log)
}

/// Starts `command` with no input and its output, both streams, in `log`.
fn spawn_logged(mut command: Command, log: &Path) -> anyhow::Result<Child> {
    let out = fs::File::create(log)?;
    Ok(command.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out).spawn()?)
}

/// [`spawn`], in a UTS namespace of its own whose host name is `host` (util-linux `unshare`).
fn spawn_with_host_name(
    binary: &Path,
    args: &[String],
    log: &Path,
    host: &str,
) -> anyhow::Result<Child> {
    let script = format!("hostname {host} && exec \"$0\" \"$@\"");
    let mut command = Command::new("unshare");
    command.args(["--uts", "sh", "-c", &script]).arg(binary).args(args);
    spawn_logged(command, log)
}

/// A round-robin TCP balancer on a loopback port, in front of several apiservers: each new
/// connection goes to the next one that accepts it, as a cloud load balancer's would. It runs on
/// a thread of its own, so it outlives any one test's runtime.
struct Balancer {
    port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Balancer {
    fn start(backends: Vec<u16>) -> anyhow::Result<Balancer> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                let next = std::sync::atomic::AtomicUsize::new(0);
                tokio::select! {
                    _ = stopped => {}
                    () = async {
                        loop {
                            let Ok((inbound, _)) = listener.accept().await else { continue };
                            let first = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            tokio::spawn(forward(inbound, backends.clone(), first));
                        }
                    } => {}
                }
            });
        });
        Ok(Balancer { port, stop: Some(stop) })
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Connects `inbound` to the first backend that accepts, trying them in turn from `first`.
async fn forward(mut inbound: tokio::net::TcpStream, backends: Vec<u16>, first: usize) {
    for i in 0..backends.len() {
        let port = backends[(first + i) % backends.len()];
        if let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            return;
        }
    }
}

/// Stops a server with SIGTERM, then SIGKILL if it has not exited within a few seconds.
pub(super) fn terminate(child: &mut Child) -> anyhow::Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    Command::new("kill").arg("-TERM").arg(child.id().to_string()).status()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill()?;
    child.wait()?;
    Ok(())
}

/// A free port for a server to bind, below the kernel's ephemeral range: a port handed out by
/// `bind(0)` comes from that range, and until the server binds it (an HA control plane starts its
/// apiservers one after another) any outgoing connection of the machine may take it. A port is
/// handed out once per test process: two control planes starting at once never get the same
/// free port before either binds it.
pub fn free_port() -> std::io::Result<u16> {
    static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let ephemeral = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok();
    let first = ephemeral.and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok());
    let below = first.unwrap_or(32_768).clamp(11_000, 32_768);
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    for _ in 0..1_000 {
        let port = fastrand::u16(10_000..below);
        if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.push(port);
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Writes the admin token file, the service account key pair and an admin kubeconfig.
fn write_credentials(dir: &Path, port: u16) -> anyhow::Result<()> {
    fs::write(dir.join("tokens.csv"), format!("{ADMIN_TOKEN},admin,admin,\"system:masters\"\n"))?;
    let key = dir.join("sa.key");
    let status = Command::new("openssl")
        .args(["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out"])
        .arg(&key)
        .status()?;
    anyhow::ensure!(status.success(), "openssl could not generate the service account key");
    let status = Command::new("openssl")
        .args(["ec", "-pubout", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(dir.join("sa.pub"))
        .stderr(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "openssl could not write the service account public key");
    fs::write(dir.join("kubeconfig"), kubeconfig(dir, port, None))?;
    Ok(())
}

/// kube-apiserver's serving certificate for 127.0.0.1, where `--cert-dir` finds it, and the CA
/// that signed it, which kubeconfigs trust: clients verify the apiserver as in a real cluster.
fn write_serving_certificate(certs: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(certs)?;
    let ca = super::secure_etcd::authority("kube-apiserver-ca")?;
    fs::write(certs.join("ca.crt"), ca.pem())?;
    let key = rcgen::KeyPair::generate()?;
    let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let certificate = rcgen::CertificateParams::new(names)?.signed_by(&key, &ca)?;
    fs::write(certs.join("apiserver.crt"), certificate.pem())?;
    fs::write(certs.join("apiserver.key"), key.serialize_pem())?;
    Ok(())
}

/// A kubeconfig with the admin's token, impersonating a user in a namespace of its own when
/// given, trusting the CA of [`write_serving_certificate`].
fn kubeconfig(dir: &Path, port: u16, impersonate: Option<(&str, &str)>) -> String {
    let (impersonate, namespace) = match impersonate {
        Some((user, namespace)) => {
            (format!("\n    as: {user}"), format!("\n    namespace: {namespace}"))
        }
        None => (String::new(), String::new()),
    };
    let ca = dir.join("certs/ca.crt");
    let ca = ca.display();
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:{port}
    certificate-authority: {ca}
users:
- name: admin
  user:
    token: {ADMIN_TOKEN}{impersonate}
contexts:
- name: test
  context:
    cluster: test
    user: admin{namespace}
current-context: test
"
    )
}

/// Records a server in `<dir>/pids` for the watchdog: its pid and its start time. A pid alone
/// is not a process: once the server exits, the kernel hands its pid to the next process that
/// starts (within a test run on a machine with 32,768 pids), and the watchdog must not kill that
/// one. The child is not yet reaped, so the start time read here is the server's.
pub(super) fn record_pid(dir: &Path, child: &Child) -> std::io::Result<()> {
    use std::io::Write;
    let start = start_time(child.id())?;
    let mut pids = fs::OpenOptions::new().create(true).append(true).open(dir.join("pids"))?;
    writeln!(pids, "{} {start}", child.id())
}

/// Field 22 of `/proc/<pid>/stat`, the process's start time in clock ticks since boot. Fields
/// are counted after the command name, which is in parentheses and may hold spaces.
fn start_time(pid: u32) -> std::io::Result<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_name = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or_default();
    after_name.split_whitespace().nth(19).map(str::to_owned).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("/proc/{pid}/stat: {stat}"))
    })
}

/// Starts a detached shell that waits for this test binary to exit, then kills every server
/// recorded in `<dir>/pids` that is still running (same pid, same start time), and removes `dir`
/// unless a test marked it to be kept.
pub(super) fn spawn_watchdog(dir: &Path) -> std::io::Result<()> {
    let script = r#"
        ours() {
            [ -f "$dir/pids" ] || return 0
            while read -r pid start; do
                now=$(awk '{ sub(/.*\) /, ""); print $20 }' "/proc/$pid/stat" 2>/dev/null)
                [ "$now" = "$start" ] && echo "$pid"
            done <"$dir/pids"
        }
        parent=$1 dir=$2
        while kill -0 "$parent" 2>/dev/null; do sleep 1; done
        ours | xargs -r kill -TERM 2>/dev/null
        sleep 3
        ours | xargs -r kill -KILL 2>/dev/null
        [ -f "$dir/KEEP" ] || rm -rf "$dir"
    "#;
    Command::new("setsid")
        .args(["sh", "-c", script, "watchdog"])
        .arg(std::process::id().to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(())
}

/// Directories of this process's control planes, marked to be kept when any test panics.
static DIRECTORIES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Registers `dir` to be kept, and its path printed, when a test panics.
pub(super) fn keep_on_panic(dir: &Path) {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default_hook(info);
            let Ok(directories) = DIRECTORIES.lock() else {
                return;
            };
            for dir in directories.iter() {
                if fs::write(dir.join(KEEP_MARKER), "").is_ok() {
                    eprintln!("control plane logs kept in {}", dir.display());
                }
            }
        }));
    });
    if let Ok(mut directories) = DIRECTORIES.lock() {
        directories.push(dir.to_owned());
    }
}
