//! Whether the cluster is still worth racing, judged over the whole link (`--strategy=racing`):
//! the remote executor owns one [`Health`], and each race (`racing.rs`) tells it how the remote side
//! did.
//!
//! When the cluster keeps failing, the link stops using it at once: every race in flight leaves its
//! job to the local side, and the rest of the link runs in local mode. When it keeps losing, new
//! jobs still look up its action cache, but a miss compiles locally without a race; the races in
//! flight keep their remote sides: the cluster already has their work, and one that is a queue
//! starting late (a busy cluster) still delivers some of them before the local slots get there.
//! Its next result sends new jobs to it again.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

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
    /// Cancelled when the cluster keeps failing: the link stops using it for good.
    pub(super) failed: CancellationToken,
    /// Set while the cluster keeps losing: new jobs do not race it.
    losing: AtomicBool,
    /// Why the link last stopped sending jobs to the cluster.
    reason: Mutex<Option<String>>,
    /// Whether the cluster delivered again after it last kept losing, and got new jobs again.
    resumed: AtomicBool,
    /// Jobs compiled locally without racing the cluster after a switch.
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
            failed: CancellationToken::new(),
            losing: AtomicBool::new(false),
            reason: Mutex::new(None),
            resumed: AtomicBool::new(false),
            local_jobs: AtomicU64::new(0),
        }
    }

    /// Whether the cluster keeps losing: a job not yet sent to it does not race it.
    pub(super) fn losing(&self) -> bool {
        self.losing.load(Ordering::Relaxed)
    }

    /// The switch to local mode, if the link made it.
    pub(super) fn report(&self) -> Option<Degraded> {
        Some(Degraded {
            reason: self.reason.lock().ok()?.clone()?,
            local_jobs: self.local_jobs.load(Ordering::Relaxed),
            resumed: self.resumed.load(Ordering::Relaxed),
        })
    }

    /// A job that does not race the cluster after a switch: a local compile, counted.
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
        if self.losing.swap(false, Ordering::Relaxed) {
            tracing::info!("racing: the cluster delivered again; new jobs go to it");
            self.resumed.store(true, Ordering::Relaxed);
        }
    }

    pub(super) fn remote_failed(&self, ctx: &RunContext, reason: &str) {
        let failures = self.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= FAILURES_TO_DEGRADE && !self.failed.is_cancelled() {
            let why = format!("the cluster failed {failures} jobs in a row (last: {reason})");
            self.switch(
                ctx,
                "racing-failed",
                &why,
                "the rest of the link compiles locally",
            );
            self.failed.cancel();
        }
    }

    pub(super) fn local_won(&self, ctx: &RunContext) {
        let wins = self.local_wins_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if wins >= self.local_wins_to_degrade && !self.losing.swap(true, Ordering::Relaxed) {
            let why = format!("local compiles won {wins} races in a row against the cluster");
            let then = "new jobs compile locally without racing it until it delivers one in flight";
            self.switch(ctx, "racing-losing", &why, then);
            // A cluster that delivered and then kept losing again is not back at the end.
            self.resumed.store(false, Ordering::Relaxed);
        }
    }

    /// Records a switch (`why`, and what the link does now) and warns of the first of its kind.
    fn switch(&self, ctx: &RunContext, kind: &str, why: &str, then: &str) {
        tracing::warn!(%why, "racing: {then}");
        if let Ok(mut reason) = self.reason.lock() {
            *reason = Some(why.to_owned());
        }
        ctx.reporter.warn_once(kind, &format!("{why}; {then}"));
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::jobs::JobFile;
    use crate::report::Reporter;

    fn context() -> RunContext {
        let job_file = json!({"common": {"linker_output": "a.out", "args": ["clang", "-c"], "inputs": []},
                              "jobs": []});
        RunContext {
            job_file: Arc::new(JobFile::from_json(Path::new("a.json"), &job_file).unwrap()),
            reporter: Arc::new(Reporter::new(0, true, false, false)),
            cancel: CancellationToken::new(),
            keep_going: false,
            trace: None,
        }
    }

    fn lose(health: &Health, ctx: &RunContext, races: u32) {
        for _ in 0..races {
            health.local_won(ctx);
        }
    }

    #[test]
    fn a_cluster_that_keeps_losing_gets_no_new_races_until_it_delivers() {
        let (ctx, health) = (context(), Health::new(2));
        lose(&health, &ctx, 7);
        assert!(
            !health.losing(),
            "eight local wins in a row at least, with two slots"
        );
        lose(&health, &ctx, 1);
        assert!(health.losing());
        assert!(!health.failed.is_cancelled(), "losing is not failing");
        let report = health.report().expect("the switch is reported");
        assert!(
            report.reason.contains("won 8 races in a row"),
            "{}",
            report.reason
        );
        assert!(!report.resumed);

        health.remote_delivered();
        assert!(!health.losing());
        assert!(health.report().unwrap().resumed);
    }

    #[test]
    fn resumed_tells_whether_the_cluster_is_back_after_its_last_switch() {
        let (ctx, health) = (context(), Health::new(1));
        lose(&health, &ctx, 8);
        health.remote_delivered();
        lose(&health, &ctx, 8);
        assert!(health.losing());
        assert!(!health.report().unwrap().resumed, "it kept losing again");
    }

    #[test]
    fn a_cluster_that_keeps_failing_is_dropped_for_good_at_the_third_failure() {
        let (ctx, health) = (context(), Health::new(4));
        health.remote_failed(&ctx, "UNAVAILABLE");
        health.remote_failed(&ctx, "UNAVAILABLE");
        health.remote_delivered();
        health.remote_failed(&ctx, "UNAVAILABLE");
        health.remote_failed(&ctx, "UNAVAILABLE");
        assert!(
            !health.failed.is_cancelled(),
            "a delivery between resets the count"
        );
        health.remote_failed(&ctx, "DEADLINE_EXCEEDED");
        assert!(health.failed.is_cancelled());
        let reason = health.report().unwrap().reason;
        assert!(
            reason.contains("failed 3 jobs in a row (last: DEADLINE_EXCEEDED)"),
            "{reason}"
        );
    }
}
