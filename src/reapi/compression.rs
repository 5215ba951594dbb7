//! zstd for blob transfers (REAPI's compressed-blobs): what travels compressed, the codec both the
//! client and `serve` use, and the streaming encoder and decoder of ByteStream transfers.
//!
//! Digests always name the uncompressed bytes, so compression changes only what is on the wire:
//! every blob is still verified against its digest after decompression. A blob is compressed only
//! when the server lists zstd in its capabilities, the user has not turned compression off, and
//! the blob is at least [`MIN_COMPRESSED_SIZE`] bytes.
//!
//! Decompression trusts nothing it is sent: a few KiB of zstd can expand to GiBs. Output comes in
//! steps of at most [`STEP`] bytes, each checked against the size the digest names before the next
//! is made, and a frame may not ask for a window above [`MAX_WINDOW_LOG`]; so what one transfer
//! can make the process hold is bounded whatever arrives.

use std::io::{self, BufReader, Read};
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use bazel_remote_apis::build::bazel::remote::execution::v2::compressor;
use zstd::stream::raw::{DParameter, Operation as _};

/// The zstd level: the library's default, the usual trade-off for network transfers.
pub const LEVEL: i32 = 3;

/// Blobs smaller than this travel uncompressed. Measured with the zstd crate on this project's
/// blobs (a loaded 2-core machine): each compression costs about 20 µs however small the blob,
/// and a zstd frame adds about 10 bytes; Directory, Command and Action messages and index shards
/// (typically 100–500 bytes) shrink by 0–25% or grow (a 296-byte shard became 306 bytes), while
/// from a few kilobytes on bitcode shrinks by 12–20% and native objects by 70%.
pub const MIN_COMPRESSED_SIZE: u64 = 1024;

/// The REAPI enum value of zstd.
pub const ZSTD: i32 = compressor::Value::Zstd as i32;

/// The REAPI enum value of no compression.
pub const IDENTITY: i32 = compressor::Value::Identity as i32;

/// The resource-name segment of zstd (`compressed-blobs/zstd/...`).
pub const ZSTD_NAME: &str = "zstd";

/// Whether a blob of `size` bytes is worth compressing.
pub fn worth_compressing(size: u64) -> bool {
    size >= MIN_COMPRESSED_SIZE
}

/// How many idle compressors are kept: about as many as compress at once on a typical machine;
/// more would only hold memory (each is a few hundred KiB).
const POOLED_COMPRESSORS: usize = 8;

/// `data` compressed as one zstd frame, by a compressor from a small shared pool: making a zstd
/// context (and zeroing its tables) costs about as much as compressing a small blob, and a cold
/// link uploads a few per job. A pool rather than one per thread, because compressions run on
/// the blocking pool's threads, which come and go: per-thread contexts were made again on each
/// new thread and kept by every idle one (30 of them, 7 MiB, in one 31-job link).
pub fn compress(data: &[u8]) -> io::Result<Vec<u8>> {
    static POOL: Mutex<Vec<zstd::bulk::Compressor<'static>>> = Mutex::new(Vec::new());
    let pooled = POOL.lock().unwrap_or_else(PoisonError::into_inner).pop();
    let mut compressor = match pooled {
        Some(compressor) => compressor,
        None => zstd::bulk::Compressor::new(LEVEL)?,
    };
    let compressed = compressor.compress(data);
    let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    if pool.len() < POOLED_COMPRESSORS {
        pool.push(compressor);
    }
    compressed
}

/// The most bytes a zstd frame of `size` uncompressed bytes can take: the bound on what a
/// compressed upload of that blob may send.
pub fn max_compressed_size(size: u64) -> u64 {
    usize::try_from(size).map_or(u64::MAX, |n| zstd::zstd_safe::compress_bound(n) as u64)
}

/// The most output one decompression step makes before it is checked against the blob's size.
const STEP: usize = 256 << 10;

/// The largest window (as a power of two: 8 MiB) a frame may need. zstd allocates the window a
/// frame header asks for, so without a limit one small frame could make the process hold 2 GiB.
/// 8 MiB is what RFC 8878 asks every decoder to support, and more than zstd's levels up to 19 and
/// the common REAPI servers' encoders use.
pub const MAX_WINDOW_LOG: u32 = 23;

/// A zstd decoder that never produces more than the `size` bytes its blob has.
struct Bounded {
    zstd: zstd::stream::raw::Decoder<'static>,
    produced: u64,
    size: u64,
    /// The last step ended at the end of a frame.
    at_frame_end: bool,
}

impl Bounded {
    fn new(size: u64) -> io::Result<Bounded> {
        let mut zstd = zstd::stream::raw::Decoder::new()?;
        zstd.set_parameter(DParameter::WindowLogMax(MAX_WINDOW_LOG))?;
        Ok(Bounded {
            zstd,
            produced: 0,
            size,
            at_frame_end: true,
        })
    }

