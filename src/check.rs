//! `dtlto-reapi check`: the first command to run against a cluster. With the settings a link would
//! use, it goes through what a link needs, one step and one line at a time — the connection (and
//! TLS), the credentials, the server's capabilities, a CAS round trip, an action-cache lookup and,
//! in remote mode, one real action on a worker (the compiler printing its version) — and says, for
//! the first step that fails, what to change. Exit status 0 means a link with these settings would
//! work.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;

use crate::advice;
use crate::cache::DigestCache;
use crate::jobs::JobFile;
use crate::plan::environment::Environment;
use crate::plan::options::ToolchainMode;
use crate::plan::planner::Planner;
use crate::plan::toolchain::Toolchain;
use crate::reapi::{self, Blob, CallContext, Client, ConnectionOptions, Digest, ReapiError};
use crate::remote_options::connection_options;
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
        Failure::new(advice::describe(e), advice)
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
    let Some(runtime) = crate::runtime::runtime() else {
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
    reapi::probe_connection(options)
        .await
        .map_err(|e| Failure::reapi(&e, advice::CHECK_CONNECTION))?;
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
    let client = Client::connect(options).await.map_err(|e| {
        let (step, advice) = advice::check_first_call(&e, &options.instance_name);
        Failure {
            step,
            what: advice::describe(&e),
            advice,
        }
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
            advice::CHECK_NO_EXECUTION,
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
    client
        .upload(vec![blob], ctx)
        .await
        .map_err(|e| Failure::reapi(&e, advice::check_cas(&e)))?;
    let back = client
        .download(&digest, ctx)
        .await
        .map_err(|e| Failure::reapi(&e, advice::check_cas(&e)))?;
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

/// The probe: `COMPILER --version` planned as a link plans its jobs, ready to upload and run.
struct Probe {
    /// The compiler as the user would type it (`zig clang`).
    shown: String,
    action: Digest,
    /// The Action's blobs and, in upload mode, the toolchain's.
    blobs: Vec<Blob>,
    /// Upload mode: the toolchain, as every Action of a link would carry it.
    uploaded: Option<Toolchain>,
    /// Why upload mode was wanted but is impossible, if so.
    why_not_uploaded: Option<String>,
    /// Why the digest cache (or a part of it) is not used, if so.
    digest_cache_warning: Option<String>,
}

/// The compiler a link uses (`common.args` starting with it): `--compiler`, else clang on PATH,
/// followed by the `--compiler-prepend-arg`s.
fn link_compiler(compiler: Option<&Path>, prepend: &[String]) -> Result<Vec<String>, Failure> {
    let Some(path) = compiler.map(Path::to_path_buf).or_else(|| on_path("clang")) else {
        return Err(Failure::new(
            "no compiler to try: none given and no clang on PATH",
            "give --compiler=PATH (the compiler a link uses)",
        ));
    };
    Ok(std::iter::once(path.to_string_lossy().into_owned())
        .chain(prepend.iter().cloned())
        .collect())
}

/// Plans the probe through the link planner: a job file whose compiler and shared arguments are
/// `common_args`, whose command is `--version`, with no files. The same toolchain resolution,
/// digest cache (`cache_dir`), settings and Action builder as a link's jobs; `legacy_output_files`
/// as a link decides it for the server.
async fn plan_probe(
    settings: &Settings,
    common_args: Vec<String>,
    legacy_output_files: bool,
    cache_dir: Option<PathBuf>,
) -> Result<Probe, Failure> {
    // What runs on the worker, as the user would type it (`zig clang`).
    let shown = match &settings.remote_compiler {
        Some(remote) => std::iter::once(remote.as_str())
            .chain(common_args[1..].iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        None => common_args.join(" "),
    };
    let environment =
        Environment::new(&settings.pass_env).map_err(|e| Failure::new(e, "fix --pass-env"))?;
    let cwd = std::env::current_dir()
        .map_err(|e| Failure::new(format!("reading the working directory: {e}"), "see above"))?;
    let job_file = JobFile {
        path: PathBuf::from("dtlto-reapi check"),
        common_args,
        common_inputs: Vec::new(),
        jobs: Vec::new(),
    };
    let planner = Planner::with_digest_cache(
        Arc::new(job_file),
        settings,
        Arc::new(environment),
        cwd,
        legacy_output_files,
        cache_dir,
    )
    .await
    .map_err(|e| Failure::new(format!("{e:#}"), advice::CHECK_COMPILER))?;
    // The compiler's digests, for the links after the check (a lost save costs hashing it again).
    planner.save_cache();
    let assembled = planner
        .plan_command(&["--version".to_owned()])
        .map_err(|e| Failure::new(e.detail, "fix the compiler's shared arguments"))?;
    let toolchain = planner.toolchain();
    let action = assembled.action_digest.clone();
    let mut blobs = assembled.into_blobs();
    blobs.extend(planner.toolchain_blobs().iter().cloned());
    Ok(Probe {
        shown,
        action,
        blobs,
        uploaded: (toolchain.identity.mode == ToolchainMode::Upload).then(|| toolchain.clone()),
        why_not_uploaded: planner.toolchain_warning().map(str::to_owned),
        digest_cache_warning: planner.digest_cache_warning(),
    })
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
    let common_args = link_compiler(compiler, prepend)?;
    let legacy = !client.capabilities().supports_output_paths();
    let probe = plan_probe(settings, common_args, legacy, DigestCache::default_dir()).await?;
    if let Some(warning) = &probe.digest_cache_warning {
        println!("! warning: {warning}");
    }
    let unexpected = |e: ReapiError| Failure::reapi(&e, advice::check_execution(&e));
    let uploading = Instant::now();
    client
        .upload_missing(probe.blobs.clone(), ctx)
        .await
        .map_err(unexpected)?;
    let uploaded_in = uploading.elapsed();
    let started = Instant::now();
    // Never answered from the action cache: the point is to run it.
    let response = client
        .execute(&probe.action, true, ctx)
        .await
        .map_err(unexpected)?;
    let total = started.elapsed();
    let shown = &probe.shown;
    let result = response.result.unwrap_or_default();
    if result.exit_code != 0 {
        let stderr = output_of(client, &result.stderr_raw, &result.stderr_digest, ctx).await;
        let advice = advice::check_compiler_failed(
            probe.uploaded.is_some(),
            probe.why_not_uploaded.as_deref(),
        );
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
    let how = match (&probe.uploaded, &probe.why_not_uploaded) {
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
    let how = format!("{how}; action {}", reapi::digest::display(&probe.action));
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

/// `name` found in the directories of `PATH`, as the shell would run it.
fn on_path(name: &str) -> Option<PathBuf> {
    crate::platform::find_on_path(std::ffi::OsStr::new(name), |_| true)
}

#[cfg(test)]
mod tests {
    use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
    use clap::Parser;
    use prost::Message;

    use super::*;
    use crate::jobs::Job;
    use crate::reapi::BlobSource;
    use crate::settings::SettingsArgs;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        settings: SettingsArgs,
    }

    fn settings(args: &[&str]) -> Settings {
        let args = Args::parse_from(std::iter::once("dtlto-reapi").chain(args.iter().copied()));
        Settings::with_defaults(args.settings, &|_| "command line".to_owned()).unwrap()
    }

    /// The message stored in `blobs` under `digest`.
    fn decode<M: Message + Default>(blobs: &[Blob], digest: &Digest) -> M {
        let blob = blobs.iter().find(|b| &b.digest == digest).expect("a blob");
        match &blob.source {
            BlobSource::Bytes(bytes) => M::decode(&bytes[..]).unwrap(),
            other => panic!("{other:?}"),
        }
    }

    /// A link's planner, made as the runner makes it, for `common_args` and `jobs`.
    async fn link_planner(
        settings: &Settings,
        common_args: &[String],
        jobs: Vec<Job>,
        legacy: bool,
    ) -> Planner {
        let job_file = JobFile {
            path: PathBuf::from("a.out.1.dist-file.json"),
            common_args: common_args.to_vec(),
            common_inputs: Vec::new(),
            jobs,
        };
        let environment = Arc::new(Environment::new(&settings.pass_env).unwrap());
        let cwd = std::env::current_dir().unwrap();
        Planner::with_digest_cache(Arc::new(job_file), settings, environment, cwd, legacy, None)
            .await
            .unwrap()
    }

    /// `check`'s probe is planned by the link planner and built by the links' Action builder: for
    /// the same compiler, settings and server, its Action digest is the one a link's planner gives
    /// the same command, and it shares with a real link job's Action everything that is not the
    /// job's own (salt, platform, environment, how the compiler is launched). Any difference in
    /// how `check` resolves the toolchain or reads the settings changes the digest.
    #[tokio::test]
    async fn the_probe_is_built_as_a_link_builds_its_actions() {
        // A link job's files, by paths relative to the working directory (the mirror layout).
        std::fs::create_dir_all("target").unwrap();
        let dir = tempfile::Builder::new()
            .prefix("check-probe-")
            .tempdir_in("target")
            .unwrap();
        let cwd = std::env::current_dir().unwrap();
        let relative = dir.path().strip_prefix(&cwd).unwrap_or(dir.path());
        let file = |name: &str| relative.join(name);
        std::fs::write(file("m.o"), b"BC\xc0\xde not really bitcode").unwrap();
        std::fs::write(file("m.thinlto.bc"), b"an index shard").unwrap();
        let job = Job {
            index: 0,
            args: ["-c", "-x", "ir", "-o"]
                .map(str::to_owned)
                .into_iter()
                .chain([file("m.native.o").display().to_string()])
                .chain([file("m.o").display().to_string()])
                .collect(),
            inputs: vec![file("m.o"), file("m.thinlto.bc")].into(),
            outputs: vec![file("m.native.o")].into(),
        };
        let compiler = "/usr/bin/true".to_owned();
        let prepend = vec!["clang".to_owned()];
        let cases: [(&[&str], bool); 4] = [
            (&["--layout=mirror"], false),
            (&["--layout=mirror"], true),
            (
                &[
                    "--layout=mirror",
                    "--toolchain=worker",
                    "--platform=OSFamily=linux",
                    "--platform=pool=big",
                    "--pass-env=PATH",
                ],
                true,
            ),
            (&["--layout=mirror", "--remote-compiler=/opt/clang"], false),
        ];
        let mut digests = Vec::new();
        for (args, legacy) in cases {
            let settings = settings(args);
            let common_args: Vec<String> = std::iter::once(compiler.clone())
                .chain(prepend.clone())
                .collect();
            let probe = plan_probe(&settings, common_args.clone(), legacy, None)
                .await
                .unwrap_or_else(|f| panic!("{}: {}", f.what, f.advice));

            let link = link_planner(&settings, &common_args, Vec::new(), legacy).await;
            let command = link.plan_command(&["--version".to_owned()]).unwrap();
            assert_eq!(probe.action, command.action_digest, "{args:?}");
            digests.push(probe.action.clone());

            // A real job of a link with the same compiler.
            let mut link_args = common_args.clone();
            link_args.push("-O2".to_owned());
            let link = link_planner(&settings, &link_args, vec![job.clone()], legacy).await;
            let spec = link.plan(&job, &|_, _| {}).unwrap();
            let probe_action: re::Action = decode(&probe.blobs, &probe.action);
            let job_action: re::Action = decode(&spec.blobs, &spec.action_digest);
            assert_eq!(probe_action.salt, job_action.salt, "{args:?}");
            assert_eq!(probe_action.platform, job_action.platform, "{args:?}");
            assert!(!probe_action.do_not_cache);
            let probe_command: re::Command =
                decode(&probe.blobs, probe_action.command_digest.as_ref().unwrap());
            let job_command: re::Command =
                decode(&spec.blobs, job_action.command_digest.as_ref().unwrap());
            assert_eq!(
                probe_command.environment_variables, job_command.environment_variables,
                "{args:?}"
            );
            // The compiler as the action runs it, then the shared arguments.
            let launched = probe_command.arguments.len() - 1;
            assert_eq!(
                probe_command.arguments[..launched],
                job_command.arguments[..launched],
                "{args:?}"
            );
            assert_eq!(probe_command.arguments[launched], "--version");
            #[allow(deprecated)] // Command.platform and output_files: the legacy fields
            {
                assert_eq!(probe_command.platform, job_command.platform, "{args:?}");
                assert_eq!(job_command.output_files.is_empty(), !legacy);
                assert_eq!(job_command.output_paths.is_empty(), legacy);
            }
            match settings.toolchain {
                Some(ToolchainMode::Worker) => assert!(!probe_action.salt.is_empty()),
                _ if settings.remote_compiler.is_some() => {
                    assert_eq!(probe_command.arguments[0], "/opt/clang");
                    assert!(!probe_action.salt.is_empty());
                }
                _ => assert!(probe.uploaded.is_some() && probe_action.salt.is_empty()),
            }
        }
        // Each setting that shapes an Action shapes the probe's (but the legacy output field:
        // the probe has no outputs).
        digests.sort_by(|a, b| a.hash.cmp(&b.hash));
        digests.dedup();
        assert_eq!(digests.len(), 3);
    }
}
