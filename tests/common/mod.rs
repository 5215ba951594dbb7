//! Shared support for the integration tests: a real clang/lld (found or installed by
//! `scripts/toolchain.sh`, see `tools`), a builder that writes C sources into a temporary project, compiles them
//! with `-flto=thin`, archives some, links through the built `dtlto-reapi` binary (reading its
//! `--stats-json` and native objects back) and runs the program, the generated programs the tests
//! link, and a handle on a `dtlto-reapi serve` test server for remote tests.
//!
//! Every test links real programs, so a missing toolchain is a test failure, never a skip.
//! Each integration test crate uses its own subset of these helpers, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use tempfile::TempDir;

#[path = "../serve_process/mod.rs"]
mod serve_process;
#[path = "../tools/mod.rs"]
pub mod tools;

pub use tools::toolchain;

/// Target triple for every compile and link: the toolchain may default to musl (ziglang), and the
/// programs must link against the system's glibc.
pub const TARGET: &str = "--target=x86_64-linux-gnu";

/// The `dtlto-reapi` binary that Cargo built for this test run.
pub fn distributor() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_dtlto-reapi"))
}

/// `Command::new(program)` with the test process's private home and none of the developer's
/// `DTLTO_REAPI_*` variables (see `isolation`): for every command that runs `dtlto-reapi`, directly
/// or through a compiler driver, linker, build system or wrapper.
pub fn isolated(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    serve_process::isolation::isolate(&mut cmd);
    cmd
}

/// The built `dtlto-reapi`, isolated like [`isolated`].
pub fn dtlto_reapi() -> Command {
    isolated(distributor())
}

/// Runs a command to completion, capturing its output; panics only when it cannot be started.
pub fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Polls `done` every 20 ms for at most `limit`; returns whether it became true. For what a test
/// waits on (a process gone, a file written), never for how fast something is.
pub fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Like [`run`], and panics with the command's stderr unless it exits 0.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A C project in a temporary directory: sources are compiled to ThinLTO bitcode as they are added,
/// and every object or archive becomes a link input, in the order added (so add archives last).
///
/// All paths given to it are relative to its working directory and are passed to clang and lld
/// as relative paths, exactly as a build system would; they may contain spaces, parentheses and
/// Unicode (but see `dtlto-facts.md` on non-ASCII *module* paths in LLVM 22.1.8).
pub struct Project {
    root: TempDir,
    dir: PathBuf,
    inputs: Vec<PathBuf>,
}

impl Default for Project {
    fn default() -> Self {
        Self::new()
    }
}

impl Project {
    /// A project whose working directory is a fresh temporary directory; its name contains a space
    /// and parentheses so that every test exercises them in the working directory's path.
    pub fn new() -> Self {
        Self::in_subdir("")
    }

    /// A project whose working directory is `subdir` (e.g. a Unicode name) inside a fresh temporary
    /// directory.
    pub fn in_subdir(subdir: &str) -> Self {
        let root = tempfile::Builder::new()
            .prefix("dtlto test (")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
        let dir = root.path().join(subdir);
        create_dir(&dir);
        Project {
            root,
            dir,
            inputs: Vec::new(),
        }
    }

    /// The working directory of every compile and link.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The paths passed to the link, in order.
    pub fn inputs(&self) -> &[PathBuf] {
        &self.inputs
    }

    /// The link inputs as absolute paths, for linking them from another directory.
    pub fn absolute_inputs(&self) -> Vec<PathBuf> {
        self.inputs
            .iter()
            .map(|input| self.dir.join(input))
            .collect()
    }

    /// Another checkout of this project: a fresh temporary directory holding a copy (`cp -a`) of
    /// the working directory, with the same link inputs.
    pub fn copy_elsewhere(&self) -> Project {
        let copy = Project {
            inputs: self.inputs.clone(),
            ..Project::new()
        };
        run_ok(
            Command::new("cp")
                .arg("-a")
                .arg(self.dir.join("."))
                .arg(&copy.dir),
        );
        copy
    }

    /// Adds a file made some other way (e.g. compiled for another target) to the link's inputs;
    /// `path` is relative to the working directory.
    pub fn add_input(&mut self, path: impl Into<PathBuf>) -> &mut Self {
        self.inputs.push(path.into());
        self
    }

    /// Writes `code` to `source`, compiles it and adds the object to the link.
    pub fn add_source(&mut self, source: &str, code: &str) -> &mut Self {
        let object = self.compile(source, code);
        self.inputs.push(object);
        self
    }

