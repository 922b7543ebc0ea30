use kube_svm::{cli::Cli, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse_invocation();
    telemetry::init(&cli.log)?;
    cli.run().await
}
