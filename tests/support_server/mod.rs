//! Shared helpers for the `server_*` and `reapi_client` tests: start the real `dtlto-reapi serve`
//! binary as its own process, find its address from the first stdout line, talk to it over real
//! gRPC (TCP or a unix socket), make the calls many tests make, and build and upload the trees,
//! Commands and Actions the tests execute.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use bazel_remote_apis::build::bazel::remote::execution::v2::{
    Action, ActionResult, BatchReadBlobsRequest, BatchUpdateBlobsRequest, Command, Digest,
    Directory, DirectoryNode, ExecuteOperationMetadata, ExecuteRequest, ExecuteResponse, FileNode,
    FindMissingBlobsRequest, GetActionResultRequest, UpdateActionResultRequest,
    WaitExecutionRequest, action_cache_client::ActionCacheClient, batch_update_blobs_request,
    capabilities_client::CapabilitiesClient, command,
    content_addressable_storage_client::ContentAddressableStorageClient,
    execution_client::ExecutionClient,
};
use bazel_remote_apis::google::bytestream::{
    QueryWriteStatusRequest, QueryWriteStatusResponse, ReadRequest, WriteRequest,
    byte_stream_client::ByteStreamClient,
};
use bazel_remote_apis::google::longrunning::{
    CancelOperationRequest, Operation, operation, operations_client::OperationsClient,
};
use bazel_remote_apis::google::protobuf::Duration;
use futures::StreamExt;
use hyper_util::rt::TokioIo;
use prost::Message;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::process::{Child, ChildStdout, Command as Process};
use tonic::transport::{Channel, Endpoint};
use tonic::{Response, Status, Streaming};

#[path = "../serve_process/mod.rs"]
mod serve_process;

/// A running `dtlto-reapi serve`, sent SIGTERM when dropped so that it cleans up after itself.
pub struct Server {
    child: Child,
    /// Where the server listens, as it printed it: `grpc://127.0.0.1:PORT` or `unix://PATH`.
    pub address: String,
    pub channel: Channel,
    // Kept open so the server never writes to a closed pipe.
    _stdout: BufReader<ChildStdout>,
}

fn serve(args: &[&str]) -> Process {
    Process::from(serve_process::command(args))
}

fn sigterm(child: &Child) {
    if let Some(pid) = child.id() {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
}

/// A channel to `address`, over TCP or a unix socket.
async fn connect(address: &str) -> Channel {
    match address.strip_prefix("unix://") {
        Some(path) => {
            let path = PathBuf::from(path);
            Endpoint::from_static("http://localhost")
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
                }))
                .await
                .unwrap_or_else(|e| panic!("cannot connect to {address}: {e}"))
        }
        None => Channel::from_shared(address.replace("grpc://", "http://"))
            .unwrap_or_else(|e| panic!("bad address {address}: {e}"))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {address}: {e}")),
    }
}

