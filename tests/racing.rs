//! `--strategy=racing` against `dtlto-reapi serve`: the local compile slots race the jobs the
//! cluster has not finished, the first result wins, the loser is cancelled and leaves nothing.
//!
//! Who wins is made certain rather than timed: a cluster whose Execute is held for ten minutes
//! loses every race; a compiler wrapper that sleeps for ten minutes when it can see the project's
//! directory — which the server hides from its actions — loses every local side. The wrapper also
//! records each local compile's pid in the project, so a test can tell whether any started.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Linked, Project, Server, Stats, chain_project, ran_only};

/// The project's files whose names mark them as staged outputs (`.NAME.dtlto-PID-XXXX.tmp`).
fn staged_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.to_string_lossy().contains(".dtlto-") {
                found.push(path);
            }
        }
    }
    found
}

/// A compiler wrapper outside `project` that runs the toolchain's compiler; when it runs where it
/// can see `project` (a local compile, not an action of a server that hides it), it records its pid
/// in `local-compiles` there and sleeps for ten minutes first while `slow-local` exists there, or
/// when `slow-local-after` there holds a number and the compile is a later one than that.
fn wrapper(project: &Project, dir: &Path) -> PathBuf {
    let tools = common::toolchain();
    let project_dir = project.dir().display().to_string();
    let script = format!(
        "#!/bin/sh\ndir='{project_dir}'\nif [ -d \"$dir\" ]; then\n  echo $$ >> \"$dir/local-compiles\"\n  \
         if [ -e \"$dir/slow-local\" ]; then sleep 600; fi\n  \
         if [ -e \"$dir/slow-local-after\" ] && \
         [ \"$(wc -l < \"$dir/local-compiles\")\" -gt \"$(cat \"$dir/slow-local-after\")\" ]; then sleep 600; fi\n\
         fi\nexec '{}' {} \"$@\"\n",
        tools.compiler.display(),
        tools.compiler_prepend
    );
    let path = dir.join("wrapped-clang");
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// The pids the wrapper recorded for local compiles.
fn local_compiles(project: &Project) -> Vec<i32> {
    fs::read_to_string(project.dir().join("local-compiles"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Links `project` with `compiler` through `server` with `--strategy=racing --jobs=2` and `extra`.
fn racing_link(
    project: &Project,
    output: &str,
    compiler: &Path,
    server: &Server,
    extra: &[&str],
) -> (Linked, Stats) {
    let linked = project
        .link(output)
        .compiler(compiler, &[])
        .remote(server.url())
        .distributor_args(["--strategy=racing", "--jobs=2"])
        .distributor_args(extra)
        .stats_json()
        .save_temps()
        .run();
    linked.assert_success();
    let stats = linked.stats();
    (linked, stats)
}

/// Each job's race winner (`local`, `remote`, or `-` for a job without a race).
fn winners(stats: &Stats) -> Vec<String> {
    stats
        .jobs()
        .iter()
        .map(|j| j["race"]["winner"].as_str().unwrap_or("-").to_owned())
        .collect()
}

/// The same project linked in local mode with the same compiler: the objects to compare with.
fn local_objects(project: &Project, compiler: &Path) -> Vec<Vec<u8>> {
    let local = project
        .link("local/app")
        .compiler(compiler, &[])
        .save_temps()
        .run();
    local.assert_success();
    local.native_object_contents()
}

/// A chain project of `modules` + 1 jobs and its expected output, the [`wrapper`] compiler for it
/// (in the directory returned last, which a test keeps until its links are done), and a server
/// started with `server_args` that hides the project from its actions.
fn setup(
    modules: usize,
    server_args: &[&str],
) -> (Project, String, PathBuf, Server, tempfile::TempDir) {
    let (project, expected) = chain_project(modules);
    let tools = tempfile::tempdir().unwrap();
    let compiler = wrapper(&project, tools.path());
    let hide = project.dir().display().to_string();
    let server = Server::start(["--hide", hide.as_str()].iter().chain(server_args));
    (project, expected, compiler, server, tools)
}

#[test]
fn against_a_cluster_too_slow_to_finish_the_local_side_wins_and_teaches_the_cache() {
    // One worker, every Execute held for ten minutes: only local compiles can finish.
    let (project, expected, compiler, server, _tools) =
        setup(4, &["--workers", "1", "--fault-slow", "Execute=600000"]);
    let (linked, stats) = racing_link(&project, "racing/app", &compiler, &server, &[]);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(stats.ran(), ran_only("local", 5), "{stats}");
    assert_eq!(winners(&stats), vec!["local"; 5], "{stats}");
    for job in stats.jobs() {
        // The remote side ran as long as the race, then was cancelled.
        assert!(job["race"]["remote_ms"].is_u64(), "{stats}");
    }
    assert_eq!(staged_files(project.dir()), Vec::<PathBuf>::new());
    let racing_objects = linked.native_object_contents();
    assert_eq!(racing_objects, local_objects(&project, &compiler));

    // The local winners were stored in the action cache: a relink is all hits and starts no
    // local compile (nor waits on the held Execute).
    let compiled = local_compiles(&project).len();
    let (relinked, again) = racing_link(&project, "again/app", &compiler, &server, &[]);
    assert_eq!(relinked.run_program(), expected);
    assert_eq!(again.ran(), ran_only("action-cache", 5), "{again}");
    assert_eq!(winners(&again), vec!["-"; 5], "{again}");
    assert_eq!(local_compiles(&project).len(), compiled);
}

#[test]
fn against_a_slow_local_side_the_cluster_wins_and_the_local_compiles_are_killed() {
    let (project, expected, compiler, server, _tools) = setup(4, &["--workers", "1"]);
    fs::write(project.dir().join("slow-local"), "").unwrap();
    let (linked, stats) = racing_link(&project, "racing/app", &compiler, &server, &[]);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(stats.ran(), ran_only("remote", 5), "{stats}");
    assert_eq!(winners(&stats), vec!["remote"; 5], "{stats}");
    // Every local compile that started (sleeping in the wrapper) was terminated with its group.
    let deadline = Instant::now() + Duration::from_secs(2);
    for pid in local_compiles(&project) {
        // SAFETY: signal 0 only checks whether the process exists.
        while unsafe { libc::kill(pid, 0) } == 0 {
            assert!(
                Instant::now() < deadline,
                "local compile {pid} outlived its race"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert_eq!(staged_files(project.dir()), Vec::<PathBuf>::new());
    fs::remove_file(project.dir().join("slow-local")).unwrap();
    assert_eq!(
        linked.native_object_contents(),
        local_objects(&project, &compiler)
    );
}

#[test]
fn when_the_cluster_fails_every_execution_the_link_completes_locally() {
    let (project, expected) = chain_project(4);
    let hide = project.dir().display().to_string();
    let server = Server::start(["--hide", &hide, "--fault-fail", "Execute=UNAVAILABLE:1000"]);
    let linked = project
        .link("app")
        .remote(server.url())
        .distributor_args(["--strategy=racing", "--jobs=2", "--remote-retries=1"])
        .stats_json()
        .run();
    linked.assert_success();
    assert_eq!(linked.run_program(), expected);
    let stats = linked.stats();
    assert_eq!(stats.ran(), ran_only("local", 5), "{stats}");
    assert_eq!(winners(&stats), vec!["local"; 5], "{stats}");
    assert_eq!(staged_files(project.dir()), Vec::<PathBuf>::new());
}

#[test]
fn a_cluster_that_kept_losing_still_wins_the_races_in_flight_when_it_delivers() {
    // Every Execute held for 5 s; local compiles after the eighth sleep for ten minutes. All 12
    // jobs go to the cluster at once; the one local slot wins eight races in a row, which stops
    // new jobs going to the cluster but leaves the races in flight their remote sides: the
    // cluster, a queue that starts late, delivers the other four after its hold.
    let (project, expected, compiler, server, _tools) =
        setup(11, &["--workers", "4", "--fault-slow", "Execute=5000"]);
    fs::write(project.dir().join("slow-local-after"), "8").unwrap();
    let linked = project
        .link("app")
        .compiler(&compiler, &[])
        .remote(server.url())
        .distributor_args(["--strategy=racing", "--jobs=1"])
        .stats_json()
        .run();
    linked.assert_success();
    assert_eq!(linked.run_program(), expected);
    let stats = linked.stats();
    let won = winners(&stats);
    assert_eq!(won.iter().filter(|w| *w == "local").count(), 8, "{stats}");
    assert_eq!(won.iter().filter(|w| *w == "remote").count(), 4, "{stats}");
    let degraded = stats.field("degraded");
    let reason = degraded["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("won 8 races in a row"), "{stats}");
    assert_eq!(degraded["resumed"], true, "{stats}");
    let (_, local_jobs) = switch(&stats, &linked);
    assert_eq!(local_jobs, 0, "{stats}");
    linked.assert_stderr_contains(", then back to racing");
    assert_eq!(staged_files(project.dir()), Vec::<PathBuf>::new());
}

/// The calls the server received, by RPC, from its `--stats-json` (written when it stops).
fn calls_received(server: Server, stats: &Path) -> serde_json::Value {
    drop(server);
    let served: serde_json::Value =
        serde_json::from_slice(&fs::read(stats).expect("serve --stats-json")).unwrap();
    served["calls"].clone()
}

/// Calls of `rpc` in `calls_received`'s answer.
fn count(calls: &serde_json::Value, rpc: &str) -> u64 {
    calls[rpc].as_u64().unwrap_or(0)
}

/// The link's switch to local mode (`degraded` in its stats): the reason and how many jobs went
/// straight to local compiles; checks that those are the jobs without a race.
fn switch(stats: &Stats, linked: &Linked) -> (String, usize) {
    let degraded = stats.field("degraded");
    let reason = degraded["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("no switch in {stats}"));
    let local_jobs = degraded["local_jobs"].as_u64().unwrap() as usize;
    let unraced = winners(stats).iter().filter(|w| *w == "-").count();
    assert_eq!(local_jobs, unraced, "{stats}");
    linked.assert_stderr_contains(&format!(
        "switched to local mode, {local_jobs} jobs local after it"
    ));
    (reason.to_owned(), local_jobs)
}

/// A racing link of a 12-job project, one remote job at a time (--remote-jobs=1, so that what the
/// cluster sees after the switch shows), against a server started with `faults` that hides the
/// project: the link must succeed, run correctly and compile every job locally. Returns its stats,
/// the switch's reason and local jobs, and the calls the server received.
fn link_to_switch(faults: &[&str], distributor_args: &[&str]) -> Switched {
    let (project, expected) = chain_project(11);
    let hide = project.dir().display().to_string();
    let served = tempfile::tempdir().unwrap();
    let served_stats = served.path().join("serve.json");
    let mut server_args = vec![
        "--hide",
        &hide,
        "--stats-json",
        served_stats.to_str().unwrap(),
    ];
    server_args.extend_from_slice(faults);
    let server = Server::start(server_args);
    let linked = project
        .link("app")
        .remote(server.url())
        .distributor_args(["--strategy=racing", "--jobs=2", "--remote-jobs=1"])
        .distributor_args(distributor_args.iter().copied())
        .stats_json()
        .run();
    linked.assert_success();
    assert_eq!(linked.run_program(), expected);
    let stats = linked.stats();
    assert_eq!(stats.ran(), ran_only("local", 12), "{stats}");
    let (reason, local_jobs) = switch(&stats, &linked);
    let calls = calls_received(server, &served_stats);
    Switched {
        stats,
        reason,
        local_jobs,
        calls,
        linked,
    }
}

/// What [`link_to_switch`] saw: the link's stats, the switch's reason and the jobs compiled locally
/// after it, the calls the server received per RPC, and the link itself.
struct Switched {
    stats: Stats,
    reason: String,
    local_jobs: usize,
    calls: serde_json::Value,
    linked: Linked,
}

#[test]
fn when_the_cluster_keeps_failing_the_link_switches_to_local_mode_after_three_failures() {
    // Every action-cache lookup fails, and every Execute: the lookups alone make three failures in
    // a row by the third job, whoever wins each race before.
    let faults = [
        "--fault-fail",
        "GetActionResult=UNAVAILABLE:1000000",
        "--fault-fail",
        "Execute=UNAVAILABLE:1000000",
    ];
    let switched = link_to_switch(&faults, &["--remote-retries=0"]);
    let (reason, calls) = (&switched.reason, &switched.calls);
    assert!(reason.contains("failed 3 jobs in a row"), "{reason}");
    assert!(switched.local_jobs >= 9, "{}", switched.stats);
    // The cluster heard from the first three jobs at most, and nothing after the switch.
    assert!(count(calls, "GetActionResult") <= 3, "{calls}");
    assert!(count(calls, "Execute") <= 2, "{calls}");
}

#[test]
fn when_the_cluster_keeps_losing_the_link_switches_to_local_mode_after_eight_races() {
    // Every Execute held for ten minutes: the local side wins every race; after 2 x --jobs (at
    // least 8) wins in a row the rest of the link compiles locally without racing the cluster.
    let faults = ["--workers", "1", "--fault-slow", "Execute=600000"];
    let switched = link_to_switch(&faults, &[]);
    let (stats, reason, calls) = (&switched.stats, &switched.reason, &switched.calls);
    assert!(reason.contains("won 8 races in a row"), "{reason}");
    assert_eq!(switched.local_jobs, 4, "{stats}");
    assert_eq!(winners(stats).iter().filter(|w| *w == "local").count(), 8);
    // The cluster's action cache still serves: every job looked up, every local result stored;
    // only the eight races executed.
    assert_eq!(count(calls, "GetActionResult"), 12, "{calls}");
    assert_eq!(count(calls, "UpdateActionResult"), 12, "{calls}");
    assert!(count(calls, "Execute") <= 8, "{calls}");
}

#[test]
fn a_compiler_upload_the_local_side_outran_is_reported_with_the_way_to_finish_it() {
    // Every ByteStream write held (the compiler's is one; the small inputs go in batches): each
    // race's remote side waits on the compiler's upload until the local side wins.
    let faults = ["--fault-slow", "ByteStream.Write=600000"];
    let switched = link_to_switch(&faults, &[]);
    let (stats, reason, calls) = (&switched.stats, &switched.reason, &switched.calls);
    assert!(reason.contains("won 8 races in a row"), "{reason}");
    assert_eq!(count(calls, "Execute"), 0, "{calls}");
    assert_eq!(stats.field("toolchain")["bytes_uploaded"], 0, "{stats}");
    let linked = &switched.linked;
    linked.assert_stderr_contains(
        "the cluster lacks the compiler, and its upload did not finish before the link did",
    );
    linked.assert_stderr_contains("`dtlto-reapi check --compiler=");
    // The check runs the compiler as the link's compiles do: with the arguments lld prepends.
    let prepend = &common::toolchain().compiler_prepend;
    if !prepend.is_empty() {
        linked.assert_stderr_contains(&format!(" --compiler-prepend-arg={prepend}`"));
    }
}
