//! The settings of a link: the options every command that links or talks to a cluster takes, as
//! [`SettingsArgs`] (each an `Option` without a default, as the command line, the environment and the
//! config file give them) and as the effective [`Settings`] (defaults applied).
//!
//! Every setting is an `Option` in [`SettingsArgs`]: `config` layers the command line (and the
//! `DTLTO_REAPI_*` environment, which clap reads) over the config file and only then applies defaults,
//! so "not given" must stay distinguishable from "given as the default value". Boolean settings take
//! `--flag` or `--flag=false`, because `-Xthinlto-distributor=` can only pass single arguments.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::Args;
use clap::builder::BoolishValueParser;
use serde::{Deserialize, Serialize, Serializer};

use crate::cache::{DEFAULT_MAX_BYTES, DiskCache, parse_size};
use crate::plan::options::{LayoutKind, ToolchainMode};
use crate::reapi::{self, HelperArg};

/// Where the backend compiles run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Processes on this machine.
    Local,
    /// Actions on a REAPI cluster.
    Remote,
    /// Local processes, results shared through a REAPI cache.
    CacheOnly,
}

/// How remote mode uses the local cores while the cluster runs the jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// The cluster runs every job (locally only what it cannot run, with --local-fallback).
    Remote,
    /// The local compile slots race the jobs the cluster has not finished; the first result wins.
    Racing,
}

/// Whether blobs travel zstd-compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Compression {
    /// When the server offers zstd, unless it is on this machine (a unix socket or a loopback
    /// address), where compressing costs CPU and saves nothing.
    Auto,
    /// When the server offers zstd, wherever it is (a tunnel to a distant cluster).
    On,
    /// Never.
    Off,
}

/// The effective settings, defaults applied.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Settings {
    pub mode: Mode,
    pub jobs: usize,
    pub keep_going: bool,
    pub quiet: bool,
    pub verbose: bool,
    pub stats_json: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    pub remote: Option<Endpoint>,
    pub instance_name: String,
    pub remote_header: Vec<RemoteHeader>,
    pub credential_helper: Vec<CredentialHelper>,
    #[serde(serialize_with = "show_duration")]
    pub credential_helper_timeout: Duration,
    pub tls_ca_cert: Option<PathBuf>,
    pub tls_client_cert: Option<PathBuf>,
    pub tls_client_key: Option<PathBuf>,
    pub platform: Vec<PlatformProperty>,
    pub remote_compiler: Option<String>,
    /// The compiler uploaded for the workers instead of the local one.
    pub upload_compiler: Option<PathBuf>,
    /// None: upload where possible.
    pub toolchain: Option<ToolchainMode>,
    /// Variables of this environment that every compile gets (and every Action key holds).
    pub pass_env: Vec<String>,
    pub remote_jobs: usize,
    pub strategy: Strategy,
    #[serde(serialize_with = "show_duration")]
    pub remote_timeout: Duration,
    #[serde(serialize_with = "show_duration")]
    pub remote_execute_timeout: Duration,
    pub remote_retries: u32,
    pub local_fallback: bool,
    pub invocation_id: Option<String>,
    pub layout: LayoutKind,
    pub remote_upload: bool,
    pub remote_compression: Compression,
    pub disk_cache: Option<PathBuf>,
    pub disk_cache_max_size: u64,
}

