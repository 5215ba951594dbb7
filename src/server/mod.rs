//! `dtlto-reapi serve`: a small, real REAPI v2 server for tests, CI and single-machine use. It
//! stores blobs and action results (in memory or under `--cas-dir`), runs actions with local
//! workers, can hide directories from actions (`--hide`) the way a remote cluster cannot see the
//! client's files, can require a header (a fixed API key) and serve as a cache only, and has
//! fault-injection knobs for testing clients. It is not a production cluster: use Buildbarn,
//! BuildBuddy, NativeLink or BuildGrid for that.
//!
//! This file holds the command line and the wiring; each service lives in its own module.

mod action_cache;
mod action_dir;
mod auth;
mod bytestream;
mod capabilities;
mod cas;
mod compression;
mod context;
mod digest;
mod execution;
mod faults;
mod hostile;
mod inputs;
mod isolation;
mod outputs;
mod paths;
mod shared_files;
mod stats;
mod storage;
mod throttle;
mod worker;

use anyhow::{Context as _, bail};
use bazel_remote_apis::build::bazel::remote::execution::v2::{
    action_cache_server::ActionCacheServer, capabilities_server::CapabilitiesServer,
    content_addressable_storage_server::ContentAddressableStorageServer,
    execution_server::ExecutionServer,
};
use bazel_remote_apis::google::bytestream::byte_stream_server::ByteStreamServer;
use bazel_remote_apis::google::longrunning::operations_server::OperationsServer;
use clap::Args;
use futures::StreamExt as _;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long running RPCs may take to finish after SIGINT/SIGTERM before the server exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// gRPC message overhead allowed on top of `--max-batch-bytes`.
const MESSAGE_OVERHEAD: usize = 1 << 20;

