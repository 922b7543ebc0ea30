//! Where a test starts: a control plane with kube-svm's CRDs installed and a client for it.
//!
//! Most tests begin the same way: a control plane (the shared one, or one of their own with other
//! flags or an audit log), a client, and kube-svm's CRDs. [`Scenario`] is that beginning, said
//! once.

use kube::Client;

use super::ControlPlane;
use super::fixtures::install_kube_svm_crds;

/// A control plane, a client of it, and kube-svm's CRDs installed.
pub struct Scenario<P> {
    /// The control plane: owned by the test, or the shared one.
    pub control_plane: P,
    /// An admin client of it.
    pub client: Client,
}

impl Scenario<ControlPlane> {
    /// A control plane of the test's own, started with these apiserver flags.
    pub async fn own(flags: &[&str]) -> Scenario<ControlPlane> {
        let control_plane = ControlPlane::start(flags).await.expect("control plane");
        Scenario::ready(control_plane).await
    }

    /// A control plane of the test's own that keeps an audit log of every write.
    pub async fn audited(flags: &[&str]) -> Scenario<ControlPlane> {
        let control_plane = ControlPlane::start_audited(flags).await.expect("control plane");
        Scenario::ready(control_plane).await
    }

    async fn ready(control_plane: ControlPlane) -> Scenario<ControlPlane> {
        let client = control_plane.client().await;
        install_kube_svm_crds(&client).await;
        Scenario { control_plane, client }
    }
}

impl Scenario<&'static ControlPlane> {
    /// The control plane every test of this binary shares (tests isolate themselves by names).
    pub async fn shared() -> Scenario<&'static ControlPlane> {
        let control_plane = super::shared().await;
        let client = control_plane.client().await;
        install_kube_svm_crds(&client).await;
        Scenario { control_plane, client }
    }
}
