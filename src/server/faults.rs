//! Fault injection: test knobs that make the server misbehave in the ways real clusters do (failing
//! RPCs, dropped Execute streams, slow responses, corrupted downloads), so that client retry and
//! verification code can be tested against real gRPC. All knobs are off by default.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// Every RPC name `--fault-fail` accepts, as the services call `Faults::enter`.
pub const RPC_NAMES: &[&str] = &[
    "GetCapabilities",
    "FindMissingBlobs",
    "BatchUpdateBlobs",
    "BatchReadBlobs",
    "GetTree",
    "ByteStream.Read",
    "ByteStream.Write",
    "ByteStream.QueryWriteStatus",
    "GetActionResult",
    "UpdateActionResult",
    "Execute",
    "WaitExecution",
    "GetOperation",
    "CancelOperation",
];

/// The delay suggested in the RetryInfo attached to UNAVAILABLE and RESOURCE_EXHAUSTED faults.
const RETRY_DELAY: Duration = Duration::from_millis(50);

/// One `--fault-fail RPC=CODE:N` rule: fail the first N calls of RPC with CODE.
#[derive(Debug, Clone)]
pub struct FailRule {
    rpc: String,
    code: Code,
    count: u32,
}

impl FromStr for FailRule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || format!("expected RPC=CODE:N (e.g. Execute=UNAVAILABLE:2), got {s:?}");
        let (rpc, rest) = s.split_once('=').ok_or_else(usage)?;
        let (code, count) = rest.rsplit_once(':').ok_or_else(usage)?;
        check_rpc_name(rpc)?;
        Ok(Self {
            rpc: rpc.to_owned(),
            code: parse_code(code).ok_or_else(|| format!("unknown status code {code:?}"))?,
            count: count.parse().map_err(|_| usage())?,
        })
    }
}

/// Checks that a knob names an RPC the server has.
pub fn check_rpc_name(rpc: &str) -> Result<(), String> {
    if RPC_NAMES.contains(&rpc) {
        Ok(())
    } else {
        Err(format!(
            "unknown RPC {rpc:?}; known: {}",
            RPC_NAMES.join(", ")
        ))
    }
}

/// A `--fault-execute-status CODE[:MESSAGE]` answer: the status of an ExecuteResponse.
#[derive(Debug, Clone)]
pub struct StatusAnswer {
    code: Code,
    message: String,
}

impl FromStr for StatusAnswer {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (code, message) = s.split_once(':').unwrap_or((s, ""));
        let code = parse_status_code(code).map_err(|e| format!("{e} in CODE[:MESSAGE] {s:?}"))?;
        let message = if message.is_empty() {
            format!("fault injection: the action was not executed ({code:?})")
        } else {
            message.to_owned()
        };
        Ok(Self { code, message })
    }
}

/// A non-OK gRPC status code for a command-line flag.
pub fn parse_status_code(name: &str) -> Result<Code, String> {
    parse_code(name)
        .filter(|&c| c != Code::Ok)
        .ok_or_else(|| format!("expected a non-OK gRPC status code, got {name:?}"))
}

/// A gRPC status code by name (`UNAVAILABLE`, `resource_exhausted`, `Unavailable`) or number.
fn parse_code(name: &str) -> Option<Code> {
    if let Ok(n) = name.parse::<i32>() {
        return (0..=16).contains(&n).then(|| Code::from_i32(n));
    }
    let wanted = name.replace('_', "").to_ascii_lowercase();
    (1..=16)
        .map(Code::from_i32)
        .find(|code| format!("{code:?}").to_ascii_lowercase() == wanted)
}

