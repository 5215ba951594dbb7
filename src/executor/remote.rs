//! The remote executor: each job becomes a REAPI Action, looked up in the action cache, executed on
//! the cluster when missing, and its outputs downloaded to where lld expects them.
//!
//! Per planned job: GetActionResult → on a miss, stage its blobs for upload, wait for a turn to
//! execute (`--remote-jobs` turns; the link runs [`UPLOAD_AHEAD`] jobs more, which stage their
//! blobs meanwhile), upload what is missing together with what other jobs staged (`uploads`),
//! Execute → download and verify the outputs into staged names → move them into place. Once the
//! lookups of a link keep missing (a cold link), jobs skip GetActionResult and go straight to
//! Execute, whose own action-cache lookup still finds any hit. A job whose
//! remote run fails for infrastructure reasons runs locally (with `--local-fallback`), with one
//! warning per cause rather than per job. In cache-only mode a miss compiles locally and the result
//! is stored in the remote cache. With `--strategy=racing` a miss also races a local compile
//! (`racing`), using the steps here: the lookup, the execution, storing a local result.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Result, bail};
use bazel_remote_apis::build::bazel::remote::execution::v2::ActionResult;
use tokio::sync::Semaphore;

use super::context::RunContext;
use super::health::Health;
use super::local_runner::{LocalRunner, local_action_result};
use super::lookups::Lookups;
use super::outcome::{self, Outcome};
use super::uploads::Uploads;
use crate::advice;
use crate::jobs::Job;
use crate::plan::action::ActionSpec;
use crate::reapi::{self, Blob, CallContext, Client, Digest, ReapiError, Stage};
use crate::settings::{Mode, Settings, Strategy};
use crate::staging::StagedOutputs;
use crate::stats::{Degraded, JobRecord, Ran, ServerTimes, Status};
use crate::trace;

/// Shared by every job of a remote or cache-only run.
pub struct RemoteExecutor {
    client: Client,
    pub(super) local_fallback: bool,
    /// Remote (execute on the cluster) or cache-only (compile locally, share through the cache).
    mode: Mode,
    /// Remote mode: whether local compiles race the cluster.
    strategy: Strategy,
    /// Cache-only mode and racing: store the results of local compiles in the remote cache.
    upload_results: bool,
    /// Racing: whether the cluster is still worth racing.
    pub(super) health: Health,
    /// The blobs this run uploads, each once however many jobs need it.
    uploads: Uploads,
    /// Set once the toolchain's files are in the CAS (upload mode), so they are sent once per link.
    toolchain_present: tokio::sync::OnceCell<()>,
    /// Bytes and blobs of the toolchain this link uploaded.
    toolchain_bytes: AtomicU64,
    toolchain_blobs: AtomicU64,
    /// Set when the cluster was found to lack toolchain files this link then began to upload.
    toolchain_missing: AtomicBool,
    /// Whether jobs of the remote strategy look up before they execute (see `lookups`).
    lookups: Lookups,
    /// Turns to execute: `--remote-jobs` of them. The link runs [`UPLOAD_AHEAD`] jobs more, which
    /// plan and stage their uploads while they wait for a turn.
    turns: Semaphore,
}

/// Jobs a remote link of the remote strategy runs beyond its `--remote-jobs` executions: they
/// plan and stage their uploads while they wait for a turn, so that a cold link's steady state
/// (one job starts as another ends) sends the blobs of this many jobs in one upload, not one
/// upload per job.
pub const UPLOAD_AHEAD: usize = 32;

/// What the link uploaded of the toolchain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ToolchainUpload {
    pub bytes_uploaded: u64,
    pub blobs_uploaded: u64,
}

/// Why a job did not finish remotely.
pub(super) enum RemoteFailure {
    /// The compiler ran remotely and failed: the job fails, as it would locally.
    Compile { exit_code: i32, stderr: Vec<u8> },
    /// The cluster could not run it (unreachable, overloaded, corrupt data...).
    Infrastructure(String),
    /// Anything else (a misbehaving server, a local I/O error).
    Other(String),
}

impl From<ReapiError> for RemoteFailure {
    fn from(e: ReapiError) -> Self {
        RemoteFailure::from(&e)
    }
}

/// A failed upload shared by several jobs.
impl From<Arc<ReapiError>> for RemoteFailure {
    fn from(e: Arc<ReapiError>) -> Self {
        RemoteFailure::from(&*e)
    }
}

