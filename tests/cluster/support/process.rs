//! `kube-svm` run as a real process, for tests where signals and kills matter.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::ControlPlane;

pub struct KubeSvm {
    child: Child,
    pub log: PathBuf,
}

impl KubeSvm {
    /// Starts `kube-svm <args>` against `control_plane`, logging to a file in a temp directory.
    pub fn start(control_plane: &ControlPlane, name: &str, args: &[&str]) -> KubeSvm {
        let log = control_plane.path(&format!("{name}.log"));
        let out = fs::File::create(&log).expect("log file");
        let mut args: Vec<&str> = args.to_vec();
        if args.first() == Some(&"controller") {
            // Many controllers run side by side: each takes a port of its own unless told one.
            // Tests create their own migrations: the CRD trigger stays off unless a test turns it
            // on, and the discovery hash is trusted at once unless a test asks for a settle time.
            for (flag, default) in [
                ("--metrics-bind-address", "--metrics-bind-address=127.0.0.1:0"),
                ("--crd-trigger", "--crd-trigger=false"),
                ("--storage-version-settle", "--storage-version-settle=0"),
            ] {
                if !args.iter().any(|a| a.starts_with(flag)) {
                    args.push(default);
                }
            }
        }
        let child = Command::new(env!("CARGO_BIN_EXE_kube-svm"))
            .args(&args)
            .arg("--kubeconfig")
            .arg(control_plane.kubeconfig())
            .env("RUST_LOG", "info,kube_svm=debug")
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
}

impl Drop for KubeSvm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
