//! Credential helpers: the headers a call carries, obtained from a program rather than from the
//! command line, by the protocol Bazel and other REAPI clients use (the EngFlow credential-helper
//! spec).
//!
//! Helpers are given as `[PATTERN=]PATH`; the one whose pattern matches the
//! server's host most specifically is used (an exact host, then the nearest `*.DOMAIN`, then one
//! without a pattern), as Bazel chooses. It runs as `PATH get`, reads `{"uri": "grpcs://HOST:PORT"}`
//! on stdin and prints `{"headers": {"NAME": ["VALUE", ...]}, "expires": "RFC 3339 time"}` (`{}`:
//! no credentials; `expires` is optional; other fields are ignored), at most [`MAX_OUTPUT_BYTES`]
//! of it. A client runs it once when it connects; again shortly before the headers expire (a
//! background task, [`renew_before_expiry`]), so calls do not meet a refusal they could have
//! avoided; and once more when the server answers UNAUTHENTICATED, after which the refused call is
//! repeated (credentials revoked mid-link). Header values never appear in an error or in debug
//! output.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};

use super::error::ReapiError;
use super::headers::{Header, header_key, header_value};
use crate::platform::ProcessTree;

/// Most stderr of a failed helper quoted in the error.
const STDERR_QUOTE_BYTES: usize = 2000;

/// Most bytes a helper may print on stdout (an answer is a few headers: kilobytes) and of its
/// stderr that are kept: a helper gone wrong must not fill the distributor's memory.
const MAX_OUTPUT_BYTES: u64 = 1 << 20;

/// How long before `expires` the helper is asked again: a quarter of the headers' lifetime, at
/// most this much (so that a call starting just before expiry does not carry them past it).
const MAX_RENEWAL_LEAD: Duration = Duration::from_secs(60);

/// The least time between two renewals, whatever `expires` says.
const MIN_RENEWAL_INTERVAL: Duration = Duration::from_secs(1);

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

/// What a helper prints; everything but `headers` and `expires` is ignored.
#[derive(Deserialize)]
struct Response {
    #[serde(default)]
    headers: Option<BTreeMap<String, Vec<String>>>,
    #[serde(default)]
    expires: Option<String>,
}

/// A helper's answer: the headers, and until when they are good if it said.
#[derive(Debug)]
struct Answer {
    headers: Vec<Header>,
    expires: Option<SystemTime>,
}

impl Helper {
    /// Runs the helper once and returns its answer.
    async fn get(&self) -> Result<Answer, ReapiError> {
        let fail = |what: String| ReapiError::CredentialHelper {
            helper: self.path.display().to_string(),
            what,
        };
        let mut command = tokio::process::Command::new(&self.path);
        command
            .arg("get")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Its own process tree (group, or job on Windows), so that a helper that hangs is killed
        // with its children.
        ProcessTree::prepare(&mut command);
        let mut child = command
            .spawn()
            .map_err(|e| fail(format!("cannot be started: {e}")))?;
        let mut group = KillGroupOnDrop(ProcessTree::adopt(&mut child).ok());
        let request = serde_json::json!({ "uri": self.uri }).to_string();
        let mut stdin = child.stdin.take();
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let talk = async move {
            let write = async {
                if let Some(stdin) = stdin.as_mut() {
                    // A helper that does not read its input may exit first: not an error by itself.
                    let _ = stdin.write_all(request.as_bytes()).await;
                }
                drop(stdin);
                Ok::<(), Failure>(())
            };
            let stdout = async {
                match read_bounded(stdout, MAX_OUTPUT_BYTES, false).await {
                    Ok((_, true)) => Err(Failure::TooMuch),
                    Ok((kept, false)) => Ok(kept),
                    Err(e) => Err(Failure::Io(e)),
                }
            };
            let stderr = async {
                read_bounded(stderr, MAX_OUTPUT_BYTES, true)
                    .await
                    .map(|(kept, _)| kept)
                    .map_err(Failure::Io)
            };
            let ((), stdout, stderr) = tokio::try_join!(write, stdout, stderr)?;
            let status = child.wait().await.map_err(Failure::Io)?;
            Ok::<_, Failure>((status, stdout, stderr))
        };
        let (status, stdout, stderr) = match tokio::time::timeout(self.timeout, talk).await {
            Ok(Ok(output)) => output,
            // Killed with its process group when `group` is dropped.
            Ok(Err(Failure::TooMuch)) => {
                return Err(fail(format!(
                    "printed more than {} KiB on stdout (the most an answer may take) and was killed",
                    MAX_OUTPUT_BYTES >> 10
                )));
            }
            Ok(Err(Failure::Io(e))) => return Err(fail(format!("cannot be run: {e}"))),
            Err(_) => {
                return Err(ReapiError::CredentialHelperTimeout {
                    helper: self.path.display().to_string(),
                    timeout: self.timeout,
                });
            }
        };
        // It finished: whatever it left running (an agent, say) is its business.
        if let Some(tree) = group.0.take() {
            tree.release();
        }
        if !status.success() {
            return Err(fail(format!(
                "failed ({status}): {}",
                quote_stderr(&stderr)
            )));
        }
        parse_response(&stdout).map_err(fail)
    }
}

