//! `dtlto-reapi link [--] <linker driver> <args...>`: runs a link with what DTLTO needs added, so that
//! a build system changes one line (a linker launcher, `CC=`, cargo's `-Clinker=`) instead of every
//! link line.
//!
//! The driver's own arguments pass through untouched; the options that make lld hand its ThinLTO
//! backend compiles to this binary are appended, in the form the driver takes them. A compiler
//! driver is identified by what it says it is (`-v`: clang or gcc), not by its name — `cc` is
//! either — and `@file` response files are expanded ([`crate::response_files`]) to decide:
//!
//! | driver | added |
//! | --- | --- |
//! | clang (ELF target) with `-flto…` and lld | `-fthinlto-distributor=<self>` |
//! | gcc with `-fuse-ld=lld` | `-Xlinker --thinlto-distributor=<self> -Xlinker --thinlto-remote-compiler=<clang on PATH>` |
//! | clang (ELF target) without `-flto`, with lld (e.g. rustc's links of `-Clinker-plugin-lto` bitcode) | `-Xlinker --thinlto-distributor=<self> -Xlinker --thinlto-remote-compiler=<clang>` |
//! | clang with an MSVC target and lld, clang-cl | `/thinlto-distributor:<self>` and `/thinlto-remote-compiler:<clang>` through `-Xlinker` (`/link` for clang-cl): such a clang silently drops `-fthinlto-distributor=` |
//! | `ld.lld`, `lld -flavor gnu` | `--thinlto-distributor=<self> --thinlto-remote-compiler=<clang on PATH>` |
//! | `lld-link`, `lld -flavor link` | `/thinlto-distributor:<self> /thinlto-remote-compiler:<clang on PATH>` |
//!
//! Nothing is added to a compile (`-c`, `-S`, `-E`, …), to a link through another linker than lld,
//! by a driver that is neither clang nor gcc, or when the user already names a distributor (why,
//! one note under `DTLTO_REAPI_VERBOSE` or `link --verbose`); a remote compiler the user names is
//! kept. A clang
//! reached through a script that runs a multi-call binary (the ziglang package's
//! `exec zig clang …`) passes that binary as the backend compiler, which does not take clang's
//! arguments: the binary is then named explicitly, with `clang` prepended to every backend command.
//!
//! The distributor's own options come from the environment and the config file, as for any run.
//! The driver replaces this process (`exec`), so its exit status, or the signal that ended it, is
//! exactly what the build system sees. Windows has no `exec`: there the wrapper runs the driver,
//! leaves Ctrl-C to it, and exits with its exit code.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, anyhow, bail};

use crate::platform::{self, os_string_from_bytes};

/// The suffix that makes a symlink or copy of this binary a wrapper of the driver named before it:
/// `clang-dtlto` runs `clang`.
pub const NAME_SUFFIX: &str = "-dtlto";

/// Set for the driver's process tree, so that a *copy* named `…-dtlto`, which lld then runs as the
/// distributor, knows it is the distributor and not another wrapper.
const IN_LINK_ENV: &str = "DTLTO_REAPI_IN_LINK";

/// The driver this process wraps when it was invoked as `<driver>-dtlto` (a symlink or copy), and
/// is not the distributor that such a link runs (on Windows `<driver>-dtlto.exe`).
pub fn wrapped_driver(argv0: &OsStr) -> Option<OsString> {
    let name = program_name(Path::new(argv0).file_name()?);
    let driver = name.strip_suffix(NAME_SUFFIX.as_bytes())?;
    (!driver.is_empty() && std::env::var_os(IN_LINK_ENV).is_none())
        .then(|| os_string_from_bytes(driver.to_vec()))
}

/// A program's file name without the `.exe` Windows adds (`clang-cl.exe` is `clang-cl`).
fn program_name(file_name: &OsStr) -> &[u8] {
    let name = file_name.as_encoded_bytes();
    let at = name.len().saturating_sub(4);
    match name.split_at_checked(at) {
        Some((stem, ext)) if cfg!(windows) && ext.eq_ignore_ascii_case(b".exe") => stem,
        _ => name,
    }
}