/// Options of `dtlto-reapi serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on: HOST:PORT (port 0 picks a free one) or unix:///PATH. The first line
    /// printed on stdout is `listening on grpc://HOST:PORT` (or `listening on unix:///PATH`).
    /// [default: a unix socket in a new directory only this user can enter, so that only this
    /// user (and root) can connect]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,

    /// Accept a --listen address other than loopback. The server has no authentication and runs
    /// whatever actions it is sent: anyone who can reach the address can run actions.
    #[arg(long)]
    pub allow_remote_clients: bool,

    /// The REAPI instance name this server answers to; requests naming another get NOT_FOUND.
    #[arg(long, default_value = "", value_name = "NAME")]
    pub instance_name: String,

    /// Keep the CAS and the action cache in this directory, across restarts (default: in memory).
    #[arg(long, value_name = "DIR")]
    pub cas_dir: Option<PathBuf>,

    /// Actions run at once (default: the number of CPUs).
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,

    /// Directory under which each action gets its own fresh directory (default: a new temporary
    /// directory, removed at exit).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,

    /// Make this directory invisible to actions (an empty read-only tmpfs covers it in each
    /// action's mount namespace). Repeatable. Fails at start-up where namespaces are unavailable.
    #[arg(long, value_name = "DIR")]
    pub hide: Vec<PathBuf>,

    /// When the server runs as root, let actions (unprivileged uids of their own) read DIR although
    /// a directory above it is closed to them, such as root's home: in each action's mount
    /// namespace, the first such directory is covered by an empty tmpfs in which only DIR appears.
    /// For compilers run from their host path (--toolchain=worker). Repeatable.
    #[arg(long, value_name = "DIR")]
    pub readable: Vec<PathBuf>,

    /// Largest total of blob bytes in one BatchUpdateBlobs or BatchReadBlobs; advertised in the
    /// capabilities and enforced. Larger blobs must go through ByteStream.
    #[arg(long, default_value_t = 4 * 1024 * 1024, value_name = "BYTES")]
    pub max_batch_bytes: u64,

    /// Newest REAPI minor version advertised (2.N, 0 to 3). Lower it to test clients against an
    /// older server, e.g. 0 for a server that predates `output_paths` (REAPI 2.1).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(0..=3), value_name = "N")]
    pub api_minor_version: i32,

    /// Answer calls without this header UNAUTHENTICATED; a VALUE of file:PATH is the content of
    /// PATH, read at every call (repeatable)
    #[arg(long, value_name = "NAME=VALUE")]
    pub require_header: Vec<auth::RequiredHeader>,

    /// Serve as a cache only: the capabilities say execution is disabled and Execute answers
    /// UNIMPLEMENTED
    #[arg(long)]
    pub no_execution: bool,

    /// A platform property the workers offer (repeatable): an action asking for any other gets
    /// FAILED_PRECONDITION, as a scheduler without a matching worker answers [default: any
    /// property is accepted]
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_property)]
    pub platform: Vec<(String, String)>,

    /// Offer and accept no compressed transfers (REAPI compressed-blobs, zstd): the capabilities
    /// list identity only, and compressed requests get INVALID_ARGUMENT.
    #[arg(long)]
    pub no_compression: bool,

    /// Play a distant cluster: blob data to and from clients crosses a link of this bandwidth in
    /// each direction (e.g. 50Mbit, 1Gbit), shared by all calls.
    #[arg(long, value_name = "BITS_PER_SEC")]
    pub throttle_bandwidth: Option<throttle::Bandwidth>,

    /// Play a distant cluster: every call waits this many milliseconds before it starts.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub throttle_latency_ms: u64,

    /// At exit, write what clients transferred to FILE as JSON: blob uploads, distinct blobs
    /// uploaded, blob bytes received and sent (as on the wire), actions run, calls by RPC.
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,

    /// Test knob: fail the first N calls of RPC with status CODE, e.g. `Execute=UNAVAILABLE:2`
    /// (UNAVAILABLE and RESOURCE_EXHAUSTED carry a RetryInfo). RPC is one of GetCapabilities,
    /// FindMissingBlobs, BatchUpdateBlobs, BatchReadBlobs, GetTree, ByteStream.Read,
    /// ByteStream.Write, ByteStream.QueryWriteStatus, GetActionResult, UpdateActionResult,
    /// Execute, WaitExecution, GetOperation, CancelOperation. Repeatable.
    #[arg(
        long,
        value_name = "RPC=CODE:N",
        help_heading = "Test knobs (fault injection)"
    )]
    pub fault_fail: Vec<faults::FailRule>,

    /// Test knob: break the first N Execute streams right after the Operation is accepted, so
    /// that the client must re-attach with WaitExecution.
    #[arg(
        long,
        default_value_t = 0,
        value_name = "N",
        help_heading = "Test knobs (fault injection)"
    )]
    pub fault_drop_execute_stream: u32,

    /// Test knob: delay every RPC by this many milliseconds.
    #[arg(
        long,
        default_value_t = 0,
        value_name = "MS",
        help_heading = "Test knobs (fault injection)"
    )]
    pub fault_delay_ms: u64,

    /// Test knob: corrupt the blob served by the first N reads (BatchReadBlobs entries and
    /// ByteStream.Read calls), so that the client's digest check must catch it.
    #[arg(
        long,
        default_value_t = 0,
        value_name = "N",
        help_heading = "Test knobs (fault injection)"
    )]
    pub fault_corrupt_reads: u32,

    /// Test knob: delay every call of RPC by MS milliseconds, e.g. `GetActionResult=20000`
    /// (RPC as for --fault-fail). Repeatable.
    #[arg(
        long,
        value_name = "RPC=MS",
        help_heading = "Test knobs (fault injection)"
    )]
    pub fault_slow: Vec<hostile::SlowRule>,

    /// Test knob: ByteStream reads `stall` (send their first chunk, then nothing, forever) or
    /// `drip` (send one byte a second); `HOW:N` for the first N reads only.
    #[arg(
        long,
        value_name = "HOW[:N]",
        help_heading = "Test knobs (fault injection)"
    )]
    pub fault_reads: Option<hostile::ReadFaults>,

    /// Test knob: every output file of an executed action claims this size in its digest.
    #[arg(
        long,
        value_name = "BYTES",
        help_heading = "Test knobs (fault injection)"
    )]
    pub fault_output_size: Option<u64>,

    /// Test knob: the stderr of every executed action is an invented blob of this size, made up
    /// on the fly by ByteStream reads (never stored).
    #[arg(
        long,
        value_name = "BYTES",
        help_heading = "Test knobs (fault injection)"
    )]
    pub fault_stderr_size: Option<u64>,

    /// Test knob: every executed action's metadata reports absurd timestamps (centuries apart,
    /// near the ends of what fits), so that clients' time arithmetic can be tested.
    #[arg(long, help_heading = "Test knobs (fault injection)")]
    pub fault_absurd_timestamps: bool,

    /// Test knob: answer every compressed ByteStream read with a zstd bomb (a 128 KiB frame that
    /// decompresses to 4 GiB), whatever blob was asked for.
    #[arg(long, help_heading = "Test knobs (fault injection)")]
    pub fault_zstd_bomb: bool,

    /// Test knob: each credential value (of the --require-header headers) is accepted for N
    /// calls, then answered UNAUTHENTICATED as expired, so that clients must fetch new ones.
    #[arg(long, value_name = "N", help_heading = "Test knobs (fault injection)")]
    pub fault_expire_credentials: Option<u32>,

    /// Test knob: answer every Execute with an ExecuteResponse whose status is CODE (and MESSAGE),
    /// without running the action, e.g. `NOT_FOUND:could not canonicalize path for command root`.
    #[arg(
        long,
        value_name = "CODE[:MESSAGE]",
        help_heading = "Test knobs (fault injection)"
    )]
    pub fault_execute_status: Option<faults::StatusAnswer>,

    /// Test knob: when an action's program cannot be started (a compiler missing on the worker),
    /// answer with an ExecuteResponse status CODE, as some servers do, instead of exit code 127.
    #[arg(
        long,
        value_name = "CODE",
        value_parser = faults::parse_status_code,
        help_heading = "Test knobs (fault injection)"
    )]
    pub missing_program_status: Option<tonic::Code>,

    /// Test knob: break the first N ByteStream writes after their first message (kept, so that
    /// QueryWriteStatus reports it) with UNAVAILABLE, so that the client must resume the upload.
    #[arg(
        long,
        default_value_t = 0,
        value_name = "N",
        help_heading = "Test knobs (fault injection)"
    )]
    pub fault_break_writes: u32,

    /// Test knob: the first N executions find the files of their input root's top directory gone
    /// from the CAS when a worker takes them (as if evicted after the client's upload), so that
    /// the Execute is answered FAILED_PRECONDITION naming them and the client must upload them
    /// again.
    #[arg(
        long,
        default_value_t = 0,
        value_name = "N",
        help_heading = "Test knobs (fault injection)"
    )]
    pub fault_lose_inputs: u32,

    /// Test knob: refuse the first N blobs sent through BatchUpdateBlobs, each with a per-blob
    /// UNAVAILABLE status in a successful response (the blob is not stored), so that the client
    /// must send those blobs again.
    #[arg(
        long,
        default_value_t = 0,
        value_name = "N",
        help_heading = "Test knobs (fault injection)"
    )]
    pub fault_refuse_blobs: u32,
}

