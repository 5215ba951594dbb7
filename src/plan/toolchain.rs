//! The compiler as part of every Action: what it is made of (its closure), the digest that names
//! it (its identity), and how an action runs it.
//!
//! - **Closure**: a statically linked compiler is one file. A dynamically linked one also needs its
//!   `DT_NEEDED` libraries, resolved the way the dynamic loader would (RPATH, `LD_LIBRARY_PATH`,
//!   RUNPATH with `$ORIGIN`, the system's library directories), and the loader itself (`PT_INTERP`).
//!   A `#!` script is its own content only: what it runs is unknown. `LD_LIBRARY_PATH` is the
//!   compiles' own (see `environment`), not the distributor's: local compiles run with that
//!   environment, so the libraries found are the ones a local compile loads.
//! - **Identity**: the digest of the closure as a REAPI Directory tree (`bin/<compiler>`,
//!   `lib/<library>`), so it depends on every file's content and name, never on where the files
//!   are on this machine.
//! - **Upload mode**: the closure is placed in the input root under
//!   `.dtlto-reapi/toolchain/<identity>/` and run from there; a dynamic compiler is run through its
//!   own loader, `<loader> --library-path <lib> <compiler> ...`, so nothing comes from the worker.
//!   **Worker mode**: the action runs the compiler at its path on the workers, and the identity goes
//!   into `Action.salt`.
//!
//! The loader searches a file's `DT_RPATH` before `--library-path`: a compiler or library whose
//! `DT_RPATH` leads outside the uploaded directory could load a worker's library, so such a
//! compiler is not uploaded (worker mode, with the reason).
//!
//! Run through its loader, a process's `/proc/self/exe` is the loader. clang reads it to find its
//! resource directory (headers, unused by a bitcode-to-object backend compile) and to re-execute
//! itself for `-cc1`, which it does not do by default (`-fintegrated-cc1`): a link that passes
//! `-fno-integrated-cc1` to the backend compiles falls back to worker mode.

use std::collections::{HashSet, VecDeque};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};
use object::{Endianness, ReadCache};

use super::environment::Environment;
use super::merkle::{TreeEntry, build_tree};
use super::options::ToolchainMode;
use crate::cache::DigestCache;
use crate::platform;
use crate::reapi::digest::Digest;

/// Where the toolchain goes, relative to the action's working directory (followed by the identity).
const TOOLCHAIN_DIR: &str = ".dtlto-reapi/toolchain";

/// The most shared libraries a compiler may need.
const MAX_LIBRARIES: usize = 256;

/// Which compiler built an action's outputs, as recorded in every [`super::action::ActionSpec`].
#[derive(Debug, Clone, PartialEq)]
pub struct ToolchainIdentity {
    pub mode: ToolchainMode,
    /// The digest of the compiler's closure as a Directory tree.
    pub digest: Digest,
}

/// One file of the compiler's closure.
#[derive(Debug, Clone)]
pub struct ToolchainFile {
    /// Its path inside the toolchain directory (`bin/clang`, `lib/libLLVM.so.22.1`).
    pub path: String,
    pub local: PathBuf,
    pub digest: Digest,
    pub executable: bool,
}

/// The link's compiler, resolved once per link.
#[derive(Debug, Clone)]
pub struct Toolchain {
    pub identity: ToolchainIdentity,
    /// The compiler the actions run: as the job file names it, or `--upload-compiler`.
    pub compiler: PathBuf,
    pub files: Vec<ToolchainFile>,
    /// Whether a local compile runs the compiler the Actions describe: false when
    /// `--upload-compiler` names a file with other contents than the local compiler. Only then may
    /// a local compile's results be stored under an Action's digest.
    pub local_is_uploaded: bool,
    /// Upload mode: what replaces `common.args[0]`, relative to the working directory.
    launch: Vec<String>,
}

/// What the compiler executable is.
enum Kind {
    Static,
    Dynamic,
    Script,
    Unsupported(String),
}

/// The settings that choose a toolchain mode.
#[derive(Debug, Clone, Copy)]
pub struct ModeRequest<'a> {
    /// `--toolchain`, when given.
    pub toolchain: Option<ToolchainMode>,
    /// `--remote-compiler`, which means worker mode.
    pub remote_compiler: Option<&'a str>,
    /// `--upload-compiler`: the compiler to upload instead of the local one (upload mode).
    pub upload_compiler: Option<&'a Path>,
}

