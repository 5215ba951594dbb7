//! Shared helpers for the `server_*` and `reapi_client` tests: start the real `dtlto-reapi serve`
//! binary as its own process, find its address from the first stdout line, talk to it over real
//! gRPC (TCP or a unix socket), and build and
//! upload the trees, Commands and Actions the tests execute.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use bazel_remote_apis::build::bazel::remote::execution::v2::{
    Action, ActionResult, BatchUpdateBlobsRequest, Command, Digest, Directory, DirectoryNode,
    ExecuteRequest, ExecuteResponse, FileNode, action_cache_client::ActionCacheClient,
    batch_update_blobs_request, capabilities_client::CapabilitiesClient, command,
    content_addressable_storage_client::ContentAddressableStorageClient,
    execution_client::ExecutionClient,
};
use bazel_remote_apis::google::bytestream::byte_stream_client::ByteStreamClient;
use bazel_remote_apis::google::longrunning::{
    Operation, operation, operations_client::OperationsClient,
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
        let command = Command {
            arguments: spec.args.iter().map(|s| s.to_string()).collect(),
            environment_variables: spec
                .env
                .iter()
                .map(|(name, value)| command::EnvironmentVariable {
                    name: name.to_string(),
                    value: value.to_string(),
                })
                .collect(),
            output_paths: spec.outputs.iter().map(|s| s.to_string()).collect(),
            working_directory: spec.working_directory.to_owned(),
            ..Default::default()
        }
        .encode_to_vec();
        let action = Action {
            command_digest: Some(digest(&command)),
            input_root_digest: Some(root),
            timeout: spec
                .timeout_secs
                .map(|seconds| Duration { seconds, nanos: 0 }),
            do_not_cache: spec.do_not_cache,
            ..Default::default()
        }
        .encode_to_vec();
        let action_digest = digest(&action);
        blobs.push(command);
        blobs.push(action);
        self.upload(&blobs).await;
        action_digest
    }

    /// Runs Execute to the end; returns every Operation seen and the final ExecuteResponse.
    pub async fn execute(
        &self,
        action: &Digest,
        skip_cache_lookup: bool,
    ) -> (Vec<Operation>, ExecuteResponse) {
        let stream = self
            .execution()
            .execute(ExecuteRequest {
                action_digest: Some(action.clone()),
                skip_cache_lookup,
                ..Default::default()
            })
            .await
            .expect("Execute")
            .into_inner();
        let operations: Vec<Operation> = stream.map(|op| op.expect("operation")).collect().await;
        let response = response_of(operations.last().expect("at least one operation"));
        (operations, response)
    }

    /// Reads a blob with BatchReadBlobs.
    pub async fn read(&self, digest: &Digest) -> Vec<u8> {
        let response = self
            .cas()
            .batch_read_blobs(
                bazel_remote_apis::build::bazel::remote::execution::v2::BatchReadBlobsRequest {
                    digests: vec![digest.clone()],
                    ..Default::default()
                },
            )
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
    bazel_remote_apis::build::bazel::remote::execution::v2::ExecuteOperationMetadata::decode(
        &*metadata.value,
    )
    .expect("metadata")
    .stage
}
