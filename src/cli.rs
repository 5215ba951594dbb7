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

    /// REAPI server: grpc://HOST:PORT, grpcs://HOST:PORT (TLS) or unix:///PATH
    #[arg(long, env = "DTLTO_REAPI_REMOTE", value_name = "URL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,

    /// REAPI instance name [default: none]
    #[arg(long, env = "DTLTO_REAPI_INSTANCE_NAME", value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_name: Option<String>,

    /// Header sent with every call, e.g. x-buildbuddy-api-key=env:BUILDBUDDY_API_KEY; a VALUE of
    /// env:VAR is read from the environment (repeatable)
    #[arg(long, env = "DTLTO_REAPI_REMOTE_HEADER", value_name = "NAME=VALUE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_header: Option<Vec<String>>,

    /// PEM file of the CA certificates that sign the server's certificate [default: system roots]
    #[arg(long, env = "DTLTO_REAPI_TLS_CA_CERT", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca_cert: Option<PathBuf>,

    /// PEM client certificate for mutual TLS (with --tls-client-key)
    #[arg(long, env = "DTLTO_REAPI_TLS_CLIENT_CERT", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_client_cert: Option<PathBuf>,

    /// PEM private key for mutual TLS (with --tls-client-cert)
    #[arg(long, env = "DTLTO_REAPI_TLS_CLIENT_KEY", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_client_key: Option<PathBuf>,

    /// Platform property of every action, e.g. OSFamily=linux (repeatable)
    #[arg(long, env = "DTLTO_REAPI_PLATFORM", value_name = "NAME=VALUE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<Vec<String>>,

    /// The compiler's path on the workers [default: the local compiler's path, common.args[0]]
    #[arg(long, env = "DTLTO_REAPI_REMOTE_COMPILER", value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_compiler: Option<String>,

    /// Remote actions in flight at once [default: 200]
    #[arg(long, env = "DTLTO_REAPI_REMOTE_JOBS", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_jobs: Option<usize>,

    /// Deadline of each remote call, in seconds, retries included [default: 60]
    #[arg(long, env = "DTLTO_REAPI_REMOTE_TIMEOUT", value_name = "SECONDS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_timeout: Option<u64>,

    /// Retries of a remote call after a transient failure [default: 5]
    #[arg(long, env = "DTLTO_REAPI_REMOTE_RETRIES", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_retries: Option<u32>,

    /// Run a job locally when the cluster cannot run it [default: true]
    #[arg(long, env = "DTLTO_REAPI_LOCAL_FALLBACK", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_fallback: Option<bool>,

    /// Identifies the build this link belongs to in the cluster's UI (RequestMetadata's
    /// correlated_invocations_id) [default: none]
    #[arg(long, env = "DTLTO_REAPI_INVOCATION_ID", value_name = "ID")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,

    /// Input layout of remote actions: canonical (modules named by content, index shards rewritten)
    /// or mirror (paths as the link named them) [default: canonical]
    #[arg(long, env = "DTLTO_REAPI_LAYOUT", value_name = "LAYOUT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layout: Option<crate::plan::layout::LayoutKind>,

    /// In cache-only mode, upload the results of local compiles to the remote cache; false makes it
    /// read-only (e.g. developer machines with read-only credentials) [default: true]
    #[arg(long, env = "DTLTO_REAPI_REMOTE_UPLOAD", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_upload: Option<bool>,

    /// Local disk cache of compile results, consulted before anything runs and filled after every
    /// successful job; `--disk-cache` alone uses <user cache dir>/dtlto-reapi/disk-cache [default: off]
    #[arg(long, env = "DTLTO_REAPI_DISK_CACHE", num_args = 0..=1, require_equals = true,
          default_missing_value = "", value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_cache: Option<PathBuf>,

    /// Size bound of the disk cache, least recently used entries evicted first, e.g. 500M, 20G
    /// [default: 10G]
    #[arg(long, env = "DTLTO_REAPI_DISK_CACHE_MAX_SIZE", value_name = "SIZE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_cache_max_size: Option<String>,
}
