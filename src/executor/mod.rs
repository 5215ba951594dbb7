//! Execution: runs every job of a link, with bounded concurrency, biggest module first, stopping
//! everything at the first failure (unless `--keep-going`) or when the link is interrupted.
//!
//! [`Runner`] composes the steps a job may go through — planning into an Action, the disk cache,
//! the remote executor (`remote`), local compiles (`local`) — as the settings ask.

mod child;
pub mod local;
pub mod reaper;
pub mod remote;
mod uploads;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use bazel_remote_apis::build::bazel::remote::execution::v2::{
    ActionResult, ExecutedActionMetadata, OutputFile,
};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cache::DiskCache;
use crate::jobs::{Job, JobFile};
use crate::output::StagedOutputs;
use crate::plan::action::ActionSpec;
use crate::plan::digests::HashingStats;
use crate::plan::planner::Planner;
use crate::reapi::{self, Digest, TransferStats};
use crate::report::{JobRecord, Ran, Reporter, Status, ToolchainReport};
use crate::settings::Settings;
use crate::trace::{self, Trace};
use remote::RemoteExecutor;

/// What every job of a run shares; cheap to clone (every job's task holds one).
#[derive(Clone)]
pub struct RunContext {
    pub job_file: Arc<JobFile>,
    pub reporter: Arc<Reporter>,
    /// Cancelled on SIGINT/SIGTERM, and on the first failure unless `keep_going`.
    pub cancel: CancellationToken,
    pub keep_going: bool,
    /// `--trace`: the spans of every job's phases.
    pub trace: Option<Arc<Trace>>,
}

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
            let record = JobRecord::new(&job, Status::NotStarted, Ran::NotStarted, Duration::ZERO);
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

/// Local compiles, at most `--jobs` at once whatever the run's overall concurrency (remote modes
/// run many more jobs at once than this machine has cores).
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
            let record = JobRecord::new(&job, Status::Cancelled, Ran::Local, Duration::ZERO);
            return (record, Vec::new());
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
        let outcome = local::run_job(&ctx.job_file, &job, &self.spawner, &ctx.cancel).await;
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
}

/// Runs jobs the way the settings ask: planned into Actions when anything keys results by them
/// (a remote, the disk cache), looked up in the disk cache first, then run remotely or locally,
/// and stored in the disk cache after success.
pub struct Runner {
    planner: Option<Arc<Planner>>,
    remote: Option<RemoteExecutor>,
    disk: Option<Arc<DiskCache>>,
    local: LocalRunner,
}

impl Runner {
    /// `remote` is the connected cluster in the remote modes (None in local mode, or when the
    /// cluster was unreachable and the link falls back to local compiles).
    pub async fn new(
        ctx: &RunContext,
        settings: &Settings,
        remote: Option<RemoteExecutor>,
    ) -> Result<Runner> {
        let disk = match &settings.disk_cache {
            None => None,
            Some(dir) => open_disk_cache(ctx, dir, settings.disk_cache_max_size).await,
        };
        let planner = if remote.is_some() || disk.is_some() {
            let legacy = remote
                .as_ref()
                .is_some_and(RemoteExecutor::legacy_output_files);
            let _phase = trace::link_phase(ctx.trace.as_ref(), "hash inputs");
            let planner = Planner::new(ctx.job_file.clone(), settings, legacy).await?;
            announce_toolchain(ctx, settings, &planner);
            Some(Arc::new(planner))
        } else {
            None
        };
        Ok(Runner {
            planner,
            remote,
            disk,
            local: LocalRunner::new(settings.jobs)
                .context("cannot start the thread that runs local compiles")?,
        })
    }

    /// Jobs in flight at once: many when a cluster runs them, else as many as local compiles.
    pub fn concurrency(&self, settings: &Settings) -> usize {
        if self.remote.is_some() {
            settings.remote_jobs
        } else if self.disk.is_some() {
            // Cache hits need no core: let them overlap with the compiles.
            settings.jobs * 4
        } else {
            settings.jobs
        }
    }

