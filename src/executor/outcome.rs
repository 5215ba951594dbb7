//! The one place where how a job ended becomes its `--stats-json` record and the lines the user
//! sees: the compiler's diagnostics, and the error line of a failure.
//!
//! Every way of running a job (a local compile, the disk cache, the action cache, the cluster) ends
//! in an [`Outcome`], so that a job reports the same way whichever ran it.

use std::time::Duration;

use super::context::RunContext;
use crate::jobs::Job;
use crate::stats::{JobRecord, Ran, RemoteTimes, Status};

/// How one job ended.
pub(crate) enum Outcome {
    /// Its outputs are in place; `output` is what the compiler printed.
    Succeeded {
        ran: Ran,
        output: Vec<u8>,
        /// The cluster's account of the execution, when it ran there.
        remote: Option<RemoteTimes>,
    },
    /// It failed: the compiler's exit code when it ran to an end, and why.
    Failed {
        ran: Ran,
        exit_code: Option<i32>,
        reason: String,
        output: Vec<u8>,
    },
    /// The link was interrupted, or failed elsewhere, while it ran.
    Cancelled { ran: Ran },
    /// It never started (an earlier failure, or an interrupt).
    NotStarted,
}

/// Shows what the job printed (and its error line, when it failed) and returns its record, with the
/// compiler's output for the caches to store.
pub(crate) fn record(
    ctx: &RunContext,
    job: &Job,
    outcome: Outcome,
    wall: Duration,
) -> (JobRecord, Vec<u8>) {
    match outcome {
        Outcome::Succeeded {
            ran,
            output,
            remote,
        } => {
            ctx.reporter.diagnostics(job, &output, false);
            let mut record = JobRecord::new(job, Status::Succeeded, ran, wall);
            record.exit_code = Some(0);
            record.remote = remote;
            (record, output)
        }
        Outcome::Failed {
            ran,
            exit_code,
            reason,
            output,
        } => {
            ctx.reporter.diagnostics(job, &output, true);
            ctx.reporter.error(&format!("{}: {reason}", job.label()));
            let mut record = JobRecord::new(job, Status::Failed, ran, wall);
            record.exit_code = exit_code;
            record.error = Some(reason);
            (record, output)
        }
        Outcome::Cancelled { ran } => (
            JobRecord::new(job, Status::Cancelled, ran, wall),
            Vec::new(),
        ),
        Outcome::NotStarted => (
            JobRecord::new(job, Status::NotStarted, Ran::NotStarted, wall),
            Vec::new(),
        ),
    }
}
