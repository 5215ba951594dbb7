//! zstd on the server side of REAPI's compressed-blobs: ByteStream reads and writes of
//! `compressed-blobs/zstd/...`, BatchUpdateBlobs entries with `compressor` ZSTD and BatchReadBlobs
//! answers for clients that accept zstd. Blobs are stored uncompressed; compressed uploads are
//! decompressed (within their digest's size) and verified like any other. `--no-compression` turns
//! all of it off: the capabilities then list identity only and compressed requests are refused.
//!
//! A few KiB of zstd can expand to GiBs, so decompression is bounded: output comes in small steps,
//! each checked against the digest's size, and a blob bigger than [`SINGLE_PASS_MAX`] is first
//! only hashed and kept only once it has proved to be the blob its digest names. Decompression
//! blocks: callers run it off the async threads.

use super::digest::BlobDigest;
use crate::reapi::compression::{self, IDENTITY, ZSTD, ZSTD_NAME};
use sha2::{Digest as _, Sha256};
use std::io::Read as _;
use tonic::Status;

/// Decompressed bytes produced (and checked) per step.
const STEP: usize = 64 << 10;

/// Blobs up to this size are decompressed once, straight into memory; bigger ones are verified
/// in a first pass that keeps nothing, so that a lying digest costs no memory.
pub const SINGLE_PASS_MAX: u64 = 16 << 20;

/// The compressors this server offers, for the capabilities.
pub fn offered(enabled: bool) -> Vec<i32> {
    if enabled {
        vec![IDENTITY, ZSTD]
    } else {
        vec![IDENTITY]
    }
}

/// Checks a compressor named in a resource name (`compressed-blobs/NAME/...`).
pub fn check_name(enabled: bool, name: &str) -> Result<(), Status> {
    if name != ZSTD_NAME {
        return Err(Status::invalid_argument(format!(
            "unknown compressor {name:?}; this server offers {ZSTD_NAME}"
        )));
    }
    check_enabled(enabled)
}

fn check_enabled(enabled: bool) -> Result<(), Status> {
    if enabled {
        Ok(())
    } else {
        Err(Status::invalid_argument(
            "compressed transfers are off on this server (--no-compression)",
        ))
    }
}

/// The blob content of a BatchUpdateBlobs entry sent with `compressor`.
pub fn decode_batch_entry(
    enabled: bool,
    compressor: i32,
    data: Vec<u8>,
    digest: &BlobDigest,
) -> Result<Vec<u8>, Status> {
    match compressor {
        IDENTITY => Ok(data),
        ZSTD => {
            check_enabled(enabled)?;
            decode(&data, digest)
        }
        other => Err(Status::invalid_argument(format!(
            "compressor {other} is not supported"
        ))),
    }
}

/// The blob of `digest` from its zstd-compressed form (INVALID_ARGUMENT if it does not
/// decompress to exactly the digest's size and content). Blocking.
pub fn decode(data: &[u8], digest: &BlobDigest) -> Result<Vec<u8>, Status> {
    let mut blob = Vec::new();
    if digest.size > SINGLE_PASS_MAX {
        let mut hasher = Sha256::new();
        decompress(data, digest, |chunk| hasher.update(chunk))?;
        let hash = hex::encode(hasher.finalize());
        if hash != digest.hash {
            return Err(Status::invalid_argument(format!(
                "zstd data of blob {digest} decompresses to data of another digest ({hash})"
            )));
        }
        blob.reserve_exact(usize::try_from(digest.size).unwrap_or(usize::MAX));
    }
    decompress(data, digest, |chunk| blob.extend_from_slice(chunk))?;
    Ok(blob)
}

/// Decompresses `data` a step at a time into `sink`, failing as soon as the output exceeds the
/// size of `digest`, or if it ends short of it.
fn decompress(data: &[u8], digest: &BlobDigest, mut sink: impl FnMut(&[u8])) -> Result<(), Status> {
    let bad = |why: String| Status::invalid_argument(format!("zstd data of blob {digest}: {why}"));
    let mut decoder =
        zstd::stream::read::Decoder::with_buffer(data).map_err(|e| bad(e.to_string()))?;
    let mut step = vec![0; STEP];
    let mut total = 0u64;
    loop {
        let n = decoder.read(&mut step).map_err(|e| bad(e.to_string()))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > digest.size {
            return Err(bad(format!(
                "decompresses to more than the {} bytes of the blob",
                digest.size
            )));
        }
        sink(&step[..n]);
    }
    if total != digest.size {
        return Err(bad(format!(
            "decompresses to {total} bytes instead of {}",
            digest.size
        )));
    }
    Ok(())
}

/// The compressed form of a blob, as a compressed ByteStream read serves it.
pub fn encode(data: &[u8]) -> Result<Vec<u8>, Status> {
    compression::compress(data).map_err(|e| Status::internal(format!("zstd: {e}")))
}

/// A BatchReadBlobs answer: zstd when the client accepts it, this server offers it, the blob is
/// worth compressing and compression makes it smaller; else the blob as it is.
pub fn encode_batch_entry(enabled: bool, acceptable: &[i32], data: Vec<u8>) -> (Vec<u8>, i32) {
    if enabled
        && acceptable.contains(&ZSTD)
        && compression::worth_compressing(data.len() as u64)
        && let Ok(packed) = compression::compress(&data)
        && packed.len() < data.len()
    {
        return (packed, ZSTD);
    }
    (data, IDENTITY)
}

/// The most bytes a compressed upload of `digest` may send.
pub fn max_upload_size(digest: &BlobDigest) -> u64 {
    compression::max_compressed_size(digest.size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_only_what_the_digest_names() {
        let blob = vec![7u8; (SINGLE_PASS_MAX + 5) as usize];
        let digest = BlobDigest::of(&blob);
        let packed = encode(&blob).unwrap();
        assert_eq!(decode(&packed, &digest).unwrap(), blob);

        // Same size, other content: refused after the hashing pass.
        let other = BlobDigest {
            hash: BlobDigest::of(b"x").hash,
            size: digest.size,
        };
        let err = decode(&packed, &other).unwrap_err();
        assert!(err.message().contains("another digest"), "{err:?}");

        // A frame expanding beyond the digest's size stops at the first step past it.
        let small = BlobDigest {
            hash: digest.hash.clone(),
            size: 1000,
        };
        let err = decode(&packed, &small).unwrap_err();
        assert!(
            err.message().contains("more than the 1000 bytes"),
            "{err:?}"
        );
        let err = decode(&packed[..packed.len() / 2], &digest).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }
}