/// Runs `driver args…` with the DTLTO options added, in place of this process (on Windows: runs it
/// and exits with its exit code); with `verbose`, one note says what was added or why nothing was.
/// Returns only when the driver cannot be found or started.
pub fn exec(driver: &OsStr, args: &[OsString], verbose: bool) -> anyhow::Error {
    match prepare(driver, args, verbose) {
        Ok(cmd) => {
            let program = cmd.get_program().to_owned();
            anyhow!(platform::run_in_place(cmd))
                .context(format!("cannot run {}", program.display()))
        }
        Err(e) => e,
    }
}

/// Whether `DTLTO_REAPI_VERBOSE` asks for the wrapper's note (true/false/1/0/yes/no, as for the
/// distributor's own `--verbose`).
pub fn verbose_from_env() -> bool {
    use clap::builder::TypedValueParser as _;
    std::env::var_os("DTLTO_REAPI_VERBOSE").is_some_and(|value| {
        clap::builder::BoolishValueParser::new()
            .parse_ref(&clap::Command::new("dtlto-reapi"), None, &value)
            .unwrap_or(false)
    })
}

/// The driver's command: the driver found on PATH (never this binary), the user's arguments, then
/// the DTLTO options.
fn prepare(driver: &OsStr, args: &[OsString], verbose: bool) -> Result<Command> {
    let this = std::env::current_exe().context("cannot find this executable's path")?;
    let path = resolve_driver(driver, &this)?;
    let name = Path::new(driver)
        .file_name()
        .map(|n| String::from_utf8_lossy(program_name(n)).into_owned())
        .unwrap_or_default();
    // Decided on the arguments the driver will see, response files expanded; passed on as given.
    let seen = crate::response_files::expand(args);
    let kind = match DriverKind::of(&name, &seen) {
        // Asking costs a process: only for a command that could get something.
        DriverKind::Compiler { cl } if compiler_passes_through(cl, &seen).is_none() => {
            identify(&path, cl)
        }
        kind => kind,
    };
    let added = dtlto_options(&kind, &seen, &this, || {
        backend_compiler(&kind, &path, &this)
    })?;
    if verbose {
        eprintln!("dtlto-reapi link: note: {}", added.describe(&path));
    }
    let mut cmd = Command::new(&path);
    cmd.args(args).env(IN_LINK_ENV, "1");
    if let Added::Options(options) = added {
        cmd.args(options);
    }
    Ok(cmd)
}

/// How a driver takes its linker options.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DriverKind {
    /// A compiler driver not asked yet what it is (`cl`: in MSVC mode, by its name or
    /// `--driver-mode=cl`).
    Compiler { cl: bool },
    /// clang (clang, clang++, a `cc` that is clang, …).
    Clang,
    /// clang in MSVC mode (`clang-cl`).
    ClangCl,
    /// gcc: passes lld's options on with `-Xlinker`, but its own executable cannot compile the
    /// backend jobs.
    Gcc,
    /// lld's ELF driver (`ld.lld`, `lld -flavor gnu`).
    Elf,
    /// lld's COFF driver (`lld-link`, `lld -flavor link`).
    Coff,
    /// A driver this wrapper cannot serve (another lld flavor, `ld.bfd`, a compiler driver that is
    /// neither clang nor gcc, …), and what it is: nothing is added.
    Other(String),
}

