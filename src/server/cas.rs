//! The ContentAddressableStorage service: find missing blobs, batch upload and download (within
//! `--max-batch-bytes`, zstd-compressed entries too unless `--no-compression`), and GetTree. The chunking RPCs (split/splice, REAPI 2.12+) are not
//! offered: the capabilities do not advertise them, and they answer UNIMPLEMENTED.

use super::compression;
use super::context::{Context, blocking, blocking_unless_small, ok_status, rpc_status};
use super::digest::BlobDigest;
use bazel_remote_apis::build::bazel::remote::execution::v2::{
    BatchReadBlobsRequest, BatchReadBlobsResponse, BatchUpdateBlobsRequest,
    BatchUpdateBlobsResponse, Directory, FindMissingBlobsRequest, FindMissingBlobsResponse,
    GetChunkMappingRequest, GetChunkMappingResponse, GetTreeRequest, GetTreeResponse,
    RegisterChunkMappingRequest, RegisterChunkMappingResponse, SpliceBlobRequest,
    SpliceBlobResponse, SplitBlobRequest, SplitBlobResponse, batch_read_blobs_response,
    batch_update_blobs_response, content_addressable_storage_server::ContentAddressableStorage,
};
use futures::stream::{self, BoxStream};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use tonic::{Request, Response, Status, Streaming};

/// Directories per GetTree page when the client does not ask for fewer.
const MAX_TREE_PAGE: usize = 1000;

pub struct CasService(pub Arc<Context>);

impl CasService {
    fn check_batch_size(&self, total: u64) -> Result<(), Status> {
        if total > self.0.max_batch_bytes {
            return Err(Status::invalid_argument(format!(
                "batch of {total} bytes exceeds the limit of {} bytes; use ByteStream",
                self.0.max_batch_bytes
            )));
        }
        Ok(())
    }

    fn update_one(
        &self,
        digest: Option<&bazel_remote_apis::build::bazel::remote::execution::v2::Digest>,
        data: Vec<u8>,
        compressor: i32,
    ) -> Result<(), Status> {
        let digest = BlobDigest::required(digest, "digest")?;
        let data = compression::decode_batch_entry(self.0.compression, compressor, data, &digest)?;
        self.0.storage.put_blob(&digest, &data)?;
        self.0.stats.uploaded(&digest);
        Ok(())
    }

    /// A blob as sent to a client accepting `acceptable` compressors, and its compressor.
    fn read_one(&self, digest: &BlobDigest, acceptable: &[i32]) -> Result<(Vec<u8>, i32), Status> {
        let data = self
            .0
            .storage
            .blob(digest)?
            .ok_or_else(|| Status::not_found(format!("blob {digest} is not in the CAS")))?
            .to_vec();
        let (mut data, compressor) =
            compression::encode_batch_entry(self.0.compression, acceptable, data);
        self.0.faults.corrupt_read(&mut data);
        self.0.stats.sent(data.len());
        Ok((data, compressor))
    }

    /// Every directory reachable from `root`, breadth first, each once; missing ones are left out.
    fn walk_tree(&self, root: &BlobDigest) -> Result<Vec<Directory>, Status> {
        let mut seen = HashSet::from([root.clone()]);
        let mut queue = VecDeque::from([root.clone()]);
        let mut found = Vec::new();
        while let Some(digest) = queue.pop_front() {
            let Some(directory) = self.0.storage.message::<Directory>(&digest)? else {
                if found.is_empty() {
                    return Err(Status::not_found(format!(
                        "tree root {digest} is not in the CAS"
                    )));
                }
                continue;
            };
            for child in &directory.directories {
                let child = BlobDigest::required(child.digest.as_ref(), "directory node digest")?;
                if seen.insert(child.clone()) {
                    queue.push_back(child);
                }
            }
            found.push(directory);
        }
        Ok(found)
    }
}

#[tonic::async_trait]
impl ContentAddressableStorage for CasService {
    async fn find_missing_blobs(
        &self,
        request: Request<FindMissingBlobsRequest>,
    ) -> Result<Response<FindMissingBlobsResponse>, Status> {
        let request = request.into_inner();
        self.0
            .enter(
                "FindMissingBlobs",
                &request.instance_name,
                request.digest_function,
            )
            .await?;
        let context = self.0.clone();
        let missing = blocking(move || {
            let mut missing = Vec::new();
            for digest in request.blob_digests {
                if !context
                    .storage
                    .has_blob(&BlobDigest::from_proto(&digest)?)?
                {
                    missing.push(digest);
                }
            }
            Ok(missing)
        })
        .await?;
        Ok(Response::new(FindMissingBlobsResponse {
            missing_blob_digests: missing,
        }))
    }

