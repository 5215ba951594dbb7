//! The REAPI client (`dtlto_reapi::reapi`) against the real `dtlto-reapi serve` process over real
//! gRPC: CAS round trips through batches and ByteStream, the action cache, Execute with its
//! re-attach paths, retries of injected faults, corrupt reads, instance names and unix sockets.

mod support_server;

use std::time::Duration;

use bazel_remote_apis::build::bazel::remote::execution::v2::{
    Action, ActionResult, Command, Digest, OutputFile,
};
use dtlto_reapi::reapi::{
    Blob, CALLS_PER_CONNECTION, CallContext, Client, ConnectionOptions, ReapiError, Stage, digest,
};
use support_server::{Server, tree};
use tonic::Code;

fn ctx() -> CallContext {
    CallContext {
        action_id: "test-action".into(),
        target_id: "test/module.o".into(),
    }
}

fn options(server: &Server) -> ConnectionOptions {
    let mut opts = ConnectionOptions::new(server.address.clone());
    opts.timeout = Duration::from_secs(20);
    opts
}

async fn connect(server: &Server) -> Client {
    Client::connect(&options(server)).await.expect("connect")
}

/// Uploads `blob` and returns its digest.
async fn put(client: &Client, blob: &[u8]) -> Digest {
    client
        .upload(vec![Blob::from_bytes(blob.to_vec())], &ctx())
        .await
        .expect("upload");
    digest::of_bytes(blob)
}

/// Deterministic, incompressible-looking test data.
fn data(len: usize, seed: u8) -> Vec<u8> {
    let mut state = u32::from(seed) | 0x9e37_0000;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state as u8
        })
        .collect()
}

/// Builds an action running `sh -c SCRIPT` over an input root with `inputs`, declaring `outputs`;
/// returns the action digest and every blob it needs.
fn action(script: &str, inputs: &[(&str, &[u8], bool)], outputs: &[&str]) -> (Digest, Vec<Blob>) {
    let (root, tree_blobs) = tree(inputs);
    let command = Command {
        arguments: vec!["/bin/sh".into(), "-c".into(), script.into()],
        output_paths: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let (command_digest, command_bytes) = digest::of_message(&command);
    let action = Action {
        command_digest: Some(command_digest),
        input_root_digest: Some(root),
        ..Default::default()
    };
    let (action_digest, action_bytes) = digest::of_message(&action);
    let mut blobs: Vec<Blob> = tree_blobs.into_iter().map(Blob::from_bytes).collect();
    blobs.push(Blob::from_bytes(command_bytes));
    blobs.push(Blob::from_bytes(action_bytes));
    (action_digest, blobs)
}

fn output<'a>(result: &'a ActionResult, path: &str) -> &'a OutputFile {
    result
        .output_files
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("no output {path}: {result:?}"))
}

