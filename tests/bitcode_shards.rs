//! The bitcode module against real index shards: C files compiled by the project's clang, linked by lld
//! with DTLTO and `--save-temps` (which keeps the job file, the shards, the native objects and the
//! archive members lld extracts), with a serial distributor written into the test's directory.
//!
//! Each shard must read back as the modules its job names, match those modules by hash, survive
//! rewriting byte for byte, and — with its modules copied to new names and its paths rewritten to
//! match — make the backend compile produce the very native object lld's own job produced.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::process::Command;

use common::{TARGET, run_ok, toolchain};
use dtlto_reapi::bitcode::{ModuleEntry, module_hash, rewrite_shard_paths, shard_modules};
use serde_json::Value;

mod common;

const DISTRIBUTOR: &str = r#"#!/usr/bin/env python3
# Runs every job of lld's DTLTO job file (the last argument) one after the other.
import json, subprocess, sys
plan = json.load(open(sys.argv[-1], encoding="utf-8"))
failed = [job for job in plan["jobs"] if subprocess.call(plan["common"]["args"] + job["args"]) != 0]
sys.exit(1 if failed else 0)
"#;

/// Compiles `name.c` (in `dir`) to `name.o` for ThinLTO, with `extra` options.
fn compile(dir: &Path, name: &str, source: &str, extra: &[&str]) {
    fs::write(dir.join(format!("{name}.c")), source).unwrap();
    run_ok(
        Command::new(&toolchain().clang)
            .current_dir(dir)
            .args([TARGET, "-O2", "-flto=thin", "-c"])
            .args(extra)
            .arg(format!("{name}.c"))
            .args(["-o", &format!("{name}.o")]),
    );
}

/// Links `inputs` in `dir` with DTLTO through [`DISTRIBUTOR`], keeping every temporary file; returns
/// the link's failure message if it failed, and the job file lld wrote.
fn dtlto_link(dir: &Path, inputs: &[&str]) -> (Result<(), String>, Value) {
    let tc = toolchain();
    let distributor = dir.join("distributor.py");
    fs::write(&distributor, DISTRIBUTOR).unwrap();
    run_ok(Command::new("chmod").arg("+x").arg(&distributor));
    let link = common::run(
        Command::new(&tc.clang)
            .current_dir(dir)
            .args([TARGET, "-O2", "-flto=thin"])
            .arg(format!("-fuse-ld={}", tc.lld.display()))
            .args(inputs)
            // Without -ffat-lto-objects, lld links a FatLTO object's native code, not its bitcode.
            .args(["-o", "app", "-Wl,--save-temps", "-ffat-lto-objects"])
            .arg(format!("-fthinlto-distributor={}", distributor.display()))
            .arg(format!(
                "-Wl,--thinlto-remote-compiler={}",
                tc.clang.display()
            )),
    );
    let linked = if link.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&link.stderr).into_owned())
    };
    let job_file = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.to_string_lossy().ends_with(".dist-file.json"))
        .expect("lld kept its job file");
    (
        linked,
        serde_json::from_slice(&fs::read(job_file).unwrap()).unwrap(),
    )
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// One backend job of lld's job file.
struct Job {
    /// `inputs[0]`, the module compiled, then `inputs[2..]`, the modules it imports from.
    modules: Vec<String>,
    shard: String,
    output: String,
}

fn jobs(plan: &Value) -> Vec<Job> {
    let jobs = plan["jobs"].as_array().unwrap();
    jobs.iter()
        .map(|job| {
            let inputs = strings(&job["inputs"]);
            let mut modules = vec![inputs[0].clone()];
            modules.extend(inputs[2..].iter().cloned());
            Job {
                modules,
                shard: inputs[1].clone(),
                output: strings(&job["outputs"])[0].clone(),
            }
        })
        .collect()
}

/// For each shard entry, the job module with its hash (the way a distributor matches them).
fn match_by_hash(dir: &Path, job: &Job, entries: &[ModuleEntry]) -> Vec<String> {
    let hashes: Vec<_> = job
        .modules
        .iter()
        .map(|module| {
            (
                module_hash(&fs::read(dir.join(module)).unwrap())
                    .unwrap()
                    .expect("a ThinLTO module has a hash"),
                module,
            )
        })
        .collect();
    entries
        .iter()
        .map(|entry| {
            let found = hashes.iter().find(|(hash, _)| entry.matches_hash(hash));
            found
                .unwrap_or_else(|| panic!("no module of {} has the hash of {entry:?}", job.shard))
                .1
                .clone()
        })
        .collect()
}

