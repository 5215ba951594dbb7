//! Content-addressable storage: which blobs the server lacks, uploading them, downloading blobs.
//!
//! Small blobs travel in batches up to the server's batch limit (every per-blob status checked),
//! large ones through ByteStream, streamed from and to files so that a large object never sits
//! whole in memory. An interrupted upload resumes from the size the server committed; an
//! interrupted download resumes from the bytes already received. Every downloaded blob is checked
//! against its digest, and a mismatch is read once more before it is reported as corruption.
//! Where the server offers zstd, blobs travel compressed (see [`super::compression`]); the
//! digests and every check stay on the uncompressed bytes.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::connections::CountedChannel;
use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use bazel_remote_apis::google::bytestream::{self as bs, byte_stream_client::ByteStreamClient};
use futures::{StreamExt as _, TryStreamExt as _};
use prost::Message as _;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _, AsyncWriteExt as _};
use tokio::time::Instant;
use tonic::Status;

use super::compression::{self, Encoder, IDENTITY, StreamDecoder, ZSTD, ZSTD_NAME};
use super::digest::{self, Digest, Hasher};
use super::error::{ReapiError, status_from_proto};
use super::retry::{self, Attempts, is_transient};
use super::{CallContext, Client, Inner, MAX_MESSAGE_BYTES};

/// Digests per FindMissingBlobs request (about 1 MB of request).
const FIND_MISSING_CHUNK: usize = 10_000;

/// Requests of one transfer call in flight at once.
const CONCURRENCY: usize = 8;

/// Blob bytes uploaded at once by one client, in KiB (64 MiB): enough to keep a fast link busy,
/// and a bound on the memory and the file reads that many concurrent jobs' uploads can hold.
pub(super) const UPLOAD_BUDGET_KIB: u32 = 64 << 10;

/// ByteStream message payload size.
const STREAM_CHUNK: usize = 1 << 20;

/// ByteStream transfers get this much time per byte on top of the call timeout (1 MiB/s), so that
/// a slow link can finish a large object while a stalled one still fails.
const MIN_THROUGHPUT_BYTES_PER_SEC: u64 = 1 << 20;

/// The largest blob the client downloads (a native object is megabytes): a digest from the server
/// claiming more is a server error, not a reason to fill the disk or wait for days.
pub const MAX_DOWNLOAD_BYTES: u64 = 4 << 30;

/// Room for the fields of a batch request or response other than the blobs themselves
/// (instance name aside): the digest function and, per blob, a status.
const BATCH_SLACK: usize = 64;

