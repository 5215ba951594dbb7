//! `dtlto-reapi serve`: a small, real REAPI v2 server for tests, CI and single-machine use.

use clap::Args;

/// Options of `dtlto-reapi serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on: HOST:PORT or unix:///PATH.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
}

/// Runs the server until SIGINT or SIGTERM.
pub fn run(_args: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("serve is not implemented yet")
}
