//! The async runtime the commands that do I/O run on (a link, `check`), started in one place so
//! that a failure to start it reads the same everywhere.

use std::sync::atomic::{AtomicUsize, Ordering};

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

/// Work of [`run_cpu`] running now, inline or on the blocking pool.
static CPU_WORK: AtomicUsize = AtomicUsize::new(0);

/// Counts one piece of [`run_cpu`] work until dropped (also when the work panics).
struct CpuWork;

impl CpuWork {
    /// Counts it; true if no other work was running.
    fn start() -> (CpuWork, bool) {
        (CpuWork, CPU_WORK.fetch_add(1, Ordering::AcqRel) == 0)
    }
}

impl Drop for CpuWork {
    fn drop(&mut self) {
        CPU_WORK.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs CPU-bound `work` of one job (planning it, writing its object): on the calling async thread
/// when no other such work is running, on the blocking pool otherwise. None if `work` panicked (as
/// a task on the blocking pool would report it).
///
/// A trip to the blocking pool and back is two thread wake-ups; in a cold remote link, where a job
/// is planned only as another ends, they were about a tenth of a job's CPU. When such work piles up
/// (an all-hit relink plans hundreds of jobs at once), all of it goes to the pool, which spreads
/// it over every core, and the async threads are left to the calls' I/O.
pub async fn run_cpu<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (counted, alone) = CpuWork::start();
    if !alone {
        let work = move || {
            let _counted = counted;
            work()
        };
        return tokio::task::spawn_blocking(work).await.ok();
    }
    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
    drop(counted);
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
        // Work of another job is running: this one goes to the blocking pool.
        let other = CpuWork::start();
        assert_ne!(thread_of_work().await, here, "beside other work: the pool");
        drop(other);
        // Work that panics is reported as such, and leaves the place free.
        assert!(run_cpu(|| panic!("a planning bug")).await.is_none());
        assert_eq!(thread_of_work().await, here, "after a panic: inline again");
    }
}
