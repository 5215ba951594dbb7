//! Local compiles die with the distributor, even when it is killed with SIGKILL and cannot
//! terminate them itself: each compiler process asks the kernel for SIGKILL when its parent dies
//! (`PR_SET_PDEATHSIG`).
//!
//! The kernel sends that signal when the *thread* that forked the child exits, not the process.
//! Async tasks fork from whichever runtime thread runs them, and a runtime may retire its threads, so
//! every compile is forked by one dedicated thread, [`Spawner`], that lives as long as the run.

use std::io;
use std::sync::mpsc;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// A command to start and where to send the started child.
type Request = (Command, oneshot::Sender<io::Result<Child>>);

/// The thread that forks every local compile; it exits when the spawner is dropped.
pub struct Spawner {
    requests: mpsc::Sender<Request>,
}

impl Spawner {
    /// Starts the spawner thread, which forks under the current tokio runtime (so that children are
    /// reaped by it). Must be called within a runtime.
    pub fn new() -> io::Result<Spawner> {
        let runtime = tokio::runtime::Handle::current();
        let (requests, incoming) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("dtlto-spawner".to_owned())
            .spawn(move || {
                let _runtime = runtime.enter();
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            })?;
        Ok(Spawner { requests })
    }

    /// Starts `command` as a child that receives SIGKILL when this process dies.
    pub async fn spawn(&self, mut command: Command) -> io::Result<Child> {
        let parent = libc::pid_t::try_from(std::process::id()).map_err(io::Error::other)?;
        // SAFETY: `die_with_parent` only makes async-signal-safe system calls.
        unsafe {
            command.pre_exec(move || die_with_parent(parent));
        }
        let gone = || io::Error::other("the thread that starts local compiles is gone");
        let (reply, started) = oneshot::channel();
        self.requests.send((command, reply)).map_err(|_| gone())?;
        started.await.map_err(|_| gone())?
    }
}

/// In the forked child, before exec: SIGKILL when the parent dies; and if it already died (before
/// the request took effect), give up instead of running orphaned.
fn die_with_parent(parent: libc::pid_t) -> io::Result<()> {
    // SAFETY: plain system calls.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::getppid() != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn starts_children_and_reports_failures_to_start() {
        let spawner = Spawner::new().unwrap();
        let mut command = Command::new("/bin/sh");
        command.args(["-c", "exit 7"]);
        let status = spawner.spawn(command).await.unwrap().wait().await.unwrap();
        assert_eq!(status.code(), Some(7));
        let missing = spawner.spawn(Command::new("/nonexistent/compiler")).await;
        assert!(missing.is_err());
    }
}
