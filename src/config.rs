//! Settings, layered: command line > `DTLTO_REAPI_<OPTION>` environment variables > TOML config file >
//! defaults, with a record of where each effective value came from (`dtlto-reapi config`).
//!
//! clap reads the command line and the environment into [`SettingsArgs`] (all `Option`s); the config
//! file deserializes into the same struct, so one list of fields serves all three layers and an
//! unknown key in the file is an error naming it. Defaults are applied last, in [`Settings`].
//!
//! A config file can name programs to run (a credential helper) and servers to send headers to, so
//! a *discovered* `dtlto-reapi.toml` is read only when no other user could have written it
//! ([`untrusted`], as git trusts a repository by its owner); the files the user names
//! (`--config`, `DTLTO_REAPI_CONFIG`) and the user's own config file are read as they are.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::ArgMatches;
use clap::parser::ValueSource;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::settings::{Settings, SettingsArgs};

/// Where one setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    CommandLine,
    Environment(String),
    ConfigFile(PathBuf),
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::CommandLine => write!(f, "command line"),
            Source::Environment(var) => write!(f, "environment {var}"),
            Source::ConfigFile(path) => write!(f, "config file {}", path.display()),
            Source::Default => write!(f, "default"),
        }
    }
}

/// The settings with the provenance of each, as `dtlto-reapi config` shows them.
#[derive(Debug)]
pub struct ResolvedSettings {
    pub settings: Settings,
    pub config_file: Option<PathBuf>,
    pub sources: BTreeMap<String, Source>,
}

/// Layers `args` (command line and environment, as parsed into `matches`) over the config file.
pub fn resolve(args: &SettingsArgs, matches: &ArgMatches) -> Result<ResolvedSettings> {
    let explicit_config = args.config.clone();
    let config_file = match explicit_config {
        // The user named it: read it whoever owns it.
        Some(path) => Some(path),
        None => discover_config_file()?,
    };
    let from_file = match &config_file {
        Some(path) => read_config_file(path)?,
        None => Map::new(),
    };
    let from_args = as_map(args)?;

    let mut sources = BTreeMap::new();
    let mut merged = from_file.clone();
    for (key, value) in from_args {
        let id = key.replace('-', "_");
        let source = match matches.value_source(&id) {
            Some(ValueSource::EnvVariable) => Source::Environment(env_var_name(&key)),
            _ => Source::CommandLine,
        };
        sources.insert(key.clone(), source);
        merged.insert(key, value);
    }
    if let Some(path) = &config_file {
        for key in from_file.keys() {
            sources
                .entry(key.clone())
                .or_insert_with(|| Source::ConfigFile(path.clone()));
        }
    }
    let layers: SettingsArgs =
        serde_json::from_value(Value::Object(merged)).context("combining settings")?;
    let origin = |key: &str| {
        sources
            .get(key)
            .map_or_else(|| Source::Default.to_string(), Source::to_string)
    };
    let settings = Settings::with_defaults(layers, &origin)?;
    for key in as_map(&settings)?.keys() {
        sources.entry(key.clone()).or_insert(Source::Default);
    }
    Ok(ResolvedSettings {
        settings,
        config_file,
        sources,
    })
}

/// `remote-jobs` → `DTLTO_REAPI_REMOTE_JOBS`.
pub fn env_var_name(key: &str) -> String {
    format!("DTLTO_REAPI_{}", key.replace('-', "_").to_uppercase())
}

fn as_map(value: &impl Serialize) -> Result<Map<String, Value>> {
    match serde_json::to_value(value)? {
        Value::Object(map) => Ok(map),
        other => bail!("settings serialized to {other}, not an object"),
    }
}

/// `dtlto-reapi.toml` in the working directory or the nearest parent that has one, else the user's
/// config file, else none. A `dtlto-reapi.toml` that another user could have written is skipped
/// with one warning, for the user's config file (never for one further up: the nearest is the
/// project's, and another project's settings are no better).
fn discover_config_file() -> Result<Option<PathBuf>> {
    let cwd = std::env::current_dir().context("reading the working directory")?;
    let project = cwd
        .ancestors()
        .map(|dir| dir.join("dtlto-reapi.toml"))
        .find(|p| p.is_file())
        .filter(|path| match untrusted(path) {
            None => true,
            Some(why) => {
                eprintln!(
                    "dtlto-reapi: warning: ignoring {}: {why}, so another user could have written \
                     it (its settings could run programs as you); your own config file applies",
                    path.display()
                );
                false
            }
        });
    let user = || {
        dirs::config_dir()
            .map(|d| d.join("dtlto-reapi").join("config.toml"))
            .filter(|p| p.is_file())
    };
    Ok(project.or_else(user))
}

