//! The compiler travels with the action: real links whose backend compiles run on a
//! `dtlto-reapi serve` that can see neither the project nor the toolchain (`--hide`), so the
//! compiler can only come from the action's input root; and the compiler's identity in the Action
//! digest, so that results built by another compiler are never reused.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{
    Project, Server, Stats, chain_project, chain_with_archive, compiler_copy, ran_only, run_ok,
    toolchain,
};
use serde_json::json;

/// A server whose actions see neither `hidden` nor the toolchain's directories (the wrappers'
/// and the real compiler's).
fn server_hiding(hidden: &Path) -> Server {
    let tools = toolchain();
    let compiler_dir = tools
        .compiler
        .parent()
        .expect("the compiler has a directory");
    Server::start([
        "--hide".as_ref(),
        hidden.as_os_str(),
        "--hide".as_ref(),
        tools.bin.as_os_str(),
        "--hide".as_ref(),
        compiler_dir.as_os_str(),
    ])
}

#[test]
fn an_uploaded_static_compiler_links_remotely_with_the_toolchain_hidden() {
    let (project, expected) = chain_with_archive(4);
    let server = server_hiding(project.dir());
    let linked = project
        .link("remote/app")
        .remote(server.url())
        .distributor_arg("--local-fallback=false")
        .stats_json()
        .save_temps()
        .run();
    linked.assert_success();
    assert_eq!(linked.run_program(), expected);
    let stats = linked.stats();
    assert_eq!(stats.ran(), ran_only("remote", 5), "{stats}");
    let compiler_size = std::fs::metadata(&toolchain().compiler).unwrap().len();
    let uploaded = &stats.toolchain();
    assert_eq!(uploaded["mode"], "upload", "{stats}");
    assert_eq!(uploaded["bytes"], compiler_size, "{stats}");
    assert_eq!(uploaded["bytes_uploaded"], compiler_size, "{stats}");
    // The summary line counts the toolchain apart from the modules.
    linked.assert_stderr_contains(&format!(
        "{:.1} MB toolchain up",
        compiler_size as f64 / 1e6
    ));

    let local = project.link("local/app").save_temps().run();
    assert_eq!(local.run_program(), expected);
    assert_eq!(
        linked.native_object_contents(),
        local.native_object_contents()
    );

    // Another program through the same server: executed there, the compiler not sent again.
    let (other, expected) = chain_project(2);
    let again = other
        .link("app")
        .remote(server.url())
        .distributor_arg("--local-fallback=false")
        .stats_json()
        .run();
    assert_eq!(again.run_program(), expected);
    let stats = again.stats();
    assert_eq!(stats.ran(), ran_only("remote", 3), "{stats}");
    assert_eq!(stats.toolchain()["bytes_uploaded"], 0, "{stats}");
}

/// Builds, in `dir`, a dynamically linked "compiler" `bin/fakecc` whose work is done by a
/// function of its own shared library `lib/libfake.so` (found through `$ORIGIN/../lib`): it writes
/// `compiled <input> by libfake` to the file after `-o`.
fn dynamic_fake_compiler(dir: &Path) -> PathBuf {
    let tools = toolchain();
    common::write(
        &dir.join("src/fake.c"),
        b"#include <stdio.h>\n\
          int fake_compile(const char *in, const char *out) {\n\
              FILE *f = fopen(out, \"w\");\n\
              if (!f) return 2;\n\
              fprintf(f, \"compiled %s by libfake\\n\", in);\n\
              return fclose(f) != 0;\n\
          }\n",
    );
    common::write(
        &dir.join("src/main.c"),
        b"#include <string.h>\n\
          int fake_compile(const char *in, const char *out);\n\
          int main(int argc, char **argv) {\n\
              const char *in = 0, *out = 0;\n\
              for (int i = 1; i < argc; i++) {\n\
                  if (!strcmp(argv[i], \"-o\") && i + 1 < argc) out = argv[++i];\n\
                  else if (!in) in = argv[i];\n\
              }\n\
              return in && out ? fake_compile(in, out) : 1;\n\
          }\n",
    );
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let mut ld = std::ffi::OsString::from("-fuse-ld=");
    ld.push(&tools.lld);
    run_ok(
        Command::new(&tools.clang)
            .current_dir(dir)
            .args([common::TARGET, "-shared", "-fPIC", "-o", "lib/libfake.so"])
            .arg(&ld)
            .arg("src/fake.c"),
    );
    run_ok(
        Command::new(&tools.clang)
            .current_dir(dir)
            .args([common::TARGET, "-o", "bin/fakecc", "src/main.c"])
            .arg(&ld)
            .args(["-Llib", "-lfake", "-Wl,-rpath,$ORIGIN/../lib"]),
    );
    dir.join("bin/fakecc")
}

