//! gRPC tests of `dtlto-reapi serve`'s execution side: running actions (inputs, environment,
//! outputs, metadata), caching rules, timeouts, WaitExecution, CancelOperation, concurrency,
//! hostile trees and paths, `--hide`, and SIGTERM with actions running.

mod support_server;

use bazel_remote_apis::build::bazel::remote::execution::v2::{
    Digest, Directory, ExecuteRequest, ExecuteResponse, FileNode, Tree, WaitExecutionRequest,
};
use bazel_remote_apis::google::longrunning::Operation;
use bazel_remote_apis::google::protobuf::Timestamp;
use futures::StreamExt;
use prost::Message;
use support_server::{ActionSpec, Server, digest, refused_start, stage_of};
use tonic::{Code, Streaming};
use tonic_types::StatusExt;

const QUEUED: i32 = 2;
const EXECUTING: i32 = 3;
const COMPLETED: i32 = 4;

fn nanos(t: &Option<Timestamp>) -> i128 {
    let t = t.as_ref().expect("timestamp");
    i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos)
}

#[tokio::test]
async fn runs_an_action_and_serves_the_cached_result_next_time() {
    let server = Server::start(&["--workers", "2"]).await;
    let script = "cat in/a.txt in/a.txt > out/b.txt; env | sort; echo oops >&2; ./tool.sh";
    let action = server
        .upload_action(&ActionSpec {
            args: &["/bin/sh", "-c", script],
            env: &[("ONLY", "this"), ("PATH", "/usr/bin:/bin")],
            inputs: &[
                ("in/a.txt", b"abc\n", false),
                ("tool.sh", b"#!/bin/sh\necho tool ran\n", true),
            ],
            outputs: &["out/b.txt"],
            ..Default::default()
        })
        .await;
    let (operations, response) = server.execute(&action, false).await;
    let stages: Vec<i32> = operations.iter().map(stage_of).collect();
    assert_eq!(stages, vec![QUEUED, EXECUTING, COMPLETED]);
    assert_eq!(response.status.as_ref().map(|s| s.code), Some(0));
    assert!(!response.cached_result);
    let result = response.result.expect("result");
    assert_eq!(result.exit_code, 0);
    // Exactly the Command's environment (sh adds PWD, SHLVL and `_` itself).
    let stdout = server.stdout_of(&result).await;
    let env: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains('=') && !l.starts_with(['P', 'S', '_']))
        .collect();
    assert_eq!(env, vec!["ONLY=this"], "stdout: {stdout}");
    assert!(stdout.contains("PATH=/usr/bin:/bin"));
    assert!(
        stdout.ends_with("tool ran\n"),
        "the executable input ran: {stdout}"
    );
    assert_eq!(
        server
            .read(result.stderr_digest.as_ref().expect("stderr"))
            .await,
        b"oops\n"
    );
    assert_eq!(result.output_files.len(), 1);
    assert_eq!(result.output_files[0].path, "out/b.txt");
    assert_eq!(
        server
            .read(result.output_files[0].digest.as_ref().expect("digest"))
            .await,
        b"abc\nabc\n"
    );

    let m = result.execution_metadata.as_ref().expect("metadata");
    assert!(!m.worker.is_empty());
    let times = [
        &m.queued_timestamp,
        &m.worker_start_timestamp,
        &m.input_fetch_start_timestamp,
        &m.input_fetch_completed_timestamp,
        &m.execution_start_timestamp,
        &m.execution_completed_timestamp,
        &m.output_upload_start_timestamp,
        &m.output_upload_completed_timestamp,
        &m.worker_completed_timestamp,
    ]
    .map(nanos);
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "timestamps out of order: {times:?}"
    );

    let (operations, cached) = server.execute(&action, false).await;
    assert_eq!(operations.len(), 1);
    assert!(cached.cached_result);
    assert_eq!(cached.result.as_ref(), Some(&result));

    let (_, rerun) = server.execute(&action, true).await;
    assert!(
        !rerun.cached_result,
        "skip_cache_lookup runs the action again"
    );
    assert_ne!(
        rerun.result.and_then(|r| r.execution_metadata),
        result.execution_metadata
    );
}

