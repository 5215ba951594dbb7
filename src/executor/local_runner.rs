//! Local compiles as a step of a job's run: at most `--jobs` at once whatever the run's overall
//! concurrency (remote modes run many more jobs at once than this machine has cores), handed out by
//! `slots` (compiles that must run first, then races), each one's end turned into an [`Outcome`]; and the ActionResult that stands for a local compile in the caches.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bazel_remote_apis::build::bazel::remote::execution::v2::{
    ActionResult, ExecutedActionMetadata, OutputFile,
};
use tokio_util::sync::CancellationToken;

use super::child;
use super::context::RunContext;
use super::local::{self, LocalOutcome, LocalSetup};
use super::outcome::{self, Outcome};
use super::slots::{Claim, Slots};
use crate::jobs::Job;
use crate::reapi::Digest;
use crate::stats::{JobRecord, Ran};
use crate::trace;

/// Local compiles, at most `--jobs` at once; `slots` decides which waiting compile goes next.
pub struct LocalRunner {
    slots: Arc<Slots>,
    setup: LocalSetup,
    spawner: child::Spawner,
}

impl LocalRunner {
    /// Must be called within the run's runtime (it starts the thread that forks the compiles).
    pub fn new(jobs: usize, setup: LocalSetup) -> std::io::Result<LocalRunner> {
        Ok(LocalRunner {
            slots: Slots::new(jobs),
            setup,
            spawner: child::Spawner::new(reaper())?,
        })
    }

    /// Runs one job locally and turns the outcome into its record, showing the compiler's output
    /// (which is also returned, for the caches to store).
    pub async fn run(&self, ctx: &RunContext, job: Job) -> (JobRecord, Vec<u8>) {
        match self.compile(ctx, &job, Claim::Needed, &ctx.cancel).await {
            Some((ended, wall)) => outcome::record(ctx, &job, ended, wall),
            None => {
                let cancelled = Outcome::Cancelled { ran: Ran::Local };
                outcome::record(ctx, &job, cancelled, Duration::ZERO)
            }
        }
    }

    /// Compiles one job locally once a slot is free for `claim`, stopping when `cancel` is
    /// cancelled: how it ended and how long the compile ran, or None when it was cancelled before
    /// it had a slot. Nothing is shown: the caller decides what the outcome means.
    pub(super) async fn compile(
        &self,
        ctx: &RunContext,
        job: &Job,
        claim: Claim,
        cancel: &CancellationToken,
    ) -> Option<(Outcome, Duration)> {
        let _slot = tokio::select! {
            slot = self.slots.take(claim) => slot?,
            () = cancel.cancelled() => return None,
        };
        let started = Instant::now();
        let _phase = trace::phase("local compile");
        ctx.reporter.verbose(|| {
            format!(
                "{}: running locally: {}",
                job.label(),
                ctx.job_file.command(job).join(" ")
            )
        });
        let ended = local::run_job(&ctx.job_file, job, &self.setup, &self.spawner, cancel).await;
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
        Some((outcome, wall))
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
            worker: local_worker_name().to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The worker field of a local result: this machine's name, read once per run.
fn local_worker_name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        format!(
            "dtlto-reapi local compile ({})",
            crate::platform::hostname()
        )
    })
}

/// How to start the reaper of local compiles: on Unix only (on Windows, each compile's Job Object
/// does its work, see `child`).
fn reaper() -> Option<std::process::Command> {
    #[cfg(unix)]
    return Some(super::reaper::command());
    #[cfg(windows)]
    return None;
}
