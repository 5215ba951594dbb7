//! Runs one action: a fresh directory under the work root, the input root materialized into it,
//! the command run in its working directory with exactly the Command's environment under the
//! Action's timeout, outputs and stdout/stderr uploaded, the directory removed. The result carries
//! the exit code and every ExecutedActionMetadata timestamp.

use super::action_dir::{ActionDir, give_directories};
use super::context::{Context, blocking};
use super::digest::BlobDigest;
use super::inputs::materialize;
use super::isolation::Isolation;
use super::outputs::{self, OutputPath};
use super::shared_files::SharedFiles;
use super::storage::Storage;
use bazel_remote_apis::build::bazel::remote::execution::v2::{
    Action, ActionResult, Command, Directory, ExecutedActionMetadata,
};
use bazel_remote_apis::google::protobuf::Timestamp;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;
use tonic::Status;

/// Exit code reported when the program cannot be started, as a shell would.
const EXIT_CANNOT_RUN: i32 = 127;

pub fn now() -> Timestamp {
    let since_epoch = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(since_epoch.subsec_nanos()).unwrap_or(0),
    }
}

/// What a worker needs from the server.
pub struct Worker {
    pub context: Arc<Context>,
    pub work_root: PathBuf,
    /// Where big input files are kept once, to be linked into each action's directory; `None`
    /// when actions have the server's rights on files (they could write a shared copy), so that
    /// each action gets copies of its own.
    pub shared: Option<SharedFiles>,
    pub isolation: Isolation,
    /// The uids (and gids) free for the next action, when actions run as ids of their own: one
    /// per worker slot, so that no two running actions share one.
    pub ids: Mutex<Vec<u32>>,
    pub name: String,
}

/// An action's ids, given back to the worker when the action is over.
struct Ids<'a> {
    id: u32,
    free: &'a Mutex<Vec<u32>>,
}

impl Drop for Ids<'_> {
    fn drop(&mut self) {
        if let Ok(mut free) = self.free.lock() {
            free.push(self.id);
        }
    }
}

/// An action to run, with its Command already fetched.
pub struct Job {
    pub action: Action,
    pub command: Command,
    pub queued: Timestamp,
}

/// A finished run: the result, and a status when the run did not complete (DEADLINE_EXCEEDED
/// after the timeout, CANCELLED after cancellation).
pub struct Finished {
    pub result: ActionResult,
    pub status: Option<Status>,
}

/// How the process ended.
enum Ending {
    Exited(i32),
    TimedOut,
    Cancelled,
}

fn timeout_of(action: &Action) -> Result<Option<Duration>, Status> {
    let Some(timeout) = &action.timeout else {
        return Ok(None);
    };
    match (u64::try_from(timeout.seconds), u32::try_from(timeout.nanos)) {
        (Ok(0), Ok(0)) => Ok(None),
        (Ok(seconds), Ok(nanos)) if nanos < 1_000_000_000 => {
            Ok(Some(Duration::new(seconds, nanos)))
        }
        _ => Err(Status::invalid_argument(
            "the Action's timeout is negative or malformed",
        )),
    }
}

fn check_command(command: &Command) -> Result<(), Status> {
    if command.arguments.is_empty() {
        return Err(Status::invalid_argument("the Command has no arguments"));
    }
    if command.arguments.iter().any(|a| a.contains('\0')) {
        return Err(Status::invalid_argument(
            "a Command argument contains a NUL byte",
        ));
    }
    for variable in &command.environment_variables {
        if variable.name.is_empty()
            || variable.name.contains(['=', '\0'])
            || variable.value.contains('\0')
        {
            return Err(Status::invalid_argument(format!(
                "environment variable {:?} is malformed",
                variable.name
            )));
        }
    }
    Ok(())
}