impl DriverKind {
    /// What the name (and `-flavor`) says; compiler drivers are then asked ([`identify`]).
    fn of(name: &str, args: &[OsString]) -> DriverKind {
        if name.contains("lld-link") {
            DriverKind::Coff
        } else if name.contains("lld") {
            // `lld` and `rust-lld` need `-flavor`; `ld.lld` is the ELF driver.
            match flag_value(args, "-flavor")
                .as_deref()
                .map(OsStr::as_encoded_bytes)
            {
                Some(b"gnu") => DriverKind::Elf,
                Some(b"link") => DriverKind::Coff,
                None if name.starts_with("ld.") => DriverKind::Elf,
                _ => DriverKind::Other(format!("{name} without -flavor gnu or link")),
            }
        } else if name == "ld" || name.starts_with("ld.") {
            DriverKind::Other(format!("{name}, a linker other than lld"))
        } else {
            let cl = name.contains("clang-cl") || args.iter().any(|a| a == "--driver-mode=cl");
            DriverKind::Compiler { cl }
        }
    }
}

/// What `driver -v` says it is: clang (`… clang version …`), gcc (`gcc version …`), or neither.
fn identify(driver: &Path, cl: bool) -> DriverKind {
    let said = Command::new(driver)
        .arg("-v")
        .stdin(Stdio::null())
        .output()
        .map(|out| {
            let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stdout));
            text
        });
    match said {
        Ok(text) => kind_from_version(&text, cl),
        Err(e) => DriverKind::Other(format!("a driver that cannot be asked what it is ({e})")),
    }
}

/// [`identify`]'s reading of `-v` output.
fn kind_from_version(text: &str, cl: bool) -> DriverKind {
    if text.lines().any(|l| l.contains("clang version")) {
        if cl {
            DriverKind::ClangCl
        } else {
            DriverKind::Clang
        }
    } else if !cl && text.lines().any(|l| l.starts_with("gcc version ")) {
        DriverKind::Gcc
    } else {
        let first = text.lines().next().unwrap_or("nothing").trim();
        DriverKind::Other(format!("neither clang nor gcc (`-v` says {first:?})"))
    }
}

/// What the wrapper adds to a command, or why it adds nothing.
#[derive(Debug, PartialEq, Eq)]
enum Added {
    Options(Vec<OsString>),
    Nothing(String),
}

impl Added {
    /// The `--verbose` note.
    fn describe(&self, driver: &Path) -> String {
        match self {
            Added::Options(options) => {
                let shown: Vec<_> = options.iter().map(|o| o.to_string_lossy()).collect();
                format!("running {} with {}", driver.display(), shown.join(" "))
            }
            Added::Nothing(why) => format!(
                "running {} as it is, without DTLTO: {why}",
                driver.display()
            ),
        }
    }
}

/// Why a compiler driver's command gets nothing whatever the driver is: it does not link, links
/// with another linker than lld, or names a distributor already.
fn compiler_passes_through(cl: bool, args: &[OsString]) -> Option<&'static str> {
    let kind = if cl {
        DriverKind::ClangCl
    } else {
        DriverKind::Clang
    };
    if compile_only(&kind, args) {
        Some("not a link")
    } else if names(args, "thinlto-distributor") {
        Some("the command names a distributor already")
    } else if !uses_lld(args) {
        Some("not a link with lld (-fuse-ld=lld)")
    } else {
        None
    }
}

/// The compiler lld runs for each backend job, and the argument a multi-call binary needs first.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BackendCompiler {
    path: PathBuf,
    prepend: Option<&'static str>,
}

