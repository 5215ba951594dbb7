//! What the user sees, shared by every mode: compiler diagnostics prefixed with the job's module, a live
//! progress bar only when stderr is a terminal, one summary line at the end, and the `--stats-json`
//! file (whose records are defined in `stats`).
//!
//! All output goes through a [`Reporter`] so that lines never tear a progress bar and `--quiet` is
//! honoured in one place.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::jobs::Job;
use crate::plan::digests::HashingStats;
use crate::reapi::TransferStats;
use crate::stats::{Degraded, JobRecord, Ran, Side, StatsFile, Status, ToolchainReport};

/// What the run's end reports besides the job records.
#[derive(Debug, Default)]
pub struct RunTotals<'a> {
    /// `local`, `remote` or `cache-only`.
    pub mode: &'a str,
    /// The remote client's counters, in the remote modes.
    pub transfers: Option<TransferStats>,
    pub toolchain: Option<ToolchainReport>,
    /// How the link's input files were hashed, when Actions were planned.
    pub inputs: Option<HashingStats>,
    /// With `--strategy=racing`, when the link stopped using the cluster.
    pub degraded: Option<Degraded>,
}

/// Counts finished jobs for the summary line, collects their records for `--stats-json`, and
/// prints on stderr.
pub struct Reporter {
    quiet: bool,
    verbose: bool,
    progress: Option<ProgressBar>,
    started: Instant,
    tally: Mutex<Tally>,
    /// Every job's record, kept only when `--stats-json` will write them: at 50,000 jobs they are
    /// tens of MB that the summary line does not need.
    records: Option<Mutex<Vec<JobRecord>>>,
    warned: Mutex<HashSet<String>>,
}

/// What the summary line says of the jobs.
#[derive(Debug, Default)]
struct Tally {
    jobs: usize,
    failed: usize,
    cancelled: usize,
    not_started: usize,
    /// Where the jobs that ran to an end ran (cancelled ones are counted above).
    disk_cache: usize,
    action_cache: usize,
    remote: usize,
    local: usize,
    local_wins: usize,
    remote_wins: usize,
}

impl Tally {
    fn add(&mut self, record: &JobRecord) {
        self.jobs += 1;
        match record.status {
            Status::Failed => self.failed += 1,
            Status::Cancelled => self.cancelled += 1,
            Status::NotStarted => self.not_started += 1,
            Status::Succeeded => {}
        }
        if matches!(record.status, Status::Succeeded | Status::Failed) {
            match record.ran {
                Ran::DiskCache => self.disk_cache += 1,
                Ran::ActionCache => self.action_cache += 1,
                Ran::Remote => self.remote += 1,
                Ran::Local => self.local += 1,
                Ran::NotStarted => {}
            }
        }
        match record.race.as_ref().and_then(|race| race.winner) {
            Some(Side::Local) => self.local_wins += 1,
            Some(Side::Remote) => self.remote_wins += 1,
            None => {}
        }
    }
}

impl Reporter {
    /// `total` is the number of jobs, for the progress bar; `keep_records` when `--stats-json`
    /// will want them.
    pub fn new(total: usize, quiet: bool, verbose: bool, keep_records: bool) -> Reporter {
        let progress = (!quiet && std::io::stderr().is_terminal() && total > 0).then(|| {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(
                "dtlto-reapi [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
            ) {
                bar.set_style(style);
            }
            bar
        });
        Reporter {
            quiet,
            verbose,
            progress,
            started: Instant::now(),
            tally: Mutex::new(Tally::default()),
            records: keep_records.then(|| Mutex::new(Vec::new())),
            warned: Mutex::new(HashSet::new()),
        }
    }

    /// Prints one line on stderr (unless quiet), above the progress bar.
    pub fn line(&self, text: &str) {
        if !self.quiet {
            self.print(text);
        }
    }

    /// Prints an error line; errors are shown even with `--quiet`.
    pub fn error(&self, text: &str) {
        self.print(&format!("dtlto-reapi: error: {text}"));
    }

    /// Prints a warning once per distinct `cause` (so a cluster problem affecting every job is one
    /// line, not thousands).
    pub fn warn_once(&self, cause: &str, text: &str) {
        let first = self
            .warned
            .lock()
            .map(|mut w| w.insert(cause.to_owned()))
            .unwrap_or(true);
        if first {
            self.line(&format!("dtlto-reapi: warning: {text}"));
        }
    }

    /// With `--verbose`, what is about to happen to a job.
    pub fn verbose(&self, text: impl FnOnce() -> String) {
        if self.verbose && !self.quiet {
            self.print(&text());
        }
    }

    /// What a compiler printed, each line prefixed with the job's module. Shown for failed jobs
    /// always, for successful ones unless quiet (a successful compile that prints, warns).
    pub fn diagnostics(&self, job: &Job, output: &[u8], failed: bool) {
        if output.is_empty() || (self.quiet && !failed) {
            return;
        }
        let module = job.module().display().to_string();
        let text = String::from_utf8_lossy(output);
        let prefixed: Vec<String> = text.lines().map(|l| format!("{module}: {l}")).collect();
        self.print(&prefixed.join("\n"));
    }

