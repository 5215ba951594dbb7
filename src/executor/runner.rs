//! The composition of a job's run: [`Runner`] chains the steps a job may go through — planning into
//! an Action, the disk cache (`disk_cache`), the remote executor (`remote`), local compiles
//! (`local_runner`) — as the settings ask.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result};

use super::context::RunContext;
use super::disk_cache::DiskCacheStep;
use super::local::LocalSetup;
use super::local_runner::LocalRunner;
use super::remote::{RemoteExecutor, UPLOAD_AHEAD};
use crate::jobs::Job;
use crate::plan::action::ActionSpec;
use crate::plan::digests::HashingStats;
use crate::plan::environment::Environment;
use crate::plan::options::ToolchainMode;
use crate::plan::planner::Planner;
use crate::reapi::{self, TransferStats};
use crate::settings::{Mode, Settings, Strategy};
use crate::stats::{Degraded, JobRecord, Ran, Status, ToolchainReport};
use crate::trace::{self, LinkTrack};

/// Runs jobs the way the settings ask: planned into Actions when anything keys results by them
/// (a remote, the disk cache), looked up in the disk cache first, then run remotely or locally,
/// and stored in the disk cache after success.
pub struct Runner {
    planner: Option<Arc<Planner>>,
    remote: Option<RemoteExecutor>,
    disk: Option<DiskCacheStep>,
    local: LocalRunner,
}

/// What a link prepares while it connects to the cluster: the disk cache, the local compile
/// slots and, when a cluster or the disk cache may key results by Actions, the planner (which
/// hashes every input: neither that nor connecting waits for the other).
pub struct Prepared {
    planner: Option<Planner>,
    disk: Option<DiskCacheStep>,
    local: LocalRunner,
}

impl Runner {
    /// The part of a [`Runner`] that does not depend on the cluster.
    pub async fn prepare(ctx: &RunContext, settings: &Settings) -> Result<Prepared> {
        let disk = match &settings.disk_cache {
            None => None,
            Some(dir) => DiskCacheStep::open(ctx, dir, settings.disk_cache_max_size).await,
        };
        // Every compile's environment, local or remote: the one its Action declares.
        let environment =
            Arc::new(Environment::new(&settings.pass_env).map_err(anyhow::Error::msg)?);
        let cwd = std::env::current_dir().context("reading the working directory")?;
        let planner = if settings.mode != Mode::Local || disk.is_some() {
            let _phase = trace::link_phase(ctx.trace.as_ref(), LinkTrack::Link, "hash inputs");
            let planner = Planner::new(
                ctx.job_file.clone(),
                settings,
                environment.clone(),
                cwd.clone(),
            )
            .await?;
            Some(planner)
        } else {
            None
        };
        let local = LocalRunner::new(
            settings.jobs,
            LocalSetup::new(&ctx.job_file, environment, cwd),
        )
        .context("cannot start the thread that runs local compiles")?;
        Ok(Prepared {
            planner,
            disk,
            local,
        })
    }

    /// The runner, once connected: `remote` is the cluster in the remote modes (None in local
    /// mode, or when the cluster was unreachable and the link falls back to local compiles).
    pub fn new(
        ctx: &RunContext,
        settings: &Settings,
        prepared: Prepared,
        remote: Option<RemoteExecutor>,
    ) -> Runner {
        let Prepared {
            planner,
            disk,
            local,
        } = prepared;
        // Planned only when something keys results by Actions.
        let planner = planner
            .filter(|_| remote.is_some() || disk.is_some())
            .map(|mut planner| {
                if remote
                    .as_ref()
                    .is_some_and(RemoteExecutor::legacy_output_files)
                {
                    planner.use_legacy_output_files();
                }
                announce_toolchain(ctx, settings, &planner);
                Arc::new(planner)
            });
        Runner {
            planner,
            remote,
            disk,
            local,
        }
    }