    /// Adds every `(path, code)` pair with [`Project::add_source`].
    pub fn add_sources<S: AsRef<str>, C: AsRef<str>>(
        &mut self,
        sources: impl IntoIterator<Item = (S, C)>,
    ) -> &mut Self {
        for (source, code) in sources {
            self.add_source(source.as_ref(), code.as_ref());
        }
        self
    }

    /// Compiles every `(path, code)` pair and puts the objects in the static archive `archive`
    /// (`$AR rcs`), which is added to the link.
    pub fn add_archive<S: AsRef<str>, C: AsRef<str>>(
        &mut self,
        archive: &str,
        sources: impl IntoIterator<Item = (S, C)>,
    ) -> &mut Self {
        let objects: Vec<PathBuf> = sources
            .into_iter()
            .map(|(source, code)| self.compile(source.as_ref(), code.as_ref()))
            .collect();
        let archive = PathBuf::from(archive);
        create_parent(&self.dir.join(&archive));
        run_ok(
            Command::new(&toolchain().ar)
                .current_dir(&self.dir)
                .arg("rcs")
                .arg(&archive)
                .args(&objects),
        );
        self.inputs.push(archive);
        self
    }

    /// Writes `code` to `source` and compiles it to `<source minus .c>.o`; returns the object's path.
    pub fn compile(&self, source: &str, code: &str) -> PathBuf {
        let source = PathBuf::from(source);
        write(&self.dir.join(&source), code.as_bytes());
        let object = source.with_extension("o");
        run_ok(
            Command::new(&toolchain().clang)
                .current_dir(&self.dir)
                .args([TARGET, "-O2", "-flto=thin", "-c"])
                .arg(&source)
                .arg("-o")
                .arg(&object),
        );
        object
    }

    /// Starts describing a link of every input to `output` (relative to the working directory; its
    /// directory is created). Give each link its own output directory when a test inspects the
    /// temporary files.
    pub fn link(&self, output: &str) -> Link<'_> {
        Link {
            project: self,
            output: PathBuf::from(output),
            distributor_args: Vec::new(),
            linker_args: Vec::new(),
            inputs: None,
            stats_json: false,
            compiler: None,
            env: Vec::new(),
            distributor: None,
        }
    }
}

/// A DTLTO link of a [`Project`] through the built `dtlto-reapi`; see [`Project::link`].
pub struct Link<'p> {
    project: &'p Project,
    output: PathBuf,
    distributor_args: Vec<OsString>,
    linker_args: Vec<OsString>,
    /// Replaces the project's inputs (e.g. the same objects named by absolute paths).
    inputs: Option<Vec<PathBuf>>,
    /// Whether the distributor writes `--stats-json` beside the output.
    stats_json: bool,
    /// The backend compiler and the arguments lld puts before the compile's own; default: the
    /// toolchain's real compiler executable ([`tools::Toolchain::compiler`]).
    compiler: Option<(PathBuf, Vec<String>)>,
    /// Environment variables set for the link (and so for the distributor).
    env: Vec<(OsString, OsString)>,
    /// What lld runs as the distributor; default: the built `dtlto-reapi`.
    distributor: Option<PathBuf>,
}