/// Where the content of a blob to upload is.
#[derive(Debug, Clone)]
pub enum BlobSource {
    Bytes(Vec<u8>),
    /// A file whose content has the blob's digest; read when uploaded, in chunks if large.
    File(PathBuf),
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
            source: BlobSource::Bytes(data),
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

/// One unit of upload work.
enum Upload {
    Batch(Vec<Blob>),
    Stream(Blob),
}

/// `{instance}/{tail}`, without a leading slash when the instance name is empty.
fn resource_name(instance: &str, tail: &str) -> String {
    if instance.is_empty() {
        tail.to_string()
    } else {
        format!("{instance}/{tail}")
    }
}

/// Bytes one blob adds to a batch request or response: its entry with digest and data.
fn batch_entry_len(d: &Digest) -> usize {
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
fn pack<T>(items: Vec<T>, base: usize, limit: usize, len: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
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
fn unique_nonempty<T>(items: Vec<T>, digest: impl Fn(&T) -> &Digest) -> Vec<T> {
    let mut seen = HashSet::new();
    items
        .into_iter()
        .filter(|item| {
            let d = digest(item);
            d.size_bytes != 0 && seen.insert((d.hash.clone(), d.size_bytes))
        })
        .collect()
}

fn digest_key(d: &Digest) -> (&str, i64) {
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

    /// Uploads `blobs` (duplicates and the empty blob are skipped). Fails if any blob fails.
    pub async fn upload(&self, blobs: Vec<Blob>, ctx: &CallContext) -> Result<(), ReapiError> {
        let inner = &self.inner;
        let blobs = unique_nonempty(blobs, |b| &b.digest);
        if let Some(bad) = blobs.iter().find(|b| !digest::is_valid(&b.digest)) {
            return Err(ReapiError::Config(format!(
                "cannot upload a blob with malformed digest {}",
                digest::display(&bad.digest)
            )));
        }
        let base = inner.batch_base();
        let limit = inner.capabilities.max_batch_bytes;
        let (small, large): (Vec<Blob>, Vec<Blob>) = blobs
            .into_iter()
            .partition(|b| base + batch_entry_len(&b.digest) <= limit);
        let work = pack(small, base, limit, |b| batch_entry_len(&b.digest))
            .into_iter()
            .map(Upload::Batch)
            .chain(large.into_iter().map(Upload::Stream));
        futures::stream::iter(work)
            .map(|job| async move {
                // A blob larger than the whole budget waits for all of it.
                let bytes: u64 = match &job {
                    Upload::Batch(blobs) => blobs.iter().map(|b| digest::size(&b.digest)).sum(),
                    Upload::Stream(blob) => digest::size(&blob.digest),
                };
                let kib = u32::try_from(bytes.div_ceil(1024))
                    .unwrap_or(u32::MAX)
                    .min(UPLOAD_BUDGET_KIB);
                let _permit =
                    inner.upload_budget.acquire_many(kib).await.map_err(|_| {
                        ReapiError::Config("the upload budget was closed".to_owned())
                    })?;
                match job {
                    Upload::Batch(blobs) => inner.upload_batch(blobs, ctx).await,
                    Upload::Stream(blob) => inner.write_stream(blob, ctx).await,
                }
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect()
            .await
    }

    /// Uploads those of `blobs` the server does not have yet; returns how many that were.
    pub async fn upload_missing(
        &self,
        blobs: Vec<Blob>,
        ctx: &CallContext,
    ) -> Result<usize, ReapiError> {
        let digests: Vec<Digest> = blobs.iter().map(|b| b.digest.clone()).collect();
        let missing = self.find_missing(&digests, ctx).await?;
        let missing: HashSet<(&str, i64)> = missing.iter().map(digest_key).collect();
        let blobs: Vec<Blob> = blobs
            .into_iter()
            .filter(|b| missing.contains(&digest_key(&b.digest)))
            .collect();
        let count = unique_nonempty(blobs.iter().collect(), |b| &b.digest).len();
        self.upload(blobs, ctx).await?;
        Ok(count)
    }

    /// The content of blob `digest`, verified against it.
    pub async fn download(
        &self,
        digest: &Digest,
        ctx: &CallContext,
    ) -> Result<Vec<u8>, ReapiError> {
        self.inner.check_digest(digest)?;
        let mut data = Vec::new();
        self.inner
            .fetch_verified(digest, ctx, &mut Sink::Memory(&mut data))
            .await?;
        Ok(data)
    }

    /// Writes blob `digest` to `path` (created or truncated), verified against the digest. On
    /// failure `path` is removed. Large blobs are streamed to the file, never held in memory.
    pub async fn download_to_file(
        &self,
        digest: &Digest,
        path: &Path,
        ctx: &CallContext,
    ) -> Result<(), ReapiError> {
        self.inner.check_digest(digest)?;
        let io_err = |source| ReapiError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = tokio::fs::File::create(path).await.map_err(io_err)?;
        let result = async {
            self.inner
                .fetch_verified(digest, ctx, &mut Sink::File(&mut file, path))
                .await?;
            file.flush().await.map_err(io_err)
        }
        .await;
        if result.is_err() {
            drop(file);
            let _ = tokio::fs::remove_file(path).await;
        }
        result
    }
}

/// Where downloaded bytes go.
enum Sink<'a> {
    Memory(&'a mut Vec<u8>),
    File(&'a mut tokio::fs::File, &'a Path),
}

impl Sink<'_> {
    async fn write(&mut self, data: &[u8]) -> Result<(), ReapiError> {
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
    async fn restart(&mut self) -> Result<(), ReapiError> {
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
    fn cas(
        &self,
    ) -> re::content_addressable_storage_client::ContentAddressableStorageClient<CountedChannel>
    {
        re::content_addressable_storage_client::ContentAddressableStorageClient::new(self.channel())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn byte_stream(&self) -> ByteStreamClient<CountedChannel> {
        ByteStreamClient::new(self.channel()).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Whether a blob of `size` bytes travels zstd-compressed through ByteStream and BatchReadBlobs.
    fn zstd_for(&self, size: u64) -> bool {
        self.compression && self.capabilities.zstd && compression::worth_compressing(size)
    }

    /// Bytes of a batch request besides its blobs.
    fn batch_base(&self) -> usize {
        BATCH_SLACK + self.instance_name.len()
    }

    /// Whether a blob travels in a batch rather than through ByteStream.
    fn fits_batch(&self, d: &Digest) -> bool {
        self.batch_base() + batch_entry_len(d) <= self.capabilities.max_batch_bytes
    }

    /// The deadline of a ByteStream transfer of `size` bytes starting now.
    fn transfer_deadline(&self, size: u64) -> Instant {
        self.deadline() + Duration::from_secs(size / MIN_THROUGHPUT_BYTES_PER_SEC)
    }

    /// Checks a digest the server sent before anything is downloaded for it: a malformed digest or
    /// an impossible size is the server's fault (and so an infrastructure failure).
    fn check_digest(&self, d: &Digest) -> Result<(), ReapiError> {
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

    async fn find_missing_chunk(
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

    /// Uploads one batch; blobs that fail transiently are sent again, alone with the others
    /// that failed, within the call's retry budget.
    async fn upload_batch(&self, blobs: Vec<Blob>, ctx: &CallContext) -> Result<(), ReapiError> {
        let zstd = self.compression && self.capabilities.zstd_batch_update;
        let mut pending = blocking(move || batch_requests(blobs, zstd)).await?;
        let mut attempts = self.attempts(self.deadline());
        loop {
            let Some(remaining) = attempts.remaining() else {
                return Err(self.fail("BatchUpdateBlobs", &retry::deadline_passed(), &attempts));
            };
            let request = re::BatchUpdateBlobsRequest {
                instance_name: self.instance_name.clone(),
                requests: pending.clone(),
                digest_function: 0,
            };
            let mut client = self.cas();
            let call = client.batch_update_blobs(self.request(request, ctx, remaining));
            let status = match tokio::time::timeout(remaining, call).await {
                Ok(Ok(response)) => {
                    let statuses: HashMap<(&str, i64), &bazel_remote_apis::google::rpc::Status> =
                        response
                            .get_ref()
                            .responses
                            .iter()
                            .filter_map(|r| {
                                Some((digest_key(r.digest.as_ref()?), r.status.as_ref()?))
                            })
                            .collect();
                    let mut failed = Vec::new();
                    let mut transient = None;
                    for blob in &pending {
                        let Some(d) = blob.digest.as_ref() else {
                            continue;
                        };
                        let status = statuses.get(&digest_key(d)).ok_or_else(|| {
                            self.protocol_error(
                                "BatchUpdateBlobs",
                                format!("no status for blob {}", digest::display(d)),
                            )
                        })?;
                        if status.code == 0 {
                            self.counters
                                .uploaded(digest::size(d), blob.data.len() as u64);
                            continue;
                        }
                        let status = status_from_proto(status);
                        let status = Status::new(
                            status.code(),
                            format!("blob {}: {}", digest::display(d), status.message()),
                        );
                        if !is_transient(status.code()) {
                            return Err(self.fail("BatchUpdateBlobs", &status, &attempts));
                        }
                        failed.push(blob.clone());
                        transient = Some(status);
                    }
                    match transient {
                        None => return Ok(()),
                        Some(status) => {
                            pending = failed;
                            status
                        }
                    }
                }
                Ok(Err(status)) => status,
                Err(_) => retry::deadline_passed(),
            };
            if !attempts.retry_after(&status).await {
                return Err(self.fail("BatchUpdateBlobs", &status, &attempts));
            }
        }
    }

    /// Uploads one blob through ByteStream Write, resuming after interruptions.
    async fn write_stream(&self, blob: Blob, ctx: &CallContext) -> Result<(), ReapiError> {
        let size = digest::size(&blob.digest);
        let source = match blob.source {
            BlobSource::Bytes(data) => {
                check_size(&blob.digest, data.len() as u64)?;
                ChunkSource::Bytes(Arc::new(data))
            }
            BlobSource::File(path) => {
                let len = tokio::fs::metadata(&path)
                    .await
                    .map_err(|source| ReapiError::Io {
                        path: path.clone(),
                        source,
                    })?
                    .len();
                check_size(&blob.digest, len)?;
                ChunkSource::File(path)
            }
        };
        // Compressed uploads count offsets in compressed bytes, up to zstd's bound.
        let zstd = self.zstd_for(size);
        let (kind, limit) = if zstd {
            (
                format!("compressed-blobs/{ZSTD_NAME}"),
                compression::max_compressed_size(size),
            )
        } else {
            ("blobs".to_owned(), size)
        };
        let new_resource = || {
            let tail = format!(
                "uploads/{}/{kind}/{}/{}",
                uuid::Uuid::new_v4(),
                blob.digest.hash,
                size
            );
            resource_name(&self.instance_name, &tail)
        };
        let mut resource = new_resource();
        let mut offset = 0u64;
        let progress = Arc::new(WriteProgress::default());
        let mut attempts = self.attempts(self.transfer_deadline(size));
        loop {
            let Some(remaining) = attempts.remaining() else {
                return Err(self.fail("Write", &retry::deadline_passed(), &attempts));
            };
            let chunks = write_requests(
                source.clone(),
                zstd,
                resource.clone(),
                offset,
                size,
                progress.clone(),
            )
            .await?;
            let mut client = self.byte_stream();
            let call = client.write(self.request(chunks, ctx, remaining));
            let outcome = tokio::time::timeout(remaining, call).await;
            if let Some(e) = progress.error.lock().ok().and_then(|mut slot| slot.take()) {
                return Err(e);
            }
            let sent = || progress.sent.load(Ordering::Relaxed);
            let status = match outcome {
                Ok(Ok(response)) => {
                    let committed = response.get_ref().committed_size;
                    // Servers answer a compressed upload with the compressed or the uncompressed
                    // size, or -1 when the blob was already there.
                    let accepted = committed == size as i64
                        || zstd
                            && (committed == -1
                                || committed == progress.end.load(Ordering::Relaxed) as i64);
                    if !accepted {
                        return Err(self.protocol_error(
                            "Write",
                            format!(
                                "committed {committed} bytes of blob {}",
                                digest::display(&blob.digest)
                            ),
                        ));
                    }
                    self.counters.uploaded(size, sent());
                    return Ok(());
                }
                Ok(Err(status)) => status,
                Err(_) => retry::deadline_passed(),
            };
            if !attempts.retry_after(&status).await {
                return Err(self.fail("Write", &status, &attempts));
            }
            match self.query_write_status(&resource, ctx, &attempts).await {
                Some(s) if s.complete && (zstd || s.committed_size == size as i64) => {
                    self.counters.uploaded(size, sent());
                    return Ok(());
                }
                Some(s) if !s.complete && (0..=limit as i64).contains(&s.committed_size) => {
                    offset = s.committed_size as u64
                }
                // No usable answer: start over under a fresh upload name.
                _ => {
                    resource = new_resource();
                    offset = 0;
                }
            }
        }
    }

    /// How much of an interrupted upload the server kept; `None` if it cannot tell.
    async fn query_write_status(
        &self,
        resource: &str,
        ctx: &CallContext,
        attempts: &Attempts<'_>,
    ) -> Option<bs::QueryWriteStatusResponse> {
        let remaining = attempts.remaining()?.min(self.timeout);
        let request = bs::QueryWriteStatusRequest {
            resource_name: resource.to_string(),
        };
        let mut client = self.byte_stream();
        let call = client.query_write_status(self.request(request, ctx, remaining));
        match tokio::time::timeout(remaining, call).await {
            Ok(Ok(response)) => Some(response.into_inner()),
            _ => None,
        }
    }

    /// Downloads `digest` into `sink` and verifies it, reading once more if it does not match.
    async fn fetch_verified(
        &self,
        d: &Digest,
        ctx: &CallContext,
        sink: &mut Sink<'_>,
    ) -> Result<(), ReapiError> {
        if d.size_bytes == 0 {
            return Ok(());
        }
        let mut mismatch = String::new();
        for _ in 0..2 {
            sink.restart().await?;
            let got = if self.fits_batch(d) {
                match self.batch_read(d, ctx).await? {
                    Ok(data) => {
                        sink.write(&data).await?;
                        Ok(digest::of_bytes(&data))
                    }
                    Err(undecodable) => Err(undecodable),
                }
            } else {
                self.read_stream(d, ctx, sink).await?
            };
            match got {
                Ok(got) if got == *d => {
                    self.counters.downloaded(digest::size(d));
                    return Ok(());
                }
                Ok(got) => {
                    mismatch = format!(
                        "received {} bytes with SHA-256 {}",
                        got.size_bytes, got.hash
                    )
                }
                Err(undecodable) => mismatch = undecodable,
            }
        }
        Err(ReapiError::Integrity {
            endpoint: self.endpoint.clone(),
            digest: digest::display(d).to_string(),
            what: format!("{mismatch} (twice)"),
        })
    }

    /// Reads one blob with BatchReadBlobs; the inner error says why what arrived cannot be
    /// decompressed.
    async fn batch_read(
        &self,
        d: &Digest,
        ctx: &CallContext,
    ) -> Result<Result<Vec<u8>, String>, ReapiError> {
        let size = digest::size(d);
        let zstd = self.zstd_for(size);
        let request = re::BatchReadBlobsRequest {
            instance_name: self.instance_name.clone(),
            digests: vec![d.clone()],
            acceptable_compressors: if zstd { vec![ZSTD] } else { Vec::new() },
            digest_function: 0,
        };
        let mut attempts = self.attempts(self.deadline());
        let response = retry::run(&mut attempts, |remaining| {
            let mut client = self.cas();
            let request = self.request(request.clone(), ctx, remaining);
            async move {
                let response = client.batch_read_blobs(request).await?.into_inner();
                let entry = response
                    .responses
                    .into_iter()
                    .find(|r| r.digest.as_ref() == Some(d))
                    .ok_or_else(|| {
                        Status::internal(format!(
                            "no entry for blob {} in the response",
                            digest::display(d)
                        ))
                    })?;
                match entry.status {
                    Some(s) if s.code != 0 => {
                        let status = status_from_proto(&s);
                        Err(Status::new(
                            status.code(),
                            format!("blob {}: {}", digest::display(d), status.message()),
                        ))
                    }
                    _ => Ok((entry.data, entry.compressor)),
                }
            }
        })
        .await
        .map_err(|status| self.fail("BatchReadBlobs", &status, &attempts))?;
        let (data, compressor) = response;
        self.counters.received(data.len() as u64);
        Ok(match compressor {
            IDENTITY => Ok(data),
            ZSTD if zstd => blocking(move || compression::decompress(&data, size))
                .await
                .map_err(|e| format!("cannot decompress the zstd data: {e}")),
            other => Err(format!("compressor {other}, which was not asked for")),
        })
    }

    /// Reads one blob with ByteStream Read into `sink`, resuming after interruptions; returns the
    /// digest of what arrived (reading stops early if more than the expected size arrives), or
    /// why compressed data could not be decompressed.
    async fn read_stream(
        &self,
        d: &Digest,
        ctx: &CallContext,
        sink: &mut Sink<'_>,
    ) -> Result<Result<Digest, String>, ReapiError> {
        let size = digest::size(d);
        // A compressed read resumes at an offset in compressed bytes, into the same decoder.
        let mut decoder = if self.zstd_for(size) {
            Some(StreamDecoder::new(size).map_err(|e| read_error(None, e))?)
        } else {
            None
        };
        let kind = if decoder.is_some() {
            format!("compressed-blobs/{ZSTD_NAME}")
        } else {
            "blobs".to_owned()
        };
        let resource = resource_name(
            &self.instance_name,
            &format!("{kind}/{}/{}", d.hash, d.size_bytes),
        );
        let mut hasher = Hasher::default();
        let mut received = 0u64;
        let mut attempts = self.attempts(self.transfer_deadline(size));
        loop {
            let Some(remaining) = attempts.remaining() else {
                return Err(self.fail("Read", &retry::deadline_passed(), &attempts));
            };
            let before = received;
            let request = bs::ReadRequest {
                resource_name: resource.clone(),
                read_offset: before as i64,
                read_limit: 0,
            };
            let mut client = self.byte_stream();
            let attempt = async {
                let mut stream = client
                    .read(self.request(request, ctx, remaining))
                    .await?
                    .into_inner();
                'read: while let Some(message) = self.next_message(&mut stream).await? {
                    self.counters.received(message.data.len() as u64);
                    received += message.data.len() as u64;
                    // Compressed data comes out of the decoder a bounded step at a time.
                    let mut plain = match &mut decoder {
                        Some(decoder) => {
                            decoder.push(message.data);
                            None
                        }
                        None => Some(message.data),
                    };
                    loop {
                        let data = match &mut decoder {
                            Some(decoder) => decoder.next().await.map_err(|e| {
                                ReadFailure::Undecodable(format!(
                                    "cannot decompress the zstd stream: {e}"
                                ))
                            })?,
                            None => plain.take(),
                        };
                        let Some(data) = data else { break };
                        if hasher.size() + data.len() as u64 > size {
                            // Too much data: count it so the digest mismatches, but do not store it.
                            hasher.update(&data);
                            break 'read;
                        }
                        sink.write(&data).await.map_err(ReadFailure::Local)?;
                        hasher.update(&data);
                    }
                }
                Ok::<_, ReadFailure>(())
            };
            let status = match tokio::time::timeout(remaining, attempt).await {
                Ok(Ok(())) => return Ok(Ok(std::mem::take(&mut hasher).finish())),
                Ok(Err(ReadFailure::Undecodable(why))) => return Ok(Err(why)),
                Ok(Err(ReadFailure::Local(e))) => return Err(e),
                Ok(Err(ReadFailure::Rpc(status))) => status,
                Err(_) => retry::deadline_passed(),
            };
            if received > before {
                attempts.reset();
            }
            if !attempts.retry_after(&status).await {
                return Err(self.fail("Read", &status, &attempts));
            }
        }
    }
}

impl Inner {
    /// The next message of a ByteStream read, or DEADLINE_EXCEEDED when none arrives within the
    /// call timeout: a stream that stalls ends, however long its whole transfer may take.
    async fn next_message(
        &self,
        stream: &mut tonic::Streaming<bs::ReadResponse>,
    ) -> Result<Option<bs::ReadResponse>, Status> {
        match tokio::time::timeout(self.timeout, stream.message()).await {
            Ok(message) => message,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "the read stalled: no data for {} s",
                self.timeout.as_secs_f64()
            ))),
        }
    }
}

impl Client {
    /// The first `limit` bytes of blob `digest`, for showing a compiler's output that may be huge:
    /// read with a ByteStream `read_limit`, so the rest never travels. Not verified (a prefix
    /// has no digest to check); a stall ends at the call timeout.
    pub async fn download_head(
        &self,
        digest: &Digest,
        limit: u64,
        ctx: &CallContext,
    ) -> Result<Vec<u8>, ReapiError> {
        let inner = &self.inner;
        if !digest::is_valid(digest) {
            return Err(inner.protocol_error(
                "ActionResult",
                format!("malformed digest {}", digest::display(digest)),
            ));
        }
        let request = bs::ReadRequest {
            resource_name: resource_name(
                &inner.instance_name,
                &format!("blobs/{}/{}", digest.hash, digest.size_bytes),
            ),
            read_offset: 0,
            read_limit: i64::try_from(limit).unwrap_or(i64::MAX),
        };
        let mut attempts = inner.attempts(inner.deadline());
        let head = retry::run(&mut attempts, |remaining| {
            let mut client = inner.byte_stream();
            let request = inner.request(request.clone(), ctx, remaining);
            async move {
                let mut stream = client.read(request).await?.into_inner();
                let mut head = Vec::new();
                while (head.len() as u64) < limit
                    && let Some(message) = inner.next_message(&mut stream).await?
                {
                    head.extend_from_slice(&message.data);
                }
                head.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
                Ok(head)
            }
        })
        .await
        .map_err(|status| inner.fail("Read", &status, &attempts))?;
        inner.counters.downloaded(head.len() as u64);
        Ok(head)
    }
}

/// Why a ByteStream read attempt stopped.
enum ReadFailure {
    Rpc(Status),
    Local(ReapiError),
    /// Compressed data that does not decompress: corrupt, like a digest mismatch.
    Undecodable(String),
}

impl From<Status> for ReadFailure {
    fn from(status: Status) -> Self {
        ReadFailure::Rpc(status)
    }
}

/// Checks that a blob's content has the size its digest claims (a file may have changed since
/// it was hashed).
fn check_size(d: &Digest, actual: u64) -> Result<(), ReapiError> {
    if actual == digest::size(d) {
        Ok(())
    } else {
        Err(ReapiError::Config(format!(
            "blob {} has {actual} bytes, not the size its digest says (did the file change after it was hashed?)",
            digest::display(d)
        )))
    }
}

/// The content of a blob being streamed, shareable across attempts.
#[derive(Clone)]
enum ChunkSource {
    Bytes(Arc<Vec<u8>>),
    File(PathBuf),
}

/// What the request stream of one Write attempt reads from.
enum ChunkReader {
    Bytes(Arc<Vec<u8>>),
    File(tokio::fs::File, PathBuf),
    Zstd(Box<Encoder>),
}

/// What the request streams of one upload report back: bytes sent over all attempts, the offset
/// after the last message, and a local read error that ended a stream early.
#[derive(Default)]
struct WriteProgress {
    sent: AtomicU64,
    end: AtomicU64,
    error: Mutex<Option<ReapiError>>,
}

impl WriteProgress {
    fn fail(&self, e: ReapiError) {
        if let Ok(mut slot) = self.error.lock() {
            *slot = Some(e);
        }
    }
}

/// The error of a failed read of `path` (`None`: an in-memory blob).
fn read_error(path: Option<PathBuf>, source: io::Error) -> ReapiError {
    ReapiError::Io {
        path: path.unwrap_or_else(|| PathBuf::from("(blob in memory)")),
        source,
    }
}

impl ChunkReader {
    /// Opens `source` at `offset`: of the blob, or with `zstd` of its compressed form.
    async fn open(source: ChunkSource, zstd: bool, offset: u64) -> Result<Self, ReapiError> {
        if zstd {
            return blocking(move || {
                let (encoder, path) = match source {
                    ChunkSource::Bytes(data) => (Encoder::of_bytes(data), None),
                    ChunkSource::File(path) => (Encoder::of_file(path.clone()), Some(path)),
                };
                let mut encoder = encoder.map_err(|e| read_error(path.clone(), e))?;
                match encoder.skip(offset) {
                    Ok(true) => Ok(ChunkReader::Zstd(Box::new(encoder))),
                    Ok(false) => Err(read_error(
                        path,
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!(
                                "the server has {offset} compressed bytes, more than there are"
                            ),
                        ),
                    )),
                    Err(e) => Err(read_error(path, e)),
                }
            })
            .await;
        }
        Ok(match source {
            ChunkSource::Bytes(data) => ChunkReader::Bytes(data),
            ChunkSource::File(path) => {
                let io_err = |source| read_error(Some(path.clone()), source);
                let mut file = tokio::fs::File::open(&path).await.map_err(io_err)?;
                file.seek(io::SeekFrom::Start(offset))
                    .await
                    .map_err(io_err)?;
                ChunkReader::File(file, path)
            }
        })
    }

    /// The next chunk at `offset` of a blob of `size` bytes, and whether it is the last.
    async fn next(self, offset: u64, size: u64) -> (Self, Result<(Vec<u8>, bool), ReapiError>) {
        let len = (size - offset).min(STREAM_CHUNK as u64) as usize;
        let last = offset + len as u64 == size;
        match self {
            ChunkReader::Bytes(data) => {
                let chunk = data
                    .get(offset as usize..offset as usize + len)
                    .map(|c| (c.to_vec(), last))
                    .ok_or_else(|| read_error(None, io::ErrorKind::UnexpectedEof.into()));
                (ChunkReader::Bytes(data), chunk)
            }
            ChunkReader::File(mut file, path) => {
                let mut buffer = vec![0; len];
                let read = file.read_exact(&mut buffer).await;
                let chunk = read
                    .map(|_| (buffer, last))
                    .map_err(|e| read_error(Some(path.clone()), e));
                (ChunkReader::File(file, path), chunk)
            }
            // The compressed size is known only at its end: a short chunk is the last one.
            ChunkReader::Zstd(mut encoder) => {
                blocking(move || {
                    let chunk = encoder
                        .read_chunk(STREAM_CHUNK)
                        .map(|c| {
                            let last = c.len() < STREAM_CHUNK;
                            (c, last)
                        })
                        .map_err(|e| read_error(encoder.path.clone(), e));
                    (ChunkReader::Zstd(encoder), chunk)
                })
                .await
            }
        }
    }
}

/// The WriteRequests of one attempt, from `offset` to the end (of the blob, or with `zstd` of its
/// compressed form). A read error ends the stream early (so the server sees an unfinished write)
/// and is left in `progress` for the caller.
async fn write_requests(
    source: ChunkSource,
    zstd: bool,
    resource: String,
    offset: u64,
    size: u64,
    progress: Arc<WriteProgress>,
) -> Result<impl futures::Stream<Item = bs::WriteRequest> + Send + 'static, ReapiError> {
    let reader = ChunkReader::open(source, zstd, offset).await?;
    let state = (Some(reader), Some(resource), offset);
    Ok(futures::stream::unfold(
        state,
        move |(reader, mut resource, offset)| {
            let progress = progress.clone();
            async move {
                let (reader, chunk) = reader?.next(offset, size).await;
                let (data, last) = match chunk {
                    Ok(chunk) => chunk,
                    Err(e) => {
                        progress.fail(e);
                        return None;
                    }
                };
                let end = offset + data.len() as u64;
                progress
                    .sent
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                progress.end.store(end, Ordering::Relaxed);
                let request = bs::WriteRequest {
                    // Only the first message of a write names the resource.
                    resource_name: resource.take().unwrap_or_default(),
                    write_offset: offset as i64,
                    finish_write: last,
                    data,
                };
                let reader = if last { None } else { Some(reader) };
                Some((request, (reader, resource, end)))
            }
        },
    ))
}

/// The BatchUpdateBlobs entries of `blobs`, read from their files and, with `zstd`, compressed
/// when that makes them smaller (blocking).
fn batch_requests(
    blobs: Vec<Blob>,
    zstd: bool,
) -> Result<Vec<re::batch_update_blobs_request::Request>, ReapiError> {
    blobs
        .into_iter()
        .map(|blob| {
            let data = match blob.source {
                BlobSource::Bytes(data) => data,
                BlobSource::File(path) => {
                    std::fs::read(&path).map_err(|source| ReapiError::Io { path, source })?
                }
            };
            check_size(&blob.digest, data.len() as u64)?;
            let compressed = (zstd && compression::worth_compressing(data.len() as u64))
                .then(|| compression::compress(&data).ok())
                .flatten()
                .filter(|c| c.len() < data.len());
            let (data, compressor) = match compressed {
                Some(c) => (c, ZSTD),
                None => (data, IDENTITY),
            };
            Ok(re::batch_update_blobs_request::Request {
                digest: Some(blob.digest),
                data,
                compressor,
            })
        })
        .collect()
}

/// Runs blocking work (file reads, compression) off the async threads.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
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

    /// The messages of one attempt, and what the attempt left in its progress.
    async fn attempt(
        source: &ChunkSource,
        zstd: bool,
        offset: u64,
        size: u64,
    ) -> (Vec<bs::WriteRequest>, Arc<WriteProgress>) {
        let progress = Arc::new(WriteProgress::default());
        let stream = write_requests(
            source.clone(),
            zstd,
            "r".into(),
            offset,
            size,
            progress.clone(),
        )
        .await
        .unwrap();
        (stream.collect().await, progress)
    }

    fn check_messages(requests: &[bs::WriteRequest], offset: u64) -> Vec<u8> {
        assert_eq!(requests[0].resource_name, "r");
        assert!(requests[1..].iter().all(|r| r.resource_name.is_empty()));
        assert!(requests.last().unwrap().finish_write);
        assert_eq!(requests.iter().filter(|r| r.finish_write).count(), 1);
        let mut at = offset as i64;
        for r in requests {
            assert_eq!(r.write_offset, at);
            at += r.data.len() as i64;
        }
        requests.iter().flat_map(|r| r.data.clone()).collect()
    }

    #[tokio::test]
    async fn write_requests_cover_the_blob_once() {
        let data: Vec<u8> = (0..(2 * STREAM_CHUNK + 10)).map(|i| i as u8).collect();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut file, &data).unwrap();
        let size = data.len() as u64;
        let sources = [
            ChunkSource::Bytes(Arc::new(data.clone())),
            ChunkSource::File(file.path().to_path_buf()),
        ];
        for source in &sources {
            for offset in [0, 5, STREAM_CHUNK as u64 + 3, size] {
                let (requests, progress) = attempt(source, false, offset, size).await;
                assert_eq!(check_messages(&requests, offset), data[offset as usize..]);
                assert_eq!(progress.end.load(Ordering::Relaxed), size);
                assert_eq!(progress.sent.load(Ordering::Relaxed), size - offset);
                assert!(progress.error.lock().unwrap().is_none());
            }
            // Compressed: offsets count compressed bytes, and a resumed attempt continues the
            // same compressed stream.
            let (whole, progress) = attempt(source, true, 0, size).await;
            let packed = check_messages(&whole, 0);
            assert!(packed.len() < data.len() / 10, "{}", packed.len());
            assert_eq!(progress.end.load(Ordering::Relaxed), packed.len() as u64);
            assert_eq!(compression::decompress(&packed, size).unwrap(), data);
            let (rest, _) = attempt(source, true, 100, size).await;
            assert_eq!(check_messages(&rest, 100), packed[100..]);
        }
        // A file that shrank after hashing ends the stream early and reports why.
        let (requests, progress) = attempt(&sources[1], false, 0, size + 1).await;
        assert!(!requests.iter().any(|r| r.finish_write));
        assert!(progress.error.lock().unwrap().is_some());
        // A server claiming more compressed bytes than there are is refused.
        let progress = Arc::new(WriteProgress::default());
        assert!(
            write_requests(sources[0].clone(), true, "r".into(), size, size, progress)
                .await
                .is_err()
        );
    }
}
