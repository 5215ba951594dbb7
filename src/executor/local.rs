//! The local executor: runs a job's compile as a child process on this machine.
//!
//! It is the embedded default, the fallback of the remote modes and the runner of cache-only misses,
//! so it takes care of the things every mode needs from a local run: outputs written under staged
//! names and moved into place only on success, the compiler's output captured for the reporter, and
//! prompt termination of the child when the link is cancelled (and its death with the distributor,
//! see `child`). And it runs the computation the job's Action describes, whatever the distributor's
//! own surroundings: the compiler the Action identifies, with the Action's environment (nothing of
//! the distributor's), from the link's working directory — so a result stored under the Action's
//! key, in the disk cache or the shared cache, is what a worker would have made.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use super::child::Spawner;
use crate::jobs::{Job, JobFile};
use crate::plan::args::rewrite_args;
use crate::plan::environment::Environment;
use crate::plan::toolchain;
use crate::platform::ProcessTree;
use crate::staging::StagedOutputs;

/// How every local compile of a link starts.
#[derive(Debug, Clone)]
pub struct LocalSetup {
    /// The compiler's file (`common.args[0]` found as the planner finds it), absolute.
    program: PathBuf,
    environment: Arc<Environment>,
    /// The link's working directory, which the job file's relative paths are relative to.
    working_directory: PathBuf,
}

impl LocalSetup {
    /// The setup of `job_file`'s compiles, run from `working_directory` (absolute) with
    /// `environment`.
    pub fn new(
        job_file: &JobFile,
        environment: Arc<Environment>,
        working_directory: PathBuf,
    ) -> LocalSetup {
        // A compiler that cannot be found is reported when the first compile cannot start.
        let program = toolchain::locate(std::path::Path::new(job_file.compiler()))
            .unwrap_or_else(|_| job_file.compiler().into());
        LocalSetup {
            program: working_directory.join(program),
            environment,
            working_directory,
        }
    }
}

/// How a local compile ended.
#[derive(Debug)]
pub enum LocalOutcome {
    /// The compiler exited 0 and every output is in place.
    Succeeded { output: Vec<u8> },
    /// The compiler ran and failed, or its outputs could not be placed.
    Failed {
        exit_code: Option<i32>,
        output: Vec<u8>,
        error: Option<String>,
    },
    /// The link was interrupted; the child was terminated.
    Cancelled,
}

/// How long a terminated compiler gets to clean up its own temporary files before it is killed.
const TERMINATE_GRACE: Duration = Duration::from_millis(500);

/// Runs `common.args ++ job.args` with the job's outputs redirected to staged names, and moves them
/// into place when the compiler succeeds.
pub async fn run_job(
    job_file: &JobFile,
    job: &Job,
    setup: &LocalSetup,
    spawner: &Spawner,
    cancel: &CancellationToken,
) -> LocalOutcome {
    let staged = match StagedOutputs::new(job) {
        Ok(staged) => staged,
        Err(e) => {
            return LocalOutcome::Failed {
                exit_code: None,
                output: Vec::new(),
                error: Some(e.to_string()),
            };
        }
    };
    let args = rewrite_args(&job.args, |arg| {
        staged
            .staged_path_of(arg.as_ref())
            .map(|p| p.to_string_lossy().into_owned())
    });
    let mut command = Command::new(&setup.program);
    command
        .env_clear()
        .envs(setup.environment.vars().iter().map(|(n, v)| (n, v)))
        .current_dir(&setup.working_directory)
        .args(&job_file.common_args[1..])
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // In a process group of its own (see `child`), so that terminating it reaches whatever it
    // started too (a wrapper script's compiler, clang's own subprocesses); the group stays
    // registered with the reaper until the compile has been waited for.
    let (child, tree) = match spawner.spawn(command).await {
        Ok(child) => child,
        Err(e) => {
            return LocalOutcome::Failed {
                exit_code: None,
                output: Vec::new(),
                error: Some(format!(
                    "cannot run the compiler {}: {e}",
                    job_file.compiler()
                )),
            };
        }
    };
    let wait = child.wait_with_output();
    tokio::pin!(wait);
    let result = tokio::select! {
        result = &mut wait => result,
        () = cancel.cancelled() => {
            terminate(&tree.tree, &mut wait).await;
            return LocalOutcome::Cancelled;
        }
    };
    let out = match result {
        Ok(out) => out,
        Err(e) => {
            return LocalOutcome::Failed {
                exit_code: None,
                output: Vec::new(),
                error: Some(format!("waiting for the compiler: {e}")),
            };
        }
    };
    let mut output = out.stderr;
    output.extend_from_slice(&out.stdout);
    if !out.status.success() {
        return LocalOutcome::Failed {
            exit_code: out.status.code(),
            error: out
                .status
                .code()
                .is_none()
                .then(|| format!("the compiler was killed ({})", out.status)),
            output,
        };
    }
    // Cancelled while the compiler was exiting (a race the cluster just won): its outputs must not
    // replace the winner's.
    if cancel.is_cancelled() {
        return LocalOutcome::Cancelled;
    }
    match staged.commit() {
        Ok(()) => LocalOutcome::Succeeded { output },
        Err(e) => LocalOutcome::Failed {
            exit_code: Some(0),
            output,
            error: Some(e.to_string()),
        },
    }
}

/// SIGTERM to the compile's process group first, so that clang removes its own temporary files, then
/// SIGKILL to whatever is left of the group after a grace period (on Windows: its job, at once).
async fn terminate<F: std::future::Future + Unpin>(tree: &ProcessTree, wait: &mut F) {
    tree.request_end();
    let exited = tokio::time::timeout(TERMINATE_GRACE, &mut *wait)
        .await
        .is_ok();
    tree.kill();
    if !exited {
        let _ = wait.await;
    }
}