/// Why talking to a helper failed.
enum Failure {
    Io(std::io::Error),
    /// It printed more than [`MAX_OUTPUT_BYTES`] on stdout.
    TooMuch,
}

/// Reads `pipe`, keeping at most `max` bytes; the flag says whether there was more. With `drain`,
/// the rest is read and dropped (a helper blocked on a full pipe would never exit); without, reading
/// stops as soon as there is more.
async fn read_bounded(
    pipe: Option<impl AsyncRead + Unpin>,
    max: u64,
    drain: bool,
) -> std::io::Result<(Vec<u8>, bool)> {
    let Some(mut pipe) = pipe else {
        return Ok((Vec::new(), false));
    };
    let mut kept = Vec::new();
    (&mut pipe).take(max + 1).read_to_end(&mut kept).await?;
    let more = kept.len() as u64 > max;
    kept.truncate(usize::try_from(max).unwrap_or(usize::MAX));
    if more && drain {
        tokio::io::copy(&mut pipe, &mut tokio::io::sink()).await?;
    }
    Ok((kept, more))
}

/// Kills a helper's process tree unless disarmed: a helper that hangs, or whose link is
/// interrupted, goes with everything it started.
struct KillGroupOnDrop(Option<ProcessTree>);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Some(tree) = &self.0 {
            tree.kill();
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
fn parse_response(stdout: &[u8]) -> Result<Answer, String> {
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
    let expires = match response.expires {
        None => None,
        Some(time) => Some(
            time::OffsetDateTime::parse(&time, &time::format_description::well_known::Rfc3339)
                .map_err(|e| format!("printed an `expires` that is not an RFC 3339 time ({e})"))?
                .into(),
        ),
    };
    Ok(Answer { headers, expires })
}

/// The helper's headers of the moment, and which fetch they came from.
struct State {
    generation: u64,
    headers: Arc<Vec<Header>>,
    /// When the helper said they expire.
    expires: Option<SystemTime>,
    /// Fetched because the server refused the previous ones.
    after_rejection: bool,
    /// A call carrying them ended without being refused.
    accepted: bool,
}

/// The headers a credential helper supplies to one client, renewed before they expire and when the
/// server refuses them.
pub(crate) struct Credentials {
    shared: Arc<Shared>,
    /// The task that renews the headers before they expire; it ends with the client.
    renewal: Option<tokio::task::AbortHandle>,
}

/// What the client's calls and the renewal task share.
struct Shared {
    helper: Option<Helper>,
    state: RwLock<State>,
    /// Held while the helper runs, so that concurrent refused calls run it once.
    refreshing: tokio::sync::Mutex<()>,
}

impl Drop for Credentials {
    fn drop(&mut self) {
        if let Some(renewal) = &self.renewal {
            renewal.abort();
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("helper", &self.shared.helper)
            .field("headers", &self.header_names())
            .finish()
    }
}

impl Credentials {
    /// Chooses the helper for the server at `uri` (with `host`) among `helpers` and runs it; with
    /// a helper, starts renewing its headers before they expire (on the current tokio runtime).
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
        let Some(helper) = helper else {
            return Ok(Credentials::fixed(Vec::new()));
        };
        let answer = helper.get().await?;
        let shared = Arc::new(Shared {
            helper: Some(helper),
            state: RwLock::new(State {
                generation: 0,
                headers: Arc::new(answer.headers),
                expires: answer.expires,
                after_rejection: false,
                accepted: false,
            }),
            refreshing: tokio::sync::Mutex::new(()),
        });
        let renewal = tokio::spawn(renew_before_expiry(Arc::downgrade(&shared)));
        Ok(Credentials {
            shared,
            renewal: Some(renewal.abort_handle()),
        })
    }