    /// Jobs in flight at once: many when a cluster runs them, else as many as local compiles.
    pub fn concurrency(&self, settings: &Settings) -> usize {
        if self.remote.is_some() {
            // Executions take turns: the jobs beyond them plan and stage their uploads meanwhile.
            // (Not when racing: a job let in races a local compile, and `--remote-jobs` is how
            // many jobs race at once.)
            let executes_only =
                settings.mode == Mode::Remote && settings.strategy == Strategy::Remote;
            let ahead = if executes_only { UPLOAD_AHEAD } else { 0 };
            settings.remote_jobs + ahead
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

    /// The switch to local mode, if racing made it.
    pub fn degraded(&self) -> Option<Degraded> {
        self.remote.as_ref()?.degraded()
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
        let hit = match &self.disk {
            Some(disk) => disk.hit(ctx, &job, &spec, started).await,
            None => None,
        };
        let mut record = match hit {
            Some(record) => record,
            None => {
                let (record, output) = match &self.remote {
                    Some(remote) => remote.run(ctx, job, &spec, &self.local, started).await,
                    None => self.local.run(ctx, job).await,
                };
                // A local compile's result only when it is the Action's computation.
                if let Some(disk) = &self.disk
                    && record.status == Status::Succeeded
                    && (record.ran != Ran::Local || spec.local_is_action)
                {
                    disk.store(ctx, &spec, output).await;
                }
                record
            }
        };
        record.action = Some(reapi::digest::display(&spec.action_digest).to_string());
        record.layout = Some(spec.layout);
        record.parts = Some(spec.parts.clone());
        record
    }

    /// The job's Action, planned by [`crate::runtime::run_cpu`] (it reads and rewrites the index
    /// shard), or None (with one warning per cause) when the job cannot be expressed as one or
    /// nothing keys results by Actions.
    async fn plan(&self, ctx: &RunContext, job: &Job) -> Option<ActionSpec> {
        let planner = self.planner.clone()?;
        let _phase = trace::phase("plan");
        let (ctx, job) = (ctx.clone(), job.clone());
        let planned = crate::runtime::run_cpu(move || {
            let warn_once = |cause: &'static str, text: &str| ctx.reporter.warn_once(cause, text);
            planner
                .plan(&job, &warn_once)
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
        planned.await.flatten()
    }

    /// Ends the run: lets the cancellations of abandoned remote operations reach the cluster, and
    /// brings the disk cache back under its size bound.
    pub async fn finish(&self, ctx: &RunContext) {
        if let Some(planner) = self.planner.clone() {
            let _ = tokio::task::spawn_blocking(move || planner.save_cache()).await;
        }
        if let Some(planner) = &self.planner {
            warn_if_digest_cache_untrusted(ctx, planner);
        }
        if let Some(remote) = &self.remote {
            remote.client().settle_cancellations().await;
            if let Some(planner) = &self.planner
                && remote.toolchain_upload_unfinished()
            {
                // The check's probe runs the compiler as the link's compiles do.
                let prepended: String = (ctx.job_file.prepended_args().iter())
                    .map(|arg| format!(" --compiler-prepend-arg={arg}"))
                    .collect();
                let text = format!(
                    "the cluster lacks the compiler, and its upload did not finish before the \
                     link did (local compiles won the races): each link pays for it again until \
                     one finishes it; `dtlto-reapi check --compiler={}{prepended}` with this \
                     link's remote settings uploads it once",
                    planner.toolchain().compiler.display()
                );
                ctx.reporter.warn_once("toolchain-upload-unfinished", &text);
            }
        }
        if let Some(disk) = &self.disk {
            disk.trim(ctx).await;
        }
    }
}

/// Warns, once per link, that the digest cache or a part of it is ignored: at the start, for
/// what reading the inputs' digests found, and at the end, for parts first read while planning.
fn warn_if_digest_cache_untrusted(ctx: &RunContext, planner: &Planner) {
    if let Some(why) = planner.digest_cache_warning() {
        ctx.reporter.warn_once("digest-cache-untrusted", &why);
    }
}

/// Says how actions get the compiler: with `--verbose`, and as a warning where upload mode was
/// wanted for remote execution but is impossible.
fn announce_toolchain(ctx: &RunContext, settings: &Settings, planner: &Planner) {
    let toolchain = planner.toolchain();
    if let Some(why_not) = planner.toolchain_warning()
        && (settings.mode == Mode::Remote || settings.toolchain.is_some())
    {
        let text = format!(
            "{why_not}; actions run the compiler at its path on the workers (--toolchain=worker)"
        );
        ctx.reporter.warn_once("toolchain", &text);
    }
    warn_if_digest_cache_untrusted(ctx, planner);
    ctx.reporter.verbose(|| {
        let mode = match toolchain.identity.mode {
            ToolchainMode::Upload => "upload",
            ToolchainMode::Worker => "worker",
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
