//! Remote-mode integration tests: real C programs linked by the real clang/lld through dtlto-reapi,
//! with every backend compile executed by `dtlto-reapi serve` — a separate process speaking real
//! gRPC on loopback — that cannot see the client's build directory (`--hide`), so any leaked
//! absolute path fails as it would on a real cluster.
//!
//! Where a job ran is read from `--stats-json`: `remote` (executed by the server), `action-cache`
//! (a cache hit, nothing ran) or `local`.

mod common;

use std::fs;

use common::{
    Chain, Linked, Project, Server, Stats, big_program, chain, chain_project, chain_with_archive,
    ran_only,
};

/// A server whose actions cannot see `project`'s files.
fn hiding_server(project: &Project, extra: &[&str]) -> Server {
    let mut args = vec!["--hide".to_owned(), project.dir().display().to_string()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    Server::start(args)
}

/// Links `project` to `output` through `server` with `extra` distributor options (temporary
/// files kept); returns the successful link and its `--stats-json`.
fn remote_link(
    project: &Project,
    server: &Server,
    output: &str,
    extra: &[&str],
) -> (Linked, Stats) {
    let linked = project
        .link(output)
        .remote(server.url())
        .distributor_args(extra)
        .stats_json()
        .save_temps()
        .run();
    linked.assert_success();
    let stats = linked.stats();
    (linked, stats)
}

/// Copies `project` to another directory and links the copy's objects, named by absolute paths,
/// from a third one through `server` with `extra` distributor options; checks that the program
/// prints `expected` and that the results of all `jobs` jobs came from the action cache.
fn assert_a_copy_links_from_the_cache_elsewhere(
    project: &Project,
    server: &Server,
    extra: &[&str],
    (expected, jobs): (&str, usize),
) {
    let copy = project.copy_elsewhere();
    let elsewhere = Project::new();
    let linked = elsewhere
        .link("app")
        .inputs(copy.absolute_inputs())
        .remote(server.url())
        .distributor_args(extra)
        .stats_json()
        .run();
    assert_eq!(linked.run_program(), expected);
    let stats = linked.stats();
    assert_eq!(stats.ran(), ran_only("action-cache", jobs), "{stats}");
}

#[test]
fn remote_link_runs_correctly_with_the_build_directory_hidden() {
    let (project, expected) = chain_with_archive(4);
    let server = hiding_server(&project, &[]);
    let (linked, stats) = remote_link(&project, &server, "remote/app", &[]);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(stats.ran(), ran_only("remote", 5), "{stats}");
    assert!(
        stats.jobs().iter().all(|j| j["layout"] == "canonical"),
        "{stats}"
    );

    let local = project.link("local/app").save_temps().run();
    assert_eq!(local.run_program(), expected);
    assert_eq!(
        linked.native_object_contents(),
        local.native_object_contents()
    );
}

#[test]
fn relinks_hit_the_action_cache_even_for_archive_members_and_from_elsewhere() {
    let (project, expected) = chain_with_archive(3);
    let server = hiding_server(&project, &[]);
    let (_, first) = remote_link(&project, &server, "one/app", &[]);
    assert_eq!(first.ran(), ran_only("remote", 4));

    // New PIDs, new temporary names, and an archive member whose name carries the PID.
    let (relinked, second) = remote_link(&project, &server, "two/app", &[]);
    assert_eq!(relinked.run_program(), expected);
    assert_eq!(second.ran(), ran_only("action-cache", 4), "{second}");
    assert_eq!(first.actions(), second.actions());

    // The same objects from another directory, named by absolute paths.
    assert_a_copy_links_from_the_cache_elsewhere(&project, &server, &[], (&expected, 4));
}

#[test]
fn modules_named_by_absolute_paths_outside_the_working_directory_build_remotely() {
    let Chain {
        sources,
        expected_output,
    } = chain(3);
    let mut objects = Project::new();
    objects.add_sources(sources);
    let project = Project::new();
    let server = Server::start([
        "--hide".to_owned(),
        objects.dir().display().to_string(),
        "--hide".to_owned(),
        project.dir().display().to_string(),
    ]);
    let linked = project
        .link("app")
        .inputs(objects.absolute_inputs())
        .remote(server.url())
        .stats_json()
        .run();
    assert_eq!(linked.run_program(), expected_output);
    assert_eq!(linked.stats().ran(), ran_only("remote", 4));

    // The mirror layout cannot express them: those jobs run locally, with one warning.
    let linked = project
        .link("mirror/app")
        .inputs(objects.absolute_inputs())
        .remote(server.url())
        .distributor_arg("--layout=mirror")
        .stats_json()
        .run();
    assert_eq!(linked.run_program(), expected_output);
    assert_eq!(linked.stats().ran(), ran_only("local", 4));
    assert_eq!(
        linked.stderr.matches("absolute path").count(),
        1,
        "{}",
        linked.stderr
    );
}

#[test]
fn mirror_layout_builds_remotely_and_relinks_of_plain_objects_hit() {
    let Chain {
        sources,
        expected_output,
    } = chain(3);
    let mut project = Project::new();
    project.add_sources(sources.iter().map(|(n, c)| (format!("sub dir/{n}"), c)));
    let server = hiding_server(&project, &[]);
    let (linked, first) = remote_link(&project, &server, "a/app", &["--layout=mirror"]);
    assert_eq!(linked.run_program(), expected_output);
    assert_eq!(first.ran(), ran_only("remote", 4));
    assert!(
        first.jobs().iter().all(|j| j["layout"] == "mirror"),
        "{first}"
    );
    let (_, second) = remote_link(&project, &server, "b/app", &["--layout=mirror"]);
    assert_eq!(second.ran(), ran_only("action-cache", 4));
}

#[test]
fn a_non_ascii_archive_member_links_although_lld_corrupts_its_path_in_the_shard() {
    let Chain {
        mut sources,
        expected_output,
    } = chain(2);
    let archived = sources.remove(1);
    let mut project = Project::new();
    project.add_sources(sources.iter().map(|(n, c)| (n.as_str(), c.as_str())));
    project.add_archive("🎁.a", [("α.c", archived.1.as_str())]);

    // The bug (dtlto-facts.md): a local backend compile cannot open the corrupted path.
    let local = project.link("local/app").run();
    local.assert_failure();

    let server = hiding_server(&project, &[]);
    let (linked, stats) = remote_link(&project, &server, "remote/app", &[]);
    assert_eq!(linked.run_program(), expected_output);
    assert_eq!(stats.ran(), ran_only("remote", 3));
}

#[test]
fn a_remote_compile_error_fails_the_link_with_the_compilers_message() {
    let (project, _) = chain_with_archive(2);
    let server = hiding_server(&project, &[]);
    let linked = project
        .link("out/app")
        .remote(server.url())
        .compiler_arg("-fno-such-flag-anywhere")
        .save_temps()
        .run();
    linked
        .assert_failure()
        .assert_stderr_contains("-fno-such-flag-anywhere")
        .assert_stderr_contains("on the cluster");
    assert!(
        linked.native_objects().is_empty(),
        "{:?}",
        linked.native_objects()
    );
}

#[test]
fn tiny_batches_force_bytestream_and_a_big_input_works() {
    let (project, expected) = big_program(12345);
    assert!(
        fs::metadata(project.dir().join("big.o"))
            .expect("big.o")
            .len()
            > 8 << 20
    );
    let server = hiding_server(&project, &["--max-batch-bytes=2048"]);
    let (linked, stats) = remote_link(&project, &server, "out/app", &[]);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(stats.ran(), ran_only("remote", 2));
}

#[test]
fn cache_only_mode_shares_results_and_uses_the_same_actions_as_remote_mode() {
    let (project, expected) = chain_with_archive(3);
    let server = hiding_server(&project, &[]);
    let (_, first) = remote_link(&project, &server, "one/app", &["--mode=cache-only"]);
    assert_eq!(first.ran(), ran_only("local", 4));

    // A fresh build directory elsewhere downloads everything and compiles nothing.
    assert_a_copy_links_from_the_cache_elsewhere(
        &project,
        &server,
        &["--mode=cache-only"],
        (&expected, 4),
    );

    // Remote execution computes the same Action digests, so CI's remote links fill the cache that
    // developers' cache-only links read (and here, hit it).
    let (_, remote) = remote_link(&project, &server, "three/app", &[]);
    assert_eq!(remote.actions(), first.actions());
    assert_eq!(remote.ran(), ran_only("action-cache", 4));

    // Read-only: misses (a platform property gives new actions) compile locally and store nothing.
    let read_only = [
        "--mode=cache-only",
        "--remote-upload=false",
        "--platform=flavor=read-only",
    ];
    let (_, misses) = remote_link(&project, &server, "four/app", &read_only);
    assert_eq!(misses.ran(), ran_only("local", 4));
    let (linked, again) = remote_link(&project, &server, "five/app", &read_only);
    assert_eq!(again.ran(), ran_only("local", 4));
    assert_eq!(linked.run_program(), expected);
}

#[test]
fn a_server_older_than_reapi_2_1_gets_output_files_and_works() {
    let (project, expected) = chain_with_archive(2);
    let old = hiding_server(&project, &["--api-minor-version=0"]);
    let (linked, stats) = remote_link(&project, &old, "old/app", &[]);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(stats.ran(), ran_only("remote", 3), "{stats}");

    // The Command differs (output_files instead of output_paths), so the Actions do too.
    let new = hiding_server(&project, &[]);
    let (_, new_stats) = remote_link(&project, &new, "new/app", &[]);
    assert_eq!(new_stats.ran(), ran_only("remote", 3), "{new_stats}");
    assert!(
        stats
            .actions()
            .iter()
            .all(|a| !new_stats.actions().contains(a)),
        "{stats} {new_stats}"
    );
}

/// Every module calls one shared module, so every job imports it and needs it in its input root
/// at the same time: it is uploaded once all the same, as is every other blob (counted by the
/// server itself), and the client's count agrees.
#[test]
fn a_blob_needed_by_many_concurrent_jobs_is_uploaded_once() {
    const USERS: usize = 16;
    let mut sources = vec![(
        "shared.c".to_owned(),
        "long shared(long x) { long s = 0; for (long i = 0; i < x; i++) s += i * i % 7; return s; }\n"
            .to_owned(),
    )];
    for i in 0..USERS {
        sources.push((
            format!("user{i}.c"),
            format!(
                "long shared(long);\nlong user{i}(long x) {{ return shared(x + {i}) + {i}; }}\n"
            ),
        ));
    }
    let declarations: String = (0..USERS)
        .map(|i| format!("long user{i}(long);\n"))
        .collect();
    let calls: String = (0..USERS).map(|i| format!(" + user{i}(10)")).collect();
    sources.push((
        "main.c".to_owned(),
        format!(
            "#include <stdio.h>\n{declarations}int main(void) {{ printf(\"%ld\\n\", 0L{calls}); return 0; }}\n"
        ),
    ));
    // shared(x) = sum of i*i % 7 for i < x; user_i(10) = shared(10 + i) + i.
    let shared = |x: i64| (0..x).map(|i| i * i % 7).sum::<i64>();
    let expected: i64 = (0..USERS as i64).map(|i| shared(10 + i) + i).sum();
    let mut project = Project::new();
    project.add_sources(sources);

    let stats_dir = tempfile::tempdir().unwrap();
    let stats_path = stats_dir.path().join("serve.json");
    let server = hiding_server(
        &project,
        &[
            "--stats-json",
            stats_path.to_str().unwrap(),
            "--workers",
            "2",
        ],
    );
    let (linked, stats) = remote_link(&project, &server, "app", &[]);
    assert_eq!(linked.run_program(), format!("{expected}\n"));
    assert_eq!(stats.ran(), ran_only("remote", USERS + 2));
    let served = served(server, &stats_path);
    let uploads = served["blob_uploads"].as_u64().unwrap();
    assert_eq!(served["distinct_blobs_uploaded"], uploads, "{served}");
    assert_eq!(stats.transfers("blobs_uploaded"), uploads, "{served}");
}

/// What `serve --stats-json` wrote at `path` once `server` stopped.
fn served(server: Server, path: &std::path::Path) -> serde_json::Value {
    drop(server);
    serde_json::from_slice(&fs::read(path).expect("serve --stats-json")).unwrap()
}

/// With the remote strategy, a link whose lookups keep missing stops asking the action cache
/// (Execute asks it itself), and a result that only Execute finds is still a hit: nothing compiles.
/// Jobs waiting for a turn to execute share their uploads: far fewer BatchUpdateBlobs than jobs.
#[test]
fn a_cold_link_stops_looking_up_and_execute_still_finds_cached_results() {
    const MODULES: usize = 60;
    let (project, expected) = chain_project(MODULES);
    let state = tempfile::tempdir().unwrap();
    let cas_dir = state.path().join("cas");
    let (cold_stats, warm_stats) = (
        state.path().join("cold.json"),
        state.path().join("warm.json"),
    );
    let args = ["--strategy=remote", "--remote-jobs=2"];
    let server_with = |stats: &std::path::Path, extra: &[&str]| {
        let mut args = vec!["--cas-dir", cas_dir.to_str().unwrap(), "--stats-json"];
        args.push(stats.to_str().unwrap());
        args.extend(extra);
        hiding_server(&project, &args)
    };

    let server = server_with(&cold_stats, &[]);
    let (linked, stats) = remote_link(&project, &server, "cold", &args);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(stats.ran(), ran_only("remote", MODULES + 1), "{stats}");
    let cold = served(server, &cold_stats);
    // 16 lookups, although 34 jobs start at once (two executions, and the 32 jobs a remote
    // link plans ahead of them): the others wait for their answers, all misses.
    assert_eq!(cold["calls"]["GetActionResult"], 16, "{cold}");
    let uploads = cold["calls"]["BatchUpdateBlobs"].as_u64().unwrap();
    assert!((1..=MODULES as u64 / 4).contains(&uploads), "{cold}");

    // Every lookup misses, but the cold link's results are in the action cache Execute consults.
    let server = server_with(
        &warm_stats,
        &["--fault-fail=GetActionResult=NOT_FOUND:1000"],
    );
    let (linked, stats) = remote_link(&project, &server, "warm", &args);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(
        stats.ran(),
        ran_only("action-cache", MODULES + 1),
        "{stats}"
    );
    let warm = served(server, &warm_stats);
    assert_eq!(warm["executions"], 0, "{warm}");
    assert!(
        warm["calls"]["GetActionResult"].as_u64().unwrap() >= 16,
        "{warm}"
    );
}

/// Against a server on this machine (a unix socket), `auto` sends blobs as they are (zstd would
/// cost CPU and save nothing); `on` compresses them all the same.
#[test]
fn a_server_on_this_machine_gets_compressed_blobs_only_when_asked() {
    let (project, expected) = chain_project(3);
    for (compression, compressed) in [("auto", false), ("on", true)] {
        // A fresh server each time, so that both links upload everything.
        let server = hiding_server(&project, &[]);
        let option = format!("--remote-compression={compression}");
        let (linked, stats) = remote_link(&project, &server, compression, &[&option]);
        assert_eq!(linked.run_program(), expected);
        let (bytes, wire) = (
            stats.transfers("bytes_uploaded"),
            stats.transfers("wire_bytes_uploaded"),
        );
        assert!(bytes > 0, "{stats}");
        assert_eq!(wire < bytes, compressed, "{compression}: {stats}");
    }
}