/// Copies the job's modules to `m<id>.o` in `work`, rewrites the shard to match, runs the backend compile
/// there exactly as lld's job file says (but for the names), and returns the native object it wrote.
fn compile_renamed(plan: &Value, dir: &Path, job: &Job, work: &Path) -> Vec<u8> {
    fs::create_dir_all(work).unwrap();
    let shard = fs::read(dir.join(&job.shard)).unwrap();
    let entries = shard_modules(&shard).unwrap();
    let files = match_by_hash(dir, job, &entries);
    let new_name = |entry: &ModuleEntry| format!("m{}.o", entry.id);
    for (entry, file) in entries.iter().zip(&files) {
        fs::copy(dir.join(file), work.join(new_name(entry))).unwrap();
    }
    let rewritten = rewrite_shard_paths(&shard, |entry| new_name(entry).into_bytes()).unwrap();
    let reread = shard_modules(&rewritten).unwrap();
    let want: Vec<ModuleEntry> = entries
        .iter()
        .map(|entry| ModuleEntry {
            path: new_name(entry).into_bytes(),
            ..entry.clone()
        })
        .collect();
    assert_eq!(
        reread, want,
        "rewritten {} reads back with the new paths",
        job.shard
    );
    fs::write(work.join("index.bc"), &rewritten).unwrap();

    let main = entries
        .iter()
        .zip(&files)
        .find(|(_, file)| **file == job.modules[0])
        .expect("the job's own module")
        .0;
    let args = strings(&plan["common"]["args"]);
    run_ok(
        Command::new(&args[0])
            .current_dir(work)
            .args(&args[1..])
            .arg(new_name(main))
            .args(["-fthinlto-index=index.bc", "-o", "out.o"]),
    );
    fs::read(work.join("out.o")).unwrap()
}

#[test]
fn shards_of_a_real_link_read_match_and_rewrite() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let main = "int twice(int); int thrice(int);\nint main(int argc, char **argv) { return twice(argc) + thrice(argc); }\n";
    compile(dir, "main", main, &[]);
    // A FatLTO object: its bitcode is in an ELF section.
    compile(
        dir,
        "two",
        "int twice(int x) { return 2 * x; }\n",
        &["-ffat-lto-objects"],
    );
    compile(dir, "three", "int thrice(int x) { return 3 * x; }\n", &[]);
    run_ok(
        Command::new(&toolchain().ar)
            .current_dir(dir)
            .args(["rcs", "libthree.a", "three.o"]),
    );
    assert!(fs::read(dir.join("two.o")).unwrap().starts_with(b"\x7fELF"));

    let (linked, plan) = dtlto_link(dir, &["main.o", "two.o", "libthree.a"]);
    linked.expect("the DTLTO link succeeds");
    let status = Command::new(dir.join("app")).status().unwrap();
    assert_eq!(status.code(), Some(5), "app returns 2*1 + 3*1");

    let jobs = jobs(&plan);
    assert_eq!(jobs.len(), 3);
    assert!(
        jobs.iter()
            .any(|job| job.modules[0].starts_with("libthree.a(three.o at ")),
        "an archive member"
    );
    assert!(
        jobs.iter().any(|job| job.modules.len() == 3),
        "main imports from both others"
    );
    // lld extracts a FatLTO object's bitcode to a file of its own; the ELF object has the same hash.
    let fat = jobs
        .iter()
        .find(|job| job.modules[0].starts_with("two.o."))
        .expect("a job for the FatLTO object");
    let fat_entries = shard_modules(&fs::read(dir.join(&fat.shard)).unwrap()).unwrap();
    let fat_hash = module_hash(&fs::read(dir.join("two.o")).unwrap()).unwrap();
    assert!(fat_hash.is_some());
    assert_eq!(
        fat_entries
            .iter()
            .find(|e| e.path.starts_with(b"two.o."))
            .unwrap()
            .hash,
        fat_hash
    );
    for (n, job) in jobs.iter().enumerate() {
        let shard = fs::read(dir.join(&job.shard)).unwrap();
        let entries = shard_modules(&shard).unwrap();

        // (b) The shard names exactly the job's modules, (c) and each one's hash is its file's.
        let paths: BTreeSet<String> = entries
            .iter()
            .map(|e| String::from_utf8(e.path.clone()).unwrap())
            .collect();
        assert_eq!(
            paths,
            job.modules.iter().cloned().collect(),
            "{}",
            job.shard
        );
        for entry in &entries {
            let file = fs::read(dir.join(String::from_utf8(entry.path.clone()).unwrap())).unwrap();
            assert_eq!(
                module_hash(&file).unwrap(),
                entry.hash,
                "{entry:?}: the hash is that of the file at its path"
            );
        }

        // (a) Rewriting to the same paths, or away and back, gives the shard byte for byte.
        assert_eq!(
            rewrite_shard_paths(&shard, |e| e.path.clone()).unwrap(),
            shard
        );
        let away = rewrite_shard_paths(&shard, |e| {
            format!("some/other/dir/{}.bc", e.id).into_bytes()
        })
        .unwrap();
        assert_ne!(away, shard);
        let back = rewrite_shard_paths(&away, |e| entries[e.id as usize].path.clone()).unwrap();
        assert_eq!(back, shard, "{}: renamed and back", job.shard);

        // (d, e) Renamed modules and a rewritten shard compile to the same native object.
        let object = compile_renamed(&plan, dir, job, &dir.join(format!("renamed{n}")));
        assert!(
            object == fs::read(dir.join(&job.output)).unwrap(),
            "{}: native object differs",
            job.output
        );
    }
}

