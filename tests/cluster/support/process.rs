//! `kube-svm` run as a real process, for tests where signals and kills matter.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{CONTROLLER_NAMESPACE, ControlPlane};

/// The kube-svm binary: `KUBE_SVM_BINARY`, else the one Cargo built for these tests.
pub fn binary() -> PathBuf {
    let built = option_env!("CARGO_BIN_EXE_kube-svm").map(PathBuf::from);
    std::env::var_os("KUBE_SVM_BINARY")
        .map(PathBuf::from)
        .or(built)
        .unwrap_or_else(|| panic!("set KUBE_SVM_BINARY to the kube-svm binary to run"))
}

/// A `PATH` a reader's shell would have: the harness's kubectl, kube-svm and its kubectl plugin
/// name, before the test's own `PATH`. The directory lives as long as the value returned.
pub struct ReadersPath {
    _bin: tempfile::TempDir,
    /// The value for `PATH`.
    pub path: String,
}

impl ReadersPath {
    pub fn new() -> ReadersPath {
        let bin = tempfile::tempdir().expect("a directory");
        let kubectl = super::asset("kubectl").expect("kubectl (hack/control-plane.sh builds it)");
        std::os::unix::fs::symlink(&kubectl, bin.path().join("kubectl")).expect("linked");
        for name in ["kube-svm", kube_svm::cli::PLUGIN_BINARY] {
            std::os::unix::fs::symlink(binary(), bin.path().join(name)).expect("linked");
        }
        let path =
            format!("{}:{}", bin.path().display(), std::env::var("PATH").unwrap_or_default());
        ReadersPath { _bin: bin, path }
    }
}

pub struct KubeSvm {
    child: Child,
    pub log: PathBuf,
}

impl KubeSvm {
    /// Starts `kube-svm <args>` against `control_plane`, logging to a file in its directory. A
    /// controller runs as the Helm chart's ServiceAccount, with only the chart's RBAC.
    pub async fn start(control_plane: &ControlPlane, name: &str, args: &[&str]) -> KubeSvm {
        let kubeconfig = match args.first() == Some(&"controller") {
            true => control_plane.controller_kubeconfig().await,
            false => control_plane.kubeconfig(),
        };
        Self::start_as(control_plane, name, args, kubeconfig)
    }

    /// Starts `kube-svm <args>` with the credentials of `kubeconfig`.
    pub fn start_as(
        control_plane: &ControlPlane,
        name: &str,
        args: &[&str],
        kubeconfig: &Path,
    ) -> KubeSvm {
        Self::start_built(control_plane, &binary(), name, args, kubeconfig)
    }

    /// Starts `<built> <args>`, a kube-svm binary built elsewhere (another commit's, for the
    /// bench), with the credentials of `kubeconfig`.
    pub fn start_built(
        control_plane: &ControlPlane,
        built: &Path,
        name: &str,
        args: &[&str],
        kubeconfig: &Path,
    ) -> KubeSvm {
        let mut args: Vec<&str> = args.to_vec();
        let lease_namespace = format!("--leader-election-namespace={CONTROLLER_NAMESPACE}");
        if args.first() == Some(&"controller") {
            // Many controllers run side by side: each takes a port of its own unless told one.
            // Tests create their own migrations: the CRD trigger stays off unless a test turns it
            // on, and the discovery hash is trusted at once unless a test asks for a settle time.
            // Leases go where the chart lets its ServiceAccount write them. The gentle pace
            // follows its own latency unless a test asks for a probe: the suite runs many tests
            // at once on a few cores, and a probe-steered pace gives way to the other tests'
            // load, as it gives way to any client's, so a migration's time would be the
            // schedule's. The bench and the probe's own tests set a budget.
            for (flag, default) in [
                ("--metrics-bind-address", "--metrics-bind-address=127.0.0.1:0"),
                ("--crd-trigger", "--crd-trigger=false"),
                ("--storage-version-settle", "--storage-version-settle=0"),
                ("--leader-election-namespace", &lease_namespace),
                ("--foreground-budget", "--foreground-budget=off"),
            ] {
                if !args.iter().any(|a| a.starts_with(flag)) {
                    args.push(default);
                }
            }
        }
        let mut command = Command::new(built);
        command.args(&args).arg("--kubeconfig").arg(kubeconfig);
        command.env("RUST_LOG", "info,kube_svm=debug");
        Self::spawn(control_plane, name, command)
    }

    /// Starts `command`, which runs kube-svm some other way (from the image, in a root of its
    /// own), as it is: no flag or variable added. Its output goes to `<name>.log` in the control
    /// plane's directory.
    pub fn spawn(control_plane: &ControlPlane, name: &str, mut command: Command) -> KubeSvm {
        let log = control_plane.path(&format!("{name}.log"));
        let out = fs::File::create(&log).expect("log file");
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .expect("kube-svm starts");
        KubeSvm { child, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, signal: &str) {
        let status =
            Command::new("kill").arg(format!("-{signal}")).arg(self.pid().to_string()).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{signal} {}", self.pid());
    }

    /// Waits for the process to exit, at most `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log holds `text`, at most `timeout`; returns the log.
    pub async fn wait_for_log(&self, text: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let logs = self.logs();
            if logs.contains(text) {
                return logs;
            }
            assert!(Instant::now() < deadline, "{text:?} never logged:\n{logs}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The base URL of the controller's admin server, from its start-up log line.
    pub async fn admin_url(&self) -> String {
        let logs = self.wait_for_log("admin server listening", Duration::from_secs(30)).await;
        let address = logs
            .lines()
            .find(|line| line.contains("admin server listening"))
            .and_then(|line| line.split("address=").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no admin address in the log:\n{logs}"));
        format!("http://{address}")
    }
}

impl Drop for KubeSvm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