async fn cached(server: &Server, action: &Digest) -> bool {
    match server.get_action_result(action).await {
        Ok(_) => true,
        Err(status) if status.code() == Code::NotFound => false,
        Err(status) => panic!("GetActionResult: {status}"),
    }
}

#[tokio::test]
async fn caches_only_successful_cacheable_results() {
    let server = Server::start(&[]).await;
    let (failing, response) = server
        .upload_and_execute(&ActionSpec {
            args: &["/bin/sh", "-c", "exit 3"],
            ..Default::default()
        })
        .await;
    assert_eq!(response.result.expect("result").exit_code, 3);
    assert!(!cached(&server, &failing).await);

    let (uncacheable, response) = server
        .upload_and_execute(&ActionSpec {
            args: &["/bin/true"],
            do_not_cache: true,
            ..Default::default()
        })
        .await;
    assert_eq!(response.result.expect("result").exit_code, 0);
    assert!(!cached(&server, &uncacheable).await);

    let cacheable = server
        .upload_action(&ActionSpec {
            args: &["/bin/true"],
            ..Default::default()
        })
        .await;
    server.execute(&cacheable, false).await;
    assert!(cached(&server, &cacheable).await);
}

#[tokio::test]
async fn a_missing_program_exits_127() {
    let server = Server::start(&[]).await;
    let (_, response) = server
        .upload_and_execute(&ActionSpec {
            args: &["no-such-program-here"],
            ..Default::default()
        })
        .await;
    let result = response.result.expect("result");
    assert_eq!(result.exit_code, 127);
    assert!(
        server
            .read(result.stderr_digest.as_ref().expect("stderr"))
            .await
            .starts_with(b"dtlto-reapi serve: cannot run")
    );
}

#[tokio::test]
async fn collects_output_directories_in_the_working_directory() {
    let server = Server::start(&[]).await;
    let (_, response) = server
        .upload_and_execute(&ActionSpec {
            args: &["/bin/sh", "-c", "mkdir -p gen/sub && echo x > gen/sub/f && ln -s sub/f gen/link && echo y > ../top.txt"],
            inputs: &[("work/keep", b"", false)],
            outputs: &["gen", "../top.txt", "never-made"],
            working_directory: "work",
            ..Default::default()
        })
        .await;
    let result = response.result.expect("result");
    assert_eq!(result.exit_code, 0);
    assert_eq!(result.output_files.len(), 1);
    assert_eq!(result.output_files[0].path, "../top.txt");
    assert_eq!(result.output_directories.len(), 1);
    let tree = Tree::decode(
        &*server
            .read(
                result.output_directories[0]
                    .tree_digest
                    .as_ref()
                    .expect("tree"),
            )
            .await,
    )
    .expect("Tree");
    let root = tree.root.expect("root");
    assert_eq!(root.symlinks[0].target, "sub/f");
    assert_eq!(root.directories[0].name, "sub");
    let sub = Directory::decode(
        &*server
            .read(root.directories[0].digest.as_ref().expect("digest"))
            .await,
    )
    .expect("Directory");
    assert_eq!(tree.children, vec![sub.clone()]);
    assert_eq!(
        server
            .read(sub.files[0].digest.as_ref().expect("digest"))
            .await,
        b"x\n"
    );
}

#[tokio::test]
async fn kills_an_action_at_its_timeout() {
    let server = Server::start(&[]).await;
    let (action, response) = server
        .upload_and_execute(&ActionSpec {
            args: &["/bin/sh", "-c", "echo started; sleep 60"],
            timeout_secs: Some(1),
            ..Default::default()
        })
        .await;
    assert_eq!(
        response.status.expect("status").code,
        Code::DeadlineExceeded as i32
    );
    let result = response.result.expect("partial result");
    assert_eq!(server.stdout_of(&result).await, "started\n");
    assert!(!cached(&server, &action).await);
}

#[tokio::test]
async fn wait_execution_reattaches_and_cancel_operation_stops_an_action() {
    let server = Server::start(&[]).await;
    let mut stream = start_sleeping(&server).await;
    let first = stream.next().await.expect("an operation").expect("ok");
    drop(stream);
    assert!(!first.done);

    let response = server.cancel(&first.name).await;
    assert_eq!(
        response.status.expect("status").code,
        Code::Cancelled as i32
    );

    let unknown = server
        .execution()
        .wait_execution(WaitExecutionRequest {
            name: "operations/nope".into(),
        })
        .await
        .expect_err("unknown operation");
    assert_eq!(unknown.code(), Code::NotFound);
}

