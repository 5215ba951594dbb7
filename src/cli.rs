//! The command line: `dtlto-reapi [OPTIONS] <JOB_FILE>` as lld runs it, plus the `config`, `serve`
//! and `check` subcommands.
//!
//! The settings themselves, shared by the commands that take them, are in `settings`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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
pub enum Command {
    /// Print the effective settings and where each one came from.
    Config(ConfigArgs),
    /// Run a small REAPI v2 server (for tests, CI and single machines).
    Serve(ServeArgs),
    /// Check, step by step, that a link with these settings would work on the cluster.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// The compiler to run on a worker (its path there) [default: --remote-compiler, else clang
    /// on PATH]
    #[arg(long, value_name = "PATH")]
    pub compiler: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,
}
