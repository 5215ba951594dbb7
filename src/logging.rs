//! Logs for finding out why a link was slow or fell back: `tracing` events for retries (the status
//! code and the delay), local fallbacks, remote execution stages and disk-cache problems, written to
//! stderr. Off by default; `--verbose` shows the distributor's own events from `debug` up, and
//! `RUST_LOG` (e.g. `RUST_LOG=dtlto_reapi=trace` or `RUST_LOG=info`) chooses any filter, including
//! other crates' events (tonic, h2).
//!
//! The user-facing messages (errors, one warning per cause, the summary) do not go through here:
//! the reporter prints them whatever the filter.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// Installs the subscriber for this process: `RUST_LOG` when set, else the distributor's own debug
/// events when `verbose`, else nothing (events then cost next to nothing). A `RUST_LOG` that does
/// not parse is reported once and ignored.
pub fn init(verbose: bool) {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => match EnvFilter::try_new(&directives) {
            Ok(filter) => filter,
            Err(e) => {
                eprintln!("dtlto-reapi: warning: ignoring RUST_LOG={directives:?}: {e}");
                return;
            }
        },
        _ if verbose => EnvFilter::new("dtlto_reapi=debug"),
        _ => return,
    };
    // Fails only when a subscriber is already installed (a second run in one process): keep it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
