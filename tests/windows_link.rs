//! Windows targets: a small Windows program (COFF, `x86_64-pc-windows-msvc`) linked by lld's COFF
//! driver, `zig lld-link`, with every ThinLTO backend compile handed to dtlto-reapi
//! (`/thinlto-distributor:`), and run under wine. Locally, remotely through `dtlto-reapi serve` with
//! the build directories hidden from its actions, and relinked from a copy of the project with every
//! job an action-cache hit.
//!
//! No Windows SDK: the program uses only kernel32 (`GetStdHandle`, `WriteFile`, `ExitProcess`), with
//! its import library made from zig's MinGW definitions (`kernel32.def.in`, preprocessed by
//! `zig clang -E`) by `zig dlltool`, and is linked with `/nodefaultlib /entry:main`.
//!
//! Wine (Debian's `wine64`, installed by `.ci/run`) is required: without it these tests fail.

mod common;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::tools::{windows_host, zig};
use common::{
    Linked, Project, Server, Stats, Wrappers, distributor, eventually, ran_only, run, run_ok,
    stats_in,
};
use tempfile::TempDir;

/// The target of every compile (clang adds the MSVC version itself).
const TARGET: &str = "--target=x86_64-pc-windows-msvc";

/// Added to every backend compile: without it, clang (by default, for MSVC targets) stamps each
/// COFF object with the time of its compile, and local and remote objects could not be compared
/// byte for byte.
const DETERMINISTIC: &str = "/thinlto-remote-compiler-arg:-mno-incremental-linker-compatible";

/// `io.c`: writes to the console through kernel32 only.
const IO: &str = r#"typedef void *HANDLE;
__declspec(dllimport) HANDLE __stdcall GetStdHandle(unsigned long which);
__declspec(dllimport) int __stdcall WriteFile(HANDLE file, const void *data, unsigned long size,
                                              unsigned long *written, void *overlapped);

void put(const char *text, unsigned long size) {
    unsigned long written;
    WriteFile(GetStdHandle((unsigned long)-11), text, size, &written, 0);
}

void put_number(long value) {
    char digits[24];
    int at = 23;
    digits[at] = '\n';
    do {
        digits[--at] = (char)('0' + value % 10);
        value /= 10;
    } while (value > 0);
    put(digits + at, 24 - at);
}
"#;

/// `main.c`: the entry point; calls into `io.c` and the archive's two members.
const MAIN: &str = r#"__declspec(dllimport) __declspec(noreturn) void __stdcall ExitProcess(unsigned int code);
void put(const char *text, unsigned long size);
void put_number(long value);
long poly(long x);
long scale(long x);

int main(void) {
    long sum = 0;
    for (long i = 1; i <= 20; i++)
        sum += poly(i) - scale(i);
    put("windows: ", 9);
    put_number(sum);
    ExitProcess(0);
}
"#;

/// `poly.c`, in the archive: calls `scale`, from the other member.
const POLY: &str = "long scale(long x);\nlong poly(long x) { return scale(x) * x + 7; }\n";

/// `scale.c`, in the archive.
const SCALE: &str = "long scale(long x) { return 3 * x + 1; }\n";

/// What the program prints: the sum of `poly(i) - scale(i)` for `i` in 1..=20.
fn expected_output() -> String {
    let scale = |x: i64| 3 * x + 1;
    let poly = |x: i64| scale(x) * x + 7;
    let sum: i64 = (1..=20).map(|i| poly(i) - scale(i)).sum();
    format!("windows: {sum}\n")
}

/// The archive, with a space and parentheses in its name; lld-link names its extracted members
/// `<archive file name><member name><offset>.<task>.<PID in hex>.o`.
const ARCHIVE: &str = "lib dir/libmath (x).lib";

/// Every backend job: `main.c`, `io.c`, and the archive's two members.
const JOBS: usize = 4;

/// The import library of kernel32, relative to the project's directory.
const KERNEL32: &str = "kernel32.lib";

/// A Windows program in a fresh project: `src (1)/main.c` and `src (1)/io.c` compiled to ThinLTO
/// bitcode, `poly.c` and `scale.c` in the archive [`ARCHIVE`], and the import library [`KERNEL32`].
fn windows_project() -> Project {
    let mut project = Project::new();
    for (source, code) in [("src (1)/main.c", MAIN), ("src (1)/io.c", IO)] {
        let object = compile(&project, source, code);
        project.add_input(object);
    }
    let members = [
        compile(&project, "math/poly.c", POLY),
        compile(&project, "math/scale.c", SCALE),
    ];
    fs::create_dir_all(project.dir().join("lib dir")).expect("lib dir");
    run_ok(
        zig_command(&project, "ar")
            .arg("rcs")
            .arg(ARCHIVE)
            .args(&members),
    );
    project.add_input(ARCHIVE);
    make_kernel32_lib(&project);
    project
}

