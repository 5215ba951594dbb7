//! ByteStream transfers of single large blobs: Write (resumable from the size the server committed,
//! streamed from a file or memory, zstd-compressed where offered) and Read (resumable from the bytes
//! received, to a [`Sink`], each message awaited at most the call timeout).

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bazel_remote_apis::google::bytestream as bs;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
use tonic::Status;

use super::cas::{Blob, BlobSource, STREAM_CHUNK, Sink, blocking, check_size, resource_name};
use super::client::{Client, Inner};
use super::compression::{self, Encoder, StreamDecoder, ZSTD_NAME};
use super::digest::{self, Digest, Hasher};
use super::error::ReapiError;
use super::metadata::CallContext;
use super::retry::{self, Attempts};

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

impl Inner {
    /// Uploads one blob through ByteStream Write, resuming after interruptions.
    pub(super) async fn write_stream(
        &self,
        blob: Blob,
        ctx: &CallContext,
    ) -> Result<(), ReapiError> {
        let size = digest::size(&blob.digest);
        let source = match blob.source {
            BlobSource::Bytes(data) => {
                check_size(&blob.digest, data.len() as u64)?;
                ChunkSource::Bytes(data)
            }
            BlobSource::Deferred(make) => {
                let data = make.make(&blob.digest)?;
                check_size(&blob.digest, data.len() as u64)?;
                ChunkSource::Bytes(data.into())
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
    pub(super) async fn query_write_status(
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

    /// Reads one blob with ByteStream Read into `sink`, resuming after interruptions; returns the
    /// digest of what arrived (reading stops early if more than the expected size arrives), or
    /// why compressed data could not be decompressed.
    pub(super) async fn read_stream(
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

    /// The next message of a ByteStream read, or DEADLINE_EXCEEDED when none arrives within the
    /// call timeout: a stream that stalls ends, however long its whole transfer may take.
    pub(super) async fn next_message(
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

/// Why a ByteStream read attempt stopped.
pub(super) enum ReadFailure {
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

/// The content of a blob being streamed, shareable across attempts.
#[derive(Clone)]
pub(super) enum ChunkSource {
    Bytes(bytes::Bytes),
    File(PathBuf),
}

/// What the request stream of one Write attempt reads from.
pub(super) enum ChunkReader {
    Bytes(bytes::Bytes),
    File(tokio::fs::File, PathBuf),
    Zstd(Box<Encoder>),
}

/// What the request streams of one upload report back: bytes sent over all attempts, the offset
/// after the last message, and a local read error that ended a stream early.
#[derive(Default)]
pub(super) struct WriteProgress {
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
pub(super) fn read_error(path: Option<PathBuf>, source: io::Error) -> ReapiError {
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
pub(super) async fn write_requests(
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;

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
            ChunkSource::Bytes(data.clone().into()),
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
