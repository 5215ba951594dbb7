//! The client of one REAPI server: how to reach it ([`ConnectionOptions`]), the connection made once
//! per link ([`Client`]: credentials, headers, channels, capabilities), and what every call needs
//! (its metadata, deadline, retries and error).
//!
//! The calls themselves are in their own files (`cas`, `upload`, `download`, `bytestream`,
//! `action_cache`, `execution`), each an `impl Client` block.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use tokio::time::Instant;

use super::capabilities::{DEFAULT_MAX_BATCH_BYTES, ServerCapabilities};
use super::channel::{self, TlsFiles};
use super::connections::{CALLS_PER_CONNECTION, Connections, CountedChannel};
use super::credentials::{Credentials, HelperArg};
use super::error::ReapiError;
use super::metadata::{CallContext, CallMetadata};
use super::retry::{self, Attempts, RetryPolicy};
use super::stats::{Counters, TransferStats};

/// Blob bytes uploaded at once by one client, in KiB (64 MiB): enough to keep a fast link busy,
/// and a bound on the memory and the file reads that many concurrent jobs' uploads can hold.
pub(super) const UPLOAD_BUDGET_KIB: u32 = 64 << 10;

/// Largest message the client accepts: batches up to the server's limit plus action results
/// with inlined output.
pub(super) const MAX_MESSAGE_BYTES: usize = 128 << 20;

/// How to reach and talk to a REAPI server.
#[derive(Clone)]
pub struct ConnectionOptions {
    /// `grpc://HOST:PORT`, `grpcs://HOST:PORT` or `unix:///PATH`.
    pub endpoint: String,
    /// The REAPI instance name (may be empty).
    pub instance_name: String,
    /// Extra headers sent with every call, `(NAME, VALUE)`; a VALUE of `env:VAR` is read from the
    /// environment variable VAR at connect time.
    pub headers: Vec<(String, String)>,
    /// Credential helpers; the one matching the endpoint's host runs when the client connects.
    pub credential_helpers: Vec<HelperArg>,
    /// How long a credential helper may take.
    pub credential_helper_timeout: Duration,
    pub tls: TlsFiles,
    /// Deadline of each call, retries included (ByteStream transfers get extra time per byte).
    pub timeout: Duration,
    /// Deadline of one Execute, from request to result, including queueing and re-attaching.
    pub execute_timeout: Duration,
    /// Retries of a call after transient failures.
    pub max_retries: u32,
    /// Identifies this link in the server's logs (`RequestMetadata.tool_invocation_id`).
    pub invocation_id: String,
    /// Identifies the build this link belongs to, if the caller knows one.
    pub correlated_invocations_id: Option<String>,
    /// Calls the client makes at once, at most (it may open one HTTP/2 connection per
    /// [`CALLS_PER_CONNECTION`] of them, each only when the others are full).
    pub concurrent_calls: usize,
    /// Transfer blobs zstd-compressed when the server offers it (REAPI compressed-blobs).
    pub compression: bool,
    /// With `compression`, compress also for a server on this machine (a unix socket or a
    /// loopback address), where the bytes cost a copy and compressing them far more; a tunnel or
    /// proxy on this machine to a distant cluster needs it.
    pub compress_near: bool,
}

impl ConnectionOptions {
    /// Options for `endpoint` with defaults: no instance name, no headers, system TLS roots,
    /// 60 s per call, 1 h per Execute, 5 retries, a fresh random invocation id.
    pub fn new(endpoint: impl Into<String>) -> Self {
        ConnectionOptions {
            endpoint: endpoint.into(),
            instance_name: String::new(),
            headers: Vec::new(),
            credential_helpers: Vec::new(),
            credential_helper_timeout: Duration::from_secs(10),
            tls: TlsFiles::default(),
            timeout: Duration::from_secs(60),
            execute_timeout: Duration::from_secs(3600),
            max_retries: 5,
            invocation_id: uuid::Uuid::new_v4().to_string(),
            correlated_invocations_id: None,
            concurrent_calls: CALLS_PER_CONNECTION,
            compression: true,
            compress_near: true,
        }
    }
}

/// Header values are secrets: debug output shows names only.
impl fmt::Debug for ConnectionOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionOptions")
            .field("endpoint", &self.endpoint)
            .field("instance_name", &self.instance_name)
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|(name, _)| name)
                    .collect::<Vec<_>>(),
            )
            .field("credential_helpers", &self.credential_helpers)
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .field("execute_timeout", &self.execute_timeout)
            .field("max_retries", &self.max_retries)
            .field("invocation_id", &self.invocation_id)
            .field("correlated_invocations_id", &self.correlated_invocations_id)
            .field("compression", &self.compression)
            .finish()
    }
}