impl From<&ReapiError> for RemoteFailure {
    fn from(e: &ReapiError) -> Self {
        if e.is_infrastructure() {
            RemoteFailure::Infrastructure(advice::describe(e))
        } else {
            RemoteFailure::Other(advice::describe(e))
        }
    }
}

impl RemoteExecutor {
    /// Connects, reading the server's capabilities, and checks that it offers what the mode needs.
    pub async fn connect(ctx: &RunContext, settings: &Settings) -> Result<RemoteExecutor> {
        let options = crate::remote_options::connection_options(settings)?;
        let client = Client::connect(&options).await?;
        if let Some(warning) = client.clear_text_warning() {
            ctx.reporter.warn_once("clear-text-headers", &warning);
        }
        let caps = client.capabilities();
        let mode = settings.mode;
        if mode == Mode::Remote && !caps.exec_enabled {
            bail!(
                "the REAPI server {} does not offer remote execution; use --mode=cache-only to \
                 share results through its cache while compiling locally",
                client.endpoint()
            );
        }
        let racing = mode == Mode::Remote && settings.strategy == Strategy::Racing;
        let stores_local_results = mode == Mode::CacheOnly || racing;
        if stores_local_results && settings.remote_upload && !caps.ac_update_enabled {
            ctx.reporter.warn_once(
                "read-only-cache",
                &format!(
                    "the REAPI server {} does not accept action-cache updates; using its cache \
                     read-only",
                    client.endpoint()
                ),
            );
        }
        Ok(RemoteExecutor {
            upload_results: stores_local_results
                && settings.remote_upload
                && caps.ac_update_enabled,
            client,
            local_fallback: settings.local_fallback,
            mode,
            strategy: settings.strategy,
            health: Health::new(settings.jobs),
            uploads: Uploads::default(),
            toolchain_present: tokio::sync::OnceCell::new(),
            toolchain_bytes: AtomicU64::new(0),
            toolchain_blobs: AtomicU64::new(0),
            toolchain_missing: AtomicBool::new(false),
            lookups: Lookups::default(),
            turns: Semaphore::new(settings.remote_jobs.max(1)),
        })
    }

    /// Whether Actions must use the pre-2.1 `output_files` field for this server.
    pub fn legacy_output_files(&self) -> bool {
        !self.client.capabilities().supports_output_paths()
    }

    /// Whether the link began to upload the toolchain and ended before the upload did (racing,
    /// when the local side won every race whose remote side waited on it).
    pub fn toolchain_upload_unfinished(&self) -> bool {
        self.toolchain_missing.load(Ordering::Relaxed) && !self.toolchain_present.initialized()
    }

    /// What this link uploaded of the toolchain.
    pub fn toolchain_upload(&self) -> ToolchainUpload {
        ToolchainUpload {
            bytes_uploaded: self.toolchain_bytes.load(Ordering::Relaxed),
            blobs_uploaded: self.toolchain_blobs.load(Ordering::Relaxed),
        }
    }

    /// The switch to local mode, if racing made it.
    pub fn degraded(&self) -> Option<Degraded> {
        self.health.report()
    }

    /// The client, for the run's transfer statistics.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Runs a planned job in the executor's mode; returns its record and the compiler's output.
    pub async fn run(
        &self,
        ctx: &RunContext,
        job: Job,
        spec: &ActionSpec,
        local: &LocalRunner,
        started: Instant,
    ) -> (JobRecord, Vec<u8>) {
        let call = CallContext {
            action_id: spec.action_digest.hash.clone(),
            target_id: job.module().to_string_lossy().into_owned(),
        };
        // The cache-only and racing futures are boxed: each is more than twice the size of the
        // remote one, and a job's task is as big as the biggest, copied and zeroed per job.
        match (self.mode, self.strategy) {
            (Mode::CacheOnly, _) => {
                Box::pin(self.run_cache_only(ctx, job, spec, &call, local, started)).await
            }
            // A local compile races only when it is the Action's computation: with another
            // compiler uploaded (`--upload-compiler`), a local winner's object would not be what
            // the Action's key describes.
            (_, Strategy::Racing) if spec.local_is_action => {
                Box::pin(self.run_racing(ctx, job, spec, &call, local, started)).await
            }
            _ => self.run_remote(ctx, job, spec, &call, local, started).await,
        }
    }

