//! The ByteStream service for blobs too large for a batch: Read on
//! `{instance}/blobs/{hash}/{size}` with offset and limit, chunked Write on
//! `{instance}/uploads/{uuid}/blobs/{hash}/{size}` verified before it is stored, and
//! QueryWriteStatus so that an interrupted upload can resume where the server stopped. The same
//! with `compressed-blobs/zstd/` for `blobs/`: offsets and sizes then count compressed bytes.

use super::compression;
use super::context::{Context, blocking, check_digest_function};
use super::digest::BlobDigest;
use bazel_remote_apis::build::bazel::remote::execution::v2::digest_function;
use bazel_remote_apis::google::bytestream::{
    QueryWriteStatusRequest, QueryWriteStatusResponse, ReadRequest, ReadResponse, WriteRequest,
    WriteResponse, byte_stream_server::ByteStream,
};
use futures::StreamExt as _;
use futures::stream::BoxStream;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status, Streaming};

/// Bytes per ReadResponse message.
const READ_CHUNK: usize = 64 * 1024;

/// How long an interrupted upload is kept for its client to resume it.
pub const UPLOAD_EXPIRY: Duration = Duration::from_secs(600);

/// What an unfinished upload has sent, and when it last sent something.
struct Partial {
    data: Vec<u8>,
    touched: Instant,
}

pub struct ByteStreamService {
    context: Arc<Context>,
    /// Data received so far by unfinished uploads, by resource name; each expires
    /// [`UPLOAD_EXPIRY`] after its last data.
    uploads: Mutex<HashMap<String, Partial>>,
}

/// The parts of a resource name this server uses.
#[derive(Debug, PartialEq)]
struct Resource {
    instance_name: String,
    digest: BlobDigest,
    /// The compressor named by `compressed-blobs/{compressor}/` (checked by the caller).
    compressor: Option<String>,
}

/// Parses `[instance/]blobs/[function/]{hash}/{size}`, or with `upload`
/// `[instance/]uploads/{uuid}/blobs/[function/]{hash}/{size}[/metadata...]`; either with
/// `compressed-blobs/{compressor}` for `blobs`. The instance name is everything before the first
/// `blobs`, `compressed-blobs` or `uploads` segment: REAPI reserves those words.
fn parse(name: &str, upload: bool) -> Result<Resource, Status> {
    let bad = |why: &str| Status::invalid_argument(format!("resource name {name:?}: {why}"));
    let segments: Vec<&str> = name.split('/').collect();
    let kinds: &[&str] = if upload {
        &["uploads"]
    } else {
        &["blobs", "compressed-blobs"]
    };
    let at = segments
        .iter()
        .position(|s| kinds.contains(s))
        .ok_or_else(|| bad(&format!("no {:?} segment", kinds.join(" or "))))?;
    let instance_name = segments[..at].join("/");
    let mut rest = &segments[at..];
    if upload {
        // uploads/{uuid}/blobs/...
        match rest {
            [_, _uuid, tail @ ..] => rest = tail,
            _ => return Err(bad("expected uploads/{uuid}/blobs/{hash}/{size}")),
        }
    }
    let compressor = match rest {
        ["blobs", tail @ ..] => {
            rest = tail;
            None
        }
        ["compressed-blobs", compressor, tail @ ..] => {
            rest = tail;
            Some((*compressor).to_owned())
        }
        _ => return Err(bad("expected blobs/{hash}/{size}")),
    };
    // An optional digest function name precedes the hash (REAPI 2.3).
    if let [function, _, _, ..] = rest
        && function.len() != 64
    {
        let known = digest_function::Value::from_str_name(&function.to_ascii_uppercase())
            .ok_or_else(|| bad(&format!("unknown digest function {function:?}")))?;
        check_digest_function(known as i32)?;
        rest = &rest[1..];
    }
    // Uploads may carry trailing metadata segments after the size; reads may not.
    let (hash, size) = match rest {
        [hash, size] => (hash, size),
        [hash, size, ..] if upload => (hash, size),
        _ => return Err(bad("expected blobs/{hash}/{size}")),
    };
    let size = size
        .parse::<i64>()
        .map_err(|_| bad("size is not a number"))?;
    Ok(Resource {
        instance_name,
        digest: BlobDigest::new(hash, size)?,
        compressor,
    })
}

impl ByteStreamService {
    pub fn new(context: Arc<Context>) -> Self {
        Self {
            context,
            uploads: Mutex::default(),
        }
    }