    async fn batch_update_blobs(
        &self,
        request: Request<BatchUpdateBlobsRequest>,
    ) -> Result<Response<BatchUpdateBlobsResponse>, Status> {
        let request = request.into_inner();
        self.0
            .enter(
                "BatchUpdateBlobs",
                &request.instance_name,
                request.digest_function,
            )
            .await?;
        let total: u64 = request.requests.iter().map(|r| r.data.len() as u64).sum();
        self.check_batch_size(total)?;
        self.0.throttle.receive(total as usize).await;
        // The work: the bytes received, and the blobs they make (decompressed), which are hashed.
        let named: u64 = request
            .requests
            .iter()
            .map(|r| {
                r.digest
                    .as_ref()
                    .map_or(0, |d| u64::try_from(d.size_bytes).unwrap_or(0))
            })
            .fold(total, u64::saturating_add);
        let cas = CasService(self.0.clone());
        let responses = blocking_unless_small(named, move || {
            Ok(request
                .requests
                .into_iter()
                .map(|r| {
                    cas.0.stats.received(r.data.len());
                    let stored = match cas.0.faults.refuse_blob() {
                        Some(refused) => Err(refused),
                        None => cas.update_one(r.digest.as_ref(), r.data, r.compressor),
                    };
                    batch_update_blobs_response::Response {
                        status: Some(match stored {
                            Ok(()) => ok_status(),
                            Err(e) => rpc_status(&e),
                        }),
                        digest: r.digest,
                    }
                })
                .collect())
        })
        .await?;
        Ok(Response::new(BatchUpdateBlobsResponse { responses }))
    }

    async fn batch_read_blobs(
        &self,
        request: Request<BatchReadBlobsRequest>,
    ) -> Result<Response<BatchReadBlobsResponse>, Status> {
        let request = request.into_inner();
        self.0
            .enter(
                "BatchReadBlobs",
                &request.instance_name,
                request.digest_function,
            )
            .await?;
        let digests = request
            .digests
            .iter()
            .map(BlobDigest::from_proto)
            .collect::<Result<Vec<_>, _>>()?;
        let total = digests.iter().map(|d| d.size).fold(0, u64::saturating_add);
        self.check_batch_size(total)?;
        let cas = CasService(self.0.clone());
        let responses = blocking_unless_small(total, move || {
            Ok(digests
                .iter()
                .map(|digest| {
                    let (data, compressor, status) =
                        match cas.read_one(digest, &request.acceptable_compressors) {
                            Ok((data, compressor)) => (data, compressor, ok_status()),
                            Err(e) => (Vec::new(), 0, rpc_status(&e)),
                        };
                    batch_read_blobs_response::Response {
                        digest: Some(digest.to_proto()),
                        data,
                        compressor,
                        status: Some(status),
                    }
                })
                .collect::<Vec<_>>())
        })
        .await?;
        let total: usize = responses.iter().map(|r| r.data.len()).sum();
        self.0.throttle.send(total).await;
        Ok(Response::new(BatchReadBlobsResponse { responses }))
    }

    type GetTreeStream = BoxStream<'static, Result<GetTreeResponse, Status>>;

    /// Pages are consecutive slices of one deterministic breadth-first walk; a page token is the
    /// index of the page's first directory in that walk.
    async fn get_tree(
        &self,
        request: Request<GetTreeRequest>,
    ) -> Result<Response<Self::GetTreeStream>, Status> {
        let request = request.into_inner();
        self.0
            .enter("GetTree", &request.instance_name, request.digest_function)
            .await?;
        let root = BlobDigest::required(request.root_digest.as_ref(), "root_digest")?;
        let page_size = match usize::try_from(request.page_size) {
            Ok(n) if n > 0 => n.min(MAX_TREE_PAGE),
            _ => MAX_TREE_PAGE,
        };
        let start = if request.page_token.is_empty() {
            0
        } else {
            request
                .page_token
                .parse::<usize>()
                .map_err(|_| Status::invalid_argument("malformed page_token"))?
        };
        let cas = CasService(self.0.clone());
        let directories = blocking(move || cas.walk_tree(&root)).await?;
        if start > directories.len() {
            return Err(Status::invalid_argument(
                "page_token is past the end of the tree",
            ));
        }
        let total = directories.len();
        let mut pages = Vec::new();
        let mut offset = start;
        for chunk in directories[start..].chunks(page_size) {
            offset += chunk.len();
            pages.push(Ok(GetTreeResponse {
                directories: chunk.to_vec(),
                next_page_token: if offset < total {
                    offset.to_string()
                } else {
                    String::new()
                },
            }));
        }
        if pages.is_empty() {
            pages.push(Ok(GetTreeResponse::default()));
        }
        Ok(Response::new(Box::pin(stream::iter(pages))))
    }

    async fn split_blob(
        &self,
        _: Request<SplitBlobRequest>,
    ) -> Result<Response<SplitBlobResponse>, Status> {
        Err(Status::unimplemented("SplitBlob is not supported"))
    }

    type GetChunkMappingStream = BoxStream<'static, Result<GetChunkMappingResponse, Status>>;

    async fn get_chunk_mapping(
        &self,
        _: Request<GetChunkMappingRequest>,
    ) -> Result<Response<Self::GetChunkMappingStream>, Status> {
        Err(Status::unimplemented("GetChunkMapping is not supported"))
    }

    async fn splice_blob(
        &self,
        _: Request<SpliceBlobRequest>,
    ) -> Result<Response<SpliceBlobResponse>, Status> {
        Err(Status::unimplemented("SpliceBlob is not supported"))
    }

    async fn register_chunk_mapping(
        &self,
        _: Request<Streaming<RegisterChunkMappingRequest>>,
    ) -> Result<Response<RegisterChunkMappingResponse>, Status> {
        Err(Status::unimplemented(
            "RegisterChunkMapping is not supported",
        ))
    }
}