/// The options to append to `args` for a driver of `kind`, or why there are none; `compiler` finds
/// the backend compiler when one must be named.
fn dtlto_options(
    kind: &DriverKind,
    args: &[OsString],
    this: &Path,
    compiler: impl FnOnce() -> Result<Option<BackendCompiler>>,
) -> Result<Added> {
    let nothing = |why: &str| Ok(Added::Nothing(why.to_owned()));
    let coff = match kind {
        DriverKind::Other(what) => return nothing(&format!("the driver is {what}")),
        DriverKind::Compiler { .. } | DriverKind::Clang | DriverKind::ClangCl | DriverKind::Gcc => {
            let cl = matches!(
                kind,
                DriverKind::ClangCl | DriverKind::Compiler { cl: true }
            );
            if let Some(why) = compiler_passes_through(cl, args) {
                return nothing(why);
            }
            match kind {
                DriverKind::Clang if target_is_msvc(args) => true,
                DriverKind::Clang if lto_enabled(args) => {
                    // clang passes the distributor on, and its own executable as the compiler.
                    let mut added = vec![concat("-fthinlto-distributor=", this)];
                    if !names(args, "thinlto-remote-compiler")
                        && let Some(c) = compiler()?.filter(|c| c.prepend.is_some())
                    {
                        for option in linker_options(&c, false) {
                            added.extend(["-Xlinker".into(), option]);
                        }
                    }
                    return Ok(Added::Options(added));
                }
                DriverKind::ClangCl => true,
                DriverKind::Compiler { .. } => return nothing("the driver was not identified"),
                _ => false,
            }
        }
        DriverKind::Elf | DriverKind::Coff => {
            if compile_only(kind, args) {
                return nothing("not a link");
            }
            if names(args, "thinlto-distributor") {
                return nothing("the command names a distributor already");
            }
            *kind == DriverKind::Coff
        }
    };
    let mut options = vec![if coff {
        concat("/thinlto-distributor:", this)
    } else {
        concat("--thinlto-distributor=", this)
    }];
    if !names(args, "thinlto-remote-compiler") {
        match compiler()? {
            Some(c) => options.extend(linker_options(&c, coff)),
            // Without a compiler for the backend jobs there is no DTLTO: link as without the wrapper.
            None => return nothing("no clang for the backend compiles"),
        }
    }
    Ok(Added::Options(match kind {
        DriverKind::Clang | DriverKind::Gcc => options
            .into_iter()
            .flat_map(|option| [OsString::from("-Xlinker"), option])
            .collect(),
        DriverKind::ClangCl if !args.iter().any(|a| a == "/link" || a == "-link") => {
            std::iter::once(OsString::from("/link"))
                .chain(options)
                .collect()
        }
        _ => options,
    }))
}

/// lld's options naming the backend compiler.
fn linker_options(compiler: &BackendCompiler, coff: bool) -> Vec<OsString> {
    let (compiler_option, prepend_option) = if coff {
        (
            "/thinlto-remote-compiler:",
            "/thinlto-remote-compiler-prepend-arg:",
        )
    } else {
        (
            "--thinlto-remote-compiler=",
            "--thinlto-remote-compiler-prepend-arg=",
        )
    };
    let mut options = vec![concat(compiler_option, &compiler.path)];
    if let Some(arg) = compiler.prepend {
        options.push(concat(prepend_option, Path::new(arg)));
    }
    options
}

fn concat(prefix: &str, path: &Path) -> OsString {
    let mut s = OsString::from(prefix);
    s.push(path);
    s
}

/// Whether the command compiles, preprocesses or queries instead of linking.
fn compile_only(kind: &DriverKind, args: &[OsString]) -> bool {
    let flags: &[&str] = match kind {
        DriverKind::Clang | DriverKind::Gcc | DriverKind::Compiler { cl: false } => &[
            "-c",
            "-S",
            "-E",
            "-M",
            "-MM",
            "-fsyntax-only",
            "-emit-llvm",
            "--version",
            "-dumpversion",
            "-dumpmachine",
            "--help",
        ],
        DriverKind::ClangCl | DriverKind::Compiler { cl: true } => {
            &["/c", "-c", "/E", "-E", "/P", "-P", "/Zs", "-Zs", "/?"]
        }
        _ => &["--version", "/?", "--help"],
    };
    args.iter().any(|a| {
        flags.iter().any(|f| a == *f)
            || a.as_encoded_bytes().starts_with(b"-print-")
            || a.as_encoded_bytes().starts_with(b"--print-")
    })
}

