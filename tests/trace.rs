//! `--trace FILE` on real links through `dtlto-reapi serve`: the trace of a remote link is valid
//! trace-event JSON whose spans nest on every track and cover every job, with the cluster's
//! executions on the workers' tracks; the trace of a relink served by the action cache shows
//! lookups and downloads only.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use common::{Server, Stats, chain_with_archive, ran_only};
use serde_json::Value;

/// The complete ("X") events of a trace file, after checking its shape.
fn events(path: &Path) -> Vec<Value> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let trace: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON: {e}"));
    let events = trace["traceEvents"]
        .as_array()
        .expect("a traceEvents array");
    for event in events {
        let ph = event["ph"].as_str().expect("every event has a phase");
        assert!(ph == "X" || ph == "M", "unexpected event {event}");
        assert!(event["pid"].is_u64() && event["tid"].is_u64(), "{event}");
        if ph == "X" {
            assert!(event["name"].is_string(), "{event}");
            assert!(
                event["ts"].is_i64() && event["dur"].as_i64().is_some_and(|d| d >= 0),
                "{event}"
            );
        }
    }
    events.iter().filter(|e| e["ph"] == "X").cloned().collect()
}

/// A span on a track: start, end (microseconds) and name.
type Span = (i64, i64, String);

/// Panics unless the spans of every track nest (a span that starts inside another ends inside it).
fn assert_nested(events: &[Value]) {
    let mut tracks: BTreeMap<(u64, u64), Vec<Span>> = BTreeMap::new();
    for e in events {
        let (ts, dur) = (e["ts"].as_i64().unwrap(), e["dur"].as_i64().unwrap());
        let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        let name = e["name"].as_str().unwrap().to_owned();
        tracks.entry(key).or_default().push((ts, ts + dur, name));
    }
    for (track, mut spans) in tracks {
        // Parents before their children: by start, longest first.
        spans.sort_by_key(|&(start, end, _)| (start, std::cmp::Reverse(end)));
        let mut open: Vec<Span> = Vec::new();
        for span in spans {
            while open.last().is_some_and(|top| top.1 <= span.0) {
                open.pop();
            }
            if let Some(top) = open.last() {
                assert!(
                    span.1 <= top.1,
                    "track {track:?}: {span:?} overlaps {top:?} without nesting"
                );
            }
            open.push(span);
        }
    }
}

/// The names of the spans of category `cat`.
fn names(events: &[Value], cat: &str) -> BTreeSet<String> {
    events
        .iter()
        .filter(|e| e["cat"] == cat)
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect()
}

fn modules(stats: &Stats) -> BTreeSet<String> {
    stats
        .jobs()
        .iter()
        .map(|job| job["module"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn remote_link_trace_nests_and_covers_every_job_and_a_cached_relink_only_looks_up() {
    let (project, expected) = chain_with_archive(5);
    let server = Server::start(["--hide".to_owned(), project.dir().display().to_string()]);
    let traces = project.dir().join("traces");
    fs::create_dir_all(&traces).unwrap();

    let link = |output: &str| {
        let trace = traces.join(format!("{output}.json"));
        let linked = project
            .link(output)
            .remote(server.url())
            .distributor_arg(format!("--trace={}", trace.display()))
            .stats_json()
            .run();
        assert_eq!(linked.run_program(), expected);
        (linked.stats(), events(&trace))
    };

    let (stats, first) = link("first");
    assert_eq!(stats.ran(), ran_only("remote", 6), "{stats}");
    assert_nested(&first);
    assert_eq!(
        names(&first, "job"),
        modules(&stats),
        "every job has its span"
    );
    let phases = names(&first, "phase");
    for phase in [
        "plan",
        "action-cache lookup",
        "upload",
        "remote execution",
        "download",
    ] {
        assert!(phases.contains(phase), "no {phase:?} span in {phases:?}");
    }
    // Before the jobs, connecting and hashing; after them, `finish`.
    let link_phases: BTreeSet<String> = ["connect", "hash inputs", "finish"]
        .map(str::to_owned)
        .into();
    assert_eq!(names(&first, "link"), link_phases);
    // The cluster's own account, on its workers' tracks.
    assert_eq!(names(&first, "action"), modules(&stats));
    assert!(names(&first, "cluster").contains("executing"));
    assert!(
        first
            .iter()
            .filter(|e| e["cat"] == "cluster")
            .all(|e| e["pid"] == 2)
    );

    let (stats, relink) = link("relink");
    assert_eq!(stats.ran(), ran_only("action-cache", 6), "{stats}");
    assert_nested(&relink);
    assert_eq!(names(&relink, "job"), modules(&stats));
    let phases = names(&relink, "phase");
    let expected_phases: BTreeSet<String> = ["plan", "action-cache lookup", "download"]
        .map(str::to_owned)
        .into();
    assert_eq!(
        phases, expected_phases,
        "a cached relink only looks up and downloads"
    );
    assert!(names(&relink, "action").is_empty());
}

/// A server whose metadata reports absurd timestamps (`--fault-absurd-timestamps`): the link
/// succeeds, the trace stays valid and nested, the executions whose times do not fit are left off
/// the workers' tracks, and the record shows no execute time rather than a wrapped one.
#[test]
fn absurd_server_timestamps_neither_overflow_nor_break_the_trace() {
    let (project, expected) = chain_with_archive(2);
    let server = Server::start([
        "--hide".to_owned(),
        project.dir().display().to_string(),
        "--fault-absurd-timestamps".to_owned(),
    ]);
    let trace = project.dir().join("absurd.trace.json");
    let linked = project
        .link("absurd")
        .remote(server.url())
        .distributor_arg(format!("--trace={}", trace.display()))
        .stats_json()
        .run();
    assert_eq!(linked.run_program(), expected);
    let stats = linked.stats();
    assert_eq!(stats.ran(), ran_only("remote", 3), "{stats}");
    let events = events(&trace);
    assert_nested(&events);
    assert_eq!(names(&events, "job"), modules(&stats));
    assert!(names(&events, "action").is_empty(), "{events:?}");
    for job in stats.jobs() {
        let remote = &job["remote"];
        assert!(remote.is_object(), "{job}");
        assert!(remote["execute_ms"].is_null(), "{job}");
        assert!(remote["input_fetch_ms"].is_null(), "{job}");
        assert_eq!(remote["queue_ms"], 0, "{job}");
    }
}