impl Link<'_> {
    /// Sets the environment variable `name` for the link, the distributor and its compiles.
    pub fn env(mut self, name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((name.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Has lld run `program` as the distributor (e.g. a script that runs `dtlto-reapi` in another
    /// environment than the link's).
    pub fn distributor(mut self, program: &Path) -> Self {
        self.distributor = Some(program.to_owned());
        self
    }

    /// Links `inputs` instead of the project's own inputs.
    pub fn inputs(mut self, inputs: Vec<PathBuf>) -> Self {
        self.inputs = Some(inputs);
        self
    }

    /// An argument for the distributor, passed as `-Xthinlto-distributor=ARG` (clang splits it on
    /// commas, as it would for a user).
    pub fn distributor_arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.distributor_args.push(arg.as_ref().to_owned());
        self
    }

    /// Each of `args` with [`Link::distributor_arg`].
    pub fn distributor_args<S: AsRef<OsStr>>(self, args: impl IntoIterator<Item = S>) -> Self {
        args.into_iter()
            .fold(self, |link, arg| link.distributor_arg(arg))
    }

    /// Runs the backend compiles through the REAPI server at `url` (`--remote=URL`).
    pub fn remote(self, url: &str) -> Self {
        self.distributor_arg(format!("--remote={url}"))
    }

    /// Has the distributor write its `--stats-json` to `<output>.stats.json`, for
    /// [`Linked::stats`].
    pub fn stats_json(mut self) -> Self {
        self.stats_json = true;
        self
    }

    /// An argument for lld, passed as `-Xlinker ARG` (no comma splitting).
    pub fn linker_arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.linker_args.push(arg.as_ref().to_owned());
        self
    }

    /// Keeps the job file, the index shards and the native objects beside the output
    /// (`--save-temps`), for [`Linked::native_objects`] and [`Linked::job_file`].
    pub fn save_temps(self) -> Self {
        self.linker_arg("--save-temps")
    }

    /// An argument appended to every backend compile (`--thinlto-remote-compiler-arg=ARG`).
    pub fn compiler_arg(self, arg: &str) -> Self {
        self.linker_arg(format!("--thinlto-remote-compiler-arg={arg}"))
    }

    /// Backend compiles run `compiler` with `prepend` before their own arguments
    /// (`--thinlto-remote-compiler`, `--thinlto-remote-compiler-prepend-arg`).
    pub fn compiler(mut self, compiler: &Path, prepend: &[&str]) -> Self {
        let prepend = prepend.iter().map(|s| (*s).to_owned()).collect();
        self.compiler = Some((compiler.to_owned(), prepend));
        self
    }

    /// Runs the link and captures what it printed; it does not judge the result.
    pub fn run(self) -> Linked {
        let tools = toolchain();
        let dir = &self.project.dir;
        create_parent(&dir.join(&self.output));
        let mut dist_flag = OsString::from("-fthinlto-distributor=");
        dist_flag.push(self.distributor.as_deref().unwrap_or(distributor()));
        let (compiler, prepend) = self.compiler.clone().unwrap_or_else(|| {
            let prepend = Some(tools.compiler_prepend.clone()).filter(|p| !p.is_empty());
            (tools.compiler.clone(), prepend.into_iter().collect())
        });
        let mut compiler_flag = OsString::from("--thinlto-remote-compiler=");
        compiler_flag.push(&compiler);
        let mut ld_flag = OsString::from("-fuse-ld=");
        ld_flag.push(&tools.lld);

        let output = dir.join(&self.output);
        let stats_path = self.stats_json.then(|| {
            let mut path = output.clone().into_os_string();
            path.push(".stats.json");
            PathBuf::from(path)
        });
        let mut cmd = isolated(&tools.clang);
        cmd.current_dir(dir)
            .args([TARGET, "-O2", "-flto=thin"])
            .arg(ld_flag)
            .args(self.inputs.as_deref().unwrap_or(&self.project.inputs))
            .arg("-o")
            .arg(&self.output)
            .arg(dist_flag)
            .arg("-Xlinker")
            .arg(compiler_flag);
        for arg in prepend {
            let flag = format!("--thinlto-remote-compiler-prepend-arg={arg}");
            cmd.arg("-Xlinker").arg(flag);
        }
        if let Some(path) = &stats_path {
            let mut flag = OsString::from("-Xthinlto-distributor=--stats-json=");
            flag.push(path);
            cmd.arg(flag);
        }
        for arg in &self.distributor_args {
            let mut flag = OsString::from("-Xthinlto-distributor=");
            flag.push(arg);
            cmd.arg(flag);
        }
        for arg in &self.linker_args {
            cmd.arg("-Xlinker").arg(arg);
        }
        cmd.envs(self.env.iter().map(|(name, value)| (name, value)));
        let out = run(&mut cmd);
        Linked::from_run(&cmd, out, output, stats_path)
    }
}

/// The result of a [`Link`].
#[derive(Debug)]
pub struct Linked {
    /// The link command, for messages.
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// Absolute path of the linked program.
    pub output: PathBuf,
    /// Where [`Link::stats_json`] had the distributor write its statistics.
    stats_path: Option<PathBuf>,
}

impl Linked {
    /// A link that `cmd` ran (e.g. a linker other than [`Link`]'s), printing `out`: `output` is the
    /// linked program's absolute path, `stats_path` where the distributor was told to write its
    /// `--stats-json`, if anywhere.
    pub fn from_run(
        cmd: &Command,
        out: Output,
        output: PathBuf,
        stats_path: Option<PathBuf>,
    ) -> Linked {
        Linked {
            command: format!("{cmd:?}"),
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            output,
            stats_path,
        }
    }

    /// Panics with the link's command and stderr unless it succeeded.
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.status.success(),
            "link failed ({}): {}\n--- stderr ---\n{}",
            self.status,
            self.command,
            self.stderr
        );
        self
    }

    /// Panics unless the link failed.
    pub fn assert_failure(&self) -> &Self {
        assert!(
            !self.status.success(),
            "link unexpectedly succeeded: {}\n--- stderr ---\n{}",
            self.command,
            self.stderr
        );
        self
    }

    /// Runs the linked program (after checking that the link succeeded) and returns its stdout;
    /// panics unless it exits 0.
    pub fn run_program(&self) -> String {
        self.assert_success();
        let out = run_ok(&mut Command::new(&self.output));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The native objects (`*.native.o`) in the output's directory, sorted by name. Needs
    /// [`Link::save_temps`], or lld deletes them after the link.
    pub fn native_objects(&self) -> Vec<PathBuf> {
        self.files_in_output_dir(|name| name.ends_with(".native.o"))
    }

    /// The contents of the native objects, sorted (their names carry lld's PID, so only the
    /// contents compare across links); needs [`Link::save_temps`].
    pub fn native_object_contents(&self) -> Vec<Vec<u8>> {
        let mut contents: Vec<Vec<u8>> = self
            .native_objects()
            .iter()
            .map(|path| fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
            .collect();
        contents.sort();
        contents
    }

    /// Panics with the link's stderr unless it contains `text`.
    pub fn assert_stderr_contains(&self, text: &str) -> &Self {
        assert!(
            self.stderr.contains(text),
            "{text:?} is not in the link's stderr:\n{}",
            self.stderr
        );
        self
    }

    /// The distributor's statistics; needs [`Link::stats_json`]. Panics (with the link's stderr)
    /// when the distributor wrote none.
    pub fn stats(&self) -> Stats {
        self.written_stats().unwrap_or_else(|| {
            panic!(
                "the link wrote no --stats-json\n--- stderr ---\n{}",
                self.stderr
            )
        })
    }

    /// The distributor's statistics, or `None` when it did not get far enough to write them;
    /// needs [`Link::stats_json`].
    pub fn written_stats(&self) -> Option<Stats> {
        let path = self
            .stats_path
            .as_ref()
            .expect("the link was run without stats_json()");
        path.exists().then(|| Stats::read(path))
    }

    /// The job file lld wrote (`<output>.<PID>.dist-file.json`); needs [`Link::save_temps`].
    pub fn job_file(&self) -> PathBuf {
        let files = self.files_in_output_dir(|name| name.ends_with(".dist-file.json"));
        match files.as_slice() {
            [one] => one.clone(),
            _ => panic!(
                "expected one job file beside {}, found {files:?} (was the link run with save_temps?)",
                self.output.display()
            ),
        }
    }

    /// The job file, parsed.
    pub fn jobs(&self) -> serde_json::Value {
        read_json(&self.job_file())
    }

    fn files_in_output_dir(&self, wanted: impl Fn(&str) -> bool) -> Vec<PathBuf> {
        let dir = self.output.parent().unwrap_or(Path::new("."));
        let entries =
            fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        let mut files: Vec<PathBuf> = entries
            .map(|entry| entry.unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display())))
            .map(|entry| entry.path())
            .filter(|path| {
                path.file_name()
                    .is_some_and(|n| wanted(&n.to_string_lossy()))
            })
            .collect();
        files.sort();
        files
    }
}