#[tokio::test]
async fn cas_round_trip_through_batches_and_bytestream() {
    let server = Server::start(&["--max-batch-bytes", "4096", "--instance-name", "main/x"]).await;
    let mut opts = options(&server);
    opts.instance_name = "main/x".into();
    let client = Client::connect(&opts).await.expect("connect");
    assert_eq!(client.capabilities().max_batch_bytes, 4096);
    assert!(client.capabilities().exec_enabled);

    let dir = tempfile::tempdir().unwrap();
    let small: Vec<Vec<u8>> = (0..40).map(|i| data(100 + i * 37, i as u8)).collect();
    let large = data(3 * 1024 * 1024 + 123, 200);
    let large_path = dir.path().join("large.bin");
    std::fs::write(&large_path, &large).unwrap();
    let large_digest = digest::of_file(&large_path).unwrap();
    let large_in_memory = data(10_000, 201);

    let mut blobs: Vec<Blob> = small.iter().cloned().map(Blob::from_bytes).collect();
    blobs.push(Blob::from_file(large_path.clone(), large_digest.clone()));
    blobs.push(Blob::from_bytes(large_in_memory.clone()));
    blobs.push(Blob::from_bytes(small[0].clone())); // a duplicate
    blobs.push(Blob::from_bytes(Vec::new())); // the empty blob
    let digests: Vec<Digest> = blobs.iter().map(|b| b.digest.clone()).collect();

    let missing = client.find_missing(&digests, &ctx()).await.unwrap();
    assert_eq!(
        missing.len(),
        42,
        "all but the duplicate and the empty blob are missing"
    );
    assert_eq!(
        client.upload_missing(blobs.clone(), &ctx()).await.unwrap(),
        42
    );
    assert!(
        client
            .find_missing(&digests, &ctx())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(client.upload_missing(blobs, &ctx()).await.unwrap(), 0);

    for blob in &small {
        assert_eq!(
            &client
                .download(&digest::of_bytes(blob), &ctx())
                .await
                .unwrap(),
            blob
        );
    }
    assert_eq!(
        client
            .download(&digest::of_bytes(&large_in_memory), &ctx())
            .await
            .unwrap(),
        large_in_memory
    );
    let out = dir.path().join("large.out");
    client
        .download_to_file(&large_digest, &out, &ctx())
        .await
        .unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), large);
    let empty = dir.path().join("empty.out");
    client
        .download_to_file(&digest::of_bytes(b""), &empty, &ctx())
        .await
        .unwrap();
    assert_eq!(std::fs::read(&empty).unwrap(), b"");

    let stats = client.stats();
    assert_eq!(stats.blobs_uploaded, 42);
    let uploaded: u64 =
        small.iter().map(|b| b.len() as u64).sum::<u64>() + large.len() as u64 + 10_000;
    assert_eq!(stats.bytes_uploaded, uploaded);
    assert_eq!(stats.blobs_downloaded, 42);
    assert_eq!(stats.bytes_downloaded, uploaded);

    // A blob the server lacks is NOT_FOUND, on both paths, and leaves no file behind.
    for unknown in [
        digest::of_bytes(b"nowhere"),
        digest::of_bytes(&data(100_000, 9)),
    ] {
        let err = client.download(&unknown, &ctx()).await.unwrap_err();
        assert_eq!(err.code(), Some(Code::NotFound), "{err}");
        let path = dir.path().join("absent");
        assert!(
            client
                .download_to_file(&unknown, &path, &ctx())
                .await
                .is_err()
        );
        assert!(!path.exists());
    }
}

#[tokio::test]
async fn a_file_that_changed_after_hashing_is_refused() {
    let server = Server::start(&["--max-batch-bytes", "1024"]).await;
    let client = connect(&server).await;
    let dir = tempfile::tempdir().unwrap();
    for len in [100, 10_000] {
        let path = dir.path().join(format!("f{len}"));
        std::fs::write(&path, data(len, 1)).unwrap();
        let d = digest::of_file(&path).unwrap();
        std::fs::write(&path, data(len / 2, 1)).unwrap();
        let err = client
            .upload(vec![Blob::from_file(path, d)], &ctx())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("did the file change"), "{err}");
    }
}

#[tokio::test]
async fn action_cache_get_and_update() {
    let server = Server::start(&[]).await;
    let client = connect(&server).await;
    assert!(client.capabilities().ac_update_enabled);
    let action = digest::of_bytes(b"some action");
    assert_eq!(
        client
            .get_action_result(&action, &[], &ctx())
            .await
            .unwrap(),
        None
    );

    let stdout = b"hello\n".to_vec();
    put(&client, &stdout).await;
    let result = ActionResult {
        exit_code: 0,
        stdout_digest: Some(digest::of_bytes(&stdout)),
        ..Default::default()
    };
    client
        .update_action_result(&action, result, &ctx())
        .await
        .unwrap();
    let got = client
        .get_action_result(&action, &[], &ctx())
        .await
        .unwrap()
        .expect("a cached result");
    assert_eq!(got.stdout_digest, Some(digest::of_bytes(&stdout)));
    assert_eq!(
        client
            .download(got.stdout_digest.as_ref().unwrap(), &ctx())
            .await
            .unwrap(),
        stdout
    );
}

#[tokio::test]
async fn cache_hits_inline_the_outputs_asked_for() {
    let server = Server::start(&[]).await;
    let client = connect(&server).await;
    let action = digest::of_bytes(b"an action with outputs");
    let (object, other) = (b"native object".to_vec(), b"proc stats".to_vec());
    client
        .upload(
            vec![
                Blob::from_bytes(object.clone()),
                Blob::from_bytes(other.clone()),
            ],
            &ctx(),
        )
        .await
        .unwrap();
    let file = |path: &str, data: &[u8]| OutputFile {
        path: path.to_owned(),
        digest: Some(digest::of_bytes(data)),
        ..Default::default()
    };
    let result = ActionResult {
        output_files: vec![file("out-0", &object), file("out-1", &other)],
        ..Default::default()
    };
    client
        .update_action_result(&action, result, &ctx())
        .await
        .unwrap();
    let got = client
        .get_action_result(&action, &["out-0".to_owned()], &ctx())
        .await
        .unwrap()
        .expect("a cached result");
    assert_eq!(output(&got, "out-0").contents, object);
    assert!(output(&got, "out-1").contents.is_empty());
}

