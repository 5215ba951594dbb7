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
        if !RPC_NAMES.contains(&rpc) {
            return Err(format!(
                "unknown RPC {rpc:?}; known: {}",
                RPC_NAMES.join(", ")
            ));
        }
        Ok(Self {
            rpc: rpc.to_owned(),
            code: parse_code(code).ok_or_else(|| format!("unknown status code {code:?}"))?,
            count: count.parse().map_err(|_| usage())?,
        })
    }
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
    break_writes: AtomicU32,
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
            break_writes: AtomicU32::new(break_writes),
        }
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