impl Settings {
    /// Applies the defaults and checks every value's form; `origin` names where the setting of a
    /// key (`remote-header`) came from, for the one line that refuses a malformed value.
    pub(crate) fn with_defaults(
        layers: SettingsArgs,
        origin: &dyn Fn(&str) -> String,
    ) -> Result<Settings> {
        let remote = layers
            .remote
            .map(|url| {
                reapi::check_endpoint(&url)
                    .map(|()| Endpoint(url.clone()))
                    .map_err(|why| anyhow!("--remote={url} ({}): {why}", origin("remote")))
            })
            .transpose()?;
        let remote_header = layers
            .remote_header
            .unwrap_or_default()
            .iter()
            .map(|arg| RemoteHeader::parse(arg))
            .collect::<Result<_, _>>()
            .map_err(|why| anyhow!("--remote-header ({}): {why}", origin("remote-header")))?;
        let credential_helper = layers
            .credential_helper
            .unwrap_or_default()
            .into_iter()
            .map(|arg| match reapi::parse_helper_arg(&arg) {
                Ok(helper) => Ok(CredentialHelper { arg, helper }),
                Err(why) => Err(anyhow!(
                    "--credential-helper `{arg}` ({}): {why}",
                    origin("credential-helper")
                )),
            })
            .collect::<Result<_>>()?;
        let platform = layers
            .platform
            .unwrap_or_default()
            .iter()
            .map(|p| PlatformProperty::parse(p))
            .collect::<Result<_, _>>()
            .map_err(|why| anyhow!("--platform ({}): {why}", origin("platform")))?;
        // A duration setting: zero (or not given) means the default.
        let duration = |text: Option<DurationText>, key: &str, default: Duration| match text {
            None => Ok(default),
            Some(DurationText(text)) => match parse_duration(&text) {
                Ok(d) if d.is_zero() => Ok(default),
                Ok(d) => Ok(d),
                Err(why) => Err(anyhow!("--{key}={text} ({}): {why}", origin(key))),
            },
        };
        let default_mode = if remote.is_some() {
            Mode::Remote
        } else {
            Mode::Local
        };
        Ok(Settings {
            mode: layers.mode.unwrap_or(default_mode),
            jobs: layers
                .jobs
                .filter(|&n| n > 0)
                .unwrap_or_else(available_cores),
            keep_going: layers.keep_going.unwrap_or(false),
            quiet: layers.quiet.unwrap_or(false),
            verbose: layers.verbose.unwrap_or(false),
            stats_json: layers.stats_json,
            trace: layers.trace,
            remote,
            instance_name: layers.instance_name.unwrap_or_default(),
            remote_header,
            credential_helper,
            credential_helper_timeout: duration(
                layers.credential_helper_timeout,
                "credential-helper-timeout",
                Duration::from_secs(10),
            )?,
            tls_ca_cert: layers.tls_ca_cert,
            tls_client_cert: layers.tls_client_cert,
            tls_client_key: layers.tls_client_key,
            platform,
            remote_compiler: layers.remote_compiler,
            upload_compiler: layers.upload_compiler,
            toolchain: layers.toolchain,
            pass_env: layers.pass_env.unwrap_or_default(),
            remote_jobs: layers.remote_jobs.filter(|&n| n > 0).unwrap_or(200),
            strategy: layers.strategy.unwrap_or(Strategy::Racing),
            remote_timeout: duration(
                layers.remote_timeout,
                "remote-timeout",
                Duration::from_secs(60),
            )?,
            remote_execute_timeout: duration(
                layers.remote_execute_timeout,
                "remote-execute-timeout",
                Duration::from_secs(3600),
            )?,
            remote_retries: layers.remote_retries.unwrap_or(5),
            local_fallback: layers.local_fallback.unwrap_or(true),
            invocation_id: layers.invocation_id,
            layout: layers.layout.unwrap_or(LayoutKind::Canonical),
            remote_upload: layers.remote_upload.unwrap_or(true),
            remote_compression: layers.remote_compression.unwrap_or(Compression::Auto),
            disk_cache: match layers.disk_cache {
                // Given without a directory: the default place.
                Some(dir) if dir.as_os_str().is_empty() => {
                    Some(DiskCache::default_dir().context(
                        "--disk-cache: this system has no user cache directory; give one",
                    )?)
                }
                other => other,
            },
            disk_cache_max_size: match layers.disk_cache_max_size {
                Some(size) => {
                    parse_size(&size).map_err(|e| anyhow::anyhow!("--disk-cache-max-size: {e}"))?
                }
                None => DEFAULT_MAX_BYTES,
            },
        })
    }
}

/// `--remote`: an endpoint of a form the client takes (`grpc://HOST:PORT`, `grpcs://HOST:PORT`,
/// `unix:///PATH`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Endpoint(String);

