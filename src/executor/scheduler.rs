//! The scheduler: runs every job of a link with bounded concurrency, biggest module first, stopping
//! everything at the first failure (unless `--keep-going`) or when the link is interrupted.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::context::RunContext;
use super::outcome::{self, Outcome};
use crate::jobs::Job;
use crate::stats::{JobRecord, Status};
use crate::trace;

/// Runs `run_one` for every job, at most `concurrency` at once, biggest module first (the longest
/// compiles start early, so the link does not wait on one straggler at the end). Each job is a task
/// of its own, so planning, hashing and file I/O of many jobs use every core. Returns true when
/// every job succeeded.
pub async fn run_all<F, Fut>(ctx: &RunContext, concurrency: usize, run_one: F) -> bool
where
    F: Fn(Job) -> Fut,
    Fut: Future<Output = JobRecord> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = JoinSet::new();
    let mut succeeded = true;
    // Ordering stats every module: blocking work.
    let job_file = ctx.job_file.clone();
    let jobs = match tokio::task::spawn_blocking(move || biggest_first(&job_file.jobs)).await {
        Ok(jobs) => jobs,
        Err(e) => {
            ctx.reporter
                .error(&format!("internal error: ordering the jobs failed: {e}"));
            return false;
        }
    };
    let mut finish = |joined: Result<JobRecord, tokio::task::JoinError>| match joined {
        Ok(record) => {
            succeeded &= record.status == Status::Succeeded;
            ctx.reporter.finish_job(record);
        }
        Err(e) => {
            succeeded = false;
            ctx.reporter
                .error(&format!("internal error: a job's task failed: {e}"));
        }
    };
    for job in jobs {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        while let Some(joined) = tasks.try_join_next() {
            finish(joined);
        }
        // After an interrupt, or a failure without --keep-going, no new job starts.
        if ctx.cancel.is_cancelled() {
            let (record, _) = outcome::record(ctx, &job, Outcome::NotStarted, Duration::ZERO);
            finish(Ok(record));
            continue;
        }
        let run = trace::Scope::of(ctx.trace.as_ref(), &job).run(run_one(job));
        let (cancel, keep_going) = (ctx.cancel.clone(), ctx.keep_going);
        tasks.spawn(async move {
            let record = run.await;
            // The link has failed: abandon the work in flight too, so lld hears it at once. (Done
            // before the slot is released, so that no new job starts after a failure.)
            if record.status == Status::Failed && !keep_going {
                cancel.cancel();
            }
            drop(slot);
            record
        });
    }
    while let Some(joined) = tasks.join_next().await {
        finish(joined);
    }
    succeeded && !ctx.cancel.is_cancelled()
}

/// The jobs ordered by the size of their module, largest first; ties keep job-file order.
fn biggest_first(jobs: &[Job]) -> Vec<Job> {
    let mut sized: Vec<(u64, &Job)> = jobs
        .iter()
        .map(|job| (std::fs::metadata(job.module()).map_or(0, |m| m.len()), job))
        .collect();
    sized.sort_by_key(|(size, _)| std::cmp::Reverse(*size));
    sized.into_iter().map(|(_, job)| job.clone()).collect()
}
