//! The action cache: looking up the result of an action by its digest, and recording one.

use super::connections::CountedChannel;
use bazel_remote_apis::build::bazel::remote::execution::v2::{self as re, ActionResult};
use tonic::Code;

use super::client::{Client, Inner, MAX_MESSAGE_BYTES};
use super::digest::Digest;
use super::error::ReapiError;
use super::metadata::CallContext;
use super::retry;

impl Inner {
    fn action_cache(&self) -> re::action_cache_client::ActionCacheClient<CountedChannel> {
        re::action_cache_client::ActionCacheClient::new(self.channel())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }
}

impl Client {
    /// The cached result of `action`, or `None` if the cache has none. The server is asked to put
    /// stdout, stderr and the `inline_outputs` (output paths) into the result, which saves a
    /// download round trip per output; it may still send only digests, and nothing it inlines is
    /// trusted before its digest is checked.
    pub async fn get_action_result(
        &self,
        action: &Digest,
        inline_outputs: &[String],
        ctx: &CallContext,
    ) -> Result<Option<ActionResult>, ReapiError> {
        let inner = &self.inner;
        let request = re::GetActionResultRequest {
            instance_name: inner.instance_name.clone(),
            action_digest: Some(action.clone()),
            inline_stdout: true,
            inline_stderr: true,
            inline_output_files: inline_outputs.to_vec(),
            digest_function: 0,
        };
        let mut attempts = inner.attempts(inner.deadline());
        retry::run(&mut attempts, |remaining| {
            let mut client = inner.action_cache();
            let request = inner.request(request.clone(), ctx, remaining);
            async move {
                match client.get_action_result(request).await {
                    Ok(response) => Ok(Some(response.into_inner())),
                    Err(status) if status.code() == Code::NotFound => Ok(None),
                    Err(status) => Err(status),
                }
            }
        })
        .await
        .map_err(|status| inner.fail("GetActionResult", &status, &attempts))
    }

    /// Records `result` as the result of `action`. Fails without a call if the server said at
    /// connect time that clients may not write to its action cache.
    pub async fn update_action_result(
        &self,
        action: &Digest,
        result: ActionResult,
        ctx: &CallContext,
    ) -> Result<(), ReapiError> {
        let inner = &self.inner;
        if !inner.capabilities.ac_update_enabled {
            return Err(ReapiError::Unsupported {
                endpoint: inner.endpoint.clone(),
                what: "does not let clients write to the action cache (update_enabled is false)"
                    .to_string(),
            });
        }
        let request = re::UpdateActionResultRequest {
            instance_name: inner.instance_name.clone(),
            action_digest: Some(action.clone()),
            action_result: Some(result),
            results_cache_policy: None,
            digest_function: 0,
        };
        let mut attempts = inner.attempts(inner.deadline());
        retry::run(&mut attempts, |remaining| {
            let mut client = inner.action_cache();
            let request = inner.request(request.clone(), ctx, remaining);
            async move { client.update_action_result(request).await.map(drop) }
        })
        .await
        .map_err(|status| inner.fail("UpdateActionResult", &status, &attempts))
    }
}