/// `zig TOOL ...` in `project`'s directory.
fn zig_command(project: &Project, tool: &str) -> Command {
    let mut cmd = common::isolated(&zig().zig);
    cmd.current_dir(project.dir()).arg(tool);
    cmd
}

/// Writes `code` to `source` and compiles it for Windows to ThinLTO bitcode `<source minus .c>.o`.
fn compile(project: &Project, source: &str, code: &str) -> PathBuf {
    common::write(&project.dir().join(source), code.as_bytes());
    let object = Path::new(source).with_extension("o");
    run_ok(
        zig_command(project, "clang")
            .args([TARGET, "-O2", "-flto=thin", "-c", source, "-o"])
            .arg(&object),
    );
    object
}

/// `kernel32.lib` without a Windows SDK: zig's MinGW `kernel32.def.in`, preprocessed for x86-64,
/// turned into an import library by `zig dlltool`.
fn make_kernel32_lib(project: &Project) {
    let mingw = zig().lib.join("libc/mingw");
    run_ok(
        zig_command(project, "clang")
            .args([
                "-E",
                "-P",
                "-x",
                "c",
                "-D__x86_64__",
                "-Wno-extra-tokens",
                "-I",
            ])
            .arg(mingw.join("def-include"))
            .arg(mingw.join("lib-common/kernel32.def.in"))
            .args(["-o", "kernel32.def"]),
    );
    run_ok(zig_command(project, "dlltool").args([
        "-m",
        "i386:x86-64",
        "-d",
        "kernel32.def",
        "-l",
        KERNEL32,
    ]));
}

/// lld-link's options for linking the program with every backend compile through dtlto-reapi
/// (`distributor_args` for it, its `--stats-json` to `stats`), keeping the temporary files
/// (`/lldsavetemps`).
fn lld_link_options(stats: &Path, distributor_args: &[&str]) -> Vec<OsString> {
    let option = |name: &str, value: &Path| {
        let mut option = OsString::from(name);
        option.push(value);
        option
    };
    let mut options: Vec<OsString> = ["/nodefaultlib", "/entry:main", "/subsystem:console"]
        .map(OsString::from)
        .into();
    options.push(option("/thinlto-distributor:", distributor()));
    options.push(option("/thinlto-remote-compiler:", &zig().zig));
    options.push("/thinlto-remote-compiler-prepend-arg:clang".into());
    options.push(DETERMINISTIC.into());
    options.push(option("/thinlto-distributor-arg:--stats-json=", stats));
    for arg in distributor_args {
        options.push(format!("/thinlto-distributor-arg:{arg}").into());
    }
    options.push("/lldsavetemps".into());
    options
}

/// The absolute paths of `output` (relative to the project's directory; its directory is created)
/// and of the `--stats-json` beside it.
fn output_paths(project: &Project, output: &str) -> (PathBuf, PathBuf) {
    let output = project.dir().join(output);
    fs::create_dir_all(output.parent().expect("the output has a directory"))
        .expect("the output's directory");
    let stats = PathBuf::from(format!("{}.stats.json", output.display()));
    (output, stats)
}

/// Links the project to `output` (relative to its directory) with `zig lld-link` and
/// [`lld_link_options`]. It does not judge the result.
fn lld_link(project: &Project, output: &str, distributor_args: &[&str]) -> Linked {
    let (output_path, stats) = output_paths(project, output);
    let mut cmd = zig_command(project, "lld-link");
    cmd.arg(format!("/out:{output}"))
        .args(project.inputs())
        .arg(KERNEL32)
        .args(lld_link_options(&stats, distributor_args));
    let out = run(&mut cmd);
    Linked::from_run(&cmd, out, output_path, Some(stats))
}

