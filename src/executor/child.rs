//! Local compiles die with the distributor, even when it is killed with SIGKILL and cannot
//! terminate them itself: each compiler process asks the kernel for SIGKILL when its parent dies
//! (`PR_SET_PDEATHSIG`), and leads a process group of its own, which the reaper (`reaper`) kills
//! with whatever the compiler started in it. On Windows each compile runs in a Job Object that
//! kills it and all it started when its handle closes ([`ProcessTree`]), which needs no reaper.
//!
//! The kernel sends the parent-death signal when the *thread* that forked the child exits, not the
//! process. Async tasks fork from whichever runtime thread runs them, and a runtime may retire its
//! threads, so every compile is forked by one dedicated thread, [`Spawner`], that lives as long as
//! the run; it also registers each new group with the reaper right after the fork.

use std::io;
#[cfg(unix)]
use std::sync::Arc;
use std::sync::mpsc;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

#[cfg(unix)]
use super::reaper::{Reaper, Watched};
use crate::platform::ProcessTree;

/// A started compile: the child, and its process tree with (on Unix) the tree's registration with
/// the reaper, to be dropped once the child has been waited for.
pub type Started = (Child, Tree);

/// A compile's process tree, and (on Unix) its registration with the reaper: None when the reaper
/// could not be started.
pub struct Tree {
    pub tree: ProcessTree,
    #[cfg(unix)]
    _watched: Option<Watched>,
}

/// A command to start and where to send the started child.
type Request = (Command, oneshot::Sender<io::Result<Started>>);

/// The thread that forks every local compile; it exits when the spawner is dropped.
pub struct Spawner {
    requests: mpsc::Sender<Request>,
}

impl Spawner {
    /// Starts the spawner thread, which forks under the current tokio runtime (so that children are
    /// reaped by it). `reaper` starts the reaper, before the first compile (see
    /// `reaper::command`). Must be called within a runtime.
    pub fn new(reaper: Option<std::process::Command>) -> io::Result<Spawner> {
        let runtime = tokio::runtime::Handle::current();
        let (requests, incoming) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("dtlto-spawner".to_owned())
            .spawn(move || {
                let _runtime = runtime.enter();
                #[cfg(unix)]
                let mut reaper = Reaping::NotStarted(reaper);
                #[cfg(windows)]
                drop(reaper);
                for (mut command, reply) in incoming {
                    let started = command.spawn().and_then(|mut child| {
                        let tree = ProcessTree::adopt(&mut child)?;
                        #[cfg(unix)]
                        let tree = Tree {
                            _watched: reaper.get().map(|r| r.watch(tree.id())),
                            tree,
                        };
                        #[cfg(windows)]
                        let tree = Tree { tree };
                        Ok((child, tree))
                    });
                    let _ = reply.send(started);
                }
            })?;
        Ok(Spawner { requests })
    }

    /// Starts `command` as a child whose process tree dies with this process: on Unix it leads a
    /// process group of its own, receives SIGKILL when this process dies, and the reaper kills its
    /// group then; on Windows its Job Object closes with this process.
    pub async fn spawn(&self, mut command: Command) -> io::Result<Started> {
        ProcessTree::prepare(&mut command);
        #[cfg(unix)]
        {
            let parent = libc::pid_t::try_from(std::process::id()).map_err(io::Error::other)?;
            // SAFETY: both make only async-signal-safe system calls.
            unsafe {
                command.pre_exec(move || {
                    crate::platform::ask_for_long_time_slice();
                    die_with_parent(parent)
                });
            }
        }
        let gone = || io::Error::other("the thread that starts local compiles is gone");
        let (reply, started) = oneshot::channel();
        self.requests.send((command, reply)).map_err(|_| gone())?;
        started.await.map_err(|_| gone())?
    }
}

/// The reaper, started by the spawner thread on the first compile of the run (many remote runs
/// never compile locally).
#[cfg(unix)]
enum Reaping {
    NotStarted(Option<std::process::Command>),
    Started(Option<Arc<Reaper>>),
}

#[cfg(unix)]
impl Reaping {
    /// The reaper, starting it if need be; None when it cannot run (with a log line: the compilers
    /// still die with the distributor, only their own children are unguarded).
    fn get(&mut self) -> Option<&Arc<Reaper>> {
        if let Reaping::NotStarted(command) = self {
            let reaper = command.take().and_then(|command| {
                Reaper::start(command)
                    .map_err(
                        |e| tracing::warn!(error = %e, "cannot start the reaper of local compiles"),
                    )
                    .ok()
            });
            *self = Reaping::Started(reaper);
        }
        match self {
            Reaping::Started(reaper) => reaper.as_ref(),
            Reaping::NotStarted(_) => None,
        }
    }
}

/// In the forked child, before exec: SIGKILL when the parent dies; and if it already died (before
/// the request took effect), give up instead of running orphaned.
#[cfg(unix)]
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

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn starts_children_and_reports_failures_to_start() {
        let spawner = Spawner::new(None).unwrap();
        let mut command = Command::new("/bin/sh");
        command.args(["-c", "exit 7"]);
        let (mut child, tree) = spawner.spawn(command).await.unwrap();
        assert!(tree._watched.is_none());
        let status = child.wait().await.unwrap();
        assert_eq!(status.code(), Some(7));
        let missing = spawner.spawn(Command::new("/nonexistent/compiler")).await;
        assert!(missing.is_err());
    }
}
