//! gRPC tests of `dtlto-reapi serve`'s storage side: Capabilities, ContentAddressableStorage,
//! ByteStream and ActionCache, instance names, `--cas-dir` persistence and unix sockets, each
//! against the real binary in its own process.

mod support_server;

use bazel_remote_apis::build::bazel::remote::execution::v2::{
    ActionResult, BatchReadBlobsRequest, BatchUpdateBlobsRequest, CacheCapabilities, Digest,
    Directory, DirectoryNode, ExecuteRequest, FindMissingBlobsRequest, GetActionResultRequest,
    GetCapabilitiesRequest, GetTreeRequest, OutputFile, batch_update_blobs_request,
    content_addressable_storage_client::ContentAddressableStorageClient,
};
use bazel_remote_apis::google::bytestream::ReadRequest;
use futures::StreamExt;
use prost::Message;
use support_server::{Server, digest, write_request};
use tonic::Code;

#[tokio::test]
async fn capabilities_advertise_what_is_implemented() {
    let server = Server::start(&["--max-batch-bytes", "1000"]).await;
    let caps = server
        .capabilities()
        .get_capabilities(GetCapabilitiesRequest::default())
        .await
        .expect("GetCapabilities")
        .into_inner();
    let cache = caps.cache_capabilities.expect("cache capabilities");
    assert_eq!(cache.digest_functions, vec![1]); // SHA256
    assert_eq!(cache.max_batch_total_size_bytes, 1000);
    assert!(
        cache
            .action_cache_update_capabilities
            .expect("ac")
            .update_enabled
    );
    let exec = caps.execution_capabilities.expect("execution capabilities");
    assert!(exec.exec_enabled);
    assert_eq!(exec.digest_function, 1);
    let (low, high) = (
        caps.low_api_version.expect("low"),
        caps.high_api_version.expect("high"),
    );
    assert_eq!((low.major, low.minor, high.major, high.minor), (2, 0, 2, 3));
}