#[test]
fn a_dynamic_compiler_runs_through_its_uploaded_loader_and_libraries() {
    let project = Project::new();
    let compiler = dynamic_fake_compiler(&project.dir().join("toolchain"));
    for name in ["m.o", "m.bc"] {
        common::write(&project.dir().join(name), b"not really bitcode");
    }
    let job_file = project.dir().join("app.1.dist-file.json");
    let jobs = json!({
        "common": {"linker_output": "app", "args": [compiler], "inputs": []},
        "jobs": [{"args": ["m.o", "-o", "m.native.o"], "inputs": ["m.o", "m.bc"],
                  "outputs": ["m.native.o"]}],
    });
    common::write(&job_file, jobs.to_string().as_bytes());
    let server = server_hiding(project.dir());
    let stats_path = project.dir().join("stats.json");
    let out = run_ok(
        common::dtlto_reapi()
            .current_dir(project.dir())
            .arg(format!("--remote={}", server.url()))
            .args(["--local-fallback=false", "--verbose"])
            .arg(format!("--stats-json={}", stats_path.display()))
            .arg(&job_file),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stats = Stats::read(&stats_path);
    assert_eq!(stats.ran(), ran_only("remote", 1), "{stats}\n{stderr}");
    assert_eq!(
        std::fs::read_to_string(project.dir().join("m.native.o")).unwrap(),
        "compiled m.o by libfake\n"
    );
    let toolchain = stats.toolchain();
    assert_eq!(toolchain["mode"], "upload", "{stats}");
    // The executable, the loader, libfake and the C library at least.
    assert!(toolchain["files"].as_u64().unwrap() >= 4, "{stats}");
    assert!(stderr.contains("toolchain: upload mode"), "{stderr}");
}

/// The Action digests and where the jobs ran when `project` is linked with `compiler` (run as
/// `<compiler> clang ...`) and `extra` distributor options.
fn link_with(project: &Project, output: &str, compiler: &Path, extra: &[&str]) -> Stats {
    let linked = project
        .link(output)
        .compiler(compiler, &[toolchain().compiler_prepend.as_str()])
        .distributor_args(extra)
        .stats_json()
        .run();
    linked.assert_success();
    linked.stats()
}

/// Copies of the toolchain's compiler executable: two identical ones in different directories and
/// one with a byte appended (which still runs).
fn compiler_copies(dir: &Path) -> [PathBuf; 3] {
    [
        compiler_copy(&dir.join("a"), b""),
        compiler_copy(&dir.join("b"), b""),
        compiler_copy(&dir.join("changed"), b"\0"),
    ]
}

#[test]
fn the_action_digest_knows_the_compiler_by_content_in_the_disk_cache() {
    let (project, _) = chain_project(2);
    let copies = tempfile::tempdir().unwrap();
    let [a, b, changed] = compiler_copies(copies.path());
    let cache = tempfile::tempdir().unwrap();
    let disk_cache = format!("--disk-cache={}", cache.path().display());
    let extra = [disk_cache.as_str()];

    let first = link_with(&project, "a/app", &a, &extra);
    assert_eq!(first.ran(), ran_only("local", 3), "{first}");
    // The same compiler elsewhere: the same Actions, so disk-cache hits.
    let same = link_with(&project, "b/app", &b, &extra);
    assert_eq!(same.actions(), first.actions());
    assert_eq!(same.ran(), ran_only("disk-cache", 3), "{same}");
    // One byte more: other Actions, compiled again.
    let other = link_with(&project, "changed/app", &changed, &extra);
    assert!(
        other.actions().iter().all(|a| !first.actions().contains(a)),
        "{other}\n{first}"
    );
    assert_eq!(other.ran(), ran_only("local", 3), "{other}");
    assert_ne!(
        other.toolchain()["digest"],
        first.toolchain()["digest"],
        "{other}"
    );
}

#[test]
fn cache_only_mode_misses_after_the_compiler_changes() {
    let (project, _) = chain_project(2);
    let copies = tempfile::tempdir().unwrap();
    let [a, _, changed] = compiler_copies(copies.path());
    let server = Server::start(["--hide", &project.dir().display().to_string()]);
    let remote = format!("--remote={}", server.url());
    let extra = [remote.as_str(), "--mode=cache-only"];

    let first = link_with(&project, "a/app", &a, &extra);
    assert_eq!(first.ran(), ran_only("local", 3), "{first}");
    let hit = link_with(&project, "again/app", &a, &extra);
    assert_eq!(hit.ran(), ran_only("action-cache", 3), "{hit}");
    let other = link_with(&project, "changed/app", &changed, &extra);
    assert_eq!(other.ran(), ran_only("local", 3), "{other}");
    // Cache-only mode never uploads the compiler: nothing runs remotely.
    assert_eq!(other.toolchain()["bytes_uploaded"], 0, "{other}");
}

#[test]
fn a_wrapper_script_as_compiler_warns_once_naming_the_fix_and_links() {
    let (project, expected) = chain_with_archive(3);
    // Worker mode runs the wrapper at its path: the server must see it.
    let server = Server::start(["--hide", &project.dir().display().to_string()]);
    let linked = project
        .link("app")
        .compiler(&toolchain().clang, &[])
        .remote(server.url())
        .stats_json()
        .run();
    linked.assert_success();
    assert_eq!(linked.run_program(), expected);
    let warnings: Vec<&str> = linked
        .stderr
        .lines()
        .filter(|l| l.contains("is a script"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", linked.stderr);
    assert!(
        warnings[0].contains("--thinlto-remote-compiler=")
            && warnings[0].contains("--thinlto-remote-compiler-prepend-arg="),
        "{}",
        linked.stderr
    );
    let stats = linked.stats();
    assert_eq!(stats.toolchain()["mode"], "worker", "{stats}");
    assert_eq!(stats.ran(), ran_only("remote", 4), "{stats}");
}