/// Takes one from a countdown; true while it had some left.
fn take(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

/// The configured faults and how many of each are left.
#[derive(Debug, Default)]
pub struct Faults {
    fail: HashMap<String, (Code, AtomicU32)>,
    drop_execute_streams: AtomicU32,
    delay: Duration,
    corrupt_reads: AtomicU32,
    execute_status: Option<StatusAnswer>,
    missing_program: Option<Code>,
    break_writes: AtomicU32,
    lose_inputs: AtomicU32,
    refuse_blobs: AtomicU32,
}

impl Faults {
    pub fn new(
        rules: &[FailRule],
        drop_execute_streams: u32,
        delay_ms: u64,
        corrupt_reads: u32,
        break_writes: u32,
    ) -> Self {
        Self {
            fail: rules
                .iter()
                .map(|r| (r.rpc.clone(), (r.code, AtomicU32::new(r.count))))
                .collect(),
            drop_execute_streams: AtomicU32::new(drop_execute_streams),
            delay: Duration::from_millis(delay_ms),
            corrupt_reads: AtomicU32::new(corrupt_reads),
            execute_status: None,
            missing_program: None,
            break_writes: AtomicU32::new(break_writes),
            lose_inputs: AtomicU32::new(0),
            refuse_blobs: AtomicU32::new(0),
        }
    }

    /// How executions are answered instead of running the command: every one with
    /// `execute_status`; those whose program cannot be started with `missing_program` (instead of
    /// exit code 127), as some servers report a compiler missing on the workers.
    pub fn with_execute_answers(
        mut self,
        execute_status: Option<StatusAnswer>,
        missing_program: Option<Code>,
    ) -> Self {
        self.execute_status = execute_status;
        self.missing_program = missing_program;
        self
    }

    /// How many executions lose their input files first (`--fault-lose-inputs`).
    pub fn with_lost_inputs(mut self, executions: u32) -> Self {
        self.lose_inputs = AtomicU32::new(executions);
        self
    }

    /// How many blobs of BatchUpdateBlobs are refused first (`--fault-refuse-blobs`).
    pub fn with_refused_blobs(mut self, blobs: u32) -> Self {
        self.refuse_blobs = AtomicU32::new(blobs);
        self
    }

    /// The per-blob status of a blob of BatchUpdateBlobs that is to be refused, not stored.
    pub fn refuse_blob(&self) -> Option<Status> {
        take(&self.refuse_blobs).then(|| {
            Status::new(
                Code::Unavailable,
                "fault injection: blob refused, send it again",
            )
        })
    }

    /// Whether this execution is to find its input files gone from the CAS.
    pub fn lose_inputs(&self) -> bool {
        take(&self.lose_inputs)
    }

    /// The status every execution is answered with, if `--fault-execute-status` is set.
    pub fn execute_status(&self) -> Option<Status> {
        self.execute_status
            .as_ref()
            .map(|a| Status::new(a.code, a.message.clone()))
    }

    /// The status an execution whose program cannot be started is answered with, if any.
    pub fn missing_program(&self, program: &str, error: &std::io::Error) -> Option<Status> {
        self.missing_program.map(|code| {
            Status::new(
                code,
                format!("could not find or run the program {program:?} of the command: {error}"),
            )
        })
    }

    /// Called first by every RPC: applies the delay, then fails the call if a rule says so.
    pub async fn enter(&self, rpc: &'static str) -> Result<(), Status> {
        debug_assert!(RPC_NAMES.contains(&rpc), "{rpc} missing from RPC_NAMES");
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        match self.fail.get(rpc) {
            Some((code, left)) if take(left) => {
                let message = format!("fault injection: {rpc} fails with {code:?}");
                Err(match code {
                    Code::Unavailable | Code::ResourceExhausted => Status::with_error_details(
                        *code,
                        message,
                        ErrorDetails::with_retry_info(Some(RETRY_DELAY)),
                    ),
                    _ => Status::new(*code, message),
                })
            }
            _ => Ok(()),
        }
    }

    /// Whether this Execute stream is to be dropped after its first message.
    pub fn drop_execute_stream(&self) -> bool {
        take(&self.drop_execute_streams)
    }

    /// Whether this ByteStream write is to be broken after its first message.
    pub fn break_write(&self) -> bool {
        take(&self.break_writes)
    }

    /// Corrupts a blob about to be served, while `--fault-corrupt-reads` has reads left.
    pub fn corrupt_read(&self, data: &mut Vec<u8>) {
        if take(&self.corrupt_reads) {
            match data.first_mut() {
                Some(byte) => *byte ^= 0xff,
                None => data.push(0),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rules() {
        let rule: FailRule = "ByteStream.Write=RESOURCE_EXHAUSTED:3"
            .parse()
            .expect("parse");
        assert_eq!(
            (rule.rpc.as_str(), rule.code, rule.count),
            ("ByteStream.Write", Code::ResourceExhausted, 3)
        );
        assert_eq!(parse_code("unavailable"), Some(Code::Unavailable));
        assert_eq!(parse_code("14"), Some(Code::Unavailable));
        assert!("Exec=UNAVAILABLE:1".parse::<FailRule>().is_err());
        assert!("Execute=NOPE:1".parse::<FailRule>().is_err());
        assert!("Execute=UNAVAILABLE".parse::<FailRule>().is_err());
        let answer: StatusAnswer = "NOT_FOUND:no such compiler: here".parse().expect("parse");
        assert_eq!(
            (answer.code, answer.message.as_str()),
            (Code::NotFound, "no such compiler: here")
        );
        assert!("INTERNAL".parse::<StatusAnswer>().is_ok());
        assert!("OK".parse::<StatusAnswer>().is_err());
    }

    #[test]
    fn counts_down() {
        let faults = Faults::new(&[], 0, 0, 1, 0);
        let mut data = b"abc".to_vec();
        faults.corrupt_read(&mut data);
        assert_eq!(data, b"\x9ebc");
        faults.corrupt_read(&mut data);
        assert_eq!(data, b"\x9ebc");
    }
}
