//! Action isolation. Every action runs in namespaces of its own: a user namespace that maps the
//! server's user to root inside it (also when the server runs as root, so that an action's
//! privileges end at its namespace), a PID namespace in which the action is process 1 with a
//! `/proc` of its own (it cannot see the server's or the client's processes, nor reach their files
//! through `/proc/<pid>/cwd`), and a private mount namespace in which every `--hide` directory is
//! covered by an empty read-only tmpfs, so that an absolute path leaking from the client fails as it
//! would on a real cluster. Namespaces are probed once at start-up: where they are unavailable,
//! `--hide` is an error rather than silently ignored, and without `--hide` the server warns and runs
//! actions unisolated.

use anyhow::{Context as _, bail};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How actions are isolated; everything prepared before any fork.
#[derive(Clone)]
pub struct Isolation {
    /// The directories to hide, as C strings.
    hidden: Arc<[CString]>,
    /// `(uid_map, gid_map)` contents mapping the server's user and group to root in the action's
    /// user namespace; `None` when the system refuses namespaces (and nothing is hidden): actions
    /// then run unisolated.
    user_maps: Option<Arc<(CString, CString)>>,
}

/// Writes `contents` to the file `path`; async-signal-safe.
///
/// # Safety
/// Only system calls on NUL-terminated strings that outlive the call.
unsafe fn write_file(path: &std::ffi::CStr, contents: &std::ffi::CStr) -> bool {
    // SAFETY: as documented above.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
        if fd < 0 {
            return false;
        }
        let len = contents.to_bytes().len();
        let written = libc::write(fd, contents.as_ptr().cast(), len);
        libc::close(fd);
        usize::try_from(written) == Ok(len)
    }
}

/// Runs in the forked child before exec: only async-signal-safe calls, no allocation. Enters new
/// user, mount and PID namespaces; this process then forks, stays behind to pass on the exit status
/// ([`relay`]), and its child — process 1 of the new PID namespace — mounts its own `/proc`, covers
/// the hidden directories and goes on to exec the action.
fn enter(hidden: &[CString], user_maps: &(CString, CString)) -> std::io::Result<()> {
    let fail = || Err(std::io::Error::last_os_error());
    let (uid_map, gid_map) = user_maps;
    // SAFETY: plain system calls on NUL-terminated strings that outlive the calls.
    unsafe {
        if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID) != 0 {
            return fail();
        }
        // An unprivileged process may map only its own ids, and gid_map only after setgroups is
        // denied.
        if !write_file(c"/proc/self/setgroups", c"deny")
            || !write_file(c"/proc/self/uid_map", uid_map)
            || !write_file(c"/proc/self/gid_map", gid_map)
        {
            return fail();
        }
        match libc::fork() {
            pid if pid < 0 => return fail(),
            0 => {}
            pid => relay(pid),
        }
        // Make every mount private first, so that no mount here ever propagates to the host.
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return fail();
        }
        let proc = c"proc";
        if libc::mount(
            proc.as_ptr(),
            c"/proc".as_ptr(),
            proc.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ) != 0
        {
            return fail();
        }
        let tmpfs = c"tmpfs";
        for path in hidden {
            let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
            if libc::mount(
                tmpfs.as_ptr(),
                path.as_ptr(),
                tmpfs.as_ptr(),
                flags,
                std::ptr::null(),
            ) != 0
            {
                return fail();
            }
        }
    }
    Ok(())
}

/// The process left outside the action's PID namespace: waits for the action and exits the way it
/// did, so that the server sees the action's own status. It closes every inherited descriptor first:
/// the server learns that the action started (or why it could not) from a descriptor that closes on
/// exec, which this process, never exec'ing, must not hold open.
fn relay(action: libc::pid_t) -> ! {
    // SAFETY: async-signal-safe system calls only; `_exit` ends the process without unwinding.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
        let mut status = 0;
        while libc::waitpid(action, &mut status, 0) < 0 {
            if *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            libc::signal(signal, libc::SIG_DFL);
            libc::kill(libc::getpid(), signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}

impl Isolation {
    /// Checks the `--hide` directories against the work root and probes for mount namespaces.
    pub fn new(hide: &[PathBuf], work_root: &Path) -> anyhow::Result<Self> {
        let mut hidden = Vec::new();
        for path in hide {
            let canonical = path
                .canonicalize()
                .with_context(|| format!("--hide {}: cannot resolve it", path.display()))?;
            if !canonical.is_dir() {
                bail!("--hide {}: not a directory", path.display());
            }
            if work_root.starts_with(&canonical) {
                bail!(
                    "--hide {} covers the action work root {}; choose another --work-dir",
                    path.display(),
                    work_root.display()
                );
            }
            hidden.push(CString::new(canonical.as_os_str().as_bytes())?);
        }
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let map = |id: u32| CString::new(format!("0 {id} 1"));
        let mut isolation = Self {
            hidden: hidden.into(),
            user_maps: Some(Arc::new((map(uid)?, map(gid)?))),
        };
        if let Err(e) = isolation.probe() {
            if !isolation.hidden.is_empty() {
                return Err(e);
            }
            eprintln!(
                "dtlto-reapi serve: warning: actions run without isolation (they can see this \
                 machine's processes and files): {e:#}"
            );
            isolation.user_maps = None;
        }
        Ok(isolation)
    }

    /// Runs `/bin/sh -c 'exit 0'` under the same isolation an action gets.
    fn probe(&self) -> anyhow::Result<()> {
        let mut probe = std::process::Command::new("/bin/sh");
        probe.args(["-c", "exit 0"]);
        self.apply_std(&mut probe);
        let status = probe.status().context(
            "actions run in user, PID and mount namespaces of their own (unshare(CLONE_NEWUSER | \
             CLONE_NEWPID | CLONE_NEWNS) and mount), which this system refused",
        )?;
        if !status.success() {
            bail!("the isolation probe exited with {status}");
        }
        Ok(())
    }

    /// Makes `command` run isolated.
    fn apply_std(&self, command: &mut std::process::Command) {
        let Some(user_maps) = self.user_maps.clone() else {
            return;
        };
        let hidden = self.hidden.clone();
        // SAFETY: `enter` only makes system calls, as a pre_exec hook must.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || {
                enter(&hidden, &user_maps)
            });
        }
    }

    /// Makes the action `command` run isolated.
    pub fn apply(&self, command: &mut tokio::process::Command) {
        self.apply_std(command.as_std_mut());
    }
}