impl Toolchain {
    /// Resolves the link's compiler (`common_args[0]`) and its closure for compiles run with
    /// `environment`, hashing its files through `digests`. Returns the toolchain and, when upload mode was wanted but is impossible, why
    /// (the caller warns where it matters).
    pub fn resolve(
        common_args: &[String],
        request: ModeRequest<'_>,
        environment: &Environment,
        digests: &DigestCache,
    ) -> Result<(Toolchain, Option<String>), String> {
        let compiler = PathBuf::from(&common_args[0]);
        if request.remote_compiler.is_some() && request.toolchain == Some(ToolchainMode::Upload) {
            return Err(
                "--toolchain=upload and --remote-compiler contradict each other: \
                 --remote-compiler names the compiler on the workers (worker mode)"
                    .to_owned(),
            );
        }
        if request.upload_compiler.is_some()
            && (request.remote_compiler.is_some()
                || request.toolchain == Some(ToolchainMode::Worker))
        {
            return Err(
                "--upload-compiler contradicts --remote-compiler and --toolchain=worker: it names \
                 the compiler to upload (upload mode)"
                    .to_owned(),
            );
        }
        let local = locate(&compiler)?;
        // The compiler the actions run: the uploaded one when named, else the local one.
        let (compiler, uploaded) = match request.upload_compiler {
            Some(upload) => (upload.to_path_buf(), locate(upload)?),
            None => (compiler, local.clone()),
        };
        let ld_library_path = environment.get("LD_LIBRARY_PATH").unwrap_or_default();
        let (kind, mut closure) = closure(&compiler, &uploaded, ld_library_path)?;
        if request.upload_compiler.is_some()
            && let Kind::Script | Kind::Unsupported(_) = kind
        {
            let reason = match kind {
                Kind::Unsupported(reason) => reason,
                _ => "a script (#!) runs programs that are not uploaded with it".to_owned(),
            };
            return Err(format!(
                "--upload-compiler {} cannot be uploaded: {reason}",
                compiler.display()
            ));
        }
        let mut why_not = None;
        let mode = if request.remote_compiler.is_some()
            || request.toolchain == Some(ToolchainMode::Worker)
        {
            ToolchainMode::Worker
        } else {
            match kind {
                Kind::Static => ToolchainMode::Upload,
                Kind::Dynamic if common_args.iter().any(|a| a == "-fno-integrated-cc1") => {
                    why_not = Some(format!(
                        "the compiler {} is dynamically linked and the backend compiles pass \
                         -fno-integrated-cc1: clang would re-execute its dynamic loader for -cc1",
                        compiler.display()
                    ));
                    ToolchainMode::Worker
                }
                Kind::Dynamic => ToolchainMode::Upload,
                Kind::Script => {
                    why_not = Some(format!(
                        "the compiler {0} is a script (#!), which cannot run on a worker without \
                         what it calls: link with -Wl,--thinlto-remote-compiler=<the executable \
                         it runs> and -Wl,--thinlto-remote-compiler-prepend-arg=<ARG> for each \
                         argument the script puts before the compile's own (e.g. `clang` for \
                         `zig clang`)",
                        compiler.display()
                    ));
                    ToolchainMode::Worker
                }
                Kind::Unsupported(ref reason) => {
                    why_not = Some(format!(
                        "the compiler {} cannot be uploaded ({reason})",
                        compiler.display()
                    ));
                    ToolchainMode::Worker
                }
            }
        };
        closure.sort_by(|a, b| a.0.cmp(&b.0));
        closure.dedup_by(|a, b| a.0 == b.0);
        let mut files = Vec::with_capacity(closure.len());
        for (path, local, executable) in closure {
            let (digest, meta) = digests
                .digest_of(&local)
                .map_err(|e| format!("cannot read {}: {e}", local.display()))?;
            files.push(ToolchainFile {
                path,
                local,
                digest,
                executable: executable || platform::executable_bit(&meta),
            });
        }
        let tree = build_tree(
            files
                .iter()
                .map(|f| TreeEntry {
                    path: &f.path,
                    digest: &f.digest,
                    executable: f.executable,
                })
                .collect(),
        )?;
        let identity = ToolchainIdentity {
            mode,
            digest: tree.root_digest,
        };
        let local_is_uploaded = uploaded == local || {
            let digest = |path: &Path| digests.digest_of(path).map(|(d, _)| d).ok();
            digest(&local).is_some() && digest(&local) == digest(&uploaded)
        };
        let dir = format!("{TOOLCHAIN_DIR}/{}", identity.digest.hash);
        let name = compiler_name(&compiler)?;
        let launch = match (&kind, mode) {
            (_, ToolchainMode::Worker) => Vec::new(),
            (Kind::Dynamic, _) => {
                let loader = files
                    .iter()
                    .find(|f| f.path.starts_with(LOADER_PREFIX))
                    .map(|f| f.path.clone())
                    .ok_or("the dynamic loader is missing from the closure")?;
                vec![
                    format!("{dir}/{loader}"),
                    "--library-path".to_owned(),
                    format!("{dir}/lib"),
                    format!("{dir}/bin/{name}"),
                ]
            }
            _ => vec![format!("{dir}/bin/{name}")],
        };
        let toolchain = Toolchain {
            identity,
            compiler,
            files,
            local_is_uploaded,
            launch,
        };
        Ok((toolchain, why_not))
    }

