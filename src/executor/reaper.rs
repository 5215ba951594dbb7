//! The reaper: a small process that kills what is left of the local compiles when the distributor
//! dies, even by SIGKILL, when it can no longer do so itself.
//!
//! `PR_SET_PDEATHSIG` (see `child`) reaches only the compiler process the distributor started, not
//! what that process started in turn: a wrapper script's compiler, a compiler's own subprocesses.
//! So every local compile runs in a process group of its own, and the reaper — this executable
//! again, as `dtlto-reapi reap-local-compiles`, started before the first local compile — learns
//! each group's id over a pipe. When the pipe closes (the distributor exited, normally or not) it
//! sends SIGKILL to every group still registered, then exits. A group is unregistered once its
//! compile has been waited for, so the reaper never signals an id the kernel may have reused.

use std::collections::HashSet;
use std::io::{self, BufRead, Write};
use std::process::{ChildStdin, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};

/// The hidden subcommand that runs [`run`].
pub const SUBCOMMAND: &str = "reap-local-compiles";

/// The distributor's end of the reaper: the pipe that registers process groups. Dropping the last
/// handle closes it, and the reaper exits.
pub struct Reaper {
    pipe: Mutex<ChildStdin>,
}

/// How to start the reaper: this very executable (by `/proc/self/exe`, which works even when the
/// file was replaced since), in a process group of its own so that a Ctrl-C meant for the link
/// does not end it before the compiles.
pub fn command() -> Command {
    use std::os::unix::process::CommandExt as _;
    let mut command = Command::new("/proc/self/exe");
    command
        .arg0("dtlto-reapi")
        .arg(SUBCOMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    command
}

impl Reaper {
    /// Starts the reaper process with `command` (see [`command`]).
    pub fn start(mut command: Command) -> io::Result<Arc<Reaper>> {
        let mut process = command.spawn()?;
        let pipe = process
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("the reaper has no stdin"))?;
        // Not waited for: it exits when the pipe closes, as the distributor ends.
        drop(process);
        Ok(Arc::new(Reaper {
            pipe: Mutex::new(pipe),
        }))
    }

    /// Registers the process group `group` until the returned guard is dropped.
    pub fn watch(self: &Arc<Self>, group: u32) -> Watched {
        self.send('+', group);
        Watched {
            reaper: self.clone(),
            group,
        }
    }

    /// One registration line. A reaper that died takes nothing more (its pipe is broken): the
    /// compiles still die with the distributor, their children are no longer guarded.
    fn send(&self, sign: char, group: u32) {
        let mut pipe = self.pipe.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = writeln!(pipe, "{sign}{group}") {
            tracing::debug!(error = %e, "cannot reach the reaper of local compiles");
        }
    }
}

/// A process group the reaper kills if the distributor dies first; unregistered when dropped.
pub struct Watched {
    reaper: Arc<Reaper>,
    group: u32,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.reaper.send('-', self.group);
    }
}

/// The reaper's main: reads registrations until the distributor's end of the pipe closes, then
/// kills every group still registered.
pub fn run() -> ExitCode {
    for group in registered(io::stdin().lock()) {
        // SAFETY: kill(2) on a process group the distributor registered and did not unregister:
        // its compile had not been waited for, so the id still names that compile's group.
        unsafe { libc::kill(-group, libc::SIGKILL) };
    }
    ExitCode::SUCCESS
}

/// The groups registered (`+ID`) and not unregistered (`-ID`) by the lines of `input`, read until
/// its end. Anything else is ignored, and so are ids that would make kill(2) signal more than one
/// group (0 is the caller's own group, -1 every process).
fn registered(input: impl BufRead) -> HashSet<libc::pid_t> {
    let mut groups = HashSet::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        let (sign, id) = line.split_at_checked(1).unwrap_or_default();
        let Ok(id) = id.parse::<libc::pid_t>() else {
            continue;
        };
        match sign {
            "+" if id > 1 => groups.insert(id),
            "-" => groups.remove(&id),
            _ => false,
        };
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_groups_are_those_not_yet_unregistered() {
        let input = "+100\n+200\n-100\n+300\ngarbage\n+0\n+1\n+-5\n-999\n+400";
        let groups = registered(input.as_bytes());
        assert_eq!(groups, HashSet::from([200, 300, 400]));
    }
}
