//! Interrupting a link: SIGTERM/SIGINT must terminate the running compiles, leave no output (not
//! even a partial one) and exit promptly with a non-zero status; a failure must stop new jobs.
//!
//! The "compiler" here is a shell script that writes part of its output and then hangs, so the test
//! controls exactly what is on disk when the signal arrives.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

/// Writes a job file of `jobs` jobs whose compiler (a script) writes half an object and sleeps.
fn hanging_link(dir: &Path, jobs: usize) -> std::path::PathBuf {
    let compiler = dir.join("slow compiler.sh");
    // `-o` is followed by the (staged) output path: write part of it, then hang like a long compile
    // in a child process. Each records its process group (its own pid) in `groups`.
    std::fs::write(
        &compiler,
        "#!/bin/sh\necho $$ >> groups\nwhile [ \"$1\" != -o ]; do shift; done\nprintf half > \"$2\"\nsleep 30\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &compiler,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut list = Vec::new();
    for i in 0..jobs {
        for name in [format!("m{i}.o"), format!("m{i}.bc")] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        list.push(
            json!({"args": [format!("m{i}.o"), "-o", format!("m{i}.native.o")],
                         "inputs": [format!("m{i}.o"), format!("m{i}.bc")],
                         "outputs": [format!("m{i}.native.o")]}),
        );
    }
    let file = dir.join("app.1.dist-file.json");
    let job_file =
        json!({"common": {"linker_output": "app", "args": [compiler], "inputs": []}, "jobs": list});
    std::fs::write(&file, job_file.to_string()).unwrap();
    file
}

fn interrupt_with(signal: i32, expected_status: i32) {
    let dir = tempfile::tempdir().unwrap();
    let job_file = hanging_link(dir.path(), 3);
    let mut child = Command::new(env!("CARGO_BIN_EXE_dtlto-reapi"))
        .arg("--jobs=2")
        .arg(&job_file)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until both running compiles have written their partial outputs.
    let deadline = Instant::now() + Duration::from_secs(20);
    let partial = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".tmp")
            })
            .count()
    };
    while partial() < 2 {
        assert!(Instant::now() < deadline, "the compiles never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent = Instant::now();
    // SAFETY: kill(2) on our own child, which has not been waited for.
    unsafe { libc::kill(child.id() as i32, signal) };
    let status = child.wait().unwrap();
    let took = sent.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(took < Duration::from_secs(2), "took {took:?} to exit");
    assert_eq!(status.code(), Some(expected_status), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("native"))
        .collect();
    left.sort();
    assert!(left.is_empty(), "outputs left behind: {left:?}");
    // No compile, nor anything it started, outlives the distributor.
    let groups = std::fs::read_to_string(dir.path().join("groups")).unwrap();
    for group in groups.split_whitespace() {
        let group: i32 = group.parse().unwrap();
        // Killed orphans are reaped by init shortly after; allow it a moment.
        // SAFETY: signal 0 only checks whether any process of the group exists.
        let alive = || unsafe { libc::kill(-group, 0) } == 0;
        let deadline = Instant::now() + Duration::from_secs(2);
        while alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(), "processes of compile group {group} still run");
    }
}

#[test]
fn sigterm_kills_the_compiles_and_leaves_no_output() {
    interrupt_with(libc::SIGTERM, 128 + libc::SIGTERM);
}

#[test]
fn sigint_kills_the_compiles_and_leaves_no_output() {
    interrupt_with(libc::SIGINT, 128 + libc::SIGINT);
}

#[test]
fn an_interrupt_while_connecting_to_a_slow_cluster_exits_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let job_file = hanging_link(dir.path(), 1);
    // Every RPC of this server takes 20 s: the client is still reading its capabilities.
    let server = common::Server::start(["--fault-delay-ms=20000"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_dtlto-reapi"))
        .arg(format!("--remote={}", server.url()))
        .arg(&job_file)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let sent = Instant::now();
    // SAFETY: kill(2) on our own child, which has not been waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let took = sent.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(
        took < Duration::from_secs(2),
        "took {took:?} to exit: {stderr}"
    );
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
}

#[test]
fn an_interrupted_remote_link_cancels_its_operations_on_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    // The "compiler" runs on the server's worker: it records its pid where the test can see it,
    // then works for 30 s.
    let pids = dir.path().join("remote pids");
    let compiler = dir.path().join("slow remote compiler.sh");
    std::fs::write(
        &compiler,
        format!(
            "#!/bin/sh\necho $$ >> '{}'\nexec sleep 30\n",
            pids.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &compiler,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    for name in ["m.o", "m.bc"] {
        std::fs::write(dir.path().join(name), b"x").unwrap();
    }
    let job_file = dir.path().join("app.1.dist-file.json");
    let jobs = json!({"common": {"linker_output": "app", "args": [compiler]},
        "jobs": [{"args": ["m.o", "-o", "m.native.o"], "inputs": ["m.o", "m.bc"],
                  "outputs": ["m.native.o"]}]});
    std::fs::write(&job_file, jobs.to_string()).unwrap();

    let server = common::Server::start(Vec::<String>::new());
    let mut child = Command::new(env!("CARGO_BIN_EXE_dtlto-reapi"))
        .arg(format!("--remote={}", server.url()))
        .arg(&job_file)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pids.exists() {
        assert!(
            Instant::now() < deadline,
            "the remote compile never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid: i32 = std::fs::read_to_string(&pids)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill(2) on our own child, which has not been waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));

    // The server heard the CancelOperation and stopped the action.
    // SAFETY: signal 0 only checks whether the process exists.
    let alive = || unsafe { libc::kill(pid, 0) } == 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(), "the abandoned action still runs on the server");
}