/// Why a discovered config file at `path` is not to be trusted, or `None` when only this user and
/// root can have written it. Trusted means: the file (and the symlink naming it, if it is one) is
/// owned by this user or root and no one else may write it, and its directory is owned by this
/// user or root and no one else may write it, or it is sticky (like `/tmp`, where only a file's
/// owner can rename or delete it). "No one else may write" means not world-writable, and not
/// group-writable unless the group is this user's primary group (a user-private group, as with
/// umask 002). Directories further up are not checked: whoever swaps one of them can only put
/// files of their own in place, which fail the owner check.
#[cfg(unix)]
fn untrusted(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    // SAFETY: geteuid and getegid cannot fail.
    let (me, my_group) = unsafe { (libc::geteuid(), libc::getegid()) };
    let others_may_write = |meta: &fs::Metadata| {
        meta.mode() & 0o002 != 0 || (meta.mode() & 0o020 != 0 && meta.gid() != my_group)
    };
    let foreign = |meta: &fs::Metadata| meta.uid() != me && meta.uid() != 0;
    let owner = |what: &str, meta: &fs::Metadata| {
        format!(
            "{what} is owned by user {}, not by you ({me}) or root",
            meta.uid()
        )
    };
    let writable = |what: &str, meta: &fs::Metadata| {
        format!(
            "{what} is writable by other users (mode {:o})",
            meta.mode() & 0o7777
        )
    };
    let (Ok(link), Ok(file)) = (fs::symlink_metadata(path), fs::metadata(path)) else {
        return Some("it cannot be inspected".to_owned());
    };
    for meta in [&link, &file] {
        if foreign(meta) {
            return Some(owner("it", meta));
        }
    }
    if others_may_write(&file) {
        return Some(writable("it", &file));
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    let Ok(dir_meta) = fs::metadata(dir) else {
        return Some(format!(
            "its directory {} cannot be inspected",
            dir.display()
        ));
    };
    let what = format!("its directory {}", dir.display());
    if foreign(&dir_meta) {
        return Some(owner(&what, &dir_meta));
    }
    let sticky = dir_meta.mode() & 0o1000 != 0;
    (others_may_write(&dir_meta) && !sticky).then(|| writable(&what, &dir_meta))
}

/// On Windows: the file and its directory must belong to this user (see
/// `platform::foreign_writable`; access lists are inherited and not inspected).
#[cfg(windows)]
fn untrusted(path: &Path) -> Option<String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    [
        ("it".to_owned(), path),
        (format!("its directory {}", dir.display()), dir),
    ]
    .into_iter()
    .find_map(|(what, path)| match fs::metadata(path) {
        Ok(meta) => {
            crate::platform::foreign_writable(path, &meta).map(|why| format!("{what} {why}"))
        }
        Err(_) => Some(format!("{what} cannot be inspected")),
    })
}

/// Reads a TOML config file into the same shape as the command-line settings, rejecting unknown keys
/// and values of the wrong type with a message naming the file.
fn read_config_file(path: &Path) -> Result<Map<String, Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("config file {}: cannot read", path.display()))?;
    let table: toml::Table = toml::from_str(&text)
        .with_context(|| format!("config file {}: not valid TOML", path.display()))?;
    // Accept `remote_jobs` as well as `remote-jobs`.
    let table: Map<String, Value> = table
        .into_iter()
        .map(|(k, v)| Ok((k.replace('_', "-"), serde_json::to_value(v)?)))
        .collect::<Result<_>>()?;
    // Deserializing checks names and types; the map itself is what gets layered.
    serde_json::from_value::<SettingsArgs>(Value::Object(table.clone()))
        .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
    Ok(table)
}

impl ResolvedSettings {
    /// The `dtlto-reapi config` report: one `key = value  # source` line per setting, secrets hidden.
    pub fn report(&self) -> Result<String> {
        let mut out = String::new();
        match &self.config_file {
            Some(path) => out.push_str(&format!("# config file: {}\n", path.display())),
            None => out.push_str("# config file: none found\n"),
        }
        for (key, value) in as_map(&self.settings)? {
            let shown = match value {
                Value::Null => "(unset)".to_owned(),
                Value::Array(headers) if key == "remote-header" => {
                    let hidden: Vec<String> = headers
                        .iter()
                        .filter_map(Value::as_str)
                        .map(redact_header)
                        .collect();
                    format!("{hidden:?}")
                }
                other => other.to_string(),
            };
            let source = self.sources.get(&key).unwrap_or(&Source::Default);
            out.push_str(&format!("{key} = {shown}  # {source}\n"));
        }
        Ok(out)
    }
}

