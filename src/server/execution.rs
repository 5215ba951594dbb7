//! The Execution service and the longrunning Operations it creates. Execute checks the request,
//! answers from the action cache unless told not to, else queues the action for a worker
//! (`--workers` run at once) and streams its Operation: QUEUED, EXECUTING, then done with an
//! ExecuteResponse. WaitExecution re-attaches to an Operation by name, and CancelOperation stops it.
//!
//! Identical actions in flight run once: an Execute of an action that is already queued or running
//! (and not `do_not_cache`) attaches to that Operation and gets the same result, as Buildbarn,
//! BuildBuddy and NativeLink do. Attached clients share the Operation, its name and its
//! cancellation.

use super::context::{
    Context, blocking, blocking_unless_small, missing_blobs, ok_status, pack, rpc_status,
};
use super::digest::BlobDigest;
use super::worker::{Finished, Job, Worker, now};
use bazel_remote_apis::build::bazel::remote::execution::v2::{
    Action, Command, ExecuteOperationMetadata, ExecuteRequest, ExecuteResponse,
    WaitExecutionRequest, execution_server::Execution, execution_stage,
};
use bazel_remote_apis::google::longrunning::{
    CancelOperationRequest, DeleteOperationRequest, GetOperationRequest, ListOperationsRequest,
    ListOperationsResponse, Operation, WaitOperationRequest, operation,
    operations_server::Operations,
};
use bazel_remote_apis::google::protobuf::Empty;
use futures::stream::{self, BoxStream, StreamExt};
use prost::Message as _;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// How long a finished Operation can still be re-attached to with WaitExecution.
const KEEP_FINISHED: Duration = Duration::from_secs(600);

const METADATA_TYPE: &str = "build.bazel.remote.execution.v2.ExecuteOperationMetadata";
const RESPONSE_TYPE: &str = "build.bazel.remote.execution.v2.ExecuteResponse";

/// Every state an Operation has been in, in order (at most QUEUED, EXECUTING, done). Keeping the
/// history rather than only the latest state lets an Execute stream show every stage even when
/// the action moves on faster than the client reads.
type History = Vec<Operation>;

/// A live or recently finished Operation.
struct Entry {
    state: watch::Receiver<History>,
    cancel: CancellationToken,
}

pub struct Executor {
    context: Arc<Context>,
    worker: Worker,
    slots: Semaphore,
    operations: Mutex<HashMap<String, Entry>>,
    /// The Operation of each cacheable action queued or running, by action digest. Locked before
    /// `operations` when both are.
    in_flight: Mutex<HashMap<BlobDigest, String>>,
    /// Cancelled at shutdown; every action's token is a child of it.
    shutdown: CancellationToken,
}

type OperationStream = BoxStream<'static, Result<Operation, Status>>;

fn stage_operation(name: &str, action: &BlobDigest, stage: execution_stage::Value) -> Operation {
    Operation {
        name: name.to_owned(),
        metadata: Some(pack(
            METADATA_TYPE,
            &ExecuteOperationMetadata {
                stage: stage as i32,
                action_digest: Some(action.to_proto()),
                ..Default::default()
            },
        )),
        done: false,
        result: None,
    }
}

fn done_operation(name: &str, action: &BlobDigest, response: &ExecuteResponse) -> Operation {
    Operation {
        done: true,
        result: Some(operation::Result::Response(pack(RESPONSE_TYPE, response))),
        ..stage_operation(name, action, execution_stage::Value::Completed)
    }
}

/// Streams an Operation's states from position `from` of its history until it is done.
fn follow(state: watch::Receiver<History>, from: usize) -> OperationStream {
    stream::unfold(Some((state, from)), |next| async move {
        let (mut state, position) = next?;
        loop {
            let operation = state.borrow_and_update().get(position).cloned();
            if let Some(operation) = operation {
                let more = (!operation.done).then_some((state, position + 1));
                return Some((Ok(operation), more));
            }
            if state.changed().await.is_err() {
                return None;
            }
        }
    })
    .boxed()
}