/// Links the project like [`lld_link`], locally, but through the clang driver, which silently drops
/// `-fthinlto-distributor=` for an MSVC target: lld-link's options go through `-Wl,` (as the README
/// says). `-fuse-ld=lld` runs `lld-link` from PATH: here a wrapper around `zig lld-link`.
fn clang_driver_link(project: &Project, output: &str) -> Linked {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = path_with_lld_link(project, &path);
    let (output_path, stats) = output_paths(project, output);
    let mut cmd = zig_command(project, "clang");
    cmd.env("PATH", path)
        .args([TARGET, "-flto=thin", "-fuse-ld=lld", "-nostdlib"])
        .args(project.inputs())
        .arg(KERNEL32)
        .args(["-o", output]);
    for option in lld_link_options(&stats, &[]) {
        let mut arg = OsString::from("-Wl,");
        arg.push(option);
        cmd.arg(arg);
    }
    let out = run(&mut cmd);
    Linked::from_run(&cmd, out, output_path, Some(stats))
}

/// `path` with a directory in front holding `lld-link`, a wrapper around `zig lld-link` (what the
/// clang driver's `-fuse-ld=lld` runs for an MSVC target).
fn path_with_lld_link(project: &Project, path: &std::ffi::OsStr) -> OsString {
    let bin = project.dir().join("bin");
    let wrapper = bin.join("lld-link");
    let script = format!(
        "#!/bin/sh\nexec '{}' lld-link \"$@\"\n",
        zig().zig.display()
    );
    common::write(&wrapper, script.as_bytes());
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).expect("chmod lld-link");
    std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(path))).expect("PATH")
}

/// Wine with a fresh prefix of its own (its first start takes a few seconds), removed with it.
struct Wine {
    wine: PathBuf,
    prefix: TempDir,
}