/// `--fault-lose-inputs`: forgets the files of the input root's top directory.
fn lose_files(storage: &Storage, input_root: &BlobDigest) -> Result<(), Status> {
    let Some(root) = storage.message::<Directory>(input_root)? else {
        return Ok(());
    };
    for file in &root.files {
        if let Some(digest) = file.digest.as_ref() {
            storage.forget_blob(&BlobDigest::from_proto(digest)?);
        }
    }
    Ok(())
}

impl Worker {
    pub async fn run(&self, job: Job, cancel: CancellationToken) -> Result<Finished, Status> {
        let mut metadata = ExecutedActionMetadata {
            worker: self.name.clone(),
            queued_timestamp: Some(job.queued),
            worker_start_timestamp: Some(now()),
            ..Default::default()
        };
        if let Some(status) = self.context.faults.execute_status() {
            return Err(status);
        }
        check_command(&job.command)?;
        let timeout = timeout_of(&job.action)?;
        let input_root =
            BlobDigest::required(job.action.input_root_digest.as_ref(), "input_root_digest")?;
        let layout = Arc::new(outputs::plan(&job.command)?);
        // Held until the action's directory is gone: no other action gets these ids before.
        let ids = self.take_ids()?;
        let owner = ids.as_ref().map(|ids| ids.id);

        let dir = ActionDir::create(&self.work_root)?;
        let root = dir.path().join("root");
        metadata.input_fetch_start_timestamp = Some(now());
        let (context, shared, input_dir, input_layout) = (
            self.context.clone(),
            self.shared.clone(),
            root.clone(),
            layout.clone(),
        );
        blocking(move || {
            std::fs::create_dir(&input_dir)
                .map_err(|e| Status::internal(format!("cannot create the input root: {e}")))?;
            if context.faults.lose_inputs() {
                lose_files(&context.storage, &input_root)?;
            }
            materialize(&context.storage, shared.as_ref(), &input_root, &input_dir)?;
            outputs::prepare(&input_dir, &input_layout)?;
            match owner {
                Some(id) => give_directories(&input_dir, id),
                None => Ok(()),
            }
        })
        .await?;
        metadata.input_fetch_completed_timestamp = Some(now());

        metadata.execution_start_timestamp = Some(now());
        let ending = self
            .execute(
                &job.command,
                &root.join(&layout.working_dir),
                dir.path(),
                timeout,
                &cancel,
                owner.unwrap_or_default(),
            )
            .await?;
        metadata.execution_completed_timestamp = Some(now());

        metadata.output_upload_start_timestamp = Some(now());
        let context = self.context.clone();
        let mut result = blocking(move || collect(&context, &root, &layout.outputs, dir)).await?;
        metadata.output_upload_completed_timestamp = Some(now());
        metadata.worker_completed_timestamp = Some(now());
        result.execution_metadata = Some(metadata);

        let status = match ending {
            Ending::Exited(code) => {
                result.exit_code = code;
                None
            }
            Ending::TimedOut => Some(Status::deadline_exceeded(format!(
                "the action ran longer than its timeout of {:?} and was killed",
                timeout.unwrap_or_default()
            ))),
            Ending::Cancelled => Some(Status::cancelled("the action was cancelled")),
        };
        if status.is_some() {
            // No exit code of the command's own: report it as killed.
            result.exit_code = 128 + libc::SIGKILL;
        }
        Ok(Finished { result, status })
    }