    /// Upload mode: the arguments that replace `common.args[0]` (paths relative to the working
    /// directory); empty in worker mode.
    pub fn launch(&self) -> &[String] {
        &self.launch
    }

    /// Upload mode: `(path relative to the working directory, file)` of every toolchain file the
    /// input root holds; empty in worker mode.
    pub fn inputs(&self) -> Vec<(String, &ToolchainFile)> {
        if self.identity.mode == ToolchainMode::Worker {
            return Vec::new();
        }
        let dir = format!("{TOOLCHAIN_DIR}/{}", self.identity.digest.hash);
        self.files
            .iter()
            .map(|f| (format!("{dir}/{}", f.path), f))
            .collect()
    }

    /// The total size of the closure, in bytes.
    pub fn size(&self) -> u64 {
        self.files
            .iter()
            .map(|f| u64::try_from(f.digest.size_bytes).unwrap_or(0))
            .sum()
    }
}

/// The loader's place in the toolchain directory starts with this.
const LOADER_PREFIX: &str = "loader/";

fn compiler_name(compiler: &Path) -> Result<String, String> {
    compiler
        .file_name()
        .and_then(OsStr::to_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            format!(
                "the compiler path {} has no usable file name",
                compiler.display()
            )
        })
}

/// The compiler's file: its path as given when it has a `/` (on Windows also `\` or a drive),
/// else looked up in `PATH` (on Windows with `PATHEXT`).
pub(crate) fn locate(compiler: &Path) -> Result<PathBuf, String> {
    if platform::names_a_path(compiler.as_os_str()) {
        return Ok(compiler.to_path_buf());
    }
    platform::find_on_path(compiler.as_os_str(), |_| true)
        .ok_or_else(|| format!("the compiler {} is not in PATH", compiler.display()))
}

/// `(path in the toolchain directory, local file, must be executable)`.
type ClosureFile = (String, PathBuf, bool);

/// Every file the compiler needs, and what kind of executable it is.
fn closure(
    compiler: &Path,
    local: &Path,
    ld_library_path: &str,
) -> Result<(Kind, Vec<ClosureFile>), String> {
    let name = compiler_name(compiler)?;
    let mut files = vec![(format!("bin/{name}"), local.to_path_buf(), true)];
    let mut magic = [0u8; 4];
    let read = std::fs::File::open(local)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut magic))
        .map_err(|e| format!("cannot read the compiler {}: {e}", local.display()))?;
    if magic[..read.min(2)] == *b"#!" {
        return Ok((Kind::Script, files));
    }
    if magic[..read] != *b"\x7fELF" {
        return Ok((Kind::Unsupported("not an ELF executable".to_owned()), files));
    }
    let exe = match read_elf(local) {
        Ok(exe) => exe,
        Err(e) => return Ok((Kind::Unsupported(e), files)),
    };
    let Some(interpreter) = &exe.interpreter else {
        return Ok((Kind::Static, files));
    };
    match libraries(local, &exe, ld_library_path) {
        Ok(libraries) => {
            let loader_name = interpreter
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "ld.so".to_owned());
            files.push((
                format!("{LOADER_PREFIX}{loader_name}"),
                interpreter.clone(),
                true,
            ));
            files.extend(
                libraries
                    .into_iter()
                    .map(|(name, path)| (format!("lib/{name}"), path, false)),
            );
            Ok((Kind::Dynamic, files))
        }
        Err(e) => Ok((Kind::Unsupported(e), files)),
    }
}