#[tokio::test]
async fn execute_runs_an_action_and_reports_stages() {
    let server = Server::start(&[]).await;
    let client = connect(&server).await;
    let (action_digest, blobs) = action(
        "cat in.txt > out && echo done",
        &[("in.txt", b"input contents\n", false)],
        &["out"],
    );
    client.upload_missing(blobs, &ctx()).await.unwrap();

    let mut stages = Vec::new();
    let inline = ["out".to_owned()];
    let response = client
        .execute_with_progress(&action_digest, false, &inline, &ctx(), |s| stages.push(s))
        .await
        .expect("execute");
    assert!(!response.cached_result);
    let result = response.result.expect("result");
    assert_eq!(result.exit_code, 0);
    // The output asked for comes inlined; it is in the CAS all the same.
    assert_eq!(output(&result, "out").contents, b"input contents\n");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    client
        .download_to_file(
            output(&result, "out").digest.as_ref().unwrap(),
            &out,
            &ctx(),
        )
        .await
        .unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), b"input contents\n");
    let stdout = match result.stdout_digest {
        Some(d) if result.stdout_raw.is_empty() => client.download(&d, &ctx()).await.unwrap(),
        _ => result.stdout_raw,
    };
    assert_eq!(stdout, b"done\n");
    assert_eq!(stages.last(), Some(&Stage::Completed), "{stages:?}");
    assert!(stages.contains(&Stage::Executing), "{stages:?}");
    assert!(
        stages.windows(2).all(|w| w[0] != w[1]),
        "only changes are reported: {stages:?}"
    );

    // The second run comes from the cache, unless the lookup is skipped.
    let again = client.execute(&action_digest, false, &ctx()).await.unwrap();
    assert!(again.cached_result);
    assert!(
        output(again.result.as_ref().unwrap(), "out")
            .contents
            .is_empty()
    );
    let inlined = client
        .execute_with_progress(&action_digest, false, &inline, &ctx(), |_| {})
        .await
        .unwrap();
    assert!(inlined.cached_result);
    let inlined = inlined.result.unwrap();
    assert_eq!(output(&inlined, "out").contents, b"input contents\n");
    let skipped = client.execute(&action_digest, true, &ctx()).await.unwrap();
    assert!(!skipped.cached_result);

    // A failing command is a result, not an error.
    let (failing, blobs) = action("echo oops >&2; exit 3", &[], &[]);
    client.upload_missing(blobs, &ctx()).await.unwrap();
    let response = client.execute(&failing, false, &ctx()).await.unwrap();
    assert_eq!(response.result.unwrap().exit_code, 3);
}

#[tokio::test]
async fn execute_with_missing_inputs_names_them() {
    let server = Server::start(&[]).await;
    let client = connect(&server).await;
    let (action_digest, blobs) = action(
        "cat in.txt > out",
        &[("in.txt", b"needed", false)],
        &["out"],
    );
    let input = digest::of_bytes(b"needed");
    // Upload all but the input file.
    let without_input: Vec<Blob> = blobs
        .iter()
        .filter(|b| b.digest != input)
        .cloned()
        .collect();
    client.upload(without_input, &ctx()).await.unwrap();
    let err = client
        .execute(&action_digest, false, &ctx())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");
    assert_eq!(err.missing_blobs(), Some(&[input][..]), "{err}");
    assert!(!err.is_infrastructure());
    // Uploading what was missing and trying once more succeeds.
    client.upload_missing(blobs, &ctx()).await.unwrap();
    let response = client.execute(&action_digest, false, &ctx()).await.unwrap();
    assert_eq!(response.result.unwrap().exit_code, 0);
}