    /// Fixed headers, as if from a helper that cannot be asked again.
    pub(crate) fn fixed(headers: Vec<Header>) -> Credentials {
        Credentials {
            shared: Arc::new(Shared {
                helper: None,
                state: RwLock::new(State {
                    generation: 0,
                    headers: Arc::new(headers),
                    expires: None,
                    after_rejection: false,
                    accepted: false,
                }),
                refreshing: tokio::sync::Mutex::new(()),
            }),
            renewal: None,
        }
    }

    /// The helper in use, if any.
    pub(crate) fn helper_path(&self) -> Option<&Path> {
        self.shared.helper.as_ref().map(|h| h.path.as_path())
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
        match self.shared.state.read() {
            Ok(state) => state.headers.clone(),
            Err(poisoned) => poisoned.into_inner().headers.clone(),
        }
    }

    /// Which fetch the current headers came from.
    pub(crate) fn generation(&self) -> u64 {
        self.shared.state.read().map_or(0, |s| s.generation)
    }

    /// Records that a call sent with the headers of `generation` was not refused.
    pub(crate) fn accepted(&self, generation: u64) {
        // Every call ends here: take the write lock only the first time.
        let state = &self.shared.state;
        let news = self.shared.helper.is_some()
            && state
                .read()
                .is_ok_and(|s| s.generation == generation && !s.accepted);
        if news
            && let Ok(mut state) = state.write()
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
        let shared = &self.shared;
        let helper = shared.helper.as_ref()?;
        let _running = shared.refreshing.lock().await;
        {
            let state = shared.state.read().ok()?;
            if state.generation != seen {
                return Some(state.generation);
            }
            if state.after_rejection && !state.accepted {
                return None;
            }
        }
        let answer = helper.get().await.ok()?;
        Some(shared.replace(answer, true))
    }
}

impl Shared {
    /// Makes `answer` the current headers; returns their generation.
    fn replace(&self, answer: Answer, after_rejection: bool) -> u64 {
        let mut state = match self.state.write() {
            Ok(state) => state,
            Err(poisoned) => poisoned.into_inner(),
        };
        *state = State {
            generation: state.generation + 1,
            headers: Arc::new(answer.headers),
            expires: answer.expires,
            after_rejection,
            accepted: false,
        };
        state.generation
    }

