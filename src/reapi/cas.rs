//! Content-addressable storage: what the transfers share — the blobs to upload, which of them the
//! server lacks (FindMissingBlobs), batch packing, the stubs and deadlines of CAS calls, and where
//! downloaded bytes go.
//!
//! Small blobs travel in batches up to the server's batch limit (every per-blob status checked),
//! large ones through ByteStream (`bytestream`), streamed from and to files so that a large object
//! never sits whole in memory. Uploads are in `upload`, downloads in `download`. Where the server
//! offers zstd, blobs travel compressed (see [`super::compression`]); the digests and every check
//! stay on the uncompressed bytes.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::connections::CountedChannel;
use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use bazel_remote_apis::google::bytestream::byte_stream_client::ByteStreamClient;
use futures::{StreamExt as _, TryStreamExt as _};
use prost::Message as _;
use tokio::io::{AsyncSeekExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

use super::client::{Client, Inner, MAX_MESSAGE_BYTES};
use super::compression::{self};
use super::digest::{self, Digest};
use super::error::ReapiError;
use super::metadata::CallContext;
use super::retry;

/// Digests per FindMissingBlobs request (about 1 MB of request).
pub(super) const FIND_MISSING_CHUNK: usize = 10_000;

/// Requests of one transfer call in flight at once.
pub(super) const CONCURRENCY: usize = 8;

/// ByteStream message payload size.
pub(super) const STREAM_CHUNK: usize = 1 << 20;

/// ByteStream transfers get this much time per byte on top of the call timeout (1 MiB/s), so that
/// a slow link can finish a large object while a stalled one still fails.
pub(super) const MIN_THROUGHPUT_BYTES_PER_SEC: u64 = 1 << 20;

/// The largest blob the client downloads (a native object is megabytes): a digest from the server
/// claiming more is a server error, not a reason to fill the disk or wait for days.
pub const MAX_DOWNLOAD_BYTES: u64 = 4 << 30;

/// Room for the fields of a batch request or response other than the blobs themselves
/// (instance name aside): the digest function and, per blob, a status.
pub(super) const BATCH_SLACK: usize = 64;

/// Where the content of a blob to upload is.
#[derive(Debug, Clone)]
pub enum BlobSource {
    /// Content in memory, shared: a blob is cloned into every upload that may carry it (and kept
    /// for a retry), which copies no content.
    Bytes(bytes::Bytes),
    /// A file whose content has the blob's digest; read when uploaded, in chunks if large.
    File(PathBuf),
    /// Content made only if it must be uploaded (whose digest was known without making it).
    Deferred(Deferred),
}

/// Makes a blob's content on demand; fails, saying why, if it cannot (or makes other content than
/// its digest says).
#[derive(Clone)]
pub struct Deferred(pub Arc<dyn Fn() -> Result<Vec<u8>, String> + Send + Sync>);

impl Deferred {
    /// The content, or a [`ReapiError::Config`] naming the blob.
    pub fn make(&self, digest: &Digest) -> Result<Vec<u8>, ReapiError> {
        (self.0)().map_err(|e| {
            ReapiError::Config(format!("making blob {}: {e}", digest::display(digest)))
        })
    }
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deferred")
    }
}

/// A blob to upload: its digest and where its content is.
#[derive(Debug, Clone)]
pub struct Blob {
    pub digest: Digest,
    pub source: BlobSource,
}

impl Blob {
    /// A blob of in-memory bytes (the digest is computed here).
    pub fn from_bytes(data: Vec<u8>) -> Blob {
        Blob {
            digest: digest::of_bytes(&data),
            source: BlobSource::Bytes(data.into()),
        }
    }

    /// A blob whose content is the file at `path`, already hashed to `digest`.
    pub fn from_file(path: PathBuf, digest: Digest) -> Blob {
        Blob {
            digest,
            source: BlobSource::File(path),
        }
    }
}

/// `{instance}/{tail}`, without a leading slash when the instance name is empty.
pub(super) fn resource_name(instance: &str, tail: &str) -> String {
    if instance.is_empty() {
        tail.to_string()
    } else {
        format!("{instance}/{tail}")
    }
}