    /// Remote mode: the action cache, else execution on the cluster, else (for infrastructure
    /// failures, with `--local-fallback`) a local compile.
    async fn run_remote(
        &self,
        ctx: &RunContext,
        job: Job,
        spec: &ActionSpec,
        call: &CallContext,
        local: &LocalRunner,
        started: Instant,
    ) -> (JobRecord, Vec<u8>) {
        let ended = tokio::select! {
            ended = self.run_remotely(&job, spec, call) => ended,
            () = ctx.cancel.cancelled() => {
                let cancelled = Outcome::Cancelled { ran: Ran::Remote };
                return outcome::record(ctx, &job, cancelled, started.elapsed());
            }
        };
        let outcome = match ended {
            Ok((ran, result, times)) => {
                let output = ctx
                    .cancel
                    .run_until_cancelled(self.stderr_of(&result, call))
                    .await
                    .unwrap_or_default();
                Outcome::Succeeded {
                    ran,
                    output,
                    remote: times.as_ref().map(ServerTimes::remote_times),
                }
            }
            Err(RemoteFailure::Compile { exit_code, stderr }) => Outcome::Failed {
                ran: Ran::Remote,
                exit_code: Some(exit_code),
                reason: format!("the compiler exited with status {exit_code} on the cluster"),
                output: stderr,
            },
            Err(RemoteFailure::Infrastructure(reason)) if self.local_fallback => {
                tracing::warn!(job = %job.label(), %reason, "remote execution failed; compiling locally");
                ctx.reporter.warn_once(
                    "infrastructure",
                    &format!("remote execution failed ({reason}); falling back to local compiles"),
                );
                let _phase = trace::phase("fallback");
                return local.run(ctx, job).await;
            }
            Err(RemoteFailure::Infrastructure(reason) | RemoteFailure::Other(reason)) => {
                Outcome::Failed {
                    ran: Ran::Remote,
                    exit_code: None,
                    reason,
                    output: Vec::new(),
                }
            }
        };
        outcome::record(ctx, &job, outcome, started.elapsed())
    }

    /// Cache-only mode: an action-cache hit is downloaded; a miss compiles locally and, unless the
    /// cache is read-only, stores the result so the next link anywhere hits.
    async fn run_cache_only(
        &self,
        ctx: &RunContext,
        job: Job,
        spec: &ActionSpec,
        call: &CallContext,
        local: &LocalRunner,
        started: Instant,
    ) -> (JobRecord, Vec<u8>) {
        // Lookups and uploads are abandoned at an interrupt, like remote executions.
        let lookup = self.cache_hit(ctx, &job, spec, call);
        let Some(hit) = ctx.cancel.run_until_cancelled(lookup).await else {
            let cancelled = Outcome::Cancelled {
                ran: Ran::ActionCache,
            };
            return outcome::record(ctx, &job, cancelled, started.elapsed());
        };
        if let Some(output) = hit {
            let hit = Outcome::Succeeded {
                ran: Ran::ActionCache,
                output,
                remote: None,
            };
            return outcome::record(ctx, &job, hit, started.elapsed());
        }
        let (record, output) = local.run(ctx, job).await;
        if record.status == Status::Succeeded {
            self.store_local_result(ctx, spec, &output, call).await;
        }
        (record, output)
    }

    /// Stores the result of a successful local compile in the remote cache, so the next link
    /// anywhere finds it — unless the cache is read-only to this link (`--remote-upload=false`, or
    /// a server that refuses updates). A failure is one warning, never a failed job.
    pub(super) async fn store_local_result(
        &self,
        ctx: &RunContext,
        spec: &ActionSpec,
        output: &[u8],
        call: &CallContext,
    ) {
        if !self.upload_results || !spec.local_is_action {
            return;
        }
        let store = self.store_result(spec, output, call);
        if let Some(Err(e)) = ctx.cancel.run_until_cancelled(store).await {
            ctx.reporter.warn_once(
                "cache-upload",
                &format!("cannot store results in the remote cache ({e})"),
            );
        }
    }

    /// Cache-only mode: the job's outputs from the remote action cache, in place, and the compiler's
    /// output; None on a miss (or a hit whose blobs cannot be had).
    async fn cache_hit(
        &self,
        ctx: &RunContext,
        job: &Job,
        spec: &ActionSpec,
        call: &CallContext,
    ) -> Option<Vec<u8>> {
        let lookup = trace::phase("action-cache lookup");
        let found = self
            .client
            .get_action_result(&spec.action_digest, &output_names(spec), call)
            .await;
        drop(lookup);
        match found {
            Ok(Some(result)) if result.exit_code == 0 => {
                self.materialize(job, spec, &result, call).await.ok()?;
                Some(self.stderr_of(&result, call).await)
            }
            Ok(_) => None,
            Err(e) => {
                ctx.reporter.warn_once(
                    "cache-lookup",
                    &format!("action-cache lookups fail ({e}); compiling locally"),
                );
                None
            }
        }
    }

