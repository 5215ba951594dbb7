//! `dtlto-reapi explain OLD.json NEW.json` on real pairs of links sharing a disk cache: an edited
//! source file (the module itself, and its importers' imported module), a changed flag, a changed
//! compiler, a changed platform, and an unchanged relink, which has nothing to explain.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::{Linked, Project, chain, run_ok, toolchain};
use tempfile::TempDir;

/// The archive holding the chain's last module.
const ARCHIVE: &str = "lib dir/libchain (x).a";

/// The chain program of 3 modules, the last (`mod2.c`) in [`ARCHIVE`], with `edit` applied to it.
fn project(edit: impl Fn(String) -> String) -> Project {
    let mut sources = chain(3).sources;
    let last = sources.remove(2);
    let mut project = Project::new();
    project
        .add_sources(sources.iter().map(|(n, c)| (format!("src (1)/{n}"), c)))
        .add_archive(ARCHIVE, [(last.0, edit(last.1))]);
    project
}

/// A successful link of `project` to `output` through the disk cache `cache`, with `more` applied;
/// returns where its `--stats-json` is.
fn link(
    project: &Project,
    cache: &Path,
    output: &str,
    more: impl FnOnce(common::Link<'_>) -> common::Link<'_>,
) -> PathBuf {
    let linked: Linked = more(
        project
            .link(output)
            .distributor_arg(format!("--disk-cache={}", cache.display()))
            .stats_json(),
    )
    .run();
    linked.run_program();
    linked.stats();
    PathBuf::from(format!("{}.stats.json", linked.output.display()))
}

/// `dtlto-reapi explain OLD NEW`'s output, one line per missed job then a count.
fn explain(old: &Path, new: &Path) -> Vec<String> {
    let out = run_ok(common::dtlto_reapi().arg("explain").arg(old).arg(new));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The line about the job whose module path contains `module` (`job N (MODULE): causes`).
fn line_about<'a>(lines: &'a [String], module: &str) -> &'a str {
    lines
        .iter()
        .find(|l| {
            l.split_once("): ")
                .is_some_and(|(job, _)| job.contains(module))
        })
        .unwrap_or_else(|| panic!("no line about {module} in {lines:#?}"))
}

fn cache() -> TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn an_edited_source_is_the_module_itself_and_its_importers_imported_module() {
    let cache = cache();
    let original = project(|code| code);
    let old = link(&original, cache.path(), "old/app", |l| l);
    let edited = project(|code| code.replace("2 * x", "3 * x"));
    let new = link(&edited, cache.path(), "new/app", |l| l);
    let lines = explain(&old, &new);
    assert!(
        line_about(&lines, "mod2.o").ends_with(": the module itself changed"),
        "{lines:#?}"
    );
    assert!(
        line_about(&lines, "mod1.o")
            .contains("an imported module changed: new/libchain (x).a(mod2.o at "),
        "{lines:#?}"
    );
    assert!(
        lines.last().unwrap().ends_with("jobs missed the cache"),
        "{lines:#?}"
    );
    assert!(
        !line_about(&lines, "mod1.o").contains("itself"),
        "{lines:#?}"
    );
}

/// Links the same project twice, the second time with `change`, checks that `explain` finds
/// every job missed, and returns each job's causes.
fn causes_of_every_job(change: impl FnOnce(common::Link<'_>) -> common::Link<'_>) -> Vec<String> {
    let cache = cache();
    let project = project(|code| code);
    let old = link(&project, cache.path(), "old/app", |l| l);
    let new = link(&project, cache.path(), "new/app", change);
    let lines = explain(&old, &new);
    assert_eq!(lines.len(), 5, "every job and the count: {lines:#?}");
    assert_eq!(lines[4], "4 of 4 jobs missed the cache");
    lines[..4]
        .iter()
        .map(|line| {
            let (_, causes) = line.split_once("): ").unwrap_or_else(|| panic!("{line}"));
            causes.to_owned()
        })
        .collect()
}

/// [`causes_of_every_job`], checking that each job's cause is `cause`.
fn every_job_missed_for(change: impl FnOnce(common::Link<'_>) -> common::Link<'_>, cause: &str) {
    for causes in causes_of_every_job(change) {
        assert_eq!(causes, cause);
    }
}

#[test]
fn a_changed_flag_is_named() {
    every_job_missed_for(
        |l| l.compiler_arg("-fno-slp-vectorize"),
        "the flags: added -fno-slp-vectorize",
    );
}

#[test]
fn a_changed_compiler_is_named_by_its_content() {
    // Another build of the compiler: the same program, other bytes.
    let tools = toolchain();
    let dir = tempfile::tempdir().unwrap();
    let other = common::compiler_copy(dir.path(), b"\0another build");
    let prepend: Vec<&str> = [tools.compiler_prepend.as_str()]
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect();
    for causes in causes_of_every_job(|l| l.compiler(&other, &prepend)) {
        let (before, now) = causes
            .strip_prefix("the compiler: ")
            .and_then(|c| c.strip_suffix(" now"))
            .and_then(|c| c.split_once(" before, "))
            .unwrap_or_else(|| panic!("not (only) the compiler: {causes}"));
        assert_ne!(before, now);
    }
}

#[test]
fn a_changed_platform_is_named() {
    every_job_missed_for(
        |l| l.distributor_arg("--platform=pool=large"),
        "the platform: [] before, [pool=large] now",
    );
}

#[test]
fn an_unchanged_relink_has_nothing_to_explain() {
    let cache = cache();
    let project = project(|code| code);
    let old = link(&project, cache.path(), "old/app", |l| l);
    // Another copy, so that the archive member's temporary name changes too.
    let copy = project.copy_elsewhere();
    let new = link(&copy, cache.path(), "new/app", |l| l);
    assert_eq!(
        explain(&old, &new),
        ["every job of NEW came from a cache: nothing to explain"]
    );
    // And the first link, against nothing cached before it, explains each of its jobs.
    let lines = explain(&new, &old);
    assert_eq!(lines.last().unwrap(), "4 of 4 jobs missed the cache");
}

#[test]
fn a_file_that_is_not_stats_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    fs::write(&bad, "{\"jobs\": 3}").unwrap();
    let out = common::run(common::dtlto_reapi().arg("explain").arg(&bad).arg(&bad));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "dtlto-reapi: error: {} is not a --stats-json file",
            bad.display()
        )),
        "{stderr}"
    );
}