/// Runs the server until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(serve(args))
}

/// `NAME=VALUE` of `--platform`.
fn parse_property(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err("expected NAME=VALUE".to_owned()),
    }
}

/// Where to listen, parsed from `--listen`.
enum Listen {
    Tcp(String),
    Unix(PathBuf),
}

/// The default listener: a socket in a new directory that only this user can enter (mode 0700),
/// so that other local users cannot connect (a unix socket's permissions are those of the path to
/// it). The directory goes when the returned guard is dropped.
fn private_socket() -> anyhow::Result<(PathBuf, tempfile::TempDir)> {
    let dir = tempfile::Builder::new()
        .prefix("dtlto-reapi-serve-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .context("cannot create a private directory for the server's socket")?;
    Ok((dir.path().join("serve.sock"), dir))
}

fn parse_listen(listen: &str) -> anyhow::Result<Listen> {
    if let Some(path) = listen.strip_prefix("unix://") {
        anyhow::ensure!(
            path.starts_with('/'),
            "--listen {listen}: a unix socket path must be absolute (unix:///PATH)"
        );
        return Ok(Listen::Unix(PathBuf::from(path)));
    }
    Ok(Listen::Tcp(
        listen.strip_prefix("grpc://").unwrap_or(listen).to_owned(),
    ))
}

/// Completes at SIGINT or SIGTERM.
async fn termination() -> anyhow::Result<()> {
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = sigterm.recv() => {}
    }
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let (context, served) = listen(&args).await?;
    if let Some(path) = &args.stats_json {
        context.stats.write(path)?;
    }
    served
}