    /// Uploads a successful local compile's outputs and compiler output, then its ActionResult.
    async fn store_result(
        &self,
        spec: &ActionSpec,
        output: &[u8],
        call: &CallContext,
    ) -> Result<(), ReapiError> {
        let _phase = trace::phase("upload");
        let mut blobs = Vec::new();
        let mut outputs = Vec::new();
        for (name, local) in &spec.outputs {
            let digest = reapi::digest::of_file(local).map_err(|source| ReapiError::Io {
                path: local.clone(),
                source,
            })?;
            outputs.push((name.clone(), digest.clone()));
            blobs.push(Blob::from_file(local.clone(), digest));
        }
        let stderr = Blob::from_bytes(output.to_vec());
        let mut result = local_action_result(outputs);
        result.stderr_digest = Some(stderr.digest.clone());
        blobs.push(stderr);
        // Sent without asking FindMissingBlobs first: the objects were just compiled here, so the
        // cluster almost never has them, and the question would cost a round trip per job.
        self.client.upload(blobs, call).await?;
        self.client
            .update_action_result(&spec.action_digest, result, call)
            .await
    }

    /// Action cache first; on a miss upload and execute. Returns where the result came from.
    async fn run_remotely(
        &self,
        job: &Job,
        spec: &ActionSpec,
        call: &CallContext,
    ) -> Result<(Ran, ActionResult, Option<ServerTimes>), RemoteFailure> {
        if let Some(asking) = self.lookups.start().await {
            if let Some(result) = self.lookup(job, spec, call).await? {
                asking.hit();
                let times = result.execution_metadata.as_ref().map(ServerTimes::of);
                return Ok((Ran::ActionCache, result, times));
            }
            asking.missed();
        }
        let executed = self.execute(job, spec, call, || {}).await;
        if let Ok((Ran::ActionCache, ..)) = executed {
            self.lookups.execute_hit();
        }
        executed
    }

    /// The job's result from the action cache, its outputs in place; None on a miss (a cached
    /// result whose blobs have expired is as good as one).
    pub(super) async fn lookup(
        &self,
        job: &Job,
        spec: &ActionSpec,
        call: &CallContext,
    ) -> Result<Option<ActionResult>, RemoteFailure> {
        let lookup = trace::phase("action-cache lookup");
        let cached = self
            .client
            .get_action_result(&spec.action_digest, &output_names(spec), call)
            .await?;
        drop(lookup);
        if let Some(result) = cached
            && result.exit_code == 0
            && self.materialize(job, spec, &result, call).await.is_ok()
        {
            return Ok(Some(result));
        }
        Ok(None)
    }

