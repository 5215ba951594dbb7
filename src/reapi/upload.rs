//! Uploads to the CAS: blobs the server lacks are sent in batches up to its batch limit (every
//! per-blob status checked), large ones through ByteStream (see `bytestream`), zstd-compressed where
//! the server offers it. An interrupted upload resumes from the size the server committed.

use std::collections::{HashMap, HashSet};

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use futures::{StreamExt as _, TryStreamExt as _};
use tonic::Status;

use super::cas::{
    Blob, BlobSource, CONCURRENCY, batch_entry_len, blocking_unless_small, check_size, digest_key,
    pack, unique_nonempty,
};
use super::client::{Client, Inner, UPLOAD_BUDGET_KIB};
use super::compression::{self, IDENTITY, ZSTD};
use super::digest::{self, Digest};
use super::error::{ReapiError, is_transient, status_from_proto};
use super::metadata::CallContext;
use super::retry;

/// One unit of upload work.
enum Upload {
    Batch(Vec<Blob>),
    Stream(Blob),
}

impl Client {
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
        self.upload_missing_and(blobs, Vec::new(), ctx).await
    }

    /// Uploads `sent` without asking whether the server has them, and in the same batches those
    /// of `asked` it does not have (FindMissingBlobs first, when there are any); returns how many
    /// blobs that were.
    pub async fn upload_missing_and(
        &self,
        asked: Vec<Blob>,
        sent: Vec<Blob>,
        ctx: &CallContext,
    ) -> Result<usize, ReapiError> {
        let mut blobs = sent;
        if !asked.is_empty() {
            let digests: Vec<Digest> = asked.iter().map(|b| b.digest.clone()).collect();
            let missing = self.find_missing(&digests, ctx).await?;
            let missing: HashSet<(&str, i64)> = missing.iter().map(digest_key).collect();
            blobs.extend(
                asked
                    .into_iter()
                    .filter(|b| missing.contains(&digest_key(&b.digest))),
            );
        }
        let count = unique_nonempty(blobs.iter().collect(), |b| &b.digest).len();
        self.upload(blobs, ctx).await?;
        Ok(count)
    }
}

impl Inner {
    /// Uploads one batch; blobs that fail transiently are sent again, alone with the others
    /// that failed, within the call's retry budget.
    pub(super) async fn upload_batch(
        &self,
        blobs: Vec<Blob>,
        ctx: &CallContext,
    ) -> Result<(), ReapiError> {
        let zstd = self.compression && self.capabilities.zstd_batch_update;
        // Each attempt makes its requests from the blobs still to send (a retry sends only those
        // that failed), so a batch's content is never copied to be kept for a retry.
        let mut pending = blobs;
        let mut attempts = self.attempts(self.deadline());
        loop {
            let Some(remaining) = attempts.remaining() else {
                return Err(self.fail("BatchUpdateBlobs", &retry::deadline_passed(), &attempts));
            };
            let bytes = pending.iter().map(|b| digest::size(&b.digest)).sum();
            let blobs = pending.clone();
            let requests =
                blocking_unless_small(bytes, move || batch_requests(blobs, zstd)).await?;
            // Each blob's bytes on the wire (compressed or not), in the order of `pending`.
            let wire_bytes: Vec<u64> = requests.iter().map(|r| r.data.len() as u64).collect();
            let request = re::BatchUpdateBlobsRequest {
                instance_name: self.instance_name.clone(),
                requests,
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
                    for (blob, wire_bytes) in
                        std::mem::take(&mut pending).into_iter().zip(wire_bytes)
                    {
                        let d = &blob.digest;
                        let status = statuses.get(&digest_key(d)).ok_or_else(|| {
                            self.protocol_error(
                                "BatchUpdateBlobs",
                                format!("no status for blob {}", digest::display(d)),
                            )
                        })?;
                        if status.code == 0 {
                            self.counters.uploaded(digest::size(d), wire_bytes);
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
                        failed.push(blob);
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
                // Without a copy when no one else holds the bytes.
                BlobSource::Bytes(data) => data.into(),
                BlobSource::File(path) => {
                    std::fs::read(&path).map_err(|source| ReapiError::Io { path, source })?
                }
                BlobSource::Deferred(make) => make.make(&blob.digest)?,
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
