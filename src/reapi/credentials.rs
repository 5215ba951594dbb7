//! Credential helpers: the headers a call carries, obtained from a program rather than from the
//! command line, by the protocol Bazel and other REAPI clients use (the EngFlow credential-helper
//! spec).
//!
//! Helpers are given as `[PATTERN=]PATH`; the one whose pattern matches the
//! server's host most specifically is used (an exact host, then the nearest `*.DOMAIN`, then one
//! without a pattern), as Bazel chooses. It runs as `PATH get`, reads `{"uri": "grpcs://HOST:PORT"}`
//! on stdin and prints `{"headers": {"NAME": ["VALUE", ...]}}` (`{}`: no credentials; other fields,
//! such as `expires`, are ignored). A client runs it once when it connects, and once more when the
//! server answers UNAUTHENTICATED, after which the refused call is repeated: so a link runs it once
//! unless its credentials expire or are revoked mid-link. Header values never appear in an error or
//! in debug output.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Deserialize;
use tokio::io::AsyncWriteExt as _;

use super::error::ReapiError;
use super::headers::{Header, header_key, header_value};

/// Most stderr of a failed helper quoted in the error.
const STDERR_QUOTE_BYTES: usize = 2000;

/// One credential helper, `[PATTERN=]PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperArg {
    /// `None`: every server; `Some("host")`: that host; `Some("*.domain")`: domain and subdomains.
    pattern: Option<String>,
    path: PathBuf,
}

/// Parses `[PATTERN=]PATH`; PATTERN is a host name or address, or `*.DOMAIN`. The error says what
/// is wrong, for the caller to prefix with where the argument came from.
pub fn parse_helper_arg(arg: &str) -> Result<HelperArg, String> {
    let (pattern, path) = match arg.split_once('=') {
        Some((pattern, path)) => (Some(pattern.to_ascii_lowercase()), path),
        None => (None, arg),
    };
    if let Some(pattern) = &pattern {
        let domain = pattern.strip_prefix("*.").unwrap_or(pattern);
        let valid = !domain.is_empty()
            && !domain.starts_with('.')
            && !domain.ends_with('.')
            && domain
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
        if !valid {
            return Err(format!(
                "`{pattern}` is not a host name or `*.DOMAIN` (expected [PATTERN=]PATH)"
            ));
        }
    }
    if path.is_empty() {
        return Err("the helper's path is empty".to_string());
    }
    Ok(HelperArg {
        pattern,
        path: PathBuf::from(path),
    })
}

/// The helper for `host`: an exact match, else the nearest `*.DOMAIN`, else the last one without
/// a pattern; among equals the last given wins. A server without a host (a unix socket) gets none.
fn select<'a>(helpers: &'a [HelperArg], host: Option<&str>) -> Option<&'a HelperArg> {
    let host = host?.to_ascii_lowercase();
    let last = |wanted: &dyn Fn(Option<&str>) -> bool| {
        helpers.iter().rev().find(|h| wanted(h.pattern.as_deref()))
    };
    if let Some(exact) = last(&|p| p == Some(host.as_str())) {
        return Some(exact);
    }
    // host, then each parent domain: `*.b.c` matches `b.c` and `a.b.c`.
    let mut domain = host.as_str();
    loop {
        let wildcard = format!("*.{domain}");
        if let Some(found) = last(&|p| p == Some(wildcard.as_str())) {
            return Some(found);
        }
        match domain.split_once('.') {
            Some((_, parent)) => domain = parent,
            None => break,
        }
    }
    last(&|p| p.is_none())
}

/// A helper chosen for one server: how to ask it.
#[derive(Debug, Clone)]
struct Helper {
    path: PathBuf,
    /// What the helper is asked about: `grpcs://HOST:PORT` or `grpc://HOST:PORT`.
    uri: String,
    timeout: Duration,
}

/// What a helper prints; everything but `headers` is ignored.
#[derive(Deserialize)]
struct Response {
    #[serde(default)]
    headers: Option<BTreeMap<String, Vec<String>>>,
}

