//! Running an action remotely: Execute, following the operation to its end.
//!
//! The server answers Execute with a stream of `google.longrunning.Operation`s that ends with a
//! done one carrying an `ExecuteResponse`. Streams break (proxies time out idle streams, servers
//! restart), so when one ends early the client re-attaches with WaitExecution under the
//! operation's name; when the server no longer knows the operation, or reports a transient
//! failure of the execution itself, the action is executed again (Execute is idempotent for a
//! given action). All of it is bounded by the retry budget and the Execute deadline.

use bazel_remote_apis::build::bazel::remote::execution::v2::{self as re, ExecuteResponse};
use std::sync::Arc;
use std::time::Duration;

use bazel_remote_apis::google::longrunning::operations_client::OperationsClient;
use bazel_remote_apis::google::longrunning::{CancelOperationRequest, Operation, operation};
use prost::Message as _;
use tonic::{Code, Status};

use super::client::{Client, Inner, MAX_MESSAGE_BYTES};
use super::digest::Digest;
use super::error::is_transient;
use super::error::{ReapiError, status_from_proto};
use super::metadata::CallContext;
use super::retry;

const EXECUTE_RESPONSE_TYPE: &str = "build.bazel.remote.execution.v2.ExecuteResponse";
const EXECUTE_METADATA_TYPE: &str = "build.bazel.remote.execution.v2.ExecuteOperationMetadata";

/// Where an action is on the server, as its operation's metadata reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    CacheCheck,
    Queued,
    Executing,
    Completed,
}

impl Stage {
    fn from_metadata(any: &bazel_remote_apis::google::protobuf::Any) -> Option<Stage> {
        if !is_type(&any.type_url, EXECUTE_METADATA_TYPE) {
            return None;
        }
        let metadata = re::ExecuteOperationMetadata::decode(any.value.as_slice()).ok()?;
        use re::execution_stage::Value;
        match Value::try_from(metadata.stage).ok()? {
            Value::Unknown => None,
            Value::CacheCheck => Some(Stage::CacheCheck),
            Value::Queued => Some(Stage::Queued),
            Value::Executing => Some(Stage::Executing),
            Value::Completed => Some(Stage::Completed),
        }
    }
}

/// Whether an `Any` type URL names `full_name` (`type.googleapis.com/<full_name>` or another host).
fn is_type(type_url: &str, full_name: &str) -> bool {
    type_url.rsplit('/').next() == Some(full_name)
}

/// How one attempt at following an operation ended, if it did not bring the result.
enum Interrupted {
    /// The call or stream failed.
    Status(Status),
    /// The stream ended without a done operation.
    StreamEnded,
}

impl Client {
    /// Executes `action` and returns the server's response once it is done. The response's
    /// status is OK and its `result` is present (a failed execution is an error carrying its
    /// code, and for missing inputs [`ReapiError::missing_blobs`]); the action's own exit code is
    /// in `result`. Stdout and stderr are asked to be inlined (servers may still send digests).
    pub async fn execute(
        &self,
        action: &Digest,
        skip_cache_lookup: bool,
        ctx: &CallContext,
    ) -> Result<ExecuteResponse, ReapiError> {
        self.execute_with_progress(action, skip_cache_lookup, &[], ctx, |_| {})
            .await
    }

