//! `dtlto-reapi link` and its `<driver>-dtlto` names, with the real clang/lld: a ThinLTO link through
//! a symlink and through a copy becomes a DTLTO link, a link without ThinLTO inputs produces the same
//! program as without the wrapper, the driver's exit status and signal come through, a user's own
//! remote compiler is kept, `ld.lld` run directly gets the distributor and a compiler, gcc (Debian's
//! `cc`) linking clang's bitcode with lld gets DTLTO, `@file` response files are read to decide,
//! and a driver that is neither clang nor gcc gets nothing but one `--verbose` note.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use common::{
    Project, TARGET, Wrappers, chain_with_archive, distributor, ran_only, run, run_ok, stats_in,
    toolchain,
};

/// `program args…` in `project`'s directory with the wrappers first on PATH and every link's
/// `--stats-json` going to `stats`.
fn command(project: &Project, wrappers: &Wrappers, stats: &Path, program: &str) -> Command {
    let mut cmd = common::isolated(program);
    cmd.current_dir(project.dir())
        .env("PATH", wrappers.path())
        .env("DTLTO_REAPI_STATS_JSON", stats)
        .env_remove("DTLTO_REAPI_REMOTE");
    cmd
}

fn stats_dir(project: &Project, name: &str) -> std::path::PathBuf {
    let dir = project.dir().join(name);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

#[test]
fn thinlto_links_through_a_symlink_and_a_copy_are_dtlto_links() {
    let (project, expected) = chain_with_archive(4);
    let wrappers = Wrappers::new(&["clang"]);
    // A copy (not a symlink): lld runs the copy as the distributor.
    let copies = tempfile::tempdir().unwrap();
    fs::copy(distributor(), copies.path().join("clang-dtlto")).unwrap();

    for (name, wrapper) in [
        ("symlink", wrappers.dir().join("clang-dtlto")),
        ("copy", copies.path().join("clang-dtlto")),
    ] {
        let stats = stats_dir(&project, &format!("{name} stats"));
        let output = format!("{name}/app");
        fs::create_dir_all(project.dir().join(name)).unwrap();
        let mut cmd = common::isolated(&wrapper);
        cmd.current_dir(project.dir())
            .env("PATH", wrappers.path())
            .env("DTLTO_REAPI_STATS_JSON", &stats)
            .args([TARGET, "-O2", "-flto=thin", "-fuse-ld=lld"])
            .args(project.inputs())
            .args(["-o", &output]);
        run_ok(&mut cmd);
        let out = run_ok(&mut Command::new(project.dir().join(&output)));
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected, "{name}");
        let links = stats_in(&stats);
        assert_eq!(links.len(), 1, "{name}: one DTLTO link");
        assert_eq!(links[0].ran(), ran_only("local", 5), "{name}: {}", links[0]);
    }
}

#[test]
fn a_link_without_thinlto_inputs_is_the_same_as_without_the_wrapper() {
    let project = Project::new();
    for (source, code) in [
        ("f.c", "int f(int x) { return x * 3; }\n"),
        (
            "main.c",
            "#include <stdio.h>\nint f(int);\nint main(void) { printf(\"%d\\n\", f(14)); return 0; }\n",
        ),
    ] {
        fs::write(project.dir().join(source), code).unwrap();
        run_ok(
            Command::new(&toolchain().clang)
                .current_dir(project.dir())
                .args([TARGET, "-O2", "-c", source]),
        );
    }
    let wrappers = Wrappers::new(&["clang"]);
    let stats = stats_dir(&project, "stats");
    // -flto=thin on the link line, but native objects: lld has no backend job to hand out.
    let link = |driver: &str, output: &str| {
        let mut cmd = command(&project, &wrappers, &stats, driver);
        cmd.args([
            TARGET,
            "-O2",
            "-flto=thin",
            "-fuse-ld=lld",
            "f.o",
            "main.o",
            "-o",
            output,
        ]);
        run_ok(&mut cmd);
        fs::read(project.dir().join(output)).unwrap()
    };
    let direct = link("clang", "direct");
    let wrapped = link("clang-dtlto", "wrapped");
    assert!(direct == wrapped, "the wrapped link wrote another program");
    assert!(stats_in(&stats).is_empty(), "the distributor ran");
    let out = run_ok(&mut Command::new(project.dir().join("wrapped")));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");
}

