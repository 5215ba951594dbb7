//! Local-mode integration tests: real multi-file C programs compiled with `-flto=thin`, linked by
//! the real clang/lld through `-fthinlto-distributor=<the built dtlto-reapi>`, and run.
//!
//! The programs make cross-module calls (so ThinLTO imports), keep one module in a static archive
//! (so lld hands over extracted members with parentheses in their names), and use spaces,
//! parentheses and Unicode in directory and output names. Module paths themselves stay ASCII:
//! clang/lld 22.1.8 corrupt non-ASCII module paths inside index shards (see `dtlto-facts.md`),
//! which no distributor can repair without rewriting the shards.

mod common;

use std::collections::BTreeSet;

use common::{Chain, Linked, Project, chain, run, toolchain, write};
use serde_json::Value;

/// Modules in the test program; the last one lives in the archive.
const MODULES: usize = 4;
/// Backend jobs of a link of that program: every module plus `main`.
const JOBS: usize = MODULES + 1;

/// The chain program with odd names: sources in a directory with spaces and parentheses, the last
/// module in a static archive with spaces and parentheses in its path, and the working directory
/// given by `subdir`. Returns the project and what the program prints.
fn odd_names_project(subdir: &str) -> (Project, String) {
    let Chain {
        mut sources,
        expected_output,
    } = chain(MODULES);
    let archived = sources.remove(MODULES - 1);
    let mut project = Project::in_subdir(subdir);
    project
        .add_sources(
            sources
                .iter()
                .map(|(name, code)| (format!("src (x) dir/{name}"), code)),
        )
        .add_archive(
            "lib dir (a)/libchain (1).a",
            [(
                format!("archived src/{} (member).c", archived.0),
                &archived.1,
            )],
        );
    (project, expected_output)
}

/// The job file's `jobs` array.
fn job_records(linked: &Linked) -> Vec<Value> {
    match linked.jobs().get("jobs") {
        Some(Value::Array(jobs)) => jobs.clone(),
        other => panic!("job file has no jobs array: {other:?}"),
    }
}

fn string_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {value}"))
}

#[test]
fn links_and_runs_a_program_with_an_archive_and_odd_names() {
    let (project, expected) = odd_names_project("wörk dïr ✓ (ü)");
    // The output's *directory* stays ASCII: lld extracts archive members beside the output, so
    // their module paths would contain it and hit the 22.1.8 non-ASCII module path bug.
    let linked = project.link("out (x)/prögrämm ✓").run();
    assert_eq!(linked.run_program(), expected);
}

#[test]
fn one_job_at_a_time_gives_the_same_native_objects_as_the_default() {
    let (project, expected) = odd_names_project("");
    let serial = project
        .link("serial/app")
        .distributor_arg("--jobs=1")
        .save_temps()
        .run();
    let parallel = project.link("parallel/app").save_temps().run();
    assert_eq!(serial.run_program(), expected);
    assert_eq!(parallel.run_program(), expected);

    // Object names contain the linker's PID, so compare the sorted contents.
    let serial_objects = serial.native_object_contents();
    assert_eq!(serial_objects.len(), JOBS);
    assert!(
        serial_objects == parallel.native_object_contents(),
        "native objects differ between --jobs=1 and the default:\n{:?}\n{:?}",
        serial.native_objects(),
        parallel.native_objects()
    );
}