impl Wine {
    /// Debian's `wine64` (`/usr/lib/wine/wine64`), or `wine64` or `wine` on PATH; panics naming the
    /// package when there is none: these tests need it.
    fn new() -> Wine {
        let wine =
            common::tools::system_tool(&["/usr/lib/wine/wine64", "wine64", "wine"], "wine64");
        let prefix = tempfile::Builder::new()
            .prefix("dtlto wine prefix ")
            .tempdir()
            .expect("a temporary directory for the wine prefix");
        Wine { wine, prefix }
    }

    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(&self.wine);
        cmd.arg(program)
            .env("WINEPREFIX", self.prefix.path())
            .env("WINEDEBUG", "-all")
            // No Mono or Gecko installs for .NET and HTML: the program needs neither.
            .env("WINEDLLOVERRIDES", "mscoree,mshtml=");
        cmd
    }

    /// Runs the linked program (after checking that the link succeeded) and returns its stdout;
    /// panics unless it exits 0.
    fn run_program(&self, linked: &Linked) -> String {
        linked.assert_success();
        let out = run_ok(&mut self.command(&linked.output));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Wine {
    /// Stops this prefix's wineserver (it lingers after the last program) before the prefix goes.
    fn drop(&mut self) {
        let server = self.wine.with_file_name("wineserver");
        let server = if server.is_file() {
            server
        } else {
            PathBuf::from("wineserver")
        };
        let _ = Command::new(server)
            .arg("-k")
            .env("WINEPREFIX", self.prefix.path())
            .status();
    }
}

/// A `dtlto-reapi serve` whose actions cannot see the `projects`' directories.
fn server_hiding(projects: &[&Project]) -> Server {
    Server::start(
        projects
            .iter()
            .flat_map(|p| ["--hide".to_owned(), p.dir().display().to_string()]),
    )
}

/// The job file's jobs as `(module, imported modules)`, file names only.
fn jobs_and_imports(linked: &Linked) -> BTreeMap<String, Vec<String>> {
    let name = |path: &serde_json::Value| -> String {
        let path = Path::new(path.as_str().expect("a path"));
        path.file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned()
    };
    let jobs = linked.jobs();
    let jobs = jobs["jobs"].as_array().expect("a jobs array");
    jobs.iter()
        .map(|job| {
            let inputs = job["inputs"].as_array().expect("inputs");
            (name(&inputs[0]), inputs[2..].iter().map(name).collect())
        })
        .collect()
}

#[test]
fn a_windows_program_links_through_lld_link_and_runs_under_wine() {
    let wine = Wine::new();
    let project = windows_project();
    let linked = lld_link(&project, "local/app.exe", &[]);
    assert_eq!(wine.run_program(&linked), expected_output());
    let stats = linked.stats();
    assert_eq!(stats.ran(), ran_only("local", JOBS), "{stats}");

    // The jobs lld-link asked for: the archive's members under lld-link's names (no parentheses),
    // and main.o importing from io.o and from both members, whose functions ThinLTO can inline.
    let jobs = jobs_and_imports(&linked);
    let member = |name: &str| {
        jobs.keys()
            .find(|module| module.starts_with(&format!("libmath (x).lib{name}")))
            .unwrap_or_else(|| panic!("no job for the member {name} in {jobs:?}"))
            .clone()
    };
    let (poly, scale) = (member("poly.o"), member("scale.o"));
    assert_eq!(jobs.len(), JOBS, "{jobs:?}");
    let mut main_imports = jobs["main.o"].clone();
    main_imports.sort();
    let mut expected_imports = vec!["io.o".to_owned(), poly, scale];
    expected_imports.sort();
    assert_eq!(main_imports, expected_imports, "{jobs:?}");

    // The same through the clang driver, with lld-link's options passed by -Wl,.
    let driven = clang_driver_link(&project, "driver/app.exe");
    assert_eq!(wine.run_program(&driven), expected_output());
    let stats = driven.stats();
    assert_eq!(stats.ran(), ran_only("local", JOBS), "{stats}");
    assert_eq!(
        driven.native_object_contents(),
        linked.native_object_contents()
    );
}

#[test]
fn remote_objects_equal_local_ones_and_a_copy_elsewhere_relinks_from_the_action_cache() {
    let wine = Wine::new();
    let project = windows_project();
    let copy = project.copy_elsewhere();
    // The toolchain stays visible: the actions run the same `zig` as the link.
    let server = server_hiding(&[&project, &copy]);
    let remote_arg = format!("--remote={}", server.url());

    let remote = lld_link(&project, "remote/app.exe", &[&remote_arg]);
    assert_eq!(wine.run_program(&remote), expected_output());
    let first: Stats = remote.stats();
    assert_eq!(first.ran(), ran_only("remote", JOBS), "{first}");
    assert!(
        first.jobs().iter().all(|j| j["layout"] == "canonical"),
        "{first}"
    );

    let local = lld_link(&project, "local/app.exe", &[]);
    assert_eq!(wine.run_program(&local), expected_output());
    assert_eq!(
        remote.native_object_contents(),
        local.native_object_contents()
    );

    // Another checkout: new PIDs in the members' names, another directory, the same actions.
    let relinked = lld_link(&copy, "out/app.exe", &[&remote_arg]);
    assert_eq!(wine.run_program(&relinked), expected_output());
    let second = relinked.stats();
    assert_eq!(second.ran(), ran_only("action-cache", JOBS), "{second}");
    assert_eq!(first.actions(), second.actions());
    assert_eq!(
        relinked.native_object_contents(),
        local.native_object_contents()
    );
}

#[test]
fn the_link_wrapper_gives_lld_link_and_an_msvc_target_clang_their_options() {
    let wine = Wine::new();
    let project = windows_project();
    let wrappers = Wrappers::new(&["lld-link"]);
    let path = path_with_lld_link(&project, &wrappers.path());
    let entry = ["/nodefaultlib", "/entry:main", "/subsystem:console"];

    // lld-link-dtlto: lld-link itself, with /thinlto-distributor: and the clang on PATH added.
    let mut lld_link = common::isolated("lld-link-dtlto");
    lld_link
        .arg("/out:lld-link/app.exe")
        .args(project.inputs())
        .args([KERNEL32])
        .args(entry);
    // dtlto-reapi link clang --target=…-msvc: the options through -Xlinker, since clang would drop
    // -fthinlto-distributor= without a word.
    let mut clang = common::dtlto_reapi();
    clang
        .arg("link")
        .arg(&common::toolchain().clang)
        .args([TARGET, "-flto=thin", "-fuse-ld=lld", "-nostdlib"])
        .args(project.inputs())
        .args([KERNEL32, "-o", "clang/app.exe"])
        .args(entry.map(|option| format!("-Wl,{option}")));
    for (name, mut cmd) in [("lld-link", lld_link), ("clang", clang)] {
        let (output, _) = output_paths(&project, &format!("{name}/app.exe"));
        let stats = project.dir().join(format!("{name} stats"));
        fs::create_dir_all(&stats).expect("stats directory");
        cmd.current_dir(project.dir())
            .env("PATH", &path)
            .env("DTLTO_REAPI_STATS_JSON", &stats);
        let out = run(&mut cmd);
        let linked = Linked::from_run(&cmd, out, output, None);
        assert_eq!(wine.run_program(&linked), expected_output(), "{name}");
        let links = stats_in(&stats);
        assert_eq!(links.len(), 1, "{name}: one DTLTO link");
        assert_eq!(
            links[0].ran(),
            ran_only("local", JOBS),
            "{name}: {}",
            links[0]
        );
    }
}

// Windows hosts: the distributor is itself a Windows program, `dtlto-reapi.exe`, run by the Windows
// `zig.exe lld-link` under wine (both from `scripts/build-windows.sh`).

/// The Linux file at the absolute `path` as a Windows program under wine sees it: drive `Z:` is
/// the Linux root, and lld-link writes the paths it derives with mixed separators.
fn on_z(path: &Path) -> OsString {
    let mut windows = OsString::from("Z:");
    windows.push(path);
    windows
}

/// Links the project to `output` with the Windows `zig.exe lld-link` under `wine`, every backend
/// compile handed to `dtlto-reapi.exe` with `distributor_args` (its `--stats-json` beside `output`)
/// and given `compiler_args`. It does not judge the result.
fn windows_hosted_link(
    wine: &Wine,
    project: &Project,
    output: &str,
    distributor_args: &[&str],
    compiler_args: &[&str],
) -> Linked {
    let host = windows_host();
    let (output_path, stats) = output_paths(project, output);
    let option = |name: &str, value: &Path| {
        let mut option = OsString::from(name);
        option.push(on_z(value));
        option
    };
    let mut cmd = wine.command(&host.zig_exe);
    cmd.current_dir(project.dir())
        .arg("lld-link")
        .arg(format!("/out:{output}"))
        .args(project.inputs())
        .args([
            KERNEL32,
            "/nodefaultlib",
            "/entry:main",
            "/subsystem:console",
        ])
        .arg(option("/thinlto-distributor:", &host.exe))
        .arg(option("/thinlto-remote-compiler:", &host.zig_exe))
        .args(["/thinlto-remote-compiler-prepend-arg:clang", DETERMINISTIC])
        .arg(option("/thinlto-distributor-arg:--stats-json=", &stats))
        .args(
            distributor_args
                .iter()
                .map(|arg| format!("/thinlto-distributor-arg:{arg}")),
        )
        .args(
            compiler_args
                .iter()
                .map(|arg| format!("/thinlto-remote-compiler-arg:{arg}")),
        )
        .arg("/lldsavetemps");
    let out = run(&mut cmd);
    Linked::from_run(&cmd, out, output_path, Some(stats))
}

#[test]
fn a_windows_hosted_link_compiles_locally_the_objects_a_linux_link_does() {
    let wine = Wine::new();
    let project = windows_project();
    let windows = windows_hosted_link(&wine, &project, "windows/app.exe", &[], &[]);
    assert_eq!(wine.run_program(&windows), expected_output());
    let stats = windows.stats();
    assert_eq!(stats.ran(), ran_only("local", JOBS), "{stats}");
    // The Windows zig.exe and the Linux zig compile the same bitcode to the same objects.
    let linux = lld_link(&project, "linux/app.exe", &[]);
    assert_eq!(
        windows.native_object_contents(),
        linux.native_object_contents()
    );
}

#[test]
fn a_windows_hosted_link_runs_every_job_on_linux_workers_and_shares_their_cache_with_linux_links() {
    let wine = Wine::new();
    let project = windows_project();
    let copy = project.copy_elsewhere();
    let server = server_hiding(&[&project, &copy]);
    let remote = format!("--remote={}", server.url());
    // The Linux zig, uploaded with every action: the workers cannot run zig.exe.
    let upload = format!("--upload-compiler={}", on_z(&zig().zig).to_string_lossy());
    // Racing asked for: with another compiler uploaded, no local compile may race.
    let args = [remote.as_str(), upload.as_str(), "--strategy=racing"];

    let first = windows_hosted_link(&wine, &project, "remote/app.exe", &args, &[]);
    assert_eq!(wine.run_program(&first), expected_output());
    let first_stats = first.stats();
    assert_eq!(first_stats.ran(), ran_only("remote", JOBS), "{first_stats}");
    assert!(
        first_stats.jobs().iter().all(|job| job["race"].is_null()),
        "a local compile raced: {first_stats}"
    );
    let local = windows_hosted_link(&wine, &project, "local/app.exe", &[], &[]);
    assert_eq!(
        first.native_object_contents(),
        local.native_object_contents()
    );

    // Another checkout, linked on Windows again: every job from the action cache.
    let relinked = windows_hosted_link(&wine, &copy, "out/app.exe", &args, &[]);
    assert_eq!(wine.run_program(&relinked), expected_output());
    let again = relinked.stats();
    assert_eq!(again.ran(), ran_only("action-cache", JOBS), "{again}");
    assert_eq!(first_stats.actions(), again.actions());

    // A link of the same project on Linux, whose compiler is that Linux zig: the same Actions.
    let linux = lld_link(&copy, "linux/app.exe", &[&remote]);
    assert_eq!(wine.run_program(&linux), expected_output());
    let linux_stats = linux.stats();
    assert_eq!(
        linux_stats.ran(),
        ran_only("action-cache", JOBS),
        "{linux_stats}"
    );
    assert_eq!(first_stats.actions(), linux_stats.actions());
}

#[test]
fn a_failing_job_of_a_windows_hosted_link_fails_it_without_an_output() {
    let wine = Wine::new();
    let project = windows_project();
    let (output, _) = output_paths(&project, "failed/app.exe");
    let linked = windows_hosted_link(&wine, &project, "failed/app.exe", &[], &["--no-such-flag"]);
    linked
        .assert_failure()
        .assert_stderr_contains("unknown argument: '--no-such-flag'");
    assert!(!output.exists(), "{} was written", output.display());
    assert_eq!(linked.native_objects(), Vec::<PathBuf>::new());
}

/// A Windows "compiler" that records that it started (`started.<its pid>` in its working directory)
/// and then hangs, built with mingw.
const HANGING_COMPILER: &str = r#"#include <windows.h>
#include <stdio.h>

int main(void) {
    char name[64];
    snprintf(name, sizeof name, "started.%lu", GetCurrentProcessId());
    CloseHandle(CreateFileA(name, GENERIC_WRITE, 0, NULL, CREATE_ALWAYS, 0, NULL));
    Sleep(INFINITE);
    return 0;
}
"#;

/// The Linux processes whose command line names `program` (wine runs each Windows process as one).
fn processes_running(program: &str) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = fs::read(entry.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains(program)
                .then_some(pid)
        })
        .collect()
}