/// clang/lld 22.1.8 corrupt non-ASCII module paths inside shards (bytes past the first become 0xFF), so the
/// backend cannot open the module; the hash still identifies it, and rewriting the path repairs the job.
#[test]
fn non_ascii_module_paths_are_repaired_by_rewriting() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    compile(
        dir,
        "main",
        "int g(int);\nint main(int argc, char **argv) { return g(argc); }\n",
        &[],
    );
    compile(dir, "\u{3b1}", "int g(int x) { return 3 * x + 1; }\n", &[]);

    let (linked, plan) = dtlto_link(dir, &["main.o", "\u{3b1}.o"]);
    let jobs = jobs(&plan);
    let main = jobs.iter().find(|job| job.modules[0] == "main.o").unwrap();
    let entries = shard_modules(&fs::read(dir.join(&main.shard)).unwrap()).unwrap();
    let alpha = entries.iter().find(|e| e.path != b"main.o").unwrap();
    assert_ne!(
        alpha.path,
        "\u{3b1}.o".as_bytes(),
        "LLVM wrote the path faithfully: the bug is fixed"
    );
    let failure = linked.expect_err("the link fails because of the corrupted path");
    assert!(failure.contains("Error loading imported file"), "{failure}");
    // The corruption reaches the first word of the hash that follows the path, but no further.
    let alpha_hash = module_hash(&fs::read(dir.join("\u{3b1}.o")).unwrap())
        .unwrap()
        .unwrap();
    assert_ne!(
        alpha.hash,
        Some(alpha_hash),
        "LLVM no longer corrupts the hash after a non-ASCII path"
    );
    assert_eq!(
        match_by_hash(dir, main, &entries),
        ["main.o", "\u{3b1}.o"].map(String::from)
    );

    // Both jobs, run under ASCII names with rewritten shards, give objects that link and run.
    let mut objects = Vec::new();
    for (n, job) in jobs.iter().enumerate() {
        let object = dir.join(format!("job{n}.o"));
        fs::write(
            &object,
            compile_renamed(&plan, dir, job, &dir.join(format!("renamed{n}"))),
        )
        .unwrap();
        objects.push(object);
    }
    run_ok(
        Command::new(&toolchain().clang)
            .arg(TARGET)
            .arg(format!("-fuse-ld={}", toolchain().lld.display()))
            .args(&objects)
            .arg("-o")
            .arg(dir.join("repaired")),
    );
    assert_eq!(
        Command::new(dir.join("repaired")).status().unwrap().code(),
        Some(4),
        "g(1) = 3*1 + 1"
    );
}
