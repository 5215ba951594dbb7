//! Tests of `dtlto-reapi serve`'s fault-injection knobs, each against the real binary over gRPC:
//! failing RPCs (with RetryInfo), dropped Execute streams, delays, corrupted reads.

mod support_server;

use bazel_remote_apis::build::bazel::remote::execution::v2::{
    BatchReadBlobsRequest, FindMissingBlobsRequest, GetCapabilitiesRequest,
};
use futures::StreamExt;
use std::time::{Duration, Instant};
use support_server::{ActionSpec, Server, digest, refused_start, write_request};
use tonic::Code;
use tonic_types::StatusExt;

#[tokio::test]
async fn fault_fail_fails_the_first_calls_of_the_named_rpc() {
    let server = Server::start(&[
        "--fault-fail",
        "FindMissingBlobs=UNAVAILABLE:2",
        "--fault-fail",
        "ByteStream.Write=permission_denied:1",
    ])
    .await;
    let find = || {
        let mut cas = server.cas();
        async move {
            cas.find_missing_blobs(FindMissingBlobsRequest::default())
                .await
        }
    };
    for _ in 0..2 {
        let status = find().await.expect_err("injected failure");
        assert_eq!(status.code(), Code::Unavailable);
        let retry = status
            .get_details_retry_info()
            .expect("RetryInfo on UNAVAILABLE");
        assert!(retry.retry_delay.is_some_and(|d| d > Duration::ZERO));
    }
    find().await.expect("the third call succeeds");

    let data = b"written".to_vec();
    let d = digest(&data);
    let name = format!("uploads/u/blobs/{}/{}", d.hash, d.size_bytes);
    let write = || server.bytestream_write(vec![write_request(&name, 0, &data, true)]);
    let status = write().await.expect_err("injected failure");
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(status.get_details_retry_info().is_none());
    write().await.expect("the second write succeeds");
    // Other RPCs are untouched.
    server
        .capabilities()
        .get_capabilities(GetCapabilitiesRequest::default())
        .await
        .expect("GetCapabilities");
}

#[tokio::test]
async fn fault_fail_rejects_unknown_rpc_names_at_start_up() {
    let (status, stderr) = refused_start(&["--fault-fail", "Exec=UNAVAILABLE:1"]).await;
    assert!(!status.success());
    assert!(stderr.contains("unknown RPC"), "stderr: {stderr}");
}

#[tokio::test]
async fn fault_drop_execute_stream_forces_wait_execution() {
    let server = Server::start(&["--fault-drop-execute-stream", "1"]).await;
    let action = server
        .upload_action(&ActionSpec {
            args: &["/bin/sh", "-c", "sleep 0.5; echo done"],
            ..Default::default()
        })
        .await;
    let mut stream = server.execute_stream(&action, false).await;
    let accepted = stream
        .next()
        .await
        .expect("the accepted operation")
        .expect("ok");
    assert!(!accepted.done);
    let broken = stream
        .next()
        .await
        .expect("an error")
        .expect_err("the stream breaks");
    assert_eq!(broken.code(), Code::Unavailable);

    let (_, response) = server.wait_execution(&accepted.name).await;
    assert_eq!(
        server.stdout_of(&response.result.expect("result")).await,
        "done\n"
    );

    // Only the first Execute stream is dropped.
    let (_, again) = server.execute(&action, true).await;
    assert_eq!(again.result.expect("result").exit_code, 0);
}

#[tokio::test]
async fn fault_delay_ms_delays_every_response() {
    let server = Server::start(&["--fault-delay-ms", "400"]).await;
    let started = Instant::now();
    server
        .capabilities()
        .get_capabilities(GetCapabilitiesRequest::default())
        .await
        .expect("GetCapabilities");
    server
        .cas()
        .find_missing_blobs(FindMissingBlobsRequest::default())
        .await
        .expect("FindMissingBlobs");
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn fault_corrupt_reads_corrupts_the_first_reads() {
    let server = Server::start(&["--fault-corrupt-reads", "2"]).await;
    let blob = b"precious bytes".to_vec();
    let d = digest(&blob);
    server.upload(std::slice::from_ref(&blob)).await;
    let batch = || {
        let mut cas = server.cas();
        let d = d.clone();
        async move {
            cas.batch_read_blobs(BatchReadBlobsRequest {
                digests: vec![d],
                ..Default::default()
            })
            .await
            .expect("BatchReadBlobs")
            .into_inner()
            .responses
            .remove(0)
            .data
        }
    };
    let stream = || async {
        server
            .bytestream_read(format!("blobs/{}/{}", d.hash, d.size_bytes), 0, 0)
            .await
            .expect("Read")
    };
    let first = batch().await;
    assert_eq!(first.len(), blob.len());
    assert_ne!(first, blob, "first read corrupted");
    assert_ne!(stream().await, blob, "second read (ByteStream) corrupted");
    assert_eq!(batch().await, blob, "third read intact");
    assert_eq!(stream().await, blob, "fourth read intact");
}