    /// The remote client's transfer counters, in the remote modes.
    pub fn transfers(&self) -> Option<TransferStats> {
        self.remote.as_ref().map(|r| r.client().stats())
    }

    /// How the link's input files were hashed, when Actions were planned.
    pub fn input_hashing(&self) -> Option<HashingStats> {
        Some(self.planner.as_ref()?.input_hashing())
    }

    /// The link's compiler and what was uploaded of it, when Actions were planned.
    pub fn toolchain(&self) -> Option<ToolchainReport> {
        let toolchain = self.planner.as_ref()?.toolchain();
        let upload = self
            .remote
            .as_ref()
            .map(RemoteExecutor::toolchain_upload)
            .unwrap_or_default();
        Some(ToolchainReport {
            mode: toolchain.identity.mode,
            compiler: toolchain.compiler.clone(),
            digest: reapi::digest::display(&toolchain.identity.digest).to_string(),
            files: toolchain.files.len(),
            bytes: toolchain.size(),
            bytes_uploaded: upload.bytes_uploaded,
            blobs_uploaded: upload.blobs_uploaded,
        })
    }

    /// Runs one job.
    pub async fn run_job(&self, ctx: &RunContext, job: Job) -> JobRecord {
        let started = Instant::now();
        let Some(spec) = self.plan(ctx, &job).await else {
            return self.local.run(ctx, job).await.0;
        };
        let spec = Arc::new(spec);
        ctx.reporter.verbose(|| {
            format!(
                "{}: action {}",
                job.label(),
                reapi::digest::display(&spec.action_digest)
            )
        });
        let mut record = match self.disk_hit(ctx, &job, &spec, started).await {
            Some(record) => record,
            None => {
                let (record, output) = match &self.remote {
                    Some(remote) => remote.run(ctx, job, &spec, &self.local, started).await,
                    None => self.local.run(ctx, job).await,
                };
                if record.status == Status::Succeeded {
                    self.store_on_disk(ctx, &spec, output).await;
                }
                record
            }
        };
        record.action = Some(reapi::digest::display(&spec.action_digest).to_string());
        record.layout = Some(spec.layout);
        record.parts = Some(spec.parts.clone());
        record
    }

    /// The job's Action, planned on the blocking pool (it reads and rewrites the index shard), or
    /// None (with one warning per cause) when the job cannot be expressed as one or nothing keys
    /// results by Actions.
    async fn plan(&self, ctx: &RunContext, job: &Job) -> Option<ActionSpec> {
        let planner = self.planner.clone()?;
        let _phase = trace::phase("plan");
        let (ctx, job) = (ctx.clone(), job.clone());
        let planned = tokio::task::spawn_blocking(move || {
            let warn_once = |cause: &'static str, text: &str| ctx.reporter.warn_once(cause, text);
            planner
                .plan(&ctx.job_file, &job, &warn_once)
                .map_err(|e| {
                    let detail = format!(
                        "{}: {}; such jobs run locally, uncached",
                        job.label(),
                        e.detail
                    );
                    ctx.reporter.warn_once(e.cause, &detail);
                })
                .ok()
        });
        planned.await.ok().flatten()
    }

    /// The job's outputs from the disk cache, if it has them all.
    async fn disk_hit(
        &self,
        ctx: &RunContext,
        job: &Job,
        spec: &Arc<ActionSpec>,
        started: Instant,
    ) -> Option<JobRecord> {
        let disk = self.disk.clone()?;
        let _phase = trace::phase("disk-cache lookup");
        let (ctx, job, spec) = (ctx.clone(), job.clone(), spec.clone());
        let hit = tokio::task::spawn_blocking(move || {
            let result = disk.get_action_result(&spec.action_digest).ok()??;
            if result.exit_code != 0 {
                return None;
            }
            let staged = StagedOutputs::new(&job).ok()?;
            for (name, local) in &spec.outputs {
                let file = result.output_files.iter().find(|f| f.path == *name)?;
                let target = staged.staged_path_of(local)?;
                if !disk.fetch_blob(file.digest.as_ref()?, target).ok()? {
                    return None;
                }
            }
            staged.commit().ok()?;
            ctx.reporter.diagnostics(&job, &result.stderr_raw, false);
            let mut record =
                JobRecord::new(&job, Status::Succeeded, Ran::DiskCache, started.elapsed());
            record.exit_code = Some(0);
            Some(record)
        });
        hit.await.ok().flatten()
    }

