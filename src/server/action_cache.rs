//! The ActionCache service: GetActionResult (inlining stdout, stderr and named output files on
//! request) and UpdateActionResult.

use super::context::{Context, blocking};
use super::digest::BlobDigest;
use bazel_remote_apis::build::bazel::remote::execution::v2::{
    ActionResult, Digest, GetActionResultRequest, UpdateActionResultRequest,
    action_cache_server::ActionCache,
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct ActionCacheService(pub Arc<Context>);

impl ActionCacheService {
    /// The bytes of a referenced blob for inlining; None when absent or too large to inline
    /// (clients then fetch it from the CAS, as the REAPI allows).
    fn inline(&self, digest: Option<&Digest>) -> Result<Option<Vec<u8>>, Status> {
        let Some(digest) = digest else {
            return Ok(None);
        };
        let digest = BlobDigest::from_proto(digest)?;
        if digest.size > self.0.max_batch_bytes {
            return Ok(None);
        }
        Ok(self.0.storage.blob(&digest)?.map(|data| data.to_vec()))
    }
}

#[tonic::async_trait]
impl ActionCache for ActionCacheService {
    async fn get_action_result(
        &self,
        request: Request<GetActionResultRequest>,
    ) -> Result<Response<ActionResult>, Status> {
        let request = request.into_inner();
        self.0
            .enter(
                "GetActionResult",
                &request.instance_name,
                request.digest_function,
            )
            .await?;
        let action = BlobDigest::required(request.action_digest.as_ref(), "action_digest")?;
        let cache = ActionCacheService(self.0.clone());
        blocking(move || {
            let mut result = cache.0.storage.action_result(&action)?.ok_or_else(|| {
                Status::not_found(format!("no cached result for action {action}"))
            })?;
            if request.inline_stdout {
                result.stdout_raw = cache
                    .inline(result.stdout_digest.as_ref())?
                    .unwrap_or_default();
            }
            if request.inline_stderr {
                result.stderr_raw = cache
                    .inline(result.stderr_digest.as_ref())?
                    .unwrap_or_default();
            }
            for file in &mut result.output_files {
                if request.inline_output_files.contains(&file.path) {
                    file.contents = cache.inline(file.digest.as_ref())?.unwrap_or_default();
                }
            }
            Ok(Response::new(result))
        })
        .await
    }

    async fn update_action_result(
        &self,
        request: Request<UpdateActionResultRequest>,
    ) -> Result<Response<ActionResult>, Status> {
        let request = request.into_inner();
        self.0
            .enter(
                "UpdateActionResult",
                &request.instance_name,
                request.digest_function,
            )
            .await?;
        let action = BlobDigest::required(request.action_digest.as_ref(), "action_digest")?;
        let result = request
            .action_result
            .ok_or_else(|| Status::invalid_argument("action_result is missing"))?;
        let context = self.0.clone();
        blocking(move || {
            context.storage.put_action_result(&action, &result)?;
            Ok(Response::new(result))
        })
        .await
    }
}