#[tokio::test]
async fn transient_failures_are_retried_and_permanent_ones_are_not() {
    let server = Server::start(&[
        "--max-batch-bytes",
        "2048",
        "--fault-fail",
        "GetCapabilities=UNAVAILABLE:1",
        "--fault-fail",
        "FindMissingBlobs=UNAVAILABLE:2",
        "--fault-fail",
        "BatchUpdateBlobs=RESOURCE_EXHAUSTED:1",
        "--fault-fail",
        "ByteStream.Write=UNAVAILABLE:1",
        "--fault-fail",
        "ByteStream.Read=UNAVAILABLE:1",
        "--fault-fail",
        "Execute=UNAVAILABLE:1",
        "--fault-fail",
        "GetActionResult=PERMISSION_DENIED:1",
    ])
    .await;
    let client = connect(&server).await;
    assert_eq!(client.stats().rpc_retries, 1, "GetCapabilities was retried");

    let small = data(500, 1);
    let large = data(300_000, 2);
    let blobs = vec![
        Blob::from_bytes(small.clone()),
        Blob::from_bytes(large.clone()),
    ];
    assert_eq!(client.upload_missing(blobs, &ctx()).await.unwrap(), 2);
    assert_eq!(
        client
            .download(&digest::of_bytes(&large), &ctx())
            .await
            .unwrap(),
        large
    );
    assert_eq!(client.stats().rpc_retries, 1 + 2 + 1 + 1 + 1);

    let (action_digest, blobs) = action("true", &[], &[]);
    client.upload_missing(blobs, &ctx()).await.unwrap();
    client.execute(&action_digest, false, &ctx()).await.unwrap();
    assert_eq!(client.stats().rpc_retries, 7);

    let err = client
        .get_action_result(&action_digest, &[], &ctx())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::PermissionDenied), "{err}");
    assert!(!err.is_infrastructure());
    assert_eq!(
        client.stats().rpc_retries,
        7,
        "a permanent failure is not retried"
    );
    assert!(
        client
            .get_action_result(&action_digest, &[], &ctx())
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn retries_are_bounded() {
    let server = Server::start(&["--fault-fail", "FindMissingBlobs=UNAVAILABLE:100"]).await;
    let mut opts = options(&server);
    opts.max_retries = 2;
    let client = Client::connect(&opts).await.unwrap();
    let err = client
        .find_missing(&[digest::of_bytes(b"x")], &ctx())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::Unavailable));
    assert!(err.is_infrastructure());
    assert!(err.to_string().contains("(after 2 retries)"), "{err}");
    assert!(err.to_string().contains(&opts.endpoint), "{err}");
}

#[tokio::test]
async fn execute_reattaches_after_a_dropped_stream() {
    let server = Server::start(&["--fault-drop-execute-stream", "1"]).await;
    let client = connect(&server).await;
    let (action_digest, blobs) = action("sleep 0.5; echo late > out", &[], &["out"]);
    client.upload_missing(blobs, &ctx()).await.unwrap();
    let response = client.execute(&action_digest, false, &ctx()).await.unwrap();
    let result = response.result.unwrap();
    assert_eq!(
        client
            .download(output(&result, "out").digest.as_ref().unwrap(), &ctx())
            .await
            .unwrap(),
        b"late\n"
    );
    assert_eq!(client.stats().rpc_retries, 1);
}

#[tokio::test]
async fn execute_runs_again_when_the_operation_is_forgotten() {
    let server = Server::start(&[
        "--fault-drop-execute-stream",
        "1",
        "--fault-fail",
        "WaitExecution=NOT_FOUND:1",
    ])
    .await;
    let client = connect(&server).await;
    let (action_digest, blobs) = action("echo again > out", &[], &["out"]);
    client.upload_missing(blobs, &ctx()).await.unwrap();
    let response = client.execute(&action_digest, false, &ctx()).await.unwrap();
    assert_eq!(response.result.unwrap().exit_code, 0);
    assert_eq!(
        client.stats().rpc_retries,
        2,
        "one re-attach, one new Execute"
    );
}

#[tokio::test]
async fn corrupt_reads_are_read_again_once() {
    for (reads, batch) in [(1, true), (2, true), (1, false), (2, false)] {
        let reads = reads.to_string();
        let server =
            Server::start(&["--max-batch-bytes", "1024", "--fault-corrupt-reads", &reads]).await;
        let client = connect(&server).await;
        let blob = data(if batch { 100 } else { 50_000 }, 3);
        let d = put(&client, &blob).await;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        let result = client.download_to_file(&d, &path, &ctx()).await;
        if reads == "1" {
            result.unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), blob);
        } else {
            let err = result.unwrap_err();
            assert!(matches!(err, ReapiError::Integrity { .. }), "{err}");
            assert!(err.is_infrastructure());
            assert!(!path.exists(), "a corrupt download leaves no file");
        }
    }
}