impl Server {
    /// Starts the server with `args` (on a free loopback port unless they say `--listen`) and
    /// connects to it.
    pub async fn start(args: &[&str]) -> Self {
        let mut process = serve(args);
        let mut child = process.spawn().expect("spawn dtlto-reapi serve");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        tokio::time::timeout(serve_process::STARTUP, stdout.read_line(&mut line))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{process:?} printed nothing within {:?}",
                    serve_process::STARTUP
                )
            })
            .expect("read the first line");
        let address = serve_process::address(&process, &line);
        let channel = connect(&address).await;
        Self {
            child,
            address,
            channel,
            _stdout: stdout,
        }
    }

    /// `http://127.0.0.1:PORT`, for third-party clients; panics for a unix socket.
    pub fn http_url(&self) -> String {
        match self.address.strip_prefix("grpc://") {
            Some(host_port) => format!("http://{host_port}"),
            None => panic!("{} is not a TCP address", self.address),
        }
    }

    /// Sends SIGTERM and waits for the exit.
    pub async fn terminate(mut self) -> ExitStatus {
        sigterm(&self.child);
        self.child.wait().await.expect("wait")
    }

    pub fn capabilities(&self) -> CapabilitiesClient<Channel> {
        CapabilitiesClient::new(self.channel.clone())
    }
    pub fn cas(&self) -> ContentAddressableStorageClient<Channel> {
        ContentAddressableStorageClient::new(self.channel.clone())
    }
    pub fn bytestream(&self) -> ByteStreamClient<Channel> {
        ByteStreamClient::new(self.channel.clone())
    }
    pub fn action_cache(&self) -> ActionCacheClient<Channel> {
        ActionCacheClient::new(self.channel.clone())
    }
    pub fn execution(&self) -> ExecutionClient<Channel> {
        ExecutionClient::new(self.channel.clone())
    }
    pub fn operations(&self) -> OperationsClient<Channel> {
        OperationsClient::new(self.channel.clone())
    }

    /// Uploads blobs with BatchUpdateBlobs, asserting that each was accepted.
    pub async fn upload(&self, blobs: &[Vec<u8>]) {
        let requests = blobs
            .iter()
            .map(|data| batch_update_blobs_request::Request {
                digest: Some(digest(data)),
                data: data.clone(),
                ..Default::default()
            })
            .collect();
        let response = self
            .cas()
            .batch_update_blobs(BatchUpdateBlobsRequest {
                requests,
                ..Default::default()
            })
            .await
            .expect("BatchUpdateBlobs")
            .into_inner();
        for r in response.responses {
            assert_eq!(
                r.status.map(|s| s.code),
                Some(0),
                "upload of {:?}",
                r.digest
            );
        }
    }

    /// Uploads an action's Command, input tree and Action; returns the Action's digest.
    pub async fn upload_action(&self, spec: &ActionSpec<'_>) -> Digest {
        let (root, mut blobs) = tree(spec.inputs);
        let (command, action) = spec.encode(root);
        let action_digest = digest(&action);
        blobs.push(command);
        blobs.push(action);
        self.upload(&blobs).await;
        action_digest
    }

    /// Uploads the action and runs Execute to the end (cache lookup allowed); returns the Action's
    /// digest and the final ExecuteResponse.
    pub async fn upload_and_execute(&self, spec: &ActionSpec<'_>) -> (Digest, ExecuteResponse) {
        let action = self.upload_action(spec).await;
        let (_, response) = self.execute(&action, false).await;
        (action, response)
    }

    /// Reads `resource_name` with ByteStream Read from `offset`, at most `limit` bytes (0: to the
    /// end); returns the bytes of every chunk, or the first error.
    pub async fn bytestream_read(
        &self,
        resource_name: String,
        offset: i64,
        limit: i64,
    ) -> Result<Vec<u8>, Status> {
        let stream = self
            .bytestream()
            .read(ReadRequest {
                resource_name,
                read_offset: offset,
                read_limit: limit,
            })
            .await?
            .into_inner();
        let chunks: Vec<_> = stream.collect().await;
        chunks.into_iter().try_fold(Vec::new(), |mut all, chunk| {
            all.extend(chunk?.data);
            Ok(all)
        })
    }

    /// Sends `requests` as one ByteStream Write; returns the committed size.
    pub async fn bytestream_write(&self, requests: Vec<WriteRequest>) -> Result<i64, Status> {
        let response = self
            .bytestream()
            .write(futures::stream::iter(requests))
            .await?;
        Ok(response.into_inner().committed_size)
    }

    /// What QueryWriteStatus says of the upload `resource_name`.
    pub async fn query_write_status(&self, resource_name: &str) -> QueryWriteStatusResponse {
        self.bytestream()
            .query_write_status(QueryWriteStatusRequest {
                resource_name: resource_name.to_owned(),
            })
            .await
            .expect("QueryWriteStatus")
            .into_inner()
    }

    /// Starts Execute; returns the stream of Operations.
    pub async fn execute_stream(
        &self,
        action: &Digest,
        skip_cache_lookup: bool,
    ) -> Streaming<Operation> {
        self.execution()
            .execute(ExecuteRequest {
                action_digest: Some(action.clone()),
                skip_cache_lookup,
                ..Default::default()
            })
            .await
            .expect("Execute")
            .into_inner()
    }

    /// Runs Execute to the end; returns every Operation seen and the final ExecuteResponse.
    pub async fn execute(
        &self,
        action: &Digest,
        skip_cache_lookup: bool,
    ) -> (Vec<Operation>, ExecuteResponse) {
        finish(self.execute_stream(action, skip_cache_lookup).await).await
    }

    /// Cancels the operation `name` and waits for it to end; returns the final ExecuteResponse.
    pub async fn cancel(&self, name: &str) -> ExecuteResponse {
        self.operations()
            .cancel_operation(CancelOperationRequest {
                name: name.to_owned(),
            })
            .await
            .expect("CancelOperation");
        self.wait_execution(name).await.1
    }

    /// Runs WaitExecution on the operation `name` to the end; returns every Operation seen and the
    /// final ExecuteResponse.
    pub async fn wait_execution(&self, name: &str) -> (Vec<Operation>, ExecuteResponse) {
        let stream = self
            .execution()
            .wait_execution(WaitExecutionRequest {
                name: name.to_owned(),
            })
            .await
            .expect("WaitExecution")
            .into_inner();
        finish(stream).await
    }

    /// GetActionResult of `action` on the default instance, without inlining.
    pub async fn get_action_result(&self, action: &Digest) -> Result<ActionResult, Status> {
        self.action_cache()
            .get_action_result(GetActionResultRequest {
                action_digest: Some(action.clone()),
                ..Default::default()
            })
            .await
            .map(Response::into_inner)
    }

    /// Stores `result` for `action` with UpdateActionResult, asserting success.
    pub async fn update_action_result(&self, action: &Digest, result: &ActionResult) {
        self.action_cache()
            .update_action_result(UpdateActionResultRequest {
                action_digest: Some(action.clone()),
                action_result: Some(result.clone()),
                ..Default::default()
            })
            .await
            .expect("UpdateActionResult");
    }

    /// The blobs among `digests` that the default instance lacks (FindMissingBlobs).
    pub async fn find_missing(&self, digests: Vec<Digest>) -> Vec<Digest> {
        self.cas()
            .find_missing_blobs(FindMissingBlobsRequest {
                blob_digests: digests,
                ..Default::default()
            })
            .await
            .expect("FindMissingBlobs")
            .into_inner()
            .missing_blob_digests
    }

    /// Reads a blob with BatchReadBlobs.
    pub async fn read(&self, digest: &Digest) -> Vec<u8> {
        let response = self
            .cas()
            .batch_read_blobs(BatchReadBlobsRequest {
                digests: vec![digest.clone()],
                ..Default::default()
            })
            .await
            .expect("BatchReadBlobs")
            .into_inner();
        let entry = response.responses.into_iter().next().expect("one response");
        assert_eq!(entry.status.map(|s| s.code), Some(0), "read {digest:?}");
        entry.data
    }

    /// The stdout of a finished action.
    pub async fn stdout_of(&self, result: &ActionResult) -> String {
        String::from_utf8(
            self.read(result.stdout_digest.as_ref().expect("stdout"))
                .await,
        )
        .expect("utf-8")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        sigterm(&self.child);
    }
}

