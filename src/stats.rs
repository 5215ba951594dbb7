//! The `--stats-json` schema: what a link records of itself and of every job.
//!
//! The reporter writes these records at the end of a link; `dtlto-reapi explain` reads them back
//! (through the same types) to say why jobs missed the cache, and the tests read them to check what
//! ran where.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::jobs::Job;
use crate::plan::action::ActionParts;
use crate::plan::digests::HashingStats;
use crate::plan::layout::LayoutKind;
use crate::plan::toolchain::ToolchainMode;
use crate::reapi::TransferStats;

/// Where a job's result came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ran {
    /// A compile on this machine.
    Local,
    /// An action executed by the cluster.
    Remote,
    /// A result found in the action cache: nothing ran.
    ActionCache,
    /// A result found in the local disk cache: nothing ran.
    DiskCache,
    /// Nothing ran: the job never started (an earlier failure, or an interrupt).
    NotStarted,
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Succeeded,
    Failed,
    Cancelled,
    NotStarted,
}

/// One `--stats-json` record.
#[derive(Debug, Clone, Serialize)]
pub struct JobRecord {
    pub index: usize,
    pub module: PathBuf,
    pub outputs: Vec<PathBuf>,
    pub status: Status,
    pub ran: Ran,
    /// The compiler's exit code, when it ran to completion.
    pub exit_code: Option<i32>,
    /// Why the job failed, when it did for a reason other than the compiler's exit code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub wall_ms: u64,
    /// The digest (`hash/size`) of the job's REAPI Action, in the remote modes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The layout of the job's remote action, when it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layout: Option<LayoutKind>,
    /// The cluster's account of the execution, when it ran remotely.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteTimes>,
    /// What the job's Action is made of, when it had one (`dtlto-reapi explain` compares them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parts: Option<ActionParts>,
    /// Its race, with `--strategy=racing` when the action cache did not have it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub race: Option<Race>,
}

/// A job's race between the cluster and a local compile: who ran it, who won, how long each side
/// ran (the loser: until it was cancelled).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Race {
    /// The side whose result the job has; none when neither delivered (a failure, an interrupt).
    pub winner: Option<Side>,
    /// How long the local compile ran; none when it never had a slot.
    pub local_ms: Option<u64>,
    /// How long the cluster had the job.
    pub remote_ms: Option<u64>,
}

/// A side of a race.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    Local,
    Remote,
}

/// Times reported by the cluster in ExecutedActionMetadata.
#[derive(Debug, Clone, Serialize)]
pub struct RemoteTimes {
    pub worker: String,
    pub queue_ms: Option<u64>,
    pub input_fetch_ms: Option<u64>,
    pub execute_ms: Option<u64>,
    pub output_upload_ms: Option<u64>,
}

impl JobRecord {
    pub fn new(job: &Job, status: Status, ran: Ran, wall: Duration) -> JobRecord {
        JobRecord {
            index: job.index,
            module: job.module().to_owned(),
            outputs: job.outputs.clone(),
            status,
            ran,
            exit_code: None,
            error: None,
            wall_ms: wall.as_millis() as u64,
            action: None,
            layout: None,
            remote: None,
            parts: None,
            race: None,
        }
    }
}

/// The whole `--stats-json` file of one link.
#[derive(Serialize)]
pub struct StatsFile<'a> {
    pub job_file: &'a Path,
    pub mode: &'a str,
    pub wall_ms: u64,
    /// The distributor's own CPU time (user and system), its local compiles excluded.
    pub cpu_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfers: Option<TransferStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub toolchain: Option<&'a ToolchainReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs: Option<HashingStats>,
    pub jobs: &'a [JobRecord],
}

/// The link's compiler as `--stats-json` and the summary line report it, when Actions were planned.
#[derive(Debug, Clone, Serialize)]
pub struct ToolchainReport {
    /// `upload` or `worker`.
    pub mode: ToolchainMode,
    /// The compiler as the job file names it.
    pub compiler: PathBuf,
    /// The identity of the compiler and the files it needs (`hash/size` of their Directory tree).
    pub digest: String,
    /// Its files and their total size.
    pub files: usize,
    pub bytes: u64,
    /// What this link uploaded of it (included in `transfers`), in remote mode.
    pub bytes_uploaded: u64,
    pub blobs_uploaded: u64,
}
