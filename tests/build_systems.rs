//! The README's "Build systems" recipes, run for real on the projects under `examples/`: CMake (a
//! static and a shared library, `CMAKE_C_LINKER_LAUNCHER="dtlto-reapi;link"`), Make
//! (`CC=clang-dtlto`) and a cargo workspace (`RUSTFLAGS="-Clinker-plugin-lto -Clinker=clang-dtlto"`).
//! Each is built through the link wrapper locally and through `dtlto-reapi serve` (with every
//! checkout hidden from its actions), its program runs, and a build of another copy in another
//! directory finds every backend job in the action cache. Every link writes its `--stats-json` into
//! a directory given by the environment, which is also how the tests know that DTLTO happened.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Server, Stats, Wrappers, ran_only, run_ok, stats_in, toolchain};
use tempfile::TempDir;

#[derive(Debug, Clone, Copy)]
enum Recipe {
    CMake,
    Make,
    Cargo,
}

impl Recipe {
    /// The project's directory under `examples/`.
    fn example(self) -> &'static str {
        match self {
            Recipe::CMake => "cmake",
            Recipe::Make => "make",
            Recipe::Cargo => "cargo",
        }
    }

    /// How many DTLTO links a build does (CMake: the shared library and the program).
    fn links(self) -> usize {
        match self {
            Recipe::CMake => 2,
            Recipe::Make | Recipe::Cargo => 1,
        }
    }

    /// Builds the project in `checkout` with the README's lines; returns the program.
    fn build(self, checkout: &Path, env: &BuildEnv, stats: &Path, remote: Option<&str>) -> PathBuf {
        let command = |program: &str| {
            let mut cmd = common::isolated(match program {
                "cmake" | "make" => common::tools::system_tool(&[program], program),
                _ => program.into(),
            });
            cmd.current_dir(checkout)
                .env("PATH", env.wrappers.path())
                .env("DTLTO_REAPI_STATS_JSON", stats);
            match remote {
                Some(url) => cmd.env("DTLTO_REAPI_REMOTE", url),
                None => cmd.env_remove("DTLTO_REAPI_REMOTE"),
            };
            cmd
        };
        match self {
            Recipe::CMake => {
                // CMake runs it as the compiler launcher: missing, it would fail deep in a build.
                common::tools::system_tool(&["ccache"], "ccache");
                // ccache's base_dir turns CMake's absolute source and include paths, which would
                // end up inside the bitcode, into relative ones.
                let with_ccache = |mut cmd: Command| {
                    cmd.env("CCACHE_DIR", env.root.path().join("ccache"))
                        .env("CCACHE_BASEDIR", checkout);
                    cmd
                };
                run_ok(with_ccache(command("cmake")).args([
                    "-S",
                    ".",
                    "-B",
                    "build",
                    "-DCMAKE_BUILD_TYPE=Release",
                    "-DCMAKE_C_COMPILER=clang",
                    "-DCMAKE_C_COMPILER_TARGET=x86_64-linux-gnu",
                    "-DCMAKE_C_COMPILER_LAUNCHER=ccache",
                    "-DCMAKE_INTERPROCEDURAL_OPTIMIZATION=ON",
                    "-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld",
                    "-DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld",
                    "-DCMAKE_C_LINKER_LAUNCHER=dtlto-reapi;link",
                ]));
                run_ok(with_ccache(command("cmake")).args(["--build", "build"]));
                checkout.join("build/shapes")
            }
            Recipe::Make => {
                run_ok(command("make").args([
                    "CC=clang-dtlto",
                    "AR=llvm-ar",
                    "CFLAGS=--target=x86_64-linux-gnu -O2",
                ]));
                checkout.join("stats")
            }
            Recipe::Cargo => {
                let mut cmd = command("cargo");
                cmd.args(["build", "--release", "--offline", "--locked"])
                    .env(
                        "RUSTFLAGS",
                        "-Clinker-plugin-lto -Clinker=clang-dtlto -Clink-arg=--target=x86_64-linux-gnu",
                    )
                    .env_remove("CARGO_TARGET_DIR")
                    .env_remove("CARGO_ENCODED_RUSTFLAGS")
                    .env_remove("CARGO_BUILD_RUSTFLAGS");
                run_ok(&mut cmd);
                checkout.join("target/release/app")
            }
        }
    }
}