    /// Uploads what the job's Action needs, executes it on the cluster and puts its outputs in
    /// place; `executing` is called when the cluster reports that a worker runs it.
    pub(super) async fn execute(
        &self,
        job: &Job,
        spec: &ActionSpec,
        call: &CallContext,
        mut executing: impl FnMut() + Send,
    ) -> Result<(Ran, ActionResult, Option<ServerTimes>), RemoteFailure> {
        let mut on_stage = |stage: Stage| {
            if stage == Stage::Executing {
                executing();
            }
        };
        let staged = self
            .uploads
            .stage(&self.client, &spec.input_files, &spec.blobs, call)?;
        let _turn = match self.turns.try_acquire() {
            Ok(turn) => turn,
            Err(_) => {
                let _phase = trace::phase("waiting to execute");
                self.turns.acquire().await.map_err(|_| {
                    RemoteFailure::Other("the turns to execute were closed".to_owned())
                })?
            }
        };
        let upload = trace::phase("upload");
        self.upload_toolchain(spec, call).await?;
        self.uploads
            .wait_for(staged, &self.client, &spec.input_files, &spec.blobs, call)
            .await?;
        drop(upload);
        let execution = trace::phase("remote execution");
        // Outputs small enough come back in the response where the server inlines them, sparing
        // a download per job.
        let outputs = output_names(spec);
        let response = match self
            .client
            .execute_with_progress(&spec.action_digest, false, &outputs, call, &mut on_stage)
            .await
        {
            Err(e) if e.missing_blobs().is_some() => {
                // The CAS lost blobs since we checked (the toolchain's too, maybe): send them
                // again, once.
                let toolchain = &spec.toolchain_blobs[..];
                self.uploads.forget(
                    (spec.input_files.iter().map(|f| &f.digest))
                        .chain(spec.blobs.iter().map(|b| &b.digest))
                        .chain(toolchain.iter().map(|b| &b.digest))
                        .cloned(),
                );
                self.uploads
                    .ensure(&self.client, toolchain, &[], call)
                    .await?;
                self.uploads
                    .ensure(&self.client, &spec.input_files, &spec.blobs, call)
                    .await?;
                self.client
                    .execute_with_progress(
                        &spec.action_digest,
                        false,
                        &outputs,
                        call,
                        &mut on_stage,
                    )
                    .await
                    .map_err(not_executed)?
            }
            other => other.map_err(not_executed)?,
        };
        drop(execution);
        let Some(result) = response.result else {
            return Err(RemoteFailure::Other(
                "the server's ExecuteResponse has no result".to_owned(),
            ));
        };
        if result.exit_code != 0 {
            let stderr = self.stderr_of(&result, call).await;
            // 126/127: the worker could not run the compiler at all (a shell's convention, which
            // workers follow); the compile itself never happened, so the cluster is at fault.
            if matches!(result.exit_code, 126 | 127) {
                return Err(RemoteFailure::Infrastructure(format!(
                    "the workers cannot run the compiler (exit code {}): {}",
                    result.exit_code,
                    String::from_utf8_lossy(&stderr).trim()
                )));
            }
            return Err(RemoteFailure::Compile {
                exit_code: result.exit_code,
                stderr,
            });
        }
        // The server's timestamps, converted once for the record and the trace.
        let times = result.execution_metadata.as_ref().map(ServerTimes::of);
        let ran = if response.cached_result {
            Ran::ActionCache
        } else {
            if let Some(times) = &times {
                trace::remote_execution(times);
            }
            Ran::Remote
        };
        self.materialize(job, spec, &result, call).await?;
        Ok((ran, result, times))
    }

    /// Upload mode: puts the toolchain's files in the CAS once per link (every job waits for the
    /// first), counting what had to be sent apart from the modules.
    async fn upload_toolchain(
        &self,
        spec: &ActionSpec,
        call: &CallContext,
    ) -> Result<(), ReapiError> {
        if spec.toolchain_blobs.is_empty() {
            return Ok(());
        }
        let upload = || async {
            let digests: Vec<Digest> = spec
                .toolchain_blobs
                .iter()
                .map(|b| b.digest.clone())
                .collect();
            let missing: HashSet<Digest> = self
                .client
                .find_missing(&digests, call)
                .await?
                .into_iter()
                .collect();
            let blobs: Vec<Blob> = spec
                .toolchain_blobs
                .iter()
                .filter(|b| missing.contains(&b.digest))
                .cloned()
                .collect();
            let bytes: u64 = missing.iter().map(reapi::digest::size).sum();
            if !missing.is_empty() {
                self.toolchain_missing.store(true, Ordering::Relaxed);
            }
            self.client.upload(blobs, call).await?;
            self.toolchain_bytes.fetch_add(bytes, Ordering::Relaxed);
            let count = u64::try_from(missing.len()).unwrap_or(u64::MAX);
            self.toolchain_blobs.fetch_add(count, Ordering::Relaxed);
            self.uploads.mark_present(digests);
            Ok::<(), ReapiError>(())
        };
        self.toolchain_present.get_or_try_init(upload).await?;
        Ok(())
    }

