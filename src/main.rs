use kube_svm::cli::Cli;
use kube_svm::ops::telemetry;

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse_invocation();
    telemetry::init(&cli.log, cli.command.default_log_level())?;
    cli.run().await
}
