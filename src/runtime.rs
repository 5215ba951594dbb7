//! The async runtime the commands that do I/O run on (a link, `check`), started in one place so
//! that a failure to start it reads the same everywhere.

use std::sync::atomic::{AtomicBool, Ordering};

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

/// Whether an async thread is running work of [`run_cpu`] now.
static CPU_WORK_INLINE: AtomicBool = AtomicBool::new(false);

/// Runs CPU-bound `work` of one job (planning it, writing its object): on the calling async thread
/// when no other such work runs on one, on the blocking pool otherwise. None if `work` panicked
/// (as a task on the blocking pool would report it).
///
/// A trip to the blocking pool and back is two thread wake-ups; in a cold remote link, where a job
/// is planned only as another ends, they were about a tenth of a job's CPU. When such work piles up
/// (an all-hit relink plans hundreds of jobs at once), the pool spreads it over every core, and at
/// most one async thread is busy with it, so that the calls' I/O goes on.
pub async fn run_cpu<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    if CPU_WORK_INLINE.swap(true, Ordering::Acquire) {
        return tokio::task::spawn_blocking(work).await.ok();
    }
    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
    CPU_WORK_INLINE.store(false, Ordering::Release);
    done.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which thread `run_cpu` ran its work on.
    async fn thread_of_work() -> std::thread::ThreadId {
        run_cpu(|| std::thread::current().id()).await.unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn cpu_work_runs_inline_unless_other_work_does() {
        let here = std::thread::current().id();
        assert_eq!(thread_of_work().await, here, "alone: inline");
        // Work of another job runs inline: this one goes to the blocking pool.
        CPU_WORK_INLINE.store(true, Ordering::Release);
        assert_ne!(thread_of_work().await, here, "beside other work: the pool");
        CPU_WORK_INLINE.store(false, Ordering::Release);
        // Work that panics is reported as such, and leaves the place free.
        assert!(run_cpu(|| panic!("a planning bug")).await.is_none());
        assert_eq!(thread_of_work().await, here, "after a panic: inline again");
    }
}