#[tokio::test]
async fn unix_socket_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("re.sock");
    let listen = format!("unix://{}", socket.display());
    let server = Server::start(&["--listen", &listen]).await;
    assert_eq!(server.address, listen);

    let client = Client::connect(&ConnectionOptions::new(listen))
        .await
        .expect("connect over unix socket");
    let blob = data(1000, 4);
    put(&client, &blob).await;
    assert_eq!(
        client
            .download(&digest::of_bytes(&blob), &ctx())
            .await
            .unwrap(),
        blob
    );
}

#[tokio::test]
async fn configuration_errors_are_clear() {
    let server = Server::start(&[]).await;
    let mut opts = options(&server);
    opts.headers = vec![(
        "x-api-key".into(),
        "env:DTLTO_REAPI_TEST_SURELY_UNSET".into(),
    )];
    let err = Client::connect(&opts).await.unwrap_err().to_string();
    assert!(
        err.contains("DTLTO_REAPI_TEST_SURELY_UNSET") && err.contains("x-api-key"),
        "{err}"
    );

    // Extra headers reach the server without upsetting it.
    opts.headers = vec![("x-api-key".into(), "plain-value".into())];
    Client::connect(&opts).await.expect("connect with a header");

    // A server that is not there: UNAVAILABLE after the retries, naming the endpoint.
    let mut opts = ConnectionOptions::new("grpc://127.0.0.1:9");
    opts.max_retries = 1;
    let err = Client::connect(&opts).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::Unavailable), "{err}");
    assert!(
        err.is_infrastructure() && err.to_string().contains("127.0.0.1:9"),
        "{err}"
    );
}

#[tokio::test]
async fn a_stalled_read_is_abandoned_at_the_call_timeout_and_read_again() {
    // The first read stalls after its first chunk; the next one behaves.
    let server = Server::start(&["--max-batch-bytes", "1024", "--fault-reads", "stall:1"]).await;
    let mut opts = options(&server);
    opts.timeout = Duration::from_secs(1);
    let client = Client::connect(&opts).await.expect("connect");
    // 16 MiB: the whole transfer may take 1 s + 16 s, but a stream silent for 1 s is given up.
    let blob = data(16 << 20, 5);
    let d = put(&client, &blob).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    let started = std::time::Instant::now();
    client.download_to_file(&d, &path, &ctx()).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(std::fs::read(&path).unwrap(), blob);
    assert!(client.stats().rpc_retries >= 1);
}

#[tokio::test]
async fn impossible_digests_from_the_server_are_server_errors() {
    let server = Server::start(&[]).await;
    let client = connect(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    // A digest claiming a terabyte, or a malformed one: nothing is read.
    for claim in [
        Digest {
            hash: "ab".repeat(32),
            size_bytes: 1 << 40,
        },
        Digest {
            hash: "not hex".into(),
            size_bytes: 1,
        },
    ] {
        let err = client
            .download_to_file(&claim, &path, &ctx())
            .await
            .unwrap_err();
        assert!(matches!(err, ReapiError::Protocol { .. }), "{err}");
        assert!(err.is_infrastructure(), "{err}");
        assert!(!path.exists());
    }
}

/// Text-like data that zstd shrinks to about half.
fn compressible(len: usize, seed: u8) -> Vec<u8> {
    data(len, seed).into_iter().map(|b| b'a' + b % 16).collect()
}

/// A server started with `args`, `--no-compression` unless `compresses`, and `--stats-json` into
/// the returned directory (read with [`server_stats`]).
async fn counting_server(args: &[&str], compresses: bool) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let stats_path = dir.path().join("serve-stats.json");
    let mut args = args.to_vec();
    args.extend(["--stats-json", stats_path.to_str().unwrap()]);
    if !compresses {
        args.push("--no-compression");
    }
    (Server::start(&args).await, dir)
}

/// What the [`counting_server`] wrote to `dir` when it exited.
async fn server_stats(server: Server, dir: &tempfile::TempDir) -> serde_json::Value {
    assert!(server.terminate().await.success());
    let path = dir.path().join("serve-stats.json");
    serde_json::from_slice(&std::fs::read(path).expect("serve --stats-json")).expect("JSON")
}

