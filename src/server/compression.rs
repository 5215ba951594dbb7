//! zstd on the server side of REAPI's compressed-blobs: ByteStream reads and writes of
//! `compressed-blobs/zstd/...`, BatchUpdateBlobs entries with `compressor` ZSTD and BatchReadBlobs
//! answers for clients that accept zstd. Blobs are stored uncompressed; compressed uploads are
//! decompressed (within their digest's size) and verified like any other. `--no-compression` turns
//! all of it off: the capabilities then list identity only and compressed requests are refused.

use super::digest::BlobDigest;
use crate::reapi::compression::{self, IDENTITY, ZSTD, ZSTD_NAME};
use tonic::Status;

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
/// decompress to exactly the digest's size; the digest itself is checked when it is stored).
pub fn decode(data: &[u8], digest: &BlobDigest) -> Result<Vec<u8>, Status> {
    compression::decompress(data, digest.size)
        .map_err(|e| Status::invalid_argument(format!("zstd data of blob {digest}: {e}")))
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
