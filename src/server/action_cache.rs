//! The ActionCache service: GetActionResult (inlining stdout, stderr and named output files on
//! request) and UpdateActionResult.

use super::context::{Context, blocking_unless_small};
use super::digest::BlobDigest;
use bazel_remote_apis::build::bazel::remote::execution::v2::{
    ActionResult, Digest, GetActionResultRequest, UpdateActionResultRequest,
    action_cache_server::ActionCache,
};
use prost::Message as _;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct ActionCacheService(pub Arc<Context>);

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
        // The entry is small; what it names, inlined on request, may not be.
        let mut result =
            self.0.storage.action_result(&action)?.ok_or_else(|| {
                Status::not_found(format!("no cached result for action {action}"))
            })?;
        let size = |d: Option<&Digest>| d.map_or(0, |d| u64::try_from(d.size_bytes).unwrap_or(0));
        let inlined = [
            (request.inline_stdout, result.stdout_digest.as_ref()),
            (request.inline_stderr, result.stderr_digest.as_ref()),
        ]
        .into_iter()
        .chain(result.output_files.iter().map(|file| {
            let wanted = request.inline_output_files.contains(&file.path);
            (wanted, file.digest.as_ref())
        }))
        .filter(|(wanted, _)| *wanted)
        .map(|(_, digest)| size(digest))
        .fold(0, u64::saturating_add);
        let cache = ActionCacheService(self.0.clone());
        blocking_unless_small(inlined, move || {
            if request.inline_stdout {
                result.stdout_raw = cache
                    .0
                    .inline(result.stdout_digest.as_ref())?
                    .unwrap_or_default();
            }
            if request.inline_stderr {
                result.stderr_raw = cache
                    .0
                    .inline(result.stderr_digest.as_ref())?
                    .unwrap_or_default();
            }
            for file in &mut result.output_files {
                if request.inline_output_files.contains(&file.path) {
                    file.contents = cache.0.inline(file.digest.as_ref())?.unwrap_or_default();
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
        blocking_unless_small(result.encoded_len() as u64, move || {
            context.storage.put_action_result(&action, &result)?;
            Ok(Response::new(result))
        })
        .await
    }
}
