//! Interrupting a link: SIGTERM/SIGINT must terminate the running compiles, leave no output (not
//! even a partial one) and exit promptly with a non-zero status; a failure must stop new jobs.
//!
//! The "compiler" here is a shell script that writes part of its output and then hangs, so the test
//! controls exactly what is on disk when the signal arrives.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::eventually;
use serde_json::json;

/// Writes the executable script `name` into `dir` and a job file of `jobs` jobs that use it as
/// their compiler (`m{i}.o -o m{i}.native.o`); returns the job file.
fn job_file_with_compiler(dir: &Path, name: &str, script: &str, jobs: usize) -> PathBuf {
    let compiler = dir.join(name);
    std::fs::write(&compiler, script).unwrap();
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

/// A job file of `jobs` jobs whose compiler writes half an object and sleeps.
fn hanging_link(dir: &Path, jobs: usize) -> PathBuf {
    // `-o` is followed by the (staged) output path: write part of it, then hang like a long compile
    // in a child process. Each records its process group (its own pid) in `groups`.
    let script = "#!/bin/sh\necho $$ >> groups\nwhile [ \"$1\" != -o ]; do shift; done\nprintf half > \"$2\"\nsleep 30\n";
    job_file_with_compiler(dir, "slow compiler.sh", script, jobs)
}

/// Starts dtlto-reapi in `dir` with `args`, its stderr captured.
fn spawn_distributor(dir: &Path, args: &[String]) -> Child {
    common::dtlto_reapi()
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Sends `signal` to `child` and waits for it: its exit status, how long that took, its stderr.
fn signal_and_wait(mut child: Child, signal: i32) -> (ExitStatus, Duration, String) {
    let sent = Instant::now();
    // SAFETY: kill(2) on our own child, which has not been waited for.
    unsafe { libc::kill(child.id() as i32, signal) };
    let status = child.wait().unwrap();
    let took = sent.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    (status, took, stderr)
}

/// Whether kill(2) finds its target: the process `pid`, or with `-group` any process of `group`.
fn exists(pid_or_negated_group: i32) -> bool {
    // SAFETY: signal 0 only checks whether the target exists.
    unsafe { libc::kill(pid_or_negated_group, 0) == 0 }
}

fn interrupt_with(signal: i32, expected_status: i32) {
    let dir = tempfile::tempdir().unwrap();
    let job_file = hanging_link(dir.path(), 3);
    let child = spawn_distributor(
        dir.path(),
        &["--jobs=2".to_owned(), job_file.display().to_string()],
    );
    // Wait until both running compiles have written their partial outputs.
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
    assert!(
        eventually(Duration::from_secs(20), || partial() >= 2),
        "the compiles never started"
    );
    let (status, took, stderr) = signal_and_wait(child, signal);
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
    // No compile, nor anything it started, outlives the distributor. (Killed orphans are reaped
    // by init shortly after; allow it a moment.)
    let groups = std::fs::read_to_string(dir.path().join("groups")).unwrap();
    for group in groups.split_whitespace() {
        let group: i32 = group.parse().unwrap();
        assert!(
            eventually(Duration::from_secs(2), || !exists(-group)),
            "processes of compile group {group} still run"
        );
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

/// Links `jobs` hanging jobs through a server started with `server_args`, with `extra` distributor
/// options; sends SIGTERM after `after` and checks that the distributor exits within 2 s, saying
/// it was interrupted. Returns the link's directory.
fn interrupt_a_remote_link(
    server_args: &[&str],
    extra: &[&str],
    jobs: usize,
    after: Duration,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let job_file = hanging_link(dir.path(), jobs);
    let server = common::Server::start(server_args);
    let mut args: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
    args.push(format!("--remote={}", server.url()));
    args.push(job_file.display().to_string());
    let child = spawn_distributor(dir.path(), &args);
    std::thread::sleep(after);
    let (status, took, stderr) = signal_and_wait(child, libc::SIGTERM);
    assert!(
        took < Duration::from_secs(2),
        "took {took:?} to exit: {stderr}"
    );
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    dir
}

#[test]
fn an_interrupt_while_connecting_to_a_slow_cluster_exits_promptly() {
    // Every RPC of this server takes 20 s: the client is still reading its capabilities.
    interrupt_a_remote_link(
        &["--fault-delay-ms=20000"],
        &[],
        1,
        Duration::from_millis(500),
    );
}

#[test]
fn an_interrupted_remote_link_cancels_its_operations_on_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    // A server running as root runs the action as a user of its own, which must write here.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    // The "compiler" runs on the server's worker (in a PID namespace of its own, so its pid means
    // nothing here): it says where the test can see that it started, works for 3 s, then says
    // that it survived.
    let pids = dir.path().join("remote progress");
    let script = format!(
        "#!/bin/sh\necho started >> '{0}'\nsleep 3\necho survived >> '{0}'\n",
        pids.display()
    );
    let job_file = job_file_with_compiler(dir.path(), "slow remote compiler.sh", &script, 1);

    let server = common::Server::start(Vec::<String>::new());
    let child = spawn_distributor(
        dir.path(),
        &[
            format!("--remote={}", server.url()),
            job_file.display().to_string(),
        ],
    );
    assert!(
        eventually(Duration::from_secs(20), || pids.exists()),
        "the remote compile never started"
    );
    let (status, _, stderr) = signal_and_wait(child, libc::SIGTERM);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{stderr}");

    // The server heard the CancelOperation and stopped the action before it finished.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        std::fs::read_to_string(&pids).unwrap(),
        "started\n",
        "the abandoned action still ran on the server"
    );
}

/// Whether process `pid` still runs: it exists and is not a zombie waiting for its reaper.
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z')
        })
        .unwrap_or(false)
}

