//! Test knobs for a *hostile* server, as opposed to a flaky one (`faults`): one that answers some
//! RPC very slowly, streams reads that stall or drip a byte a second, claims outputs and
//! compiler output far larger than anything a client should load, or answers compressed reads with
//! a zstd bomb. They exist so that the client's bounds (no-progress timeouts, size limits,
//! truncated compiler output, bounded decompression) can be tested over real gRPC. All are off by
//! default.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bazel_remote_apis::build::bazel::remote::execution::v2::{ActionResult, Digest};
use bazel_remote_apis::google::bytestream::ReadResponse;
use bazel_remote_apis::google::protobuf::Timestamp;
use futures::stream::{self, BoxStream, StreamExt as _};
use tonic::Status;

use super::faults::check_rpc_name;

/// The hash of the blob that [`Hostile::claim_stderr`] makes up: never the hash of real content,
/// so that it is only ever served by [`Hostile::invented_read`].
const INVENTED_HASH: &str = "1111111111111111111111111111111111111111111111111111111111111111";

/// How fast a dripping read sends its bytes.
const DRIP_INTERVAL: Duration = Duration::from_secs(1);

/// Chunk size of an invented blob's read.
const INVENTED_CHUNK: u64 = 64 * 1024;

/// What the zstd bomb of `--fault-zstd-bomb` decompresses to: 4 GiB (of zeros).
const BOMB_SIZE: u64 = 4 << 30;

/// One `--fault-slow RPC=MS` rule.
#[derive(Debug, Clone)]
pub struct SlowRule {
    rpc: String,
    delay: Duration,
}

impl FromStr for SlowRule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || format!("expected RPC=MS (e.g. GetActionResult=20000), got {s:?}");
        let (rpc, ms) = s.split_once('=').ok_or_else(usage)?;
        check_rpc_name(rpc)?;
        Ok(SlowRule {
            rpc: rpc.to_owned(),
            delay: Duration::from_millis(ms.parse().map_err(|_| usage())?),
        })
    }
}

/// How ByteStream reads misbehave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadFault {
    /// Reads behave.
    #[default]
    None,
    /// Send the first chunk, then nothing, forever.
    Stall,
    /// Send one byte a second.
    Drip,
}

/// A `--fault-reads HOW[:N]` value: how the first N reads (all without `:N`) misbehave.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadFaults {
    how: ReadFault,
    count: u32,
}

impl FromStr for ReadFaults {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || format!("expected stall, drip, stall:N or drip:N, got {s:?}");
        let (how, count) = match s.split_once(':') {
            Some((how, n)) => (how, n.parse().map_err(|_| usage())?),
            None => (s, u32::MAX),
        };
        let how = match how {
            "stall" => ReadFault::Stall,
            "drip" => ReadFault::Drip,
            _ => return Err(usage()),
        };
        Ok(ReadFaults { how, count })
    }
}

/// The configured hostile behaviours.
#[derive(Debug, Default)]
pub struct Hostile {
    slow: HashMap<String, Duration>,
    reads: ReadFault,
    /// Reads still to misbehave.
    bad_reads: AtomicU32,
    output_size: Option<u64>,
    stderr_size: Option<u64>,
    /// Compressed reads get [`zstd_bomb`] instead of the blob.
    zstd_bomb: bool,
    /// `--fault-absurd-timestamps`: executed actions' metadata reports absurd timestamps.
    absurd_timestamps: bool,
}

impl Hostile {
    pub fn new(
        slow: &[SlowRule],
        reads: Option<ReadFaults>,
        output_size: Option<u64>,
        stderr_size: Option<u64>,
    ) -> Hostile {
        Hostile {
            slow: slow.iter().map(|r| (r.rpc.clone(), r.delay)).collect(),
            reads: reads.map_or(ReadFault::None, |r| r.how),
            bad_reads: AtomicU32::new(reads.map_or(0, |r| r.count)),
            output_size,
            stderr_size,
            zstd_bomb: false,
            absurd_timestamps: false,
        }
    }

    /// Answers every compressed ByteStream read with a zstd bomb (`--fault-zstd-bomb`).
    pub fn with_zstd_bomb(self, zstd_bomb: bool) -> Hostile {
        Hostile { zstd_bomb, ..self }
    }

