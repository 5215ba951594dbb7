//! The local disk cache as a step of a job's run: a lookup before anything runs, a store after a
//! success, a trim at the end. A cache never fails a link: each problem is one warning.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::context::RunContext;
use super::local_runner::local_action_result;
use super::outcome::{self, Outcome};
use crate::cache::DiskCache;
use crate::jobs::Job;
use crate::plan::action::ActionSpec;
use crate::staging::StagedOutputs;
use crate::stats::{JobRecord, Ran};
use crate::trace;

/// The disk cache, open for one link.
pub(crate) struct DiskCacheStep {
    cache: Arc<DiskCache>,
}

impl DiskCacheStep {
    /// The disk cache in `dir`, or None with one warning when it cannot be used (unwritable, another
    /// user's, a full disk).
    pub(crate) async fn open(ctx: &RunContext, dir: &Path, max: u64) -> Option<DiskCacheStep> {
        let path = dir.to_owned();
        let opened = tokio::task::spawn_blocking(move || DiskCache::open(&path, max))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        match opened {
            Ok(cache) => Some(DiskCacheStep {
                cache: Arc::new(cache),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the disk cache");
                let text = format!("{e}; the link goes on without the disk cache");
                ctx.reporter.warn_once("disk-cache-open", &text);
                None
            }
        }
    }

    /// The job's outputs from the disk cache, if it has them all.
    pub(crate) async fn hit(
        &self,
        ctx: &RunContext,
        job: &Job,
        spec: &Arc<ActionSpec>,
        started: Instant,
    ) -> Option<JobRecord> {
        let disk = self.cache.clone();
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
            let hit = Outcome::Succeeded {
                ran: Ran::DiskCache,
                output: result.stderr_raw,
                remote: None,
            };
            Some(outcome::record(&ctx, &job, hit, started.elapsed()).0)
        });
        hit.await.ok().flatten()
    }

    /// Stores a successful job's outputs (now in place) and compiler output in the disk cache.
    pub(crate) async fn store(&self, ctx: &RunContext, spec: &Arc<ActionSpec>, output: Vec<u8>) {
        let disk = self.cache.clone();
        let _phase = trace::phase("disk-cache store");
        let spec = spec.clone();
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
                self.cache.dir().display()
            );
            ctx.reporter.warn_once("disk-cache-store", &text);
        }
    }

    /// Brings the disk cache back under its size bound, at the end of the run.
    pub(crate) async fn trim(&self, ctx: &RunContext) {
        let disk = self.cache.clone();
        let trimmed = tokio::task::spawn_blocking(move || disk.trim()).await;
        if let Err(e) = trimmed.unwrap_or_else(|e| Err(std::io::Error::other(e))) {
            let text = format!(
                "cannot trim the disk cache {}: {e}",
                self.cache.dir().display()
            );
            ctx.reporter.warn_once("disk-cache-trim", &text);
        }
    }
}
