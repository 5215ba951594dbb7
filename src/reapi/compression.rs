//! zstd for blob transfers (REAPI's compressed-blobs): what travels compressed, the codec both the
//! client and `serve` use, and the streaming encoder and decoder of ByteStream transfers.
//!
//! Digests always name the uncompressed bytes, so compression changes only what is on the wire:
//! every blob is still verified against its digest after decompression. A blob is compressed only
//! when the server lists zstd in its capabilities, the user has not turned compression off, and
//! the blob is at least [`MIN_COMPRESSED_SIZE`] bytes.

use std::io::{self, BufReader, Read, Write as _};
use std::path::PathBuf;
use std::sync::Arc;

use bazel_remote_apis::build::bazel::remote::execution::v2::compressor;

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

/// `data` compressed as one zstd frame.
pub fn compress(data: &[u8]) -> io::Result<Vec<u8>> {
    zstd::bulk::compress(data, LEVEL)
}

/// The most bytes a zstd frame of `size` uncompressed bytes can take: the bound on what a
/// compressed upload of that blob may send.
pub fn max_compressed_size(size: u64) -> u64 {
    usize::try_from(size).map_or(u64::MAX, |n| zstd::zstd_safe::compress_bound(n) as u64)
}

/// Decompresses `data`, which must hold exactly `size` bytes once decompressed (never more is
/// allocated: a frame that would grow beyond `size` is an error, not a memory blow-up).
pub fn decompress(data: &[u8], size: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(64 << 20));
    zstd::stream::read::Decoder::new(data)?
        .take(size.saturating_add(1))
        .read_to_end(&mut out)?;
    if out.len() as u64 != size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "decompressed to {}{} bytes instead of {size}",
                out.len(),
                if out.len() as u64 > size { "+" } else { "" }
            ),
        ));
    }
    Ok(out)
}

/// In-memory content shared across upload attempts.
struct SharedBytes(Arc<Vec<u8>>);

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
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
    /// Compresses in-memory `data`.
    pub(crate) fn of_bytes(data: Arc<Vec<u8>>) -> io::Result<Encoder> {
        Self::new(Box::new(io::Cursor::new(SharedBytes(data))), None)
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
/// more than the blob's size.
pub(crate) struct StreamDecoder {
    inner: zstd::stream::write::Decoder<'static, Vec<u8>>,
    produced: u64,
    size: u64,
}

impl StreamDecoder {
    pub(crate) fn new(size: u64) -> io::Result<StreamDecoder> {
        Ok(StreamDecoder {
            inner: zstd::stream::write::Decoder::new(Vec::new())?,
            produced: 0,
            size,
        })
    }

    /// Feeds compressed bytes; returns the uncompressed bytes they completed.
    pub(crate) fn feed(&mut self, compressed: &[u8]) -> io::Result<Vec<u8>> {
        self.inner.write_all(compressed)?;
        self.inner.flush()?;
        let out = std::mem::take(self.inner.get_mut());
        self.produced += out.len() as u64;
        if self.produced > self.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("decompresses to more than the {} bytes named", self.size),
            ));
        }
        Ok(out)
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
        let data = Arc::new(sample(200_000));
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
        assert_eq!(decompress(&all, data.len() as u64).unwrap(), *data);
        // A second encoder skipping a prefix continues with exactly the same bytes.
        let mut resumed = Encoder::of_bytes(data.clone()).unwrap();
        assert!(resumed.skip(1234).unwrap());
        assert_eq!(resumed.read_chunk(all.len()).unwrap(), all[1234..]);
        let mut short = Encoder::of_bytes(data).unwrap();
        assert!(!short.skip(all.len() as u64 + 1).unwrap());
    }

    #[test]
    fn the_stream_decoder_takes_any_split_and_refuses_too_much() {
        let data = sample(100_000);
        let packed = compress(&data).unwrap();
        let mut decoder = StreamDecoder::new(data.len() as u64).unwrap();
        let mut out = Vec::new();
        for piece in packed.chunks(333) {
            out.extend(decoder.feed(piece).unwrap());
        }
        assert_eq!(out, data);
        let mut small = StreamDecoder::new(10).unwrap();
        assert!(packed.chunks(333).any(|piece| small.feed(piece).is_err()));
    }
}