/// `operations` with the output files named in `wanted` inlined in the done Operation's result,
/// as long as they fit in one batch together (a client fetches the others from the CAS). Inlined
/// contents are a read of the blob, so `--fault-corrupt-reads` applies to them; with the faults
/// of ByteStream reads nothing is inlined, so that those reads happen.
fn inlining(
    context: Arc<Context>,
    operations: OperationStream,
    wanted: Vec<String>,
) -> OperationStream {
    if wanted.is_empty() || context.hostile.spoils_reads() {
        return operations;
    }
    let wanted = Arc::new(wanted);
    operations
        .then(move |item| {
            let (context, wanted) = (context.clone(), wanted.clone());
            async move {
                match item {
                    Ok(operation) if operation.done => {
                        let bytes = inlined_size(&context, &operation, &wanted);
                        let inline = move || inline_outputs(&context, operation, &wanted);
                        blocking_unless_small(bytes, inline).await
                    }
                    other => other,
                }
            }
        })
        .boxed()
}

/// How many bytes [`inline_outputs`] reads for `operation`: the `wanted` outputs, at most a batch.
fn inlined_size(context: &Context, operation: &Operation, wanted: &[String]) -> u64 {
    let Some(operation::Result::Response(any)) = &operation.result else {
        return 0;
    };
    let Ok(response) = ExecuteResponse::decode(any.value.as_slice()) else {
        return 0;
    };
    response
        .result
        .iter()
        .flat_map(|result| &result.output_files)
        .filter(|file| wanted.contains(&file.path))
        .map(|file| {
            file.digest
                .as_ref()
                .map_or(0, |d| d.size_bytes.max(0) as u64)
        })
        .fold(0, u64::saturating_add)
        .min(context.max_batch_bytes)
}

/// The done `operation` with the `wanted` outputs of its response's result inlined (see
/// [`inlining`]).
fn inline_outputs(
    context: &Context,
    mut operation: Operation,
    wanted: &[String],
) -> Result<Operation, Status> {
    let Some(operation::Result::Response(any)) = &operation.result else {
        return Ok(operation);
    };
    let mut response = ExecuteResponse::decode(any.value.as_slice())
        .map_err(|e| Status::internal(format!("cannot decode an ExecuteResponse: {e}")))?;
    let Some(result) = response.result.as_mut() else {
        return Ok(operation);
    };
    let mut room = context.max_batch_bytes;
    for file in &mut result.output_files {
        let size = file
            .digest
            .as_ref()
            .map_or(0, |d| d.size_bytes.max(0) as u64);
        if !wanted.contains(&file.path) || size > room {
            continue;
        }
        if let Some(mut data) = context.inline(file.digest.as_ref())? {
            room -= size;
            context.faults.corrupt_read(&mut data);
            file.contents = data;
        }
    }
    operation.result = Some(operation::Result::Response(pack(RESPONSE_TYPE, &response)));
    Ok(operation)
}

