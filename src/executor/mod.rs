//! Execution: runs every job of a link through a mode's per-job runner, with bounded concurrency,
//! biggest module first, stopping new work after the first failure (unless `--keep-going`) and
//! stopping everything when the link is cancelled.

pub mod local;
pub mod remote;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::jobs::{Job, JobFile};
use crate::report::{JobRecord, Ran, Reporter, Status};

/// What every job of a run shares.
pub struct RunContext {
    pub job_file: Arc<JobFile>,
    pub reporter: Arc<Reporter>,
    /// Cancelled on SIGINT/SIGTERM, and on the first failure unless `keep_going`.
    pub cancel: CancellationToken,
    pub keep_going: bool,
}

/// Runs `run_one` for every job, at most `concurrency` at once, biggest module first (the longest
/// compiles start early, so the link does not wait on one straggler at the end). Returns true when
/// every job succeeded.
pub async fn run_all<F, Fut>(ctx: &RunContext, concurrency: usize, run_one: F) -> bool
where
    F: Fn(Job) -> Fut,
    Fut: Future<Output = JobRecord>,
{
    let failed = AtomicBool::new(false);
    let order = biggest_first(&ctx.job_file.jobs);
    let run_one = &run_one;
    let failed_ref = &failed;
    futures::stream::iter(order)
        .map(|job| async move {
            // After an interrupt, or a failure without --keep-going, no new job starts.
            if ctx.cancel.is_cancelled() {
                return JobRecord::new(&job, Status::NotStarted, Ran::NotStarted, Duration::ZERO);
            }
            let record = run_one(job).await;
            if record.status == Status::Failed {
                failed_ref.store(true, Ordering::Relaxed);
                // The link has failed: abandon the work in flight too, so lld hears it at once.
                if !ctx.keep_going {
                    ctx.cancel.cancel();
                }
            }
            record
        })
        .buffer_unordered(concurrency.max(1))
        .for_each(|record| {
            ctx.reporter.finish_job(record);
            async {}
        })
        .await;
    !failed.load(Ordering::Relaxed) && !ctx.cancel.is_cancelled()
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

/// Runs one job locally and turns the outcome into its record, showing the compiler's output (which
/// is also returned, for cache-only mode to store).
pub async fn run_local_job(ctx: &RunContext, job: Job) -> (JobRecord, Vec<u8>) {
    let started = Instant::now();
    ctx.reporter.verbose(|| {
        format!(
            "{}: running locally: {}",
            job.label(),
            ctx.job_file.command(&job).join(" ")
        )
    });
    let outcome = local::run_job(&ctx.job_file, &job, &ctx.cancel).await;
    let wall = started.elapsed();
    match outcome {
        local::LocalOutcome::Succeeded { output } => {
            ctx.reporter.diagnostics(&job, &output, false);
            let mut record = JobRecord::new(&job, Status::Succeeded, Ran::Local, wall);
            record.exit_code = Some(0);
            (record, output)
        }
        local::LocalOutcome::Failed {
            exit_code,
            output,
            error,
        } => {
            ctx.reporter.diagnostics(&job, &output, true);
            let reason = match (&error, exit_code) {
                (Some(e), _) => e.clone(),
                (None, Some(code)) => format!("the compiler exited with status {code}"),
                (None, None) => "the compiler failed".to_owned(),
            };
            ctx.reporter.error(&format!("{}: {reason}", job.label()));
            let mut record = JobRecord::new(&job, Status::Failed, Ran::Local, wall);
            record.exit_code = exit_code;
            record.error = Some(reason);
            (record, output)
        }
        local::LocalOutcome::Cancelled => (
            JobRecord::new(&job, Status::Cancelled, Ran::Local, wall),
            Vec::new(),
        ),
    }
}