    /// When to ask the helper again for headers that expire at `expires`, fetched at `now`: a
    /// quarter of their remaining lifetime (at most [`MAX_RENEWAL_LEAD`]) before they expire, and
    /// not sooner than [`MIN_RENEWAL_INTERVAL`] from now.
    fn renewal_delay(expires: SystemTime, now: SystemTime) -> Duration {
        let lifetime = expires.duration_since(now).unwrap_or_default();
        let lead = (lifetime / 4).min(MAX_RENEWAL_LEAD);
        lifetime.saturating_sub(lead).max(MIN_RENEWAL_INTERVAL)
    }
}

/// Runs the helper again shortly before the current headers expire, for as long as the client
/// lives. Renewal stops for good when an answer has no `expires` or one already past, or when the
/// helper fails then (not fatal: the headers may still be good, and a refusal runs it again).
async fn renew_before_expiry(shared: std::sync::Weak<Shared>) {
    loop {
        let Some(expires) = shared
            .upgrade()
            .and_then(|s| s.state.read().ok().and_then(|state| state.expires))
        else {
            return;
        };
        if expires <= SystemTime::now() {
            // Expired when it came (or a skewed clock): asking again soon would loop.
            return;
        }
        tokio::time::sleep(Shared::renewal_delay(expires, SystemTime::now())).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let Some(helper) = &shared.helper else {
            return;
        };
        let _running = shared.refreshing.lock().await;
        // A refusal may have renewed them meanwhile.
        let current = shared.state.read().ok().and_then(|state| state.expires);
        if current != Some(expires) {
            continue;
        }
        match helper.get().await {
            Ok(answer) => {
                tracing::debug!(helper = %helper.path.display(), "renewed credentials before they expired");
                shared.replace(answer, false);
            }
            Err(e) => {
                tracing::warn!("cannot renew credentials before they expire: {e}");
                return;
            }
        }
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
    fn expires_is_read_and_renewal_comes_before_it() {
        let answer =
            parse_response(br#"{"headers": {"x": ["s3cret"]}, "expires": "2030-01-01T00:00:00Z"}"#)
                .unwrap();
        assert_eq!(
            answer.expires,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_893_456_000))
        );
        assert_eq!(parse_response(b"{}").unwrap().expires, None);
        let err =
            parse_response(br#"{"headers": {"x": ["s3cret"]}, "expires": "soon"}"#).unwrap_err();
        assert!(
            err.contains("not an RFC 3339 time") && !err.contains("s3c"),
            "{err}"
        );

        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let delay = |secs| Shared::renewal_delay(now + Duration::from_secs(secs), now);
        assert_eq!(delay(3600), Duration::from_secs(3540)); // a minute ahead
        assert_eq!(delay(8), Duration::from_secs(6)); // a quarter of the lifetime ahead
        assert_eq!(delay(0), MIN_RENEWAL_INTERVAL);
    }

    #[test]
    fn responses_are_read_without_quoting_secrets() {
        let headers = parse_response(
            br#"{"headers": {"Authorization": ["Bearer s3cret"], "x-b": ["1", "2"]},
                 "expires": "2030-01-01T00:00:00Z", "future": 1}"#,
        )
        .unwrap()
        .headers;
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
        assert!(parse_response(b"{}").unwrap().headers.is_empty());
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

    /// A helper that answers `x-run: N` on its Nth run (and `expires` as `$expires` has it).
    fn counting_helper(dir: &Path, expires: &str) -> HelperArg {
        helper(
            dir,
            &format!(
                r#"echo run >> '{0}/runs'
n=$(wc -l < '{0}/runs')
{expires}
echo "{{\"headers\": {{\"x-run\": [\"$n\"]}}$expires}}""#,
                dir.display()
            ),
        )
    }

    /// A helper script of `body`.
    fn helper(dir: &Path, body: &str) -> HelperArg {
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.join("helper");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        parse_helper_arg(&path.display().to_string()).unwrap()
    }

    fn run_header(credentials: &Credentials) -> String {
        credentials.headers()[0].1.to_str().unwrap().to_string()
    }

    #[tokio::test]
    async fn refusals_run_the_helper_again_once_per_fetch() {
        let dir = tempfile::tempdir().unwrap();
        let helpers = [counting_helper(dir.path(), "expires=")];
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

    #[tokio::test]
    async fn headers_are_renewed_before_they_expire() {
        let dir = tempfile::tempdir().unwrap();
        // Every answer is good for 2 s.
        let expires = r#"expires=", \"expires\": \"$(date -u -d "@$(( $(date +%s) + 2 ))" +%Y-%m-%dT%H:%M:%SZ)\"""#;
        let helpers = [counting_helper(dir.path(), expires)];
        let credentials =
            Credentials::obtain(&helpers, "grpc://h:1", Some("h"), Duration::from_secs(10))
                .await
                .unwrap();
        assert_eq!(run_header(&credentials), "1");
        assert!(credentials.shared.state.read().unwrap().expires.is_some());
        // Renewed without any refusal, twice.
        let waited = std::time::Instant::now();
        while credentials.generation() < 2 {
            assert!(waited.elapsed() < Duration::from_secs(60), "not renewed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(run_header(&credentials), "3");
        assert!(!credentials.shared.state.read().unwrap().after_rejection);
    }

    #[tokio::test]
    async fn a_helper_printing_too_much_is_killed_and_its_chatter_on_stderr_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        let obtain = |helper: HelperArg| async move {
            Credentials::obtain(&[helper], "grpc://h:1", Some("h"), Duration::from_secs(30)).await
        };
        let endless = helper(dir.path(), "yes '{\"headers\": {}}'");
        let err = obtain(endless).await.unwrap_err().to_string();
        assert!(
            err.contains("printed more than 1024 KiB on stdout") && err.contains("killed"),
            "{err}"
        );
        let chatty = helper(
            dir.path(),
            "head -c 3000000 /dev/zero | tr '\\0' x >&2\necho '{\"headers\": {\"x-a\": [\"1\"]}}'",
        );
        assert_eq!(obtain(chatty).await.unwrap().header_names(), ["x-a"]);
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