#[test]
fn the_drivers_exit_status_and_signal_come_through() {
    let mut project = Project::new();
    project.add_source(
        "main.c",
        "int missing(void);\nint main(void) { return missing(); }\n",
    );
    let wrappers = Wrappers::new(&["clang"]);
    let stats = stats_dir(&project, "stats");
    // An undefined symbol: the same failure and message as without the wrapper.
    let link = |driver: &str| {
        let mut cmd = command(&project, &wrappers, &stats, driver);
        cmd.args([TARGET, "-flto=thin", "-fuse-ld=lld", "main.o", "-o", "app"]);
        run(&mut cmd)
    };
    let (direct, wrapped) = (link("clang"), link("clang-dtlto"));
    assert!(!direct.status.success());
    assert_eq!(wrapped.status.code(), direct.status.code());
    let stderr = String::from_utf8_lossy(&wrapped.stderr);
    assert!(stderr.contains("undefined symbol: missing"), "{stderr}");

    let status = |script: &str| {
        let mut cmd = command(&project, &wrappers, &stats, "dtlto-reapi");
        cmd.args(["link", "--", "sh", "-c", script]);
        run(&mut cmd).status
    };
    assert_eq!(status("exit 3").code(), Some(3));
    assert_eq!(status("kill -TERM $$").signal(), Some(libc::SIGTERM));

    let mut cmd = command(&project, &wrappers, &stats, "dtlto-reapi");
    let out = run(cmd.args(["link", "no-such-driver", "-o", "x"]));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "dtlto-reapi: error: link: no-such-driver not found on PATH (other than this wrapper)\n"
    );
}

/// The backend command lld wrote into the job file (`common.args`), from a `--save-temps` link.
fn backend_command(
    project: &Project,
    wrappers: &Wrappers,
    driver: &str,
    extra: &[&str],
) -> Vec<String> {
    let stats = stats_dir(project, "stats");
    let dir = project.dir().join(format!("out {}", extra.len()));
    fs::create_dir_all(&dir).unwrap();
    let mut cmd = command(project, wrappers, &stats, driver);
    cmd.args([
        TARGET,
        "-O2",
        "-flto=thin",
        "-fuse-ld=lld",
        "-Wl,--save-temps",
    ])
    .args(project.inputs())
    .arg("-o")
    .arg(dir.join("app"))
    .args(extra);
    run_ok(&mut cmd);
    let job_file = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".dist-file.json"))
        .expect("a job file");
    let jobs: serde_json::Value = serde_json::from_slice(&fs::read(job_file).unwrap()).unwrap();
    serde_json::from_value(jobs["common"]["args"].clone()).unwrap()
}

#[test]
fn the_users_remote_compiler_is_kept_and_a_multi_call_clang_is_named() {
    let (project, _) = chain_with_archive(2);
    let wrappers = Wrappers::new(&["clang"]);
    let clang = toolchain().clang.to_string_lossy().into_owned();
    let own = format!("-Wl,--thinlto-remote-compiler={clang}");
    assert_eq!(
        backend_command(&project, &wrappers, "clang-dtlto", &[&own])[0],
        clang
    );
    // The toolchain's clang is a script running a multi-call binary (zig) when it comes from the
    // ziglang package; a real clang binary is passed as it is.
    let command = backend_command(&project, &wrappers, "clang-dtlto", &[]);
    let script = fs::read(&toolchain().clang).unwrap().starts_with(b"#!");
    let exe = Path::new(&command[0])
        .file_name()
        .unwrap()
        .to_string_lossy();
    if script && !exe.contains("clang") {
        assert_eq!(command[1], "clang", "{command:?}");
    } else {
        assert_ne!(command[1], "clang", "{command:?}");
    }
}

#[test]
fn ld_lld_run_directly_gets_the_distributor_and_a_compiler() {
    let mut project = Project::new();
    project.add_sources([
        ("a.c", "int b(int);\nint a(int x) { return b(x) + 1; }\n"),
        ("b.c", "int b(int x) { return x * 2; }\n"),
    ]);
    let wrappers = Wrappers::new(&["ld.lld"]);
    let stats = stats_dir(&project, "stats");
    let mut cmd = command(&project, &wrappers, &stats, "ld.lld-dtlto");
    cmd.args(["-shared", "a.o", "b.o", "-o", "libab.so"]);
    run_ok(&mut cmd);
    let links = stats_in(&stats);
    assert_eq!(links.len(), 1);
    assert_eq!(links[0].ran(), ran_only("local", 2), "{}", links[0]);
    assert!(project.dir().join("libab.so").is_file());
}