impl Helper {
    /// Runs the helper once and returns its headers.
    async fn get(&self) -> Result<Vec<Header>, ReapiError> {
        let fail = |what: String| ReapiError::CredentialHelper {
            helper: self.path.display().to_string(),
            what,
        };
        let mut child = tokio::process::Command::new(&self.path)
            .arg("get")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so that a helper that hangs is killed with its children.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(format!("cannot be started: {e}")))?;
        let mut group = KillGroupOnDrop(child.id().and_then(|id| libc::pid_t::try_from(id).ok()));
        let request = serde_json::json!({ "uri": self.uri }).to_string();
        let mut stdin = child.stdin.take();
        let talk = async move {
            if let Some(stdin) = stdin.as_mut() {
                // A helper that does not read its input may exit first: not an error by itself.
                let _ = stdin.write_all(request.as_bytes()).await;
            }
            drop(stdin);
            child.wait_with_output().await
        };
        let output = match tokio::time::timeout(self.timeout, talk).await {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => return Err(fail(format!("cannot be run: {e}"))),
            Err(_) => {
                return Err(ReapiError::CredentialHelperTimeout {
                    helper: self.path.display().to_string(),
                    seconds: self.timeout.as_secs(),
                });
            }
        };
        // It finished: whatever it left running (an agent, say) is its business.
        group.0 = None;
        if !output.status.success() {
            return Err(fail(format!(
                "failed ({}): {}",
                output.status,
                quote_stderr(&output.stderr)
            )));
        }
        parse_response(&output.stdout).map_err(fail)
    }
}

/// Kills a helper's process group unless disarmed: a helper that hangs, or whose link is
/// interrupted, goes with everything it started.
struct KillGroupOnDrop(Option<libc::pid_t>);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Some(group) = self.0 {
            // SAFETY: kill(2) on the process group our child leads (it was started with
            // process_group(0)); ESRCH, when nothing of it is left, is harmless.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
    }
}

/// The end of a helper's stderr, as one line for an error message.
fn quote_stderr(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    if text.is_empty() {
        return "it printed nothing on stderr".to_string();
    }
    let start = text.len().saturating_sub(STDERR_QUOTE_BYTES);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let tail = text[start..].lines().collect::<Vec<_>>().join(" | ");
    format!("stderr: {tail}")
}

/// Reads a helper's answer. The message never quotes the output: it holds secrets.
fn parse_response(stdout: &[u8]) -> Result<Vec<Header>, String> {
    let response: Response = serde_json::from_slice(stdout).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Data => "JSON of the wrong shape",
            serde_json::error::Category::Eof if stdout.iter().all(u8::is_ascii_whitespace) => {
                "nothing"
            }
            _ => "something that is not JSON",
        };
        format!(
            "printed {what} (at line {}, column {}) instead of {{\"headers\": {{\"NAME\": [\"VALUE\"]}}}}",
            e.line(),
            e.column()
        )
    })?;
    let mut headers = Vec::new();
    for (name, values) in response.headers.unwrap_or_default() {
        let key = header_key(&name).map_err(|e| e.to_string())?;
        for value in values {
            headers.push((key.clone(), header_value(&name, &value)?));
        }
    }
    Ok(headers)
}

/// The helper's headers of the moment, and which fetch they came from.
struct State {
    generation: u64,
    headers: Arc<Vec<Header>>,
    /// Fetched because the server refused the previous ones.
    after_rejection: bool,
    /// A call carrying them ended without being refused.
    accepted: bool,
}

/// The headers a credential helper supplies to one client, refreshed when the server refuses them.
pub(crate) struct Credentials {
    helper: Option<Helper>,
    state: RwLock<State>,
    /// Held while the helper runs, so that concurrent refused calls run it once.
    refreshing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("helper", &self.helper)
            .field("headers", &self.header_names())
            .finish()
    }
}

impl Credentials {
    /// Chooses the helper for the server at `uri` (with `host`) among `helpers` and runs it.
    pub(crate) async fn obtain(
        helpers: &[HelperArg],
        uri: &str,
        host: Option<&str>,
        timeout: Duration,
    ) -> Result<Credentials, ReapiError> {
        let helper = select(helpers, host).map(|h| Helper {
            path: h.path.clone(),
            uri: uri.to_string(),
            timeout,
        });
        let headers = match &helper {
            Some(helper) => helper.get().await?,
            None => Vec::new(),
        };
        Ok(Credentials::new(helper, headers))
    }

