//! `--strategy=racing`: a job the action cache does not have goes to the cluster, and the local
//! compile slots race it; the first complete, verified result wins and the other side is cancelled.
//!
//! A job's race: an action-cache hit ends it before anything runs (a hit never starts local work).
//! On a miss the remote side (upload, Execute, download into staged names) starts at once, and the
//! local side waits for a local slot as a race candidate (`slots` decides which candidate a free
//! slot takes: the one the cluster will most likely finish last). Whichever side first has the
//! job's outputs in place wins; the loser is cancelled — the remote one by dropping its Execute,
//! which sends CancelOperation, the local one by terminating its process group — and its staged
//! files are removed with it. A local winner's result is stored in the action cache (unless
//! `--remote-upload=false`), so the cluster learns it.
//!
//! A remote failure of the compile itself ends the race (a local compile would fail alike); any
//! other remote failure leaves the job to its local side, which then takes the next free slot. A
//! local failure waits for the remote side. And when the cluster keeps failing, the link stops
//! using it (`health.rs`): the rest of the link runs in local mode at once, instead of each job
//! waiting for its own timeouts; when it keeps losing, new jobs still look up its action cache, but
//! a miss compiles locally without a race until the cluster delivers again. The switch, and how
//! many jobs it sent straight to local compiles, is in `--stats-json` (`degraded`) and on the
//! summary line.

use std::time::Instant;

use super::context::RunContext;
use super::local_runner::LocalRunner;
use super::outcome::{self, Outcome};
use super::remote::{RemoteExecutor, RemoteFailure};
use super::slots::{Candidate, Claim, Remote};
use crate::jobs::Job;
use crate::plan::action::ActionSpec;
use crate::reapi::CallContext;
use crate::stats::{JobRecord, Race, Ran, RemoteTimes, ServerTimes, Side, Status};
use crate::trace;

/// How the remote side of a race ended.
enum RemoteEnd {
    Delivered {
        ran: Ran,
        output: Vec<u8>,
        times: Option<RemoteTimes>,
    },
    /// The compiler ran on the cluster and failed.
    CompileFailed { exit_code: i32, output: Vec<u8> },
    /// The cluster could not run it, or the link stopped using the cluster.
    GaveUp(Option<String>),
}

impl RemoteExecutor {
    /// Runs a planned job with `--strategy=racing`.
    pub(super) async fn run_racing(
        &self,
        ctx: &RunContext,
        job: Job,
        spec: &ActionSpec,
        call: &CallContext,
        local: &LocalRunner,
        started: Instant,
    ) -> (JobRecord, Vec<u8>) {
        let health = &self.health;
        if health.failed.is_cancelled() {
            return health.run_locally(ctx, job, local).await;
        }
        // The action cache first, also while the cluster keeps losing (its cache works, its
        // executions lag): a hit never starts local work.
        let lookup = tokio::select! {
            found = self.lookup(&job, spec, call) => found,
            () = ctx.cancel.cancelled() => {
                let cancelled = Outcome::Cancelled { ran: Ran::ActionCache };
                return outcome::record(ctx, &job, cancelled, started.elapsed());
            }
            () = health.failed.cancelled() => Ok(None),
        };
        match lookup {
            Ok(Some(result)) => {
                let output = ctx
                    .cancel
                    .run_until_cancelled(self.stderr_of(&result, call))
                    .await
                    .unwrap_or_default();
                let hit = Outcome::Succeeded {
                    ran: Ran::ActionCache,
                    output,
                    remote: result
                        .execution_metadata
                        .as_ref()
                        .map(|meta| ServerTimes::of(meta).remote_times()),
                };
                return outcome::record(ctx, &job, hit, started.elapsed());
            }
            Ok(None) => {}
            Err(RemoteFailure::Compile { .. }) => {}
            Err(RemoteFailure::Infrastructure(reason) | RemoteFailure::Other(reason)) => {
                health.remote_failed(ctx, &reason);
            }
        }
        if health.failed.is_cancelled() {
            return health.run_locally(ctx, job, local).await;
        }
        if health.losing() {
            // No race: a local compile, stored as a local winner's result is.
            let (record, output) = health.run_locally(ctx, job, local).await;
            if record.status == Status::Succeeded {
                self.store_local_result(ctx, spec, &output, call).await;
            }
            return (record, output);
        }
        self.race(ctx, job, spec, call, local, started).await
    }

    /// The race proper, after an action-cache miss; a local winner's result is stored in the
    /// action cache once both sides are gone (the loser may hold shared uploads).
    async fn race(
        &self,
        ctx: &RunContext,
        job: Job,
        spec: &ActionSpec,
        call: &CallContext,
        local: &LocalRunner,
        started: Instant,
    ) -> (JobRecord, Vec<u8>) {
        let sent = Instant::now();
        let (end, race) = self.contest(ctx, &job, spec, call, local).await;
        trace::phase_since(
            "race",
            sent,
            serde_json::to_value(&race).unwrap_or_default(),
        );
        let local_won = race.winner == Some(Side::Local);
        let (record, output) = outcome::record(ctx, &job, end, started.elapsed());
        if local_won {
            self.store_local_result(ctx, spec, &output, call).await;
        }
        with_race((record, output), race)
    }

