//! The async runtime the commands that do I/O run on (a link, `check`), started in one place so
//! that a failure to start it reads the same everywhere.

/// The async runtime of a command; `None` (after printing why) when it cannot start.
pub fn runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| eprintln!("dtlto-reapi: error: cannot start the async runtime: {e}"))
        .ok()
}