/// Starts the server with `args` expecting it to refuse; returns its exit status and stderr.
pub async fn refused_start(args: &[&str]) -> (ExitStatus, String) {
    let output = serve(args)
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("run");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// One message of a ByteStream Write: `data` at `offset` of the upload `name`.
pub fn write_request(name: &str, offset: usize, data: &[u8], finish: bool) -> WriteRequest {
    WriteRequest {
        resource_name: name.into(),
        write_offset: offset as i64,
        finish_write: finish,
        data: data.to_vec(),
    }
}

/// What an action runs: arguments, environment, input files (path, contents, executable),
/// output paths, working directory, timeout and caching.
#[derive(Default)]
pub struct ActionSpec<'a> {
    pub args: &'a [&'a str],
    pub env: &'a [(&'a str, &'a str)],
    pub inputs: &'a [(&'a str, &'a [u8], bool)],
    pub outputs: &'a [&'a str],
    pub working_directory: &'a str,
    pub timeout_secs: Option<i64>,
    pub do_not_cache: bool,
}

impl ActionSpec<'_> {
    /// The encoded Command and Action, the Action's input root being `input_root`.
    pub fn encode(&self, input_root: Digest) -> (Vec<u8>, Vec<u8>) {
        let command = Command {
            arguments: self.args.iter().map(|s| s.to_string()).collect(),
            environment_variables: self
                .env
                .iter()
                .map(|(name, value)| command::EnvironmentVariable {
                    name: name.to_string(),
                    value: value.to_string(),
                })
                .collect(),
            output_paths: self.outputs.iter().map(|s| s.to_string()).collect(),
            working_directory: self.working_directory.to_owned(),
            ..Default::default()
        }
        .encode_to_vec();
        let action = Action {
            command_digest: Some(digest(&command)),
            input_root_digest: Some(input_root),
            timeout: self
                .timeout_secs
                .map(|seconds| Duration { seconds, nanos: 0 }),
            do_not_cache: self.do_not_cache,
            ..Default::default()
        }
        .encode_to_vec();
        (command, action)
    }
}

