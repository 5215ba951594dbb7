//! Cache-only mode against a third-party REAPI server: BuildGrid 0.4.4 from PyPI, storage only
//! (CAS, ByteStream, action cache; no execution), started by each test on loopback. Real C programs
//! are linked by the real clang/lld through dtlto-reapi: a first link compiles locally and uploads
//! its results, a link from a fresh copy of the build directory (new PIDs, new temporary names)
//! downloads them all and compiles nothing, an object bigger than BuildGrid's batch limit travels
//! through ByteStream both ways, and the linked programs run correctly.
//!
//! The server has a two-part instance name, so every resource name dtlto-reapi builds must carry it
//! the way BuildGrid parses it. Where a job ran is read from `--stats-json`.

mod buildgrid;
mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

use buildgrid::BuildGrid;
use common::{Chain, Linked, Project, chain, run_ok};
use dtlto_reapi::reapi::digest;
use serde_json::Value;

/// BuildGrid's instance for these tests.
const INSTANCE: &str = "dtlto/ci";

/// Links `inputs` of `project` to `output` in cache-only mode through `server`; returns the
/// successful link (temporary files kept) and its `--stats-json`.
fn cache_only_link(
    project: &Project,
    inputs: &[PathBuf],
    server: &BuildGrid,
    output: &str,
) -> (Linked, Value) {
    let stats = project.dir().join(format!("{output}.stats.json"));
    let mut link = project
        .link(output)
        .inputs(inputs.to_vec())
        .distributor_arg("--mode=cache-only")
        .distributor_arg(format!("--remote={}", server.url()))
        .distributor_arg(format!("--stats-json={}", stats.display()))
        .save_temps();
    if !server.instance_name().is_empty() {
        link = link.distributor_arg(format!("--instance-name={}", server.instance_name()));
    }
    let linked = link.run();
    linked.assert_success();
    (linked, common::read_json(&stats))
}

/// How many jobs ran where (`local`, `action-cache`, `remote`).
fn ran(stats: &Value) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for job in jobs(stats) {
        let place = job["ran"].as_str().unwrap_or("?").to_owned();
        *counts.entry(place).or_insert(0) += 1;
    }
    counts
}

fn jobs(stats: &Value) -> &[Value] {
    stats["jobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no jobs array in {stats}"))
}

/// The sorted Action digests of a link's jobs.
fn actions(stats: &Value) -> Vec<&str> {
    let mut actions: Vec<&str> = jobs(stats)
        .iter()
        .map(|job| {
            job["action"]
                .as_str()
                .unwrap_or_else(|| panic!("no action in {job}"))
        })
        .collect();
    actions.sort_unstable();
    actions
}

/// A counter of `transfers` in the stats (`bytes_uploaded`, `bytes_downloaded`, ...).
fn transferred(stats: &Value, counter: &str) -> u64 {
    stats["transfers"][counter]
        .as_u64()
        .unwrap_or_else(|| panic!("no transfers.{counter} in {stats}"))
}