/// Whether an argument gives lld's option `option` (in any spelling: `--x=`, `-fx=`, `/x:`,
/// `-Wl,--x=`), not counting clang's `-Xthinlto-distributor=` (an argument *for* the distributor).
fn names(args: &[OsString], option: &str) -> bool {
    args.iter().any(|a| {
        let a = a.to_string_lossy();
        a.match_indices(option).any(|(at, _)| {
            let after = a[at + option.len()..].chars().next();
            matches!(after, Some('=' | ':')) && !a[..at].ends_with('X')
        })
    })
}

/// The value of `flag` given as `flag VALUE` or `flag=VALUE` (the last one wins).
fn flag_value(args: &[OsString], flag: &str) -> Option<OsString> {
    let with_eq = format!("{flag}=");
    let mut value = None;
    for (i, a) in args.iter().enumerate() {
        if a == flag {
            value = args.get(i + 1).cloned();
        } else if let Some(v) = a.as_encoded_bytes().strip_prefix(with_eq.as_bytes()) {
            value = Some(os_string_from_bytes(v.to_vec()));
        }
    }
    value
}

/// Whether the last `-flto…`/`-fno-lto` turns LTO on.
fn lto_enabled(args: &[OsString]) -> bool {
    args.iter()
        .rev()
        .find_map(|a| {
            let a = a.as_encoded_bytes();
            if a == b"-fno-lto" {
                Some(false)
            } else if a == b"-flto" || a.starts_with(b"-flto=") {
                Some(true)
            } else {
                None
            }
        })
        .unwrap_or(false)
}

/// Whether the link goes through lld (`-fuse-ld=lld`, `-fuse-ld=/path/ld.lld`, `-fuse-ld=lld-link`).
fn uses_lld(args: &[OsString]) -> bool {
    flag_value(args, "-fuse-ld").is_some_and(|v| {
        Path::new(&v)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains("lld"))
    })
}

/// Whether the target (`--target=`, `-target`) is Windows with the MSVC environment, where clang
/// drops `-fthinlto-distributor=` and lld-link takes `/` options.
fn target_is_msvc(args: &[OsString]) -> bool {
    let target = flag_value(args, "--target").or_else(|| flag_value(args, "-target"));
    target.is_some_and(|t| {
        let t = t.to_string_lossy();
        t.contains("msvc") || (t.contains("windows") && !t.contains("gnu") && !t.contains("cygnus"))
    })
}

/// The compiler for the backend jobs: the clang behind a clang driver, or for lld itself and gcc
/// the clang on PATH. `None` when there is none.
fn backend_compiler(
    kind: &DriverKind,
    driver: &Path,
    this: &Path,
) -> Result<Option<BackendCompiler>> {
    let clang = match kind {
        DriverKind::Clang | DriverKind::ClangCl => driver.to_owned(),
        _ => match find_on_path(OsStr::new("clang"), this) {
            Some(clang) => clang,
            // gcc links without clang are common: only lld run directly is told.
            None if *kind == DriverKind::Gcc => return Ok(None),
            None => {
                eprintln!(
                    "dtlto-reapi link: warning: no clang on PATH for the backend compiles; linking \
                     without DTLTO (name one with --thinlto-remote-compiler=)"
                );
                return Ok(None);
            }
        },
    };
    if !is_script(&clang) {
        return Ok(Some(BackendCompiler {
            path: clang,
            prepend: None,
        }));
    }
    // A script: ask the clang behind it for its executable, as it passes it to lld.
    Ok(clang_executable(&clang).map(|path| {
        let multi_call = !path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains("clang"));
        BackendCompiler {
            path,
            prepend: multi_call.then_some("clang"),
        }
    }))
}

/// Whether `path` is a script (`#!`).
fn is_script(path: &Path) -> bool {
    let mut start = [0u8; 2];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut start))
        .is_ok_and(|()| &start == b"#!")
}