/// What the loader needs to know of one ELF file.
#[derive(Debug, Default)]
struct ElfInfo {
    machine: elf::Machine,
    interpreter: Option<PathBuf>,
    needed: Vec<String>,
    rpath: Vec<String>,
    runpath: Vec<String>,
}

/// Reads the program and dynamic headers of a 64-bit ELF file (only the headers are read).
fn read_elf(path: &Path) -> Result<ElfInfo, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let cache = ReadCache::new(file);
    let error = |e: object::Error| format!("{}: {e}", path.display());
    let elf = ElfFile64::<Endianness, _>::parse(&cache).map_err(error)?;
    let (endian, data) = (elf.endian(), elf.data());
    let mut info = ElfInfo {
        machine: elf.elf_header().e_machine(endian),
        ..ElfInfo::default()
    };
    for header in elf.elf_program_headers() {
        if let Some(interp) = header.interpreter(endian, data).map_err(error)? {
            let interp = interp.strip_suffix(&[0]).unwrap_or(interp);
            info.interpreter = Some(PathBuf::from(platform::os_string_from_bytes(
                interp.to_vec(),
            )));
        }
    }
    let table = elf
        .elf_section_table()
        .dynamic_table(endian, data)
        .map_err(error)?;
    for entry in &table {
        let list = match entry.tag {
            elf::DT_NEEDED => &mut info.needed,
            elf::DT_RPATH => &mut info.rpath,
            elf::DT_RUNPATH => &mut info.runpath,
            _ => continue,
        };
        let value = String::from_utf8_lossy(table.string(entry).map_err(error)?).into_owned();
        if entry.tag == elf::DT_NEEDED {
            list.push(value);
        } else {
            list.extend(
                value
                    .split(':')
                    .filter(|d| !d.is_empty())
                    .map(str::to_owned),
            );
        }
    }
    Ok(info)
}

/// Every library `exe` (at `path`) needs, transitively, as `(DT_NEEDED name, file)`, found the
/// way the dynamic loader finds them with `ld_library_path`.
fn libraries(
    path: &Path,
    exe: &ElfInfo,
    ld_library_path: &str,
) -> Result<Vec<(String, PathBuf)>, String> {
    let system = system_library_dirs();
    let ld_library_path: Vec<String> = ld_library_path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
        .collect();
    let loader_name = exe
        .interpreter
        .as_ref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    let mut found = Vec::new();
    let mut seen: HashSet<String> = loader_name.into_iter().collect();
    let exe_origin = origin_of(path);
    let mut pending: VecDeque<(String, PathBuf)> = VecDeque::new();
    let enqueue = |requester: &ElfInfo,
                   origin: &Path,
                   seen: &mut HashSet<String>,
                   pending: &mut VecDeque<(String, PathBuf)>|
     -> Result<(), String> {
        for name in &requester.needed {
            if !seen.insert(name.clone()) {
                continue;
            }
            // Search order: RPATH (the requester's, then the executable's) unless the requester
            // has a RUNPATH, LD_LIBRARY_PATH, RUNPATH, the system directories.
            let mut dirs: Vec<PathBuf> = Vec::new();
            if requester.runpath.is_empty() {
                dirs.extend(expand(&requester.rpath, origin));
                dirs.extend(expand(&exe.rpath, &exe_origin));
            }
            dirs.extend(ld_library_path.iter().map(PathBuf::from));
            dirs.extend(expand(&requester.runpath, origin));
            dirs.extend(system.iter().cloned());
            let file = if name.contains('/') {
                Some(PathBuf::from(name))
            } else {
                dirs.iter()
                    .map(|dir| dir.join(name))
                    .find(|candidate| is_library_for(candidate, exe.machine))
            };
            let file = file.ok_or_else(|| {
                format!(
                    "its library {name} is not found where the dynamic loader would look ({})",
                    dirs.iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(":")
                )
            })?;
            pending.push_back((name.clone(), file));
        }
        Ok(())
    };
    refuse_foreign_rpath(exe, "bin", path)?;
    enqueue(exe, &exe_origin, &mut seen, &mut pending)?;
    while let Some((name, file)) = pending.pop_front() {
        let info = read_elf(&file)?;
        refuse_foreign_rpath(&info, "lib", &file)?;
        enqueue(&info, &origin_of(&file), &mut seen, &mut pending)?;
        found.push((name, file));
        if found.len() > MAX_LIBRARIES {
            return Err(format!("it needs more than {MAX_LIBRARIES} libraries"));
        }
    }
    Ok(found)
}