/// Serves until shutdown; returns the shared context (for its statistics) and how serving ended.
async fn listen(args: &ServeArgs) -> anyhow::Result<(Arc<context::Context>, anyhow::Result<()>)> {
    // Hold the temporary work root (if any) until the server exits.
    let (work_root, _temporary) = match &args.work_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create --work-dir {}", dir.display()))?;
            (dir.canonicalize()?, None)
        }
        None => {
            let dir = tempfile::Builder::new()
                .prefix("dtlto-reapi-serve-")
                .tempdir()?;
            (dir.path().canonicalize()?, Some(dir))
        }
    };
    let (listen, socket_dir) = match &args.listen {
        Some(listen) => (parse_listen(listen)?, None),
        None => {
            let (path, dir) = private_socket()?;
            (Listen::Unix(path), Some(dir))
        }
    };
    // The server's own state is none of the actions' business.
    let mut private: Vec<PathBuf> = args.cas_dir.iter().cloned().collect();
    private.extend(socket_dir.as_ref().map(|dir| dir.path().to_path_buf()));
    let isolation = isolation::Isolation::new(&args.hide, &args.readable, &private, &work_root)?;
    if isolation.own_ids() {
        // Actions, running as other users, must reach their own directories inside.
        std::fs::set_permissions(&work_root, std::fs::Permissions::from_mode(0o711))
            .with_context(|| format!("cannot open up {}", work_root.display()))?;
    }
    let context = Arc::new(context::Context {
        instance_name: args.instance_name.clone(),
        storage: storage::Storage::open(args.cas_dir.as_deref())?,
        faults: faults::Faults::new(
            &args.fault_fail,
            args.fault_drop_execute_stream,
            args.fault_delay_ms.saturating_add(args.throttle_latency_ms),
            args.fault_corrupt_reads,
            args.fault_break_writes,
        )
        .with_execute_answers(
            args.fault_execute_status.clone(),
            args.missing_program_status,
        )
        .with_lost_inputs(args.fault_lose_inputs)
        .with_refused_blobs(args.fault_refuse_blobs),
        hostile: hostile::Hostile::new(
            &args.fault_slow,
            args.fault_reads,
            args.fault_output_size,
            args.fault_stderr_size,
        )
        .with_zstd_bomb(args.fault_zstd_bomb)
        .with_absurd_timestamps(args.fault_absurd_timestamps),
        max_batch_bytes: args.max_batch_bytes,
        api_minor_version: args.api_minor_version,
        exec_enabled: !args.no_execution,
        platform: (!args.platform.is_empty()).then(|| args.platform.clone()),
        compression: !args.no_compression,
        stats: stats::Stats::default(),
        throttle: throttle::Throttle::new(args.throttle_bandwidth),
    });
    let workers = args
        .workers
        .unwrap_or_else(crate::settings::available_cores);
    let shutdown = CancellationToken::new();
    // Actions with the server's rights on files could write a shared copy: they get their own.
    let shared = if isolation.actions_are_server_user() {
        None
    } else {
        Some(shared_files::SharedFiles::new(
            work_root.join("shared-inputs"),
        )?)
    };
    let first_id = isolation::FIRST_ACTION_ID;
    let worker = worker::Worker {
        context: context.clone(),
        shared,
        work_root,
        isolation,
        ids: std::sync::Mutex::new((first_id..).take(workers.max(1)).collect()),
        name: format!("dtlto-reapi-serve@{}", std::process::id()),
    };
    let executor = Arc::new(execution::Executor::new(
        context.clone(),
        worker,
        workers,
        shutdown.clone(),
    ));

    let message_limit = usize::try_from(args.max_batch_bytes)
        .unwrap_or(usize::MAX)
        .max(4 << 20)
        .saturating_add(MESSAGE_OVERHEAD);
    let auth = auth::Auth::new(&args.require_header, args.fault_expire_credentials);
    let actions = (!args.no_execution).then_some(executor);
    let router = tonic::transport::Server::builder()
        .layer(tonic::service::InterceptorLayer::new(auth))
        .add_service(CapabilitiesServer::new(capabilities::CapabilitiesService(
            context.clone(),
        )))
        .add_service(
            ContentAddressableStorageServer::new(cas::CasService(context.clone()))
                .max_decoding_message_size(message_limit)
                .max_encoding_message_size(message_limit),
        )
        .add_service(
            ByteStreamServer::new(bytestream::ByteStreamService::new(context.clone()))
                .max_decoding_message_size(message_limit),
        )
        .add_service(
            ActionCacheServer::new(action_cache::ActionCacheService(context.clone()))
                .max_decoding_message_size(message_limit)
                .max_encoding_message_size(message_limit),
        )
        // Without execution, the services are absent and their calls UNIMPLEMENTED.
        .add_optional_service(
            actions
                .clone()
                .map(|e| ExecutionServer::new(execution::ExecutionService(e))),
        )
        .add_optional_service(
            actions.map(|e| OperationsServer::new(execution::OperationsService(e))),
        );

    let stop = shutdown.clone();
    tokio::spawn(async move {
        if let Err(e) = termination().await {
            eprintln!("dtlto-reapi serve: cannot wait for signals: {e}");
        }
        // Stops accepting connections and cancels running actions.
        stop.cancel();
    });
    let stopped = shutdown.clone().cancelled_owned();

    let served = match listen {
        Listen::Tcp(address) => {
            let resolved = tcp_addresses(&address, args.allow_remote_clients).await?;
            let listener = tokio::net::TcpListener::bind(&resolved[..])
                .await
                .with_context(|| format!("cannot listen on {address}"))?;
            announce(&format!("grpc://{}", listener.local_addr()?))?;
            let incoming =
                tokio_stream::wrappers::TcpListenerStream::new(listener).inspect(counted(&context));
            finish(
                router.serve_with_incoming_shutdown(incoming, stopped),
                &shutdown,
            )
            .await
        }
        Listen::Unix(path) => {
            let listener = tokio::net::UnixListener::bind(&path)
                .with_context(|| format!("cannot listen on unix://{}", path.display()))?;
            announce(&format!("unix://{}", path.display()))?;
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener)
                .inspect(counted(&context));
            let served = finish(
                router.serve_with_incoming_shutdown(incoming, stopped),
                &shutdown,
            )
            .await;
            // Best effort: a stale socket file would only make the next bind fail clearly.
            let _ = std::fs::remove_file(&path);
            served
        }
    };
    Ok((context, served))
}