/// What every build of one test shares: a root directory for the checkouts, their stats and
/// ccache's cache, and the wrappers.
struct BuildEnv {
    root: TempDir,
    wrappers: Wrappers,
}

impl BuildEnv {
    fn new() -> BuildEnv {
        BuildEnv {
            root: tempfile::Builder::new()
                .prefix("dtlto recipe ")
                .tempdir()
                .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}")),
            wrappers: Wrappers::new(&["clang"]),
        }
    }

    /// Copies the recipe's project to `<root>/<name>/`, builds it, checks that its program prints
    /// the expected output, and returns the stats of its links.
    fn build(&self, recipe: Recipe, name: &str, remote: Option<&str>) -> Vec<Stats> {
        let example = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples")
            .join(recipe.example());
        let checkout = self.root.path().join(name);
        fs::create_dir_all(&checkout).unwrap_or_else(|e| panic!("{}: {e}", checkout.display()));
        run_ok(
            Command::new("cp")
                .arg("-a")
                .arg(example.join("."))
                .arg(&checkout),
        );
        let stats = self.root.path().join(format!("{name} stats"));
        fs::create_dir_all(&stats).unwrap_or_else(|e| panic!("{}: {e}", stats.display()));

        let program = recipe.build(&checkout, self, &stats, remote);
        let out = run_ok(&mut Command::new(&program));
        let expected = fs::read_to_string(example.join("expected-output.txt"))
            .unwrap_or_else(|e| panic!("expected-output.txt: {e}"));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            expected,
            "{recipe:?} program"
        );
        stats_in(&stats)
    }
}

/// Panics unless there are `links` links' stats and every job of each succeeded and ran in `place`.
fn assert_every_job(stats: &[Stats], links: usize, place: &str) -> usize {
    assert_eq!(
        stats.len(),
        links,
        "expected {links} DTLTO links: {stats:?}"
    );
    let mut jobs = 0;
    for link in stats {
        assert!(!link.jobs().is_empty(), "a link without jobs: {link}");
        assert_eq!(link.ran(), ran_only(place, link.jobs().len()), "{link}");
        jobs += link.jobs().len();
    }
    jobs
}

/// Builds the recipe locally, then remotely, then from another copy remotely again.
fn check_recipe(recipe: Recipe) {
    let env = BuildEnv::new();
    let local = env.build(recipe, "local", None);
    let jobs = assert_every_job(&local, recipe.links(), "local");

    let server = Server::start([Path::new("--hide"), env.root.path()]);
    let first = env.build(recipe, "first checkout", Some(server.url()));
    assert_eq!(assert_every_job(&first, recipe.links(), "remote"), jobs);
    let second = env.build(recipe, "second checkout", Some(server.url()));
    assert_eq!(
        assert_every_job(&second, recipe.links(), "action-cache"),
        jobs
    );
}

#[test]
fn cmake_project_with_a_linker_launcher() {
    check_recipe(Recipe::CMake);
}

#[test]
fn makefile_project_with_a_wrapper_as_cc() {
    check_recipe(Recipe::Make);
}

#[test]
fn cargo_workspace_with_a_wrapper_as_linker() {
    let llvm_major = |cmd: &mut Command, prefix: &str| {
        let out = String::from_utf8_lossy(&run_ok(cmd).stdout).into_owned();
        out.lines()
            .find_map(|l| l.split_once(prefix).map(|(_, v)| v.trim().to_owned()))
            .and_then(|v| v.split('.').next().map(str::to_owned))
            .unwrap_or_else(|| panic!("no {prefix:?} in {out}"))
    };
    let rustc = llvm_major(Command::new("rustc").arg("-vV"), "LLVM version:");
    let clang = llvm_major(
        Command::new(&toolchain().clang).arg("--version"),
        "clang version",
    );
    assert_eq!(
        rustc, clang,
        "rustc's LLVM is {rustc} but clang's is {clang}: -Clinker-plugin-lto needs the same major version"
    );
    check_recipe(Recipe::Cargo);
}