    /// The resource `name` names; whether it is compressed (with a compressor this server offers).
    fn resource(&self, name: &str, upload: bool) -> Result<(BlobDigest, bool), Status> {
        let resource = parse(name, upload)?;
        self.context.check_instance(&resource.instance_name)?;
        if let Some(compressor) = &resource.compressor {
            compression::check_name(self.context.compression, compressor)?;
        }
        Ok((resource.digest, resource.compressor.is_some()))
    }

    /// The unfinished uploads, the expired ones gone.
    fn uploads(&self) -> Result<std::sync::MutexGuard<'_, HashMap<String, Partial>>, Status> {
        let mut uploads = self
            .uploads
            .lock()
            .map_err(|_| Status::internal("upload table lock poisoned"))?;
        uploads.retain(|_, partial| partial.touched.elapsed() < UPLOAD_EXPIRY);
        Ok(uploads)
    }

    /// Appends the stream's data to `received`, at most `limit` bytes in all; true once a
    /// message said finish_write. With `cut`, fails with UNAVAILABLE after the first message.
    async fn receive(
        &self,
        first: WriteRequest,
        stream: &mut Streaming<WriteRequest>,
        received: &mut Vec<u8>,
        limit: u64,
        cut: bool,
    ) -> Result<bool, Status> {
        let mut message = first;
        loop {
            if u64::try_from(message.write_offset).ok() != Some(received.len() as u64) {
                return Err(Status::invalid_argument(format!(
                    "write_offset {} does not match the {} bytes committed",
                    message.write_offset,
                    received.len()
                )));
            }
            self.context.stats.received(message.data.len());
            self.context.throttle.receive(message.data.len()).await;
            if (received.len() + message.data.len()) as u64 > limit {
                return Err(Status::invalid_argument(format!(
                    "more data than the {limit} bytes this blob can take"
                )));
            }
            received.extend_from_slice(&message.data);
            if cut {
                return Err(Status::unavailable("fault injection: write interrupted"));
            }
            if message.finish_write {
                return Ok(true);
            }
            match stream.message().await? {
                Some(next) => message = next,
                None => return Ok(false),
            }
        }
    }
}

#[tonic::async_trait]
impl ByteStream for ByteStreamService {
    type ReadStream = BoxStream<'static, Result<ReadResponse, Status>>;

    async fn read(
        &self,
        request: Request<ReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        self.context.misbehave("ByteStream.Read").await?;
        let request = request.into_inner();
        let (digest, compressed) = self.resource(&request.resource_name, false)?;
        if let Some(bomb) = self.context.hostile.bomb_read().filter(|_| compressed) {
            return Ok(Response::new(bomb));
        }
        let digest = &digest;
        let outside = || {
            Status::out_of_range(format!(
                "read_offset {} is outside the blob",
                request.read_offset
            ))
        };
        let offset = u64::try_from(request.read_offset).map_err(|_| outside())?;
        let limit = u64::try_from(request.read_limit)
            .map_err(|_| Status::invalid_argument("read_limit is negative"))?;
        if let Some(invented) = self
            .context
            .hostile
            .invented_read(&digest.hash, offset, limit)
        {
            return Ok(Response::new(invented));
        }
        let (context, wanted) = (self.context.clone(), digest.clone());
        let mut data = blocking(move || {
            let blob = context
                .storage
                .blob(&wanted)?
                .ok_or_else(|| Status::not_found(format!("blob {wanted} is not in the CAS")))?;
            if compressed {
                compression::encode(&blob)
            } else {
                Ok(blob.to_vec())
            }
        })
        .await?;
        if offset > data.len() as u64 {
            return Err(outside());
        }
        self.context.faults.corrupt_read(&mut data);
        // offset <= data.len(), so both conversions and the slice are in range.
        let start = offset as usize;
        let end = if limit == 0 {
            data.len()
        } else {
            data.len().min(start.saturating_add(limit as usize))
        };
        self.context.stats.sent(end - start);
        let chunks: Vec<_> = data[start..end]
            .chunks(READ_CHUNK)
            .map(|chunk| {
                Ok(ReadResponse {
                    data: chunk.to_vec(),
                })
            })
            .collect();
        let context = self.context.clone();
        let paced = self
            .context
            .hostile
            .read_stream(chunks)
            .then(move |response| {
                let context = context.clone();
                async move {
                    if let Ok(r) = &response {
                        context.throttle.send(r.data.len()).await;
                    }
                    response
                }
            });
        Ok(Response::new(paced.boxed()))
    }