/// `NAME=VALUE` → `NAME=<hidden>`: header values are credentials. `env:VAR` references are shown,
/// since they name a variable rather than hold the secret.
fn redact_header(header: &str) -> String {
    match header.split_once('=') {
        Some((_, value)) if value.starts_with("env:") => header.to_owned(),
        Some((name, _)) => format!("{name}=<hidden>"),
        // Not NAME=VALUE: the whole of it may be a secret.
        None => "<hidden>".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use crate::settings::Mode;
    use clap::{CommandFactory, FromArgMatches};

    /// Parses `argv` like the binary does, with `config_file` as the config file.
    fn resolve_with(argv: &[&str], config_text: &str) -> ResolvedSettings {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("dtlto-reapi.toml");
        std::fs::write(&config, config_text).unwrap();
        let mut full = vec!["dtlto-reapi", "config"];
        full.extend_from_slice(argv);
        let config_arg = format!("--config={}", config.display());
        full.push(&config_arg);
        let matches = Cli::command().try_get_matches_from(full).unwrap();
        let cli = Cli::from_arg_matches(&matches).unwrap();
        let Some(Command::Config(args)) = cli.command else {
            panic!("not config")
        };
        let (_, sub) = matches.subcommand().unwrap();
        resolve(&args.settings, sub).unwrap()
    }

    #[test]
    fn command_line_beats_file_beats_default() {
        let r = resolve_with(&["--jobs=3"], "jobs = 7\nkeep_going = true\n");
        assert_eq!(r.settings.jobs, 3);
        assert_eq!(r.sources["jobs"], Source::CommandLine);
        assert!(r.settings.keep_going);
        assert!(matches!(r.sources["keep-going"], Source::ConfigFile(_)));
        assert!(!r.settings.quiet);
        assert_eq!(r.sources["quiet"], Source::Default);
        let report = r.report().unwrap();
        assert!(report.contains("jobs = 3  # command line"), "{report}");
    }

    #[test]
    fn booleans_take_an_optional_value() {
        let r = resolve_with(&["--quiet", "--keep-going=false"], "keep-going = true");
        assert!(r.settings.quiet);
        assert!(!r.settings.keep_going);
    }

    #[test]
    fn unknown_keys_in_the_file_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("c.toml");
        std::fs::write(&config, "jbos = 3").unwrap();
        let err = read_config_file(&config).unwrap_err().to_string();
        assert!(err.contains("c.toml") && err.contains("jbos"), "{err}");
        std::fs::write(&config, "jobs = \"many\"").unwrap();
        let err = read_config_file(&config).unwrap_err().to_string();
        assert!(
            err.contains("c.toml") && err.contains("invalid type"),
            "{err}"
        );
    }

    #[test]
    fn remote_defaults_and_secrets() {
        let r = resolve_with(
            &[
                "--remote=grpc://127.0.0.1:1",
                "--remote-header=x-api-key=s3cret",
            ],
            "remote-header = [\"a=env:A\"]",
        );
        assert_eq!(r.settings.mode, Mode::Remote);
        let headers: Vec<_> = r
            .settings
            .remote_header
            .iter()
            .map(|h| (h.name.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(headers, [("x-api-key", "s3cret")]);
        let report = r.report().unwrap();
        assert!(!report.contains("s3cret"), "{report}");
        assert!(report.contains("x-api-key=<hidden>"), "{report}");
        assert_eq!(redact_header("a=env:A"), "a=env:A");
        assert_eq!(redact_header("s3cret"), "<hidden>");
        let r = resolve_with(&[], "mode = \"cache-only\"\nremote = \"grpc://h:1\"");
        assert_eq!(r.settings.mode, Mode::CacheOnly);
    }

    #[test]
    fn discovered_files_are_trusted_only_when_no_other_user_could_write_them() {
        use std::os::unix::fs::{PermissionsExt as _, chown, lchown};
        let mode = |path: &Path, mode: u32| {
            fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap()
        };
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("project");
        fs::create_dir(&dir).unwrap();
        let file = dir.join("dtlto-reapi.toml");
        fs::write(&file, "jobs = 1\n").unwrap();
        mode(&dir, 0o755);
        mode(&file, 0o644);
        assert_eq!(untrusted(&file), None);
        mode(&file, 0o646);
        assert!(
            untrusted(&file)
                .unwrap()
                .contains("writable by other users (mode 646)")
        );
        mode(&file, 0o644);
        mode(&dir, 0o777);
        let why = untrusted(&file).unwrap();
        assert!(
            why.contains("its directory") && why.contains("mode 777"),
            "{why}"
        );
        // Sticky, like /tmp: others cannot replace a file they do not own.
        mode(&dir, 0o1777);
        assert_eq!(untrusted(&file), None);
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: the checks of other users' files are not exercised");
            return;
        }
        // Group-writable: fine for this user's primary group, not for another.
        mode(&dir, 0o775);
        assert_eq!(untrusted(&file), None);
        chown(&dir, None, Some(65534)).unwrap();
        assert!(
            untrusted(&file)
                .unwrap()
                .contains("writable by other users")
        );
        chown(&dir, None, Some(0)).unwrap();
        mode(&dir, 0o1777);
        chown(&file, Some(65534), None).unwrap();
        let why = untrusted(&file).unwrap();
        assert!(why.contains("owned by user 65534"), "{why}");
        // A symlink another user planted, to a file of this user's, is theirs.
        chown(&file, Some(0), None).unwrap();
        let link = dir.join("link.toml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(untrusted(&link), None);
        lchown(&link, Some(65534), None).unwrap();
        assert!(untrusted(&link).unwrap().contains("owned by user 65534"));
    }

    #[test]
    fn env_var_names() {
        assert_eq!(env_var_name("remote-jobs"), "DTLTO_REAPI_REMOTE_JOBS");
    }
}