/// The contents of a link's native objects, sorted (their names carry lld's PID).
fn native_object_contents(linked: &Linked) -> Vec<Vec<u8>> {
    let mut contents: Vec<Vec<u8>> = linked
        .native_objects()
        .iter()
        .map(|path| fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect();
    contents.sort();
    contents
}

/// A fresh project holding a copy (`cp -a`) of `project`'s build directory: another checkout,
/// linked with the same relative paths.
fn fresh_copy(project: &Project) -> Project {
    let fresh = Project::new();
    run_ok(
        Command::new("cp")
            .arg("-a")
            .arg(project.dir().join("."))
            .arg(fresh.dir()),
    );
    fresh
}

#[test]
fn cache_only_links_share_results_through_buildgrid_even_from_a_fresh_build_directory() {
    let Chain {
        mut sources,
        expected_output,
    } = chain(4);
    let archived = sources.remove(3);
    let mut project = Project::new();
    project
        .add_sources(sources)
        .add_archive("lib/libchain.a", [archived]);
    let inputs = project.inputs().to_vec();
    // Copied before the first link, so it holds nothing that link produced.
    let fresh = fresh_copy(&project);
    let server = BuildGrid::start(INSTANCE, true);

    let (first, first_stats) = cache_only_link(&project, &inputs, &server, "one/app");
    assert_eq!(first.run_program(), expected_output);
    assert_eq!(
        ran(&first_stats),
        BTreeMap::from([("local".to_owned(), 5)]),
        "{first_stats}"
    );
    let objects = native_object_contents(&first);
    let object_bytes: u64 = objects.iter().map(|o| o.len() as u64).sum();
    assert_eq!(objects.len(), 5);
    assert!(
        transferred(&first_stats, "bytes_uploaded") >= object_bytes,
        "{first_stats}"
    );
    let log = server.log();
    for action in actions(&first_stats) {
        assert!(
            log.contains(&format!("Result cached for action. digest=\"{action}\"")),
            "BuildGrid stored no result for {action}:\n{log}"
        );
    }

    let (second, second_stats) = cache_only_link(&fresh, &inputs, &server, "two/app");
    assert_eq!(second.run_program(), expected_output);
    assert_eq!(
        ran(&second_stats),
        BTreeMap::from([("action-cache".to_owned(), 5)]),
        "{second_stats}\n{}",
        second.stderr
    );
    assert_eq!(actions(&second_stats), actions(&first_stats));
    assert_eq!(native_object_contents(&second), objects);
    // Exactly the objects came down (the compiles printed nothing), and nothing went up.
    assert_eq!(
        transferred(&second_stats, "bytes_downloaded"),
        object_bytes,
        "{second_stats}"
    );
    assert_eq!(transferred(&second_stats, "bytes_uploaded"), 0);
}

#[test]
fn an_object_bigger_than_buildgrids_batch_limit_goes_through_bytestream() {
    // A 12 MiB string of letters: the native object of big.c holds all of it.
    let big: String = (0..12 << 20)
        .map(|i: u32| char::from(b'a' + ((i.wrapping_mul(2654435761) >> 7) % 26) as u8))
        .collect();
    let mut project = Project::new();
    project.add_sources([
        ("big.c".to_owned(), format!("const char big[] = \"{big}\";\nint pick(int i) {{ return big[i]; }}\n")),
        ("main.c".to_owned(), "#include <stdio.h>\nint pick(int);\nint main(void) { printf(\"%c\\n\", pick(54321)); return 0; }\n".to_owned()),
    ]);
    let expected = format!("{}\n", char::from(big.as_bytes()[54321]));
    let inputs = project.inputs().to_vec();
    let fresh = fresh_copy(&project);
    let server = BuildGrid::start(INSTANCE, true);
    let batch_limit = server.capabilities().max_batch_bytes as u64;
    assert!(batch_limit <= 4 << 20, "{batch_limit}");

    let (first, first_stats) = cache_only_link(&project, &inputs, &server, "one/app");
    assert_eq!(first.run_program(), expected);
    assert_eq!(ran(&first_stats), BTreeMap::from([("local".to_owned(), 2)]));
    let objects = native_object_contents(&first);
    let biggest = objects
        .iter()
        .max_by_key(|o| o.len())
        .expect("native objects");
    assert!(biggest.len() as u64 > 2 * batch_limit, "{}", biggest.len());
    assert!(
        transferred(&first_stats, "bytes_uploaded") > biggest.len() as u64,
        "{first_stats}"
    );
    // BuildGrid's own account: the object arrived whole through ByteStream Write.
    let digest = digest::of_bytes(biggest);
    let digest = digest::display(&digest);
    let written = format!("Write request completed. digest=\"{digest}\"");
    assert!(server.log().contains(&written), "{}", server.log());

    let (second, second_stats) = cache_only_link(&fresh, &inputs, &server, "two/app");
    assert_eq!(second.run_program(), expected);
    assert_eq!(
        ran(&second_stats),
        BTreeMap::from([("action-cache".to_owned(), 2)]),
        "{second_stats}\n{}",
        second.stderr
    );
    assert!(
        transferred(&second_stats, "bytes_downloaded") > biggest.len() as u64,
        "{second_stats}"
    );
    let read = format!("Read request completed. digest=\"{digest}\"");
    assert!(server.log().contains(&read), "{}", server.log());
    assert_eq!(native_object_contents(&second), objects);
}

#[test]
fn buildgrid_offers_a_writable_cache_but_no_execution_and_remote_mode_says_so() {
    let server = BuildGrid::start(INSTANCE, true);
    let caps = server.capabilities();
    assert!(!caps.exec_enabled, "{caps:?}");
    assert!(caps.ac_update_enabled, "{caps:?}");
    assert!(caps.supports_output_paths(), "{caps:?}");

    let Chain {
        sources,
        expected_output,
    } = chain(2);
    let mut project = Project::new();
    project.add_sources(sources);
    let linked = project
        .link("remote/app")
        .distributor_arg(format!("--remote={}", server.url()))
        .distributor_arg(format!("--instance-name={INSTANCE}"))
        .run();
    linked.assert_failure();
    assert!(
        linked
            .stderr
            .contains("does not offer remote execution; use --mode=cache-only"),
        "{}",
        linked.stderr
    );
    // The same link in cache-only mode works.
    let inputs = project.inputs().to_vec();
    let (linked, _) = cache_only_link(&project, &inputs, &server, "cache-only/app");
    assert_eq!(linked.run_program(), expected_output);
}

#[test]
fn a_buildgrid_cache_refusing_updates_is_used_read_only_with_one_warning() {
    // The default (empty) instance name, this time.
    let server = BuildGrid::start("", false);
    assert!(!server.capabilities().ac_update_enabled);
    let Chain {
        sources,
        expected_output,
    } = chain(2);
    let mut project = Project::new();
    project.add_sources(sources);
    let inputs = project.inputs().to_vec();
    for output in ["one/app", "two/app"] {
        let (linked, stats) = cache_only_link(&project, &inputs, &server, output);
        assert_eq!(linked.run_program(), expected_output);
        // Nothing was stored, so the second link misses too.
        assert_eq!(ran(&stats), BTreeMap::from([("local".to_owned(), 3)]));
        assert_eq!(transferred(&stats, "bytes_uploaded"), 0, "{stats}");
        assert_eq!(
            linked
                .stderr
                .matches("does not accept action-cache updates")
                .count(),
            1,
            "{}",
            linked.stderr
        );
    }
}
