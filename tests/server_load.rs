//! Many clients at once against one `dtlto-reapi serve`, as CI runs them: concurrent cold links
//! of the same project (in directories of their own, the server's actions unable to see any of
//! them) must all produce correct programs, and identical actions in flight must run once
//! (`executions` and `merged_executions` of the server's `--stats-json`). The load test prints
//! the server's peak resident memory, which it reports in the same file; memory is measured, not
//! asserted (bench/ holds the benchmarks).

mod common;

use common::{Linked, Project, Server};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// How long a batch of concurrent links may take in all before the test fails.
const LINKS_WITHIN: Duration = Duration::from_secs(900);

/// examples/sample as a test project (hash.c in the static archive, as scripts/sample-link.sh
/// builds it); returns it and what the program prints.
fn sample_project() -> (Project, String) {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sample");
    let read = |name: &str| {
        std::fs::read_to_string(sample.join(name))
            .unwrap_or_else(|e| panic!("cannot read examples/sample/{name}: {e}"))
    };
    let mut project = Project::new();
    common::write(&project.dir().join("sample.h"), read("sample.h").as_bytes());
    project.add_sources(
        ["main.c", "primes.c", "collatz.c", "checksum.c"].map(|name| (name, read(name))),
    );
    project.add_archive("libsample.a", [("hash.c", read("hash.c"))]);
    (project, read("expected-output.txt"))
}

/// Links every project at once through `server`; panics if they take longer than
/// [`LINKS_WITHIN`] in all.
fn link_all_at_once(projects: &[Project], server: &Server) -> Vec<Linked> {
    let (done, finished) = mpsc::channel();
    std::thread::scope(|scope| {
        for (i, project) in projects.iter().enumerate() {
            let done = done.clone();
            scope.spawn(move || {
                let linked = project.link("app").remote(server.url()).stats_json().run();
                // The receiver is gone only when the test already failed.
                let _ = done.send((i, linked));
            });
        }
        let mut links: Vec<Option<Linked>> = projects.iter().map(|_| None).collect();
        for _ in projects {
            let (i, linked) = finished
                .recv_timeout(LINKS_WITHIN)
                .unwrap_or_else(|_| panic!("the links took longer than {LINKS_WITHIN:?}"));
            links[i] = Some(linked);
        }
        links.into_iter().map(|l| l.expect("every link")).collect()
    })
}

/// `n` copies of the sample project, a server (with `--stats-json`) whose actions can see none of
/// them, and what the program prints.
fn copies_and_server(n: usize, stats: &Path) -> (Vec<Project>, Server, String) {
    let (project, expected) = sample_project();
    let copies: Vec<Project> = (0..n).map(|_| project.copy_elsewhere()).collect();
    let mut args = vec!["--stats-json".to_owned(), stats.display().to_string()];
    for copy in &copies {
        args.extend(["--hide".to_owned(), copy.dir().display().to_string()]);
    }
    args.extend(["--hide".to_owned(), project.dir().display().to_string()]);
    (copies, Server::start(args), expected)
}

/// Stops the server and reads its `--stats-json`.
fn server_totals(server: Server, stats: &Path) -> serde_json::Value {
    drop(server);
    let data = std::fs::read(stats).expect("the server's --stats-json");
    serde_json::from_slice(&data).expect("JSON")
}

#[test]
fn three_identical_cold_links_at_once_run_each_action_once() {
    let stats = tempfile::NamedTempFile::new().expect("tempfile");
    let (copies, server, expected) = copies_and_server(3, stats.path());
    let links = link_all_at_once(&copies, &server);
    let mut distinct = std::collections::BTreeSet::new();
    for linked in &links {
        linked.assert_success();
        assert_eq!(linked.run_program(), expected);
        distinct.extend(linked.stats().actions().into_iter().map(str::to_owned));
    }
    let totals = server_totals(server, stats.path());
    let executions = totals["executions"].as_u64().expect("executions");
    assert!(
        executions as f64 <= 1.1 * distinct.len() as f64,
        "{executions} executions for {} distinct actions: {totals}",
        distinct.len()
    );
}

#[test]
fn eight_concurrent_cold_links_are_all_correct() {
    let stats = tempfile::NamedTempFile::new().expect("tempfile");
    let (copies, server, expected) = copies_and_server(8, stats.path());
    let links = link_all_at_once(&copies, &server);
    for linked in &links {
        linked.assert_success();
        assert_eq!(linked.run_program(), expected);
    }
    let totals = server_totals(server, stats.path());
    eprintln!(
        "8 concurrent cold links of examples/sample: serve's peak RSS {:.1} MiB, {} executions, \
         {} merged: {totals}",
        totals["peak_rss_bytes"].as_u64().expect("peak_rss_bytes") as f64 / f64::from(1 << 20),
        totals["executions"],
        totals["merged_executions"]
    );
}