/// A `--stats-json` file: a record per job (where it `ran`, its `action` digest, ...) and the
/// client's `transfers` counters. Displays as the JSON, for assertion messages.
#[derive(Debug)]
pub struct Stats(serde_json::Value);

impl Stats {
    /// Reads and parses the file, panicking with the path on failure.
    pub fn read(path: &Path) -> Stats {
        Stats(read_json(path))
    }

    /// The job records.
    pub fn jobs(&self) -> &[serde_json::Value] {
        self.0["jobs"]
            .as_array()
            .unwrap_or_else(|| panic!("no jobs array in {self}"))
    }

    /// How many jobs ran where (`remote`, `action-cache`, `local`).
    pub fn ran(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for job in self.jobs() {
            let place = job["ran"].as_str().unwrap_or("?").to_owned();
            *counts.entry(place).or_insert(0) += 1;
        }
        counts
    }

    /// The jobs' Action digests, sorted (stable across links of the same objects).
    pub fn actions(&self) -> Vec<&str> {
        let mut actions: Vec<&str> = self
            .jobs()
            .iter()
            .map(|job| {
                job["action"]
                    .as_str()
                    .unwrap_or_else(|| panic!("no action in {job}"))
            })
            .collect();
        actions.sort_unstable();
        actions
    }

