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

use buildgrid::BuildGrid;
use common::{Linked, Project, Stats, big_program, chain_project, chain_with_archive, ran_only};
use dtlto_reapi::reapi::digest;

/// BuildGrid's instance for these tests.
const INSTANCE: &str = "dtlto/ci";

/// Links `project` to `output` in cache-only mode through `server`; returns the successful link
/// (temporary files kept) and its `--stats-json`.
fn cache_only_link(project: &Project, server: &BuildGrid, output: &str) -> (Linked, Stats) {
    let mut link = project
        .link(output)
        .distributor_arg("--mode=cache-only")
        .remote(server.url())
        .stats_json()
        .save_temps();
    if !server.instance_name().is_empty() {
        link = link.distributor_arg(format!("--instance-name={}", server.instance_name()));
    }
    let linked = link.run();
    linked.assert_success();
    let stats = linked.stats();
    (linked, stats)
}

/// A [`cache_only_link`] whose program must print `expected` and whose `jobs` jobs must all have
/// run in `place`.
fn checked_cache_only_link(
    project: &Project,
    server: &BuildGrid,
    output: &str,
    expected: &str,
    (place, jobs): (&str, usize),
) -> (Linked, Stats) {
    let (linked, stats) = cache_only_link(project, server, output);
    assert_eq!(linked.run_program(), expected);
    assert_eq!(
        stats.ran(),
        ran_only(place, jobs),
        "{stats}\n{}",
        linked.stderr
    );
    (linked, stats)
}

#[test]
fn cache_only_links_share_results_through_buildgrid_even_from_a_fresh_build_directory() {
    let (project, expected_output) = chain_with_archive(4);
    // Copied before the first link, so it holds nothing that link produced.
    let fresh = project.copy_elsewhere();
    let server = BuildGrid::start(INSTANCE, true);

    let (first, first_stats) =
        checked_cache_only_link(&project, &server, "one/app", &expected_output, ("local", 5));
    let objects = first.native_object_contents();
    let object_bytes: u64 = objects.iter().map(|o| o.len() as u64).sum();
    assert_eq!(objects.len(), 5);
    assert!(
        first_stats.transfers("bytes_uploaded") >= object_bytes,
        "{first_stats}"
    );
    let log = server.log();
    for action in first_stats.actions() {
        assert!(
            log.contains(&format!("Result cached for action. digest=\"{action}\"")),
            "BuildGrid stored no result for {action}:\n{log}"
        );
    }

    let (second, second_stats) = checked_cache_only_link(
        &fresh,
        &server,
        "two/app",
        &expected_output,
        ("action-cache", 5),
    );
    assert_eq!(second_stats.actions(), first_stats.actions());
    assert_eq!(second.native_object_contents(), objects);
    // Exactly the objects came down (the compiles printed nothing), and nothing went up.
    assert_eq!(
        second_stats.transfers("bytes_downloaded"),
        object_bytes,
        "{second_stats}"
    );
    assert_eq!(second_stats.transfers("bytes_uploaded"), 0);
}

#[test]
fn an_object_bigger_than_buildgrids_batch_limit_goes_through_bytestream() {
    // The native object of big.c holds all of its 12 MiB string.
    let (project, expected) = big_program(54321);
    let fresh = project.copy_elsewhere();
    let server = BuildGrid::start(INSTANCE, true);
    let batch_limit = server.capabilities().max_batch_bytes as u64;
    assert!(batch_limit <= 4 << 20, "{batch_limit}");

    let (first, first_stats) =
        checked_cache_only_link(&project, &server, "one/app", &expected, ("local", 2));
    let objects = first.native_object_contents();
    let biggest = objects
        .iter()
        .max_by_key(|o| o.len())
        .expect("native objects");
    assert!(biggest.len() as u64 > 2 * batch_limit, "{}", biggest.len());
    assert!(
        first_stats.transfers("bytes_uploaded") > biggest.len() as u64,
        "{first_stats}"
    );
    // BuildGrid's own account: the object arrived whole through ByteStream Write.
    let digest = digest::of_bytes(biggest);
    let digest = digest::display(&digest);
    let written = format!("Write request completed. digest=\"{digest}\"");
    assert!(server.log().contains(&written), "{}", server.log());

    let (second, second_stats) =
        checked_cache_only_link(&fresh, &server, "two/app", &expected, ("action-cache", 2));
    assert!(
        second_stats.transfers("bytes_downloaded") > biggest.len() as u64,
        "{second_stats}"
    );
    let read = format!("Read request completed. digest=\"{digest}\"");
    assert!(server.log().contains(&read), "{}", server.log());
    assert_eq!(second.native_object_contents(), objects);
}

#[test]
fn buildgrid_offers_a_writable_cache_but_no_execution_and_remote_mode_says_so() {
    let server = BuildGrid::start(INSTANCE, true);
    let caps = server.capabilities();
    assert!(!caps.exec_enabled, "{caps:?}");
    assert!(caps.ac_update_enabled, "{caps:?}");
    assert!(caps.supports_output_paths(), "{caps:?}");

    let (project, expected_output) = chain_project(2);
    let linked = project
        .link("remote/app")
        .remote(server.url())
        .distributor_arg(format!("--instance-name={INSTANCE}"))
        .run();
    linked
        .assert_failure()
        .assert_stderr_contains("does not offer remote execution; use --mode=cache-only");
    // The same link in cache-only mode works.
    let (linked, _) = cache_only_link(&project, &server, "cache-only/app");
    assert_eq!(linked.run_program(), expected_output);
}

#[test]
fn a_buildgrid_cache_refusing_updates_is_used_read_only_with_one_warning() {
    // The default (empty) instance name, this time.
    let server = BuildGrid::start("", false);
    assert!(!server.capabilities().ac_update_enabled);
    let (project, expected_output) = chain_project(2);
    for output in ["one/app", "two/app"] {
        // Nothing was stored, so the second link misses too.
        let (linked, stats) =
            checked_cache_only_link(&project, &server, output, &expected_output, ("local", 3));
        assert_eq!(stats.transfers("bytes_uploaded"), 0, "{stats}");
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
