//! The async runtime the commands that do I/O run on (a link, `check`), started in one place so
//! that a failure to start it reads the same everywhere.

/// Threads of the blocking pool per core: enough to overlap file I/O with hashing and compression.
const BLOCKING_THREADS_PER_CORE: usize = 4;

/// The async runtime of a command; `None` (after printing why) when it cannot start.
pub fn runtime() -> Option<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    tokio::runtime::Builder::new_multi_thread()
        // The blocking pool runs short file and compression work, never a wait; tokio's default
        // of up to 512 threads made a new thread, with its own malloc arena, for nearly every
        // job of a link whose jobs upload at once — CPU and memory taken from the compiles.
        .max_blocking_threads(BLOCKING_THREADS_PER_CORE * cores)
        .enable_all()
        .build()
        .map_err(|e| eprintln!("dtlto-reapi: error: cannot start the async runtime: {e}"))
        .ok()
}