    /// The link's compiler: `toolchain.mode`, `.digest`, `.bytes_uploaded`, ...
    pub fn toolchain(&self) -> &serde_json::Value {
        &self.0["toolchain"]
    }

    /// A number of the whole run (`wall_ms`, `cpu_ms`).
    pub fn total(&self, name: &str) -> u64 {
        self.0[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no {name} in {self}"))
    }

    /// A field of the whole run, as it is (null when absent): `degraded`, ...
    pub fn field(&self, name: &str) -> &serde_json::Value {
        &self.0[name]
    }

    /// A counter of `transfers` (`bytes_uploaded`, `rpc_retries`, ...).
    pub fn transfers(&self, counter: &str) -> u64 {
        self.0["transfers"][counter]
            .as_u64()
            .unwrap_or_else(|| panic!("no transfers.{counter} in {self}"))
    }

    /// A counter of `inputs` (`files_hashed`, `bytes_from_digest_cache`, ...).
    pub fn inputs(&self, counter: &str) -> u64 {
        self.0["inputs"][counter]
            .as_u64()
            .unwrap_or_else(|| panic!("no inputs.{counter} in {self}"))
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The `--stats-json` files of every link of a build, written into `dir` (one per link, sorted
/// by name).
pub fn stats_in(dir: &Path) -> Vec<Stats> {
    let entries =
        fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    let mut paths: Vec<PathBuf> = entries
        .map(|entry| {
            entry
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .path()
        })
        .filter(|p| p.to_string_lossy().ends_with(".stats.json"))
        .collect();
    paths.sort();
    paths.iter().map(|p| Stats::read(p)).collect()
}

/// A directory of `<driver>-dtlto` symlinks to the built `dtlto-reapi` (`dtlto-reapi link <driver>`
/// under another name) and of `dtlto-reapi` itself, and the PATH that finds them first, then the
/// toolchain, then the test's PATH.
pub struct Wrappers {
    dir: TempDir,
}

impl Wrappers {
    /// Symlinks `<name>-dtlto` for each of `drivers`, and `dtlto-reapi` itself.
    pub fn new(drivers: &[&str]) -> Wrappers {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("cannot create a directory: {e}"));
        let names = drivers.iter().map(|d| format!("{d}-dtlto"));
        for name in names.chain(["dtlto-reapi".to_owned()]) {
            let link = dir.path().join(name);
            std::os::unix::fs::symlink(distributor(), &link)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", link.display()));
        }
        Wrappers { dir }
    }

    /// The directory of the wrappers.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// PATH with the wrappers first and the toolchain's `clang`, `ld.lld` and `llvm-ar` next.
    pub fn path(&self) -> OsString {
        let mut dirs = vec![self.dir.path().to_owned(), toolchain().bin.clone()];
        dirs.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        std::env::join_paths(dirs).unwrap_or_else(|e| panic!("cannot build PATH: {e}"))
    }
}

/// What [`Stats::ran`] says when all `jobs` jobs ran in `place`.
pub fn ran_only(place: &str, jobs: usize) -> BTreeMap<String, usize> {
    BTreeMap::from([(place.to_owned(), jobs)])
}

/// A generated program of `n` modules where module `i` calls module `i + 1` (so ThinLTO imports
/// and inlines across modules) plus a `main.c` that prints the sum of every module's result.
pub struct Chain {
    /// `(file name, code)`: `mod0.c` … `mod{n-1}.c`, then `main.c`.
    pub sources: Vec<(String, String)>,
    /// What the linked program prints.
    pub expected_output: String,
}

/// Builds a [`Chain`] of `n >= 1` modules.
pub fn chain(n: usize) -> Chain {
    assert!(n >= 1, "a chain needs at least one module");
    let mut sources = Vec::with_capacity(n + 1);
    for i in 0..n {
        let body = if i + 1 < n {
            format!(
                "long chain{next}(long);\nlong chain{i}(long x) {{ return chain{next}(x + {i}) + 1; }}\n",
                next = i + 1
            )
        } else {
            format!("long chain{i}(long x) {{ return 2 * x; }}\n")
        };
        sources.push((format!("mod{i}.c"), body));
    }
    let declarations: String = (0..n).map(|i| format!("long chain{i}(long);\n")).collect();
    let calls: String = (0..n)
        .map(|i| format!("    sum += chain{i}({i});\n"))
        .collect();
    let main = format!(
        "#include <stdio.h>\n{declarations}int main(void) {{\n    long sum = 0;\n{calls}    printf(\"chain of {n}: %ld\\n\", sum);\n    return 0;\n}}\n"
    );
    sources.push(("main.c".to_owned(), main));

    // chain_i(x) = chain_{i+1}(x + i) + 1, chain_{n-1}(x) = 2x; evaluated the same way here.
    let value = |start: usize| {
        let (mut x, mut added) = (start as i64, 0);
        for j in start..n - 1 {
            x += j as i64;
            added += 1;
        }
        2 * x + added
    };
    let sum: i64 = (0..n).map(value).sum();
    Chain {
        sources,
        expected_output: format!("chain of {n}: {sum}\n"),
    }
}

/// A project of the [`chain`] program of `n` modules; returns it and what the program prints.
pub fn chain_project(n: usize) -> (Project, String) {
    let Chain {
        sources,
        expected_output,
    } = chain(n);
    let mut project = Project::new();
    project.add_sources(sources);
    (project, expected_output)
}

/// The [`chain`] program of `modules` modules, the last one in a static archive, with spaces and
/// parentheses in the names (sources in `src (1)/`, the archive `lib dir/libchain (x).a`); returns
/// the project and what the program prints.
pub fn chain_with_archive(modules: usize) -> (Project, String) {
    let Chain {
        mut sources,
        expected_output,
    } = chain(modules);
    let archived = sources.remove(modules - 1);
    let mut project = Project::new();
    project
        .add_sources(sources.iter().map(|(n, c)| (format!("src (1)/{n}"), c)))
        .add_archive("lib dir/libchain (x).a", [archived]);
    (project, expected_output)
}

/// A program whose `big.c` holds a 12 MiB string of pseudo-random letters (bitcode stores them in
/// 6 bits each, so its bitcode is still bigger than 8 MiB, and its native object holds all of it)
/// and whose `main.c` prints the letter at `index`. Returns the project and what the program prints.
pub fn big_program(index: usize) -> (Project, String) {
    let big: String = (0..12 << 20)
        .map(|i: u32| char::from(b'a' + ((i.wrapping_mul(2654435761) >> 7) % 26) as u8))
        .collect();
    let mut project = Project::new();
    project.add_sources([
        (
            "big.c",
            format!("const char big[] = \"{big}\";\nint pick(int i) {{ return big[i]; }}\n"),
        ),
        (
            "main.c",
            format!(
                "#include <stdio.h>\nint pick(int);\nint main(void) {{ printf(\"%c\\n\", pick({index})); return 0; }}\n"
            ),
        ),
    ]);
    (project, format!("{}\n", char::from(big.as_bytes()[index])))
}

/// Reads and parses a JSON file, panicking with the path on failure.
fn read_json(path: &Path) -> serde_json::Value {
    let text =
        fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}\n{text}", path.display()))
}

/// A copy of the toolchain's compiler executable in `dir` (under its own name), with `extra`
/// appended: a different compiler by content that still runs.
pub fn compiler_copy(dir: &Path, extra: &[u8]) -> PathBuf {
    let copy = dir.join(toolchain().compiler.file_name().unwrap());
    fs::create_dir_all(dir).unwrap();
    fs::copy(&toolchain().compiler, &copy).unwrap();
    if !extra.is_empty() {
        let mut file = fs::OpenOptions::new().append(true).open(&copy).unwrap();
        std::io::Write::write_all(&mut file, extra).unwrap();
    }
    copy
}

/// Writes a file, creating its directory.
pub fn write(path: &Path, contents: &[u8]) {
    create_parent(path);
    fs::write(path, contents).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

fn create_parent(path: &Path) {
    if let Some(parent) = path.parent() {
        create_dir(parent);
    }
}

fn create_dir(dir: &Path) {
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
}

/// A `dtlto-reapi serve` test server (by default on 127.0.0.1, port 0), stopped when dropped.
///
/// [`Server::start`] runs `dtlto-reapi serve <args>` (e.g. `["--hide", dir]` so that actions cannot
/// see the client's files), waits for its first stdout line, `listening on ADDRESS` (`grpc://HOST:PORT`,
/// or `unix://PATH` with `--listen unix://PATH`), and keeps that address for [`Server::url`].
/// Everything the server prints afterwards is forwarded to the test's captured stderr, prefixed
/// with `serve:`. Dropping it sends SIGTERM so the server removes its temporary directories, and
/// SIGKILL if it has not exited after [`Server::STOP_GRACE`].
pub struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// How long the server may take to exit after SIGTERM (it gives running RPCs 5 s).
    pub const STOP_GRACE: Duration = Duration::from_secs(10);

    pub fn start<I, S>(args: I) -> Server
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = serve_process::command(args);
        // A server running as root runs actions as users of their own, who cannot enter root's
        // home, where the toolchain may be: let them read it (links with --toolchain=worker).
        if let Some(toolchain) = toolchain().bin.parent() {
            cmd.arg("--readable").arg(toolchain);
        }
        cmd.stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let (first_line_tx, first_line) = mpsc::channel();
        forward_lines(child.stdout.take(), Some(first_line_tx));
        forward_lines(child.stderr.take(), None);
        // From here on, dropping `server` stops the child, also when a check below panics.
        let mut server = Server {
            child,
            url: String::new(),
        };
        let line = first_line
            .recv_timeout(serve_process::STARTUP)
            .unwrap_or_else(|_| {
                panic!(
                    "{cmd:?} exited or printed nothing within {:?}",
                    serve_process::STARTUP
                )
            });
        server.url = serve_process::address(&cmd, &line);
        server
    }

    /// `grpc://HOST:PORT` (or `unix://PATH` with `--listen unix://PATH`), as the server printed it.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The server may have exited already; either way it must not outlive the test.
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child, which has not been reaped (try_wait/wait below
            // reap it only after this).
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = Instant::now() + Self::STOP_GRACE;
            while Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Copies every line of a child's stream to this test's (captured) stderr, prefixed with `serve:`,
/// on a thread of its own; the first line goes to `first_line` instead when one is given.
fn forward_lines(
    stream: Option<impl Read + Send + 'static>,
    first_line: Option<mpsc::Sender<String>>,
) {
    let Some(stream) = stream else { return };
    thread::spawn(move || {
        let mut first_line = first_line;
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            match first_line.take() {
                Some(tx) => {
                    let _ = tx.send(line);
                }
                None => eprintln!("serve: {line}"),
            }
        }
    });
}

/// A credential-helper script (`#!/bin/sh`) in a temporary directory of its own. Before `body`
/// runs, the script appends its stdin (the request) and a newline to `requests` and a line to
/// `runs`; `$D` is the directory, for the body's own files.
pub struct CredentialHelper {
    dir: TempDir,
    pub path: PathBuf,
}

impl CredentialHelper {
    pub fn new(body: &str) -> CredentialHelper {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("cannot create a temporary directory");
        let path = dir.path().join("helper");
        let script = format!(
            "#!/bin/sh\nD='{}'\ncat >> \"$D/requests\"\necho >> \"$D/requests\"\necho run >> \"$D/runs\"\n{body}\n",
            dir.path().display()
        );
        write(&path, script.as_bytes());
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("cannot make {} executable: {e}", path.display()));
        CredentialHelper { dir, path }
    }

    /// A helper that always answers `headers` (a JSON object of NAME: [VALUE, ...]).
    pub fn answering(headers: &str) -> CredentialHelper {
        Self::new(&format!(
            "echo '{{\"headers\": {headers}, \"expires\": \"2099-01-01T00:00:00Z\"}}'"
        ))
    }

    /// The helper's directory (`$D` in its body).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// How many times the helper ran.
    pub fn runs(&self) -> usize {
        fs::read_to_string(self.dir.path().join("runs")).map_or(0, |t| t.lines().count())
    }

    /// What the helper read on stdin, one line per run.
    pub fn requests(&self) -> String {
        fs::read_to_string(self.dir.path().join("requests")).unwrap_or_default()
    }

    /// `--credential-helper=PATH`.
    pub fn option(&self) -> String {
        format!("--credential-helper={}", self.path.display())
    }
}
