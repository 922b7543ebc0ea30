//! kube-svm's probe, as the controller's gentle pace runs it (quiet windows included), sent by
//! the bench while it measures something else: what the probe reads there, and what it costs.

use std::sync::Arc;
use std::time::Duration;

use kube_svm::api::Budget;
use kube_svm::engine;

use crate::support::CONTROLLER_NAMESPACE;

/// The probe, running. A write is admitted every second and none is sent, too seldom to wait on
/// the rate: the rate stays, and the probe's p99 is that of the last minute.
pub struct Probe {
    gate: Arc<engine::Foreground>,
    admitting: tokio::task::JoinHandle<()>,
}

impl Probe {
    /// Starts the probe as the controller's ServiceAccount (`account`), on the chart's ConfigMap,
    /// against `budget`.
    pub fn start(account: &kube::Config, budget: Budget, params: engine::ProbeParams) -> Probe {
        let metrics = Arc::new(kube_svm::ops::metrics::Metrics::new().expect("metrics"));
        let gate = Arc::new(engine::Foreground::new(
            account.clone(),
            Some(CONTROLLER_NAMESPACE),
            budget,
            params,
            metrics,
        ));
        let admitting = {
            let gate = gate.clone();
            tokio::spawn(async move {
                loop {
                    drop(gate.admit(None).await);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            })
        };
        Probe { gate, admitting }
    }

    /// Stops the probe; what it saw.
    pub fn stop(self) -> engine::Steered {
        self.admitting.abort();
        self.gate.seen()
    }
}
