//! Downloads from the CAS, to memory or to a file: small blobs in batches, large ones through
//! ByteStream (see `bytestream`). Every downloaded blob is checked against its digest, and a
//! mismatch is read once more before it is reported as corruption; an interrupted download resumes
//! from the bytes already received.

use std::path::Path;

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use tokio::io::AsyncWriteExt as _;
use tonic::Status;

use super::cas::{Sink, blocking_unless_small};
use super::client::{Client, Inner};
use super::compression::{self, IDENTITY, ZSTD};
use super::digest::{self, Digest};
use super::error::{ReapiError, status_from_proto};
use super::metadata::CallContext;
use super::retry;

impl Client {
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
    /// failure `path` is removed. Large blobs are streamed to the file, never held in memory;
    /// a blob that travels in a batch (most native objects) is read whole, then written at once
    /// (off the async threads unless small), instead of through an async file handle (a trip to
    /// the blocking pool per create, write, flush and close).
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
        if self.inner.fits_batch(digest) {
            let data = self.download(digest, ctx).await?;
            let target = path.to_path_buf();
            return blocking_unless_small(data.len() as u64, move || {
                std::fs::write(&target, &data).inspect_err(|_| {
                    let _ = std::fs::remove_file(&target);
                })
            })
            .await
            .map_err(io_err);
        }
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

impl Inner {
    /// Downloads `digest` into `sink` and verifies it, reading once more if it does not match.
    pub(super) async fn fetch_verified(
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
    pub(super) async fn batch_read(
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
            ZSTD if zstd => {
                blocking_unless_small(size, move || compression::decompress(&data, size))
                    .await
                    .map_err(|e| format!("cannot decompress the zstd data: {e}"))
            }
            other => Err(format!("compressor {other}, which was not asked for")),
        })
    }
}