    /// An action's ids when actions run as ids of their own.
    fn take_ids(&self) -> Result<Option<Ids<'_>>, Status> {
        if !self.isolation.own_ids() {
            return Ok(None);
        }
        let id = self
            .ids
            .lock()
            .map_err(|_| Status::internal("action id lock poisoned"))?
            .pop()
            .ok_or_else(|| Status::internal("more actions running than worker slots"))?;
        Ok(Some(Ids {
            id,
            free: &self.ids,
        }))
    }

    /// Runs the command in `cwd` as `id` (uid and gid, when actions run as ids of their own), its
    /// stdout and stderr going to files in `dir`.
    async fn execute(
        &self,
        command: &Command,
        cwd: &Path,
        dir: &Path,
        timeout: Option<Duration>,
        cancel: &CancellationToken,
        id: u32,
    ) -> Result<Ending, Status> {
        let stream = |name: &str| {
            std::fs::File::create(dir.join(name))
                .map_err(|e| Status::internal(format!("cannot create the {name} file: {e}")))
        };
        let (stdout, stderr) = (stream("stdout")?, stream("stderr")?);
        let program = &command.arguments[0];
        let mut process = tokio::process::Command::new(program);
        process
            .args(&command.arguments[1..])
            .env_clear()
            .envs(
                command
                    .environment_variables
                    .iter()
                    .map(|v| (&v.name, &v.value)),
            )
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(
                stderr
                    .try_clone()
                    .map_err(|e| Status::internal(e.to_string()))?,
            )
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: the hook makes only system calls.
        unsafe {
            process.pre_exec(|| {
                crate::platform::ask_for_long_time_slice();
                Ok(())
            });
        }
        self.isolation.apply(&mut process, (id, id));
        let mut child = match spawn(&mut process).await {
            Ok(child) => child,
            Err(e) => {
                if let Some(status) = self.context.faults.missing_program(program, &e) {
                    return Err(status);
                }
                use std::io::Write;
                let mut stderr = stderr;
                // Best effort: the exit code already says the program could not run.
                let _ = writeln!(stderr, "dtlto-reapi serve: cannot run {program:?}: {e}");
                return Ok(Ending::Exited(EXIT_CANNOT_RUN));
            }
        };
        let pid = child.id();
        let deadline = async {
            match timeout {
                Some(timeout) => tokio::time::sleep(timeout).await,
                None => std::future::pending().await,
            }
        };
        let ending = tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| Status::internal(format!("cannot wait for the action: {e}")))?;
                Ending::Exited(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
            }
            () = deadline => Ending::TimedOut,
            () = cancel.cancelled() => Ending::Cancelled,
        };
        let running = !matches!(ending, Ending::Exited(_));
        self.isolation.stop(pid, running);
        if running {
            // Reap the stopped action; its status no longer matters. Once it is reaped, nothing
            // of the action runs any more.
            let _ = child.wait().await;
        }
        Ok(ending)
    }
}

/// How often, and how long apart, a spawn that fails with ETXTBSY is tried again.
const BUSY_RETRIES: u32 = 50;
const BUSY_PAUSE: Duration = Duration::from_millis(20);

/// Spawns `process`, trying again while its program is "text file busy". An input just written by
/// this server (a compiler materialized for the action) is closed before it runs, but a process
/// that another action's thread forks at that moment inherits the writable descriptor until it
/// execs, and exec refuses a file open for writing: the race is brief and ends on its own.
async fn spawn(process: &mut tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    let mut tries = 0;
    loop {
        match process.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < BUSY_RETRIES => {
                tries += 1;
                tokio::time::sleep(BUSY_PAUSE).await;
            }
            spawned => return spawned,
        }
    }
}

/// The most bytes an action's stdout, and its stderr, may hold; more is an action error.
pub const MAX_STREAM_BYTES: u64 = 64 << 20;

/// Uploads outputs, stdout and stderr, then removes the action's directory.
fn collect(
    context: &Context,
    root: &Path,
    outputs: &[OutputPath],
    dir: ActionDir,
) -> Result<ActionResult, Status> {
    let mut result = ActionResult::default();
    outputs::collect(&context.storage, root, outputs, &mut result)?;
    let upload = |name: &str| {
        let data = outputs::read_capped(&dir.path().join(name), MAX_STREAM_BYTES, name)?;
        context.storage.add_blob(&data).map(|d| Some(d.to_proto()))
    };
    result.stdout_digest = upload("stdout")?;
    result.stderr_digest = upload("stderr")?;
    dir.remove()?;
    Ok(result)
}