impl Endpoint {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One `--remote-header=NAME=VALUE`; a VALUE of `env:VAR` is read from the environment when the
/// client connects. Shown (`config`) as given, and redacted there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteHeader {
    pub name: String,
    pub value: String,
}

impl RemoteHeader {
    /// The error never shows the value: it may be a secret.
    fn parse(arg: &str) -> Result<RemoteHeader, String> {
        let (name, value) = reapi::parse_header_arg(arg)?;
        reapi::check_header_name(&name)?;
        if value.strip_prefix("env:") == Some("") {
            return Err(format!("header `{name}`: `env:` names no variable"));
        }
        Ok(RemoteHeader { name, value })
    }
}

impl Serialize for RemoteHeader {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}={}", self.name, self.value))
    }
}

/// One `--platform=NAME=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformProperty {
    pub name: String,
    pub value: String,
}

impl PlatformProperty {
    fn parse(arg: &str) -> Result<PlatformProperty, String> {
        match arg.split_once('=') {
            Some((name, value)) if !name.is_empty() => Ok(PlatformProperty {
                name: name.to_owned(),
                value: value.to_owned(),
            }),
            _ => Err(format!("`{arg}` is not of the form NAME=VALUE")),
        }
    }
}

impl Serialize for PlatformProperty {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}={}", self.name, self.value))
    }
}

/// One `--credential-helper=[PATTERN=]PATH`, as given and as parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialHelper {
    pub arg: String,
    pub helper: HelperArg,
}

impl Serialize for CredentialHelper {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.arg)
    }
}

/// A duration setting as given, checked in [`Settings::with_defaults`] (where the line that refuses
/// it can say where it came from). A config file may give whole seconds as a number (`30`, as
/// before) or a string (`"500ms"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct DurationText(String);

impl std::str::FromStr for DurationText {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(DurationText(text.to_owned()))
    }
}

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Anything else is kept as written, for `with_defaults` to refuse with the option's name.
        Ok(DurationText(match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(text) => text,
            other => other.to_string(),
        }))
    }
}

/// `30` (seconds), `500ms`, `30s`, `2m` or `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let unit_ms: u64 = match unit.trim_start() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => 0,
    };
    number
        .parse::<u64>()
        .ok()
        .filter(|_| unit_ms > 0)
        .and_then(|n| n.checked_mul(unit_ms))
        .map(Duration::from_millis)
        .ok_or_else(|| {
            format!(
                "`{text}` is not a duration: give seconds (30) or a number with a unit (500ms, \
                 30s, 2m, 1h)"
            )
        })
}

/// A duration as `config` shows it, in a form [`parse_duration`] reads back.
fn show_duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    if d.subsec_millis() == 0 {
        s.serialize_str(&format!("{}s", d.as_secs()))
    } else {
        s.serialize_str(&format!("{}ms", d.as_millis()))
    }
}

