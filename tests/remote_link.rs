//! Remote-mode integration tests: real C programs linked by the real clang/lld through dtlto-reapi,
//! with every backend compile executed by `dtlto-reapi serve` — a separate process speaking real
//! gRPC on loopback — that cannot see the client's build directory (`--hide`), so any leaked
//! absolute path fails as it would on a real cluster.
//!
//! Where a job ran is read from `--stats-json`: `remote` (executed by the server), `action-cache`
//! (a cache hit, nothing ran) or `local`.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Chain, Linked, Project, Server, chain, run_ok};
use serde_json::Value;

/// The chain program with a module in a static archive and names with spaces and parentheses.
fn project_with_archive(modules: usize) -> (Project, String) {
    let Chain {
        mut sources,
        expected_output,
    } = chain(modules);
    let archived = sources.remove(modules - 1);
    let mut project = Project::new();
    project
        .add_sources(
            sources
                .iter()
                .map(|(name, code)| (format!("src (1)/{name}"), code)),
        )
        .add_archive("lib dir/libchain (x).a", [(archived.0, archived.1)]);
    (project, expected_output)
}

/// A server whose actions cannot see `project`'s files.
fn hiding_server(project: &Project, extra: &[&str]) -> Server {
    let mut args = vec!["--hide".to_owned(), project.dir().display().to_string()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    Server::start(args)
}

/// Links `project` to `output` through `server` and returns the link and its `--stats-json` jobs.
fn remote_link(
    project: &Project,
    server: &Server,
    output: &str,
    extra: &[&str],
) -> (Linked, Vec<Value>) {
    let stats = project.dir().join(format!("{output}.stats.json"));
    let mut link = project
        .link(output)
        .distributor_arg(format!("--remote={}", server.url()))
        .distributor_arg(format!("--stats-json={}", stats.display()))
        .save_temps();
    for arg in extra {
        link = link.distributor_arg(arg);
    }
    let linked = link.run();
    linked.assert_success();
    (linked, stats_jobs(&stats))
}

fn stats_jobs(path: &Path) -> Vec<Value> {
    match common::read_json(path).get("jobs") {
        Some(Value::Array(jobs)) => jobs.clone(),
        other => panic!("{} has no jobs array: {other:?}", path.display()),
    }
}

/// How many jobs ran where (`remote`, `action-cache`, `local`).
fn ran(jobs: &[Value]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for job in jobs {
        let place = job["ran"].as_str().unwrap_or("?").to_owned();
        *counts.entry(place).or_insert(0) += 1;
    }
    counts
}

fn only(place: &str, n: usize) -> BTreeMap<String, usize> {
    BTreeMap::from([(place.to_owned(), n)])
}

/// The contents of the link's native objects, sorted (their names carry the linker's PID).
fn native_object_contents(linked: &Linked) -> Vec<Vec<u8>> {
    let mut contents: Vec<Vec<u8>> = linked
        .native_objects()
        .iter()
        .map(|p| fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    contents.sort();
    contents
}

/// Action digests by module name in the job (stable across layouts of the same link).
fn actions(jobs: &[Value]) -> Vec<String> {
    let mut actions: Vec<String> = jobs
        .iter()
        .map(|j| {
            j["action"]
                .as_str()
                .unwrap_or_else(|| panic!("no action in {j}"))
                .to_owned()
        })
        .collect();
    actions.sort();
    actions
}

/// Copies a project's working directory to a fresh temporary directory (another checkout).
fn copy_elsewhere(project: &Project) -> tempfile::TempDir {
    let copy = tempfile::Builder::new()
        .prefix("dtlto copy (")
        .tempdir()
        .expect("tempdir");
    run_ok(
        Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", project.dir().display()))
            .arg(copy.path()),
    );
    copy
}

#[test]
fn remote_link_runs_correctly_with_the_build_directory_hidden() {
    let (project, expected) = project_with_archive(4);
    let server = hiding_server(&project, &[]);
    let (linked, jobs) = remote_link(&project, &server, "remote/app", &[]);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(ran(&jobs), only("remote", 5), "{jobs:?}");
    assert!(jobs.iter().all(|j| j["layout"] == "canonical"), "{jobs:?}");

    let local = project.link("local/app").save_temps().run();
    assert_eq!(local.run_program(), expected);
    assert_eq!(
        native_object_contents(&linked),
        native_object_contents(&local)
    );
}

#[test]
fn relinks_hit_the_action_cache_even_for_archive_members_and_from_elsewhere() {
    let (project, expected) = project_with_archive(3);
    let server = hiding_server(&project, &[]);
    let (_, first) = remote_link(&project, &server, "one/app", &[]);
    assert_eq!(ran(&first), only("remote", 4));

    // New PIDs, new temporary names, and an archive member whose name carries the PID.
    let (relinked, second) = remote_link(&project, &server, "two/app", &[]);
    assert_eq!(relinked.run_program(), expected);
    assert_eq!(ran(&second), only("action-cache", 4), "{second:?}");
    assert_eq!(actions(&first), actions(&second));

    // The same objects from another directory, named by absolute paths.
    let copy = copy_elsewhere(&project);
    let elsewhere = Project::new();
    let inputs: Vec<PathBuf> = project
        .inputs()
        .iter()
        .map(|p| copy.path().join(p))
        .collect();
    let stats = elsewhere.dir().join("stats.json");
    let linked = elsewhere
        .link("app")
        .inputs(inputs)
        .distributor_arg(format!("--remote={}", server.url()))
        .distributor_arg(format!("--stats-json={}", stats.display()))
        .run();
    assert_eq!(linked.run_program(), expected);
    assert_eq!(ran(&stats_jobs(&stats)), only("action-cache", 4));
}

#[test]
fn modules_named_by_absolute_paths_outside_the_working_directory_build_remotely() {
    let Chain {
        sources,
        expected_output,
    } = chain(3);
    let objects = Project::new();
    let absolute: Vec<PathBuf> = sources
        .iter()
        .map(|(name, code)| objects.dir().join(objects.compile(name, code)))
        .collect();
    let project = Project::new();
    let server = Server::start([
        "--hide".to_owned(),
        objects.dir().display().to_string(),
        "--hide".to_owned(),
        project.dir().display().to_string(),
    ]);
    let stats = project.dir().join("stats.json");
    let linked = project
        .link("app")
        .inputs(absolute.clone())
        .distributor_arg(format!("--remote={}", server.url()))
        .distributor_arg(format!("--stats-json={}", stats.display()))
        .run();
    assert_eq!(linked.run_program(), expected_output);
    assert_eq!(ran(&stats_jobs(&stats)), only("remote", 4));

    // The mirror layout cannot express them: those jobs run locally, with one warning.
    let stats = project.dir().join("mirror.json");
    let linked = project
        .link("mirror/app")
        .inputs(absolute)
        .distributor_arg(format!("--remote={}", server.url()))
        .distributor_arg("--layout=mirror")
        .distributor_arg(format!("--stats-json={}", stats.display()))
        .run();
    assert_eq!(linked.run_program(), expected_output);
    assert_eq!(ran(&stats_jobs(&stats)), only("local", 4));
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
    assert_eq!(ran(&first), only("remote", 4));
    assert!(first.iter().all(|j| j["layout"] == "mirror"), "{first:?}");
    let (_, second) = remote_link(&project, &server, "b/app", &["--layout=mirror"]);
    assert_eq!(ran(&second), only("action-cache", 4));
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
    let (linked, jobs) = remote_link(&project, &server, "remote/app", &[]);
    assert_eq!(linked.run_program(), expected_output);
    assert_eq!(ran(&jobs), only("remote", 3));
}

#[test]
fn a_remote_compile_error_fails_the_link_with_the_compilers_message() {
    let (project, _) = project_with_archive(2);
    let server = hiding_server(&project, &[]);
    let linked = project
        .link("out/app")
        .distributor_arg(format!("--remote={}", server.url()))
        .compiler_arg("-fno-such-flag-anywhere")
        .save_temps()
        .run();
    linked.assert_failure();
    assert!(
        linked.stderr.contains("-fno-such-flag-anywhere"),
        "{}",
        linked.stderr
    );
    assert!(
        linked.stderr.contains("on the cluster"),
        "{}",
        linked.stderr
    );
    assert!(
        linked.native_objects().is_empty(),
        "{:?}",
        linked.native_objects()
    );
}

#[test]
fn tiny_batches_force_bytestream_and_a_big_input_works() {
    // A module with a 12 MiB string of letters (bitcode stores them in 6 bits each): its bitcode is
    // bigger than 8 MiB.
    let big: String = (0..12 << 20)
        .map(|i: u32| char::from(b'a' + ((i.wrapping_mul(2654435761) >> 7) % 26) as u8))
        .collect();
    let mut project = Project::new();
    project.add_sources([
        ("big.c".to_owned(), format!("const char big[] = \"{big}\";\nint pick(int i) {{ return big[i]; }}\n")),
        ("main.c".to_owned(), "#include <stdio.h>\nint pick(int);\nint main(void) { printf(\"%c\\n\", pick(12345)); return 0; }\n".to_owned()),
    ]);
    let expected = format!("{}\n", big.as_bytes()[12345] as char);
    assert!(
        fs::metadata(project.dir().join("big.o"))
            .expect("big.o")
            .len()
            > 8 << 20
    );
    let server = hiding_server(&project, &["--max-batch-bytes=2048"]);
    let (linked, jobs) = remote_link(&project, &server, "out/app", &[]);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(ran(&jobs), only("remote", 2));
}

#[test]
fn cache_only_mode_shares_results_and_uses_the_same_actions_as_remote_mode() {
    let (project, expected) = project_with_archive(3);
    let server = hiding_server(&project, &[]);
    let (_, first) = remote_link(&project, &server, "one/app", &["--mode=cache-only"]);
    assert_eq!(ran(&first), only("local", 4));

    // A fresh build directory elsewhere downloads everything and compiles nothing.
    let copy = copy_elsewhere(&project);
    let elsewhere = Project::new();
    let inputs: Vec<PathBuf> = project
        .inputs()
        .iter()
        .map(|p| copy.path().join(p))
        .collect();
    let stats = elsewhere.dir().join("stats.json");
    let linked = elsewhere
        .link("app")
        .inputs(inputs)
        .distributor_arg(format!("--remote={}", server.url()))
        .distributor_arg("--mode=cache-only")
        .distributor_arg(format!("--stats-json={}", stats.display()))
        .run();
    assert_eq!(linked.run_program(), expected);
    assert_eq!(ran(&stats_jobs(&stats)), only("action-cache", 4));

    // Remote execution computes the same Action digests, so CI's remote links fill the cache that
    // developers' cache-only links read (and here, hit it).
    let (_, remote) = remote_link(&project, &server, "three/app", &[]);
    assert_eq!(actions(&remote), actions(&first));
    assert_eq!(ran(&remote), only("action-cache", 4));

    // Read-only: misses (a platform property gives new actions) compile locally and store nothing.
    let read_only = [
        "--mode=cache-only",
        "--remote-upload=false",
        "--platform=flavor=read-only",
    ];
    let (_, misses) = remote_link(&project, &server, "four/app", &read_only);
    assert_eq!(ran(&misses), only("local", 4));
    let (linked, again) = remote_link(&project, &server, "five/app", &read_only);
    assert_eq!(ran(&again), only("local", 4));
    assert_eq!(linked.run_program(), expected);
}
