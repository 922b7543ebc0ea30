//! Running the process: Prometheus series ([`metrics`]), the admin HTTP server with `/metrics`,
//! `/healthz` and `/readyz` ([`server`]), and logging ([`telemetry`]).

pub mod metrics;
pub mod server;
pub mod telemetry;