#[tokio::test]
async fn batch_update_verifies_digests_and_batch_read_returns_blobs() {
    let server = Server::start(&[]).await;
    let good = b"good blob".to_vec();
    let liar = digest(b"what the digest claims");
    let response = server
        .cas()
        .batch_update_blobs(BatchUpdateBlobsRequest {
            requests: vec![
                batch_update_blobs_request::Request {
                    digest: Some(digest(&good)),
                    data: good.clone(),
                    ..Default::default()
                },
                batch_update_blobs_request::Request {
                    digest: Some(liar.clone()),
                    data: b"something else".to_vec(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        })
        .await
        .expect("BatchUpdateBlobs")
        .into_inner();
    let codes: Vec<i32> = response
        .responses
        .iter()
        .map(|r| r.status.as_ref().map_or(-1, |s| s.code))
        .collect();
    assert_eq!(codes, vec![Code::Ok as i32, Code::InvalidArgument as i32]);

    let missing = server
        .find_missing(vec![digest(&good), liar.clone(), digest(b"")])
        .await;
    assert_eq!(
        missing,
        vec![liar.clone()],
        "the mismatched blob must not be stored; the empty blob always exists"
    );

    let read = server
        .cas()
        .batch_read_blobs(BatchReadBlobsRequest {
            digests: vec![digest(&good), liar],
            ..Default::default()
        })
        .await
        .expect("BatchReadBlobs")
        .into_inner();
    assert_eq!(read.responses[0].data, good);
    assert_eq!(
        read.responses[1].status.as_ref().map(|s| s.code),
        Some(Code::NotFound as i32)
    );
}

#[tokio::test]
async fn malformed_digests_and_oversized_batches_are_refused() {
    let server = Server::start(&["--max-batch-bytes", "100"]).await;
    let bad = Digest {
        hash: "not-a-hash".into(),
        size_bytes: 3,
    };
    let status = server
        .cas()
        .find_missing_blobs(FindMissingBlobsRequest {
            blob_digests: vec![bad],
            ..Default::default()
        })
        .await
        .expect_err("malformed digest");
    assert_eq!(status.code(), Code::InvalidArgument);

    let big = vec![7u8; 101];
    let status = server
        .cas()
        .batch_update_blobs(BatchUpdateBlobsRequest {
            requests: vec![batch_update_blobs_request::Request {
                digest: Some(digest(&big)),
                data: big.clone(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect_err("over the batch limit");
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = server
        .cas()
        .batch_read_blobs(BatchReadBlobsRequest {
            digests: vec![digest(&big)],
            ..Default::default()
        })
        .await
        .expect_err("over the batch limit");
    assert_eq!(status.code(), Code::InvalidArgument);

    // The server still answers after refusing.
    server.upload(&[b"small".to_vec()]).await;
}

#[tokio::test]
async fn get_tree_walks_the_tree_in_pages() {
    let server = Server::start(&[]).await;
    let leaf = Directory::default().encode_to_vec();
    let middle = Directory {
        directories: vec![DirectoryNode {
            name: "leaf".into(),
            digest: Some(digest(&leaf)),
        }],
        ..Default::default()
    }
    .encode_to_vec();
    let root = Directory {
        directories: vec![
            DirectoryNode {
                name: "a".into(),
                digest: Some(digest(&middle)),
            },
            DirectoryNode {
                name: "b".into(),
                digest: Some(digest(&leaf)),
            },
        ],
        ..Default::default()
    }
    .encode_to_vec();
    server.upload(&[leaf, middle, root.clone()]).await;

    let pages = |page_size: i32, page_token: String| {
        let mut cas: ContentAddressableStorageClient<_> = server.cas();
        let root = digest(&root);
        async move {
            let stream = cas
                .get_tree(GetTreeRequest {
                    root_digest: Some(root),
                    page_size,
                    page_token,
                    ..Default::default()
                })
                .await
                .expect("GetTree")
                .into_inner();
            stream
                .map(|page| page.expect("page"))
                .collect::<Vec<_>>()
                .await
        }
    };
    let all = pages(0, String::new()).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].directories.len(), 3, "root, middle and leaf (once)");
    let paged = pages(1, String::new()).await;
    assert_eq!(paged.len(), 3);
    assert_eq!(paged[0].next_page_token, "1");
    assert!(paged[2].next_page_token.is_empty());
    let resumed = pages(2, paged[0].next_page_token.clone()).await;
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0].directories, all[0].directories[1..].to_vec());

    let status = server
        .cas()
        .get_tree(GetTreeRequest {
            root_digest: Some(digest(b"no such dir")),
            ..Default::default()
        })
        .await
        .expect_err("missing root");
    assert_eq!(status.code(), Code::NotFound);
}

#[tokio::test]
async fn bytestream_writes_in_chunks_resumes_and_reads_ranges() {
    let server = Server::start(&[]).await;
    let blob: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let d = digest(&blob);
    let name = format!(
        "uploads/4f0e3c1a-0000-4000-8000-000000000001/blobs/{}/{}",
        d.hash, d.size_bytes
    );

    // The first attempt stops after 100 000 bytes without finishing.
    let half = vec![
        write_request(&name, 0, &blob[..60_000], false),
        write_request("", 60_000, &blob[60_000..100_000], false),
    ];
    let status = server
        .bytestream_write(half)
        .await
        .expect_err("unfinished write");
    assert_eq!(status.code(), Code::InvalidArgument);
    let query = server.query_write_status(&name).await;
    assert_eq!((query.committed_size, query.complete), (100_000, false));

    // Resuming at the committed size completes the upload.
    let rest = vec![write_request(&name, 100_000, &blob[100_000..], true)];
    let committed = server.bytestream_write(rest).await.expect("resumed write");
    assert_eq!(committed, blob.len() as i64);
    assert!(server.query_write_status(&name).await.complete);

    // A second upload of the same blob completes at once, before all data is sent.
    let again = format!(
        "uploads/4f0e3c1a-0000-4000-8000-000000000002/blobs/{}/{}",
        d.hash, d.size_bytes
    );
    let early = vec![write_request(&again, 0, &blob[..10], false)];
    let committed = server
        .bytestream_write(early)
        .await
        .expect("early completion");
    assert_eq!(committed, blob.len() as i64);

    let read = |offset, limit| {
        server.bytestream_read(format!("blobs/{}/{}", d.hash, d.size_bytes), offset, limit)
    };
    assert_eq!(read(0, 0).await.expect("read all"), blob);
    assert_eq!(read(150_000, 0).await.expect("read tail"), blob[150_000..]);
    assert_eq!(read(1000, 500).await.expect("read range"), blob[1000..1500]);
    assert_eq!(
        read(300_000, 0).await.expect_err("past the end").code(),
        Code::OutOfRange
    );
}

#[tokio::test]
async fn bytestream_refuses_mismatched_and_unknown_blobs() {
    let server = Server::start(&[]).await;
    let claimed = digest(b"claimed contents");
    let name = format!("uploads/u1/blobs/{}/{}", claimed.hash, claimed.size_bytes);
    let lie = vec![write_request(&name, 0, b"CLAIMED CONTENTS", true)];
    assert_eq!(
        server
            .bytestream_write(lie)
            .await
            .expect_err("mismatch")
            .code(),
        Code::InvalidArgument
    );
    let missing = server.find_missing(vec![claimed.clone()]).await;
    assert_eq!(missing, vec![claimed.clone()]);
    let name = format!("blobs/{}/{}", claimed.hash, claimed.size_bytes);
    assert_eq!(
        refused_read(&server, name, "not stored").await,
        Code::NotFound
    );
    let name = "blobs/../../etc/passwd".to_owned();
    assert_eq!(
        refused_read(&server, name, "malformed name").await,
        Code::InvalidArgument
    );
}

/// The code of the status with which the server refuses a ByteStream Read of `resource_name` (for
/// the reason `why`) before sending any data.
async fn refused_read(server: &Server, resource_name: String, why: &str) -> Code {
    server
        .bytestream()
        .read(ReadRequest {
            resource_name,
            ..Default::default()
        })
        .await
        .expect_err(why)
        .code()
}

#[tokio::test]
async fn action_cache_stores_results_and_inlines_on_request() {
    let server = Server::start(&[]).await;
    let (stdout, output) = (b"the stdout".to_vec(), b"the output file".to_vec());
    server.upload(&[stdout.clone(), output.clone()]).await;
    let action = digest(b"an action");
    let result = ActionResult {
        exit_code: 0,
        stdout_digest: Some(digest(&stdout)),
        output_files: vec![
            OutputFile {
                path: "out/a.o".into(),
                digest: Some(digest(&output)),
                ..Default::default()
            },
            OutputFile {
                path: "out/b.o".into(),
                digest: Some(digest(&output)),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let status = server
        .get_action_result(&action)
        .await
        .expect_err("not cached yet");
    assert_eq!(status.code(), Code::NotFound);
    server.update_action_result(&action, &result).await;
    let plain = server
        .get_action_result(&action)
        .await
        .expect("GetActionResult");
    assert_eq!(plain, result);
    let inlined = server
        .action_cache()
        .get_action_result(GetActionResultRequest {
            action_digest: Some(action),
            inline_stdout: true,
            inline_output_files: vec!["out/b.o".into()],
            ..Default::default()
        })
        .await
        .expect("GetActionResult")
        .into_inner();
    assert_eq!(inlined.stdout_raw, stdout);
    assert!(inlined.output_files[0].contents.is_empty());
    assert_eq!(inlined.output_files[1].contents, output);
}

#[tokio::test]
async fn every_service_checks_the_instance_name() {
    let server = Server::start(&["--instance-name", "main/ci"]).await;
    let other = server
        .cas()
        .find_missing_blobs(FindMissingBlobsRequest {
            instance_name: "other".into(),
            ..Default::default()
        })
        .await
        .expect_err("wrong instance");
    assert_eq!(other.code(), Code::NotFound);
    let default = server
        .get_action_result(&digest(b"x"))
        .await
        .expect_err("wrong instance");
    assert_eq!(default.code(), Code::NotFound);
    let d = digest(b"x");
    let name = format!("other/blobs/{}/{}", d.hash, d.size_bytes);
    assert_eq!(
        refused_read(&server, name, "wrong instance").await,
        Code::NotFound
    );
    let execute = server
        .execution()
        .execute(ExecuteRequest {
            action_digest: Some(d.clone()),
            ..Default::default()
        })
        .await
        .expect_err("wrong instance");
    assert_eq!(execute.code(), Code::NotFound);

    let name = format!("main/ci/uploads/u/blobs/{}/{}", d.hash, d.size_bytes);
    server
        .bytestream_write(vec![write_request(&name, 0, b"x", true)])
        .await
        .expect("right instance");
    let found = server
        .cas()
        .find_missing_blobs(FindMissingBlobsRequest {
            instance_name: "main/ci".into(),
            blob_digests: vec![d],
            ..Default::default()
        })
        .await
        .expect("right instance")
        .into_inner();
    assert!(found.missing_blob_digests.is_empty());
}

#[tokio::test]
async fn cas_dir_keeps_blobs_and_results_across_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cas_dir = dir.path().to_str().expect("utf-8 path");
    let blob = b"persistent".to_vec();
    let action = digest(b"persistent action");
    let result = ActionResult {
        exit_code: 0,
        stdout_digest: Some(digest(&blob)),
        ..Default::default()
    };

    let first = Server::start(&["--cas-dir", cas_dir]).await;
    first.upload(std::slice::from_ref(&blob)).await;
    first.update_action_result(&action, &result).await;
    assert!(first.terminate().await.success(), "SIGTERM exits 0");

    let second = Server::start(&["--cas-dir", cas_dir]).await;
    assert_eq!(second.read(&digest(&blob)).await, blob);
    let cached = second
        .get_action_result(&action)
        .await
        .expect("GetActionResult after restart");
    assert_eq!(cached, result);
}

#[tokio::test]
async fn listens_on_a_unix_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("serve.sock");
    let listen = format!("unix://{}", socket.display());
    let server = Server::start(&["--listen", &listen]).await;
    assert_eq!(server.address, listen);

    let caps = server
        .capabilities()
        .get_capabilities(GetCapabilitiesRequest::default())
        .await
        .expect("GetCapabilities over the unix socket")
        .into_inner();
    assert!(caps.execution_capabilities.expect("exec").exec_enabled);

    assert!(server.terminate().await.success());
    assert!(!socket.exists(), "the socket file is removed at exit");
}

async fn cache_capabilities(server: &Server) -> CacheCapabilities {
    server
        .capabilities()
        .get_capabilities(GetCapabilitiesRequest::default())
        .await
        .expect("GetCapabilities")
        .into_inner()
        .cache_capabilities
        .expect("cache capabilities")
}

/// Text-like data that zstd shrinks to about half.
fn compressible(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9u32;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            b'a' + (state % 16) as u8
        })
        .collect()
}

#[tokio::test]
async fn compressed_blobs_round_trip_resume_and_are_verified() {
    use dtlto_reapi::reapi::compression::{IDENTITY, ZSTD, compress, decompress};
    let server = Server::start(&[]).await;
    let caps = cache_capabilities(&server).await;
    assert_eq!(caps.supported_compressors, vec![IDENTITY, ZSTD]);
    assert_eq!(
        caps.supported_batch_update_compressors,
        vec![IDENTITY, ZSTD]
    );

    let blob = compressible(300_000);
    let d = digest(&blob);
    let packed = compress(&blob).unwrap();
    assert!(packed.len() < blob.len() * 3 / 4, "{}", packed.len());
    let name = format!(
        "uploads/4f0e3c1a-0000-4000-8000-000000000003/compressed-blobs/zstd/{}/{}",
        d.hash, d.size_bytes
    );
    // An interrupted compressed upload: offsets and the committed size count compressed bytes.
    let half = packed.len() / 2;
    let first = vec![write_request(&name, 0, &packed[..half], false)];
    server
        .bytestream_write(first)
        .await
        .expect_err("unfinished");
    let query = server.query_write_status(&name).await;
    assert_eq!((query.committed_size, query.complete), (half as i64, false));
    let rest = vec![write_request(&name, half, &packed[half..], true)];
    let committed = server.bytestream_write(rest).await.expect("resumed write");
    assert_eq!(committed, packed.len() as i64);
    assert!(server.find_missing(vec![d.clone()]).await.is_empty());
    // Already present: a compressed upload ends at once with -1.
    let again = format!(
        "uploads/u2/compressed-blobs/zstd/{}/{}",
        d.hash, d.size_bytes
    );
    let early = vec![write_request(&again, 0, &packed[..10], false)];
    assert_eq!(server.bytestream_write(early).await.expect("early"), -1);

    // Compressed reads, whole and from a compressed offset.
    let read = |offset| {
        server.bytestream_read(
            format!("compressed-blobs/zstd/{}/{}", d.hash, d.size_bytes),
            offset,
            0,
        )
    };
    let whole = read(0).await.expect("compressed read");
    assert_eq!(decompress(&whole, blob.len() as u64).unwrap(), blob);
    assert_eq!(read(1000).await.expect("tail"), whole[1000..]);

    // Batches: a zstd entry is stored decompressed; reads are compressed when accepted.
    let small = compressible(5000);
    let lie = compressible(5001);
    let update = BatchUpdateBlobsRequest {
        requests: vec![
            batch_update_blobs_request::Request {
                digest: Some(digest(&small)),
                data: compress(&small).unwrap(),
                compressor: ZSTD,
            },
            batch_update_blobs_request::Request {
                digest: Some(digest(&lie[..5000])),
                data: compress(&lie).unwrap(),
                compressor: ZSTD,
            },
        ],
        ..Default::default()
    };
    let statuses: Vec<i32> = server
        .cas()
        .batch_update_blobs(update)
        .await
        .expect("BatchUpdateBlobs")
        .into_inner()
        .responses
        .iter()
        .map(|r| r.status.as_ref().map_or(0, |s| s.code))
        .collect();
    assert_eq!(statuses, vec![0, Code::InvalidArgument as i32]);
    for acceptable in [vec![], vec![ZSTD]] {
        let response = server
            .cas()
            .batch_read_blobs(BatchReadBlobsRequest {
                digests: vec![digest(&small)],
                acceptable_compressors: acceptable.clone(),
                ..Default::default()
            })
            .await
            .expect("BatchReadBlobs")
            .into_inner();
        let entry = &response.responses[0];
        if acceptable.is_empty() {
            assert_eq!((entry.compressor, &entry.data), (IDENTITY, &small));
        } else {
            assert_eq!(entry.compressor, ZSTD);
            assert_eq!(decompress(&entry.data, small.len() as u64).unwrap(), small);
        }
    }

    // Compressed data of other content is refused and not stored.
    let other = digest(&compressible(299_999));
    let name = format!(
        "uploads/u3/compressed-blobs/zstd/{}/{}",
        other.hash, other.size_bytes
    );
    let wrong = vec![write_request(&name, 0, &packed, true)];
    let status = server.bytestream_write(wrong).await.expect_err("wrong");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(server.find_missing(vec![other.clone()]).await, vec![other]);
    let unknown = format!("compressed-blobs/brotli/{}/{}", d.hash, d.size_bytes);
    assert_eq!(
        refused_read(&server, unknown, "unknown compressor").await,
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn no_compression_offers_and_accepts_identity_only() {
    use dtlto_reapi::reapi::compression::{IDENTITY, ZSTD, compress};
    let server = Server::start(&["--no-compression"]).await;
    let caps = cache_capabilities(&server).await;
    assert_eq!(caps.supported_compressors, vec![IDENTITY]);
    assert_eq!(caps.supported_batch_update_compressors, vec![IDENTITY]);
    let blob = compressible(5000);
    let d = digest(&blob);
    let name = format!(
        "uploads/u/compressed-blobs/zstd/{}/{}",
        d.hash, d.size_bytes
    );
    let write = vec![write_request(&name, 0, &compress(&blob).unwrap(), true)];
    assert_eq!(
        server
            .bytestream_write(write)
            .await
            .expect_err("off")
            .code(),
        Code::InvalidArgument
    );
    let update = BatchUpdateBlobsRequest {
        requests: vec![batch_update_blobs_request::Request {
            digest: Some(d.clone()),
            data: compress(&blob).unwrap(),
            compressor: ZSTD,
        }],
        ..Default::default()
    };
    let response = server
        .cas()
        .batch_update_blobs(update)
        .await
        .expect("BatchUpdateBlobs")
        .into_inner();
    assert_eq!(
        response.responses[0].status.as_ref().map(|s| s.code),
        Some(Code::InvalidArgument as i32)
    );
    server.upload(std::slice::from_ref(&blob)).await;
    let name = format!("compressed-blobs/zstd/{}/{}", d.hash, d.size_bytes);
    assert_eq!(
        refused_read(&server, name, "compression off").await,
        Code::InvalidArgument
    );
    let response = server
        .cas()
        .batch_read_blobs(BatchReadBlobsRequest {
            digests: vec![d],
            acceptable_compressors: vec![ZSTD],
            ..Default::default()
        })
        .await
        .expect("BatchReadBlobs")
        .into_inner();
    assert_eq!(response.responses[0].compressor, IDENTITY);
    assert_eq!(response.responses[0].data, blob);
}
