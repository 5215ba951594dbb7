//! The `--stats-json` schema: what a link records of itself and of every job.
//!
//! The reporter writes these records at the end of a link; `dtlto-reapi explain` reads them back
//! through the same types to say why jobs missed the cache. The cluster's account of an execution
//! (ExecutedActionMetadata) is converted here, once and with checked arithmetic, into the times the
//! records show and the trace places ([`ServerTimes`]): a server's timestamps may be absurd.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bazel_remote_apis::build::bazel::remote::execution::v2::ExecutedActionMetadata;
use bazel_remote_apis::google::protobuf::Timestamp;
use serde::{Deserialize, Serialize};

use crate::jobs::Job;
use crate::plan::action::ActionParts;
use crate::plan::digests::HashingStats;
use crate::plan::options::{LayoutKind, ToolchainMode};
use crate::reapi::TransferStats;

/// Where a job's result came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Succeeded,
    Failed,
    Cancelled,
    NotStarted,
}

/// One `--stats-json` record.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    pub parts: Option<Arc<ActionParts>>,
    /// Its race, with `--strategy=racing` when the action cache did not have it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub race: Option<Race>,
}

/// A job's race between the cluster and a local compile: who ran it, who won, how long each side
/// ran (the loser: until it was cancelled).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Race {
    /// The side whose result the job has; none when neither delivered (a failure, an interrupt).
    pub winner: Option<Side>,
    /// How long the local compile ran; none when it never had a slot.
    pub local_ms: Option<u64>,
    /// How long the cluster had the job.
    pub remote_ms: Option<u64>,
}

/// The link's switch to local mode under `--strategy=racing`, when the cluster kept failing or
/// kept losing races.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Degraded {
    /// Why the link (last) stopped racing the cluster.
    pub reason: String,
    /// The jobs compiled locally after the switch without racing the cluster: after one for
    /// failures, without asking it anything (but for the job whose lookup made the switch); after
    /// one for losing, each after a miss in its action cache.
    pub local_jobs: u64,
    /// Whether the cluster, having kept losing, delivered a race in flight and got new jobs again
    /// (after the last switch, if it kept losing more than once).
    #[serde(default)]
    pub resumed: bool,
}

/// A side of a race.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    Local,
    Remote,
}

/// Times reported by the cluster in ExecutedActionMetadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
            outputs: job.outputs.to_vec(),
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
#[derive(Debug, Serialize, Deserialize)]
pub struct StatsFile {
    pub job_file: PathBuf,
    pub mode: String,
    pub wall_ms: u64,
    /// The distributor's own CPU time (user and system), its local compiles excluded.
    pub cpu_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfers: Option<TransferStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub toolchain: Option<ToolchainReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs: Option<HashingStats>,
    /// With `--strategy=racing`, when the link stopped using the cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub degraded: Option<Degraded>,
    pub jobs: Vec<JobRecord>,
}

/// The link's compiler as `--stats-json` and the summary line report it, when Actions were planned.
#[derive(Debug, Clone, Serialize, Deserialize)]
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

/// The timestamps of an ExecutedActionMetadata, converted once: microseconds since the Unix epoch,
/// or None where the server sent none or one that does not fit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerTimes {
    pub worker: String,
    pub queued: Option<i64>,
    pub worker_start: Option<i64>,
    pub worker_completed: Option<i64>,
    pub input_fetch: (Option<i64>, Option<i64>),
    pub execution: (Option<i64>, Option<i64>),
    pub output_upload: (Option<i64>, Option<i64>),
}

impl ServerTimes {
    pub fn of(meta: &ExecutedActionMetadata) -> ServerTimes {
        let at = |ts: &Option<Timestamp>| {
            let ts = ts.as_ref()?;
            ts.seconds
                .checked_mul(1_000_000)?
                .checked_add(i64::from(ts.nanos) / 1000)
        };
        ServerTimes {
            worker: meta.worker.clone(),
            queued: at(&meta.queued_timestamp),
            worker_start: at(&meta.worker_start_timestamp),
            worker_completed: at(&meta.worker_completed_timestamp),
            input_fetch: (
                at(&meta.input_fetch_start_timestamp),
                at(&meta.input_fetch_completed_timestamp),
            ),
            execution: (
                at(&meta.execution_start_timestamp),
                at(&meta.execution_completed_timestamp),
            ),
            output_upload: (
                at(&meta.output_upload_start_timestamp),
                at(&meta.output_upload_completed_timestamp),
            ),
        }
    }

    /// Queue, input fetch, execution and output upload times, as the job's record shows them.
    pub fn remote_times(&self) -> RemoteTimes {
        let ms = |(from, to): (Option<i64>, Option<i64>)| {
            u64::try_from(micros_between(from, to)? / 1000).ok()
        };
        RemoteTimes {
            worker: self.worker.clone(),
            queue_ms: ms((self.queued, self.worker_start)),
            input_fetch_ms: ms(self.input_fetch),
            execute_ms: ms(self.execution),
            output_upload_ms: ms(self.output_upload),
        }
    }
}

/// Microseconds from `from` to `to`, when both are known, `to` is not earlier and the difference
/// fits.
pub fn micros_between(from: Option<i64>, to: Option<i64>) -> Option<i64> {
    to?.checked_sub(from?).filter(|d| *d >= 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64, nanos: i32) -> Option<Timestamp> {
        Some(Timestamp { seconds, nanos })
    }

    #[test]
    fn server_times_survive_absurd_timestamps() {
        let meta = ExecutedActionMetadata {
            queued_timestamp: at(10, 500_000_000),
            worker_start_timestamp: at(12, 0),
            execution_start_timestamp: at(i64::MIN, 0),
            execution_completed_timestamp: at(i64::MAX, 999_999_999),
            input_fetch_start_timestamp: at(20, 0),
            input_fetch_completed_timestamp: at(10, 0),
            output_upload_start_timestamp: at(-9_223_372_036_854, -999_999_999),
            output_upload_completed_timestamp: at(9_223_372_036_854, 999_999_999),
            ..Default::default()
        };
        let times = ServerTimes::of(&meta).remote_times();
        assert_eq!(times.queue_ms, Some(1500));
        assert_eq!(times.execute_ms, None);
        assert_eq!(times.input_fetch_ms, None);
        // Both ends fit in microseconds, their difference does not.
        assert_eq!(times.output_upload_ms, None);
    }

    #[test]
    fn records_read_back_as_written() {
        let job = Job {
            index: 3,
            args: vec![].into(),
            inputs: vec!["a.o".into()].into(),
            outputs: vec!["a.n.o".into()].into(),
        };
        let mut record =
            JobRecord::new(&job, Status::Failed, Ran::Remote, Duration::from_millis(7));
        record.error = Some("why".into());
        record.remote = Some(ServerTimes::default().remote_times());
        let file = StatsFile {
            job_file: "x.dist-file.json".into(),
            mode: "remote".into(),
            wall_ms: 1,
            cpu_ms: 2,
            transfers: Some(TransferStats::default()),
            toolchain: None,
            inputs: None,
            degraded: Some(Degraded {
                reason: "the cluster failed 3 jobs in a row".into(),
                local_jobs: 9,
                resumed: false,
            }),
            jobs: vec![record],
        };
        let text = serde_json::to_string(&file).unwrap();
        let back: StatsFile = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
        assert_eq!(
            (back.jobs[0].status, back.jobs[0].ran),
            (Status::Failed, Ran::Remote)
        );
    }
}
