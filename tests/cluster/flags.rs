//! Flags that make no sense are refused at start-up: the real binary, run with each of them,
//! exits with clap's usage error (2) naming the flag and the bound, before it reaches any
//! cluster. No control plane: the kubeconfig points at a port where nothing listens, so a
//! binary that took a bad value would go on running (or panic later) instead of refusing it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::process::binary;

/// A resource to name where a command needs one.
const WIDGETS: &str = "widgets.example.com";

/// How long a refusal may take. Parsing the command line takes milliseconds; a binary that
/// accepted the value is still running (or failed another way) when this runs out.
const REFUSAL: Duration = Duration::from_secs(30);

/// A kubeconfig for a cluster that is not there.
fn nowhere_kubeconfig(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let config = "apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster:
    server: https://127.0.0.1:1
    insecure-skip-tls-verify: true
users:
- name: nobody
  user:
    token: none
contexts:
- name: nowhere
  context: { cluster: nowhere, user: nobody, namespace: default }
current-context: nowhere
";
    std::fs::write(&path, config).expect("the kubeconfig is written");
    path
}

/// Runs `kube-svm <args>` with `env`; its exit code (`None`: still running after [`REFUSAL`],
/// then killed) and standard error.
fn run(kubeconfig: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(binary());
    command.args(args).arg("--kubeconfig").arg(kubeconfig);
    if args.first() == Some(&"controller") {
        command.arg("--metrics-bind-address=127.0.0.1:0");
    }
    let log = tempfile::NamedTempFile::new().expect("a log file");
    let mut child = command
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.reopen().expect("the log file"))
        .spawn()
        .expect("kube-svm starts");
    let deadline = Instant::now() + REFUSAL;
    let code = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, std::fs::read_to_string(log.path()).unwrap_or_default())
}

/// A command line that must be refused, and what the refusal must name.
#[derive(Clone, Copy)]
struct Case {
    args: &'static [&'static str],
    env: Option<(&'static str, &'static str)>,
    flag: &'static str,
    why: &'static str,
}

impl Case {
    const fn new(args: &'static [&'static str], flag: &'static str, why: &'static str) -> Case {
        Case { args, env: None, flag, why }
    }

    const fn env(
        args: &'static [&'static str],
        var: (&'static str, &'static str),
        flag: &'static str,
        why: &'static str,
    ) -> Case {
        Case { args, env: Some(var), flag, why }
    }
}