#[test]
fn lld_own_cache_serves_a_relink_without_starting_the_distributor() {
    let (project, expected) = chain_with_archive(3);
    let wrappers = Wrappers::new(&["clang"]);
    let stats = stats_dir(&project, "stats");
    for _ in 0..2 {
        let mut cmd = command(&project, &wrappers, &stats, "clang-dtlto");
        cmd.args([TARGET, "-O2", "-flto=thin", "-fuse-ld=lld"])
            .arg("-Wl,--thinlto-cache-dir=lld cache")
            .args(project.inputs())
            .args(["-o", "app"]);
        run_ok(&mut cmd);
        let out = run_ok(&mut Command::new(project.dir().join("app")));
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    }
    // Only the first link handed jobs to the distributor.
    assert_eq!(stats_in(&stats).len(), 1);
}

/// Whether `cc` is gcc here (Debian's `cc`, and the C compiler the README asks for).
fn cc_is_gcc() -> bool {
    let out = run(Command::new("cc").arg("-v"));
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .any(|l| l.starts_with("gcc version "))
}

#[test]
fn gcc_with_lld_links_bitcode_through_dtlto() {
    assert!(cc_is_gcc(), "these tests need `cc` to be gcc (Debian: gcc)");
    let (project, expected) = chain_with_archive(3);
    let wrappers = Wrappers::new(&["cc"]);
    let stats = stats_dir(&project, "stats");
    // As a build system links with `cc`: no -flto, gcc finds ld.lld on PATH.
    let mut cmd = command(&project, &wrappers, &stats, "cc-dtlto");
    cmd.env("DTLTO_REAPI_VERBOSE", "1")
        .arg("-fuse-ld=lld")
        .args(project.inputs())
        .args(["-o", "app"]);
    let out = run_ok(&mut cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let notes: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("dtlto-reapi link: note:"))
        .collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    assert!(
        notes[0].contains("-Xlinker --thinlto-distributor=")
            && notes[0].contains("-Xlinker --thinlto-remote-compiler="),
        "{}",
        notes[0]
    );
    let run_app = run_ok(&mut Command::new(project.dir().join("app")));
    assert_eq!(String::from_utf8_lossy(&run_app.stdout), expected);
    let links = stats_in(&stats);
    assert_eq!(links.len(), 1, "one DTLTO link");
    assert_eq!(links[0].ran(), ran_only("local", 4), "{}", links[0]);
}

#[test]
fn a_response_file_holding_the_lto_options_gets_dtlto() {
    let (project, expected) = chain_with_archive(2);
    let wrappers = Wrappers::new(&["clang"]);
    let stats = stats_dir(&project, "stats");
    // The options in a response file naming another, with quoting.
    fs::write(project.dir().join("lld.rsp"), "'-fuse-ld=lld'\n").unwrap();
    fs::write(
        project.dir().join("link options.rsp"),
        format!("{TARGET} -O2 \"-flto=thin\" @lld.rsp\n"),
    )
    .unwrap();
    let mut cmd = command(&project, &wrappers, &stats, "clang-dtlto");
    cmd.arg("@link options.rsp")
        .args(project.inputs())
        .args(["-o", "app"]);
    run_ok(&mut cmd);
    let out = run_ok(&mut Command::new(project.dir().join("app")));
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    let links = stats_in(&stats);
    assert_eq!(links.len(), 1, "one DTLTO link");
    assert_eq!(links[0].ran(), ran_only("local", 3), "{}", links[0]);
}

#[test]
fn a_driver_that_is_neither_clang_nor_gcc_gets_nothing_and_one_note() {
    let project = Project::new();
    let wrappers = Wrappers::new(&[]);
    let stats = stats_dir(&project, "stats");
    // A driver that prints its arguments (`-v` too): it says nothing of clang or gcc.
    let driver = project.dir().join("fakecc");
    fs::write(&driver, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n").unwrap();
    fs::set_permissions(&driver, fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = command(&project, &wrappers, &stats, "dtlto-reapi");
    cmd.args([
        "link",
        "--verbose",
        "./fakecc",
        "-flto=thin",
        "-fuse-ld=lld",
        "a.o",
    ]);
    let out = run_ok(&mut cmd);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "-flto=thin\n-fuse-ld=lld\na.o\n"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("dtlto-reapi link: note: running ")
            && stderr.contains("without DTLTO: the driver is neither clang nor gcc"),
        "{stderr}"
    );
}
