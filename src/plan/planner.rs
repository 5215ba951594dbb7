//! Turning a job into its REAPI Action, for everything that keys results by Action digest: remote
//! execution, the remote cache and the local disk cache.
//!
//! The planner hashes every input of the link once, up front, then per job chooses a layout
//! (canonical when asked for and possible, else mirror, with one warning per cause) and builds the
//! Action. A job that cannot be expressed as an Action at all runs locally, uncached: so do all jobs
//! of a link whose shared arguments name something no key can describe (see `args::named_files`),
//! while the files they name are inputs of every Action. Planning reads and rewrites files (index
//! shards), so it is blocking work: callers run it on the blocking pool.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Result;

use super::action::{self, ActionOptions, ActionSpec, Assembled};
use super::args;
use super::digests::{FileDigests, HashingStats};
use super::environment::Environment;
use super::layout::{self, NotRemotable};
use super::options::LayoutKind;
use super::toolchain::{ModeRequest, Toolchain};
use crate::cache::DigestCache;
use crate::jobs::{Job, JobFile};
use crate::reapi::Blob;
use crate::settings::Settings;

/// Receives a warning that applies to every job with the same cause (`cause`, `text`); the reporter
/// shows each cause once.
pub type WarnOnce<'a> = &'a dyn Fn(&'static str, &str);

/// At most this many input files (as the job file lists them, repeats included), the link's files
/// are known on the calling thread rather than on the blocking pool: a relink's. For unchanged
/// files, that is one `stat` each.
const INLINE_INPUT_FILES: usize = 64;

/// What every job's planning shares.
pub struct Planner {
    /// The link's job file, with the files its shared arguments name among its common inputs.
    job_file: Arc<JobFile>,
    /// Why no job of the link can have an Action, when its shared arguments say so.
    refused: Option<NotRemotable>,
    digests: FileDigests,
    options: ActionOptions,
    cwd: PathBuf,
    layout: LayoutKind,
    /// Why upload mode was wanted but not possible, for the caller to warn about.
    toolchain_warning: Option<String>,
    /// How long identifying the compiler took (`--verbose`; the digest cache makes it cheap).
    toolchain_time: std::time::Duration,
    /// The digest cache: it also remembers the digests of rewritten index shards
    /// (`layout::canonical`), saved by [`Planner::save_cache`] once the jobs are planned.
    cache: Arc<DigestCache>,
    /// Index shards rewritten by this link, and rewrites whose digests the digest cache knew.
    shards_rewritten: AtomicU64,
    shard_rewrites_remembered: AtomicU64,
}

impl Planner {
    /// Resolves the compiler and hashes every input file of the link (a relink's few on the calling
    /// thread, more on blocking threads, `--jobs` at once), remembering the digests of both across
    /// links in the digest cache.
    /// Every Action runs with `environment`; the link runs in `cwd`. Actions name their outputs
    /// in REAPI 2.1's `output_paths` until [`Planner::use_legacy_output_files`] (the server is
    /// known only once connected, which a link does while this hashes).
    pub async fn new(
        job_file: Arc<JobFile>,
        settings: &Settings,
        environment: Arc<Environment>,
        cwd: PathBuf,
    ) -> Result<Planner> {
        let cache_dir = DigestCache::default_dir();
        Planner::with_digest_cache(job_file, settings, environment, cwd, false, cache_dir).await
    }

    /// Actions name their outputs in the pre-2.1 `output_files` field, for older servers.
    pub fn use_legacy_output_files(&mut self) {
        self.options.legacy_output_files = true;
    }

    /// [`Planner::new`] with the digest cache kept in `cache_dir` (`None`: in memory only).
    pub async fn with_digest_cache(
        job_file: Arc<JobFile>,
        settings: &Settings,
        environment: Arc<Environment>,
        cwd: PathBuf,
        legacy_output_files: bool,
        cache_dir: Option<PathBuf>,
    ) -> Result<Planner> {
        let platform = platform_properties(settings)?;
        let (job_file, refused) = with_named_files(job_file, &cwd);
        let planned_job_file = job_file.clone();
        let threads = settings.jobs;
        let (request, remote_compiler) = (settings.toolchain, settings.remote_compiler.clone());
        let upload_compiler = settings.upload_compiler.clone();
        // One digest cache for the compiler's files and the link's inputs: opened once (a stat of
        // its directory), shared by both, saved once the jobs are planned (`save_cache`).
        let cache = Arc::new(DigestCache::open(cache_dir));
        // lld wrote it just now: the clock of the file system the link's files are on.
        cache.written_now(&job_file.path);
        let job_file_for_toolchain = job_file.clone();
        let cache_for_toolchain = cache.clone();
        let environment_for_toolchain = environment.clone();
        let resolve_toolchain = move || {
            let started = std::time::Instant::now();
            let request = ModeRequest {
                toolchain: request,
                remote_compiler: remote_compiler.as_deref(),
                upload_compiler: upload_compiler.as_deref(),
            };
            let resolved = Toolchain::resolve(
                &job_file_for_toolchain.common_args,
                request,
                &environment_for_toolchain,
                &cache_for_toolchain,
            );
            resolved.map(|(toolchain, warning)| (toolchain, warning, started.elapsed()))
        };
        let listed = job_file.common_inputs.len()
            + job_file.jobs.iter().map(|j| j.inputs.len()).sum::<usize>();
        let cache_for_inputs = cache.clone();
        let hash_inputs = move || {
            let paths = job_file
                .jobs
                .iter()
                .flat_map(|j| j.inputs.iter())
                .chain(&job_file.common_inputs)
                .map(PathBuf::as_path);
            FileDigests::compute(paths, threads, &cache_for_inputs)
        };
        // A relink's few files are known here, one after the other: each trip to the blocking
        // pool and back is two thread wake-ups (and a new thread the first time), which cost a
        // one-job relink about as much CPU as the work. A bigger link hashes its inputs on the
        // pool, the compiler's files beside them, and an interrupt need not wait for either (a
        // small link that is the first with a compiler hashes it here: an interrupt waits).
        let (toolchain, digests) = if listed <= INLINE_INPUT_FILES {
            (resolve_toolchain(), hash_inputs())
        } else {
            let toolchain = tokio::task::spawn_blocking(resolve_toolchain);
            let digests = tokio::task::spawn_blocking(hash_inputs).await?;
            let toolchain = toolchain.await?;
            // What took a while is kept at once, should the link not get to `save_cache`.
            let saved = cache.clone();
            let _ = tokio::task::spawn_blocking(move || saved.save()).await?;
            (toolchain, digests)
        };
        let digests = digests.map_err(|e| anyhow::anyhow!("hashing the link's inputs: {e}"))?;
        let (toolchain, toolchain_warning, toolchain_time) =
            toolchain.map_err(|e| anyhow::anyhow!("the compiler: {e}"))?;
        let toolchain_blobs: Arc<[Blob]> = toolchain
            .inputs()
            .into_iter()
            .map(|(_, f)| Blob::from_file(f.local.clone(), f.digest.clone()))
            .collect();
        Ok(Planner {
            job_file: planned_job_file,
            refused,
            digests,
            options: ActionOptions {
                toolchain: Arc::new(toolchain),
                toolchain_blobs,
                remote_compiler: settings.remote_compiler.clone(),
                platform,
                environment,
                legacy_output_files,
            },
            cwd,
            layout: settings.layout,
            toolchain_warning,
            toolchain_time,
            cache,
            shards_rewritten: AtomicU64::new(0),
            shard_rewrites_remembered: AtomicU64::new(0),
        })
    }

    /// Saves what planning added to the digest cache (the digests of rewritten shards); a lost
    /// save only costs rewriting them again next time.
    pub fn save_cache(&self) {
        let _ = self.cache.save();
    }

    /// The link's compiler, as every Action records it.
    pub fn toolchain(&self) -> &Toolchain {
        &self.options.toolchain
    }

    /// How many input bytes were hashed, and how many the digest cache knew; the same of the
    /// index shards' rewrites.
    pub fn input_hashing(&self) -> HashingStats {
        HashingStats {
            shards_rewritten: self.shards_rewritten.load(Ordering::Relaxed),
            shard_rewrites_from_digest_cache: self
                .shard_rewrites_remembered
                .load(Ordering::Relaxed),
            ..self.digests.stats()
        }
    }

    /// How long identifying the compiler took.
    pub fn toolchain_time(&self) -> std::time::Duration {
        self.toolchain_time
    }

    /// Why the compiler is not uploaded although upload mode was wanted, if so.
    pub fn toolchain_warning(&self) -> Option<&str> {
        self.toolchain_warning.as_deref()
    }

    /// Why the digest cache, or a part of it, is ignored (another user could write it), if it is:
    /// a part is checked when first read, so a part read only while planning the jobs (for a
    /// rewritten shard's digest) is known after they are planned.
    pub fn digest_cache_warning(&self) -> Option<String> {
        self.cache.untrusted()
    }

    /// The Action of `job`, or why it has none.
    pub fn plan(&self, job: &Job, warn_once: WarnOnce<'_>) -> Result<ActionSpec, NotRemotable> {
        if let Some(refused) = &self.refused {
            return Err(refused.clone());
        }
        let job_file = &*self.job_file;
        let layout = self.layout(job_file, job, warn_once)?;
        action::build(job_file, job, layout, &self.digests, &self.options).map_err(|e| {
            NotRemotable {
                cause: "planning",
                detail: format!("cannot plan the action: {e}"),
            }
        })
    }

    /// The Action of a command that is not one of the link's jobs: the link's compiler and shared
    /// arguments followed by `args`, with no input files of its own and no outputs, built by the
    /// same [`action::assemble`] as every job's Action. `check` runs its probe (`--version`) so.
    pub fn plan_command(&self, args: &[String]) -> Result<Assembled, NotRemotable> {
        if let Some(refused) = &self.refused {
            return Err(refused.clone());
        }
        let layout = layout::Layout::bare(self.layout);
        let job_file = &*self.job_file;
        let rename = |arg: &str| layout.renames.get(arg).cloned();
        let mut arguments = args::rewrite_args(&job_file.common_args[1..], rename);
        arguments.extend_from_slice(args);
        action::assemble(
            job_file.compiler(),
            arguments,
            &layout,
            &self.digests,
            &self.options,
        )
        .map_err(|e| NotRemotable {
            cause: "planning",
            detail: format!("cannot plan the action: {e}"),
        })
    }

    /// Upload mode: the toolchain's files as blobs, the same for every Action of the link.
    pub fn toolchain_blobs(&self) -> &Arc<[Blob]> {
        &self.options.toolchain_blobs
    }

    /// Canonical when asked for and possible, else mirror.
    fn layout(
        &self,
        job_file: &JobFile,
        job: &Job,
        warn_once: WarnOnce<'_>,
    ) -> Result<layout::Layout, NotRemotable> {
        if self.layout == LayoutKind::Canonical {
            match layout::canonical(job_file, job, &self.digests, &self.cache) {
                Ok(layout) => {
                    let remembered = layout.generated.iter().any(|generated| {
                        matches!(generated.source, crate::reapi::BlobSource::Deferred(_))
                    });
                    let counter = if remembered {
                        &self.shard_rewrites_remembered
                    } else {
                        &self.shards_rewritten
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    return Ok(layout);
                }
                Err(e) => warn_once(
                    e.cause,
                    &format!(
                        "{}: {}; such jobs use the mirror layout",
                        job.label(),
                        e.detail
                    ),
                ),
            }
        }
        layout::mirror(job_file, job, &self.cwd)
    }
}

/// `job_file` with the files that its shared arguments name, and that it does not list, added to
/// its common inputs (hashed, in every Action's key and input root, renamed in the arguments); or
/// unchanged, with why no job can have an Action, when the arguments name what no key describes.
fn with_named_files(job_file: Arc<JobFile>, cwd: &Path) -> (Arc<JobFile>, Option<NotRemotable>) {
    let listed = |path: &str| {
        let jobs = job_file.jobs.iter();
        let mut files = job_file
            .common_inputs
            .iter()
            .chain(jobs.flat_map(|j| j.inputs.iter().chain(j.outputs.iter())));
        files.any(|file| file.as_os_str() == path)
    };
    match args::named_files(&job_file.common_args[1..], cwd, listed) {
        Ok(files) if files.is_empty() => (job_file, None),
        Ok(files) => {
            let mut with_files = (*job_file).clone();
            with_files
                .common_inputs
                .extend(files.into_iter().map(PathBuf::from));
            (Arc::new(with_files), None)
        }
        Err(why) => {
            let refused = NotRemotable {
                cause: "argument-outside-the-key",
                detail: format!("the backend compiles pass {why}"),
            };
            (job_file, Some(refused))
        }
    }
}

/// The platform properties, `(NAME, VALUE)`.
fn platform_properties(settings: &Settings) -> Result<Vec<(String, String)>> {
    Ok(settings
        .platform
        .iter()
        .map(|p| (p.name.clone(), p.value.clone()))
        .collect())
}
