//! What the release workflow publishes besides the image and the chart: the krew manifest of
//! `kubectl svm`, filled in by `hack/krew-manifest.sh` for the archives it uploads.

use std::fs;
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

fn krew_manifest(version: &str, dist: &Path) -> std::process::Output {
    Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/krew-manifest.sh"))
        .args([version, "https://github.com/OWNER/kube-svm"])
        .arg(dist)
        .output()
        .expect("hack/krew-manifest.sh runs")
}

/// Each platform names its archive on the release and that archive's sha256, and runs the
/// kube-svm binary it holds; krew links it as `kubectl-svm`, the name kube-svm answers to as a
/// plugin. A missing archive fails the release rather than publishing a manifest without it.
#[test]
fn the_krew_manifest_names_each_archive_and_its_checksum() {
    let version = env!("CARGO_PKG_VERSION");
    let dist = tempfile::tempdir().expect("a directory");
    let mut sums = Vec::new();
    for arch in ["amd64", "arm64"] {
        let archive = format!("kube-svm-{version}-linux-{arch}.tar.gz");
        fs::write(dist.path().join(&archive), arch).expect("an archive");
        let sum: String = Sha256::digest(arch).iter().map(|b| format!("{b:02x}")).collect();
        sums.push((arch, archive, sum));
    }
    let output = krew_manifest(version, dist.path());
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let manifest: serde_yaml_ng::Value =
        serde_yaml_ng::from_slice(&output.stdout).expect("the manifest is YAML");
    assert_eq!(manifest["apiVersion"], "krew.googlecontainertools.github.com/v1alpha2");
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(
        format!("kubectl-{}", manifest["metadata"]["name"].as_str().unwrap_or_default()),
        kube_svm::cli::PLUGIN_BINARY
    );
    let spec = &manifest["spec"];
    assert_eq!(spec["version"].as_str(), Some(format!("v{version}").as_str()));
    let platforms = spec["platforms"].as_sequence().expect("platforms");
    assert_eq!(platforms.len(), sums.len());
    for (platform, (arch, archive, sum)) in platforms.iter().zip(&sums) {
        assert_eq!(platform["selector"]["matchLabels"]["os"], "linux");
        assert_eq!(platform["selector"]["matchLabels"]["arch"], *arch);
        let uri =
            format!("https://github.com/OWNER/kube-svm/releases/download/v{version}/{archive}");
        assert_eq!(platform["uri"].as_str(), Some(uri.as_str()));
        assert_eq!(platform["sha256"].as_str(), Some(sum.as_str()));
        assert_eq!(platform["bin"], "kube-svm");
    }

    fs::remove_file(dist.path().join(&sums[1].1)).expect("removed");
    let output = krew_manifest(version, dist.path());
    assert!(!output.status.success(), "a manifest without the arm64 archive was printed");
}