/// The executable that `clang -###` shows running `-cc1`: clang's own binary.
fn clang_executable(clang: &Path) -> Option<PathBuf> {
    let out = Command::new(clang)
        .args([
            "-###",
            "-c",
            "-x",
            "c",
            platform::NULL_DEVICE,
            "-o",
            platform::NULL_DEVICE,
        ])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(cc1_executable)
}

/// From a `-###` line ` "/path/clang" "-cc1" …`, the first word.
fn cc1_executable(line: &str) -> Option<PathBuf> {
    let rest = line.trim_start().strip_prefix('"')?;
    let mut exe = String::new();
    let mut chars = rest.chars();
    loop {
        match chars.next()? {
            '\\' => exe.push(chars.next()?),
            '"' => break,
            c => exe.push(c),
        }
    }
    chars
        .as_str()
        .trim_start()
        .starts_with("\"-cc1\"")
        .then(|| PathBuf::from(exe))
}

/// The driver to run: a path as given, or the first `driver` on PATH that is not this binary.
fn resolve_driver(driver: &OsStr, this: &Path) -> Result<PathBuf> {
    if platform::names_a_path(driver) {
        return Ok(PathBuf::from(driver));
    }
    match find_on_path(driver, this) {
        Some(path) => Ok(path),
        None => bail!(
            "link: {} not found on PATH (other than this wrapper)",
            driver.display()
        ),
    }
}

