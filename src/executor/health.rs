//! Whether the cluster is still worth racing, judged over the whole link (`--strategy=racing`):
//! the remote executor owns one [`Health`], and each race (`racing.rs`) tells it how the remote side
//! did. When the cluster keeps failing, or keeps losing, it switches the rest of the link to local
//! compiles at once.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use tokio_util::sync::CancellationToken;

use super::context::RunContext;
use super::local_runner::LocalRunner;
use crate::jobs::Job;
use crate::stats::{Degraded, JobRecord};

/// Remote failures in a row (with no remote success between them) after which the link stops
/// using the cluster.
const FAILURES_TO_DEGRADE: u32 = 3;

/// Whether the cluster is worth racing, judged over the whole link.
pub(super) struct Health {
    failures_in_a_row: AtomicU32,
    local_wins_in_a_row: AtomicU32,
    /// Races the local side may win in a row before the cluster is deemed too slow to help.
    local_wins_to_degrade: u32,
    /// Cancelled when the link stops using the cluster.
    pub(super) degraded: CancellationToken,
    /// Why it did.
    reason: OnceLock<String>,
    /// Jobs compiled locally since, without asking the cluster.
    local_jobs: AtomicU64,
}

impl Health {
    /// `jobs`: the local compile slots. The local side winning twice as many races in a row as it
    /// has slots (at least 8) means the cluster delivered nothing while the local slots went
    /// through their work twice over.
    pub(super) fn new(jobs: usize) -> Health {
        Health {
            failures_in_a_row: AtomicU32::new(0),
            local_wins_in_a_row: AtomicU32::new(0),
            local_wins_to_degrade: u32::try_from(jobs.saturating_mul(2))
                .unwrap_or(u32::MAX)
                .max(8),
            degraded: CancellationToken::new(),
            reason: OnceLock::new(),
            local_jobs: AtomicU64::new(0),
        }
    }

    /// The switch to local mode, if the link made it.
    pub(super) fn report(&self) -> Option<Degraded> {
        Some(Degraded {
            reason: self.reason.get()?.clone(),
            local_jobs: self.local_jobs.load(Ordering::Relaxed),
        })
    }

    /// A job of a link that stopped using the cluster: a local compile, counted.
    pub(super) async fn run_locally(
        &self,
        ctx: &RunContext,
        job: Job,
        local: &LocalRunner,
    ) -> (JobRecord, Vec<u8>) {
        self.local_jobs.fetch_add(1, Ordering::Relaxed);
        local.run(ctx, job).await
    }

    pub(super) fn remote_delivered(&self) {
        self.failures_in_a_row.store(0, Ordering::Relaxed);
        self.local_wins_in_a_row.store(0, Ordering::Relaxed);
    }

    pub(super) fn remote_failed(&self, ctx: &RunContext, reason: &str) {
        let failures = self.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= FAILURES_TO_DEGRADE {
            self.degrade(
                ctx,
                &format!("the cluster failed {failures} jobs in a row (last: {reason})"),
            );
        }
    }

    pub(super) fn local_won(&self, ctx: &RunContext) {
        let wins = self.local_wins_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if wins >= self.local_wins_to_degrade {
            self.degrade(
                ctx,
                &format!("local compiles won {wins} races in a row against the cluster"),
            );
        }
    }

    fn degrade(&self, ctx: &RunContext, why: &str) {
        if self.reason.set(why.to_owned()).is_ok() {
            tracing::warn!(%why, "racing: the rest of the link compiles locally");
            let text = format!("{why}; the rest of the link compiles locally");
            ctx.reporter.warn_once("racing-degraded", &text);
            self.degraded.cancel();
        }
    }
}