/// Compressed and identity paths both round-trip small and large blobs (batches and ByteStream,
/// from memory and from files); a server without zstd is never sent compressed data (it refuses
/// it), and neither is any server when the client turns compression off.
#[tokio::test]
async fn compressed_and_identity_transfers_round_trip() {
    for (server_compresses, client_compresses) in [(true, true), (false, true), (true, false)] {
        let (server, dir) =
            counting_server(&["--max-batch-bytes", "65536"], server_compresses).await;
        let mut opts = options(&server);
        opts.compression = client_compresses;
        let client = Client::connect(&opts).await.expect("connect");
        let zstd = server_compresses && client_compresses;

        let blobs_data: Vec<Vec<u8>> = vec![
            compressible(100, 1),     // below the threshold
            compressible(5000, 2),    // batch, compressed
            data(5000, 3),            // batch, incompressible: sent as it is
            compressible(3 << 20, 4), // ByteStream
            data(200_000, 5),         // ByteStream, incompressible
        ];
        let large_path = dir.path().join("large");
        std::fs::write(&large_path, &blobs_data[3]).unwrap();
        let mut blobs: Vec<Blob> = blobs_data.iter().cloned().map(Blob::from_bytes).collect();
        blobs[3] = Blob::from_file(large_path, digest::of_bytes(&blobs_data[3]));
        client.upload(blobs, &ctx()).await.expect("upload");
        for blob in &blobs_data {
            let d = digest::of_bytes(blob);
            assert_eq!(&client.download(&d, &ctx()).await.unwrap(), blob);
            let path = dir.path().join("out");
            client.download_to_file(&d, &path, &ctx()).await.unwrap();
            assert_eq!(&std::fs::read(&path).unwrap(), blob);
        }
        let stats = client.stats();
        let logical: u64 = blobs_data.iter().map(|b| b.len() as u64).sum();
        assert_eq!(stats.bytes_uploaded, logical);
        assert_eq!(stats.bytes_downloaded, 2 * logical);
        if zstd {
            assert!(
                stats.wire_bytes_uploaded < logical * 3 / 4,
                "{stats:?} of {logical}"
            );
            assert!(
                stats.wire_bytes_downloaded < 2 * logical * 3 / 4,
                "{stats:?}"
            );
        } else {
            assert_eq!(stats.wire_bytes_uploaded, logical, "{stats:?}");
            assert_eq!(stats.wire_bytes_downloaded, 2 * logical, "{stats:?}");
        }
        // The server's own count of what arrived agrees.
        let served = server_stats(server, &dir).await;
        assert_eq!(served["blob_bytes_received"], stats.wire_bytes_uploaded);
        assert_eq!(served["blob_bytes_sent"], stats.wire_bytes_downloaded);
        assert_eq!(served["blob_uploads"], 5);
    }
}

/// An interrupted upload resumes from what the server committed — for a compressed upload an
/// offset in compressed bytes — instead of starting over.
#[tokio::test]
async fn interrupted_uploads_resume_compressed_or_not() {
    for server_compresses in [true, false] {
        let (server, dir) =
            counting_server(&["--fault-break-writes", "1"], server_compresses).await;
        let client = connect(&server).await;
        let blob = compressible(5 << 20, 9);
        let d = put(&client, &blob).await;
        assert_eq!(client.download(&d, &ctx()).await.unwrap(), blob);
        assert!(client.stats().rpc_retries >= 1);
        let served = server_stats(server, &dir).await;
        let received = served["blob_bytes_received"].as_u64().unwrap();
        // Resumed: every byte arrived once (starting over would resend the first 1 MiB).
        let expected = if server_compresses {
            dtlto_reapi::reapi::compression::compress(&blob)
                .unwrap()
                .len() as u64
        } else {
            blob.len() as u64
        };
        assert!(
            received.abs_diff(expected) < 256 << 10,
            "received {received}, expected about {expected}"
        );
        assert_eq!(served["blob_uploads"], 1);
    }
}