/// Upload mode runs the compiler as `<loader> --library-path <uploaded lib> ...`, but the loader
/// searches a file's `DT_RPATH` (in effect when it has no `DT_RUNPATH`) *before* that path: an
/// entry outside the uploaded toolchain directory could load a worker's library instead of the
/// uploaded one, which is not what the key names. Such a file makes the compiler one that cannot
/// be uploaded, with the reason. (`DT_RUNPATH` is searched after `--library-path`, where every
/// needed library is found, so it cannot interfere.) `dir` is where the file lies in the
/// toolchain directory, which `$ORIGIN` names on a worker.
fn refuse_foreign_rpath(elf: &ElfInfo, dir: &str, path: &Path) -> Result<(), String> {
    if !elf.runpath.is_empty() {
        return Ok(());
    }
    match elf.rpath.iter().find(|entry| !inside_toolchain(entry, dir)) {
        None => Ok(()),
        Some(entry) => Err(format!(
            "{} has the DT_RPATH entry {entry}, which the dynamic loader searches before the \
             uploaded libraries: on a worker a library there would be loaded instead of the \
             uploaded one (a compiler linked with $ORIGIN-relative paths, or with DT_RUNPATH \
             (--enable-new-dtags), can be uploaded)",
            path.display()
        )),
    }
}

/// Whether the search-path `entry` of a file in `dir` of the toolchain directory stays inside
/// that directory: `$ORIGIN`-relative without leaving it (an absolute path, a relative one — to
/// the process's working directory — or one with other tokens does not).
fn inside_toolchain(entry: &str, dir: &str) -> bool {
    let Some(rest) = ["$ORIGIN", "${ORIGIN}"]
        .iter()
        .find_map(|origin| entry.strip_prefix(origin))
    else {
        return false;
    };
    if !(rest.is_empty() || rest.starts_with('/')) || rest.contains('$') {
        return false;
    }
    let mut depth = dir.split('/').count();
    for component in rest.split('/') {
        match component {
            "" | "." => {}
            ".." if depth == 0 => return false,
            ".." => depth -= 1,
            _ => depth += 1,
        }
    }
    true
}

