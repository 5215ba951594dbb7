//! What one action can do to the host, to other actions and to other clients through
//! `dtlto-reapi serve`, tried by hostile actions over real gRPC: overwrite a big input that other
//! actions share, write a root-owned file outside its input root (when the server runs as root),
//! outlive its timeout or cancellation through `setsid`, leave directories it made unreadable;
//! and that identical actions in flight run once, and the default listener admits only this user.

mod support_server;

use futures::StreamExt;
use sha2::{Digest as _, Sha256};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};
use support_server::{ActionSpec, Server, response_of};
use tonic::Code;

/// How long after its Execute has answered an action may still have processes.
const GONE_WITHIN: Duration = Duration::from_secs(2);

fn running_as_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The pids of host processes whose command line contains `tag`.
fn processes_with(tag: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|line| String::from_utf8_lossy(&line).contains(tag))
        })
        .collect()
}

/// Waits until no process carries `tag`, for at most [`GONE_WITHIN`]; returns those left.
async fn left_running(tag: &str) -> Vec<u32> {
    let deadline = Instant::now() + GONE_WITHIN;
    loop {
        let left = processes_with(tag);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A script that starts a sleeper in a session of its own, then puts itself (process 1 of the
/// action) in another session and sleeps: a process group kill reaches neither. Both sleepers'
/// command lines carry `tag` (a number only this test uses).
fn escaping_script(tag: &str) -> String {
    format!("setsid sleep 3{tag} & exec setsid sleep 4{tag}")
}

/// A tag unique to this test process and `case`, usable as the fraction of a sleep duration.
fn tag(case: u32) -> String {
    format!("00.{case}{}", std::process::id())
}

#[tokio::test]
async fn an_action_cannot_change_the_big_inputs_other_actions_get() {
    let server = Server::start(&["--workers", "2"]).await;
    // Big enough to be shared between actions where that is safe.
    let big: Vec<u8> = (0..(3u32 << 20)).map(|i| (i % 251) as u8).collect();
    let hash = hex::encode(Sha256::digest(&big));
    let inputs: &[(&str, &[u8], bool)] = &[("big", &big, false)];
    let tamper = "chmod 666 big; printf tampered | dd of=big conv=notrunc 2>/dev/null; \
                  echo more >> big; sha256sum big";
    let (_, response) = server
        .upload_and_execute(&ActionSpec {
            args: &["/bin/sh", "-c", tamper],
            inputs,
            ..Default::default()
        })
        .await;
    let result = response.result.expect("result");
    let own_view = server.stdout_of(&result).await;
    // Another client's action with the same input, later: it gets the blob as uploaded.
    let (_, response) = server
        .upload_and_execute(&ActionSpec {
            args: &["/bin/sh", "-c", "sha256sum big"],
            inputs,
            env: &[("OTHER", "client")],
            ..Default::default()
        })
        .await;
    let result = response.result.expect("result");
    assert_eq!(result.exit_code, 0);
    assert_eq!(
        server.stdout_of(&result).await,
        format!("{hash}  big\n"),
        "the tampering action saw {own_view:?}"
    );
}

#[tokio::test]
async fn as_root_an_action_cannot_write_root_files_outside_its_input_root() {
    if !running_as_root() {
        eprintln!("skipped: this test needs serve to run as root (the tests run as another user)");
        return;
    }
    let server = Server::start(&[]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let file = dir.path().join("root-owned");
    std::fs::write(&file, "original\n").expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let script = format!(
        "echo appended >> '{0}'; chmod 666 '{0}'; echo appended >> '{0}'; id -u",
        file.display()
    );
    let (_, response) = server
        .upload_and_execute(&ActionSpec {
            args: &["/bin/sh", "-c", &script],
            ..Default::default()
        })
        .await;
    let result = response.result.expect("result");
    let uid = server.stdout_of(&result).await;
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "original\n");
    assert_ne!(uid.trim(), "0", "the action ran as root");
    assert_eq!(
        std::fs::metadata(&file).expect("stat").permissions().mode() & 0o777,
        0o644
    );
}

#[tokio::test]
async fn a_timed_out_action_is_gone_with_everything_it_started() {
    let server = Server::start(&[]).await;
    let tag = tag(1);
    let script = escaping_script(&tag);
    let (_, response) = server
        .upload_and_execute(&ActionSpec {
            args: &["/bin/sh", "-c", &script],
            timeout_secs: Some(1),
            ..Default::default()
        })
        .await;
    assert_eq!(
        response.status.expect("status").code,
        Code::DeadlineExceeded as i32
    );
    assert_eq!(left_running(&tag).await, Vec::<u32>::new());
}

#[tokio::test]
async fn a_cancelled_action_is_gone_with_everything_it_started() {
    let server = Server::start(&[]).await;
    let tag = tag(2);
    let script = escaping_script(&tag);
    let action = server
        .upload_action(&ActionSpec {
            args: &["/bin/sh", "-c", &script],
            ..Default::default()
        })
        .await;
    let mut stream = server.execute_stream(&action, false).await;
    let first = stream.next().await.expect("an operation").expect("ok");
    // Cancel only once the sleepers run.
    let started = Instant::now();
    while processes_with(&tag).len() < 2 {
        assert!(started.elapsed() < Duration::from_secs(30), "never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let response = server.cancel(&first.name).await;
    assert_eq!(
        response.status.expect("status").code,
        Code::Cancelled as i32
    );
    assert_eq!(left_running(&tag).await, Vec::<u32>::new());
}

#[tokio::test]
async fn action_directories_go_even_when_the_action_locked_them() {
    let work = tempfile::tempdir().expect("tempdir");
    let work_dir = work.path().to_str().expect("utf-8");
    let server = Server::start(&["--work-dir", work_dir]).await;
    let (_, response) = server
        .upload_and_execute(&ActionSpec {
            args: &[
                "/bin/sh",
                "-c",
                "mkdir -p a/b && touch a/b/f && chmod 0 a/b a && echo locked",
            ],
            ..Default::default()
        })
        .await;
    let result = response.result.expect("result");
    assert_eq!(server.stdout_of(&result).await, "locked\n");
    // The directory is gone before the answer.
    let actions_left = std::fs::read_dir(work.path())
        .expect("read work dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("action-"))
        .count();
    assert_eq!(actions_left, 0);
}

#[tokio::test]
async fn output_over_the_caps_is_an_action_error() {
    let server = Server::start(&[]).await;
    // 65 MiB of stdout: over the 64 MiB cap.
    let (_, response) = server
        .upload_and_execute(&ActionSpec {
            args: &["/bin/sh", "-c", "head -c 68157440 /dev/zero"],
            ..Default::default()
        })
        .await;
    let status = response.status.expect("status");
    assert_eq!(status.code, Code::InvalidArgument as i32, "{status:?}");
    assert!(
        status.message.contains("stdout holds more than"),
        "{status:?}"
    );
}

#[tokio::test]
async fn identical_actions_in_flight_run_once() {
    let stats = tempfile::NamedTempFile::new().expect("tempfile");
    let path = stats.path().to_str().expect("utf-8");
    let server = Server::start(&["--workers", "4", "--stats-json", path]).await;
    // The action waits for a file that appears once all three Executes are in.
    let gate = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(gate.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let go = gate.path().join("go");
    let script = format!(
        "while ! test -e '{}'; do sleep 0.05; done; echo ran",
        go.display()
    );
    let action = server
        .upload_action(&ActionSpec {
            args: &["/bin/sh", "-c", &script],
            ..Default::default()
        })
        .await;
    let mut streams = Vec::new();
    let mut names = Vec::new();
    for _ in 0..3 {
        let mut stream = server.execute_stream(&action, false).await;
        let first = stream.next().await.expect("an operation").expect("ok");
        names.push(first.name);
        streams.push(stream);
    }
    std::fs::write(&go, "").expect("open the gate");
    assert!(names.iter().all(|name| *name == names[0]), "{names:?}");
    for stream in streams {
        let operations: Vec<_> = stream.map(|op| op.expect("operation")).collect().await;
        let response = response_of(operations.last().expect("done"));
        assert_eq!(response.status.expect("status").code, 0);
        let result = response.result.expect("result");
        assert_eq!(server.stdout_of(&result).await, "ran\n");
    }
    assert!(server.terminate().await.success());
    let totals: serde_json::Value =
        serde_json::from_slice(&std::fs::read(stats.path()).expect("stats")).expect("json");
    assert_eq!(totals["executions"], 1, "{totals}");
    assert_eq!(totals["merged_executions"], 2, "{totals}");
}

#[tokio::test]
async fn by_default_only_this_user_can_reach_the_server() {
    let server = Server::start(&["--default-listen"]).await;
    let path = server
        .address
        .strip_prefix("unix://")
        .unwrap_or_else(|| panic!("{} is not a unix socket", server.address));
    let dir = std::path::Path::new(path)
        .parent()
        .expect("socket directory");
    let meta = std::fs::metadata(dir).expect("stat");
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    // SAFETY: geteuid cannot fail.
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), unsafe {
        libc::geteuid()
    });
    // And it serves.
    let (_, response) = server
        .upload_and_execute(&ActionSpec {
            args: &["/bin/sh", "-c", "echo hello"],
            ..Default::default()
        })
        .await;
    let result = response.result.expect("result");
    assert_eq!(server.stdout_of(&result).await, "hello\n");
}

/// zstd of `size` zero bytes, made a step at a time (never `size` bytes in memory).
fn zeros_compressed(size: u64) -> Vec<u8> {
    use std::io::Read as _;
    zstd::stream::encode_all(std::io::repeat(0).take(size), 3).expect("zstd")
}

#[tokio::test]
async fn a_zstd_bomb_upload_ends_with_a_clear_error_in_bounded_memory() {
    use bazel_remote_apis::build::bazel::remote::execution::v2::{
        BatchUpdateBlobsRequest, Digest, batch_update_blobs_request, compressor,
    };
    let stats = tempfile::NamedTempFile::new().expect("tempfile");
    let path = stats.path().to_str().expect("utf-8");
    let server = Server::start(&["--stats-json", path]).await;
    let gib = 1u64 << 30;
    let bomb = zeros_compressed(gib);
    let one_mib = vec![0u8; 1 << 20];
    let small = hex::encode(Sha256::digest(&one_mib));
    let other = hex::encode(Sha256::digest(b"not a GiB of zeros"));

    // The digest says 1 MiB: decompression stops just past it.
    let name = format!("uploads/u1/compressed-blobs/zstd/{small}/{}", 1 << 20);
    let err = server
        .bytestream_write(vec![support_server::write_request(&name, 0, &bomb, true)])
        .await
        .expect_err("a bomb");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("more than the 1048576 bytes"),
        "{err:?}"
    );

    // The digest says 1 GiB but names other bytes: refused without keeping 1 GiB.
    let name = format!("uploads/u2/compressed-blobs/zstd/{other}/{}", gib);
    let err = server
        .bytestream_write(vec![support_server::write_request(&name, 0, &bomb, true)])
        .await
        .expect_err("a bomb");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("another digest"), "{err:?}");

    // The same in a batch entry.
    let response = server
        .cas()
        .batch_update_blobs(BatchUpdateBlobsRequest {
            requests: vec![batch_update_blobs_request::Request {
                digest: Some(Digest {
                    hash: other,
                    size_bytes: gib as i64,
                }),
                data: bomb,
                compressor: compressor::Value::Zstd as i32,
            }],
            ..Default::default()
        })
        .await
        .expect("BatchUpdateBlobs")
        .into_inner();
    let status = response.responses[0].status.clone().expect("status");
    assert_eq!(status.code, Code::InvalidArgument as i32, "{status:?}");

    assert!(server.terminate().await.success());
    let totals: serde_json::Value =
        serde_json::from_slice(&std::fs::read(stats.path()).expect("stats")).expect("json");
    let peak = totals["peak_rss_bytes"].as_u64().expect("peak_rss_bytes");
    assert!(peak < 200 << 20, "serve's peak RSS was {peak} bytes");
}