    /// Both sides of the race until one wins (or neither can); the loser is cancelled before this
    /// returns, and dropped with it.
    async fn contest(
        &self,
        ctx: &RunContext,
        job: &Job,
        spec: &ActionSpec,
        call: &CallContext,
        local: &LocalRunner,
    ) -> (Outcome, Race) {
        let health = &self.health;
        let size = std::fs::metadata(job.module()).map_or(0, |m| m.len());
        let candidate = Candidate::new(size);
        let sent = Instant::now();
        let remote_side = async {
            let executing = || candidate.set(Remote::Executing);
            tokio::select! {
                ended = self.execute(job, spec, call, executing) => match ended {
                    Ok((ran, result, times)) => RemoteEnd::Delivered {
                        ran,
                        output: self.stderr_of(&result, call).await,
                        times: times.as_ref().map(ServerTimes::remote_times),
                    },
                    Err(RemoteFailure::Compile { exit_code, stderr }) => RemoteEnd::CompileFailed {
                        exit_code,
                        output: stderr,
                    },
                    Err(RemoteFailure::Infrastructure(reason) | RemoteFailure::Other(reason)) => {
                        RemoteEnd::GaveUp(Some(reason))
                    }
                },
                () = health.failed.cancelled() => RemoteEnd::GaveUp(None),
            }
        };
        let local_cancel = ctx.cancel.child_token();
        let local_side = local.compile(ctx, job, Claim::Race(candidate.clone()), &local_cancel);
        tokio::pin!(remote_side, local_side);

        let mut race = Race::default();
        // A local failure waits for the remote side; a remote one for the local side.
        let mut local_failed: Option<Outcome> = None;
        let (mut remote_done, mut local_done) = (false, false);
        let end = loop {
            tokio::select! {
                ended = &mut remote_side, if !remote_done => {
                    remote_done = true;
                    race.remote_ms = Some(millis(sent.elapsed()));
                    match ended {
                        RemoteEnd::Delivered { ran, output, times } => {
                            health.remote_delivered();
                            race.winner = Some(Side::Remote);
                            break Outcome::Succeeded { ran, output, remote: times };
                        }
                        RemoteEnd::CompileFailed { exit_code, output } => {
                            break Outcome::Failed {
                                ran: Ran::Remote,
                                exit_code: Some(exit_code),
                                reason: format!(
                                    "the compiler exited with status {exit_code} on the cluster"
                                ),
                                output,
                            };
                        }
                        RemoteEnd::GaveUp(reason) => {
                            candidate.set(Remote::GaveUp);
                            let Some(reason) = reason else {
                                // The link stopped using the cluster: the local side goes on.
                                if let Some(failed) = local_failed.take() {
                                    break failed;
                                }
                                continue;
                            };
                            tracing::warn!(job = %job.label(), %reason, "racing: the cluster cannot run a job");
                            health.remote_failed(ctx, &reason);
                            if let Some(failed) = local_failed.take() {
                                break failed;
                            }
                            if !self.local_fallback {
                                break Outcome::Failed {
                                    ran: Ran::Remote,
                                    exit_code: None,
                                    reason,
                                    output: Vec::new(),
                                };
                            }
                            let text = format!(
                                "remote execution failed ({reason}); such jobs compile locally"
                            );
                            ctx.reporter.warn_once("infrastructure", &text);
                        }
                    }
                }
                ended = &mut local_side, if !local_done => {
                    local_done = true;
                    let Some((ended, wall)) = ended else {
                        // Interrupted before it had a slot.
                        break Outcome::Cancelled { ran: Ran::Local };
                    };
                    race.local_ms = Some(millis(wall));
                    match ended {
                        Outcome::Succeeded { .. } => {
                            if !remote_done {
                                // Dropping the remote side below cancels its operation.
                                race.remote_ms = Some(millis(sent.elapsed()));
                                health.local_won(ctx);
                            }
                            race.winner = Some(Side::Local);
                            break ended;
                        }
                        // The cluster may still deliver: the local failure may be this machine's.
                        Outcome::Failed { .. } if !remote_done => local_failed = Some(ended),
                        _ => break ended,
                    }
                }
                // An interrupt ends a local side by itself; a local side that already failed
                // leaves the remote one to stop here.
                () = ctx.cancel.cancelled(), if local_done => {
                    break Outcome::Cancelled { ran: Ran::Remote };
                }
            }
        };
        // The loser: a local compile still running is terminated (its process group, its staged
        // files) and waited for; the remote side is dropped with this function.
        if !local_done {
            local_cancel.cancel();
            if let Some((_, wall)) = local_side.await {
                race.local_ms = Some(millis(wall));
            }
        }
        if !remote_done {
            race.remote_ms = Some(millis(sent.elapsed()));
        }
        (end, race)
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A job's record with its race.
fn with_race((mut record, output): (JobRecord, Vec<u8>), race: Race) -> (JobRecord, Vec<u8>) {
    record.race = Some(race);
    (record, output)
}