/// A connection to one REAPI server and instance. Cheap to clone; clones share the channel and
/// the statistics.
#[derive(Clone, Debug)]
pub struct Client {
    pub(super) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    /// Up to one HTTP/2 connection per [`CALLS_PER_CONNECTION`] concurrent calls, opened on demand.
    pub(super) connections: Connections,
    pub(super) endpoint: String,
    pub(super) instance_name: String,
    pub(super) metadata: CallMetadata,
    pub(super) retry: RetryPolicy,
    pub(super) timeout: Duration,
    pub(super) execute_timeout: Duration,
    pub(super) capabilities: ServerCapabilities,
    /// Whether compression may be used (the server's capabilities decide on top).
    pub(super) compression: bool,
    pub(super) counters: Counters,
    /// Bounds the blob bytes being uploaded at once, over all calls (in KiB; see
    /// [`UPLOAD_BUDGET_KIB`]).
    pub(super) upload_budget: tokio::sync::Semaphore,
    /// CancelOperation calls for abandoned executions, still in flight.
    pub(super) cancellations: std::sync::Mutex<tokio::task::JoinSet<()>>,
}

impl Client {
    /// Runs the credential helper (if one matches), connects to the server and reads its
    /// capabilities (retrying while it is unavailable).
    pub async fn connect(opts: &ConnectionOptions) -> Result<Client, ReapiError> {
        check_instance_name(&opts.instance_name)?;
        let (uri, host) = channel::helper_uri(&opts.endpoint)?;
        let credentials = Credentials::obtain(
            &opts.credential_helpers,
            &uri,
            host.as_deref(),
            opts.credential_helper_timeout,
        )
        .await?;
        let metadata = CallMetadata::new(
            &opts.headers,
            Arc::new(credentials),
            &opts.invocation_id,
            opts.correlated_invocations_id.as_deref(),
        )?;
        let connections = opts.concurrent_calls.div_ceil(CALLS_PER_CONNECTION).max(1);
        let channels = (0..connections)
            .map(|_| channel::channel(&opts.endpoint, &opts.tls, opts.timeout))
            .collect::<Result<_, _>>()?;
        let connections = Connections::new(channels)
            .ok_or_else(|| ReapiError::Config("no connection to open".to_owned()))?;
        let mut inner = Inner {
            connections,
            endpoint: opts.endpoint.clone(),
            instance_name: opts.instance_name.clone(),
            metadata,
            retry: RetryPolicy::new(opts.max_retries),
            timeout: opts.timeout,
            execute_timeout: opts.execute_timeout,
            // Replaced by what the server says, just below.
            capabilities: ServerCapabilities {
                max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
                exec_enabled: false,
                ac_update_enabled: false,
                high_api_version: (2, 0),
                zstd: false,
                zstd_batch_update: false,
            },
            compression: opts.compression,
            counters: Counters::default(),
            upload_budget: tokio::sync::Semaphore::new(UPLOAD_BUDGET_KIB as usize),
            cancellations: Default::default(),
        };
        inner.capabilities = inner.read_capabilities().await?;
        if !opts.compress_near && channel::is_this_machine(&opts.endpoint) {
            inner.compression = false;
        }
        Ok(Client {
            inner: Arc::new(inner),
        })
    }

    /// Asks the server for its capabilities again, in full (the client keeps only what it uses).
    pub async fn fetch_capabilities(&self) -> Result<re::ServerCapabilities, ReapiError> {
        self.inner.fetch_capabilities().await
    }

    /// What the server said it can do when the client connected.
    pub fn capabilities(&self) -> &ServerCapabilities {
        &self.inner.capabilities
    }

    /// The endpoint this client talks to, as configured.
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    /// The client's transfer counters so far.
    pub fn stats(&self) -> TransferStats {
        let connections = u64::try_from(self.inner.connections.opened()).unwrap_or(u64::MAX);
        self.inner.counters.snapshot(connections)
    }

    /// Where the call headers come from, names only: the configured headers' names, and the credential
    /// helper with the names of the headers it supplied.
    pub fn header_sources(&self) -> (Vec<String>, Option<(std::path::PathBuf, Vec<String>)>) {
        let credentials = &self.inner.metadata.credentials;
        (
            self.inner.metadata.header_names(),
            credentials
                .helper_path()
                .map(|path| (path.to_path_buf(), credentials.header_names())),
        )
    }

    /// A warning when the calls carry headers (credentials) in clear text to another machine.
    pub fn clear_text_warning(&self) -> Option<String> {
        let host = channel::plaintext_remote_host(&self.inner.endpoint)?;
        self.inner.metadata.sends_headers().then(|| {
            format!(
                "headers (credentials) are sent without TLS to {host} ({}); use grpcs:// unless \
                 the network is trusted",
                self.inner.endpoint
            )
        })
    }
}

/// Opens a connection to `opts.endpoint` (TCP or socket, and TLS) without making a call.
pub async fn probe_connection(opts: &ConnectionOptions) -> Result<(), ReapiError> {
    channel::probe(&opts.endpoint, &opts.tls, opts.timeout).await
}

impl Inner {
    /// The channel for one more call (see [`connections`]).
    pub(super) fn channel(&self) -> CountedChannel {
        self.connections.pick()
    }

    async fn read_capabilities(&self) -> Result<ServerCapabilities, ReapiError> {
        ServerCapabilities::from_proto(&self.endpoint, &self.fetch_capabilities().await?)
    }