    /// Decodes from the front of `input` (consuming it) up to [`STEP`] bytes of output; empty when
    /// `input` is used up and nothing is left to come out. An error once the output passes `size`
    /// (blocking: CPU-bound).
    fn step(&mut self, input: &mut &[u8]) -> io::Result<Vec<u8>> {
        let mut out = vec![0; STEP];
        let mut written = 0;
        while written < STEP {
            let status = self.zstd.run_on_buffers(input, &mut out[written..])?;
            *input = &input[status.bytes_read..];
            written += status.bytes_written;
            if status.bytes_read == 0 && status.bytes_written == 0 {
                break;
            }
            self.at_frame_end = status.remaining == 0;
        }
        out.truncate(written);
        self.produced += written as u64;
        if self.produced > self.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("decompresses to more than the {} bytes named", self.size),
            ));
        }
        Ok(out)
    }
}

/// Decompresses `data`, which must hold exactly `size` bytes once decompressed (a frame that
/// would grow beyond `size` is an error after at most [`STEP`] more bytes, not a memory blow-up).
/// Blocking (CPU-bound): call from a blocking thread.
pub fn decompress(mut data: &[u8], size: u64) -> io::Result<Vec<u8>> {
    let mut decoder = Bounded::new(size)?;
    let mut out = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(64 << 20));
    loop {
        let step = decoder.step(&mut data)?;
        if step.is_empty() {
            break;
        }
        out.extend_from_slice(&step);
    }
    if out.len() as u64 != size || !decoder.at_frame_end {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("decompressed to {} bytes instead of {size}", out.len()),
        ));
    }
    Ok(out)
}

/// The compressed form of a blob, produced on demand a chunk at a time (never the whole blob in
/// memory). zstd is deterministic, so a resumed upload produces the same bytes again and skips
/// those the server already has.
pub(crate) struct Encoder {
    inner: zstd::stream::read::Encoder<'static, BufReader<Box<dyn Read + Send>>>,
    /// The file being compressed, for error messages (`None` for in-memory blobs).
    pub(crate) path: Option<PathBuf>,
}

impl Encoder {
    /// Compresses in-memory `data` (shared with the blob, across upload attempts).
    pub(crate) fn of_bytes(data: bytes::Bytes) -> io::Result<Encoder> {
        Self::new(Box::new(io::Cursor::new(data)), None)
    }

    /// Compresses the file at `path` (blocking: call from a blocking thread).
    pub(crate) fn of_file(path: PathBuf) -> io::Result<Encoder> {
        let file = std::fs::File::open(&path)?;
        Self::new(Box::new(file), Some(path))
    }

    fn new(reader: Box<dyn Read + Send>, path: Option<PathBuf>) -> io::Result<Encoder> {
        Ok(Encoder {
            inner: zstd::stream::read::Encoder::new(reader, LEVEL)?,
            path,
        })
    }

    /// Up to `max` compressed bytes; fewer only at the end of the frame (blocking).
    pub(crate) fn read_chunk(&mut self, max: usize) -> io::Result<Vec<u8>> {
        let mut chunk = Vec::with_capacity(max);
        (&mut self.inner).take(max as u64).read_to_end(&mut chunk)?;
        Ok(chunk)
    }

    /// Skips the first `n` compressed bytes (those a resumed upload's server has); false if the
    /// frame is shorter (blocking).
    pub(crate) fn skip(&mut self, n: u64) -> io::Result<bool> {
        let skipped = io::copy(&mut (&mut self.inner).take(n), &mut io::sink())?;
        Ok(skipped == n)
    }
}

/// Decompresses a ByteStream read as it arrives, across resumed attempts, refusing to produce
/// more than the blob's size: compressed messages go in with [`push`](Self::push), and come out
/// a [`STEP`] at a time with [`next`](Self::next), each step on a blocking thread.
pub(crate) struct StreamDecoder {
    /// `None` only while a step runs (or after one was abandoned mid-way: see [`next`]).
    state: Option<StreamState>,
}

struct StreamState {
    decoder: Bounded,
    /// Compressed bytes not decoded yet, from `consumed` on.
    input: Vec<u8>,
    consumed: usize,
}

impl StreamDecoder {
    pub(crate) fn new(size: u64) -> io::Result<StreamDecoder> {
        Ok(StreamDecoder {
            state: Some(StreamState {
                decoder: Bounded::new(size)?,
                input: Vec::new(),
                consumed: 0,
            }),
        })
    }

    /// Queues compressed bytes for [`next`](Self::next).
    pub(crate) fn push(&mut self, compressed: Vec<u8>) {
        if let Some(state) = &mut self.state {
            if state.consumed == state.input.len() {
                state.input = compressed;
            } else {
                state.input.drain(..state.consumed);
                state.input.extend_from_slice(&compressed);
            }
            state.consumed = 0;
        }
    }