/// The first executable `name` in PATH's directories that is not `this` binary (a wrapper named
/// after its driver must not run itself).
fn find_on_path(name: &OsStr, this: &Path) -> Option<PathBuf> {
    let this = this.canonicalize().ok();
    platform::find_on_path(name, |candidate| candidate.canonicalize().ok() != this)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    fn options(kind: DriverKind, list: &[&str], compiler: Option<(&str, bool)>) -> Vec<String> {
        let compiler = compiler.map(|(path, multi)| BackendCompiler {
            path: PathBuf::from(path),
            prepend: multi.then_some("clang"),
        });
        match dtlto_options(&kind, &args(list), Path::new("/d/dtlto-reapi"), || {
            Ok(compiler)
        })
        .unwrap()
        {
            Added::Options(options) => options
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect(),
            Added::Nothing(_) => Vec::new(),
        }
    }

    #[test]
    fn kinds_follow_the_driver_name_and_flavor() {
        let none = args(&[]);
        let compiler = DriverKind::Compiler { cl: false };
        assert_eq!(DriverKind::of("clang", &none), compiler);
        assert_eq!(DriverKind::of("cc", &none), compiler);
        assert_eq!(DriverKind::of("clang++-22", &none), compiler);
        let cl = DriverKind::Compiler { cl: true };
        assert_eq!(DriverKind::of("clang-cl", &none), cl);
        assert_eq!(DriverKind::of("clang", &args(&["--driver-mode=cl"])), cl);
        assert_eq!(DriverKind::of("ld.lld", &none), DriverKind::Elf);
        assert_eq!(DriverKind::of("lld-link", &none), DriverKind::Coff);
        let gnu = args(&["-flavor", "gnu"]);
        assert_eq!(DriverKind::of("rust-lld", &gnu), DriverKind::Elf);
        assert_eq!(
            DriverKind::of("lld", &args(&["-flavor", "link"])),
            DriverKind::Coff
        );
        assert!(matches!(DriverKind::of("lld", &none), DriverKind::Other(_)));
        assert!(matches!(
            DriverKind::of("ld.bfd", &none),
            DriverKind::Other(_)
        ));
    }

    #[test]
    fn compiler_drivers_are_what_they_say_they_are() {
        let clang = "Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu\nFound candidate GCC installation: /usr/lib/gcc/x86_64-linux-gnu/12\n";
        assert_eq!(kind_from_version(clang, false), DriverKind::Clang);
        assert_eq!(kind_from_version(clang, true), DriverKind::ClangCl);
        let gcc = "Using built-in specs.\nCOLLECT_GCC=cc\nTarget: x86_64-linux-gnu\ngcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n";
        assert_eq!(kind_from_version(gcc, false), DriverKind::Gcc);
        assert!(matches!(kind_from_version(gcc, true), DriverKind::Other(_)));
        let DriverKind::Other(what) = kind_from_version("icx: Intel(R) oneAPI\n", false) else {
            panic!("not other")
        };
        assert!(
            what.contains("neither clang nor gcc") && what.contains("Intel"),
            "{what}"
        );
    }

    #[test]
    fn gcc_with_lld_names_distributor_and_clang_to_lld() {
        let c = Some(("/usr/bin/clang", false));
        let expected = [
            "-Xlinker",
            "--thinlto-distributor=/d/dtlto-reapi",
            "-Xlinker",
            "--thinlto-remote-compiler=/usr/bin/clang",
        ];
        assert_eq!(
            options(DriverKind::Gcc, &["-fuse-ld=lld", "main.o", "-lm"], c),
            expected
        );
        assert_eq!(
            options(
                DriverKind::Gcc,
                &["-flto=thin", "-fuse-ld=lld", "main.o"],
                c
            ),
            expected
        );
        assert!(options(DriverKind::Gcc, &["main.o", "-lm"], c).is_empty());
        assert!(options(DriverKind::Gcc, &["-fuse-ld=lld", "-c", "a.c"], c).is_empty());
        // No clang for the backend compiles: the link runs as without the wrapper.
        assert!(options(DriverKind::Gcc, &["-fuse-ld=lld", "main.o"], None).is_empty());
    }

    #[test]
    fn clang_with_lto_gets_the_distributor_flag() {
        let link = ["-flto=thin", "-fuse-ld=lld", "a.o", "-o", "app"];
        assert_eq!(
            options(DriverKind::Clang, &link, Some(("/usr/bin/clang", false))),
            ["-fthinlto-distributor=/d/dtlto-reapi"]
        );
        // A multi-call binary behind a script is named, with `clang` first on every backend command.
        assert_eq!(
            options(DriverKind::Clang, &link, Some(("/z/zig", true))),
            [
                "-fthinlto-distributor=/d/dtlto-reapi",
                "-Xlinker",
                "--thinlto-remote-compiler=/z/zig",
                "-Xlinker",
                "--thinlto-remote-compiler-prepend-arg=clang"
            ]
        );
        // The user's own remote compiler is kept.
        let mut own = link.to_vec();
        own.push("-Wl,--thinlto-remote-compiler=/opt/clang");
        assert_eq!(
            options(DriverKind::Clang, &own, Some(("/z/zig", true))),
            ["-fthinlto-distributor=/d/dtlto-reapi"]
        );
    }

    #[test]
    fn clang_without_lto_names_distributor_and_compiler_to_lld() {
        // rustc's link of -Clinker-plugin-lto bitcode: no -flto, lld.
        let link = ["-m64", "main.o", "-fuse-ld=lld", "-o", "app"];
        assert_eq!(
            options(DriverKind::Clang, &link, Some(("/z/zig", true))),
            [
                "-Xlinker",
                "--thinlto-distributor=/d/dtlto-reapi",
                "-Xlinker",
                "--thinlto-remote-compiler=/z/zig",
                "-Xlinker",
                "--thinlto-remote-compiler-prepend-arg=clang"
            ]
        );
        // No compiler to be found: the link runs as without the wrapper.
        assert!(options(DriverKind::Clang, &link, None).is_empty());
    }

    #[test]
    fn msvc_targets_get_lld_link_options() {
        let link = [
            "--target=x86_64-pc-windows-msvc",
            "-flto=thin",
            "-fuse-ld=lld",
            "a.o",
        ];
        assert_eq!(
            options(DriverKind::Clang, &link, Some(("/usr/bin/clang", false))),
            [
                "-Xlinker",
                "/thinlto-distributor:/d/dtlto-reapi",
                "-Xlinker",
                "/thinlto-remote-compiler:/usr/bin/clang"
            ]
        );
        let cl = ["-flto=thin", "-fuse-ld=lld", "a.obj"];
        assert_eq!(
            options(DriverKind::ClangCl, &cl, Some(("/usr/bin/clang-cl", false))),
            [
                "/link",
                "/thinlto-distributor:/d/dtlto-reapi",
                "/thinlto-remote-compiler:/usr/bin/clang-cl"
            ]
        );
        assert_eq!(
            options(
                DriverKind::Coff,
                &["a.obj", "/out:a.exe"],
                Some(("/z/zig", true))
            ),
            [
                "/thinlto-distributor:/d/dtlto-reapi",
                "/thinlto-remote-compiler:/z/zig",
                "/thinlto-remote-compiler-prepend-arg:clang"
            ]
        );
    }

    #[test]
    fn lld_gets_distributor_and_compiler() {
        assert_eq!(
            options(
                DriverKind::Elf,
                &["a.o", "-o", "app"],
                Some(("/usr/bin/clang", false))
            ),
            [
                "--thinlto-distributor=/d/dtlto-reapi",
                "--thinlto-remote-compiler=/usr/bin/clang"
            ]
        );
    }

    #[test]
    fn compiles_other_linkers_and_own_distributors_pass_through() {
        let c = Some(("/usr/bin/clang", false));
        for list in [
            &["-flto=thin", "-c", "a.c", "-o", "a.o"][..],
            &["-flto=thin", "a.o"],                 // default linker
            &["-flto=thin", "-fuse-ld=bfd", "a.o"], // not lld
            &[
                "-flto=thin",
                "-fuse-ld=lld",
                "-fthinlto-distributor=/x",
                "a.o",
            ],
            &["-fuse-ld=lld", "--print-search-dirs"],
        ] {
            assert!(options(DriverKind::Clang, list, c).is_empty(), "{list:?}");
        }
        assert!(options(DriverKind::Elf, &["--thinlto-distributor=/x", "a.o"], c).is_empty());
        // Arguments for the distributor are not a distributor.
        let with_x = [
            "-flto=thin",
            "-fuse-ld=lld",
            "-Xthinlto-distributor=--jobs=2",
            "a.o",
        ];
        assert_eq!(options(DriverKind::Clang, &with_x, c).len(), 1);
        assert!(options(DriverKind::Other("ld.bfd".into()), &["a.o"], c).is_empty());
        // The last -flto/-fno-lto decides.
        assert!(!lto_enabled(&args(&["-flto=thin", "-fno-lto"])));
        assert!(lto_enabled(&args(&["-fno-lto", "-flto"])));
    }

    #[test]
    fn the_cc1_line_names_clangs_executable() {
        assert_eq!(
            cc1_executable(r#" "/opt/z ig/zig" "-cc1" "-triple" "x86_64""#),
            Some(PathBuf::from("/opt/z ig/zig"))
        );
        assert_eq!(
            cc1_executable(r#" "/a\"b/clang" "-cc1""#),
            Some(PathBuf::from("/a\"b/clang"))
        );
        assert_eq!(cc1_executable(r#" "/usr/bin/ld.lld" "-o" "a""#), None);
        assert_eq!(cc1_executable("clang version 22.1.8"), None);
    }

    #[test]
    fn wrapper_names_strip_the_suffix() {
        // The test process is not inside a wrapped link.
        assert_eq!(
            wrapped_driver(OsStr::new("/usr/local/bin/cc-dtlto")),
            Some(OsString::from("cc"))
        );
        assert_eq!(
            wrapped_driver(OsStr::new("ld.lld-dtlto")),
            Some(OsString::from("ld.lld"))
        );
        assert_eq!(wrapped_driver(OsStr::new("dtlto-reapi")), None);
        assert_eq!(wrapped_driver(OsStr::new("-dtlto")), None);
    }
}