    /// [`Client::execute`], calling `on_stage` each time the action's stage changes, and asking
    /// the server to inline the output files named in `inline_outputs` (output paths) in the
    /// result; it may still send only digests, and nothing it inlines is trusted unchecked.
    pub async fn execute_with_progress(
        &self,
        action: &Digest,
        skip_cache_lookup: bool,
        inline_outputs: &[String],
        ctx: &CallContext,
        mut on_stage: impl FnMut(Stage) + Send,
    ) -> Result<ExecuteResponse, ReapiError> {
        let inner = &self.inner;
        if !inner.capabilities.exec_enabled {
            return Err(ReapiError::Unsupported {
                endpoint: inner.endpoint.clone(),
                what: "does not execute actions (exec_enabled is false); use it as a cache only"
                    .to_string(),
            });
        }
        let request = re::ExecuteRequest {
            instance_name: inner.instance_name.clone(),
            skip_cache_lookup,
            action_digest: Some(action.clone()),
            execution_policy: None,
            results_cache_policy: None,
            digest_function: 0,
            inline_stdout: true,
            inline_stderr: true,
            inline_output_files: inline_outputs.to_vec(),
        };
        let mut attempts = inner.attempts(tokio::time::Instant::now() + inner.execute_timeout);
        // Holds the operation to re-attach to (`None` means (re-)execute), and cancels it on the
        // server if this future is dropped while it runs.
        let mut abandon = CancelOnDrop {
            inner: self.inner.clone(),
            ctx: ctx.clone(),
            operation: None,
        };
        let mut stage = None;
        loop {
            let rpc = if abandon.operation.is_some() {
                "WaitExecution"
            } else {
                "Execute"
            };
            let Some(remaining) = attempts.remaining() else {
                return Err(inner.fail(rpc, &retry::deadline_passed(), &attempts));
            };
            let mut progressed = false;
            let follow = inner.follow(
                &request,
                &mut abandon.operation,
                ctx,
                remaining,
                &mut progressed,
                |s| {
                    if stage != Some(s) {
                        tracing::debug!(
                            action = %ctx.action_id,
                            target = %ctx.target_id,
                            stage = ?s,
                            "remote execution stage"
                        );
                        stage = Some(s);
                        on_stage(s);
                    }
                },
            );
            let outcome = tokio::time::timeout(remaining, follow).await;
            let status = match outcome {
                Ok(Ok(done)) => match inner.unpack(done) {
                    Ok(response) => {
                        abandon.operation = None;
                        return Ok(response);
                    }
                    // A transient failure of the execution itself: run the action again. That
                    // execution is a spent attempt, not progress: a server that fails every one
                    // (INTERNAL for a compiler it cannot run) must not be retried for an hour.
                    Err(status)
                        if is_transient(status.code())
                            && status.code() != Code::DeadlineExceeded =>
                    {
                        abandon.operation = None;
                        progressed = false;
                        status
                    }
                    Err(status) => return Err(inner.fail("Execute", &status, &attempts)),
                },
                Ok(Err(Interrupted::StreamEnded)) => {
                    Status::unavailable("the operation stream ended before the action was done")
                }
                Ok(Err(Interrupted::Status(status)))
                    if status.code() == Code::NotFound && abandon.operation.is_some() =>
                {
                    // The server forgot the operation (restarted, or expired it): execute again.
                    abandon.operation = None;
                    Status::unavailable(format!(
                        "the server no longer knows the operation: {}",
                        status.message()
                    ))
                }
                Ok(Err(Interrupted::Status(status))) => status,
                Err(_) => retry::deadline_passed(),
            };
            if progressed {
                attempts.reset();
            }
            if !attempts.retry_after(&status).await {
                return Err(inner.fail(rpc, &status, &attempts));
            }
        }
    }
}

/// Sends CancelOperation for an operation whose Execute was abandoned (the future dropped: the link
/// failed or was interrupted), so the cluster stops spending a worker on it. Best effort: the call
/// runs on a task of its own, and [`Client::settle_cancellations`] lets the run wait for it briefly.
struct CancelOnDrop {
    inner: Arc<Inner>,
    ctx: CallContext,
    /// The operation in flight, if any.
    operation: Option<String>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(name) = self.operation.take() else {
            return;
        };
        let inner = self.inner.clone();
        let ctx = self.ctx.clone();
        let cancel = async move {
            let mut client = OperationsClient::new(inner.channel());
            let request = inner.request(CancelOperationRequest { name }, &ctx, CANCEL_TIMEOUT);
            // Servers without the Operations service answer UNIMPLEMENTED: nothing more to do.
            let _ = client.cancel_operation(request).await;
        };
        if let Ok(mut pending) = self.inner.cancellations.lock()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            pending.spawn(cancel);
        }
    }
}

/// How long a CancelOperation may take; it must not hold up the end of an interrupted link.
const CANCEL_TIMEOUT: Duration = Duration::from_millis(500);

