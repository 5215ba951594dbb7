//! The bitcode module against real index shards: C files compiled by the project's clang, linked by lld
//! with DTLTO and `--save-temps` (which keeps the job file, the shards, the native objects and the
//! archive members lld extracts), with a serial distributor written into the test's directory.
//!
//! Each shard must read back as the modules its job names, match those modules by hash, canonicalize
//! to a form that depends on the new names only (the same objects linked under other paths give the
//! same bytes), and — with its modules copied to new names and the shard canonicalized to match — make
//! the backend compile produce the very native object lld's own job produced.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::Path;
use std::process::Command;

use common::{Project, TARGET, run_ok, toolchain};
use dtlto_reapi::bitcode::{ModuleEntry, canonicalize_shard, module_hash, shard_modules};
use serde_json::Value;
use sha2::{Digest, Sha256};

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

/// Links `inputs` in `dir` to `output` with DTLTO through [`DISTRIBUTOR`], keeping every temporary
/// file (lld writes them beside `output`); returns the link's failure message if it failed, and the job
/// file lld wrote.
fn dtlto_link(dir: &Path, inputs: &[&str], output: &str) -> (Result<(), String>, Value) {
    let tc = toolchain();
    let output_dir = dir.join(output).parent().unwrap().to_owned();
    fs::create_dir_all(&output_dir).unwrap();
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
            .args(["-o", output, "-Wl,--save-temps", "-ffat-lto-objects"])
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
    let job_file = fs::read_dir(output_dir)
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

/// Copies the job's modules into `work` under the names `name` gives their files, canonicalizes the
/// shard to match, runs the backend compile there exactly as lld's job file says (but for the names),
/// and returns the canonical shard and the native object the compile wrote.
fn compile_renamed(
    plan: &Value,
    dir: &Path,
    job: &Job,
    work: &Path,
    name: &dyn Fn(&str) -> String,
) -> (Vec<u8>, Vec<u8>) {
    fs::create_dir_all(work).unwrap();
    let shard = fs::read(dir.join(&job.shard)).unwrap();
    let entries = shard_modules(&shard).unwrap();
    let files = match_by_hash(dir, job, &entries);
    for file in &files {
        fs::copy(dir.join(file), work.join(name(file))).unwrap();
    }
    let mut file_of = files.iter();
    let canonical =
        canonicalize_shard(&shard, |_| name(file_of.next().unwrap()).into_bytes()).unwrap();
    // The entries, renamed and renumbered in the order of their new names.
    let mut want: Vec<ModuleEntry> = entries
        .iter()
        .zip(&files)
        .map(|(entry, file)| ModuleEntry {
            path: name(file).into_bytes(),
            ..entry.clone()
        })
        .collect();
    want.sort_by(|a, b| a.path.cmp(&b.path));
    for (id, entry) in want.iter_mut().enumerate() {
        entry.id = id as u64;
    }
    assert_eq!(
        shard_modules(&canonical).unwrap(),
        want,
        "canonical {} reads back with the new paths, in their order",
        job.shard
    );
    fs::write(work.join("index.bc"), &canonical).unwrap();

    let args = strings(&plan["common"]["args"]);
    run_ok(
        Command::new(&args[0])
            .current_dir(work)
            .args(&args[1..])
            .arg(name(&job.modules[0]))
            .args(["-fthinlto-index=index.bc", "-o", "out.o"]),
    );
    (canonical, fs::read(work.join("out.o")).unwrap())
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

    let (linked, plan) = dtlto_link(dir, &["main.o", "two.o", "libthree.a"], "app");
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

        // (a) A canonical shard is left as it is by canonicalizing it again, and renaming away and
        // back gives it again.
        let canonical = canonicalize_shard(&shard, |e| e.path.clone()).unwrap();
        assert_eq!(
            canonicalize_shard(&canonical, |e| e.path.clone()).unwrap(),
            canonical
        );
        // Names in the reverse order, so that the modules are renumbered on the way.
        let away_name = |e: &ModuleEntry| format!("some/other/dir/{}.bc", 9 - e.id).into_bytes();
        let away = canonicalize_shard(&shard, away_name).unwrap();
        let original: HashMap<Vec<u8>, Vec<u8>> = entries
            .iter()
            .map(|e| (away_name(e), e.path.clone()))
            .collect();
        let back = canonicalize_shard(&away, |e| original[&e.path].clone()).unwrap();
        assert_eq!(back, canonical, "{}: renamed and back", job.shard);

        // (d, e) Renamed modules and a rewritten shard compile to the same native object.
        let by_place = |file: &str| {
            let place = job.modules.iter().position(|m| m == file).unwrap();
            format!("m{place}.o")
        };
        let work = dir.join(format!("renamed{n}"));
        let (_, object) = compile_renamed(&plan, dir, job, &work, &by_place);
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

    let (linked, plan) = dtlto_link(dir, &["main.o", "\u{3b1}.o"], "app");
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
        let ascii =
            |file: &str| format!("m{}.o", job.modules.iter().position(|m| m == file).unwrap());
        let work = dir.join(format!("renamed{n}"));
        fs::write(&object, compile_renamed(&plan, dir, job, &work, &ascii).1).unwrap();
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

/// The name a distributor gives a module: the SHA-256 of its content.
fn content_name(dir: &Path) -> impl Fn(&str) -> String {
    move |file: &str| {
        format!(
            "{}.o",
            hex::encode(Sha256::digest(fs::read(dir.join(file)).unwrap()))
        )
    }
}

/// The same objects linked twice, with the outputs (and so the archive member lld extracts) in `one/`
/// and `two/`: lld numbers the modules differently (`one/...` sorts before `src (1)/...`, `two/...`
/// after), yet each job's shard, renamed by content and canonicalized, comes out byte for byte the
/// same, and the backend compile with it gives lld's own native object.
#[test]
fn the_same_objects_linked_under_other_paths_give_the_same_canonical_shards() {
    let mut project = Project::new();
    project.add_sources([
        (
            "src (1)/mod0.c",
            "int f1(int); extern int g;\nint main(int argc, char **argv) { return f1(argc) + g; }\n",
        ),
        (
            "src (1)/mod1.c",
            "int f2(int); int f3(int); extern int g;\n\
             static int local(int x) { return x + g; }\n\
             int f1(int x) { return local(f2(x)) + f3(x); }\n",
        ),
    ]);
    project.add_archive(
        "src (1)/libchain (x).a",
        [(
            "src (1)/mod2.c",
            "int g = 7;\nint f2(int x) { return x * g; }\n\
             int f3(int) __attribute__((alias(\"f2\")));\n",
        )],
    );
    let dir = project.dir();
    let inputs: Vec<String> = project
        .inputs()
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let links: Vec<(Value, Vec<Job>)> = ["one/app", "two/app"]
        .iter()
        .map(|output| {
            let (linked, plan) = dtlto_link(dir, &inputs, output);
            linked.expect("the DTLTO link succeeds");
            let status = Command::new(dir.join(output)).status().unwrap();
            assert_eq!(status.code(), Some(28), "app returns (1*7 + 7) + 1*7 + 7");
            let jobs = jobs(&plan);
            (plan, jobs)
        })
        .collect();
    let name = content_name(dir);
    let mut reordered = 0;
    for (n, job) in links[0].1.iter().enumerate() {
        let other = links[1]
            .1
            .iter()
            .find(|other| name(&other.modules[0]) == name(&job.modules[0]))
            .expect("both links have a job for each module");
        let order = |job: &Job| -> Vec<String> {
            let entries = shard_modules(&fs::read(dir.join(&job.shard)).unwrap()).unwrap();
            match_by_hash(dir, job, &entries)
                .iter()
                .map(|f| name(f))
                .collect()
        };
        if order(job) != order(other) {
            reordered += 1;
        }
        let (one, object) =
            compile_renamed(&links[0].0, dir, job, &dir.join(format!("one-{n}")), &name);
        let (two, _) = compile_renamed(
            &links[1].0,
            dir,
            other,
            &dir.join(format!("two-{n}")),
            &name,
        );
        assert!(
            one == two,
            "{} and {}: canonical shards differ",
            job.shard,
            other.shard
        );
        assert!(
            object == fs::read(dir.join(&job.output)).unwrap(),
            "{}: native object differs",
            job.output
        );
    }
    assert!(
        reordered > 0,
        "lld numbered the modules of some job differently in the two links"
    );
}