#[test]
fn stats_json_has_one_record_per_job() {
    let (project, expected) = odd_names_project("");
    // The statistics go to `out/app (1).stats.json`: a path with a space and parentheses.
    let linked = project.link("out/app (1)").stats_json().save_temps().run();
    assert_eq!(linked.run_program(), expected);

    let jobs = job_records(&linked);
    assert_eq!(jobs.len(), JOBS);
    let stats = linked.stats();
    let records = stats.jobs();
    assert_eq!(records.len(), JOBS, "{stats}");
    // The distributor's own CPU time: the compiles it ran are not counted, and no more threads
    // than cores were busy.
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as u64;
    assert!(
        stats.total("cpu_ms") <= stats.total("wall_ms") * cores,
        "{stats}"
    );

    let modules = |records: &[Value]| -> BTreeSet<String> {
        records
            .iter()
            .map(|r| r.get("module").and_then(Value::as_str).map(str::to_owned))
            .map(|m| m.unwrap_or_else(|| panic!("a record without a module: {stats}")))
            .collect()
    };
    let job_modules: BTreeSet<String> = jobs
        .iter()
        .map(|j| string_at(j, "/inputs/0").to_owned())
        .collect();
    assert_eq!(modules(records), job_modules);
    assert!(
        job_modules.iter().any(|m| m.contains("libchain (1).a(")),
        "no archive member among {job_modules:?}"
    );
    for record in records {
        let module = string_at(record, "/module");
        let job = jobs
            .iter()
            .find(|j| string_at(j, "/inputs/0") == module)
            .unwrap_or_else(|| panic!("no job for {module}"));
        assert_eq!(record.get("outputs"), job.get("outputs"), "{record}");
        assert_eq!(record.get("exit_code"), Some(&Value::from(0)), "{record}");
        assert_eq!(record.get("ran"), Some(&Value::from("local")), "{record}");
        assert!(
            record.get("wall_ms").is_some_and(Value::is_number),
            "{record}"
        );
    }
}

#[test]
fn a_failing_backend_compile_fails_the_link_and_leaves_no_native_object() {
    let (project, _) = odd_names_project("");
    let linked = project
        .link("out/app")
        .compiler_arg("--no-such-flag")
        .save_temps()
        .run();
    linked
        .assert_failure()
        .assert_stderr_contains("unknown argument: '--no-such-flag'");
    assert_eq!(linked.native_objects(), Vec::<std::path::PathBuf>::new());
}

#[test]
fn a_warning_from_a_successful_compile_is_shown() {
    let (project, expected) = odd_names_project("");
    // Each backend compile gets `-O2 ... -O4`; clang warns that -O4 means -O3.
    let linked = project.link("out/app").compiler_arg("-O4").run();
    assert_eq!(linked.run_program(), expected);
    linked.assert_stderr_contains("-O4 is equivalent to -O3");
}

#[test]
fn quiet_prints_nothing_on_success() {
    let (project, expected) = odd_names_project("");
    let linked = project.link("out/app").distributor_arg("--quiet").run();
    assert_eq!(linked.run_program(), expected);
    assert_eq!(linked.stdout, "");
    assert_eq!(linked.stderr, "");
}

#[test]
fn the_summary_line_counts_the_jobs() {
    let (project, expected) = odd_names_project("");
    let linked = project.link("out/app").run();
    assert_eq!(linked.run_program(), expected);
    let count = format!("{JOBS} jobs");
    assert!(
        linked.stderr.lines().any(|line| line.contains(&count)),
        "no summary line mentioning {count:?}:\n{}",
        linked.stderr
    );
}

#[test]
fn a_missing_input_fails_with_one_line_naming_the_job_and_the_file() {
    let project = Project::new();
    let module = project.compile("m.c", "int m(void) { return 1; }\n");
    let module = module.to_string_lossy();
    let shard = "no such shard (1).thinlto.bc";
    let native = "m.native.o";
    let job_file = project.dir().join("jobs.json");
    let jobs = serde_json::json!({
        "common": {
            "linker_output": "app",
            "args": [toolchain().clang, "-c", common::TARGET, "-O2"],
            "inputs": [],
        },
        "jobs": [{
            "args": [module, format!("-fthinlto-index={shard}"), "-o", native],
            "inputs": [module, shard],
            "outputs": [native],
        }],
    });
    write(&job_file, jobs.to_string().as_bytes());

    let out = run(common::dtlto_reapi()
        .current_dir(project.dir())
        .arg(&job_file));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded:\n{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        matches!(lines.as_slice(), [line] if line.contains(module.as_ref()) && line.contains(shard)),
        "expected one line naming {module} and {shard}, got:\n{stderr}"
    );
    assert!(!project.dir().join(native).exists());
}
