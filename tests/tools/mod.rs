//! The tools the tests need beyond Rust: clang/lld 22 (`scripts/toolchain.sh`), the ziglang package
//! (`scripts/ziglang.sh`) and BuildGrid's `bgd` (`scripts/buildgrid.sh`), each found or installed
//! once per test process by the project's own script, which prints `NAME=PATH` lines. A failing install fails the test, never skips it.
//!
//! `common` includes this module; a test crate that needs only `bgd` includes it alone, hence the
//! `dead_code` allowance.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The clang, lld and archiver the tests use, as printed by `scripts/toolchain.sh`.
#[derive(Debug)]
pub struct Toolchain {
    /// Directory holding the wrappers.
    pub bin: PathBuf,
    pub clang: PathBuf,
    pub lld: PathBuf,
    pub ar: PathBuf,
    /// The executable backend compiles run (never a wrapper script) and the argument that goes
    /// before theirs (`clang` for `zig clang`; empty for a real clang).
    pub compiler: PathBuf,
    pub compiler_prepend: String,
}

/// The toolchain, located (and installed if needed) once per test process.
///
/// Panics with the script's stderr when it fails.
pub fn toolchain() -> &'static Toolchain {
    static TOOLCHAIN: OnceLock<Toolchain> = OnceLock::new();
    TOOLCHAIN.get_or_init(|| {
        let [bin, clang, lld, ar, compiler, prepend] = script_paths(
            "scripts/toolchain.sh",
            ["BIN", "CLANG", "LLD", "AR", "COMPILER", "COMPILER_PREPEND"],
        );
        Toolchain {
            bin,
            clang,
            lld,
            ar,
            compiler,
            compiler_prepend: prepend.to_string_lossy().into_owned(),
        }
    })
}

/// PyPI's ziglang package (`scripts/ziglang.sh`), whatever clang `toolchain()` found: the Windows
/// tests need its `lld-link`, `dlltool` and MinGW import-library definitions.
#[derive(Debug)]
pub struct Zig {
    /// The `zig` executable (`zig clang`, `zig lld-link`, `zig ar`, `zig dlltool`).
    pub zig: PathBuf,
    /// Its `lib/` directory (`libc/mingw/...`).
    pub lib: PathBuf,
}

/// The ziglang package, installed if needed once per test process; panics with the script's
/// stderr when the install fails.
pub fn zig() -> &'static Zig {
    static ZIG: OnceLock<Zig> = OnceLock::new();
    ZIG.get_or_init(|| {
        let [zig, lib] = script_paths("scripts/ziglang.sh", ["ZIG", "ZIG_LIB"]);
        Zig { zig, lib }
    })
}

/// The Windows build of the distributor and the Windows zig (clang and lld-link 22), both made by
/// `scripts/build-windows.sh`, which `scripts/test.sh` runs first.
pub struct WindowsHost {
    /// `dtlto-reapi.exe`, with the wine-only `bcryptprimitives.dll` stub beside it.
    pub exe: PathBuf,
    /// `zig.exe` from ziglang's win_amd64 wheel.
    pub zig_exe: PathBuf,
}

/// What `scripts/build-windows.sh` built; panics naming what is missing when it has not run.
pub fn windows_host() -> &'static WindowsHost {
    static HOST: OnceLock<WindowsHost> = OnceLock::new();
    HOST.get_or_init(|| {
        let [exe, zig_exe] =
            script_paths("scripts/build-windows.sh --installed", ["EXE", "ZIG_EXE"]);
        WindowsHost { exe, zig_exe }
    })
}

/// BuildGrid's `bgd` command (client and server), installed once per test process by
/// `scripts/buildgrid.sh`; panics with the script's stderr when the install fails.
pub fn bgd() -> &'static Path {
    static BGD: OnceLock<PathBuf> = OnceLock::new();
    BGD.get_or_init(|| {
        let [bgd] = script_paths("scripts/buildgrid.sh", ["BGD"]);
        bgd
    })
}

/// Runs one of the project's install scripts (`script` is relative to the repository, followed by
/// its arguments if any) and returns the paths it printed as `NAME=PATH` lines for each of `names`,
/// in order.
///
/// Panics with the script's stderr when it fails, and with its stdout when a name is missing: the
/// tests need what it installs, so they fail rather than skip.
pub fn script_paths<const N: usize>(script: &str, names: [&str; N]) -> [PathBuf; N] {
    let mut words = script.split(' ');
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(words.next().unwrap_or_default());
    let out = Command::new("bash")
        .arg(&script)
        .args(words)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} failed ({}); these tests need what it installs:\n{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let vars: HashMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once('=')).collect();
    names.map(|name| match vars.get(name) {
        Some(value) => PathBuf::from(value),
        None => panic!("{} printed no {name}= line:\n{stdout}", script.display()),
    })
}

/// A program the tests take from the system rather than from the project's install scripts: its
/// path, the first `candidates` entry that is a file (a name is looked up on PATH). Panics with one
/// line naming the program and the command that installs it (`scripts/test.sh` installs them all),
/// never with a bare "No such file or directory" when a test first runs it.
pub fn system_tool(candidates: &[&str], debian_package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    candidates
        .iter()
        .find_map(|candidate| {
            let candidate = Path::new(candidate);
            if candidate.is_absolute() {
                Some(candidate.to_path_buf()).filter(|file| file.is_file())
            } else {
                std::env::split_paths(&path)
                    .map(|dir| dir.join(candidate))
                    .find(|file| file.is_file())
            }
        })
        .unwrap_or_else(|| {
            panic!(
                "{} is not installed: these tests need it (Debian: apt-get install {debian_package}; \
                 scripts/test.sh installs everything the tests need)",
                candidates.join(" or ")
            )
        })
}