    async fn fetch_capabilities(&self) -> Result<re::ServerCapabilities, ReapiError> {
        let request = re::GetCapabilitiesRequest {
            instance_name: self.instance_name.clone(),
        };
        let mut attempts = self.attempts(self.deadline());
        let ctx = CallContext::default();
        let caps = retry::run(&mut attempts, |remaining| {
            let mut client = re::capabilities_client::CapabilitiesClient::new(self.channel());
            let request = self.request(request.clone(), &ctx, remaining);
            async move { client.get_capabilities(request).await }
        })
        .await
        .map_err(|status| self.fail("GetCapabilities", &status, &attempts))?;
        Ok(caps.into_inner())
    }

    /// A request carrying `message`, the metadata for `ctx` and a gRPC deadline of `timeout`.
    pub(super) fn request<T>(
        &self,
        message: T,
        ctx: &CallContext,
        timeout: Duration,
    ) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        self.metadata.apply(request.metadata_mut(), ctx);
        request.set_timeout(timeout);
        request
    }

    /// The deadline of an ordinary call starting now.
    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    pub(super) fn attempts(&self, deadline: Instant) -> Attempts<'_> {
        Attempts::new(&self.retry, deadline, &self.counters.rpc_retries)
            .authenticating(&self.metadata.credentials)
    }

    pub(super) fn fail(
        &self,
        rpc: &'static str,
        status: &tonic::Status,
        attempts: &Attempts<'_>,
    ) -> ReapiError {
        // tonic enforces the grpc-timeout each request carries and reports its expiry as
        // CANCELLED ("Timeout expired"); once the call's deadline has passed, that is the deadline.
        let status = if status.code() == tonic::Code::Cancelled && attempts.remaining().is_none() {
            &retry::deadline_passed()
        } else {
            status
        };
        ReapiError::rpc(rpc, &self.endpoint, status, attempts.retries())
    }

    pub(super) fn protocol_error(&self, rpc: &'static str, what: impl Into<String>) -> ReapiError {
        ReapiError::Protocol {
            rpc,
            endpoint: self.endpoint.clone(),
            what: what.into(),
        }
    }
}

/// Instance names are `/`-separated segments that must not be mistaken for resource name parts.
fn check_instance_name(name: &str) -> Result<(), ReapiError> {
    const RESERVED: [&str; 7] = [
        "blobs",
        "uploads",
        "actions",
        "actionResults",
        "operations",
        "capabilities",
        "compressed-blobs",
    ];
    if name.is_empty() {
        return Ok(());
    }
    match name
        .split('/')
        .find(|s| s.is_empty() || RESERVED.contains(s))
    {
        None => Ok(()),
        Some("") => Err(ReapiError::Config(format!(
            "instance name `{name}` has an empty path segment (leading, trailing or double `/`)"
        ))),
        Some(reserved) => Err(ReapiError::Config(format!(
            "instance name `{name}` contains the reserved segment `{reserved}`"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reapi::{ActionResult, Digest};

    #[test]
    fn instance_names() {
        for ok in ["", "main", "a/b/c", "default_instance"] {
            assert!(check_instance_name(ok).is_ok(), "{ok}");
        }
        for bad in ["/main", "main/", "a//b", "x/blobs/y", "uploads"] {
            assert!(check_instance_name(bad).is_err(), "{bad}");
        }
    }

    /// The executor runs calls on spawned tasks: every call's future must be `Send`.
    #[test]
    fn call_futures_are_send() {
        fn send<T: Send>(_: T) {}
        fn check(c: &Client, d: &Digest, ctx: &CallContext, path: &std::path::Path) {
            send(c.find_missing(std::slice::from_ref(d), ctx));
            send(c.upload(Vec::new(), ctx));
            send(c.upload_missing(Vec::new(), ctx));
            send(c.download(d, ctx));
            send(c.download_to_file(d, path, ctx));
            send(c.get_action_result(d, &[], ctx));
            send(c.update_action_result(d, ActionResult::default(), ctx));
            send(c.execute(d, false, ctx));
        }
        // Type-checking `check` is the test.
        let _ = check;
        send(Client::connect(&ConnectionOptions::new("grpc://h:1")));
    }

    /// A server that accepts connections and never answers: nothing waits forever, the call ends
    /// at its deadline and says so.
    #[tokio::test]
    async fn a_silent_server_fails_calls_with_deadline_exceeded() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let mut opts = ConnectionOptions::new(format!("grpc://{address}"));
        opts.timeout = Duration::from_millis(300);
        opts.max_retries = 2;
        let started = Instant::now();
        let err = Client::connect(&opts).await.unwrap_err();
        silent.abort();
        assert_eq!(err.code(), Some(tonic::Code::DeadlineExceeded), "{err}");
        assert!(err.is_infrastructure());
        assert!(err.to_string().contains("DEADLINE_EXCEEDED"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn debug_hides_header_values() {
        let mut opts = ConnectionOptions::new("grpc://h:1");
        opts.headers
            .push(("authorization".into(), "Bearer s3cret".into()));
        let shown = format!("{opts:?}");
        assert!(
            shown.contains("authorization") && !shown.contains("s3cret"),
            "{shown}"
        );
    }
}
