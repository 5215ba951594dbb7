//! A result stored under an Action key is the computation the key describes, whatever surrounds the
//! link that stored it: the distributor's environment (clang reads `CCC_OVERRIDE_OPTIONS`) and
//! clang configuration files beside the compiler never reach a compile unless they are in the key.
//! Each test stores results in a cache-only link made in such surroundings, relinks a copy of the
//! project from another directory from the cache, and compares every object with a clean local
//! link's; and shows that the surroundings would have changed the objects.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{
    Linked, Project, Server, Stats, chain_project, compiler_copy, ran_only, run, toolchain,
};

/// Links `project` to `output` in cache-only mode against `server`, with `extra` distributor
/// options, keeping the native objects; returns the successful link and its `--stats-json`.
fn cache_only(
    project: &Project,
    server: &Server,
    output: &str,
    configure: impl FnOnce(common::Link<'_>) -> common::Link<'_>,
) -> (Linked, Stats) {
    let link = project
        .link(output)
        .remote(server.url())
        .distributor_arg("--mode=cache-only")
        .stats_json()
        .save_temps();
    let linked = configure(link).run();
    linked.assert_success();
    let stats = linked.stats();
    (linked, stats)
}

/// A clean local link of `project`: the toolchain's own compiler, the distributor in the test's
/// environment.
fn clean_local(project: &Project, output: &str, expected: &str) -> Linked {
    let linked = project.link(output).save_temps().run();
    linked.assert_success();
    assert_eq!(linked.run_program(), expected);
    linked
}

/// A script that runs the built `dtlto-reapi` with `CCC_OVERRIDE_OPTIONS=+-O0` in its
/// environment: what lld starts when the user's shell has that variable and the link does not.
fn distributor_with_override(dir: &Path) -> PathBuf {
    let script = dir.join("dtlto-reapi-O0");
    let text = format!(
        "#!/bin/sh\nCCC_OVERRIDE_OPTIONS=+-O0 exec '{}' \"$@\"\n",
        common::distributor().display()
    );
    common::write(&script, text.as_bytes());
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
fn the_distributors_environment_never_reaches_a_stored_result() {
    let (project, expected) = chain_project(4);
    let scripts = tempfile::tempdir().unwrap();
    let overriding = distributor_with_override(scripts.path());
    let server = Server::start(["--no-execution"]);

    let (stored, first) = cache_only(&project, &server, "one/app", |l| l.distributor(&overriding));
    assert_eq!(first.ran(), ran_only("local", 5), "{first}");
    let clean = clean_local(&project, "clean/app", &expected);
    assert_eq!(
        stored.native_object_contents(),
        clean.native_object_contents(),
        "the compiles of a distributor with CCC_OVERRIDE_OPTIONS set read it"
    );

    // Another checkout, a clean environment: every job hits, and every object is a clean one.
    let elsewhere = project.copy_elsewhere();
    let (relinked, second) = cache_only(&elsewhere, &server, "two/app", |l| l);
    assert_eq!(second.ran(), ran_only("action-cache", 5), "{second}");
    assert_eq!(second.actions(), first.actions());
    assert_eq!(relinked.run_program(), expected);
    assert_eq!(
        relinked.native_object_contents(),
        clean.native_object_contents()
    );

    // Passed on purpose, the variable reaches the compiles (it does change the objects: the
    // comparisons above could fail) and every key.
    let (passed, third) = cache_only(&project, &server, "three/app", |l| {
        l.distributor(&overriding)
            .distributor_arg("--pass-env=CCC_OVERRIDE_OPTIONS")
    });
    assert_eq!(third.ran(), ran_only("local", 5), "{third}");
    assert!(
        third.actions().iter().all(|a| !first.actions().contains(a)),
        "{third}"
    );
    assert_ne!(
        passed.native_object_contents(),
        clean.native_object_contents()
    );
    assert_eq!(passed.run_program(), expected);
}

/// Writes configuration files that clang reads beside `compiler` (for the triple lld passes, and
/// for any triple), holding an option that changes the code of every function.
fn configuration_beside(compiler: &Path) {
    let dir = compiler.parent().unwrap();
    for name in ["x86_64-unknown-linux-gnu-clang.cfg", "clang.cfg"] {
        common::write(&dir.join(name), b"-mllvm -align-all-functions=8\n");
    }
}

/// Compiles `module` (bitcode) to an object with `compiler` as a backend compile would, with
/// `CLANG_NO_DEFAULT_CONFIG` set to `no_config` when given; returns the object and clang's stderr
/// under `-v`.
fn backend_compile(
    compiler: &Path,
    module: &Path,
    out: &Path,
    no_config: Option<&str>,
) -> (Vec<u8>, String) {
    let mut cmd = Command::new(compiler);
    cmd.args(prepend())
        .args([
            "--target=x86_64-unknown-linux-gnu",
            "-O2",
            "-v",
            "-c",
            "-x",
            "ir",
        ])
        .arg(module)
        .arg("-o")
        .arg(out)
        .env_remove("CLANG_NO_DEFAULT_CONFIG");
    if let Some(value) = no_config {
        cmd.env("CLANG_NO_DEFAULT_CONFIG", value);
    }
    let output = run(&mut cmd);
    assert!(output.status.success(), "{cmd:?}: {output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (std::fs::read(out).unwrap(), stderr)
}

/// What lld puts before every compile's arguments for the toolchain's compiler (`clang` for zig).
fn prepend() -> Vec<String> {
    let prepend = &toolchain().compiler_prepend;
    (!prepend.is_empty())
        .then(|| prepend.clone())
        .into_iter()
        .collect()
}

#[test]
fn a_configuration_file_beside_the_compiler_never_reaches_a_stored_result() {
    let (project, expected) = chain_project(3);
    let copies = tempfile::tempdir().unwrap();
    let configured = compiler_copy(&copies.path().join("configured"), b"");
    configuration_beside(&configured);

    // clang does read those files, and they change the object.
    let module = project.dir().join("mod0.o");
    let out = copies.path().join("mod0.native.o");
    let (with_file, stderr) = backend_compile(&configured, &module, &out, None);
    assert!(
        stderr.contains(&format!(
            "Configuration file: {}",
            copies.path().join("configured").display()
        )),
        "{stderr}"
    );
    let (without, _) = backend_compile(&configured, &module, &out, Some("1"));
    assert_ne!(with_file, without);

    let server = Server::start(["--no-execution"]);
    let prepend = prepend();
    let prepend: Vec<&str> = prepend.iter().map(String::as_str).collect();
    let (stored, first) = cache_only(&project, &server, "one/app", |l| {
        l.compiler(&configured, &prepend)
    });
    assert_eq!(first.ran(), ran_only("local", 4), "{first}");
    let clean = clean_local(&project, "clean/app", &expected);
    assert_eq!(
        stored.native_object_contents(),
        clean.native_object_contents(),
        "the compiles read the configuration file beside the compiler"
    );

    // The same compiler elsewhere without the file: the same keys (the file is in no key, because
    // no compile reads it), and clean objects.
    let elsewhere = project.copy_elsewhere();
    let (relinked, second) = cache_only(&elsewhere, &server, "two/app", |l| l);
    assert_eq!(second.ran(), ran_only("action-cache", 4), "{second}");
    assert_eq!(relinked.run_program(), expected);
    assert_eq!(
        relinked.native_object_contents(),
        clean.native_object_contents()
    );
}

#[test]
fn a_file_named_by_the_compile_arguments_travels_and_is_in_the_key() {
    let (project, expected) = chain_project(2);
    let profile = project.dir().join("prof/app.prof");
    common::write(&profile, b"chain0:100:10\n 1: 10\n");
    // The workers cannot see the project: the profile reaches them as an input of the action.
    let server = Server::start(["--hide".to_owned(), project.dir().display().to_string()]);
    let link = |output: &str| {
        let linked = project
            .link(output)
            .remote(server.url())
            .distributor_arg("--local-fallback=false")
            .compiler_arg("-fprofile-sample-use=prof/app.prof")
            .stats_json()
            .run();
        linked.assert_success();
        assert_eq!(linked.run_program(), expected);
        linked.stats()
    };
    let first = link("one/app");
    assert_eq!(first.ran(), ran_only("remote", 3), "{first}");
    assert_eq!(link("two/app").actions(), first.actions());

    // Its content is in the key: another profile, other actions.
    common::write(&profile, b"chain0:900:90\n 1: 90\n");
    let changed = link("three/app");
    assert_eq!(changed.ran(), ran_only("remote", 3), "{changed}");
    assert!(
        changed
            .actions()
            .iter()
            .all(|a| !first.actions().contains(a)),
        "{changed}"
    );
}

#[test]
fn a_configuration_file_named_by_the_compile_arguments_is_never_cached() {
    let (project, expected) = chain_project(2);
    common::write(
        &project.dir().join("extra.cfg"),
        b"-mllvm -align-all-functions=8\n",
    );
    let server = Server::start(["--no-execution"]);
    for output in ["one/app", "two/app"] {
        let (linked, stats) = cache_only(&project, &server, output, |l| {
            l.compiler_arg("--config=./extra.cfg")
        });
        assert_eq!(stats.ran(), ran_only("local", 3), "{stats}");
        assert!(
            stats.jobs().iter().all(|job| job["action"].is_null()),
            "{stats}"
        );
        linked.assert_stderr_contains(
            "the backend compiles pass --config=./extra.cfg: a clang configuration file",
        );
        assert_eq!(linked.run_program(), expected);
    }
}