#[test]
fn the_job_objects_of_a_killed_windows_distributor_kill_its_compiles() {
    let wine = Wine::new();
    let dir = tempfile::tempdir().expect("a temporary directory");
    // Named after this test's directory, so that no other test's processes match.
    let name = format!(
        "hanging {}.exe",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    let mingw = common::tools::system_tool(&["x86_64-w64-mingw32-gcc"], "gcc-mingw-w64-x86-64");
    common::write(&dir.path().join("hang.c"), HANGING_COMPILER.as_bytes());
    run_ok(
        Command::new(mingw)
            .current_dir(dir.path())
            .args(["-O1", "hang.c", "-o"])
            .arg(&name),
    );
    let jobs: Vec<_> = (0..2)
        .map(|i| {
            common::write(&dir.path().join(format!("m{i}.o")), b"x");
            common::write(&dir.path().join(format!("m{i}.bc")), b"x");
            serde_json::json!({"args": [format!("m{i}.o"), "-o", format!("m{i}.native.o")],
                               "inputs": [format!("m{i}.o"), format!("m{i}.bc")],
                               "outputs": [format!("m{i}.native.o")]})
        })
        .collect();
    let compiler = on_z(&dir.path().join(&name)).to_string_lossy().into_owned();
    let job_file = serde_json::json!({
        "common": {"linker_output": "app", "args": [compiler], "inputs": []},
        "jobs": jobs,
    });
    common::write(
        &dir.path().join("app.1.dist-file.json"),
        job_file.to_string().as_bytes(),
    );

    let mut distributor = wine.command(&windows_host().exe);
    distributor
        .current_dir(dir.path())
        .args(["--jobs=2", "app.1.dist-file.json"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut distributor = distributor.spawn().expect("wine dtlto-reapi.exe");
    let started = || {
        fs::read_dir(dir.path())
            .map(|entries| {
                let names = entries.flatten().map(|e| e.file_name());
                names
                    .filter(|n| n.to_string_lossy().starts_with("started."))
                    .count()
            })
            .unwrap_or(0)
    };
    let both = eventually(std::time::Duration::from_secs(120), || started() == 2);
    if !both {
        let _ = distributor.kill();
        panic!("the two compiles never started");
    }
    assert_eq!(processes_running(&name).len(), 2, "the compiles run");
    // SIGKILL: the distributor cannot end anything itself; closing its handles ends the jobs.
    distributor.kill().expect("kill the distributor");
    distributor.wait().expect("wait for the distributor");
    assert!(
        eventually(std::time::Duration::from_secs(60), || processes_running(
            &name
        )
        .is_empty()),
        "compiles outlived the distributor: {:?}",
        processes_running(&name)
    );
}
