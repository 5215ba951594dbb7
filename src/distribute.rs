//! One distributor run, from lld's job file to the exit status lld sees: load and validate the job
//! file, pick the mode's runner, run every job, report, and turn SIGINT/SIGTERM/SIGHUP into a
//! prompt, clean, non-zero exit.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use tokio_util::sync::CancellationToken;

use crate::advice;
use crate::executor::remote::RemoteExecutor;
use crate::executor::{self, RunContext, Runner};
use crate::jobs::JobFile;
use crate::platform;
use crate::reapi::ReapiError;
use crate::report::{Reporter, RunTotals};
use crate::settings::{Mode, Settings};
use crate::staging;
use crate::trace::{self, LinkTrack, Trace};

/// Runs every job of `job_file_path` and returns the exit status for lld.
pub fn run(job_file_path: &Path, settings: &Settings) -> ExitCode {
    crate::logging::init(settings.verbose);
    let job_file = match JobFile::load(job_file_path) {
        Ok(file) => Arc::new(file),
        Err(e) => {
            for line in e.to_string().lines() {
                eprintln!("dtlto-reapi: error: {line}");
            }
            return ExitCode::FAILURE;
        }
    };
    let outputs: Vec<&Path> = job_file
        .jobs
        .iter()
        .flat_map(|job| job.outputs.iter().map(PathBuf::as_path))
        .collect();
    staging::remove_leftovers(&outputs);
    match crate::runtime::runtime() {
        Some(runtime) => runtime.block_on(run_jobs(job_file, settings)),
        None => ExitCode::FAILURE,
    }
}

async fn run_jobs(job_file: Arc<JobFile>, settings: &Settings) -> ExitCode {
    let reporter = Arc::new(Reporter::new(
        job_file.jobs.len(),
        settings.quiet,
        settings.verbose,
        settings.stats_json.is_some(),
    ));
    let ctx = RunContext {
        job_file: job_file.clone(),
        reporter: reporter.clone(),
        cancel: CancellationToken::new(),
        keep_going: settings.keep_going,
        trace: settings.trace.is_some().then(Trace::new),
    };
    let signalled = Arc::new(AtomicI32::new(0));
    let watcher = match watch_signals(ctx.cancel.clone(), signalled.clone()) {
        Ok(task) => task,
        Err(e) => {
            reporter.error(&format!("cannot install signal handlers: {e}"));
            return ExitCode::FAILURE;
        }
    };

    // Connecting (with its retries) and hashing the inputs can take a while: an interrupt must
    // not wait for them, and neither waits for the other.
    let connect = async {
        if settings.mode == Mode::Local {
            return Some(Ok(None));
        }
        let _phase = trace::link_phase(ctx.trace.as_ref(), LinkTrack::Connection, "connect");
        let connected = ctx
            .cancel
            .run_until_cancelled(RemoteExecutor::connect(&ctx, settings))
            .await;
        connected.map(|c| c.map(Some))
    };
    let prepare = ctx
        .cancel
        .run_until_cancelled(Runner::prepare(&ctx, settings));
    let (connected, prepared) = tokio::join!(connect, prepare);
    let remote = match connected {
        None => return interrupted(&reporter, &signalled),
        Some(Ok(remote)) => remote,
        // The cluster is down or too slow to answer: the link can still be done here.
        Some(Err(e)) if settings.local_fallback && is_infrastructure(&e) => {
            let error = advice::describe_any(&e);
            tracing::warn!(%error, "cannot connect: every job falls back to a local compile");
            let text = format!("{error}; falling back to local compiles");
            reporter.warn_once("infrastructure", &text);
            None
        }
        Some(Err(e)) => {
            reporter.error(&advice::describe_any(&e));
            return ExitCode::FAILURE;
        }
    };
    let prepared = match prepared {
        None => return interrupted(&reporter, &signalled),
        Some(Ok(prepared)) => prepared,
        Some(Err(e)) => {
            reporter.error(&format!("{e:#}"));
            return ExitCode::FAILURE;
        }
    };
    let runner = Runner::new(&ctx, settings, prepared, remote);
    let runner = Arc::new(runner);
    let concurrency = runner.concurrency(settings);
    let succeeded = executor::run_all(&ctx, concurrency, |job| {
        let (runner, ctx) = (runner.clone(), ctx.clone());
        async move { runner.run_job(&ctx, job).await }
    })
    .await;
    {
        // Saving the digest cache, waiting for cancellations: what a link does after its last job.
        let _phase = trace::link_phase(ctx.trace.as_ref(), LinkTrack::Link, "finish");
        runner.finish(&ctx).await;
    }
    let transfers = runner.transfers();
    let toolchain = runner.toolchain();
    let inputs = runner.input_hashing();
    let degraded = runner.degraded();
    watcher.abort();

    let mode = serde_json::to_value(settings.mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned));
    let stats_json = settings.stats_json.as_deref();
    let totals = RunTotals {
        mode: mode.as_deref().unwrap_or("?"),
        transfers,
        toolchain,
        inputs,
        degraded,
    };
    if let Err(e) = reporter.finish(&job_file.path, &totals, stats_json) {
        reporter.error(&format!("cannot write --stats-json: {e}"));
        return ExitCode::FAILURE;
    }
    if let (Some(trace), Some(path)) = (&ctx.trace, &settings.trace) {
        let path = crate::report::per_link_file(path, &job_file.path, "trace");
        if let Err(e) = trace.write(&path) {
            reporter.error(&format!("cannot write --trace {}: {e}", path.display()));
            return ExitCode::FAILURE;
        }
    }
    match signalled.load(Ordering::Relaxed) {
        0 if succeeded => ExitCode::SUCCESS,
        0 => ExitCode::FAILURE,
        _ => interrupted(&reporter, &signalled),
    }
}

/// The exit status after SIGINT/SIGTERM/SIGHUP: 128 + the signal, as a shell reports it (on
/// Windows, 128 + the number the C runtime gives the console event: 130 for Ctrl-C).
fn interrupted(reporter: &Reporter, signalled: &AtomicI32) -> ExitCode {
    let signo = signalled.load(Ordering::Relaxed);
    reporter.error(&format!(
        "interrupted by {}; no partial outputs were left",
        platform::describe_interrupt(signo)
    ));
    ExitCode::from(128u8.saturating_add(u8::try_from(signo).unwrap_or(0)))
}

/// Cancels the run on the first SIGINT, SIGTERM or SIGHUP (a closed terminal) — on Windows Ctrl-C,
/// Ctrl-Break or the console closing — and remembers which it was. A second SIGINT (Ctrl-C) is an impatient user: the process exits at once, its compiles die
/// with it (see `executor::child`), and the next run removes the staged files it leaves.
fn watch_signals(
    cancel: CancellationToken,
    signalled: Arc<AtomicI32>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let mut interrupts = platform::Interrupts::new()?;
    Ok(tokio::spawn(async move {
        let signo = interrupts.next().await;
        signalled.store(signo, Ordering::Relaxed);
        cancel.cancel();
        interrupts.next_interrupt().await;
        eprintln!("dtlto-reapi: error: interrupted again; exiting at once");
        std::process::exit(128 + platform::INTERRUPT);
    }))
}

/// Whether a failure to start the remote executor is the cluster's fault (unreachable, overloaded,
/// timing out) rather than a configuration error, which must not be papered over by local compiles.
fn is_infrastructure(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<ReapiError>()
        .is_some_and(ReapiError::is_infrastructure)
}