    /// Executed actions' metadata reports absurd timestamps (`--fault-absurd-timestamps`).
    pub fn with_absurd_timestamps(self, absurd_timestamps: bool) -> Hostile {
        Hostile {
            absurd_timestamps,
            ..self
        }
    }

    /// Whether reads misbehave (`--fault-reads`, `--fault-zstd-bomb`): outputs are then never
    /// inlined in Execute responses, so that the client reads every one.
    pub fn spoils_reads(&self) -> bool {
        self.reads != ReadFault::None || self.zstd_bomb
    }

    /// The responses of a compressed read when `--fault-zstd-bomb` is on: a frame of 128 KiB
    /// that decompresses to 4 GiB, whatever blob was asked for.
    pub fn bomb_read(&self) -> Option<BoxStream<'static, Result<ReadResponse, Status>>> {
        self.zstd_bomb.then(|| {
            let chunks: Vec<_> = zstd_bomb(BOMB_SIZE)
                .chunks(INVENTED_CHUNK as usize)
                .map(|chunk| {
                    Ok(ReadResponse {
                        data: chunk.to_vec(),
                    })
                })
                .collect();
            stream::iter(chunks).boxed()
        })
    }

    /// Delays `rpc` if a `--fault-slow` rule names it.
    pub async fn slow_down(&self, rpc: &str) {
        if let Some(delay) = self.slow.get(rpc) {
            tokio::time::sleep(*delay).await;
        }
    }

    /// Rewrites an executed action's result the way the knobs say: every output file claims
    /// `--fault-output-size` bytes, and stderr becomes an invented blob of `--fault-stderr-size`
    /// bytes (served only by ByteStream reads, never stored), and the metadata's timestamps are
    /// `--fault-absurd-timestamps`.
    pub fn lie_about(&self, result: &mut ActionResult) {
        if self.absurd_timestamps
            && let Some(meta) = &mut result.execution_metadata
        {
            let at = |seconds, nanos| Some(Timestamp { seconds, nanos });
            // Each fits in microseconds since the epoch; their differences do not.
            let (past, future) = (at(-9_223_372_036, 0), at(9_223_372_036_854, 0));
            meta.queued_timestamp = past;
            meta.worker_start_timestamp = past;
            meta.worker_completed_timestamp = future;
            meta.execution_start_timestamp = past;
            meta.execution_completed_timestamp = future;
            // These fit nothing.
            meta.input_fetch_start_timestamp = at(i64::MIN, -1);
            meta.input_fetch_completed_timestamp = at(i64::MAX, i32::MAX);
        }
        if let Some(size) = self.output_size {
            for file in &mut result.output_files {
                if let Some(digest) = &mut file.digest {
                    digest.size_bytes = i64::try_from(size).unwrap_or(i64::MAX);
                }
                file.contents.clear();
            }
        }
        if let Some(size) = self.stderr_size {
            result.stderr_raw.clear();
            result.stderr_digest = Some(Digest {
                hash: INVENTED_HASH.to_owned(),
                size_bytes: i64::try_from(size).unwrap_or(i64::MAX),
            });
        }
    }

    /// A read of the invented stderr blob: `limit` bytes (0: all) from `offset`, made up on the
    /// fly so that the server holds none of it. None for any other blob.
    pub fn invented_read(
        &self,
        hash: &str,
        offset: u64,
        limit: u64,
    ) -> Option<BoxStream<'static, Result<ReadResponse, Status>>> {
        let size = self.stderr_size.filter(|_| hash == INVENTED_HASH)?;
        let end = if limit == 0 {
            size
        } else {
            size.min(offset.saturating_add(limit))
        };
        let chunks = stream::unfold(offset, move |at| async move {
            (at < end).then(|| {
                let len = (end - at).min(INVENTED_CHUNK);
                let data = vec![b'w'; usize::try_from(len).unwrap_or(0)];
                (Ok(ReadResponse { data }), at + len)
            })
        });
        Some(chunks.boxed())
    }

    /// The responses of a ByteStream read, misbehaving as `--fault-reads` says (while it has reads
    /// left).
    pub fn read_stream(
        &self,
        chunks: Vec<Result<ReadResponse, Status>>,
    ) -> BoxStream<'static, Result<ReadResponse, Status>> {
        let misbehave = self
            .bad_reads
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        match if misbehave {
            self.reads
        } else {
            ReadFault::None
        } {
            ReadFault::None => stream::iter(chunks).boxed(),
            ReadFault::Stall => stream::iter(chunks.into_iter().take(1))
                .chain(stream::pending())
                .boxed(),
            ReadFault::Drip => {
                let bytes: Vec<u8> = chunks
                    .into_iter()
                    .filter_map(Result::ok)
                    .flat_map(|r| r.data)
                    .collect();
                stream::iter(bytes)
                    .then(|byte| async move {
                        tokio::time::sleep(DRIP_INTERVAL).await;
                        Ok(ReadResponse { data: vec![byte] })
                    })
                    .boxed()
            }
        }
    }
}