    /// Downloads every output of `result` into staged names, verifies them, and moves them into place.
    /// Only the outputs the job file lists are ever written.
    async fn materialize(
        &self,
        job: &Job,
        spec: &ActionSpec,
        result: &ActionResult,
        call: &CallContext,
    ) -> Result<(), RemoteFailure> {
        let _phase = trace::phase("download");
        let staged = StagedOutputs::new(job).map_err(|e| RemoteFailure::Other(e.to_string()))?;
        for file in &result.output_files {
            let Some((_, local)) = spec.outputs.iter().find(|(name, _)| *name == file.path) else {
                return Err(RemoteFailure::Other(format!(
                    "the server returned an output this job does not have: {:?}",
                    file.path
                )));
            };
            let (Some(target), Some(digest)) = (staged.staged_path_of(local), &file.digest) else {
                return Err(RemoteFailure::Other(format!(
                    "output {:?} has no digest",
                    file.path
                )));
            };
            // Contents the server inlined are used when they match their digest; anything else is
            // downloaded (and verified) instead.
            let inlined = (!file.contents.is_empty() || digest.size_bytes == 0)
                && reapi::digest::of_bytes(&file.contents) == *digest;
            if inlined {
                // Creating many files at once is much faster in parallel (file creation dominates
                // a fully cached relink): `run_cpu` moves them to the blocking pool when they pile up.
                let (path, contents) = (target.to_path_buf(), file.contents.clone());
                crate::runtime::run_cpu(move || std::fs::write(path, contents))
                    .await
                    .unwrap_or_else(|| Err(std::io::Error::other("the write panicked")))
                    .map_err(|e| RemoteFailure::Other(format!("{}: {e}", target.display())))?;
            } else {
                self.client.download_to_file(digest, target, call).await?;
            }
        }
        for (name, local) in &spec.outputs {
            if !result.output_files.iter().any(|f| f.path == *name) {
                return Err(RemoteFailure::Other(format!(
                    "the remote compile did not produce {}",
                    local.display()
                )));
            }
        }
        staged
            .commit()
            .map_err(|e| RemoteFailure::Other(e.to_string()))
    }

    /// The compiler's stderr (and stdout) from an action result, inline or from the CAS.
    pub(super) async fn stderr_of(&self, result: &ActionResult, call: &CallContext) -> Vec<u8> {
        let mut text = self
            .stream(&result.stderr_raw, result.stderr_digest.as_ref(), call)
            .await;
        text.extend(
            self.stream(&result.stdout_raw, result.stdout_digest.as_ref(), call)
                .await,
        );
        text
    }

    /// One of the compiler's streams, at most [`MAX_SHOWN_OUTPUT`] bytes of it (with a note saying
    /// how much was left out): a server may claim gigabytes.
    async fn stream(&self, raw: &[u8], digest: Option<&Digest>, call: &CallContext) -> Vec<u8> {
        let (mut text, size) = if !raw.is_empty() {
            (
                raw[..raw.len().min(MAX_SHOWN_OUTPUT)].to_vec(),
                raw.len() as u64,
            )
        } else {
            match digest {
                Some(d) if d.size_bytes > 0 => {
                    let limit = MAX_SHOWN_OUTPUT as u64;
                    match self.client.download_head(d, limit, call).await {
                        Ok(head) => (head, reapi::digest::size(d)),
                        Err(e) => {
                            return format!("(cannot fetch the compiler's output: {e})\n")
                                .into_bytes();
                        }
                    }
                }
                _ => return Vec::new(),
            }
        };
        if size > text.len() as u64 {
            let note = format!(
                "\n(... {} more bytes of the compiler's output not shown)\n",
                size - text.len() as u64
            );
            text.extend_from_slice(note.as_bytes());
        }
        text
    }
}

/// How much of a remote compile's stdout or stderr is shown: plenty for any diagnostic.
const MAX_SHOWN_OUTPUT: usize = 64 << 10;

/// Classifies a failed Execute. A non-OK status means the action did not run (REAPI), whatever
/// the server's reason, e.g. NOT_FOUND "could not canonicalize path for command root" for a
/// compiler missing on the workers: an infrastructure failure, which a local compile can make up
/// for. Except where local compiles would hide a problem the user must fix: credentials
/// (UNAUTHENTICATED, PERMISSION_DENIED) and requests the server calls malformed (INVALID_ARGUMENT).
fn not_executed(e: ReapiError) -> RemoteFailure {
    use tonic::Code;
    match e.code() {
        // The error says which options to check.
        Some(Code::Unauthenticated | Code::PermissionDenied) => {
            RemoteFailure::Other(advice::describe(&e))
        }
        Some(Code::InvalidArgument) | None => RemoteFailure::from(e),
        Some(_) => RemoteFailure::Infrastructure(format!(
            "the cluster did not run the action: {}",
            advice::describe(&e)
        )),
    }
}

/// The paths of a job's outputs inside its action, for the server to inline in cache hits.
fn output_names(spec: &ActionSpec) -> Vec<String> {
    spec.outputs.iter().map(|(name, _)| name.clone()).collect()
}
