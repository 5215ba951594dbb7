//! Tests never see the developer's own dtlto-reapi files. Every command a test starts that runs
//! `dtlto-reapi` (directly, as `serve`, or through clang, lld, a build system or the link wrapper)
//! gets a private `HOME`, `XDG_CACHE_HOME` and `XDG_CONFIG_HOME` of this test process, and none of
//! the developer's `DTLTO_REAPI_*` variables (but `DTLTO_REAPI_STRATEGY=remote`, see [`isolate`]): a test neither reads nor writes the real digest cache,
//! disk cache or config file, and a developer's `DTLTO_REAPI_REMOTE` cannot turn a local test remote.
//!
//! Tools found through the real home stay found: `CARGO_HOME` and `RUSTUP_HOME` are pinned to the
//! developer's (the cargo recipe of `tests/build_systems.rs` runs cargo).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The private home of this test process, under Cargo's temporary directory for integration tests
/// (`target/tmp`), made once.
fn private_home() -> &'static PathBuf {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("home-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("a private home directory under CARGO_TARGET_TMPDIR");
        // Kept for the whole process (and afterwards, for a look after a failure).
        dir.keep()
    })
}

/// Gives `cmd` the private home and removes the developer's `DTLTO_REAPI_*` variables. Call it
/// right after `Command::new`, before the test sets variables of its own.
pub fn isolate(cmd: &mut Command) -> &mut Command {
    let home = private_home();
    if let Some(real_home) = std::env::var_os("HOME").map(PathBuf::from) {
        for (var, default) in [("CARGO_HOME", ".cargo"), ("RUSTUP_HOME", ".rustup")] {
            if std::env::var_os(var).is_none() {
                cmd.env(var, real_home.join(default));
            }
        }
    }
    cmd.env("HOME", home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("XDG_CONFIG_HOME", home.join("config"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("DTLTO_REAPI_") {
            cmd.env_remove(name);
        }
    }
    // Tests check where each job ran, which a race leaves to timing: remote mode runs every job on
    // the cluster unless a test asks for `--strategy=racing` (the command line beats this).
    cmd.env("DTLTO_REAPI_STRATEGY", "remote");
    cmd
}