/// A zstd frame that decompresses to `size` zero bytes (rounded up to 128 KiB) in 4 bytes per
/// 128 KiB: RLE blocks, each a 3-byte header saying "repeat the next byte 128 Ki times" (RFC 8878,
/// 3.1.1.2). Made by hand because zstd itself would have to read all `size` bytes to make it.
fn zstd_bomb(size: u64) -> Vec<u8> {
    const BLOCK: u32 = 128 << 10;
    let blocks = size.div_ceil(u64::from(BLOCK)).max(1);
    let mut frame = Vec::with_capacity(6 + 4 * blocks as usize);
    frame.extend_from_slice(&0xFD2F_B528u32.to_le_bytes());
    // Frame header: no content size, no checksum, no dictionary; a 128 KiB window (2^(10+7)).
    frame.extend_from_slice(&[0x00, 7 << 3]);
    for i in 0..blocks {
        let last = u32::from(i + 1 == blocks);
        let header = (BLOCK << 3) | (1 << 1) | last;
        frame.extend_from_slice(&header.to_le_bytes()[..3]);
        frame.push(0);
    }
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_slow_rules() {
        let rule: SlowRule = "GetActionResult=1500".parse().unwrap();
        assert_eq!(rule.delay, Duration::from_millis(1500));
        assert!("Nope=1".parse::<SlowRule>().is_err());
        assert!("Execute=soon".parse::<SlowRule>().is_err());
    }

    #[test]
    fn parses_read_faults() {
        let faults: ReadFaults = "stall:2".parse().unwrap();
        assert_eq!((faults.how, faults.count), (ReadFault::Stall, 2));
        let faults: ReadFaults = "drip".parse().unwrap();
        assert_eq!((faults.how, faults.count), (ReadFault::Drip, u32::MAX));
        assert!("slow".parse::<ReadFaults>().is_err());
        assert!("stall:x".parse::<ReadFaults>().is_err());
    }

    #[test]
    fn the_bomb_is_small_and_decompresses_to_its_size() {
        use std::io::Read as _;
        let bomb = zstd_bomb(BOMB_SIZE);
        assert_eq!(bomb.len(), 6 + 4 * (BOMB_SIZE as usize >> 17));
        let small = zstd_bomb(1 << 20);
        let mut out = Vec::new();
        zstd::stream::read::Decoder::new(&small[..])
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, vec![0; 1 << 20]);
        let hostile = Hostile::new(&[], None, None, None);
        assert!(hostile.bomb_read().is_none());
        assert!(hostile.with_zstd_bomb(true).bomb_read().is_some());
    }

    #[tokio::test]
    async fn invents_only_its_own_blob_and_only_what_is_asked() {
        let hostile = Hostile::new(&[], None, None, Some(200_000));
        assert!(hostile.invented_read("ab", 0, 0).is_none());
        let read: Vec<_> = hostile
            .invented_read(INVENTED_HASH, 10, 100_000)
            .unwrap()
            .collect()
            .await;
        let total: usize = read.iter().map(|r| r.as_ref().unwrap().data.len()).sum();
        assert_eq!(total, 100_000);
        let mut result = ActionResult::default();
        hostile.lie_about(&mut result);
        assert_eq!(result.stderr_digest.unwrap().size_bytes, 200_000);
    }
}