/// Bytes one blob adds to a batch request or response: its entry with digest and data.
pub(super) fn batch_entry_len(d: &Digest) -> usize {
    use prost::encoding::{encoded_len_varint, key_len};
    let digest_len = d.encoded_len();
    let size = digest::size(d);
    let data_len = if size == 0 {
        0
    } else {
        key_len(2) + encoded_len_varint(size) + size as usize
    };
    let entry = key_len(1) + encoded_len_varint(digest_len as u64) + digest_len + data_len;
    key_len(2) + encoded_len_varint(entry as u64) + entry
}

/// Groups items into batches whose summed `len` (plus `base` each) stays within `limit`, in order.
/// An item larger than the limit on its own gets a batch of its own.
pub(super) fn pack<T>(
    items: Vec<T>,
    base: usize,
    limit: usize,
    len: impl Fn(&T) -> usize,
) -> Vec<Vec<T>> {
    let mut batches: Vec<Vec<T>> = Vec::new();
    let mut current = Vec::new();
    let mut used = base;
    for item in items {
        let n = len(&item);
        if !current.is_empty() && used + n > limit {
            batches.push(std::mem::take(&mut current));
            used = base;
        }
        used += n;
        current.push(item);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// Drops the empty blob (always present by definition) and repeated digests.
pub(super) fn unique_nonempty<T>(items: Vec<T>, digest: impl Fn(&T) -> &Digest) -> Vec<T> {
    let mut seen = HashSet::new();
    items
        .into_iter()
        .filter(|item| {
            let d = digest(item);
            d.size_bytes != 0 && seen.insert((d.hash.clone(), d.size_bytes))
        })
        .collect()
}

pub(super) fn digest_key(d: &Digest) -> (&str, i64) {
    (d.hash.as_str(), d.size_bytes)
}

impl Client {
    /// The digests among `digests` that the server does not have (the empty blob is never missing).
    pub async fn find_missing(
        &self,
        digests: &[Digest],
        ctx: &CallContext,
    ) -> Result<Vec<Digest>, ReapiError> {
        let unique = unique_nonempty(digests.iter().collect(), |d| d);
        let chunks: Vec<Vec<Digest>> = unique
            .chunks(FIND_MISSING_CHUNK)
            .map(|c| c.iter().map(|d| (*d).clone()).collect())
            .collect();
        let inner = &self.inner;
        let missing: Vec<Vec<Digest>> = futures::stream::iter(chunks)
            .map(|chunk| inner.find_missing_chunk(chunk, ctx))
            .buffered(CONCURRENCY)
            .try_collect()
            .await?;
        Ok(missing.into_iter().flatten().collect())
    }
}

/// Where downloaded bytes go.
pub(super) enum Sink<'a> {
    Memory(&'a mut Vec<u8>),
    File(&'a mut tokio::fs::File, &'a Path),
}

impl Sink<'_> {
    pub(super) async fn write(&mut self, data: &[u8]) -> Result<(), ReapiError> {
        match self {
            Sink::Memory(v) => {
                v.extend_from_slice(data);
                Ok(())
            }
            Sink::File(f, path) => f.write_all(data).await.map_err(|source| ReapiError::Io {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Empties the sink before the blob is read again.
    pub(super) async fn restart(&mut self) -> Result<(), ReapiError> {
        match self {
            Sink::Memory(v) => {
                v.clear();
                Ok(())
            }
            Sink::File(f, path) => async {
                f.set_len(0).await?;
                f.seek(io::SeekFrom::Start(0)).await.map(drop)
            }
            .await
            .map_err(|source| ReapiError::Io {
                path: path.to_path_buf(),
                source,
            }),
        }
    }
}

impl Inner {
    pub(super) fn cas(
        &self,
    ) -> re::content_addressable_storage_client::ContentAddressableStorageClient<CountedChannel>
    {
        re::content_addressable_storage_client::ContentAddressableStorageClient::new(self.channel())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    pub(super) fn byte_stream(&self) -> ByteStreamClient<CountedChannel> {
        ByteStreamClient::new(self.channel()).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Whether a blob of `size` bytes travels zstd-compressed through ByteStream and BatchReadBlobs.
    pub(super) fn zstd_for(&self, size: u64) -> bool {
        self.compression && self.capabilities.zstd && compression::worth_compressing(size)
    }

    /// Bytes of a batch request besides its blobs.
    pub(super) fn batch_base(&self) -> usize {
        BATCH_SLACK + self.instance_name.len()
    }

    /// Whether a blob travels in a batch rather than through ByteStream.
    pub(super) fn fits_batch(&self, d: &Digest) -> bool {
        self.batch_base() + batch_entry_len(d) <= self.capabilities.max_batch_bytes
    }

    /// The deadline of a ByteStream transfer of `size` bytes starting now.
    pub(super) fn transfer_deadline(&self, size: u64) -> Instant {
        self.deadline() + Duration::from_secs(size / MIN_THROUGHPUT_BYTES_PER_SEC)
    }

    /// Checks a digest the server sent before anything is downloaded for it: a malformed digest or
    /// an impossible size is the server's fault (and so an infrastructure failure).
    pub(super) fn check_digest(&self, d: &Digest) -> Result<(), ReapiError> {
        let problem = if !digest::is_valid(d) {
            format!("malformed digest {}", digest::display(d))
        } else if digest::size(d) > MAX_DOWNLOAD_BYTES {
            format!(
                "blob {} claims {} bytes, more than the {} GiB limit of a download",
                digest::display(d),
                d.size_bytes,
                MAX_DOWNLOAD_BYTES >> 30
            )
        } else {
            return Ok(());
        };
        Err(self.protocol_error("ActionResult", problem))
    }

    pub(super) async fn find_missing_chunk(
        &self,
        digests: Vec<Digest>,
        ctx: &CallContext,
    ) -> Result<Vec<Digest>, ReapiError> {
        let request = re::FindMissingBlobsRequest {
            instance_name: self.instance_name.clone(),
            blob_digests: digests,
            digest_function: 0,
        };
        let mut attempts = self.attempts(self.deadline());
        let response = retry::run(&mut attempts, |remaining| {
            let mut client = self.cas();
            let request = self.request(request.clone(), ctx, remaining);
            async move { client.find_missing_blobs(request).await }
        })
        .await
        .map_err(|status| self.fail("FindMissingBlobs", &status, &attempts))?;
        Ok(response.into_inner().missing_blob_digests)
    }
}

/// Checks that a blob's content has the size its digest claims (a file may have changed since
/// it was hashed).
pub(super) fn check_size(d: &Digest, actual: u64) -> Result<(), ReapiError> {
    if actual == digest::size(d) {
        Ok(())
    } else {
        Err(ReapiError::Config(format!(
            "blob {} has {actual} bytes, not the size its digest says (did the file change after it was hashed?)",
            digest::display(d)
        )))
    }
}

/// Runs blocking work (file reads, compression) off the async threads.
pub(super) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    blocking_unless_small(u64::MAX, work).await
}

/// Runs work on about `bytes` bytes off the async threads unless it is small (see
/// [`crate::runtime::run_sized`]).
pub(super) async fn blocking_unless_small<T: Send + 'static>(
    bytes: u64,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    match crate::runtime::run_sized(bytes, work).await {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names() {
        assert_eq!(resource_name("", "blobs/h/1"), "blobs/h/1");
        assert_eq!(resource_name("main/x", "blobs/h/1"), "main/x/blobs/h/1");
    }

    #[test]
    fn batch_entry_len_is_exact() {
        for size in [1usize, 100, 200, 70_000] {
            let data = vec![7u8; size];
            let d = digest::of_bytes(&data);
            let request = re::BatchUpdateBlobsRequest {
                instance_name: String::new(),
                requests: vec![re::batch_update_blobs_request::Request {
                    digest: Some(d.clone()),
                    data,
                    compressor: 0,
                }],
                digest_function: 0,
            };
            assert_eq!(request.encoded_len(), batch_entry_len(&d), "size {size}");
        }
    }

    #[test]
    fn packing_respects_the_limit() {
        let sizes = [10usize, 50, 40, 30, 80, 200, 5, 5];
        let batches = pack(sizes.to_vec(), 10, 100, |n| *n);
        assert_eq!(
            batches,
            vec![vec![10, 50], vec![40, 30], vec![80], vec![200], vec![5, 5]]
        );
        for b in &batches {
            assert!(b.len() == 1 || 10 + b.iter().sum::<usize>() <= 100);
        }
        assert!(pack(Vec::<usize>::new(), 0, 10, |n| *n).is_empty());
    }

    #[test]
    fn uniqueness_skips_duplicates_and_empty() {
        let a = Blob::from_bytes(b"a".to_vec());
        let empty = Blob::from_bytes(Vec::new());
        let blobs = unique_nonempty(vec![a.clone(), empty, a], |b| &b.digest);
        assert_eq!(blobs.len(), 1);
    }
}