/// Uploads an action that sleeps for a minute and starts executing it; returns the Execute stream.
async fn start_sleeping(server: &Server) -> Streaming<Operation> {
    let action = server
        .upload_action(&ActionSpec {
            args: &["/bin/sleep", "60"],
            ..Default::default()
        })
        .await;
    server.execute_stream(&action, false).await
}

/// Runs two one-second actions at once; returns whether their executions overlapped.
async fn overlapped(workers: &str) -> bool {
    let server = Server::start(&["--workers", workers]).await;
    let a = server
        .upload_action(&ActionSpec {
            args: &["/bin/sleep", "1"],
            ..Default::default()
        })
        .await;
    let b = server
        .upload_action(&ActionSpec {
            args: &["/bin/sleep", "1"],
            env: &[("B", "1")],
            ..Default::default()
        })
        .await;
    let ((_, ra), (_, rb)) = tokio::join!(server.execute(&a, false), server.execute(&b, false));
    let window = |r: ExecuteResponse| {
        let m = r
            .result
            .and_then(|r| r.execution_metadata)
            .expect("metadata");
        (
            nanos(&m.execution_start_timestamp),
            nanos(&m.execution_completed_timestamp),
        )
    };
    let (wa, wb) = (window(ra), window(rb));
    wa.0 < wb.1 && wb.0 < wa.1
}

#[tokio::test]
async fn workers_bound_how_many_actions_run_at_once() {
    assert!(
        overlapped("2").await,
        "two workers run two actions together"
    );
    assert!(
        !overlapped("1").await,
        "one worker runs them one after the other"
    );
}