/// `$ORIGIN` for the file at `path`: the directory of its real path.
fn origin_of(path: &Path) -> PathBuf {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    real.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// Search-path entries with `$ORIGIN` replaced; entries with other tokens (`$LIB`, `$PLATFORM`)
/// are skipped rather than guessed.
fn expand(entries: &[String], origin: &Path) -> Vec<PathBuf> {
    let origin = origin.to_string_lossy();
    entries
        .iter()
        .map(|e| e.replace("${ORIGIN}", &origin).replace("$ORIGIN", &origin))
        .filter(|e| !e.contains('$'))
        .map(PathBuf::from)
        .collect()
}

/// Whether `path` is an ELF file for `machine` (the loader skips libraries of other machines).
fn is_library_for(path: &Path, machine: elf::Machine) -> bool {
    path.is_file() && read_elf(path).is_ok_and(|info| info.machine == machine)
}

/// The directories the loader searches last: those of `/etc/ld.so.conf.d` (the source of its
/// cache), then the defaults.
fn system_library_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut confs: Vec<PathBuf> = std::fs::read_dir("/etc/ld.so.conf.d")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "conf"))
                .collect()
        })
        .unwrap_or_default();
    confs.sort();
    for conf in confs {
        let text = std::fs::read_to_string(conf).unwrap_or_default();
        dirs.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| l.starts_with('/'))
                .map(PathBuf::from),
        );
    }
    dirs.extend(["/lib64", "/usr/lib64", "/lib", "/usr/lib"].map(PathBuf::from));
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(toolchain: Option<ToolchainMode>) -> ModeRequest<'static> {
        ModeRequest {
            toolchain,
            remote_compiler: None,
            upload_compiler: None,
        }
    }

    fn resolve(compiler: &Path, request: ModeRequest<'_>) -> (Toolchain, Option<String>) {
        let digests = DigestCache::open(None);
        let args = vec![compiler.to_string_lossy().into_owned(), "-c".to_owned()];
        let environment = Environment::new(&[]).unwrap();
        Toolchain::resolve(&args, request, &environment, &digests).unwrap()
    }

    #[test]
    fn a_script_is_worker_mode_with_advice() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("clang");
        std::fs::write(&script, "#!/bin/sh\nexec zig clang \"$@\"\n").unwrap();
        let (toolchain, why_not) = resolve(&script, request(None));
        assert_eq!(toolchain.identity.mode, ToolchainMode::Worker);
        assert!(toolchain.launch().is_empty() && toolchain.inputs().is_empty());
        let why_not = why_not.unwrap();
        assert!(why_not.contains("--thinlto-remote-compiler="), "{why_not}");
        assert!(why_not.contains("prepend-arg"), "{why_not}");
    }

    #[test]
    fn the_identity_is_the_content_not_the_place() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            dir.path().join("a/cc"),
            dir.path().join("b/cc"),
            dir.path().join("c/cc"),
        );
        for (path, content) in [(&a, &b"#!x"[..]), (&b, b"#!x"), (&c, b"#!x\n")] {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        let id = |p: &Path| resolve(p, request(None)).0.identity.digest;
        assert_eq!(id(&a), id(&b));
        assert_ne!(id(&a), id(&c));
    }

    #[test]
    fn an_upload_compiler_is_what_the_actions_run_and_key() {
        let dir = tempfile::tempdir().unwrap();
        // The "local" compiler: a script (not uploadable by itself, like a Windows zig.exe on a
        // Linux worker); the upload compiler: this test's own ELF executable, under another name.
        let local = dir.path().join("zig.exe");
        std::fs::write(&local, "#!/bin/sh\n").unwrap();
        let upload = dir.path().join("linux/zig");
        std::fs::create_dir_all(upload.parent().unwrap()).unwrap();
        std::fs::copy(std::env::current_exe().unwrap(), &upload).unwrap();
        fn with(upload: &Path) -> ModeRequest<'_> {
            ModeRequest {
                upload_compiler: Some(upload),
                ..request(None)
            }
        }
        let (toolchain, why_not) = resolve(&local, with(&upload));
        assert_eq!(
            (toolchain.identity.mode, why_not),
            (ToolchainMode::Upload, None)
        );
        assert!(!toolchain.local_is_uploaded);
        assert!(toolchain.launch().last().unwrap().ends_with("/bin/zig"));
        assert_eq!(toolchain.compiler, upload);
        // The same bytes as the local compiler: local compiles are the actions' computation.
        let (same, _) = resolve(&upload, with(&upload));
        assert!(same.local_is_uploaded);
        assert_eq!(same.identity, toolchain.identity);
        // A script cannot be uploaded; worker mode contradicts it.
        let digests = DigestCache::open(None);
        let environment = Environment::new(&[]).unwrap();
        let args = vec![upload.to_string_lossy().into_owned()];
        let script = Toolchain::resolve(&args, with(&local), &environment, &digests);
        assert!(script.unwrap_err().contains("cannot be uploaded"));
        let worker = ModeRequest {
            toolchain: Some(ToolchainMode::Worker),
            ..with(&upload)
        };
        let contradiction = Toolchain::resolve(&args, worker, &environment, &digests);
        assert!(contradiction.unwrap_err().contains("contradicts"));
    }

    #[test]
    fn the_test_binary_resolves_like_the_loader() {
        // This test's own executable: dynamically linked against the system's libc.
        let exe = std::env::current_exe().unwrap();
        let (toolchain, why_not) = resolve(&exe, request(None));
        assert_eq!(why_not, None);
        assert_eq!(toolchain.identity.mode, ToolchainMode::Upload);
        let paths: Vec<&str> = toolchain.files.iter().map(|f| f.path.as_str()).collect();
        assert!(
            paths.iter().any(|p| p.starts_with("lib/libc.so")),
            "{paths:?}"
        );
        assert!(
            paths.iter().any(|p| p.starts_with(LOADER_PREFIX)),
            "{paths:?}"
        );
        let launch = toolchain.launch();
        assert_eq!(launch[1], "--library-path");
        assert!(launch[0].contains("/loader/"), "{launch:?}");
        assert!(launch[3].ends_with(&*exe.file_name().unwrap().to_string_lossy()));

        let worker = resolve(&exe, request(Some(ToolchainMode::Worker))).0;
        assert_eq!(worker.identity.mode, ToolchainMode::Worker);
        assert_eq!(worker.identity.digest, toolchain.identity.digest);
        let both = ModeRequest {
            toolchain: Some(ToolchainMode::Upload),
            remote_compiler: Some("/usr/bin/clang"),
            upload_compiler: None,
        };
        let digests = DigestCache::open(None);
        let args = vec![exe.to_string_lossy().into_owned()];
        let environment = Environment::new(&[]).unwrap();
        assert!(Toolchain::resolve(&args, both, &environment, &digests).is_err());
    }

    #[test]
    fn only_origin_relative_rpath_entries_inside_the_toolchain_are_harmless() {
        for entry in [
            "$ORIGIN",
            "$ORIGIN/../lib",
            "${ORIGIN}/../lib/x",
            "$ORIGIN/./..",
        ] {
            assert!(inside_toolchain(entry, "bin"), "{entry}");
        }
        for entry in [
            "/opt/llvm/lib",
            "lib",
            "../lib",
            "$ORIGIN/../..",
            "$ORIGIN/../../../../usr/lib",
            "$ORIGINAL",
            "$ORIGIN/$LIB",
            "$LIB",
        ] {
            assert!(!inside_toolchain(entry, "bin"), "{entry}");
        }
        let elf = |rpath: &[&str], runpath: &[&str]| ElfInfo {
            rpath: rpath.iter().map(|s| (*s).to_owned()).collect(),
            runpath: runpath.iter().map(|s| (*s).to_owned()).collect(),
            ..ElfInfo::default()
        };
        let file = Path::new("/opt/llvm/lib/libLLVM.so");
        let err = refuse_foreign_rpath(&elf(&["$ORIGIN", "/opt/llvm/lib"], &[]), "lib", file);
        let err = err.unwrap_err();
        assert!(err.contains("/opt/llvm/lib/libLLVM.so has the DT_RPATH entry /opt/llvm/lib"));
        // With a DT_RUNPATH the loader ignores DT_RPATH, and searches --library-path first.
        let with_runpath = elf(&["/opt/llvm/lib"], &["/opt/llvm/lib"]);
        assert_eq!(refuse_foreign_rpath(&with_runpath, "lib", file), Ok(()));
        assert_eq!(refuse_foreign_rpath(&elf(&[], &[]), "lib", file), Ok(()));
    }

    /// Links a small program with the system's C compiler and `flags`, in `dir`.
    fn program_linked_with(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
        let source = dir.join("main.c");
        std::fs::write(&source, "int main(void) { return 0; }\n").unwrap();
        let exe = dir.join(name);
        let status = std::process::Command::new("cc")
            .arg(&source)
            .arg("-o")
            .arg(&exe)
            .args(flags)
            .status()
            .unwrap();
        assert!(status.success());
        exe
    }

    #[test]
    fn a_compiler_with_an_absolute_rpath_is_refused_for_upload_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let old_tags = "-Wl,--disable-new-dtags";
        let absolute = program_linked_with(dir.path(), "a", &[old_tags, "-Wl,-rpath,/opt/x/lib"]);
        let (toolchain, why_not) = resolve(&absolute, request(None));
        assert_eq!(toolchain.identity.mode, ToolchainMode::Worker);
        let why_not = why_not.unwrap();
        assert!(
            why_not.contains("has the DT_RPATH entry /opt/x/lib") && why_not.contains("cannot be"),
            "{why_not}"
        );

        // The same path as DT_RUNPATH, or a DT_RPATH relative to $ORIGIN: uploaded.
        let runpath = "-Wl,--enable-new-dtags";
        let new_tags = program_linked_with(dir.path(), "b", &[runpath, "-Wl,-rpath,/opt/x/lib"]);
        let origin = program_linked_with(dir.path(), "c", &[old_tags, "-Wl,-rpath,$ORIGIN/../lib"]);
        for exe in [new_tags, origin] {
            let (toolchain, why_not) = resolve(&exe, request(None));
            assert_eq!(why_not, None);
            assert_eq!(toolchain.identity.mode, ToolchainMode::Upload);
        }
    }

    #[test]
    fn origin_is_expanded_and_other_tokens_skipped() {
        let dirs = expand(
            &[
                "$ORIGIN/../lib".to_owned(),
                "${ORIGIN}/x".to_owned(),
                "$LIB/y".to_owned(),
            ],
            Path::new("/opt/llvm/bin"),
        );
        assert_eq!(
            dirs,
            [
                PathBuf::from("/opt/llvm/bin/../lib"),
                PathBuf::from("/opt/llvm/bin/x")
            ]
        );
    }
}