/// A job file of `jobs` jobs whose compiler records its pid in `pids`, ignores SIGTERM and runs
/// for 30 s as a single process (`exec`).
fn stubborn_link(dir: &Path, jobs: usize) -> PathBuf {
    let script = "#!/bin/sh\necho $$ >> pids\ntrap '' TERM\nexec sleep 30\n";
    job_file_with_compiler(dir, "stubborn compiler.sh", script, jobs)
}

/// The pids the compilers of [`stubborn_link`] recorded, once `count` of them have started.
fn compiler_pids(dir: &Path, count: usize) -> Vec<i32> {
    let pids = || -> Vec<i32> {
        std::fs::read_to_string(dir.join("pids"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    };
    assert!(
        eventually(Duration::from_secs(20), || pids().len() >= count),
        "the compiles never started"
    );
    pids()
}

/// Asserts that every process of `pids` is gone within 2 s.
fn assert_all_died(pids: &[i32]) {
    for &pid in pids {
        assert!(
            eventually(Duration::from_secs(2), || !running(pid)),
            "compile {pid} outlived the distributor"
        );
    }
}

#[test]
fn sigkill_of_the_distributor_kills_its_compiles() {
    let dir = tempfile::tempdir().unwrap();
    let job_file = stubborn_link(dir.path(), 2);
    let mut child = spawn_distributor(
        dir.path(),
        &["--jobs=2".to_owned(), job_file.display().to_string()],
    );
    let pids = compiler_pids(dir.path(), 2);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_all_died(&pids);
}

/// A job file of `jobs` jobs whose compiler is a wrapper that ignores SIGTERM and runs two
/// children of its own — one in the background, one in the foreground, both ignoring SIGTERM too —
/// recording all three pids in `pids`, as a compiler wrapper or clang's own subprocesses would.
fn wrapper_link(dir: &Path, jobs: usize) -> PathBuf {
    let script = "#!/bin/sh\ntrap '' TERM\necho $$ >> pids\nsleep 30 &\necho $! >> pids\n\
                  sh -c 'echo $$ >> pids; exec sleep 30'\nwait\n";
    job_file_with_compiler(dir, "wrapper compiler.sh", script, jobs)
}

#[test]
fn sigkill_of_the_distributor_kills_the_children_of_its_compiles_too() {
    let dir = tempfile::tempdir().unwrap();
    let job_file = wrapper_link(dir.path(), 2);
    let mut child = spawn_distributor(
        dir.path(),
        &["--jobs=2".to_owned(), job_file.display().to_string()],
    );
    // Two compiles of three processes each.
    let pids = compiler_pids(dir.path(), 6);
    assert!(pids.iter().all(|&pid| running(pid)), "{pids:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_all_died(&pids);
}

#[test]
fn a_second_ctrl_c_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let job_file = stubborn_link(dir.path(), 1);
    let child = spawn_distributor(dir.path(), &[job_file.display().to_string()]);
    let pids = compiler_pids(dir.path(), 1);
    // SAFETY: kill(2) on our own child, which has not been waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    std::thread::sleep(Duration::from_millis(50));
    let (status, _, stderr) = signal_and_wait(child, libc::SIGINT);
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{stderr}");
    assert!(stderr.contains("interrupted again"), "{stderr}");
    // The compile, which ignores SIGTERM, did not get its grace period, and still died.
    assert_all_died(&pids);
}

#[test]
fn sighup_is_handled_like_sigterm() {
    interrupt_with(libc::SIGHUP, 128 + libc::SIGHUP);
}

#[test]
fn an_interrupted_cache_only_link_stops_waiting_for_the_cache() {
    // Connecting is quick; every action-cache lookup takes 20 s.
    let dir = interrupt_a_remote_link(
        &["--fault-slow=GetActionResult=20000"],
        &["--mode=cache-only"],
        2,
        Duration::from_millis(1500),
    );
    assert!(
        !dir.path().join("groups").exists(),
        "no compile ran: the lookups were still waiting"
    );
}

#[test]
fn staged_files_of_a_killed_run_are_removed_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let script = "#!/bin/sh\nwhile [ \"$1\" != -o ]; do shift; done\nprintf obj > \"$2\"\n";
    let job_file = job_file_with_compiler(dir.path(), "compiler.sh", script, 2);
    // As a run killed with SIGKILL leaves them (no process has pid 2^31-1).
    let leftover = dir
        .path()
        .join(format!(".m0.native.o.dtlto-{}-Xy12Ab.tmp", i32::MAX));
    std::fs::write(&leftover, b"half").unwrap();
    let output = common::dtlto_reapi()
        .arg(&job_file)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(
        !leftover.exists(),
        "the leftover staged file is still there"
    );
    assert_eq!(
        std::fs::read(dir.path().join("m0.native.o")).unwrap(),
        b"obj"
    );
}