    async fn write(
        &self,
        request: Request<Streaming<WriteRequest>>,
    ) -> Result<Response<WriteResponse>, Status> {
        self.context.misbehave("ByteStream.Write").await?;
        let mut stream = request.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty write stream"))?;
        let name = first.resource_name.clone();
        let (digest, compressed) = self.resource(&name, true)?;
        // The blob is already here: finish at once, as the REAPI allows (a compressed upload
        // then gets -1).
        if self.context.storage.has_blob(&digest)? {
            self.uploads()?.remove(&name);
            self.context.stats.uploaded(&digest);
            let committed_size = if compressed {
                -1
            } else {
                digest.to_proto().size_bytes
            };
            return Ok(Response::new(WriteResponse { committed_size }));
        }
        let limit = if compressed {
            compression::max_upload_size(&digest)
        } else {
            digest.size
        };
        let mut received = self
            .uploads()?
            .remove(&name)
            .map(|partial| partial.data)
            .unwrap_or_default();
        let cut = self.context.faults.break_write();
        match self
            .receive(first, &mut stream, &mut received, limit, cut)
            .await
        {
            Ok(true) => {
                // A mismatch discards the data: the client must start again.
                let committed_size = received.len() as i64;
                let (context, wanted) = (self.context.clone(), digest.clone());
                blocking(move || {
                    let blob = if compressed {
                        compression::decode(&received, &wanted)?
                    } else {
                        received
                    };
                    context.storage.put_blob(&wanted, &blob)
                })
                .await?;
                self.context.stats.uploaded(&digest);
                Ok(Response::new(WriteResponse { committed_size }))
            }
            outcome => {
                // Keep what arrived so that QueryWriteStatus can report it and the client resume.
                let partial = Partial {
                    data: received,
                    touched: Instant::now(),
                };
                self.uploads()?.insert(name, partial);
                Err(outcome.err().unwrap_or_else(|| {
                    Status::invalid_argument("write stream ended without finish_write")
                }))
            }
        }
    }

    async fn query_write_status(
        &self,
        request: Request<QueryWriteStatusRequest>,
    ) -> Result<Response<QueryWriteStatusResponse>, Status> {
        self.context
            .faults
            .enter("ByteStream.QueryWriteStatus")
            .await?;
        let name = request.into_inner().resource_name;
        let (digest, _) = self.resource(&name, true)?;
        if self.context.storage.has_blob(&digest)? {
            return Ok(Response::new(QueryWriteStatusResponse {
                committed_size: digest.to_proto().size_bytes,
                complete: true,
            }));
        }
        let committed = self
            .uploads()?
            .get(&name)
            .map(|partial| partial.data.len() as i64)
            .ok_or_else(|| Status::not_found(format!("no upload named {name:?}")))?;
        Ok(Response::new(QueryWriteStatusResponse {
            committed_size: committed,
            complete: false,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    fn resource(instance: &str) -> Resource {
        Resource {
            instance_name: instance.to_owned(),
            digest: BlobDigest::new(HASH, 3).expect("digest"),
            compressor: None,
        }
    }

    #[test]
    fn parses_resource_names() {
        assert_eq!(
            parse(&format!("blobs/{HASH}/3"), false).ok(),
            Some(resource(""))
        );
        assert_eq!(
            parse(&format!("a/b/blobs/sha256/{HASH}/3"), false).ok(),
            Some(resource("a/b"))
        );
        assert_eq!(
            parse(&format!("main/uploads/u-1/blobs/{HASH}/3/extra/meta"), true).ok(),
            Some(resource("main"))
        );
        assert!(parse(&format!("blobs/{HASH}/3/extra"), false).is_err());
        assert!(parse(&format!("blobs/md5/{HASH}/3"), false).is_err());
        let zstd = |instance: &str| Resource {
            compressor: Some("zstd".to_owned()),
            ..resource(instance)
        };
        assert_eq!(
            parse(&format!("uploads/u/compressed-blobs/zstd/{HASH}/3"), true).ok(),
            Some(zstd(""))
        );
        assert_eq!(
            parse(&format!("i/compressed-blobs/zstd/sha256/{HASH}/3"), false).ok(),
            Some(zstd("i"))
        );
        assert!(parse(&format!("compressed-blobs/{HASH}/3"), false).is_err());
        assert!(parse(&format!("uploads/u/{HASH}/3"), true).is_err());
        assert!(parse(&format!("blobs/{HASH}/x"), false).is_err());
        assert!(parse("", false).is_err());
    }
}