impl Executor {
    pub fn new(
        context: Arc<Context>,
        worker: Worker,
        workers: usize,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            context,
            worker,
            slots: Semaphore::new(workers.max(1)),
            operations: Mutex::default(),
            in_flight: Mutex::default(),
            shutdown,
        }
    }

    fn operations(&self) -> Result<std::sync::MutexGuard<'_, HashMap<String, Entry>>, Status> {
        self.operations
            .lock()
            .map_err(|_| Status::internal("operation table lock poisoned"))
    }

    fn fetch<M: prost::Message + Default>(
        &self,
        digest: &BlobDigest,
        what: &str,
    ) -> Result<M, Status> {
        self.context.storage.message(digest)?.ok_or_else(|| {
            missing_blobs(
                &format!("the {what} is not in the CAS"),
                std::slice::from_ref(digest),
            )
        })
    }

    fn in_flight(&self) -> Result<std::sync::MutexGuard<'_, HashMap<BlobDigest, String>>, Status> {
        self.in_flight
            .lock()
            .map_err(|_| Status::internal("in-flight table lock poisoned"))
    }

    fn entry_state(&self, name: &str) -> Result<watch::Receiver<History>, Status> {
        self.operations()?
            .get(name)
            .map(|entry| entry.state.clone())
            .ok_or_else(|| Status::not_found(format!("no operation named {name:?}")))
    }

    /// Waits for a worker slot, runs the action and publishes each stage, then the response.
    async fn drive(
        self: Arc<Self>,
        name: String,
        action_digest: BlobDigest,
        job: Job,
        state: watch::Sender<History>,
        cancel: CancellationToken,
    ) {
        let do_not_cache = job.action.do_not_cache;
        let finished = tokio::select! {
            permit = self.slots.acquire() => match permit {
                Ok(_permit) => {
                    self.context.stats.executed();
                    state.send_modify(|history| history.push(stage_operation(&name, &action_digest, execution_stage::Value::Executing)));
                    self.worker.run(job, cancel).await
                }
                Err(_) => Err(Status::unavailable("the server is shutting down")),
            },
            () = cancel.cancelled() => Err(Status::cancelled("the action was cancelled before it ran")),
        };
        let response = match finished {
            Ok(Finished { result, status }) => {
                let mut response = ExecuteResponse {
                    status: Some(status.as_ref().map_or_else(ok_status, rpc_status)),
                    ..Default::default()
                };
                // Only complete, successful, cacheable runs enter the action cache.
                if status.is_none() && result.exit_code == 0 && !do_not_cache {
                    let (context, key, value) =
                        (self.context.clone(), action_digest.clone(), result.clone());
                    let size = value.encoded_len() as u64;
                    let store = move || context.storage.put_action_result(&key, &value);
                    if let Err(e) = blocking_unless_small(size, store).await {
                        response.status = Some(rpc_status(&e));
                    }
                }
                let mut result = result;
                self.context.hostile.lie_about(&mut result);
                response.result = Some(result);
                response
            }
            Err(e) => ExecuteResponse {
                status: Some(rpc_status(&e)),
                ..Default::default()
            },
        };
        // From here on an identical Execute runs the action again (or finds it cached).
        if !do_not_cache && let Ok(mut in_flight) = self.in_flight() {
            in_flight.remove(&action_digest);
        }
        state.send_modify(|history| history.push(done_operation(&name, &action_digest, &response)));
        tokio::time::sleep(KEEP_FINISHED).await;
        if let Ok(mut operations) = self.operations() {
            operations.remove(&name);
        }
    }
}

/// The Execution service, sharing the Executor with the Operations service.
pub struct ExecutionService(pub Arc<Executor>);

#[tonic::async_trait]
impl Execution for ExecutionService {
    type ExecuteStream = OperationStream;

