//! The container image `make image` builds, read as a container runtime reads it, and run as the
//! chart's Deployment runs it.
//!
//! The image is the OCI layout `KUBE_SVM_IMAGE_LAYOUT` names (`make test` builds `target/image/`
//! and points it there). [`Image::open`] follows `index.json` to the one manifest and its config,
//! checking every blob against its digest; [`Image::unpack`] extracts the layers in order into a
//! root filesystem. [`Pod`] starts the image's entrypoint there as a container runtime would: in
//! that root (nothing of the host's filesystem is there: no libraries, no CA certificates, no
//! users), with PID and mount namespaces of its own, `/proc` mounted and the default devices, as
//! the image's user, with the environment and the ServiceAccount files a pod gets, and no
//! kubeconfig.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::ControlPlane;
use super::process::KubeSvm;

/// The OCI layout of the image under test: `KUBE_SVM_IMAGE_LAYOUT`, as `make test` sets it.
pub fn layout() -> PathBuf {
    match std::env::var_os("KUBE_SVM_IMAGE_LAYOUT") {
        Some(path) => Path::new(env!("CARGO_MANIFEST_DIR")).join(path),
        None => panic!(
            "no image: set KUBE_SVM_IMAGE_LAYOUT to an OCI layout (`make test` builds target/image/ with `make image`)"
        ),
    }
}

/// An image of an OCI layout: its manifest and config, read through digests checked.
pub struct Image {
    layout: PathBuf,
    pub manifest: Value,
    pub config: Value,
}

impl Image {
    /// Reads the layout's one image.
    pub fn open(layout: &Path) -> Image {
        let oci_layout = read_json(&layout.join("oci-layout"));
        assert_eq!(oci_layout["imageLayoutVersion"], "1.0.0", "{}", layout.display());
        let index = read_json(&layout.join("index.json"));
        let manifests = index["manifests"].as_array().expect("index.json lists manifests");
        assert_eq!(manifests.len(), 1, "one image in {}: {index}", layout.display());
        let mut image =
            Image { layout: layout.to_owned(), manifest: Value::Null, config: Value::Null };
        image.manifest = image.json_blob(&manifests[0]);
        image.config = image.json_blob(&image.manifest["config"]);
        image
    }

    /// A field of the config's `config`: what a runtime runs, as whom, with which labels.
    pub fn setting(&self, field: &str) -> &Value {
        &self.config["config"][field]
    }

    /// Extracts the layers, in order, into `rootfs`, owners and modes as recorded.
    pub fn unpack(&self, rootfs: &Path) {
        fs::create_dir_all(rootfs).expect("the root directory is created");
        let layers = self.manifest["layers"].as_array().expect("the manifest lists layers");
        for layer in layers {
            let media_type = layer["mediaType"].as_str().unwrap_or_default();
            assert!(
                media_type.ends_with("tar.gzip") || media_type.ends_with("tar+gzip"),
                "a gzipped tar layer: {media_type}"
            );
            let blob = self.blob_path(layer);
            let status = Command::new("tar")
                .args(["--extract", "--gzip", "--numeric-owner", "--same-owner"])
                .args(["--same-permissions", "--file"])
                .arg(&blob)
                .arg("--directory")
                .arg(rootfs)
                .status()
                .expect("tar runs");
            assert!(status.success(), "{} does not extract", blob.display());
        }
    }

    /// The file of the blob `descriptor` names, once its size and digest are checked.
    fn blob_path(&self, descriptor: &Value) -> PathBuf {
        let digest = descriptor["digest"].as_str().expect("a descriptor has a digest");
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        let path = self.layout.join("blobs/sha256").join(hex);
        let bytes = fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        assert_eq!(Some(bytes.len() as u64), descriptor["size"].as_u64(), "size of {digest}");
        let sum: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sum, hex, "the blob {digest} holds what its digest says");
        path
    }

    fn json_blob(&self, descriptor: &Value) -> Value {
        read_json(&self.blob_path(descriptor))
    }
}