    /// Records a finished (or never started) job.
    pub fn finish_job(&self, record: JobRecord) {
        if let Some(bar) = &self.progress {
            bar.inc(1);
        }
        if let Ok(mut tally) = self.tally.lock() {
            tally.add(&record);
        }
        if let Some(Ok(mut records)) = self.records.as_ref().map(Mutex::lock) {
            records.push(record);
        }
    }

    fn print(&self, text: &str) {
        let write = || {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{text}");
        };
        match &self.progress {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }

    /// The records (taken: the run is over), in job-file order; none unless kept.
    fn take_records(&self) -> Vec<JobRecord> {
        let mut records = match self.records.as_ref().map(Mutex::lock) {
            Some(Ok(mut records)) => std::mem::take(&mut *records),
            _ => Vec::new(),
        };
        records.sort_by_key(|r| r.index);
        records
    }

    /// Ends the run: clears the progress bar, prints the summary line and writes `--stats-json`.
    pub fn finish(
        &self,
        job_file: &Path,
        totals: &RunTotals<'_>,
        stats_json: Option<&Path>,
    ) -> std::io::Result<()> {
        if let Some(bar) = &self.progress {
            bar.finish_and_clear();
        }
        let wall = self.started.elapsed();
        let tally = self.tally.lock().map(|mut t| std::mem::take(&mut *t));
        let toolchain_up = totals.toolchain.as_ref().map_or(0, |t| t.bytes_uploaded);
        self.line(&summary_line(
            &tally.unwrap_or_default(),
            totals.transfers.as_ref(),
            toolchain_up,
            totals.degraded.as_ref(),
            wall,
        ));
        if let Some(path) = stats_json {
            let stats = StatsFile {
                job_file: job_file.to_owned(),
                mode: totals.mode.to_owned(),
                wall_ms: wall.as_millis() as u64,
                cpu_ms: crate::platform::own_cpu().as_millis() as u64,
                transfers: totals.transfers,
                toolchain: totals.toolchain.clone(),
                inputs: totals.inputs,
                degraded: totals.degraded.clone(),
                jobs: self.take_records(),
            };
            let path = per_link_file(path, job_file, "stats");
            crate::staging::write_atomically_with(&path, |out| {
                serde_json::to_writer_pretty(&mut *out, &stats).map_err(std::io::Error::other)?;
                out.write_all(b"\n")
            })?;
        }
        Ok(())
    }
}

/// Where a per-link file (`--stats-json PATH`, `--trace PATH`) goes: PATH itself, or, when PATH is a
/// directory (a build runs many links), a file in it named after the job file:
/// `app.1234.dist-file.json` → `app.1234.<kind>.json`.
pub fn per_link_file(path: &Path, job_file: &Path, kind: &str) -> PathBuf {
    if !path.is_dir() {
        return path.to_owned();
    }
    let name = job_file.file_name().unwrap_or_default().to_string_lossy();
    let stem = name.strip_suffix(".dist-file.json").unwrap_or(&name);
    path.join(format!("{stem}.{kind}.json"))
}

/// `dtlto-reapi: 12 jobs, 1 failed (3 cache hits, 6 remote, 2 local; 1.2 MB up, 3.4 MB down) in 3.41 s`,
/// with `; races won 2 local, 4 remote` after where the jobs ran when any job raced the cluster,
/// `; switched to local mode, 9 jobs local after it` when racing stopped using the cluster,
/// `, 185.3 MB toolchain up` after the modules' upload when the compiler was uploaded, and
/// `; on the wire 0.6 MB up, 1.1 MB down` after the logical bytes when they differ (compression).
fn summary_line(
    tally: &Tally,
    transfers: Option<&TransferStats>,
    toolchain_up: u64,
    degraded: Option<&Degraded>,
    wall: Duration,
) -> String {
    let mut parts = vec![
        format!("{} jobs", tally.jobs),
        format!("{} failed", tally.failed),
    ];
    for (n, name) in [
        (tally.cancelled, "cancelled"),
        (tally.not_started, "not started"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {name}"));
        }
    }
    let mut detail = Vec::new();
    if tally.disk_cache > 0 {
        detail.push(format!("{} disk-cache hits", tally.disk_cache));
    }
    if transfers.is_some() {
        detail.push(format!("{} cache hits", tally.action_cache));
        detail.push(format!("{} remote", tally.remote));
    }
    detail.push(format!("{} local", tally.local));
    let mut detail = detail.join(", ");
    let (local_wins, remote_wins) = (tally.local_wins, tally.remote_wins);
    if local_wins + remote_wins > 0 {
        detail.push_str(&format!(
            "; races won {local_wins} local, {remote_wins} remote"
        ));
    }
    if let Some(degraded) = degraded {
        detail.push_str(&format!(
            "; switched to local mode, {} jobs local after it",
            degraded.local_jobs
        ));
        if degraded.resumed {
            detail.push_str(", then back to racing");
        }
    }
    if let Some(t) = transfers {
        detail.push_str(&format!(
            "; {} up",
            megabytes(t.bytes_uploaded.saturating_sub(toolchain_up))
        ));
        if toolchain_up > 0 {
            detail.push_str(&format!(", {} toolchain up", megabytes(toolchain_up)));
        }
        detail.push_str(&format!(", {} down", megabytes(t.bytes_downloaded)));
        if (t.wire_bytes_uploaded, t.wire_bytes_downloaded)
            != (t.bytes_uploaded, t.bytes_downloaded)
        {
            detail.push_str(&format!(
                "; on the wire {} up, {} down",
                megabytes(t.wire_bytes_uploaded),
                megabytes(t.wire_bytes_downloaded)
            ));
        }
    }
    format!(
        "dtlto-reapi: {} ({detail}) in {:.2} s",
        parts.join(", "),
        wall.as_secs_f64()
    )
}

fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_json_in_a_directory_is_named_after_the_job_file() {
        let dir = tempfile::tempdir().unwrap();
        let job_file = Path::new("out/lib text.so.4321.dist-file.json");
        assert_eq!(
            per_link_file(dir.path(), job_file, "stats"),
            dir.path().join("lib text.so.4321.stats.json")
        );
        let file = dir.path().join("stats.json");
        assert_eq!(per_link_file(&file, job_file, "trace"), file);
    }