#[tokio::test]
async fn refuses_hostile_trees_and_paths() {
    let server = Server::start(&[]).await;
    let status_of = |response: ExecuteResponse| response.status.map(|s| s.code).unwrap_or_default();
    let true_spec = ActionSpec {
        args: &["/bin/true"],
        ..Default::default()
    };
    for bad in ["..", ".", "", "a/b"] {
        let blob = b"payload".to_vec();
        let root = Directory {
            files: vec![FileNode {
                name: bad.into(),
                digest: Some(digest(&blob)),
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec();
        let (command, action) = true_spec.encode(digest(&root));
        server.upload(&[blob, root, command, action.clone()]).await;
        let (_, response) = server.execute(&digest(&action), false).await;
        assert_eq!(
            status_of(response),
            Code::InvalidArgument as i32,
            "entry named {bad:?}"
        );
    }
    for bad in ["../../escape", "/abs/path", ""] {
        let (_, response) = server
            .upload_and_execute(&ActionSpec {
                args: &["/bin/true"],
                outputs: &[bad],
                ..Default::default()
            })
            .await;
        assert_eq!(
            status_of(response),
            Code::InvalidArgument as i32,
            "output path {bad:?}"
        );
    }
    // An action whose symlink points outside cannot make the server write or read there.
    let outside = tempfile::tempdir().expect("tempdir");
    let script = format!("rmdir out && ln -s {} out", outside.path().display());
    let action = server
        .upload_action(&ActionSpec {
            args: &["/bin/sh", "-c", &script],
            outputs: &["out/secret"],
            ..Default::default()
        })
        .await;
    std::fs::write(outside.path().join("secret"), b"host file").expect("write");
    let (_, response) = server.execute(&action, false).await;
    let result = response.result.expect("result");
    assert_eq!(result.exit_code, 0);
    assert!(
        result.output_files.is_empty(),
        "must not follow the planted symlink"
    );

    // A missing input blob is reported as a precondition failure naming it.
    let (root, _) = support_server::tree(&[("f", b"never uploaded", false)]);
    let (command, action) = true_spec.encode(root);
    server.upload(&[command, action.clone()]).await;
    let (_, response) = server.execute(&digest(&action), false).await;
    assert_eq!(status_of(response), Code::FailedPrecondition as i32);
    let status = server
        .execution()
        .execute(ExecuteRequest {
            action_digest: Some(digest(b"no such action")),
            ..Default::default()
        })
        .await
        .expect_err("missing Action");
    assert_eq!(status.code(), Code::FailedPrecondition);
    let violations = status
        .get_details_precondition_failure()
        .expect("PreconditionFailure")
        .violations;
    assert_eq!(violations[0].r#type, "MISSING");
    assert!(violations[0].subject.starts_with("blobs/"));
}

#[tokio::test]
async fn hide_makes_a_directory_invisible_to_actions() {
    let client_dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(client_dir.path().join("leak.txt"), b"visible").expect("write");
    let path = client_dir.path().join("leak.txt");
    let script = format!("cat {}", path.display());
    let spec = ActionSpec {
        args: &["/bin/sh", "-c", &script],
        ..Default::default()
    };

    let open = Server::start(&[]).await;
    let (_, response) = open.upload_and_execute(&spec).await;
    assert_eq!(
        open.stdout_of(&response.result.expect("result")).await,
        "visible"
    );

    let hidden = Server::start(&["--hide", client_dir.path().to_str().expect("utf-8")]).await;
    let (_, response) = hidden.upload_and_execute(&spec).await;
    assert_ne!(
        response.result.expect("result").exit_code,
        0,
        "the hidden file must not be readable"
    );
    assert_eq!(
        std::fs::read(&path).expect("still there for the client"),
        b"visible"
    );

    let work = tempfile::tempdir().expect("tempdir");
    let work_dir = work.path().join("actions");
    let (status, stderr) = refused_start(&[
        "--work-dir",
        work_dir.to_str().expect("utf-8"),
        "--hide",
        work.path().to_str().expect("utf-8"),
    ])
    .await;
    assert!(!status.success());
    assert!(
        stderr.contains("covers the action work root"),
        "stderr: {stderr}"
    );
}

#[tokio::test]
async fn sigterm_cancels_running_actions_and_exits_zero() {
    let server = Server::start(&[]).await;
    let mut stream = start_sleeping(&server).await;
    // Wait until the action runs, then stop the server.
    while let Some(op) = stream.next().await {
        if stage_of(&op.expect("operation")) == EXECUTING {
            break;
        }
    }
    let exit = tokio::time::timeout(std::time::Duration::from_secs(30), server.terminate())
        .await
        .expect("the server exits well before the action would have finished");
    assert!(exit.success(), "exit status {exit}");
}

#[tokio::test]
async fn actions_run_in_namespaces_of_their_own() {
    let server = Server::start(&[]).await;
    let client = std::process::id();
    // Process 1 of a PID namespace of its own, with its own /proc: the client's process (and so
    // its working directory through /proc/<pid>/cwd) is out of sight. When the server is root,
    // the action is a user of its own, without privileges (`id -u` is far from 0); otherwise its
    // user namespace maps one user, not the whole id range of the host's.
    let script = format!(
        "echo $$; test -e /proc/{client}/cwd && echo sees-the-client; id -u; \
         cat /proc/self/uid_map; grep NoNewPrivs /proc/self/status"
    );
    let spec = ActionSpec {
        args: &["/bin/sh", "-c", &script],
        ..Default::default()
    };
    let (_, response) = server.upload_and_execute(&spec).await;
    let result = response.result.expect("result");
    let stdout = server.stdout_of(&result).await;
    let lines: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert_eq!(lines[0], ["1"], "{stdout}");
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let uid: u64 = lines[1][0].parse().expect("a uid");
        assert!(uid >= 1 << 30, "{stdout}");
    } else {
        assert_eq!(lines[2][0], "0", "{stdout}");
        assert_eq!(lines[2][2], "1", "only one user is mapped: {stdout}");
    }
    assert_eq!(lines[3], ["NoNewPrivs:", "1"], "{stdout}");
}

#[tokio::test]
async fn listens_only_on_loopback_unless_allowed() {
    for address in ["0.0.0.0:0", "[::]:0"] {
        let (status, stderr) = refused_start(&["--listen", address]).await;
        assert!(!status.success(), "{address}");
        assert!(
            stderr.contains("not a loopback address") && stderr.contains("--allow-remote-clients"),
            "{address}: {stderr}"
        );
    }
    let open = Server::start(&["--listen", "0.0.0.0:0", "--allow-remote-clients"]).await;
    drop(open);
    let local = Server::start(&["--listen", "localhost:0"]).await;
    drop(local);
}
