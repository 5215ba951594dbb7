//! `dtlto-reapi check`: the first command to run against a cluster. With the settings a link would
//! use, it goes through what a link needs, one step and one line at a time — the connection (and
//! TLS), the credentials, the server's capabilities, a CAS round trip, an action-cache lookup and,
//! in remote mode, one real action on a worker (the compiler printing its version) — and says, for
//! the first step that fails, what to change. Exit status 0 means a link with these settings would
//! work.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use tonic::Code;

use crate::cache::DigestCache;
use crate::executor::remote::connection_options;
use crate::plan::action::platform;
use crate::plan::environment::Environment;
use crate::plan::merkle::{TreeFile, build_tree};
use crate::plan::planner::platform_properties;
use crate::plan::toolchain::{ModeRequest, Toolchain, ToolchainMode};
use crate::reapi::{self, Blob, CallContext, Client, ConnectionOptions, Digest, ReapiError};
use crate::settings::{Mode, Settings};
use crate::stats::ServerTimes;

/// The outcome of one step: what was found, or what failed and what to do about it.
type Step<T> = Result<(T, String), Failure>;

struct Failure {
    /// The step that failed, when it is not the one that ran (a wrong instance name shows up
    /// in the first call).
    step: Option<&'static str>,
    what: String,
    advice: String,
}

impl Failure {
    fn new(what: impl ToString, advice: impl Into<String>) -> Failure {
        Failure {
            step: None,
            what: what.to_string(),
            advice: advice.into(),
        }
    }

    /// A failure of the REAPI client, with what it says to check.
    fn reapi(e: &ReapiError, advice: impl Into<String>) -> Failure {
        Failure::new(crate::advice::describe(e), advice)
    }
}

/// Runs `step`, prints its line, and returns its value when it succeeded.
async fn step<T>(name: &str, step: impl Future<Output = Step<T>>) -> Option<T> {
    let started = Instant::now();
    let outcome = step.await;
    let took = millis(started.elapsed());
    match outcome {
        Ok((value, detail)) => {
            println!("✓ {name}: {detail} ({took})");
            Some(value)
        }
        Err(failure) => {
            let name = failure.step.unwrap_or(name);
            println!("✗ {name}: {} ({took})", failure.what);
            println!("  → {}", failure.advice);
            None
        }
    }
}

