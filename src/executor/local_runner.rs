//! Local compiles as a step of a job's run: at most `--jobs` at once whatever the run's overall
//! concurrency (remote modes run many more jobs at once than this machine has cores), each one's end
//! turned into an [`Outcome`]; and the ActionResult that stands for a local compile in the caches.

use std::time::{Duration, Instant};

use bazel_remote_apis::build::bazel::remote::execution::v2::{
    ActionResult, ExecutedActionMetadata, OutputFile,
};
use tokio::sync::Semaphore;

use super::context::RunContext;
use super::local::{self, LocalOutcome};
use super::outcome::{self, Outcome};
use super::{child, reaper};
use crate::jobs::Job;
use crate::reapi::Digest;
use crate::stats::{JobRecord, Ran};
use crate::trace;

/// Local compiles, at most `--jobs` at once.
pub struct LocalRunner {
    slots: Semaphore,
    spawner: child::Spawner,
}

impl LocalRunner {
    /// Must be called within the run's runtime (it starts the thread that forks the compiles).
    pub fn new(jobs: usize) -> std::io::Result<LocalRunner> {
        Ok(LocalRunner {
            slots: Semaphore::new(jobs.max(1)),
            spawner: child::Spawner::new(Some(reaper::command()))?,
        })
    }

    /// Runs one job locally and turns the outcome into its record, showing the compiler's output
    /// (which is also returned, for the caches to store).
    pub async fn run(&self, ctx: &RunContext, job: Job) -> (JobRecord, Vec<u8>) {
        let Ok(_slot) = self.slots.acquire().await else {
            let cancelled = Outcome::Cancelled { ran: Ran::Local };
            return outcome::record(ctx, &job, cancelled, Duration::ZERO);
        };
        let started = Instant::now();
        let _phase = trace::phase("local compile");
        ctx.reporter.verbose(|| {
            format!(
                "{}: running locally: {}",
                job.label(),
                ctx.job_file.command(&job).join(" ")
            )
        });
        let ended = local::run_job(&ctx.job_file, &job, &self.spawner, &ctx.cancel).await;
        let wall = started.elapsed();
        let outcome = match ended {
            LocalOutcome::Succeeded { output } => Outcome::Succeeded {
                ran: Ran::Local,
                output,
                remote: None,
            },
            LocalOutcome::Failed {
                exit_code,
                output,
                error,
            } => {
                let reason = match (error, exit_code) {
                    (Some(e), _) => e,
                    (None, Some(code)) => format!("the compiler exited with status {code}"),
                    (None, None) => "the compiler failed".to_owned(),
                };
                Outcome::Failed {
                    ran: Ran::Local,
                    exit_code,
                    reason,
                    output,
                }
            }
            LocalOutcome::Cancelled => Outcome::Cancelled { ran: Ran::Local },
        };
        outcome::record(ctx, &job, outcome, wall)
    }
}

/// The ActionResult of a successful compile that ran here, for the caches to store.
pub(crate) fn local_action_result(outputs: Vec<(String, Digest)>) -> ActionResult {
    ActionResult {
        output_files: outputs
            .into_iter()
            .map(|(path, digest)| OutputFile {
                path,
                digest: Some(digest),
                ..Default::default()
            })
            .collect(),
        exit_code: 0,
        execution_metadata: Some(ExecutedActionMetadata {
            worker: format!("dtlto-reapi local compile ({})", hostname()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// This machine's name, for the worker field of results it stores.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "unknown host".to_owned(), |h| h.trim().to_owned())
}