pub fn digest(data: &[u8]) -> Digest {
    Digest {
        hash: hex::encode(Sha256::digest(data)),
        size_bytes: data.len() as i64,
    }
}

/// A directory in the making, keyed by entry name so that entries come out sorted.
#[derive(Default)]
struct Node {
    files: BTreeMap<String, (Vec<u8>, bool)>,
    dirs: BTreeMap<String, Node>,
}

fn encode(node: &Node, blobs: &mut Vec<Vec<u8>>) -> Digest {
    let directory = Directory {
        files: node
            .files
            .iter()
            .map(|(name, (data, is_executable))| {
                blobs.push(data.clone());
                FileNode {
                    name: name.clone(),
                    digest: Some(digest(data)),
                    is_executable: *is_executable,
                    ..Default::default()
                }
            })
            .collect(),
        directories: node
            .dirs
            .iter()
            .map(|(name, child)| DirectoryNode {
                name: name.clone(),
                digest: Some(encode(child, blobs)),
            })
            .collect(),
        ..Default::default()
    };
    let data = directory.encode_to_vec();
    let d = digest(&data);
    blobs.push(data);
    d
}

/// The input root holding `files`; returns its digest and every blob it needs.
pub fn tree(files: &[(&str, &[u8], bool)]) -> (Digest, Vec<Vec<u8>>) {
    let mut root = Node::default();
    for (path, data, executable) in files {
        let mut parts: Vec<&str> = path.split('/').collect();
        let name = parts.pop().expect("file name");
        let node = parts.into_iter().fold(&mut root, |node, part| {
            node.dirs.entry(part.to_owned()).or_default()
        });
        node.files
            .insert(name.to_owned(), (data.to_vec(), *executable));
    }
    let mut blobs = Vec::new();
    let digest = encode(&root, &mut blobs);
    (digest, blobs)
}

/// Reads a stream of Operations to its end; returns them and the final ExecuteResponse.
async fn finish(stream: Streaming<Operation>) -> (Vec<Operation>, ExecuteResponse) {
    let operations: Vec<Operation> = stream.map(|op| op.expect("operation")).collect().await;
    let response = response_of(operations.last().expect("at least one operation"));
    (operations, response)
}

/// The ExecuteResponse of a finished Operation.
pub fn response_of(operation: &Operation) -> ExecuteResponse {
    assert!(operation.done, "operation {} is not done", operation.name);
    match &operation.result {
        Some(operation::Result::Response(any)) => {
            ExecuteResponse::decode(&*any.value).expect("ExecuteResponse")
        }
        other => panic!("operation finished without a response: {other:?}"),
    }
}

/// The stage in an Operation's ExecuteOperationMetadata.
pub fn stage_of(operation: &Operation) -> i32 {
    let metadata = operation.metadata.as_ref().expect("metadata");
    ExecuteOperationMetadata::decode(&*metadata.value)
        .expect("metadata")
        .stage
}