    fn new(helper: Option<Helper>, headers: Vec<Header>) -> Credentials {
        Credentials {
            helper,
            state: RwLock::new(State {
                generation: 0,
                headers: Arc::new(headers),
                after_rejection: false,
                accepted: false,
            }),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    /// Fixed headers, as if from a helper that cannot be asked again.
    #[cfg(test)]
    pub(crate) fn fixed(headers: Vec<Header>) -> Credentials {
        Credentials::new(None, headers)
    }

    /// The helper in use, if any.
    pub(crate) fn helper_path(&self) -> Option<&Path> {
        self.helper.as_ref().map(|h| h.path.as_path())
    }

    /// The names of the headers the helper supplied (never their values).
    pub(crate) fn header_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .headers()
            .iter()
            .map(|(k, _)| k.as_str().to_string())
            .collect();
        names.dedup();
        names
    }

    /// The current headers.
    pub(crate) fn headers(&self) -> Arc<Vec<Header>> {
        match self.state.read() {
            Ok(state) => state.headers.clone(),
            Err(poisoned) => poisoned.into_inner().headers.clone(),
        }
    }

    /// Which fetch the current headers came from.
    pub(crate) fn generation(&self) -> u64 {
        self.state.read().map_or(0, |s| s.generation)
    }

    /// Records that a call sent with the headers of `generation` was not refused.
    pub(crate) fn accepted(&self, generation: u64) {
        // Every call ends here: take the write lock only the first time.
        let news = self.helper.is_some()
            && self
                .state
                .read()
                .is_ok_and(|s| s.generation == generation && !s.accepted);
        if news
            && let Ok(mut state) = self.state.write()
            && state.generation == generation
        {
            state.accepted = true;
        }
    }

    /// After the server refused the headers of `seen`: runs the helper again unless another call
    /// already did. Returns the generation to retry with, or `None` when retrying cannot help: no
    /// helper, the helper failed, or its last answer was itself fetched after a refusal and no call
    /// has vouched for it yet (so a helper whose answers are always refused is not run in a loop).
    pub(crate) async fn refresh_after_rejection(&self, seen: u64) -> Option<u64> {
        let helper = self.helper.as_ref()?;
        let _running = self.refreshing.lock().await;
        {
            let state = self.state.read().ok()?;
            if state.generation != seen {
                return Some(state.generation);
            }
            if state.after_rejection && !state.accepted {
                return None;
            }
        }
        let headers = helper.get().await.ok()?;
        let mut state = self.state.write().ok()?;
        *state = State {
            generation: state.generation + 1,
            headers: Arc::new(headers),
            after_rejection: true,
            accepted: false,
        };
        Some(state.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn helpers(args: &[&str]) -> Vec<HelperArg> {
        args.iter().map(|a| parse_helper_arg(a).unwrap()).collect()
    }

    fn chosen(helpers: &[HelperArg], host: Option<&str>) -> Option<String> {
        select(helpers, host).map(|h| h.path.display().to_string())
    }

    #[test]
    fn the_most_specific_pattern_wins() {
        let all = helpers(&[
            "/any",
            "*.example.com=/wild",
            "*.eu.example.com=/eu",
            "re.example.com=/exact",
            "/any2",
        ]);
        assert_eq!(chosen(&all, Some("re.example.com")).unwrap(), "/exact");
        assert_eq!(chosen(&all, Some("RE.Example.com")).unwrap(), "/exact");
        assert_eq!(chosen(&all, Some("a.eu.example.com")).unwrap(), "/eu");
        assert_eq!(chosen(&all, Some("eu.example.com")).unwrap(), "/eu");
        assert_eq!(chosen(&all, Some("example.com")).unwrap(), "/wild");
        assert_eq!(chosen(&all, Some("x.example.com")).unwrap(), "/wild");
        assert_eq!(chosen(&all, Some("example.org")).unwrap(), "/any2");
        assert_eq!(chosen(&all, None), None);
        let scoped = helpers(&["127.0.0.1=/local"]);
        assert_eq!(chosen(&scoped, Some("127.0.0.1")).unwrap(), "/local");
        assert_eq!(chosen(&scoped, Some("127.0.0.2")), None);
    }

    #[test]
    fn bad_helper_args_are_rejected() {
        for bad in ["", "=/x", "*.=/x", "a b=/x", "host=", ".com=/x"] {
            assert!(parse_helper_arg(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_helper_arg("/opt/helper").unwrap(),
            HelperArg {
                pattern: None,
                path: "/opt/helper".into()
            }
        );
    }

    #[test]
    fn responses_are_read_without_quoting_secrets() {
        let headers = parse_response(
            br#"{"headers": {"Authorization": ["Bearer s3cret"], "x-b": ["1", "2"]},
                 "expires": "2030-01-01T00:00:00Z", "future": 1}"#,
        )
        .unwrap();
        let shown: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            shown,
            [
                ("authorization", "Bearer s3cret"),
                ("x-b", "1"),
                ("x-b", "2")
            ]
        );
        assert!(parse_response(b"{}").unwrap().is_empty());
        for bad in [
            &br#"{"headers": "s3cret"}"#[..],
            br#"{"headers": {"x": "s3cret"}}"#,
            b"s3cret",
            br#"{"headers": {"x": ["s3cret"#,
            br#"{"headers": {"x": ["s3c\nret"]}}"#,
            br#"{"headers": {"bad name": ["s3cret"]}}"#,
        ] {
            let err = parse_response(bad).unwrap_err();
            assert!(!err.contains("s3c"), "{err}");
        }
        assert!(parse_response(b"").unwrap_err().contains("printed nothing"));
    }

    /// A helper that answers `x-run: N` on its Nth run.
    fn counting_helper(dir: &Path) -> HelperArg {
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.join("helper");
        let script = format!(
            r#"#!/bin/sh
echo run >> '{0}/runs'
n=$(wc -l < '{0}/runs')
echo "{{\"headers\": {{\"x-run\": [\"$n\"]}}}}"
"#,
            dir.display()
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        parse_helper_arg(&path.display().to_string()).unwrap()
    }

    fn run_header(credentials: &Credentials) -> String {
        credentials.headers()[0].1.to_str().unwrap().to_string()
    }

    #[tokio::test]
    async fn refusals_run_the_helper_again_once_per_fetch() {
        let dir = tempfile::tempdir().unwrap();
        let helpers = [counting_helper(dir.path())];
        let timeout = Duration::from_secs(10);
        let credentials = Credentials::obtain(&helpers, "grpc://h:1", Some("h"), timeout)
            .await
            .unwrap();
        assert_eq!(
            (credentials.generation(), run_header(&credentials)),
            (0, "1".into())
        );
        // Refused: the helper runs again.
        assert_eq!(credentials.refresh_after_rejection(0).await, Some(1));
        assert_eq!(run_header(&credentials), "2");
        // Another call refused with the old credentials retries with the new ones, no new run.
        assert_eq!(credentials.refresh_after_rejection(0).await, Some(1));
        assert_eq!(run_header(&credentials), "2");
        // The fresh ones refused before any call vouched for them: no loop.
        assert_eq!(credentials.refresh_after_rejection(1).await, None);
        // Once a call went through with them, a later refusal (expiry) runs the helper again.
        credentials.accepted(1);
        assert_eq!(credentials.refresh_after_rejection(1).await, Some(2));
        assert_eq!(run_header(&credentials), "3");
        // No helper for this host: nothing to refresh.
        let none = Credentials::obtain(&[], "grpc://h:1", Some("h"), timeout)
            .await
            .unwrap();
        assert!(none.headers().is_empty());
        assert_eq!(none.refresh_after_rejection(0).await, None);
    }

    #[test]
    fn stderr_is_quoted_as_one_line() {
        assert_eq!(quote_stderr(b"  \n"), "it printed nothing on stderr");
        assert_eq!(
            quote_stderr(b"no token\nlog in\n"),
            "stderr: no token | log in"
        );
        let long = "é".repeat(STDERR_QUOTE_BYTES);
        assert!(quote_stderr(long.as_bytes()).len() <= STDERR_QUOTE_BYTES + 10);
    }
}