impl Client {
    /// Waits (at most [`CANCEL_TIMEOUT`]) for the CancelOperation calls of abandoned executions.
    pub async fn settle_cancellations(&self) {
        let pending = match self.inner.cancellations.lock() {
            Ok(mut pending) => std::mem::take(&mut *pending),
            Err(_) => return,
        };
        let _ = tokio::time::timeout(CANCEL_TIMEOUT, pending.join_all()).await;
    }
}

impl Inner {
    /// Calls Execute (or WaitExecution when `operation` is known) and reads the stream until a
    /// done operation arrives. Records the operation's name and whether any message arrived.
    async fn follow(
        &self,
        request: &re::ExecuteRequest,
        operation: &mut Option<String>,
        ctx: &CallContext,
        remaining: std::time::Duration,
        progressed: &mut bool,
        mut on_stage: impl FnMut(Stage),
    ) -> Result<Operation, Interrupted> {
        let mut client = re::execution_client::ExecutionClient::new(self.channel())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let response = match operation.as_deref() {
            None => {
                client
                    .execute(self.request(request.clone(), ctx, remaining))
                    .await
            }
            Some(name) => {
                let wait = re::WaitExecutionRequest {
                    name: name.to_string(),
                };
                client
                    .wait_execution(self.request(wait, ctx, remaining))
                    .await
            }
        };
        let mut stream = response.map_err(Interrupted::Status)?.into_inner();
        while let Some(op) = stream.message().await.map_err(Interrupted::Status)? {
            *progressed = true;
            if !op.name.is_empty() {
                *operation = Some(op.name.clone());
            }
            if let Some(stage) = op.metadata.as_ref().and_then(Stage::from_metadata) {
                on_stage(stage);
            }
            if op.done {
                return Ok(op);
            }
        }
        Err(Interrupted::StreamEnded)
    }

    /// The ExecuteResponse of a done operation, or the status it failed with (as a gRPC status,
    /// so that missing-blob details and transient codes are read the same way as a call's).
    /// A malformed operation is INTERNAL, so the action is executed again within the budget.
    fn unpack(&self, op: Operation) -> Result<ExecuteResponse, Status> {
        let protocol =
            |what: &str| Status::internal(format!("invalid operation {}: {what}", op.name));
        let any = match &op.result {
            Some(operation::Result::Error(status)) => return Err(status_from_proto(status)),
            Some(operation::Result::Response(any)) => any,
            None => return Err(protocol("done without a result")),
        };
        if !is_type(&any.type_url, EXECUTE_RESPONSE_TYPE) {
            return Err(protocol(&format!("response of type {}", any.type_url)));
        }
        let response = ExecuteResponse::decode(any.value.as_slice())
            .map_err(|e| protocol(&format!("undecodable ExecuteResponse: {e}")))?;
        match &response.status {
            Some(status) if status.code != 0 => {
                let status = status_from_proto(status);
                let message = if response.message.is_empty() {
                    status.message().to_string()
                } else {
                    format!("{} ({})", status.message(), response.message)
                };
                Err(Status::with_details(
                    status.code(),
                    message,
                    status.details().to_vec().into(),
                ))
            }
            _ if response.result.is_none() => {
                Err(protocol("an OK ExecuteResponse without a result"))
            }
            _ => Ok(response),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bazel_remote_apis::google::protobuf::Any;

    #[test]
    fn type_urls_and_stages() {
        assert!(is_type(
            "type.googleapis.com/build.bazel.remote.execution.v2.ExecuteResponse",
            EXECUTE_RESPONSE_TYPE
        ));
        assert!(!is_type(
            "type.googleapis.com/google.rpc.Status",
            EXECUTE_RESPONSE_TYPE
        ));
        let metadata = re::ExecuteOperationMetadata {
            stage: re::execution_stage::Value::Queued as i32,
            ..Default::default()
        };
        let any = Any {
            type_url: format!("type.googleapis.com/{EXECUTE_METADATA_TYPE}"),
            value: metadata.encode_to_vec(),
        };
        assert_eq!(Stage::from_metadata(&any), Some(Stage::Queued));
        assert_eq!(
            Stage::from_metadata(&Any {
                type_url: "x/y".into(),
                value: vec![]
            }),
            None
        );
    }
}