/// Corrupt compressed data (zstd that does not decode) is read once more, like a digest mismatch,
/// then reported as corruption, in batches and ByteStream alike.
#[tokio::test]
async fn corrupt_compressed_reads_are_detected() {
    for (reads, size) in [(1, 5000), (2, 5000), (1, 200_000), (2, 200_000)] {
        let reads = reads.to_string();
        let server = Server::start(&[
            "--max-batch-bytes",
            "65536",
            "--fault-corrupt-reads",
            &reads,
        ])
        .await;
        let client = connect(&server).await;
        let blob = compressible(size, 7);
        put(&client, &blob).await;
        let result = client.download(&digest::of_bytes(&blob), &ctx()).await;
        if reads == "1" {
            assert_eq!(result.unwrap(), blob);
        } else {
            let err = result.unwrap_err();
            assert!(matches!(err, ReapiError::Integrity { .. }), "{err}");
            assert!(err.to_string().contains("decompress"), "{err}");
        }
    }
}

/// Connections are opened on demand: calls one after another share one connection; more calls at
/// once than one connection carries open a second, and the server counts the same.
#[tokio::test]
async fn connections_are_opened_only_when_the_earlier_ones_are_full() {
    let (server, dir) = counting_server(&["--fault-slow", "GetActionResult=1500"], true).await;
    let mut opts = options(&server);
    opts.concurrent_calls = 4 * CALLS_PER_CONNECTION;
    let client = Client::connect(&opts).await.expect("connect");
    for seed in 0..5 {
        put(&client, &data(100, seed)).await;
    }
    assert_eq!(client.stats().connections, 1);

    let action = digest::of_bytes(b"no such action");
    let ctx = ctx();
    let lookups =
        (0..CALLS_PER_CONNECTION + 10).map(|_| client.get_action_result(&action, &[], &ctx));
    for found in futures::future::join_all(lookups).await {
        assert!(found.expect("lookup").is_none());
    }
    assert_eq!(client.stats().connections, 2);
    drop(client);
    // And the test harness's own connection to the server.
    assert_eq!(server_stats(server, &dir).await["connections"], 2 + 1);
}

/// Jobs' uploads are coalesced: what jobs stage goes in the upload of the first job that needs
/// it, one BatchUpdateBlobs for all. A blob that cannot be sent (a file that changed after it was
/// hashed) fails the job it belongs to, not the others that shared its upload.
#[tokio::test]
async fn staged_uploads_go_together_and_a_bad_blob_fails_only_its_own_job() {
    use dtlto_reapi::executor::uploads::Uploads;
    let (server, dir) = counting_server(&[], false).await;
    let client = connect(&server).await;
    let uploads = Uploads::default();
    let made: Vec<Blob> = (0..5).map(|i| Blob::from_bytes(data(500, i))).collect();
    let none: &[Blob] = &[];
    for blob in &made[..4] {
        uploads
            .stage(&client, none, std::slice::from_ref(blob), &ctx())
            .unwrap();
    }
    uploads
        .ensure(&client, none, &made[4..], &ctx())
        .await
        .expect("upload");
    // The staged blobs went with it: these find them sent and send nothing.
    for blob in &made[..4] {
        let one = std::slice::from_ref(blob);
        uploads
            .ensure(&client, none, one, &ctx())
            .await
            .expect("present");
    }

    // A file that shrank after it was hashed, staged by one job; another job's upload carries it.
    let path = dir.path().join("changed.o");
    std::fs::write(&path, data(2000, 9)).unwrap();
    let changed = Blob::from_file(path.clone(), digest::of_file(&path).unwrap());
    std::fs::write(&path, data(1000, 9)).unwrap();
    let good = Blob::from_bytes(data(700, 10));
    let bad_job = [changed];
    uploads.stage(&client, &bad_job, &[], &ctx()).unwrap();
    let good_job = std::slice::from_ref(&good);
    uploads
        .ensure(&client, none, good_job, &ctx())
        .await
        .expect("the good job's upload, sent again alone");
    let failed = uploads.ensure(&client, &bad_job, &[], &ctx()).await;
    let error = failed
        .expect_err("the changed file cannot be sent")
        .to_string();
    assert!(error.contains("did the file change"), "{error}");

    let all: Vec<Digest> = made
        .iter()
        .chain([&good])
        .map(|b| b.digest.clone())
        .collect();
    assert!(client.find_missing(&all, &ctx()).await.unwrap().is_empty());
    let calls = &server_stats(server, &dir).await["calls"];
    // One batch for the five staged blobs, one for the good job's blob alone: the upload it
    // shared with the changed file failed before it was sent.
    assert_eq!(calls["BatchUpdateBlobs"], 2, "{calls}");
}