fn read_json(path: &Path) -> Value {
    let text = fs::read(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// What a pod of the chart's Deployment gets besides its image.
pub struct Pod<'a> {
    /// The unpacked image.
    pub rootfs: &'a Path,
    /// `uid:gid`, as the image's `User` or the pod's `runAsUser`/`runAsGroup` say.
    pub user: &'a str,
    /// The pod's name (its `POD_NAME`, the Deployment's one variable).
    pub name: &'a str,
    /// The ServiceAccount's namespace and token, mounted where every pod finds them.
    pub namespace: &'a str,
    pub token: &'a str,
}

/// Where a pod finds its ServiceAccount's credentials.
const SERVICE_ACCOUNT_DIR: &str = "var/run/secrets/kubernetes.io/serviceaccount";

impl Pod<'_> {
    /// Starts `command` (the image's entrypoint and the container's args) in the pod, against
    /// `control_plane` as the in-cluster client finds it: `KUBERNETES_SERVICE_HOST` and `_PORT`,
    /// and the ServiceAccount's files.
    pub fn start(&self, control_plane: &ControlPlane, command: &[String]) -> KubeSvm {
        let credentials = self.rootfs.join(SERVICE_ACCOUNT_DIR);
        fs::create_dir_all(&credentials).expect("the ServiceAccount's directory is created");
        fs::copy(control_plane.ca_certificate(), credentials.join("ca.crt")).expect("ca.crt");
        fs::write(credentials.join("token"), self.token).expect("the token is written");
        fs::write(credentials.join("namespace"), self.namespace).expect("the namespace is written");
        for file in ["ca.crt", "token", "namespace"] {
            let readable = fs::Permissions::from_mode(0o644);
            fs::set_permissions(credentials.join(file), readable).expect("made readable");
        }
        // Where the runtime mounts the pod's /proc, and the devices it gives every container
        // (the OCI runtime spec's defaults): kube-svm reads its random seeds from /dev/urandom.
        fs::create_dir_all(self.rootfs.join("proc")).expect("the /proc mount point");
        fs::create_dir_all(self.rootfs.join("dev")).expect("the /dev directory");
        for (device, minor) in
            [("null", 3), ("zero", 5), ("full", 7), ("random", 8), ("urandom", 9)]
        {
            let path = self.rootfs.join("dev").join(device);
            let status = Command::new("mknod")
                .args(["--mode=0666"])
                .arg(&path)
                .args(["c", "1", &minor.to_string()])
                .status()
                .expect("mknod runs");
            assert!(status.success(), "{} is created", path.display());
        }

        let (uid, gid) = self.user.split_once(':').expect("a user as uid:gid");
        // The runtime takes HOME from the image's own /etc/passwd.
        let passwd = fs::read_to_string(self.rootfs.join("etc/passwd")).expect("/etc/passwd");
        let home = passwd
            .lines()
            .map(|line| line.split(':').collect::<Vec<_>>())
            .find(|fields| fields.len() == 7 && fields[2] == uid && fields[3] == gid)
            .map(|fields| fields[5].to_owned())
            .unwrap_or_else(|| panic!("the image's /etc/passwd names no user {uid}:{gid}"));
        let (program, args) = command.split_first().expect("an entrypoint");
        let mut unshare = Command::new("unshare");
        unshare
            .args(["--pid", "--fork", "--kill-child", "--mount-proc"])
            .arg(format!("--root={}", self.rootfs.display()))
            .args([format!("--setgid={gid}"), format!("--setuid={uid}"), "--".into()])
            .arg(program)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", home)
            .env("HOSTNAME", self.name)
            .env("POD_NAME", self.name)
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", control_plane.front_port().to_string());
        let controller = KubeSvm::spawn(control_plane, self.name, unshare);
        control_plane.adopt(controller.pid());
        controller
    }
}