fn millis(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// Runs every check and returns the exit status: success only if a link would work.
pub fn run(settings: &Settings, compiler: Option<&Path>, prepend: &[String]) -> ExitCode {
    let Some(runtime) = crate::distribute::runtime() else {
        return ExitCode::FAILURE;
    };
    if runtime.block_on(check(settings, compiler, prepend)) {
        println!("dtlto-reapi check: a link with these settings would work");
        ExitCode::SUCCESS
    } else {
        println!("dtlto-reapi check: a link with these settings would not work (see ✗ above)");
        ExitCode::FAILURE
    }
}

async fn check(settings: &Settings, compiler: Option<&Path>, prepend: &[String]) -> bool {
    let mode = serde_json::to_value(settings.mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    if settings.mode == Mode::Local {
        println!(
            "✓ mode local: compiles run on this machine, {} at once; there is no cluster to \
             check (give --remote=URL for one)",
            settings.jobs
        );
        return true;
    }
    let Some(mut options) = step("settings", async {
        let mut options = connection_options(settings)
            .map_err(|e| Failure::new(format!("{e:#}"), "fix the option named above"))?;
        // A check must not wait an hour for a worker.
        options.execute_timeout = options.timeout;
        let detail = format!(
            "mode {mode}, server {}, instance {:?}",
            options.endpoint, options.instance_name
        );
        Ok((options, detail))
    })
    .await
    else {
        return false;
    };
    options.concurrent_calls = 1;
    if step("connection", connection(&options)).await.is_none() {
        return false;
    }
    let Some(client) = step("authentication", authenticate(&options)).await else {
        return false;
    };
    if let Some(warning) = client.clear_text_warning() {
        println!("! warning: {warning}");
    }
    let ctx = CallContext {
        action_id: String::new(),
        target_id: "dtlto-reapi check".to_string(),
    };
    let writes = settings.mode == Mode::Remote || settings.remote_upload;
    step("capabilities", capabilities(&client, settings))
        .await
        .is_some()
        && step("CAS", cas_round_trip(&client, writes, &ctx))
            .await
            .is_some()
        && step("action cache", action_cache(&client, &ctx))
            .await
            .is_some()
        && (settings.mode != Mode::Remote
            || step(
                "remote execution",
                execution(&client, settings, compiler, prepend, &ctx),
            )
            .await
            .is_some())
}

/// Opens the connection (and the TLS session) without a call.
async fn connection(options: &ConnectionOptions) -> Step<()> {
    reapi::probe_connection(options).await.map_err(|e| {
        Failure::reapi(
            &e,
            "check that the server runs and that --remote names it (grpc://HOST:PORT without \
             TLS, grpcs://HOST:PORT with TLS, --tls-ca-cert for a private CA)",
        )
    })?;
    let how = if options.endpoint.starts_with("unix://") {
        "unix socket"
    } else if options.endpoint.starts_with("grpc://") || options.endpoint.starts_with("http://") {
        "TCP, no TLS"
    } else {
        "TCP and TLS"
    };
    Ok(((), format!("{how} to {}", options.endpoint)))
}

/// Runs the credential helper and the first call; reports where the headers came from.
async fn authenticate(options: &ConnectionOptions) -> Step<Client> {
    let client = Client::connect(options).await.map_err(|e| match &e {
        ReapiError::CredentialHelper { .. } => Failure::reapi(
            &e,
            "fix the credential helper (run it by hand: `PATH get` with {\"uri\": \"...\"} on \
             stdin) or --credential-helper",
        ),
        ReapiError::Rpc {
            code: Code::Unauthenticated | Code::PermissionDenied,
            ..
        } => Failure::reapi(
            &e,
            "the server refused the credentials: give the header it expects with \
             --remote-header=NAME=env:VAR (is the variable set?) or --credential-helper",
        ),
        ReapiError::Rpc {
            code: Code::NotFound | Code::InvalidArgument,
            ..
        } => Failure {
            step: Some("instance name"),
            advice: format!(
                "the server does not serve instance {:?}: set --instance-name to the instance \
                 its administrator configured",
                options.instance_name
            ),
            what: crate::advice::describe(&e),
        },
        _ => Failure {
            step: Some("first call"),
            what: crate::advice::describe(&e),
            advice: "see the error above; is --remote the REAPI endpoint of the cluster?"
                .to_string(),
        },
    })?;
    let (given, helper) = client.header_sources();
    let mut sources = Vec::new();
    if !given.is_empty() {
        sources.push(format!("{} from --remote-header", given.join(", ")));
    }
    if let Some((path, names)) = helper {
        let names = if names.is_empty() {
            "no headers".to_string()
        } else {
            names.join(", ")
        };
        sources.push(format!("{names} from credential helper {}", path.display()));
    }
    let detail = if sources.is_empty() {
        "no credentials given, none asked for".to_string()
    } else {
        format!("{}; accepted", sources.join("; "))
    };
    Ok((client, detail))
}

/// What the server offers, and whether it is what the mode needs.
async fn capabilities(client: &Client, settings: &Settings) -> Step<()> {
    let caps = client
        .fetch_capabilities()
        .await
        .map_err(|e| Failure::reapi(&e, "see the error above"))?;
    let used = client.capabilities();
    let cache = caps.cache_capabilities.clone().unwrap_or_default();
    let names = |values: &[i32], name: fn(i32) -> Option<&'static str>| -> String {
        let names: Vec<&str> = values.iter().map(|&v| name(v).unwrap_or("?")).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    let digests = names(&cache.digest_functions, |v| {
        re::digest_function::Value::try_from(v)
            .ok()
            .map(|v| v.as_str_name())
    });
    let compressors = names(&cache.supported_compressors, |v| {
        re::compressor::Value::try_from(v)
            .ok()
            .map(|v| v.as_str_name())
    })
    .to_lowercase();
    let version = |v: &Option<bazel_remote_apis::build::bazel::semver::SemVer>| {
        v.as_ref()
            .map_or("?".to_string(), |v| format!("{}.{}", v.major, v.minor))
    };
    let detail = format!(
        "REAPI {} to {}, digest functions {digests}, compressors {compressors}, batch limit {} \
         bytes, execution {}, action-cache updates {}",
        version(&caps.low_api_version),
        version(&caps.high_api_version),
        used.max_batch_bytes,
        if used.exec_enabled {
            "enabled"
        } else {
            "disabled"
        },
        if used.ac_update_enabled {
            "allowed"
        } else {
            "not allowed"
        },
    );
    if settings.mode == Mode::Remote && !used.exec_enabled {
        return Err(Failure::new(
            format!("{detail}: this server does not execute actions"),
            "use --mode=cache-only: compiles run locally and results are shared through the \
             server's cache",
        ));
    }
    if settings.mode == Mode::CacheOnly && settings.remote_upload && !used.ac_update_enabled {
        println!(
            "! warning: the server does not accept action-cache updates: links will use its \
             cache read-only (--remote-upload=false says so)"
        );
    }
    Ok(((), detail))
}

/// Uploads a small blob and reads it back (or, when links never write, looks it up).
async fn cas_round_trip(client: &Client, writes: bool, ctx: &CallContext) -> Step<()> {
    let content = format!("dtlto-reapi check {}\n", uuid::Uuid::new_v4()).into_bytes();
    let blob = Blob::from_bytes(content.clone());
    let digest = blob.digest.clone();
    let denied = "the credentials may not write to the CAS: use read-write credentials, or \
                  --mode=cache-only --remote-upload=false where links should only read";
    if !writes {
        client
            .find_missing(std::slice::from_ref(&digest), ctx)
            .await
            .map_err(|e| Failure::reapi(&e, "see the error above"))?;
        return Ok((
            (),
            "FindMissingBlobs works (no upload: links do not write, --remote-upload=false)"
                .to_string(),
        ));
    }
    let advice = |e: &ReapiError| match e.code() {
        Some(Code::PermissionDenied) => denied.to_string(),
        _ => "see the error above".to_string(),
    };
    client
        .upload(vec![blob], ctx)
        .await
        .map_err(|e| Failure::reapi(&e, advice(&e)))?;
    let back = client
        .download(&digest, ctx)
        .await
        .map_err(|e| Failure::reapi(&e, advice(&e)))?;
    if back != content {
        return Err(Failure::new(
            "the blob read back differs from the one uploaded",
            "the server's CAS is broken: report it to its administrator",
        ));
    }
    Ok((
        (),
        format!("uploaded and read back a {}-byte blob", content.len()),
    ))
}

/// Looks up an action nobody ran: a miss is the expected answer.
async fn action_cache(client: &Client, ctx: &CallContext) -> Step<()> {
    let nobody = reapi::digest::of_bytes(uuid::Uuid::new_v4().as_bytes());
    let found = client
        .get_action_result(&nobody, &[], ctx)
        .await
        .map_err(|e| Failure::reapi(&e, "see the error above"))?;
    let detail = match found {
        None => "lookup works (a miss, as expected)",
        Some(_) => "lookup works",
    };
    Ok(((), detail.to_string()))
}

/// The compiler a check runs, and how it gets to the worker.
struct CheckedCompiler {
    /// As the user named it.
    shown: String,
    /// What the action runs before `--version`.
    arguments: Vec<String>,
    /// Upload mode: the toolchain, for the input root and the uploads.
    uploaded: Option<Toolchain>,
    /// Why upload mode was wanted but is impossible, if so.
    why_not_uploaded: Option<String>,
}

/// The compiler to try: `--compiler`, else `--upload-compiler`, else `--remote-compiler`, else clang
/// on PATH; uploaded with
/// the action as a link would upload it (unless `--remote-compiler` or `--toolchain=worker` say the
/// workers have it).
async fn checked_compiler(
    settings: &Settings,
    compiler: Option<&Path>,
    prepend: &[String],
) -> Result<CheckedCompiler, Failure> {
    let Some(path) = compiler
        .map(Path::to_path_buf)
        .or_else(|| settings.upload_compiler.clone())
        .or_else(|| settings.remote_compiler.as_ref().map(PathBuf::from))
        .or_else(|| on_path("clang"))
    else {
        return Err(Failure::new(
            "no compiler to try: none given and no clang on PATH",
            "give --compiler=PATH (the compiler a link uses; with --remote-compiler or \
             --toolchain=worker, its path on the workers)",
        ));
    };
    let path_text = path.to_string_lossy().into_owned();
    // As the user would type it: `zig clang`.
    let shown = std::iter::once(path_text.clone())
        .chain(prepend.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    let worker_mode = |why_not_uploaded| CheckedCompiler {
        shown: shown.clone(),
        arguments: std::iter::once(path_text.clone())
            .chain(prepend.iter().cloned())
            .collect(),
        uploaded: None,
        why_not_uploaded,
    };
    if settings.remote_compiler.is_some() || settings.toolchain == Some(ToolchainMode::Worker) {
        return Ok(worker_mode(None));
    }
    let request = ModeRequest {
        toolchain: settings.toolchain,
        remote_compiler: None,
        upload_compiler: None,
    };
    let args = vec![path_text.clone()];
    let environment = compile_environment(settings)?;
    let resolved = tokio::task::spawn_blocking(move || {
        let digests = DigestCache::open(DigestCache::default_file());
        let resolved = Toolchain::resolve(&args, request, &environment, &digests);
        // Losing the cache only costs hashing the compiler again next time.
        let _ = digests.save();
        resolved
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    match resolved {
        Err(e) => Err(Failure::new(
            format!("the compiler {path_text}: {e}"),
            "give --compiler the compiler a link uses",
        )),
        Ok((toolchain, why_not)) if toolchain.identity.mode == ToolchainMode::Upload => {
            Ok(CheckedCompiler {
                arguments: toolchain.launch().iter().chain(prepend).cloned().collect(),
                shown,
                uploaded: Some(toolchain),
                why_not_uploaded: why_not,
            })
        }
        Ok((_, why_not)) => Ok(worker_mode(why_not)),
    }
}

/// The environment a link's compiles get (`--pass-env`).
fn compile_environment(settings: &Settings) -> Result<Environment, Failure> {
    Environment::new(&settings.pass_env).map_err(|e| Failure::new(e, "fix --pass-env"))
}

/// Runs `COMPILER --version` on a worker, as a link's actions would run the compiler: uploaded
/// with the action (upload mode) or at its path on the worker (worker mode).
async fn execution(
    client: &Client,
    settings: &Settings,
    compiler: Option<&Path>,
    prepend: &[String],
    ctx: &CallContext,
) -> Step<()> {
    let compiler = checked_compiler(settings, compiler, prepend).await?;
    let properties = platform_properties(settings)
        .map_err(|e| Failure::new(format!("{e:#}"), "fix --platform"))?;
    let environment = compile_environment(settings)?;
    let (action, blobs) = version_action(&compiler, &properties, &environment)
        .map_err(|e| Failure::new(format!("building the action: {e}"), "report this as a bug"))?;
    let unexpected = |e: ReapiError| {
        let advice = match e.code() {
            Some(Code::FailedPrecondition | Code::InvalidArgument | Code::Unavailable) => {
                "no worker takes this action: check --platform against the properties the \
                 cluster's workers offer, and --instance-name"
            }
            Some(Code::Unimplemented) => {
                "this server does not execute actions: use --mode=cache-only"
            }
            _ => "see the error above",
        };
        Failure::reapi(&e, advice)
    };
    let uploading = Instant::now();
    client
        .upload_missing(blobs, ctx)
        .await
        .map_err(unexpected)?;
    let uploaded_in = uploading.elapsed();
    let started = Instant::now();
    let response = client
        .execute(&action, true, ctx)
        .await
        .map_err(unexpected)?;
    let total = started.elapsed();
    let shown = &compiler.shown;
    let result = response.result.unwrap_or_default();
    if result.exit_code != 0 {
        let stderr = output_of(client, &result.stderr_raw, &result.stderr_digest, ctx).await;
        let advice = match (&compiler.uploaded, &compiler.why_not_uploaded) {
            (Some(_), _) => "the compiler was uploaded with the action and still did not run: \
                 the workers may be another architecture or operating system (select matching \
                 ones with --platform), or try --toolchain=worker with a worker image that has \
                 the compiler"
                .to_owned(),
            (None, Some(why_not)) => format!("it could not be uploaded: {why_not}"),
            (None, None) => "the workers cannot run this compiler: give --remote-compiler (or \
                 check's --compiler) the compiler's path on the workers, or --platform \
                 properties that select workers (a container image) that have it"
                .to_owned(),
        };
        return Err(Failure::new(
            format!(
                "`{shown} --version` exited with {} on the worker: {}",
                result.exit_code,
                String::from_utf8_lossy(&stderr).trim()
            ),
            advice,
        ));
    }
    let stdout = output_of(client, &result.stdout_raw, &result.stdout_digest, ctx).await;
    let version = String::from_utf8_lossy(&stdout)
        .lines()
        .next()
        .unwrap_or("(no output)")
        .to_string();
    let times = result
        .execution_metadata
        .as_ref()
        .map(|meta| ServerTimes::of(meta).remote_times());
    let span = |ms: Option<u64>| ms.map_or("?".to_string(), |ms| format!("{ms} ms"));
    let worker = times
        .as_ref()
        .map(|t| t.worker.as_str())
        .filter(|w| !w.is_empty())
        .unwrap_or("?");
    let how = match (&compiler.uploaded, &compiler.why_not_uploaded) {
        (Some(toolchain), _) => format!(
            "upload mode: {} file{}, {:.1} MB, in the CAS after {}",
            toolchain.files.len(),
            if toolchain.files.len() == 1 { "" } else { "s" },
            toolchain.size() as f64 / 1e6,
            millis(uploaded_in)
        ),
        (None, Some(why_not)) => format!("worker mode, as links will run it: {why_not}"),
        (None, None) => "worker mode: the compiler at its path on the worker".to_owned(),
    };
    let detail = format!(
        "`{shown} --version` on worker {worker}: {version} (queued {}, executed {}, Execute \
         took {}; {how})",
        span(times.as_ref().and_then(|t| t.queue_ms)),
        span(times.as_ref().and_then(|t| t.execute_ms)),
        millis(total)
    );
    Ok(((), detail))
}

/// An action's stdout or stderr: inline, else from the CAS (empty when it cannot be read).
async fn output_of(
    client: &Client,
    raw: &[u8],
    digest: &Option<Digest>,
    ctx: &CallContext,
) -> Vec<u8> {
    match digest {
        _ if !raw.is_empty() => raw.to_vec(),
        Some(d) if d.size_bytes > 0 => client.download(d, ctx).await.unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// An action running the compiler with `--version`, never cached: its input root is empty, or
/// holds the toolchain in upload mode.
fn version_action(
    compiler: &CheckedCompiler,
    properties: &[(String, String)],
    environment: &Environment,
) -> Result<(Digest, Vec<Blob>), String> {
    let platform = platform(properties);
    #[allow(deprecated)] // Command.platform: as links set it, for servers that read it there
    let command = re::Command {
        arguments: compiler
            .arguments
            .iter()
            .cloned()
            .chain(["--version".to_owned()])
            .collect(),
        environment_variables: environment.to_command(),
        platform: platform.clone(),
        ..Default::default()
    };
    let mut blobs = Vec::new();
    let toolchain = compiler.uploaded.iter().flat_map(Toolchain::inputs);
    let mut entries = Vec::new();
    for (path, file) in toolchain {
        let tree_file = TreeFile {
            digest: file.digest.clone(),
            executable: file.executable,
        };
        entries.push((path, tree_file));
        blobs.push(Blob::from_file(file.local.clone(), file.digest.clone()));
    }
    let tree = build_tree(entries)?;
    blobs.extend(
        tree.directories
            .into_iter()
            .map(|(_, bytes)| Blob::from_bytes(bytes)),
    );
    let (command_digest, command_bytes) = reapi::digest::of_message(&command);
    let action = re::Action {
        command_digest: Some(command_digest),
        input_root_digest: Some(tree.root_digest),
        do_not_cache: true,
        platform,
        ..Default::default()
    };
    let (action_digest, action_bytes) = reapi::digest::of_message(&action);
    blobs.extend(
        [command_bytes, action_bytes]
            .into_iter()
            .map(Blob::from_bytes),
    );
    Ok((action_digest, blobs))
}

/// `name` found in the directories of `PATH`, as the shell would run it.
fn on_path(name: &str) -> Option<PathBuf> {
    crate::platform::find_on_path(std::ffi::OsStr::new(name), |_| true)
}