    async fn execute(
        &self,
        request: Request<ExecuteRequest>,
    ) -> Result<Response<Self::ExecuteStream>, Status> {
        let executor = &self.0;
        let request = request.into_inner();
        executor
            .context
            .enter("Execute", &request.instance_name, request.digest_function)
            .await?;
        let action_digest = BlobDigest::required(request.action_digest.as_ref(), "action_digest")?;
        let (reading, key) = (executor.clone(), action_digest.clone());
        let skip_cache_lookup = request.skip_cache_lookup;
        let (action, command, cached) = blocking(move || {
            let action: Action = reading.fetch(&key, "Action")?;
            let command_digest =
                BlobDigest::required(action.command_digest.as_ref(), "command_digest")?;
            let command: Command = reading.fetch(&command_digest, "Command")?;
            reading.context.check_platform(&action, &command)?;
            let cached = if skip_cache_lookup {
                None
            } else {
                reading.context.storage.action_result(&key)?
            };
            Ok((action, command, cached))
        })
        .await?;
        let name = if executor.context.instance_name.is_empty() {
            format!("operations/{}", uuid::Uuid::new_v4())
        } else {
            format!(
                "{}/operations/{}",
                executor.context.instance_name,
                uuid::Uuid::new_v4()
            )
        };

        if let Some(result) = cached {
            let response = ExecuteResponse {
                result: Some(result),
                cached_result: true,
                status: Some(ok_status()),
                ..Default::default()
            };
            let done = done_operation(&name, &action_digest, &response);
            let operations = stream::iter([Ok(done)]).boxed();
            return Ok(Response::new(inlining(
                executor.context.clone(),
                operations,
                request.inline_output_files,
            )));
        }

        let do_not_cache = action.do_not_cache;
        let state = {
            let mut in_flight = executor.in_flight()?;
            let running = match in_flight.get(&action_digest) {
                Some(running) if !do_not_cache => executor.entry_state(running).ok(),
                _ => None,
            };
            match running {
                Some(state) => {
                    executor.context.stats.merged();
                    state
                }
                None => {
                    let queued =
                        stage_operation(&name, &action_digest, execution_stage::Value::Queued);
                    let (sender, state) = watch::channel(vec![queued]);
                    let cancel = executor.shutdown.child_token();
                    executor.operations()?.insert(
                        name.clone(),
                        Entry {
                            state: state.clone(),
                            cancel: cancel.clone(),
                        },
                    );
                    if !do_not_cache {
                        in_flight.insert(action_digest.clone(), name.clone());
                    }
                    let job = Job {
                        action,
                        command,
                        queued: now(),
                    };
                    tokio::spawn(
                        executor
                            .clone()
                            .drive(name, action_digest, job, sender, cancel),
                    );
                    state
                }
            }
        };

        let operations = inlining(
            executor.context.clone(),
            follow(state, 0),
            request.inline_output_files,
        );
        if executor.context.faults.drop_execute_stream() {
            // The client sees the accepted Operation, then a broken stream, and must WaitExecution.
            let dropped = Status::unavailable("fault injection: Execute stream dropped");
            return Ok(Response::new(
                operations
                    .take(1)
                    .chain(stream::iter([Err(dropped)]))
                    .boxed(),
            ));
        }
        Ok(Response::new(operations))
    }

    type WaitExecutionStream = OperationStream;

    async fn wait_execution(
        &self,
        request: Request<WaitExecutionRequest>,
    ) -> Result<Response<Self::WaitExecutionStream>, Status> {
        self.0.context.misbehave("WaitExecution").await?;
        let state = self.0.entry_state(&request.get_ref().name)?;
        // Re-attaching starts from the latest state.
        let latest = state.borrow().len().saturating_sub(1);
        Ok(Response::new(follow(state, latest)))
    }
}

/// The google.longrunning Operations service: GetOperation and CancelOperation.
pub struct OperationsService(pub Arc<Executor>);

#[tonic::async_trait]
impl Operations for OperationsService {
    async fn list_operations(
        &self,
        _: Request<ListOperationsRequest>,
    ) -> Result<Response<ListOperationsResponse>, Status> {
        Err(Status::unimplemented("ListOperations is not supported"))
    }

    async fn get_operation(
        &self,
        request: Request<GetOperationRequest>,
    ) -> Result<Response<Operation>, Status> {
        self.0.context.misbehave("GetOperation").await?;
        let state = self.0.entry_state(&request.get_ref().name)?;
        let latest = state.borrow().last().cloned();
        latest
            .map(Response::new)
            .ok_or_else(|| Status::internal("operation without a state"))
    }

    async fn delete_operation(
        &self,
        _: Request<DeleteOperationRequest>,
    ) -> Result<Response<Empty>, Status> {
        Err(Status::unimplemented("DeleteOperation is not supported"))
    }

    async fn cancel_operation(
        &self,
        request: Request<CancelOperationRequest>,
    ) -> Result<Response<Empty>, Status> {
        self.0.context.misbehave("CancelOperation").await?;
        let name = &request.get_ref().name;
        self.0
            .operations()?
            .get(name)
            .ok_or_else(|| Status::not_found(format!("no operation named {name:?}")))?
            .cancel
            .cancel();
        Ok(Response::new(Empty {}))
    }

    async fn wait_operation(
        &self,
        _: Request<WaitOperationRequest>,
    ) -> Result<Response<Operation>, Status> {
        Err(Status::unimplemented("WaitOperation is not supported"))
    }
}