    /// Stores a successful job's outputs (now in place) and compiler output in the disk cache.
    async fn store_on_disk(&self, ctx: &RunContext, spec: &Arc<ActionSpec>, output: Vec<u8>) {
        let Some(disk) = self.disk.clone() else {
            return;
        };
        let _phase = trace::phase("disk-cache store");
        let spec = spec.clone();
        let dir = disk.dir().to_owned();
        let stored = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let mut outputs = Vec::with_capacity(spec.outputs.len());
            for (name, local) in &spec.outputs {
                outputs.push((name.clone(), disk.store_file(local)?));
            }
            let mut result = local_action_result(outputs);
            result.stderr_raw = output;
            disk.put_action_result(&spec.action_digest, &result)
        });
        let stored = stored
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        if let Err(e) = stored {
            tracing::warn!(error = %e, "cannot store a result in the disk cache");
            let text = format!(
                "cannot store results in the disk cache {}: {e}",
                dir.display()
            );
            ctx.reporter.warn_once("disk-cache-store", &text);
        }
    }

    /// Ends the run: lets the cancellations of abandoned remote operations reach the cluster, and
    /// brings the disk cache back under its size bound.
    pub async fn finish(&self, ctx: &RunContext) {
        if let Some(remote) = &self.remote {
            remote.client().settle_cancellations().await;
        }
        if let Some(disk) = self.disk.clone() {
            let dir = disk.dir().to_owned();
            let trimmed = tokio::task::spawn_blocking(move || disk.trim()).await;
            if let Err(e) = trimmed.unwrap_or_else(|e| Err(std::io::Error::other(e))) {
                let text = format!("cannot trim the disk cache {}: {e}", dir.display());
                ctx.reporter.warn_once("disk-cache-trim", &text);
            }
        }
    }
}

/// The disk cache in `dir`, or None with one warning when it cannot be used (unwritable, another
/// user's, a full disk): a cache never fails a link.
async fn open_disk_cache(
    ctx: &RunContext,
    dir: &std::path::Path,
    max: u64,
) -> Option<Arc<DiskCache>> {
    let path = dir.to_owned();
    let opened = tokio::task::spawn_blocking(move || DiskCache::open(&path, max))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    match opened {
        Ok(disk) => Some(Arc::new(disk)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the disk cache");
            let text = format!("{e}; the link goes on without the disk cache");
            ctx.reporter.warn_once("disk-cache-open", &text);
            None
        }
    }
}

/// Says how actions get the compiler: with `--verbose`, and as a warning where upload mode was
/// wanted for remote execution but is impossible.
fn announce_toolchain(ctx: &RunContext, settings: &Settings, planner: &Planner) {
    let toolchain = planner.toolchain();
    if let Some(why_not) = planner.toolchain_warning()
        && (settings.mode == crate::settings::Mode::Remote || settings.toolchain.is_some())
    {
        let text = format!(
            "{why_not}; actions run the compiler at its path on the workers (--toolchain=worker)"
        );
        ctx.reporter.warn_once("toolchain", &text);
    }
    ctx.reporter.verbose(|| {
        let mode = match toolchain.identity.mode {
            crate::plan::toolchain::ToolchainMode::Upload => "upload",
            crate::plan::toolchain::ToolchainMode::Worker => "worker",
        };
        format!(
            "toolchain: {mode} mode, compiler {} ({} file{}, {:.1} MB), digest {}, identified in \
             {:.1} ms",
            toolchain.compiler.display(),
            toolchain.files.len(),
            if toolchain.files.len() == 1 { "" } else { "s" },
            toolchain.size() as f64 / 1e6,
            reapi::digest::display(&toolchain.identity.digest),
            planner.toolchain_time().as_secs_f64() * 1000.0
        )
    });
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