    /// The next uncompressed bytes (at most [`STEP`]), or `None` when the queued input is used up.
    /// Cancelled mid-way (a timeout around it), it loses the stream: later calls are errors.
    pub(crate) async fn next(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut state = self.state.take().ok_or_else(|| {
            io::Error::other("a decompression step was interrupted; the stream cannot go on")
        })?;
        let (state, out) = tokio::task::spawn_blocking(move || {
            let mut input = &state.input[state.consumed..];
            let out = state.decoder.step(&mut input);
            state.consumed = state.input.len() - input.len();
            (state, out)
        })
        .await
        .map_err(io::Error::other)?;
        self.state = Some(state);
        let out = out?;
        Ok((!out.is_empty()).then_some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i % 251) as u8 ^ (i / 4096) as u8)
            .collect()
    }

    #[test]
    fn round_trips_and_bounds_the_output() {
        for len in [0, 1, 1000, 300_000] {
            let data = sample(len);
            let packed = compress(&data).unwrap();
            assert!(packed.len() as u64 <= max_compressed_size(len as u64));
            assert_eq!(decompress(&packed, len as u64).unwrap(), data);
            if len > 0 {
                assert!(decompress(&packed, len as u64 - 1).is_err());
            }
            assert!(decompress(&packed, len as u64 + 1).is_err());
        }
        assert!(decompress(b"not zstd at all", 15).is_err());
    }

    #[test]
    fn the_streaming_encoder_is_deterministic_and_resumable() {
        let data = bytes::Bytes::from(sample(200_000));
        let mut whole = Encoder::of_bytes(data.clone()).unwrap();
        let mut all = Vec::new();
        loop {
            let chunk = whole.read_chunk(7000).unwrap();
            let last = chunk.len() < 7000;
            all.extend(chunk);
            if last {
                break;
            }
        }
        assert_eq!(decompress(&all, data.len() as u64).unwrap(), data);
        // A second encoder skipping a prefix continues with exactly the same bytes.
        let mut resumed = Encoder::of_bytes(data.clone()).unwrap();
        assert!(resumed.skip(1234).unwrap());
        assert_eq!(resumed.read_chunk(all.len()).unwrap(), all[1234..]);
        let mut short = Encoder::of_bytes(data).unwrap();
        assert!(!short.skip(all.len() as u64 + 1).unwrap());
    }

    /// Everything `decoder` makes of `pieces` pushed one after the other; the error, if any.
    async fn stream(decoder: &mut StreamDecoder, pieces: &[&[u8]]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        for piece in pieces {
            decoder.push(piece.to_vec());
            while let Some(step) = decoder.next().await? {
                assert!(step.len() <= STEP);
                out.extend(step);
            }
        }
        Ok(out)
    }

    #[tokio::test]
    async fn the_stream_decoder_takes_any_split_and_refuses_too_much() {
        let data = sample(1_000_000);
        let packed = compress(&data).unwrap();
        let pieces: Vec<&[u8]> = packed.chunks(333).collect();
        let mut decoder = StreamDecoder::new(data.len() as u64).unwrap();
        assert_eq!(stream(&mut decoder, &pieces).await.unwrap(), data);
        let mut small = StreamDecoder::new(10).unwrap();
        let err = stream(&mut small, &pieces).await.unwrap_err();
        assert!(err.to_string().contains("more than the 10 bytes"), "{err}");
    }

    #[tokio::test]
    async fn a_bomb_stops_after_one_step_past_the_size() {
        // 64 MiB of zeros in a few KiB; the blob is said to be 1 MiB.
        let bomb = compress(&vec![0; 64 << 20]).unwrap();
        assert!(bomb.len() < 64 << 10, "{}", bomb.len());
        let mut decoder = StreamDecoder::new(1 << 20).unwrap();
        decoder.push(bomb.clone());
        let mut produced = 0;
        let err = loop {
            match decoder.next().await {
                Ok(Some(step)) => produced += step.len(),
                Ok(None) => panic!("the bomb ended"),
                Err(e) => break e,
            }
        };
        assert!(produced <= 1 << 20, "{produced}");
        assert!(
            err.to_string().contains("more than the 1048576 bytes"),
            "{err}"
        );
        assert!(decompress(&bomb, 1 << 20).is_err());
    }

    #[test]
    fn frames_asking_for_a_huge_window_are_refused() {
        let data = sample(100_000);
        let mut encoder = zstd::stream::raw::Encoder::new(LEVEL).unwrap();
        encoder
            .set_parameter(zstd::stream::raw::CParameter::WindowLog(MAX_WINDOW_LOG + 4))
            .unwrap();
        let mut wide = zstd::stream::write::Encoder::with_encoder(Vec::new(), encoder);
        std::io::Write::write_all(&mut wide, &data).unwrap();
        let wide = wide.finish().unwrap();
        let err = decompress(&wide, data.len() as u64).unwrap_err();
        assert!(err.to_string().contains("too much memory"), "{err}");
    }
}