/// Counts each accepted connection in the server's statistics.
fn counted<T, E>(context: &Arc<context::Context>) -> impl Fn(&Result<T, E>) + use<T, E> {
    let context = context.clone();
    move |accepted| {
        if accepted.is_ok() {
            context.stats.connection_accepted();
        }
    }
}

/// The socket addresses `address` names; all of them loopback unless `allow_remote` (the server
/// runs commands for anyone who reaches it, so it must not be reachable from the network by
/// accident).
async fn tcp_addresses(address: &str, allow_remote: bool) -> anyhow::Result<Vec<SocketAddr>> {
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host(address)
        .await
        .with_context(|| format!("--listen {address}: cannot resolve it"))?
        .collect();
    if let Some(open) = resolved.iter().find(|a| !a.ip().is_loopback())
        && !allow_remote
    {
        bail!(
            "--listen {address}: {} is not a loopback address, and this server runs commands for \
             anyone who reaches it without authentication; listen on 127.0.0.1, ::1 or \
             unix:///PATH, or pass --allow-remote-clients on a trusted network",
            open.ip()
        );
    }
    Ok(resolved)
}

/// Prints the line tests and scripts parse to find the server.
fn announce(address: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on {address}")?;
    stdout.flush()?;
    Ok(())
}

/// Runs the server; after shutdown starts, gives running RPCs a grace period to finish.
async fn finish(
    server: impl std::future::Future<Output = Result<(), tonic::transport::Error>>,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let grace = async {
        shutdown.cancelled().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        result = server => result.context("the gRPC server failed"),
        () = grace => Ok(()),
    }
}
