//! Logging setup: `tracing` with plain or JSON output, level from `--log-level` or `RUST_LOG`.

use std::io::IsTerminal;

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Logging flags shared by every subcommand.
#[derive(Args, Clone, Debug)]
pub struct LogArgs {
    /// Log line format.
    #[arg(long, env = "KUBE_SVM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain, global = true)]
    pub log_format: LogFormat,

    /// Log filter, in `RUST_LOG` syntax (for example `info` or `kube_svm=debug,kube=info`);
    /// `info` for the controller, `warn` for the commands a person runs.
    #[arg(long, env = "RUST_LOG", global = true)]
    pub log_level: Option<String>,
}

/// The filter for `level`: kube's client logs every failed request at ERROR, and kube-svm says
/// what failed itself (an outage once, see [`crate::apiserver::reachability`]), so those lines are shown
/// only when asked for: when everything is logged at debug or trace, or the filter names
/// `kube_client` (or `kube`).
fn directives(level: &str) -> String {
    let asked = level.split(',').map(str::trim).any(|directive| {
        matches!(directive, "debug" | "trace")
            || directive.starts_with("kube_client")
            || directive.starts_with("kube=")
    });
    match asked {
        true => level.to_owned(),
        false => format!("{level},kube_client=off"),
    }
}

/// Installs the global subscriber; logs go to standard error so standard output stays for data.
/// `default_level` applies when no level was given.
pub fn init(
    args: &LogArgs,
    default_level: &str,
) -> Result<(), tracing_subscriber::filter::ParseError> {
    let LogArgs { log_format, log_level } = args;
    let filter = EnvFilter::try_new(directives(log_level.as_deref().unwrap_or(default_level)))?;
    // Colours only for a person at a terminal, never in files, pipes or log collectors.
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match log_format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubes_client_lines_show_only_when_asked_for() {
        assert_eq!(directives("info"), "info,kube_client=off");
        assert_eq!(directives("info,kube_svm=debug"), "info,kube_svm=debug,kube_client=off");
        assert_eq!(directives("debug"), "debug");
        assert_eq!(directives("warn,kube_client=info"), "warn,kube_client=info");
    }
}