/// `--page-size=0`, `--request-timeout=inf` and an overflowing `--lease-duration`, each on both commands that take it (and from the environment), then every
/// other number and duration flag with a negative, non-finite, zero or overflowing value.
#[test]
fn nonsensical_numbers_are_refused_at_start_up() {
    let dir = tempfile::tempdir().expect("a directory");
    let kubeconfig = nowhere_kubeconfig(dir.path());
    let cases = [
        Case::new(&["controller", "--page-size=0"], "--page-size", "at least 1"),
        Case::new(&["migrate", WIDGETS, "--page-size=0"], "--page-size", "at least 1"),
        Case::env(&["migrate", WIDGETS], ("KUBE_SVM_PAGE_SIZE", "0"), "--page-size", "at least 1"),
        Case::new(&["controller", "--request-timeout=inf"], "--request-timeout", "finite"),
        Case::new(&["migrate", WIDGETS, "--request-timeout=inf"], "--request-timeout", "finite"),
        Case::new(&["controller", "--request-timeout=0"], "--request-timeout", "at least 1"),
        Case::new(
            &["controller", "--leader-elect=true", "--lease-duration=18446744073709551615"],
            "--lease-duration",
            "at most 2147483647",
        ),
        Case::new(
            &["controller", "--leader-elect=true", "--lease-duration=99999999999"],
            "--lease-duration",
            "at most 2147483647",
        ),
        Case::new(
            &["controller", "--leader-elect=true", "--lease-duration=0"],
            "--lease-duration",
            "at least 2",
        ),
        Case::new(&["controller", "--kube-api-qps=-1"], "--kube-api-qps", "at least 0.001"),
        Case::new(&["migrate", WIDGETS, "--kube-api-qps=NaN"], "--kube-api-qps", "at least 0.001"),
        Case::new(&["controller", "--kube-api-qps=1e-300"], "--kube-api-qps", "at least 0.001"),
        Case::new(&["controller", "--kube-api-burst=0"], "--kube-api-burst", "at least 1"),
        Case::new(&["controller", "--writes-in-flight=0"], "--writes-in-flight", "at least 1"),
        Case::new(&["controller", "--pace-params=cut=2"], "--pace-params", "between 0 and 1"),
        Case::new(&["migrate", WIDGETS, "--pace-params=holds=3"], "--pace-params", "no parameter"),
        Case::new(
            &["controller", "--writes-in-flight=18446744073709551615"],
            "--writes-in-flight",
            "at most",
        ),
        Case::new(
            &["controller", "--storage-version-settle=-1"],
            "--storage-version-settle",
            "at least 0",
        ),
        Case::new(
            &["migrate", WIDGETS, "--storage-version-wait=NaN"],
            "--storage-version-wait",
            "finite",
        ),
        Case::new(
            &["controller", "--apiserver-outage-timeout=1e30"],
            "--apiserver-outage-timeout",
            "at most",
        ),
        Case::new(&["controller", "--concurrency=0"], "--concurrency", "at least 1"),
        Case::new(&["controller", "--checkpoint-interval=-inf"], "--checkpoint-interval", "finite"),
        Case::new(&["controller", "--discovery-attempts=0"], "--discovery-attempts", "at least 1"),
        Case::new(&["controller", "--discovery-interval=0"], "--discovery-interval", "at least 1"),
        Case::new(&["status", "--watch", "--interval=inf"], "--interval", "finite"),
        Case::new(&["status", "--watch", "--interval=0"], "--interval", "at least 0.5"),
        Case::new(&["status", "--all-contexts", "--timeout=0"], "--timeout", "at least 0.1"),
        Case::new(&["plan", "--drop=v1", WIDGETS, "--timeout=inf"], "--timeout", "finite"),
    ];
    let mut wrong = Vec::new();
    std::thread::scope(|scope| {
        let runs: Vec<_> = cases
            .into_iter()
            .map(|case| {
                let kubeconfig = &kubeconfig;
                (case, scope.spawn(move || run(kubeconfig, case.args, case.env.as_slice())))
            })
            .collect();
        for (Case { args, env, flag, why }, run) in runs {
            let (code, stderr) = run.join().expect("the run is watched");
            let refused = code == Some(2) && stderr.contains(flag) && stderr.contains(why);
            if !refused {
                wrong.push(format!("{env:?} {args:?}: exit {code:?}, expected 2 naming {flag} and {why:?}\n{stderr}"));
            }
        }
    });
    assert!(wrong.is_empty(), "accepted or not explained:\n{}", wrong.join("\n"));
}

/// The defaults, and the values the chart and the tests use, still parse: `--help` after them
/// exits 0.
#[test]
fn sensible_numbers_are_accepted() {
    let dir = tempfile::tempdir().expect("a directory");
    let kubeconfig = nowhere_kubeconfig(dir.path());
    let controller = [
        "controller",
        "--page-size=500",
        "--request-timeout=30",
        "--lease-duration=15",
        "--kube-api-qps=0.5",
        "--kube-api-burst=200",
        "--writes-in-flight=64",
        "--storage-version-settle=0",
        "--storage-version-wait=120",
        "--apiserver-outage-timeout=900",
        "--concurrency=2",
        "--checkpoint-interval=0",
        "--discovery-attempts=5",
        "--discovery-interval=600",
        "--help",
    ];
    for args in [&controller[..], &["status", "--interval=0.5", "--help"]] {
        let (code, stderr) = run(&kubeconfig, args, &[]);
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
    }
}