/// The number of cores this process may use, asked once: each asking reads the process's cgroup
/// files, and a link's start asked three times (its settings, the runtime, tokio itself).
pub fn available_cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
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
    pub mode: Option<Mode>,

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

    /// Write one JSON record per job (module, outputs, times, exit status, where it ran) to FILE; when
    /// FILE is a directory, to <link output>.<PID>.stats.json in it (one file per link of a build)
    #[arg(long, env = "DTLTO_REAPI_STATS_JSON", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats_json: Option<PathBuf>,

    /// Write a Chrome trace-event JSON of the link (Perfetto, chrome://tracing) to FILE: one track
    /// per concurrent slot, a span per job phase; when FILE is a directory, to
    /// <link output>.<PID>.trace.json in it
    #[arg(long, env = "DTLTO_REAPI_TRACE", value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<PathBuf>,

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

    /// Program that supplies the call headers (credentials), run as `PATH get` by the
    /// credential-helper protocol Bazel uses; `PATTERN=PATH` uses it only for the host PATTERN or,
    /// as `*.DOMAIN`, for DOMAIN and its subdomains; the most specific match wins (repeatable).
    /// A --remote-header of the same name wins over the helper's
    #[arg(
        long,
        env = "DTLTO_REAPI_CREDENTIAL_HELPER",
        value_name = "[PATTERN=]PATH"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential_helper: Option<Vec<String>>,

    /// How long a credential helper may take before it is killed: seconds, or a number with a
    /// unit (500ms, 30s, 2m, 1h) [default: 10s]
    #[arg(
        long,
        env = "DTLTO_REAPI_CREDENTIAL_HELPER_TIMEOUT",
        value_name = "DURATION"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential_helper_timeout: Option<DurationText>,

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

    /// The compiler to upload for the workers when it is not the local one, e.g. a static Linux
    /// clang or zig kept on a Windows machine's disk: its bytes are in every Action key, and local
    /// compiles (which run the local compiler) are then not stored in the caches [default: the
    /// local compiler, common.args[0]]
    #[arg(long, env = "DTLTO_REAPI_UPLOAD_COMPILER", value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload_compiler: Option<PathBuf>,

    /// How actions get the compiler: upload (the compiler and the libraries it needs are inputs of
    /// every action) or worker (the workers have it at --remote-compiler, else at the local path)
    /// [default: upload, or worker with --remote-compiler or when the compiler cannot be uploaded]
    #[arg(long, env = "DTLTO_REAPI_TOOLCHAIN", value_name = "MODE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub toolchain: Option<ToolchainMode>,

    /// Variable of the distributor's environment that every compile gets, local and remote, with
    /// its value in every Action key (e.g. a licence server's address); compiles otherwise run
    /// with a fixed environment (repeatable)
    #[arg(long, env = "DTLTO_REAPI_PASS_ENV", value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass_env: Option<Vec<String>>,

    /// Remote actions in flight at once [default: 200]
    #[arg(long, env = "DTLTO_REAPI_REMOTE_JOBS", value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_jobs: Option<usize>,

    /// In remote mode: remote (the cluster runs every job) or racing (action cache first, then the
    /// local compile slots race the jobs the cluster has not finished; the first result wins)
    /// [default: racing]
    #[arg(long, env = "DTLTO_REAPI_STRATEGY", value_name = "STRATEGY")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,

    /// Deadline of each remote call, retries included: seconds, or a number with a unit (500ms,
    /// 30s, 2m, 1h) [default: 60s]
    #[arg(long, env = "DTLTO_REAPI_REMOTE_TIMEOUT", value_name = "DURATION")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_timeout: Option<DurationText>,

    /// Longest wait for one remote execution, from Execute to its result, queueing and
    /// re-attaching included: seconds, or a number with a unit (500ms, 30s, 2m, 1h) [default: 1h]
    #[arg(
        long,
        env = "DTLTO_REAPI_REMOTE_EXECUTE_TIMEOUT",
        value_name = "DURATION"
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_execute_timeout: Option<DurationText>,

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
    pub layout: Option<LayoutKind>,

    /// In cache-only mode, upload the results of local compiles to the remote cache; false makes it
    /// read-only (e.g. developer machines with read-only credentials) [default: true]
    #[arg(long, env = "DTLTO_REAPI_REMOTE_UPLOAD", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_upload: Option<bool>,

    /// zstd-compress blob transfers: auto (when the server offers it and is not on this machine;
    /// small blobs stay uncompressed), on (also then, e.g. through a tunnel) or off [default: auto]
    #[arg(long, env = "DTLTO_REAPI_REMOTE_COMPRESSION", value_name = "WHEN")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_compression: Option<Compression>,

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_seconds_or_a_number_with_a_unit() {
        let ms = |text| parse_duration(text).map(|d| d.as_millis());
        assert_eq!(ms("30"), Ok(30_000));
        assert_eq!(ms(" 30s "), Ok(30_000));
        assert_eq!(ms("500ms"), Ok(500));
        assert_eq!(ms("2m"), Ok(120_000));
        assert_eq!(ms("2 min"), Ok(120_000));
        assert_eq!(ms("1h"), Ok(3_600_000));
        for bad in [
            "",
            "s",
            "-3",
            "1.5s",
            "30x",
            "99999999999999999999h",
            "true",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("not a duration"), "{bad}: {e}");
        }
    }
}