    #[test]
    fn summary_counts() {
        let job = Job {
            index: 0,
            args: vec![].into(),
            inputs: vec!["a.o".into(), "a.bc".into()].into(),
            outputs: vec!["a.n.o".into()].into(),
        };
        let records = vec![
            JobRecord::new(&job, Status::Succeeded, Ran::Local, Duration::ZERO),
            JobRecord::new(&job, Status::Failed, Ran::Local, Duration::ZERO),
            JobRecord::new(&job, Status::NotStarted, Ran::NotStarted, Duration::ZERO),
        ];
        let tally = |records: &[JobRecord]| {
            let mut tally = Tally::default();
            records.iter().for_each(|r| tally.add(r));
            tally
        };
        assert_eq!(
            summary_line(&tally(&records), None, 0, None, Duration::from_millis(1500)),
            "dtlto-reapi: 3 jobs, 1 failed, 1 not started (2 local) in 1.50 s"
        );
        let mut transfers = TransferStats {
            bytes_uploaded: 1_500_000,
            wire_bytes_uploaded: 1_500_000,
            ..Default::default()
        };
        assert_eq!(
            summary_line(
                &tally(&records),
                Some(&transfers),
                0,
                None,
                Duration::from_millis(10)
            ),
            "dtlto-reapi: 3 jobs, 1 failed, 1 not started (0 cache hits, 0 remote, 2 local; 1.5 MB up, 0.0 MB down) in 0.01 s"
        );
        // Toolchain bytes are counted apart from the modules'.
        assert_eq!(
            summary_line(
                &tally(&records),
                Some(&transfers),
                1_000_000,
                None,
                Duration::from_millis(10)
            ),
            "dtlto-reapi: 3 jobs, 1 failed, 1 not started (0 cache hits, 0 remote, 2 local; 0.5 MB up, 1.0 MB toolchain up, 0.0 MB down) in 0.01 s"
        );
        transfers.wire_bytes_uploaded = 700_000;
        assert!(
            summary_line(
                &tally(&records),
                Some(&transfers),
                0,
                None,
                Duration::from_millis(10)
            )
            .contains("; 1.5 MB up, 0.0 MB down; on the wire 0.7 MB up, 0.0 MB down)")
        );
        // Races won each way.
        let mut raced = records.clone();
        for (record, winner) in raced.iter_mut().zip([Some(Side::Local), None]) {
            record.race = Some(crate::stats::Race {
                winner,
                ..Default::default()
            });
        }
        assert!(
            summary_line(
                &tally(&raced),
                Some(&transfers),
                0,
                None,
                Duration::from_millis(10)
            )
            .contains("2 local; races won 1 local, 0 remote; 1.5 MB up")
        );
        // The switch to local mode.
        let mut degraded = Degraded {
            reason: "the cluster failed 3 jobs in a row".to_owned(),
            local_jobs: 9,
            resumed: false,
        };
        let line = |degraded: &Degraded| {
            summary_line(
                &tally(&raced),
                Some(&transfers),
                0,
                Some(degraded),
                Duration::from_millis(10),
            )
        };
        let switched = line(&degraded);
        assert!(
            switched.contains("races won 1 local, 0 remote; switched to local mode, 9 jobs local after it; 1.5 MB up"),
            "{switched}"
        );
        // And back, when a cluster that kept losing delivered again.
        degraded.resumed = true;
        let resumed = line(&degraded);
        assert!(
            resumed.contains(
                "; switched to local mode, 9 jobs local after it, then back to racing; 1.5 MB up"
            ),
            "{resumed}"
        );
    }
}
