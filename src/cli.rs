//! The command line: `dtlto-reapi [OPTIONS] <JOB_FILE>` as lld runs it, plus the `config` and `serve`
//! subcommands.
//!
//! Every setting is an `Option` here, without a default: `config` layers the command line (and the
//! `DTLTO_REAPI_*` environment, which clap reads) over the config file and only then applies defaults,
//! so "not given" must stay distinguishable from "given as the default value". Boolean settings take
//! `--flag` or `--flag=false`, because `-Xthinlto-distributor=` can only pass single arguments.

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};

use crate::server::ServeArgs;

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
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,
}

/// The settings that the command line, the environment and the config file can all give. Field
/// names, long options, environment variables and config keys correspond: `remote_jobs`,
/// `--remote-jobs`, `DTLTO_REAPI_REMOTE_JOBS`, `remote-jobs`.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SettingsArgs {
    /// Config file to read [default: dtlto-reapi.toml in the working directory or a parent, else
    /// <user config dir>/dtlto-reapi/config.toml]
    #[arg(long, env = "DTLTO_REAPI_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Where jobs run: local, remote or cache-only [default: remote when --remote is set, else local]
    #[arg(long, env = "DTLTO_REAPI_MODE", value_name = "MODE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<crate::config::Mode>,

    /// Local compiles at once [default: available cores]
    #[arg(long, short = 'j', env = "DTLTO_REAPI_JOBS", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jobs: Option<usize>,

    /// Keep running the other jobs after one fails [default: false]
    #[arg(long, env = "DTLTO_REAPI_KEEP_GOING", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_going: Option<bool>,

    /// Print nothing but errors [default: false]
    #[arg(long, short = 'q', env = "DTLTO_REAPI_QUIET", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quiet: Option<bool>,

    /// Print each job's command and where it ran [default: false]
    #[arg(long, short = 'v', env = "DTLTO_REAPI_VERBOSE", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verbose: Option<bool>,

    /// Write one JSON record per job (module, outputs, times, exit status, where it ran) to FILE
    #[arg(long, env = "DTLTO_REAPI_STATS_JSON", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats_json: Option<PathBuf>,
}
