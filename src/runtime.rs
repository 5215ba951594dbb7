//! The async runtime the commands that do I/O run on (a link, `check`), started in one place so
//! that a failure to start it reads the same everywhere.

/// Threads of the blocking pool per core: enough to overlap file I/O with hashing and compression.
const BLOCKING_THREADS_PER_CORE: usize = 4;

/// The async runtime of a command; `None` (after printing why) when it cannot start.
pub fn runtime() -> Option<tokio::runtime::Runtime> {
    let cores = crate::settings::available_cores();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        // The blocking pool runs short file and compression work, never a wait; tokio's default
        // of up to 512 threads made a new thread, with its own malloc arena, for nearly every
        // job of a link whose jobs upload at once — CPU and memory taken from the compiles.
        .max_blocking_threads(BLOCKING_THREADS_PER_CORE * cores)
        .enable_all()
        .build()
        .map_err(|e| eprintln!("dtlto-reapi: error: cannot start the async runtime: {e}"))
        .ok()
}

/// Work on at most this many bytes runs on the async thread that has it (see [`run_sized`]).
pub const SMALL_WORK_BYTES: u64 = 64 << 10;

/// Runs `work`, which reads, hashes, compresses or writes about `bytes` bytes: on the calling
/// async thread when that is at most [`SMALL_WORK_BYTES`], on the blocking pool otherwise.
///
/// A trip to the blocking pool and back is two thread wake-ups, and each can wait for a core: in a
/// racing relink, preparing a 9 KB object's upload took 0.2–0.45 ms that way, and `serve`'s hop
/// for storing it about 0.2 ms more, while 64 KiB of such work takes tens of microseconds.
pub async fn run_sized<T: Send + 'static>(
    bytes: u64,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if bytes <= SMALL_WORK_BYTES {
        Ok(work())
    } else {
        tokio::task::spawn_blocking(work).await
    }
}
