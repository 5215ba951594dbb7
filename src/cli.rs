//! The command line: `dtlto-reapi [OPTIONS] <JOB_FILE>` as lld runs it, plus the `config`, `serve`,
//! `check`, `link` and `explain` subcommands.
//!
//! The settings themselves, shared by the commands that take them, are in `settings`.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[cfg(unix)]
use crate::server::ServeArgs;
use crate::settings::SettingsArgs;

#[derive(Debug, Parser)]
#[command(
    name = "dtlto-reapi",
    version,
    about = "A Distributed ThinLTO distributor for lld: runs ThinLTO backend compiles locally in parallel \
             or on a Remote Execution API v2 cluster",
    after_help = "lld runs it as `dtlto-reapi [OPTIONS] <JOB_FILE>`: pass it to clang with \
                  -fthinlto-distributor=PATH and options with -Xthinlto-distributor=--option=value.\n\
                  Every option can also be set as DTLTO_REAPI_<OPTION> in the environment or in a \
                  dtlto-reapi.toml config file; `dtlto-reapi config` shows the effective settings.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// The job file lld wrote (`<output>.<pid>.dist-file.json`); always the last argument.
    pub job_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
// Without `serve`'s arguments (Windows), `check`'s are the one large variant; parsed once per run.
#[cfg_attr(windows, allow(clippy::large_enum_variant))]
pub enum Command {
    /// Print the effective settings and where each one came from.
    Config(Box<ConfigArgs>),
    /// Run a small REAPI v2 server (for tests, CI and single machines).
    #[cfg(unix)]
    Serve(ServeArgs),
    /// Run a small REAPI v2 server: Linux only (its actions run in Linux namespaces).
    #[cfg(windows)]
    #[command(disable_help_flag = true)]
    Serve {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<OsString>,
    },
    /// Check, step by step, that a link with these settings would work on the cluster.
    Check(CheckArgs),
    /// Run a link with the options that make lld use this distributor added (see `link`).
    Link(LinkArgs),
    /// Say why the jobs of a link missed the cache, from the --stats-json of an earlier link and of it.
    Explain(ExplainArgs),
    /// The reaper of a distributor's local compiles (started by the distributor itself).
    #[cfg(unix)]
    #[command(name = crate::executor::reaper::SUBCOMMAND, hide = true)]
    ReapLocalCompiles,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// The compiler a link uses; its `--version` runs on a worker in an Action built as a link's:
    /// uploaded with the action, at --remote-compiler on the workers, or at its own path with
    /// --toolchain=worker [default: clang on PATH]
    #[arg(long, value_name = "PATH")]
    pub compiler: Option<PathBuf>,
    /// An argument before `--version`, as lld's --thinlto-remote-compiler-prepend-arg puts one
    /// before a compile's own (`clang` for `zig`); repeatable
    #[arg(long, value_name = "ARG")]
    pub compiler_prepend_arg: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The --stats-json of the earlier link
    pub old: PathBuf,
    /// The --stats-json of the link whose misses to explain
    pub new: PathBuf,
}

#[derive(Debug, Args)]
pub struct LinkArgs {
    /// Say what was added to the command, or why nothing was (also DTLTO_REAPI_VERBOSE=1)
    #[arg(long)]
    pub verbose: bool,
    /// The linker driver: clang, clang++, cc, clang-cl, ld.lld, lld-link, ... (a name on PATH or a path)
    pub driver: OsString,
    /// The driver's arguments, passed through untouched
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,
}
